// tensorlift._tensorlift: the nanobind extension. Bindings only: it uses the
// public C++ API and converts Status codes to Python exceptions in one place
// (Raise). The pure-Python package (python/tensorlift) builds the safetensors-
// and fastsafetensors-compatible APIs on top.
//
// Buffers reach Python only as DLPack capsules that own a reference to their
// arena, so a tensor stays valid until the last consumer drops it.
#include <Python.h>
#include <dlpack/dlpack.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "tensorlift/assign.h"
#include "tensorlift/capabilities.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/content.h"
#include "tensorlift/convert.h"
#include "tensorlift/crash.h"
#include "tensorlift/loader.h"
#include "tensorlift/objstore.h"
#include "tensorlift/remote.h"
#include "tensorlift/safetensors.h"
#include "tensorlift/sparse.h"
#include "tensorlift/streamer.h"
#include "tensorlift/striped.h"
#include "tensorlift/version.h"

namespace nb = nanobind;
using namespace tensorlift;

namespace {

PyObject* g_format_error = nullptr;

[[noreturn]] void Raise(const Status& st) {
  PyObject* type = PyExc_RuntimeError;
  switch (st.code()) {
    case StatusCode::kCorruption:
      type = g_format_error;
      break;
    case StatusCode::kNotFound:
      type = PyExc_FileNotFoundError;
      break;
    case StatusCode::kPermissionDenied:
      type = PyExc_PermissionError;
      break;
    case StatusCode::kIOError:
      type = PyExc_OSError;
      break;
    case StatusCode::kInvalidArgument:
      type = PyExc_ValueError;
      break;
    case StatusCode::kOutOfRange:
      type = PyExc_IndexError;
      break;
    case StatusCode::kResourceExhausted:
      type = PyExc_MemoryError;
      break;
    case StatusCode::kUnimplemented:
      type = PyExc_NotImplementedError;
      break;
    case StatusCode::kUnavailable:
      type = PyExc_ConnectionError;
      break;
    default:
      break;
  }
  PyErr_SetString(type, st.message().c_str());
  throw nb::python_error();
}

template <typename T>
T Unwrap(Result<T> r) {
  if (!r.ok()) Raise(r.status());
  return std::move(r).value();
}

nb::object MetadataToPy(const std::optional<Metadata>& m) {
  if (!m) return nb::none();
  nb::dict d;
  for (const auto& [k, v] : *m) d[nb::str(k.data(), k.size())] = nb::str(v.data(), v.size());
  return d;
}

nb::str Str(std::string_view s) { return nb::str(s.data(), s.size()); }

nb::tuple TensorTuple(const TensorInfo& t) {
  nb::list shape;
  for (uint64_t d : t.shape) shape.append(d);
  return nb::make_tuple(Str(t.name), Str(DtypeName(t.dtype)), nb::tuple(shape), t.begin, t.end);
}

// (name, dtype, shape, data_ptr, nbytes) tuples from Python -> TensorViews.
std::vector<TensorView> ToViews(
    const std::vector<
        std::tuple<std::string, std::string, std::vector<uint64_t>, uintptr_t, uint64_t>>& specs) {
  std::vector<TensorView> views;
  views.reserve(specs.size());
  for (const auto& [name, dtype, shape, ptr, len] : specs) {
    auto d = DtypeFromName(dtype);
    if (!d) Raise(InvalidArgumentError("unknown dtype '" + dtype + "' for tensor '" + name + "'"));
    if (len > 0 && ptr == 0)
      Raise(InvalidArgumentError("tensor '" + name + "' has no data pointer"));
    views.push_back({name, *d, shape,
                     std::span<const std::byte>(reinterpret_cast<const std::byte*>(ptr), len)});
  }
  return views;
}

std::optional<Metadata> ToMetadata(const std::optional<nb::dict>& md) {
  if (!md) return std::nullopt;
  Metadata m;
  for (auto [k, v] : *md) {
    if (!nb::isinstance<nb::str>(k) || !nb::isinstance<nb::str>(v)) {
      Raise(InvalidArgumentError("metadata keys and values must be strings"));
    }
    m[nb::cast<std::string>(k)] = nb::cast<std::string>(v);
  }
  return m;
}

// A DLPack capsule that runs the deleter unless a consumer took it (and
// renamed it "used_...", as the protocol says).
template <typename Managed>
nb::object MakeCapsule(Managed* m, const char* name) {
  PyCapsule_Destructor dtor = [](PyObject* cap) {
    const char* n =
        std::is_same_v<Managed, DLManagedTensorVersioned> ? "dltensor_versioned" : "dltensor";
    if (PyCapsule_IsValid(cap, n)) {
      auto* managed = static_cast<Managed*>(PyCapsule_GetPointer(cap, n));
      if (managed && managed->deleter) managed->deleter(managed);
    }
  };
  PyObject* cap = PyCapsule_New(m, name, dtor);
  if (cap == nullptr) {
    m->deleter(m);
    throw nb::python_error();
  }
  return nb::steal(cap);
}

struct PyCheckpoint {
  std::shared_ptr<const Checkpoint> ckpt;
  // Set for a checkpoint in object storage (s3://, gs://): how to reach it.
  std::optional<ObjectStoreOptions> store;
};

struct PyLoaded {
  std::shared_ptr<const LoadedCheckpoint> loaded;
  const LoadedCheckpoint& get() const {
    if (!loaded) Raise(InvalidArgumentError("the loaded checkpoint was released"));
    return *loaded;
  }
};

PyLoaded DoLoad(const PyCheckpoint& self, std::optional<std::vector<std::string>> names,
                std::optional<std::string> regex, const std::string& mode,
                const std::string& engine, int threads, int queue_depth, uint64_t block_size,
                std::optional<nb::object> progress, const std::string& device,
                std::optional<std::string> dtype, int staging_buffers, uint64_t staging_bytes,
                bool gds, bool decode_sparse, bool copy,
                std::optional<std::shared_ptr<ArenaPool>> arena_pool, bool misaligned_views,
                const std::string& content_hash) {
  LoadOptions opts;
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
  opts.device = device;
  Unwrap(ParseDevice(device));  // A bad name is a ValueError before any I/O.
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
  if (!r.ok() && r.status().code() == StatusCode::kUnavailable && device != "cpu") {
    // No GPU or driver here: what torch raises for that, not ConnectionError.
    PyErr_SetString(PyExc_RuntimeError, r.status().message().c_str());
    throw nb::python_error();
  }
  return PyLoaded{std::make_shared<const LoadedCheckpoint>(Unwrap(std::move(r)))};
}

// Peer loading: keys travel as dicts of their fields.
PeerKey KeyFromDict(const nb::dict& d) {
  PeerKey key;
  for (auto [k, v] : d) {
    const std::string name = nb::cast<std::string>(k);
    if (name == "protocol") {
      key.protocol = nb::cast<int>(v);
      continue;
    }
    const std::string value = nb::cast<std::string>(v);
    if (name == "model")
      key.model = value;
    else if (name == "revision")
      key.revision = value;
    else if (name == "dtype")
      key.dtype = value;
    else if (name == "quantization")
      key.quantization = value;
    else if (name == "layout")
      key.layout = value;
    else if (name == "content")
      key.content = value;  // PeerKey::content: "" = any bytes.
    else
      Raise(InvalidArgumentError("unknown peer key field '" + name + "'"));
  }
  return key;
}

nb::dict KeyToDict(const PeerKey& key) {
  nb::dict d;
  d["model"] = key.model;
  d["revision"] = key.revision;
  d["dtype"] = key.dtype;
  d["quantization"] = key.quantization;
  d["layout"] = key.layout;
  if (!key.content.empty()) d["content"] = key.content;
  d["protocol"] = key.protocol;
  d["digest"] = key.Digest();
  return d;
}

struct PyPeerServer {
  std::unique_ptr<PeerServer> server;
  PeerServer& get() const {
    if (!server) Raise(InvalidArgumentError("the peer server was closed"));
    return *server;
  }
};

ServeOptions MakeServeOptions(const std::string& host, int port, const std::string& token,
                              uint64_t rate_limit, int max_sessions, int tp_size, int tp_rank,
                              const std::string& registry, const std::string& transports,
                              uint64_t chunk_bytes, int registry_ttl, bool handover,
                              bool resident) {
  ServeOptions o;
  o.host = host;
  o.port = port;
  o.token = token;
  o.rate_limit = rate_limit;
  o.max_sessions = max_sessions;
  o.parallel = {tp_size, tp_rank};
  o.registry = registry;
  o.transports = transports;
  o.chunk_bytes = chunk_bytes;
  o.registry_ttl_s = registry_ttl;
  o.handover = handover;
  o.resident = resident;
  return o;
}

// LayerStreamer is move-only and joins its thread on destruction; the Python
// object owns it through a pointer.
struct PyStreamer {
  std::unique_ptr<LayerStreamer> streamer;
};

// SafetensorError: the common base of the errors about safetensors files and
// their use (as safetensors.SafetensorError is), so that code written for the
// reference can catch it. FormatError is also a ValueError; Raise uses it.
void BindErrors(nb::module_& m) {
  static nb::object safetensor_error = nb::steal(PyErr_NewExceptionWithDoc(
      "tensorlift.SafetensorError",
      "Base of tensorlift's safetensors errors (FormatError, missing tensor, closed file).",
      PyExc_Exception, nullptr));
  if (!safetensor_error.is_valid()) throw nb::python_error();
  m.attr("SafetensorError") = safetensor_error;
  nb::object format_bases = nb::steal(PyTuple_Pack(2, PyExc_ValueError, safetensor_error.ptr()));
  if (!format_bases.is_valid()) throw nb::python_error();
  static nb::object format_error = nb::steal(PyErr_NewExceptionWithDoc(
      "tensorlift.FormatError",
      "A file breaks the safetensors format (the message names the rule).", format_bases.ptr(),
      nullptr));
  if (!format_error.is_valid()) throw nb::python_error();
  g_format_error = format_error.ptr();
  m.attr("FormatError") = format_error;
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
                  "tp_size and layout apply to s3:// and gs:// paths (a rank fetches only its "
                  "slices); " +
                  path + " is local"));
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
          nb::arg("content_hash") = "off",
          "Loads the tensors (all, or those named, or matching regex) onto `device` (cpu, cuda:N), "
          "converting floating-point tensors to `dtype` when given; sparse-bitmask groups come "
          "back dense unless decode_sparse is False; mode auto hands out views of page-cached "
          "files unless copy is True (with misaligned_views, also of tensors misaligned for "
          "their dtype, as the reference does); content_hash (off, auto, on): LoadOptions::"
          "content_hash (off by default here), the root then in Loaded.content; the GIL is "
          "released.");
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

