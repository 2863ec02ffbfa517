// tensorlift serve / fetch: peer loading from the command line.
#include "tensorlift/remote.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "tensorlift/checksum.h"
#include "tensorlift/safetensors.h"
#include "tensorlift/striped.h"

namespace tensorlift::cli {
namespace {

// The key from the flags, with the defaults taken from `path` (when given).
Result<PeerKey> KeyFrom(const PeerArgs& a, const std::string& path, const StoreArgs& store = {}) {
  PeerKey key;
  if (!path.empty() && (a.model.empty() || a.revision.empty())) {
    TL_ASSIGN_OR_RETURN(const Checkpoint ckpt, OpenCheckpoint(path, store));
    TL_ASSIGN_OR_RETURN(key, PeerKeyForCheckpoint(ckpt));
  }
  if (!a.model.empty()) key.model = a.model;
  if (!a.revision.empty()) key.revision = a.revision;
  if (key.model.empty())
    return InvalidArgumentError("--model is needed (or a checkpoint path to take it from)");
  TL_ASSIGN_OR_RETURN(key.dtype, ParsePeerKeyDtype(a.dtype));
  key.quantization = a.quantization;
  key.layout = a.layout;
  TL_RETURN_IF_ERROR(key.Validate());
  return key;
}

Result<std::string> Token(const std::string& file) {
  if (file.empty()) return std::string();
  return ReadTokenFile(file);
}

int Fail(const Status& st, int code = kExitInvalid) {
  std::fprintf(stderr, "%s\n", st.ToString().c_str());
  return code;
}

// SIGINT and SIGTERM blocked in this thread and every thread started after,
// so that WaitServing's sigwait gets them.
sigset_t BlockStopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

// fetch's SIGINT and SIGTERM (blocked in every thread, BlockStopSignals):
// its pulls stop cleanly (StopPeerPulls: no source is left replying into a
// connection closed under it), and fetch exits with 128 + the signal; a
// second signal, or 30 s without an exit, ends the process at once.
class StopWatcher {
 public:
  explicit StopWatcher(const sigset_t& set) : set_(set) {
    std::thread([this] {
      int sig = 0;
      if (sigwait(&set_, &sig) != 0) return;
      StopPeerPulls();
      {
        std::lock_guard<std::mutex> lock(mu_);
        signal_ = sig;
      }
      cv_.notify_all();
      const timespec grace{30, 0};
      sigtimedwait(&set_, nullptr, &grace);
      std::fprintf(stderr, "stopped (signal %d)\n", sig);
      std::_Exit(128 + sig);
    }).detach();  // Lives as long as the process (it refers to a static).
  }
  // The signal that came, or 0.
  int signal() const {
    std::lock_guard<std::mutex> lock(mu_);
    return signal_;
  }
  // Blocks until one comes.
  int Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return signal_ != 0; });
    return signal_;
  }

 private:
  const sigset_t set_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int signal_ = 0;
};

// Writes the URL to `ready_file` (when given), then serves until a signal
// (`wait` returns it).
int WaitServing(const PeerServer& server, const std::string& ready_file,
                const std::function<int()>& wait) {
  if (!ready_file.empty()) {
    const std::string tmp = ready_file + ".tmp";
    std::ofstream(tmp) << server.url() << "\n";
    if (std::rename(tmp.c_str(), ready_file.c_str()) != 0)
      return Fail(IOError("cannot write " + ready_file));
  }
  const int sig = wait();
  std::printf("stopping (signal %d): served %llu bytes\n", sig,
              static_cast<unsigned long long>(server.served_bytes()));
  return kExitOk;
}

}  // namespace

