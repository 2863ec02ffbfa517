// LayerStreamer: layers loaded under a memory budget, the next one
// prefetched (include/tensorlift/streamer.h).

#include <memory>
#include <string>
#include <vector>

#include "ext_common.h"
#include "tensorlift/streamer.h"

namespace tensorlift::ext {
namespace {

// LayerStreamer is move-only and joins its thread on destruction; the Python
// object owns it through a pointer.
struct PyStreamer {
  std::unique_ptr<LayerStreamer> streamer;
};

// LayerStreamer(path, layers, budget, mode): opens the checkpoint and the
// streamer without the GIL.
void InitStreamer(PyStreamer* self, const std::string& path,
                  std::vector<std::vector<std::string>> layers, uint64_t budget,
                  const std::string& mode, const std::string& device) {
  LoadOptions opts;
  opts.mode = Unwrap(ParseIoMode(mode));
  opts.device = Unwrap(ParseDevice(device));
  Result<LayerStreamer> r = InternalError("not run");
  {
    nb::gil_scoped_release nogil;  // Open reads the headers (and sparse groups' shapes).
    auto ckpt = Checkpoint::Open(path);
    r = ckpt.ok() ? LayerStreamer::Open(*ckpt, std::move(layers), budget, std::move(opts))
                  : Result<LayerStreamer>(ckpt.status());
  }
  new (self) PyStreamer{std::make_unique<LayerStreamer>(Unwrap(std::move(r)))};
}

}  // namespace

void BindStreamer(nb::module_& m) {
  nb::class_<PyStreamer>(m, "LayerStreamer")
      .def(
          "__init__", &InitStreamer, nb::arg("path"), nb::arg("layers"), nb::arg("budget"),
          nb::arg("mode") = "auto", nb::arg("device") = "cpu",
          "Streams the layers (dense tensor names per layer, in execution order) of the checkpoint "
          "at `path` under a memory budget in bytes: those that fit stay resident, the next one "
          "is prefetched while the current one is in use (include/tensorlift/streamer.h).")
      .def(
          "acquire",
          [](PyStreamer& s, size_t layer) {
            Result<std::shared_ptr<const LoadedCheckpoint>> r = InternalError("not run");
            {
              nb::gil_scoped_release nogil;
              r = s.streamer->Acquire(layer);
            }
            return PyLoaded{Unwrap(std::move(r))};
          },
          nb::arg("layer"), "The layer's tensors (a Loaded), waiting for its load without the GIL.")
      .def(
          "release",
          [](PyStreamer& s, size_t layer, uint64_t stream) {
            Status st = s.streamer->Release(layer, stream);
            if (!st.ok()) Raise(st);
          },
          nb::arg("layer"), nb::arg("stream") = 0,
          "Drops the streamer's reference to a streamed layer (tensors handed out keep theirs). "
          "On a device, `stream` (a cudaStream_t as an int, 0 the default stream) is the stream "
          "whose queued work reads the layer: its buffer is reused once that work is done.")
      .def(
          "in_memory",
          [](const PyStreamer& s, size_t layer) {
            if (layer >= s.streamer->num_layers()) Raise(OutOfRangeError("no such layer"));
            return s.streamer->in_memory(layer);
          },
          nb::arg("layer"), "The layer is loaded or loading now.")
      .def_prop_ro("device", [](const PyStreamer& s) { return s.streamer->device().Name(); })
      .def_prop_ro(
          "device_memory", [](const PyStreamer& s) { return s.streamer->device_memory(); },
          "Device bytes the streamer holds (resident layers' buffers and the ring); 0 on "
          "the host.")
      .def(
          "device_bytes",
          [](const PyStreamer& s, size_t layer) {
            if (layer >= s.streamer->num_layers()) Raise(OutOfRangeError("no such layer"));
            return s.streamer->device_bytes(layer);
          },
          nb::arg("layer"), "Device bytes the layer's load allocates (0 on the host).")
      .def("resident_layers",
           [](const PyStreamer& s) {
             std::vector<size_t> out;
             for (size_t i = 0; i < s.streamer->num_layers(); ++i) {
               if (s.streamer->resident(i)) out.push_back(i);
             }
             return out;
           })
      .def("num_layers", [](const PyStreamer& s) { return s.streamer->num_layers(); })
      .def(
          "layer_bytes",
          [](const PyStreamer& s, size_t layer) {
            if (layer >= s.streamer->num_layers()) Raise(OutOfRangeError("no such layer"));
            return nb::make_tuple(s.streamer->dense_bytes(layer), s.streamer->stored_bytes(layer));
          },
          nb::arg("layer"), "(dense bytes, stored bytes) of a layer.")
      .def("stats", [](const PyStreamer& s) {
        const LayerStreamer::Stats st = s.streamer->stats();
        nb::dict d;
        d["bytes_read"] = st.bytes_read;
        d["loads"] = st.loads;
        d["prefetch_hits"] = st.prefetch_hits;
        d["prefetch_misses"] = st.prefetch_misses;
        d["wait_seconds"] = st.wait_seconds;
        return d;
      });
}

}  // namespace tensorlift::ext