// LayerStreamer(path, layers, budget, mode): opens the checkpoint and the
// streamer without the GIL.
void InitStreamer(PyStreamer* self, const std::string& path,
                  std::vector<std::vector<std::string>> layers, uint64_t budget,
                  const std::string& mode, const std::string& device) {
  LoadOptions opts;
  opts.mode = Unwrap(ParseIoMode(mode));
  opts.device = device;
  Result<LayerStreamer> r = InternalError("not run");
  {
    nb::gil_scoped_release nogil;  // Open reads the headers (and sparse groups' shapes).
    auto ckpt = Checkpoint::Open(path);
    r = ckpt.ok() ? LayerStreamer::Open(*ckpt, std::move(layers), budget, std::move(opts))
                  : Result<LayerStreamer>(ckpt.status());
  }
  new (self) PyStreamer{std::make_unique<LayerStreamer>(Unwrap(std::move(r)))};
}

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
      .def_prop_ro("device", [](const PyStreamer& s) { return s.streamer->device(); })
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

void BindPeerServer(nb::module_& m) {
  nb::class_<PyPeerServer>(m, "PeerServer")
      .def_prop_ro("url", [](const PyPeerServer& s) { return s.get().url(); })
      .def_prop_ro("port", [](const PyPeerServer& s) { return s.get().port(); })
      .def_prop_ro("key", [](const PyPeerServer& s) { return KeyToDict(s.get().key()); })
      .def_prop_ro("served_bytes", [](const PyPeerServer& s) { return s.get().served_bytes(); })
      .def_prop_ro("active_sessions",
                   [](const PyPeerServer& s) { return s.get().active_sessions(); })
      .def_prop_ro(
          "content",
          [](const PyPeerServer& s) -> nb::object {
            const std::string c = s.get().content();
            return c.empty() ? nb::none() : nb::cast(c);
          },
          "The content root the seed publishes (32 hex digits), or None (device memory).")
      .def("corrupt_for_testing",
           [](PyPeerServer& s, const std::string& name, uint64_t offset) {
             Status st = s.get().CorruptForTesting(name, offset);
             if (!st.ok()) Raise(st);
           })
      .def(
          "close",
          [](PyPeerServer& s) {
            nb::gil_scoped_release nogil;
            s.server.reset();
          },
          "Stops serving (waits for the control thread; pulls in progress fail over on the "
          "clients).");
}