int RunServe(const ServeArgs& args) {
  auto key = KeyFrom(args.peer, args.path);
  if (!key.ok()) return Fail(key.status(), kExitUsage);
  auto token = Token(args.token_file);
  if (!token.ok()) return Fail(token.status());
  ServeOptions opts;
  opts.host = args.host;
  opts.port = args.port;
  opts.token = *token;
  opts.rate_limit = static_cast<uint64_t>(args.rate_limit_mbps * 1e6);
  opts.chunk_bytes = args.chunk_bytes;
  opts.max_sessions = args.max_sessions;
  opts.clients_per_worker = args.clients_per_worker;
  opts.parallel = {args.peer.tp_size, args.peer.tp_rank};
  opts.registry = args.registry;
  opts.registry_ttl_s = args.registry_ttl_s;
  opts.transports = args.peer.transports;
  opts.handover = !args.no_handover;
  opts.resident = args.resident;
  const sigset_t set = BlockStopSignals();  // Before any thread starts.
  LoadOptions load;
  auto device = ParseDevice(args.device);
  if (!device.ok()) return Fail(device.status(), kExitUsage);
  load.device = *device;
  auto server = PeerServer::ServeCheckpoint(args.path, *key, opts, load);
  if (!server.ok()) return Fail(server.status());
  std::printf("serving %s (rank %d of %d) at %s\nkey %s revision %s digest %s\n", args.path.c_str(),
              opts.parallel.rank, opts.parallel.size, (*server)->url().c_str(), key->model.c_str(),
              key->revision.c_str(), key->Digest().c_str());
  if (const std::string content = (*server)->content(); !content.empty())
    std::printf("content %s\n", content.c_str());
  std::fflush(stdout);
  return WaitServing(**server, args.ready_file, [&set] {
    int sig = 0;
    sigwait(&set, &sig);
    return sig;
  });
}

// fetch --stripe: every source at once (LoadStriped), then, with --seed, serving
// what it got.
Result<PeerLoad> FetchStriped(const FetchArgs& args, const PeerKey& key, const std::string& token,
                              std::string* source) {
  StripeOptions o;
  for (const std::string& f : args.fallback) {
    std::string& slot = IsObjectStoreUrl(f) ? o.object_url : o.path;
    if (!slot.empty()) {
      return InvalidArgumentError(
          "fetch --stripe: at most one local path and one bucket URL in "
          "--fallback");
    }
    slot = f;
  }
  if (o.path.empty() && o.object_url.empty()) {
    return InvalidArgumentError(
        "fetch --stripe: give --fallback (a local path or a bucket): the headers come from it");
  }
  if (args.peer.tp_size != 1 && args.seed) {
    return InvalidArgumentError(
        "fetch --stripe --seed: a seed of striped loads serves whole tensors; a tensor-parallel "
        "rank's slices (--tp-size) are not served");
  }
  // A rank's slices: the loader plans them, every source reads only their bytes.
  o.load.parallel = {args.peer.tp_size, args.peer.tp_rank};
  o.load.layout = key.layout;
  o.store = args.store.ToOptions();
  o.peers = args.urls;
  o.registry = args.registry;
  o.token = token;
  o.key = key;
  o.transports = args.peer.transports;
  o.request_timeout_ms = o.connect_timeout_ms = o.stall_timeout_ms = args.timeout_ms;
  o.min_rate = static_cast<uint64_t>(args.min_rate_mbps * 1e6);
  TL_ASSIGN_OR_RETURN(o.load.device, ParseDevice(args.device));
  o.use_page_cache = !args.stripe_cached;
  StripeReport report;
  TL_ASSIGN_OR_RETURN(LoadedCheckpoint loaded, LoadStriped(o, &report));
  PeerLoad out;
  out.loaded = std::make_shared<const LoadedCheckpoint>(std::move(loaded));
  out.report.failures = report.failures;
  out.report.bytes = report.bytes;
  out.report.seconds = report.seconds;
  *source = std::to_string(report.sources.size()) + " source(s) at once" +
            (report.checked ? ", every chunk checked" : "") +
            (report.note.empty() ? "" : " (" + report.note + ")");
  for (const StripeSourceReport& s : report.sources) {
    char line[512];
    std::snprintf(line, sizeof(line), "\n  %s: %llu bytes in %llu ranges%s%s", s.name.c_str(),
                  static_cast<unsigned long long>(s.bytes),
                  static_cast<unsigned long long>(s.ranges),
                  s.failure.empty() ? "" : ", failed: ", s.failure.c_str());
    *source += line;
  }
  if (args.seed) {
    ServeOptions so;
    so.host = args.seed_host.empty() ? "127.0.0.1" : args.seed_host;
    so.registry = args.registry;
    so.registry_ttl_s = args.registry_ttl_s;
    so.token = token;
    so.transports = args.peer.transports;
    TL_ASSIGN_OR_RETURN(out.seed, PeerServer::Serve(out.loaded, key, so));
  }
  return out;
}

