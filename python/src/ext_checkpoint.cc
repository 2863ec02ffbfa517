// Checkpoint, ArenaPool and Loaded: opening checkpoints (files, indexes,
// directories, s3:// and gs://), loading them, and the loaded tensors.

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "ext_common.h"
#include "tensorlift/content.h"
#include "tensorlift/sparse.h"

namespace tensorlift::ext {
namespace {

PyLoaded DoLoad(const PyCheckpoint& self, std::optional<std::vector<std::string>> names,
                std::optional<std::string> regex, const std::string& mode,
                const std::string& engine, int threads, int queue_depth, uint64_t block_size,
                std::optional<nb::object> progress, const std::string& device,
                std::optional<std::string> dtype, int staging_buffers, uint64_t staging_bytes,
                bool gds, bool decode_sparse, bool copy,
                std::optional<std::shared_ptr<ArenaPool>> arena_pool, bool misaligned_views,
                const std::string& content_hash, int tp_size, int tp_rank,
                const std::string& layout) {
  LoadOptions opts;
  opts.parallel = {tp_size, tp_rank};
  opts.layout = layout;
  if (content_hash == "on")
    opts.content_hash = ContentHashMode::kOn;
  else if (content_hash == "off")
    opts.content_hash = ContentHashMode::kOff;
  else if (content_hash != "auto")
    Raise(InvalidArgumentError("content_hash must be auto, on or off, not '" + content_hash + "'"));
  if (arena_pool) opts.arena_pool = *arena_pool;
  opts.decode_sparse = decode_sparse;
  opts.copy = copy;
  opts.misaligned_views = misaligned_views;
  opts.device = Unwrap(ParseDevice(device));  // A bad name is a ValueError before any I/O.
  if (dtype) {
    auto dt = DtypeFromName(*dtype);
    if (!dt) Raise(InvalidArgumentError("unknown dtype '" + *dtype + "'"));
    opts.dtype = *dt;
  }
  opts.staging_buffers = staging_buffers;
  opts.staging_bytes = staging_bytes;
  opts.gds = gds;
  opts.mode = Unwrap(ParseIoMode(mode));
  opts.engine = Unwrap(ParseIoEngine(engine));
  opts.threads = threads;
  opts.queue_depth = queue_depth;
  opts.block_size = block_size;
  if (names) opts.filter = TensorFilter::Names(std::move(*names));
  if (regex) opts.filter = Unwrap(TensorFilter::Regex(*regex));
  std::shared_ptr<nb::object> cb;
  if (progress && !progress->is_none()) {
    cb = std::make_shared<nb::object>(*progress);
    opts.progress = [cb](const Progress& p) {
      nb::gil_scoped_acquire gil;
      try {
        (*cb)(p.bytes_done, p.bytes_total, p.seconds);
      } catch (nb::python_error& e) {
        e.discard_as_unraisable("tensorlift progress callback");
      }
    };
  }
  Result<LoadedCheckpoint> r = InternalError("not run");
  {
    nb::gil_scoped_release nogil;
    r = self.store ? LoadFromObjectStore(*self.ckpt, opts, *self.store) : Load(*self.ckpt, opts);
  }
  cb.reset();
  if (!r.ok() && r.status().code() == StatusCode::kUnavailable && !opts.device.on_host()) {
    // No GPU or driver here: what torch raises for that, not ConnectionError.
    PyErr_SetString(PyExc_RuntimeError, r.status().message().c_str());
    throw nb::python_error();
  }
  return PyLoaded{std::make_shared<const LoadedCheckpoint>(Unwrap(std::move(r)))};
}

// Checkpoint.load_names: a sparse-bitmask group counts as its dense tensor (as
// load() returns it).
std::vector<std::string> LoadNames(const PyCheckpoint& s) {
  auto catalog = [&] {
    nb::gil_scoped_release nogil;  // Reads each group's shape.
    return sparse::FindSparse(*s.ckpt);
  }();
  const sparse::SparseCatalog c = Unwrap(std::move(catalog));
  std::vector<std::string> out;
  for (auto loc : c.dense) out.push_back(s.ckpt->info(loc).name);
  for (const auto& g : c.sparse) out.push_back(g.name);
  std::sort(out.begin(), out.end());
  return out;
}

// Checkpoint.tensors: (name, dtype, shape, begin, end, shard) in name order.
nb::list CheckpointTensors(const PyCheckpoint& s) {
  nb::list out;
  for (auto loc : s.ckpt->tensors()) {
    nb::tuple t = TensorTuple(s.ckpt->info(loc));
    out.append(nb::make_tuple(t[0], t[1], t[2], t[3], t[4], loc.shard));
  }
  return out;
}

// The shard's header, or IndexError.
const Header& ShardHeader(const PyCheckpoint& s, size_t shard) {
  if (shard >= s.ckpt->shards().size()) Raise(OutOfRangeError("no such shard"));
  return s.ckpt->shards()[shard].header;
}

}  // namespace

void BindCheckpoint(nb::module_& m) {
  nb::class_<PyCheckpoint>(m, "Checkpoint")
      .def_static(
          "open",
          [](const std::string& path, bool as_file, const std::string& endpoint,
             const std::string& region, const std::string& profile, bool anonymous, int tp_size,
             int tp_rank, const std::string& layout) {
            if (IsObjectStoreUrl(path)) {
              ObjectStoreOptions store;
              store.endpoint = endpoint;
              store.region = region;
              store.profile = profile;
              store.anonymous = anonymous;
              store.parallel = {tp_size, tp_rank};
              store.layout = layout;
              Result<Checkpoint> ckpt = InternalError("not run");
              {
                nb::gil_scoped_release nogil;
                ckpt = OpenObjectStoreCheckpoint(path, store);
              }
              return PyCheckpoint{std::make_shared<const Checkpoint>(Unwrap(std::move(ckpt))),
                                  store};
            }
            if (tp_size != 1 || !layout.empty()) {
              Raise(InvalidArgumentError(
                  "Checkpoint.open takes tp_size and layout for s3:// and gs:// paths; a local "
                  "checkpoint's rank gives them to load() (" +
                  path + " is local)"));
            }
            return PyCheckpoint{std::make_shared<const Checkpoint>(Unwrap(
                                    as_file ? Checkpoint::OpenFile(path) : Checkpoint::Open(path))),
                                std::nullopt};
          },
          nb::arg("path"), nb::arg("as_file") = false, nb::arg("endpoint") = "",
          nb::arg("region") = "", nb::arg("profile") = "", nb::arg("anonymous") = false,
          nb::arg("tp_size") = 1, nb::arg("tp_rank") = 0, nb::arg("layout") = "",
          "Opens a file, an index or a directory and validates every header (as_file: one "
          ".safetensors file whatever its name); s3:// and gs:// paths are read from object "
          "storage (endpoint, region, profile, anonymous override the environment's settings; "
          "tp_size, tp_rank and layout: its loads fetch only that rank's slices).")
      .def_static(
          "open_files",
          [](const std::vector<std::string>& paths) {
            return PyCheckpoint{
                std::make_shared<const Checkpoint>(Unwrap(Checkpoint::OpenFiles(paths))),
                std::nullopt};
          },
          nb::arg("paths"),
          "Opens several .safetensors files as the shards of one checkpoint, loaded in one go "
          "(a tensor in two of them is a ValueError naming both).")
      .def_prop_ro("path", [](const PyCheckpoint& s) { return s.ckpt->path(); })
      .def("load_names", &LoadNames,
           "The names load() returns by default, in name order: sparse-bitmask groups as their "
           "dense tensors.")
      .def("tensors", &CheckpointTensors, "(name, dtype, shape, begin, end, shard) in name order.")
      .def(
          "shard_tensors",
          [](const PyCheckpoint& s, size_t shard) {
            const Header& header = ShardHeader(s, shard);
            nb::list out;
            for (const auto& t : header.tensors()) out.append(TensorTuple(t));
            return out;
          },
          nb::arg("shard") = 0, "(name, dtype, shape, begin, end) of one shard, in file order.")
      .def("shards",
           [](const PyCheckpoint& s) {
             std::vector<std::string> out;
             for (const auto& sh : s.ckpt->shards()) out.push_back(sh.path);
             return out;
           })
      .def(
          "metadata",
          [](const PyCheckpoint& s, size_t shard) {
            return MetadataToPy(ShardHeader(s, shard).metadata());
          },
          nb::arg("shard") = 0)
      .def(
          "data_offset",
          [](const PyCheckpoint& s, size_t shard) { return ShardHeader(s, shard).data_offset(); },
          nb::arg("shard") = 0)
      .def("warnings", [](const PyCheckpoint& s) { return s.ckpt->warnings(); })
      .def(
          "load", &DoLoad, nb::arg("names") = nb::none(), nb::arg("regex") = nb::none(),
          nb::arg("mode") = "auto", nb::arg("engine") = "auto",
          nb::arg("threads") = LoadOptions{}.threads,
          nb::arg("queue_depth") = LoadOptions{}.queue_depth,
          nb::arg("block_size") = LoadOptions{}.block_size, nb::arg("progress") = nb::none(),
          nb::arg("device") = "cpu", nb::arg("dtype") = nb::none(),
          nb::arg("staging_buffers") = LoadOptions{}.staging_buffers,
          nb::arg("staging_bytes") = LoadOptions{}.staging_bytes,
          nb::arg("gds") = LoadOptions{}.gds,
          nb::arg("decode_sparse") = LoadOptions{}.decode_sparse, nb::arg("copy") = false,
          nb::arg("arena_pool") = nb::none(),
          nb::arg("misaligned_views") = LoadOptions{}.misaligned_views,
          // Off unless asked: tensorlift.load and the drop-in APIs return tensors, not the
          // identity (tensorlift.content_root asks for it).
          nb::arg("content_hash") = "off", nb::arg("tp_size") = 1, nb::arg("tp_rank") = 0,
          nb::arg("layout") = "",
          "Loads the tensors (all, or those named, or matching regex) onto `device` (cpu, cuda:N), "
          "converting floating-point tensors to `dtype` when given; sparse-bitmask groups come "
          "back dense unless decode_sparse is False; mode auto hands out views of page-cached "
          "files unless copy is True (with misaligned_views, also of tensors misaligned for "
          "their dtype, as the reference does); content_hash (off, auto, on): LoadOptions::"
          "content_hash (off by default here), the root then in Loaded.content; tp_size, tp_rank, "
          "layout: the tensors layout splits come back as this tensor-parallel rank's slices, "
          "only their bytes read; the GIL is released.");
}

void BindArenaPool(nb::module_& m) {
  nb::class_<ArenaPool>(
      m, "ArenaPool",
      "Host memory kept between loads (the pieces of tensorlift.stream): a load given the "
      "pool takes its buffers from the ones freed before, already faulted in.")
      .def(nb::init<int>(), nb::arg("max_free") = 2)
      .def("stats",
           [](const ArenaPool& p) {
             const ArenaPool::Stats s = p.stats();
             nb::dict d;
             d["fresh"] = s.fresh;
             d["reused"] = s.reused;
             d["free"] = s.free;
             d["free_bytes"] = s.free_bytes;
             return d;
           })
      .def("trim", &ArenaPool::Trim, "Frees the free buffers now.");
}

namespace {

// The loaded tensor `name`, or KeyError.
const LoadedTensor& FindOrKeyError(const PyLoaded& s, const std::string& name) {
  const LoadedTensor* t = s.get().Find(name);
  if (!t) {
    PyErr_SetString(PyExc_KeyError, name.c_str());
    throw nb::python_error();
  }
  return *t;
}

// Loaded.files: one dict per file (or peer) the tensors came from.
nb::list FileReports(const PyLoaded& s) {
  nb::list out;
  for (const auto& f : s.get().files()) {
    nb::dict d;
    d["path"] = f.path;
    d["mode"] = Str(IoModeName(f.mode));
    d["engine"] = Str(IoEngineName(f.engine));
    d["reason"] = f.reason;
    d["bytes"] = f.bytes;
    d["tensors"] = f.tensors;
    d["realigned"] = f.realigned;
    d["realigned_bytes"] = f.realigned_bytes;
    d["converted"] = f.converted;
    d["gds"] = f.gds;
    out.append(d);
  }
  return out;
}

}  // namespace

void BindLoaded(nb::module_& m) {
  nb::class_<PyLoaded>(m, "Loaded")
      .def("names",
           [](const PyLoaded& s) {
             std::vector<std::string> out;
             for (const auto& t : s.get().tensors()) out.push_back(t.name);
             return out;
           })
      .def("info",
           [](const PyLoaded& s, const std::string& name) {
             const LoadedTensor& t = FindOrKeyError(s, name);
             return nb::make_tuple(Str(DtypeName(t.dtype)), nb::tuple(nb::cast(t.shape)), t.nbytes);
           })
      .def(
          "device",
          [](const PyLoaded& s, const std::string& name) {
            const LoadedTensor& t = FindOrKeyError(s, name);
            // DLPack's device type and index: kDLCPU 1, kDLCUDA 2, kDLExtDev 12.
            const int type = t.device == DeviceType::kCuda       ? 2
                             : t.device == DeviceType::kEmulated ? 12
                                                                 : 1;
            return nb::make_tuple(type, t.device_index);
          },
          "(DLPack device type, index) of the tensor's memory.")
      .def(
          "dlpack",
          [](const PyLoaded& s, const std::string& name, bool versioned, bool raw_bytes) {
            FindOrKeyError(s, name);
            if (versioned) {
              return MakeCapsule(Unwrap(s.get().ToDLPackVersioned(name, raw_bytes)),
                                 "dltensor_versioned");
            }
            return MakeCapsule(Unwrap(s.get().ToDLPack(name, raw_bytes)), "dltensor");
          },
          nb::arg("name"), nb::arg("versioned") = true, nb::arg("raw_bytes") = true,
          "A DLPack capsule over the tensor's bytes (uint8 1-D when raw_bytes).")
      .def("files", &FileReports)
      .def(
          "host_bytes",
          [](const PyLoaded& s, const std::string& name) {
            const LoadedTensor& t = FindOrKeyError(s, name);
            nb::bytearray out;
            out.resize(t.nbytes);
            Status st = Status::Ok();
            {
              nb::gil_scoped_release nogil;
              st = s.get().CopyToHost(name, out.data());
            }
            if (!st.ok()) Raise(st);
            return out;
          },
          nb::arg("name"),
          "A copy of the tensor's bytes in host memory, from whatever device they are on.")
      .def_prop_ro("total_bytes", [](const PyLoaded& s) { return s.get().total_bytes(); })
      .def_prop_ro("seconds", [](const PyLoaded& s) { return s.get().seconds(); })
      .def_prop_ro(
          "content",
          [](const PyLoaded& s) -> nb::object {
            const ContentIdentity* c = s.get().content();
            return c ? nb::cast(c->root.Hex()) : nb::none();
          },
          "The content identity root (32 hex digits) when the load computed it "
          "(content_hash), else None.")
      .def(
          "device_plan",
          [](const PyLoaded& s) {
            const DeviceMemoryPlan& p = s.get().device_plan();
            nb::dict d;
            d["device_bytes"] = p.device_bytes;
            d["scratch_bytes"] = p.scratch_bytes;
            d["pinned_bytes"] = p.pinned_bytes;
            return d;
          },
          "Memory the load planned (device buffers, conversion slots, pinned staging).")
      .def(
          "release", [](PyLoaded& s) { s.loaded.reset(); },
          "Drops this object's reference to the buffers (tensors handed out keep theirs).");
}

}  // namespace tensorlift::ext