// serve_checkpoint, serve_loaded and serve_buffers: what to serve, then the
// ServeOptions fields (TL_SERVE_ARGS in BindServing).
PyPeerServer ServeCheckpointPy(const std::string& path, const nb::dict& key,
                               const std::string& host, int port, const std::string& token,
                               uint64_t rate_limit, int max_sessions, int tp_size, int tp_rank,
                               const std::string& registry, const std::string& transports,
                               uint64_t chunk_bytes, int registry_ttl, bool handover, bool resident,
                               const std::string& device) {
  const ServeOptions o =
      MakeServeOptions(host, port, token, rate_limit, max_sessions, tp_size, tp_rank, registry,
                       transports, chunk_bytes, registry_ttl, handover, resident);
  const PeerKey k = KeyFromDict(key);
  LoadOptions load;
  load.device = device;
  Result<std::unique_ptr<PeerServer>> r = InternalError("not run");
  {
    nb::gil_scoped_release nogil;
    r = PeerServer::ServeCheckpoint(path, k, o, load);
  }
  return PyPeerServer{Unwrap(std::move(r))};
}

PyPeerServer ServeLoadedPy(const PyLoaded& loaded, const nb::dict& key, const std::string& host,
                           int port, const std::string& token, uint64_t rate_limit,
                           int max_sessions, int tp_size, int tp_rank, const std::string& registry,
                           const std::string& transports, uint64_t chunk_bytes, int registry_ttl,
                           bool handover, bool resident) {
  const ServeOptions o =
      MakeServeOptions(host, port, token, rate_limit, max_sessions, tp_size, tp_rank, registry,
                       transports, chunk_bytes, registry_ttl, handover, resident);
  const PeerKey k = KeyFromDict(key);
  auto held = loaded.loaded;
  if (!held) Raise(InvalidArgumentError("the loaded checkpoint was released"));
  Result<std::unique_ptr<PeerServer>> r = InternalError("not run");
  {
    nb::gil_scoped_release nogil;
    r = PeerServer::Serve(held, k, o);
  }
  return PyPeerServer{Unwrap(std::move(r))};
}