int RunFetch(const FetchArgs& args) {
  if (args.fallback.size() > 1 && !args.stripe) {
    return Fail(InvalidArgumentError("fetch: give one --fallback (several need --stripe)"),
                kExitUsage);
  }
  const std::string first_fallback = args.fallback.empty() ? "" : args.fallback[0];
  auto key = KeyFrom(args.peer, first_fallback, args.store);
  if (!key.ok()) return Fail(key.status(), kExitUsage);
  key->content = args.content;
  if (Status st = key->Validate(); !st.ok()) return Fail(st, kExitUsage);
  if (!args.content.empty() && args.stripe) {
    return Fail(
        InvalidArgumentError("fetch: --content checks one source's bytes; not with --stripe"),
        kExitUsage);
  }
  if (args.stripe && (args.no_relay || args.relay_rate_limit > 0)) {
    return Fail(InvalidArgumentError("fetch --stripe does not relay: --no-relay and "
                                     "--relay-rate-limit are for pulls with --registry"),
                kExitUsage);
  }
  auto token = Token(args.token_file);
  if (!token.ok()) return Fail(token.status());
  PeerLoadOptions opts;
  opts.peers = args.urls;
  opts.registry = args.registry;
  opts.token = *token;
  opts.parallel = {args.peer.tp_size, args.peer.tp_rank};
  opts.fallback_path = first_fallback;
  if (IsObjectStoreUrl(first_fallback)) {
    // Opened through the bucket and loaded as the peer load's: its slices are
    // --tp-size/--tp-rank's with the key's layout, straight onto --device
    // (fetch takes no --cache-dir, --tp-size or --layout for the bucket).
    opts.fallback_open = ObjectStoreOpener(args.store.ToOptions());
  }
  opts.transports = args.peer.transports;
  opts.request_timeout_ms = args.timeout_ms;
  opts.connect_timeout_ms = args.timeout_ms;
  opts.stall_timeout_ms = args.timeout_ms;
  opts.min_rate = static_cast<uint64_t>(args.min_rate_mbps * 1e6);
  auto device = ParseDevice(args.device);
  if (!device.ok()) return Fail(device.status(), kExitUsage);
  opts.device = *device;
  auto handover = ParseHandoverMode(args.handover);  // CLI11 checked it too.
  if (!handover.ok()) return Fail(handover.status(), kExitUsage);
  opts.handover = *handover;
  opts.handover_verify = args.handover_verify;
  opts.handover_copy_on_write = args.copy_on_write;
  opts.local = !args.no_local;
  opts.relay = !args.no_relay;
  opts.relay_host = args.seed_host;
  opts.relay_rate_limit = static_cast<uint64_t>(args.relay_rate_limit * 1e6);
  opts.seed.registry_ttl_s = args.registry_ttl_s;
  if (args.no_relay && args.relay_rate_limit > 0) {
    return Fail(
        InvalidArgumentError("fetch: --relay-rate-limit limits a relay; not with --no-relay"),
        kExitUsage);
  }
  if (!args.out.empty() && !opts.device.on_host()) {
    return Fail(InvalidArgumentError("fetch: --out writes a host fetch: leave --device at cpu"),
                kExitUsage);
  }
  if (opts.peers.empty() && opts.registry.empty() && opts.fallback_path.empty() && !opts.local) {
    return Fail(InvalidArgumentError("fetch: give a peer URL, --registry, or --fallback "
                                     "(--no-local leaves no source)"),
                kExitUsage);
  }
  // Before any thread starts; a static, as the watcher's thread outlives this call.
  static StopWatcher stop(BlockStopSignals());
  if (args.seed) {
    opts.become_seed = true;
    opts.seed.host = args.seed_host.empty() ? "127.0.0.1" : args.seed_host;
    opts.seed.registry_ttl_s = args.registry_ttl_s;
  }
  std::string striped_from;
  auto pulled = args.stripe ? FetchStriped(args, *key, *token, &striped_from)
                            : LoadFromPeerAndSeed(*key, opts);
  if (const int sig = stop.signal()) {
    std::fprintf(stderr, "stopped (signal %d)%s%s\n", sig, pulled.ok() ? "" : ": ",
                 pulled.ok() ? "" : pulled.status().message().c_str());
    return 128 + sig;
  }
  if (!pulled.ok()) return Fail(pulled.status());
  const PeerLoadReport& report = pulled->report;
  for (const std::string& f : report.failures) std::fprintf(stderr, "fallback: %s\n", f.c_str());
  const std::shared_ptr<const LoadedCheckpoint>& loaded = pulled->loaded;
  FILE* out = args.checksum ? stderr : stdout;
  if (!args.content.empty())
    std::fprintf(out, "content %s: the bytes received hash to it\n", args.content.c_str());
  if (args.stripe) {
    std::fprintf(out, "fetched %zu tensors, %llu bytes from %s\nin %.3f s: %.2f GB/s\n",
                 loaded->tensors().size(), static_cast<unsigned long long>(loaded->total_bytes()),
                 striped_from.c_str(), report.seconds,
                 report.seconds > 0 ? loaded->total_bytes() / report.seconds / 1e9 : 0.0);
  } else {
    std::fprintf(out,
                 "fetched %zu tensors, %llu bytes from %s (%d source ranks%s) in %.3f s: %.2f "
                 "GB/s\n",
                 loaded->tensors().size(), static_cast<unsigned long long>(loaded->total_bytes()),
                 report.source.c_str(), report.source_ranks, report.handover ? ", handed over" : "",
                 report.seconds,
                 report.seconds > 0 ? loaded->total_bytes() / report.seconds / 1e9 : 0.0);
  }
  if (!report.relay.empty() || !report.sources.empty()) {
    // A relaying pull: what each source gave (a working fan-out or a silent
    // fallback to the root alone are told apart here).
    std::fprintf(out, "relayed%s%s%s; from %zu source(s):\n", report.relay.empty() ? "" : " at ",
                 report.relay.c_str(),
                 report.relay_behind ? " (behind its parent: moved to the chain's end)" : "",
                 report.sources.size());
    for (const PeerLoadReport::Source& s : report.sources) {
      std::fprintf(out, "  %s: %llu bytes%s%s\n", s.url.c_str(),
                   static_cast<unsigned long long>(s.bytes),
                   s.failure.empty() ? "" : ", dropped: ", s.failure.c_str());
    }
  } else {
    for (const FileReport& f : loaded->files()) {
      if (f.bytes)
        std::fprintf(out, "  %s: %s, %llu bytes\n", f.path.c_str(), f.reason.c_str(),
                     static_cast<unsigned long long>(f.bytes));
    }
  }
  if (!args.out.empty()) {
    std::vector<TensorView> views;
    for (const LoadedTensor& t : loaded->tensors()) {
      std::vector<uint64_t> shape(t.shape.begin(), t.shape.end());
      views.push_back(
          {t.name, t.dtype, shape,
           std::span<const std::byte>(static_cast<const std::byte*>(t.data), t.nbytes)});
    }
    ::mkdir(args.out.c_str(), 0755);
    Metadata md{{"format", "pt"},
                {"tensorlift.peer.model", key->model},
                {"tensorlift.peer.revision", key->revision}};
    const std::string file = args.out + "/model.safetensors";
    Status st = WriteFile(file, views, md);
    if (!st.ok()) return Fail(st.WithContext(file));
    std::fprintf(out, "wrote %s\n", file.c_str());
  }
  if (args.checksum) {
    const int rc = PrintChecksums(*loaded);
    if (rc != kExitOk) return rc;
  }
  if (args.seed && pulled->seed) {
    std::fprintf(out, "seeding at %s\n", pulled->seed->url().c_str());
    std::fflush(out);
    std::fflush(stdout);
    return WaitServing(*pulled->seed, args.ready_file, [] { return stop.Wait(); });
  }
  // A relay serves the holders still pulling from it before the process goes.
  std::fflush(out);
  std::fflush(stdout);
  WaitForRelays(120000);
  if (const int sig = stop.signal()) return 128 + sig;
  return kExitOk;
}

}  // namespace tensorlift::cli
