// Peers and many sources: PeerServer and the serve_* functions (a rank's
// tensors served to peers), load_from_peer, load_striped (include/tensorlift/
// remote.h, striped.h) and reading ranges of objects in a bucket.

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "ext_common.h"
#include "tensorlift/content.h"
#include "tensorlift/remote.h"
#include "tensorlift/striped.h"

namespace tensorlift::ext {
namespace {

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
      key.dtype = Unwrap(ParsePeerKeyDtype(value));
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
  d["dtype"] = std::string(PeerKeyDtypeName(key.dtype));
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

}  // namespace

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
      .def(
          "close",
          [](PyPeerServer& s) {
            nb::gil_scoped_release nogil;
            s.server.reset();
          },
          "Stops serving (waits for the control thread; pulls in progress fail over on the "
          "clients).");
}

namespace {

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
  load.device = Unwrap(ParseDevice(device));
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
    tensors.push_back({name, *d, shape, reinterpret_cast<const void*>(ptr), dim, start, full,
                       Unwrap(ParseDevice(device))});
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
    tensors.push_back({tname, *d, shape, reinterpret_cast<const void*>(ptr), dim, start, full,
                       Unwrap(ParseDevice(device))});
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

}  // namespace

void BindServing(nb::module_& m) {
#define TL_SERVE_ARGS                                                                             \
  nb::arg("host") = "127.0.0.1", nb::arg("port") = 0, nb::arg("token") = "",                      \
  nb::arg("rate_limit") = 0, nb::arg("max_sessions") = 16, nb::arg("tp_size") = 1,                \
  nb::arg("tp_rank") = 0, nb::arg("registry") = "", nb::arg("transports") = "",                   \
  nb::arg("chunk_bytes") = uint64_t{0}, nb::arg("registry_ttl") = 10, nb::arg("handover") = true, \
  nb::arg("resident") = false
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

namespace {

// load_from_peer: (Loaded, report dict, the seed server or None).
nb::tuple LoadFromPeerPy(const nb::dict& key, const std::vector<std::string>& peers,
                         const std::string& registry, const std::string& token, int tp_size,
                         int tp_rank, const std::string& fallback, const std::string& mode,
                         int timeout_ms, const std::string& transports, bool become_seed,
                         const std::string& seed_host, uint64_t batch_bytes, int max_in_flight,
                         const std::string& device, const std::string& handover,
                         bool handover_copy_on_write, bool handover_verify, bool relay,
                         const std::string& relay_host, double relay_rate_limit_mbps) {
  if (!(relay_rate_limit_mbps >= 0 && relay_rate_limit_mbps <= 1e6))
    throw nb::value_error("relay_rate_limit: MB/s in [0, 1e6]");
  if (!relay && relay_rate_limit_mbps > 0)
    throw nb::value_error("relay_rate_limit limits a relay; not with relay=False");
  PeerLoadOptions o;
  o.device = Unwrap(ParseDevice(device));  // A bad name is a ValueError before any I/O.
  o.peers = peers;
  o.registry = registry;
  o.token = token;
  o.parallel = {tp_size, tp_rank};
  o.fallback_path = fallback;
  if (IsObjectStoreUrl(fallback)) o.fallback_open = ObjectStoreOpener();
  o.fallback_load.mode = Unwrap(ParseIoMode(mode));
  o.request_timeout_ms = o.connect_timeout_ms = o.stall_timeout_ms = timeout_ms;
  o.transports = transports;
  o.become_seed = become_seed;
  o.seed.host = seed_host;
  o.batch_bytes = batch_bytes;
  o.max_in_flight = max_in_flight;
  o.handover = Unwrap(ParseHandoverMode(handover));
  o.handover_copy_on_write = handover_copy_on_write;
  o.handover_verify = handover_verify;
  o.relay = relay;
  o.relay_host = relay_host;
  o.relay_rate_limit = static_cast<uint64_t>(relay_rate_limit_mbps * 1e6);
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
  // A relaying pull: its relay's URL, and what each source gave.
  report["relay"] = pl.report.relay.empty() ? nb::object(nb::none()) : nb::cast(pl.report.relay);
  report["relay_behind"] = pl.report.relay_behind;
  nb::list sources;
  for (const PeerLoadReport::Source& s : pl.report.sources) {
    nb::dict d;
    d["url"] = s.url;
    d["bytes"] = s.bytes;
    d["failure"] = s.failure;
    sources.append(d);
  }
  report["sources"] = sources;
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
                        const std::string& region, const nb::object& names, bool use_page_cache,
                        int tp_size, int tp_rank, const std::string& layout) {
  const DeviceId where = Unwrap(ParseDevice(device));
  StripeOptions o;
  o.load.parallel = {tp_size, tp_rank};
  o.load.layout = layout;
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
  o.load.device = where;
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

}  // namespace

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
  m.def(
      "wait_for_relays",
      [](int timeout_ms) {
        nb::gil_scoped_release nogil;
        return WaitForRelays(timeout_ms);
      },
      nb::arg("timeout_ms"),
      "Waits until this process's relays have stopped (their children done), at most timeout_ms; "
      "how many still serve.");
  m.def(
      "stop_pulls", [] { StopPeerPulls(); },
      "Ends this process's peer pulls cleanly, for good (StopPeerPulls).");
  m.def("load_from_peer", &LoadFromPeerPy, nb::arg("key"),
        nb::arg("peers") = std::vector<std::string>{}, nb::arg("registry") = "",
        nb::arg("token") = "", nb::arg("tp_size") = 1, nb::arg("tp_rank") = 0,
        nb::arg("fallback") = "", nb::arg("mode") = "auto", nb::arg("timeout_ms") = 10000,
        nb::arg("transports") = "", nb::arg("become_seed") = false,
        nb::arg("seed_host") = "127.0.0.1", nb::arg("batch_bytes") = uint64_t{8} << 20,
        nb::arg("max_in_flight") = 16, nb::arg("device") = "cpu", nb::arg("handover") = "auto",
        nb::arg("handover_copy_on_write") = true, nb::arg("handover_verify") = false,
        nb::arg("relay") = true, nb::arg("relay_host") = "", nb::arg("relay_rate_limit") = 0.0,
        "Pulls from the first working peer (then the registry's seeds, then disk) onto "
        "`device`: (Loaded, report, seed or None).");
  m.def("load_striped", &LoadStripedPy, nb::arg("path") = "", nb::arg("object_url") = "",
        nb::arg("peers") = std::vector<std::string>{}, nb::arg("registry") = "",
        nb::arg("token") = "", nb::arg("key") = nb::none(), nb::arg("device") = "cpu",
        nb::arg("timeout_ms") = 10000, nb::arg("transports") = "",
        nb::arg("range_bytes") = uint64_t{8} << 20, nb::arg("disk_threads") = 4,
        nb::arg("object_threads") = 0, nb::arg("endpoint") = "", nb::arg("region") = "",
        nb::arg("names") = nb::none(), nb::arg("use_page_cache") = true, nb::arg("tp_size") = 1,
        nb::arg("tp_rank") = 0, nb::arg("layout") = "",
        "Loads from the local files, a bucket and peers at once (include/tensorlift/"
        "striped.h): (Loaded, report); tp_size, tp_rank, layout: a tensor-parallel rank's "
        "slices alone.");
}

}  // namespace tensorlift::ext