// (name, dtype, shape, data_ptr, shard_dim, shard_start, full_shape, device)
using BufferSpec = std::tuple<std::string, std::string, std::vector<int64_t>, uintptr_t, int,
                              int64_t, std::vector<int64_t>, std::string>;

PyPeerServer ServeBuffersPy(const std::vector<BufferSpec>& specs, nb::object keep_alive,
                            const nb::dict& key, const std::string& host, int port,
                            const std::string& token, uint64_t rate_limit, int max_sessions,
                            int tp_size, int tp_rank, const std::string& registry,
                            const std::string& transports, uint64_t chunk_bytes, int registry_ttl,
                            bool handover, bool resident) {
  const ServeOptions o =
      MakeServeOptions(host, port, token, rate_limit, max_sessions, tp_size, tp_rank, registry,
                       transports, chunk_bytes, registry_ttl, handover, resident);
  const PeerKey k = KeyFromDict(key);
  std::vector<PeerServer::Tensor> tensors;
  for (const auto& [name, dtype, shape, ptr, dim, start, full, device] : specs) {
    auto d = DtypeFromName(dtype);
    if (!d) Raise(InvalidArgumentError("unknown dtype '" + dtype + "' for tensor '" + name + "'"));
    tensors.push_back(
        {name, *d, shape, reinterpret_cast<const void*>(ptr), dim, start, full, device});
  }
  // The Python objects owning the buffers stay referenced until the
  // server is gone (released with the GIL held).
  auto* ref = new nb::object(keep_alive);
  std::shared_ptr<const void> hold(ref, [](const void* p) {
    nb::gil_scoped_acquire gil;
    delete static_cast<const nb::object*>(p);
  });
  Result<std::unique_ptr<PeerServer>> r = InternalError("not run");
  {
    nb::gil_scoped_release nogil;
    r = PeerServer::ServeBuffers(std::move(tensors), k, o, hold);
    hold.reset();
  }
  return PyPeerServer{Unwrap(std::move(r))};
}

// (sealed, copy_on_write): ShareTensors of host buffers (BufferSpec each,
// whole tensors), copied under the GIL's release.
nb::tuple ShareTensorsPy(const std::vector<BufferSpec>& specs, const std::string& name) {
  std::vector<PeerServer::Tensor> tensors;
  for (const auto& [tname, dtype, shape, ptr, dim, start, full, device] : specs) {
    auto d = DtypeFromName(dtype);
    if (!d) Raise(InvalidArgumentError("unknown dtype '" + dtype + "' for tensor '" + tname + "'"));
    tensors.push_back(
        {tname, *d, shape, reinterpret_cast<const void*>(ptr), dim, start, full, device});
  }
  Result<SharedTensors> r = InternalError("not run");
  {
    nb::gil_scoped_release nogil;
    r = ShareTensors(tensors, name);
  }
  SharedTensors shared = Unwrap(std::move(r));
  return nb::make_tuple(
      PyLoaded{std::move(shared.sealed)},
      PyLoaded{std::make_shared<const LoadedCheckpoint>(std::move(shared.copy_on_write))});
}

void BindServing(nb::module_& m) {
#define TL_SERVE_ARGS                                                              \
  nb::arg("host") = "127.0.0.1", nb::arg("port") = 0, nb::arg("token") = "",       \
  nb::arg("rate_limit") = 0, nb::arg("max_sessions") = 16, nb::arg("tp_size") = 1, \
  nb::arg("tp_rank") = 0, nb::arg("registry") = "", nb::arg("transports") = "",    \
  nb::arg("chunk_bytes") = uint64_t{4} << 20, nb::arg("registry_ttl") = 10,        \
  nb::arg("handover") = true, nb::arg("resident") = false
  m.def("serve_checkpoint", &ServeCheckpointPy, nb::arg("path"), nb::arg("key"), TL_SERVE_ARGS,
        nb::arg("device") = "cpu",
        "Loads `path` (onto `device`) and serves this rank's tensors to peers.");
  m.def("serve_loaded", &ServeLoadedPy, nb::arg("loaded"), nb::arg("key"), TL_SERVE_ARGS,
        "Serves tensors already loaded (whole tensors).");
  m.def(
      "read_object_range",
      [](const std::string& url, uint64_t offset, uintptr_t address, uint64_t nbytes) {
        Status st;
        {
          nb::gil_scoped_release nogil;
          st = ReadObjectStoreRange(url, offset, nbytes, reinterpret_cast<void*>(address));
        }
        if (!st.ok()) Raise(st);
      },
      nb::arg("url"), nb::arg("offset"), nb::arg("address"), nb::arg("nbytes"),
      "Fills nbytes bytes at `address` (host memory the caller owns) with bytes [offset, "
      "offset + nbytes) of the object at url (s3://, gs://).");
  m.def("serve_buffers", &ServeBuffersPy, nb::arg("tensors"), nb::arg("keep_alive"), nb::arg("key"),
        TL_SERVE_ARGS,
        "Serves host or device buffers: (name, dtype, shape, data_ptr, shard_dim, "
        "shard_start, full_shape, device) each.");
  m.def("share_tensors", &ShareTensorsPy, nb::arg("tensors"), nb::arg("name"),
        "Copies host buffers (specs as serve_buffers') into sealed shared memory: (sealed, "
        "copy_on_write) Loaded objects over the same memory (serve the first, use the second).");
#undef TL_SERVE_ARGS
}

// load_from_peer: (Loaded, report dict, the seed server or None).
nb::tuple LoadFromPeerPy(const nb::dict& key, const std::vector<std::string>& peers,
                         const std::string& registry, const std::string& token, int tp_size,
                         int tp_rank, const std::string& fallback, const std::string& mode,
                         int timeout_ms, const std::string& transports, bool become_seed,
                         const std::string& seed_host, uint64_t batch_bytes, int max_in_flight,
                         const std::string& device, const std::string& handover,
                         bool handover_copy_on_write, bool handover_verify) {
  Unwrap(ParseDevice(device));  // A bad name is a ValueError before any I/O.
  PeerLoadOptions o;
  o.device = device;
  o.peers = peers;
  o.registry = registry;
  o.token = token;
  o.parallel = {tp_size, tp_rank};
  o.fallback_path = fallback;
  if (IsObjectStoreUrl(fallback)) o.fallback_loader = ObjectStoreFallback();
  o.fallback_load.mode = Unwrap(ParseIoMode(mode));
  o.request_timeout_ms = o.connect_timeout_ms = o.stall_timeout_ms = timeout_ms;
  o.transports = transports;
  o.become_seed = become_seed;
  o.seed.host = seed_host;
  o.batch_bytes = batch_bytes;
  o.max_in_flight = max_in_flight;
  o.handover = handover;
  o.handover_copy_on_write = handover_copy_on_write;
  o.handover_verify = handover_verify;
  const PeerKey k = KeyFromDict(key);
  Result<PeerLoad> r = InternalError("not run");
  {
    nb::gil_scoped_release nogil;
    r = LoadFromPeerAndSeed(k, o);
  }
  PeerLoad pl = Unwrap(std::move(r));
  nb::dict report;
  report["source"] = pl.report.source;
  report["failures"] = pl.report.failures;
  report["bytes"] = pl.report.bytes;
  report["seconds"] = pl.report.seconds;
  report["source_ranks"] = pl.report.source_ranks;
  report["handover"] = pl.report.handover;
  // The root the tensors received hash to: key.content once checked (a load
  // that succeeds with it was checked), else what a disk load computed.
  if (!k.content.empty())
    report["content"] = k.content;
  else if (pl.loaded && pl.loaded->content())
    report["content"] = pl.loaded->content()->root.Hex();
  else
    report["content"] = nb::none();
  nb::object seed = nb::none();
  if (pl.seed) seed = nb::cast(PyPeerServer{std::move(pl.seed)});
  return nb::make_tuple(PyLoaded{pl.loaded}, report, seed);
}

// load_striped: (Loaded, report dict).
nb::tuple LoadStripedPy(const std::string& path, const std::string& object_url,
                        const std::vector<std::string>& peers, const std::string& registry,
                        const std::string& token, const nb::object& key, const std::string& device,
                        int timeout_ms, const std::string& transports, uint64_t range_bytes,
                        int disk_threads, int object_threads, const std::string& endpoint,
                        const std::string& region, const nb::object& names, bool use_page_cache) {
  Unwrap(ParseDevice(device));
  StripeOptions o;
  if (!names.is_none())
    o.load.filter = TensorFilter::Names(nb::cast<std::vector<std::string>>(names));
  o.path = path;
  o.object_url = object_url;
  o.store.endpoint = endpoint;
  o.store.region = region;
  o.peers = peers;
  o.registry = registry;
  o.token = token;
  if (!key.is_none()) o.key = KeyFromDict(nb::cast<nb::dict>(key));
  o.load.device = device;
  o.request_timeout_ms = o.connect_timeout_ms = o.stall_timeout_ms = timeout_ms;
  o.transports = transports;
  o.range_bytes = range_bytes;
  o.disk_threads = disk_threads;
  o.object_threads = object_threads;
  o.use_page_cache = use_page_cache;
  StripeReport rep;
  Result<LoadedCheckpoint> r = InternalError("not run");
  {
    nb::gil_scoped_release nogil;
    r = LoadStriped(o, &rep);
  }
  auto loaded = std::make_shared<const LoadedCheckpoint>(Unwrap(std::move(r)));
  nb::dict report;
  nb::list sources;
  for (const StripeSourceReport& s : rep.sources) {
    nb::dict d;
    d["name"] = s.name;
    d["bytes"] = s.bytes;
    d["ranges"] = s.ranges;
    d["seconds"] = s.seconds;
    d["failure"] = s.failure;
    sources.append(d);
  }
  report["sources"] = sources;
  report["failures"] = rep.failures;
  report["bytes"] = rep.bytes;
  report["ranges"] = rep.ranges;
  report["refetched"] = rep.refetched;
  report["checked"] = rep.checked;
  report["seconds"] = rep.seconds;
  report["note"] = rep.note;
  return nb::make_tuple(PyLoaded{loaded}, report);
}

void BindPeerLoading(nb::module_& m) {
  m.def(
      "peer_key_for",
      [](const std::string& path) {
        if (IsObjectStoreUrl(path)) {
          Result<Checkpoint> ckpt = InternalError("not run");
          {
            nb::gil_scoped_release nogil;
            ckpt = OpenObjectStoreCheckpoint(path);
          }
          return KeyToDict(Unwrap(PeerKeyForCheckpoint(Unwrap(std::move(ckpt)))));
        }
        return KeyToDict(Unwrap(PeerKeyForCheckpoint(path)));
      },
      nb::arg("path"), "The default key of a checkpoint (its name and a digest of its headers).");
  m.def("load_from_peer", &LoadFromPeerPy, nb::arg("key"),
        nb::arg("peers") = std::vector<std::string>{}, nb::arg("registry") = "",
        nb::arg("token") = "", nb::arg("tp_size") = 1, nb::arg("tp_rank") = 0,
        nb::arg("fallback") = "", nb::arg("mode") = "auto", nb::arg("timeout_ms") = 10000,
        nb::arg("transports") = "", nb::arg("become_seed") = false,
        nb::arg("seed_host") = "127.0.0.1", nb::arg("batch_bytes") = uint64_t{8} << 20,
        nb::arg("max_in_flight") = 16, nb::arg("device") = "cpu", nb::arg("handover") = "auto",
        nb::arg("handover_copy_on_write") = true, nb::arg("handover_verify") = false,
        "Pulls from the first working peer (then the registry's seeds, then disk) onto "
        "`device`: (Loaded, report, seed or None).");
  m.def("load_striped", &LoadStripedPy, nb::arg("path") = "", nb::arg("object_url") = "",
        nb::arg("peers") = std::vector<std::string>{}, nb::arg("registry") = "",
        nb::arg("token") = "", nb::arg("key") = nb::none(), nb::arg("device") = "cpu",
        nb::arg("timeout_ms") = 10000, nb::arg("transports") = "",
        nb::arg("range_bytes") = uint64_t{8} << 20, nb::arg("disk_threads") = 4,
        nb::arg("object_threads") = 0, nb::arg("endpoint") = "", nb::arg("region") = "",
        nb::arg("names") = nb::none(), nb::arg("use_page_cache") = true,
        "Loads from the local files, a bucket and peers at once (include/tensorlift/"
        "striped.h): (Loaded, report).");
}

void BindFormat(nb::module_& m) {
  m.def(
      "parse_header",
      [](nb::bytes data) {
        auto span =
            std::span<const std::byte>(static_cast<const std::byte*>(data.data()), data.size());
        Header h = Unwrap(Header::Parse(span));
        nb::list tensors;
        for (const auto& t : h.tensors()) tensors.append(TensorTuple(t));
        return nb::make_tuple(tensors, MetadataToPy(h.metadata()), h.data_offset());
      },
      nb::arg("data"),
      "Validates a whole file held in bytes: (tensors in file order, metadata, data_offset).");

  using Spec = std::tuple<std::string, std::string, std::vector<uint64_t>, uintptr_t, uint64_t>;
  m.def(
      "serialize",
      [](const std::vector<Spec>& specs, std::optional<nb::dict> metadata) {
        auto views = ToViews(specs);
        auto md = ToMetadata(metadata);
        Result<std::vector<std::byte>> r = InternalError("not run");
        {
          nb::gil_scoped_release nogil;
          r = Serialize(views, md);
        }
        auto bytes = Unwrap(std::move(r));
        return nb::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
      },
      nb::arg("tensors"), nb::arg("metadata") = nb::none(),
      "tensors: (name, dtype, shape, data_ptr, nbytes); bytes identical to the reference "
      "writer's.");
  m.def(
      "serialize_file",
      [](const std::vector<Spec>& specs, const std::string& path,
         std::optional<nb::dict> metadata) {
        auto views = ToViews(specs);
        auto md = ToMetadata(metadata);
        Status st;
        {
          nb::gil_scoped_release nogil;
          st = WriteFile(path, views, md);
        }
        if (!st.ok()) Raise(st);
      },
      nb::arg("tensors"), nb::arg("path"), nb::arg("metadata") = nb::none(),
      "Writes through a temporary file renamed over `path`.");
}

// convert: `data`'s elements converted from one dtype to another, as new bytes.
nb::bytes ConvertPy(nb::bytes data, const std::string& from_dtype, const std::string& to_dtype) {
  auto from = DtypeFromName(from_dtype);
  if (!from) Raise(InvalidArgumentError("unknown dtype '" + from_dtype + "'"));
  auto to = DtypeFromName(to_dtype);
  if (!to) Raise(InvalidArgumentError("unknown dtype '" + to_dtype + "'"));
  const uint64_t from_bits = DtypeBits(*from);
  const uint64_t to_bits = DtypeBits(*to);
  if (data.size() * 8 % from_bits != 0) {
    Raise(InvalidArgumentError(std::to_string(data.size()) + " bytes are not a whole number of " +
                               from_dtype + " elements"));
  }
  const uint64_t count = data.size() * 8 / from_bits;
  // Checks the pair (the C++ message) before anything is allocated.
  if (Status pair = ConvertOnHost(nullptr, *to, nullptr, *from, 0); !pair.ok()) Raise(pair);
  // A new bytes object nobody else sees yet: filled without the GIL.
  PyObject* out = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(count * to_bits / 8));
  if (out == nullptr) throw nb::python_error();
  nb::bytes result = nb::steal<nb::bytes>(out);
  auto* dst = reinterpret_cast<std::byte*>(PyBytes_AsString(out));
  const auto* src = static_cast<const std::byte*>(data.data());
  Status st;
  {
    nb::gil_scoped_release nogil;
    st = ConvertOnHost(dst, *to, src, *from, count);
  }
  if (!st.ok()) Raise(st);
  return result;
}

// The multi-rank rules of include/tensorlift/assign.h, for the
// fastsafetensors API: which rank reads which file, and a rank's shard.
void BindMultiRank(nb::module_& m) {
  m.def(
      "assign_whole_files",
      [](const std::vector<uint64_t>& file_bytes, int world) {
        std::vector<std::vector<uint64_t>> tensor_bytes;
        tensor_bytes.reserve(file_bytes.size());
        for (uint64_t b : file_bytes) tensor_bytes.push_back({b});
        AssignOptions options;
        options.whole_files = true;
        Result<Assignment> a = AssignByBytes(tensor_bytes, world, options);
        if (!a.ok()) Raise(a.status());
        std::vector<std::vector<uint32_t>> files(a->ranks.size());
        for (size_t r = 0; r < a->ranks.size(); ++r) {
          for (const ReadPiece& p : a->ranks[r].pieces) files[r].push_back(p.file);
        }
        return files;
      },
      nb::arg("file_bytes"), nb::arg("world"),
      "Each rank's files (indices into file_bytes, ascending) under the multi-rank loader's "
      "whole-file rule (AssignByBytes with whole_files): largest first, each to the rank with the "
      "fewest bytes (ties: fewer files, then the lower rank).");
  m.def(
      "shard_range",
      [](int64_t extent, int rank, int world) {
        Result<IndexRange> r = ShardRange(extent, rank, world);
        if (!r.ok()) Raise(r.status());
        return std::make_pair(r->start, r->length);
      },
      nb::arg("extent"), nb::arg("rank"), nb::arg("world"),
      "(start, length) of rank's part of a dim of `extent`: tensorlift's one shard-range rule "
      "(blocks of ceil(extent / world), the last ones clipped; ValueError for bad arguments).");
}

// ucx_version, release_pinned_staging, dtype_bits and convert.
void BindUtilities(nb::module_& m) {
  m.def(
      "ucx_version",
      [] {
        RemoteCapabilities r = QueryRemoteCapabilities();
        return r.ucx_built ? std::optional<std::string>(r.ucx_version) : std::nullopt;
      },
      "The UCX peer loading uses, loaded at run time (Debian's libucp.so.0, or the build "
      "TENSORLIFT_UCX_LIB names): '1.13.1 (libucp.so.0)', or 'not loadable: <why>'; None when "
      "tensorlift was built without UCX (then serving and pulling raise).");
  m.def("release_pinned_staging", &ReleasePinnedStaging,
        "Frees the pinned staging memory GPU loads keep for the next load onto the same device; "
        "the bytes freed (a load running keeps its own until it ends).");
  m.def("dtype_bits", [](const std::string& d) {
    auto dt = DtypeFromName(d);
    if (!dt) Raise(InvalidArgumentError("unknown dtype '" + d + "'"));
    return DtypeBits(*dt);
  });
  m.def("convert", &ConvertPy, nb::arg("data"), nb::arg("from_dtype"), nb::arg("to_dtype"),
        "Converts the elements in `data` (safetensors dtype names) with the loader's conversions "
        "(bit-exact with torch's scalar CPU conversions); ValueError for an unknown name or pair.");
}

void BindCrashReport(nb::module_& m) {
  m.def("crash_handler_installed", &CrashHandlerInstalled,
        "Whether a fatal signal prints tensorlift's report (include/tensorlift/crash.h): installed "
        "when this module is imported, unless TENSORLIFT_CRASH_HANDLER=0.");
  m.def(
      "_crash_for_test",
      [](const std::string& kind) {
        if (kind == "segv") {
          volatile int* nowhere = nullptr;
          *nowhere = 1;  // NOLINT: the fault is the point.
        } else if (kind == "abort") {
          std::abort();
        } else {
          throw nb::value_error("kind: segv or abort");
        }
      },
      nb::arg("kind"), "Crashes the process (tests of the crash report only).");
}

}  // namespace

NB_MODULE(_tensorlift, m) {
  m.doc() = "tensorlift's C++ core (use the tensorlift package, not this module)";
  m.attr("__version__") = kVersion;
  // A fatal signal in any thread of this process leaves a report on stderr, then
  // goes on to the handler that was there before (Python's faulthandler, when on).
  InstallCrashHandler();
  BindCrashReport(m);
  BindErrors(m);
  BindCheckpoint(m);
  BindArenaPool(m);
  BindLoaded(m);
  BindStreamer(m);
  BindPeerServer(m);
  BindServing(m);
  BindPeerLoading(m);
  BindFormat(m);
  BindMultiRank(m);
  BindUtilities(m);
}
