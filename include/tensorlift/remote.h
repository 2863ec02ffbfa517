// Loading from a running peer (R-Fork): a process that holds tensors serves
// them; a new process pulls them one-sided over UCX into its own buffers,
// checks every chunk's XXH3, and gets the same LoadedCheckpoint a disk load
// returns. docs/remote.md has the protocol.
//
//   // Source: load from disk (or register your own buffers) and serve.
//   tensorlift::PeerKey key;
//   key.model = "llama-7b";
//   key.revision = "abc123";
//   auto server = tensorlift::PeerServer::ServeCheckpoint("model_dir", key, {});
//   // (*server)->url() is "http://host:port"; it serves until destroyed.
//
//   // Destination: pull from the first peer that works, else from disk.
//   tensorlift::PeerLoadOptions opts;
//   opts.peers = {"http://host:port"};
//   opts.fallback_path = "model_dir";
//   tensorlift::PeerLoadReport report;
//   auto loaded = tensorlift::LoadFromPeer(key, opts, &report);
//
// Trust: a manifest is untrusted input, validated like a file header before
// anything is allocated; every chunk is checked before a tensor is returned;
// on any failure what was pulled is freed and the next source is tried.
// Thread safety: a PeerServer serves from its own threads; its methods may be
// called from any thread. LoadFromPeer may run concurrently.
#ifndef TENSORLIFT_REMOTE_H_
#define TENSORLIFT_REMOTE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tensorlift/checkpoint.h"
#include "tensorlift/dtype.h"
#include "tensorlift/loader.h"
#include "tensorlift/status.h"

namespace tensorlift {

// The version of the control and data protocols; part of every key.
inline constexpr int kPeerProtocolVersion = 1;

// What must match between a source and a destination before any byte moves.
// The parallel layout is `layout` (the sharding rules, docs/remote.md,
// "Layouts") with each side's size and rank in its manifest: sources and
// destinations with the same rules but different tensor-parallel sizes are
// compatible (the destination reads its slices from the source ranks).
struct PeerKey {
  std::string model;     // Model id, e.g. "meta-llama/Llama-2-7b-hf".
  std::string revision;  // An immutable revision (commit or digest).
  // The dtype every tensor was converted to; nullopt: as stored. Its text
  // (canonical form, wire, registry) is "as-stored" or the safetensors name
  // ("BF16"); ParsePeerKeyDtype reads those and torch's spellings, so keys
  // made from "bfloat16" and "BF16" are the same key.
  std::optional<Dtype> dtype;
  std::string quantization = "none";
  std::string layout;  // Sharding rules ("" = every tensor whole).
  int protocol = kPeerProtocolVersion;
  // Optional: the content identity root (tensorlift/content.h, 32 lowercase
  // hex digits) of exactly the bytes wanted. Not part of Canonical(),
  // Digest() or Mismatch(): seeds are still found by the key. A client with
  // it refuses a seed whose manifest publishes another root, recomputes the
  // hashes of the bytes it receives (pulled or handed over) and refuses them
  // on a mismatch, naming the tensor; then tries the next source, as for any
  // refusal. A disk fallback must hash to it too. Whole tensors only: a
  // destination rank of a sliced layout cannot check a whole checkpoint's
  // root (InvalidArgument).
  std::string content;

  // "tensorlift-peer\nprotocol=1\nmodel=...\n...": one line per field, in
  // this order, values as given (a newline in a value is an error of
  // Validate()).
  std::string Canonical() const;
  // 16 hex digits of XXH3-64 over Canonical(): the registry's key.
  std::string Digest() const;
  // "" when equal, else the first field that differs and both values, e.g.
  // "revision: 'abc' (ours) != 'abd' (peer's)".
  std::string Mismatch(const PeerKey& peer) const;
  Status Validate() const;  // Non-empty model, bounded lengths, no control characters.
  bool operator==(const PeerKey& other) const { return Mismatch(other).empty(); }
};

// PeerKey::dtype from its text: "as-stored" is nullopt; a safetensors name
// ("F16") or torch's ("float16", "torch.float16", "half") is that dtype;
// anything else is InvalidArgument.
Result<std::optional<Dtype>> ParsePeerKeyDtype(std::string_view text);
// The text of PeerKey::dtype: "as-stored" or the safetensors name.
std::string_view PeerKeyDtypeName(const std::optional<Dtype>& dtype);

// A key for the checkpoint at `path` (file, index or directory): model is its
// name (the directory's, or the file's without .safetensors), revision "h:"
// and 16 hex digits of XXH3-64 over every tensor's name, dtype, shape and
// byte range in the headers (no tensor data is read: give a real revision
// when weights may change under the same headers).
Result<PeerKey> PeerKeyForCheckpoint(const std::string& path);
// The same for a checkpoint already open (its path names the model), e.g.
// one in object storage: a copy of a local checkpoint has the same key.
Result<PeerKey> PeerKeyForCheckpoint(const Checkpoint& checkpoint);

// Reads a token file (ServeOptions::token, PeerLoadOptions::token): its
// content without surrounding whitespace. Errors: missing/unreadable, empty,
// over 4 KiB, or readable by group/others (kPermissionDenied: "chmod 600 it").
Result<std::string> ReadTokenFile(const std::string& path);

// The chunk size a source serving `total_bytes` checks in when none is
// given (ServeOptions::chunk_bytes = 0): 4 MiB, halved while that cuts the
// bytes into fewer than 128 chunks, down to 64 KiB.
uint64_t AutoChunkBytes(uint64_t total_bytes);

// A tensor-parallel position: this process's rank among `size` ranks.
struct ServeOptions {
  std::string host = "127.0.0.1";  // Address the control endpoint binds and advertises.
  int port = 0;                    // 0: any free port (see PeerServer::port()).
  // When non-empty, every request must carry an HMAC-SHA256 of itself under
  // this token (docs/remote.md, "Security"); remote keys go only to clients
  // that sign.
  std::string token;
  // Bytes per second the source lets clients pull in all (0: no limit); each
  // session gets an equal share, and clients pace themselves to it.
  uint64_t rate_limit = 0;
  int max_sessions = 16;  // Concurrent clients.
  // Checksum granularity (4 KiB .. 1 GiB); 0: AutoChunkBytes of the bytes
  // served. A relay serves a chunk once it is whole and checked, so a chain
  // of relays lags a chunk per hop: small checkpoints get small chunks.
  uint64_t chunk_bytes = 0;
  TensorParallel parallel;  // This source's position.
  // etcd endpoint ("http://host:2379"); empty: not registered.
  std::string registry;
  int registry_ttl_s = 10;  // Lease TTL; renewed every TTL/3.
  // UCX transports (UCX_TLS syntax, e.g. "tcp" or "sm,self"); empty: UCX's
  // defaults (or UCX_TLS from the environment).
  std::string transports;
  // Sessions one UCX worker takes before new sessions get a fresh worker
  // (the old one goes when its last session closes). UCX remembers every
  // peer a worker has met, about 85 bytes each, until the worker goes; this
  // keeps a long-running seed's memory flat. 0: one worker for good.
  uint64_t clients_per_worker = 1024;
  // Same-host handover (docs/remote.md, "Same-host handover"): a client on
  // this host is handed the served memory itself (sealed shared memory that it
  // maps, read-only) instead of pulling copies over UCX. Offered when every
  // served tensor is in sealed shared memory: ServeCheckpoint loads host
  // tensors into it, and a client's handed-over tensors are in it. Device
  // tensors of ServeCheckpoint and Serve (whole allocations of one device)
  // are offered as exported device memory (CUDA IPC handles; the emulated
  // device's memfds) to clients on the same device; not those of
  // ServeBuffers.
  bool handover = true;
  // A resident seed: announced on this host under its key's digest and
  // tensor-parallel position, so that a client here finds it with the key
  // alone (PeerLoadOptions::local), no URL or registry; what `tensorlift serve
  // --resident` runs to keep a model in memory while servers come and go.
  // One resident seed per key and position: a second is refused
  // (kUnavailable).
  bool resident = false;
};

// Serves tensors to peers until destroyed.
class PeerServer {
 public:
  // Loads `path` from disk (LoadOptions `load`) and serves the tensors of
  // this rank: with options.parallel.size > 1, only its slices of the
  // tensors the key's layout shards, and the other tensors whole.
  // load.device puts them on a device and serves them from its memory
  // ("cuda:N": GPU memory, which needs a UCX built with CUDA, e.g. PyPI's
  // libucx-cu12 through TENSORLIFT_UCX_LIB; kUnimplemented says so
  // otherwise). Chunk checksums of device memory are computed on pinned
  // staged copies.
  // Serve(loaded) and become_seed serve device tensors the same way.
  static Result<std::unique_ptr<PeerServer>> ServeCheckpoint(const std::string& path,
                                                             const PeerKey& key,
                                                             const ServeOptions& options,
                                                             const LoadOptions& load = {});
  // Serves tensors already loaded (they stay alive as long as the server).
  static Result<std::unique_ptr<PeerServer>> Serve(std::shared_ptr<const LoadedCheckpoint> loaded,
                                                   const PeerKey& key, const ServeOptions& options);

  // A buffer the caller owns, served by name; `data` must stay valid and
  // unchanged until the server is destroyed. For Serve(tensors) below.
  struct Tensor {
    std::string name;
    Dtype dtype = Dtype::kU8;
    std::vector<int64_t> shape;  // This rank's shape.
    const void* data = nullptr;
    // Sharding of the full tensor: dim (-1: whole) and where this rank's
    // slice starts along it; full_shape empty means `shape`.
    int shard_dim = -1;
    int64_t shard_start = 0;
    std::vector<int64_t> full_shape;
    // Where `data` lives: the host, or a device (DeviceId::Cuda(N): a device
    // address, e.g. a framework's GPU tensor, served from the GPU's memory as
    // ServeCheckpoint serves device tensors; DeviceId::Emulated() in tests).
    DeviceId device;
  };
  // Serves user-registered buffers, in host or device memory (Tensor::device).
  // `keep_alive` is held until the server is destroyed (may be null). A GPU
  // buffer needs a UCX with CUDA support (Unimplemented otherwise, naming
  // TENSORLIFT_UCX_LIB), like any device tensor served.
  static Result<std::unique_ptr<PeerServer>> ServeBuffers(
      std::vector<Tensor> tensors, const PeerKey& key, const ServeOptions& options,
      std::shared_ptr<const void> keep_alive = nullptr);

  virtual ~PeerServer() = default;
  virtual std::string url() const = 0;  // "http://host:port"
  virtual int port() const = 0;
  virtual const PeerKey& key() const = 0;
  virtual uint64_t served_bytes()
      const = 0;  // Bytes of tensors served so far (as reported by clients' sessions).
  virtual int active_sessions() const = 0;
  // UCX workers alive now: the one new sessions get, and older ones that
  // open sessions still use (ServeOptions::clients_per_worker).
  virtual int live_workers() const = 0;
  // The content identity root of the tensors served (32 hex digits; what the
  // manifest and GET /v1/key publish), or "" when they are in device memory.
  virtual std::string content() const = 0;
};

// Host tensors a process holds (an inference server's parameters), copied
// once into sealed shared memory so that a server of `sealed`
// (PeerServer::Serve) hands them to same-host clients (docs/remote.md,
// "Same-host handover"). `copy_on_write` is the same memory mapped privately
// for the process itself: its pages stay shared with `sealed`, one copy in
// the host's memory, until the process writes one (then that page is its
// own). Both keep the memory alive; tensors in name order, each aligned to
// 64 bytes.
struct SharedTensors {
  std::shared_ptr<const LoadedCheckpoint> sealed;
  LoadedCheckpoint copy_on_write;
};
// Whole host tensors only: kInvalidArgument for a device tensor, a slice
// (shard_dim >= 0), a name given twice or a bad shape. `name` names the
// shared memory (/proc/PID/maps shows it).
Result<SharedTensors> ShareTensors(const std::vector<PeerServer::Tensor>& tensors,
                                   const std::string& name);

// PeerLoadOptions::handover: kAuto takes a same-host seed's memory when it
// offers it, kOff always pulls.
enum class HandoverMode : uint8_t { kAuto, kOff };
// "auto" or "off" (the CLI's and Python's spelling); InvalidArgument naming
// the value otherwise.
Result<HandoverMode> ParseHandoverMode(std::string_view name);
std::string_view HandoverModeName(HandoverMode mode);

struct PeerLoadOptions {
  // Control endpoints to try in order ("http://host:port").
  std::vector<std::string> peers;
  // etcd endpoint: live seeds for the key are tried (least loaded first)
  // after `peers`.
  std::string registry;
  std::string token;        // As ServeOptions::token.
  TensorParallel parallel;  // The destination's position.
  // Where to load from when no peer works ("" = fail instead).
  std::string fallback_path;
  // The loads' options, a pull's (a Load of the pull's file, peer_store.h)
  // and the disk fallback's. The options that shape the tensors are the
  // key's, for peers and disk alike: the fallback converts to PeerKey::dtype
  // when it names F32, F16 or BF16 (or torch's float32, float16, bfloat16;
  // another label is taken as stored); fallback_load.dtype, when set, must be
  // that dtype, and fallback_load.filter must be every tensor (else
  // InvalidArgument); the slices are PeerLoadOptions::parallel's under the
  // key's layout; on_tensor is refused (a failed pull would hand out tensors
  // the next source hands out again). The others apply to both (progress,
  // staging, fault threads, gds, content_hash: a pull hashes the content only
  // when kOn, its chunks checked as they land), but mode, engine and threads,
  // which are about reading local files: the fallback's alone.
  LoadOptions fallback_load;
  // How fallback_path is loaded: Load when empty (a local path); another
  // source's loader otherwise, e.g. ObjectStoreFallback() (objstore.h) for
  // s3:// paths. The report's source is then the path itself, not "disk:".
  std::function<Result<LoadedCheckpoint>(const std::string& path, const LoadOptions& options)>
      fallback_loader;
  // How fallback_path is opened when there is no fallback_loader:
  // Checkpoint::Open when empty; another store's opener otherwise, e.g.
  // ObjectStoreOpener() (objstore.h) for s3:// paths. Either way the load is
  // Load's: the key's dtype and this rank's slices, planned as slices and
  // read straight onto `device`. The report's source is "disk:PATH" for
  // Checkpoint::Open, the path itself for an opener.
  std::function<Result<Checkpoint>(const std::string& path)> fallback_open;
  // Where the tensors go, from a peer or from disk: the host, or a GPU
  // (DeviceId::Cuda(N); DeviceId::Emulated() in tests). Pulls land straight
  // in the device's memory when the loaded UCX can write it (a GPU's needs a
  // UCX built with CUDA, e.g. PyPI's libucx-cu12 through TENSORLIFT_UCX_LIB),
  // each chunk checked on a staged copy in pinned host memory; otherwise they
  // land in the GPU pipeline's pinned staging slots (fallback_load's
  // staging_bytes and staging_buffers), are checked there and copied up
  // while the next blocks' bytes arrive. A pull is a load of the
  // destination's tensors as a store's file: fallback_load's options that do
  // not shape the tensors (progress, staging, fault_threads) apply to it. The disk
  // fallback loads straight onto the device, a tensor-parallel rank's slices
  // included, also through fallback_open (a fallback_loader's sliced load is
  // whole tensors, cut in host memory and copied up). fallback_load.device
  // must be the host (its default) or the same device. A seed (become_seed)
  // serves the tensors from where they are (device memory: see
  // ServeCheckpoint).
  DeviceId device;
  // Time-outs: each control request, connecting the data plane, and the
  // longest a pull may go without finishing a get.
  // Each control request must complete within request_timeout_ms (a peer
  // that dribbles its answer is dropped then, whatever it has sent).
  int request_timeout_ms = 5000;
  int connect_timeout_ms = 5000;
  int stall_timeout_ms = 10000;
  // Bytes per second a source must give this client: one whose manifest
  // grants less (its rate limit's share) is skipped, and a pull that has
  // averaged less once it is stall_timeout_ms old fails over, like a stall
  // (a peer that lets a get finish just often enough never stalls); the
  // bytes of its gets in flight count as arriving (a seed serving several
  // clients lands their gets late and together). 0: any.
  uint64_t min_rate = 1000000;
  uint64_t batch_bytes = 8ull << 20;  // The largest single get.
  int max_in_flight = 16;             // Gets outstanding per source rank.
  std::string transports;             // As ServeOptions::transports.
  // After a peer load: serve the result (become a seed) with these options
  // (registry and token are taken from above when empty). See PeerLoad.
  bool become_seed = false;
  ServeOptions seed;
  // Same-host handover (docs/remote.md, "Same-host handover"): kAuto maps a
  // seed's memory when the seed is on this host and offers it (whole tensors
  // from one source rank), and pulls over UCX when it does not or the
  // handover fails; kOff always pulls. A device destination gets one copy
  // from the mapped memory. A seed whose tensors are on a device (a GPU, or
  // the emulated device) hands over its allocations themselves (CUDA IPC):
  // a destination on that same device maps them, no byte copied; any other
  // destination pulls (docs/remote.md, "Same-host handover of GPU memory").
  HandoverMode handover = HandoverMode::kAuto;
  // Ask this host's resident seed for the key (ServeOptions::resident) before
  // `peers` and the registry.
  bool local = true;
  // Handed-over tensors are read-only (a write faults) unless this is set:
  // then a page written becomes this process's own copy, and the seed's
  // memory never changes (what frameworks that change weights in place need).
  // Handed-over device memory is the seed's, shared writable; with this set
  // it is copied once, device to device, into this process's own memory and
  // the seed's is let go (on a GPU also what keeps the tensors valid when
  // the seed exits).
  bool handover_copy_on_write = false;
  // Check every chunk of handed-over memory against the manifest's checksums
  // (reads all of it, on up to 4 threads). Off, the sealed memory is
  // trusted as the seed checksummed it: nothing can write it since.
  bool handover_verify = false;
  // Relaying (docs/remote.md, "Relaying"), with a registry: the pull
  // registers at once as a relay (a partial seed: lease-bound, with its
  // progress), serves every chunk it has received and checked, and takes
  // chunks from the two holders that registered just before it (the root
  // seed for the first), every chunk checked against the root's manifest
  // wherever it came from; a holder that fails, stalls or serves a wrong
  // chunk is dropped and the next earlier one taken. Whole tensors into host
  // memory only (parallel.size 1, no device); other pulls, and pulls that
  // find no whole seed, go as without it. Once its own load is done a relay
  // serves the holders still pulling from it (at most a minute), then stops,
  // unless become_seed: then it is the seed.
  bool relay = true;
  // The address a relay listens on and advertises; empty: seed.host unless
  // that is loopback while the registry is not, then the local address of a
  // connection to the registry (never 127.0.0.1 to other hosts).
  std::string relay_host;
  // Bytes per second a relay lets its children pull in all (0: no limit), so
  // that a new instance's link is not all spent on others.
  uint64_t relay_rate_limit = 0;
};

// What LoadFromPeer did.
struct PeerLoadReport {
  std::string source;                 // The peer URL used, or "disk:PATH".
  std::vector<std::string> failures;  // One line per source that failed, and why.
  uint64_t bytes = 0;                 // Tensor bytes pulled (or loaded).
  double seconds = 0;
  int source_ranks = 0;   // Source ranks read from (layout translation when != 1).
  bool handover = false;  // The tensors are the seed's memory, handed over on this host.
  // A relaying pull (PeerLoadOptions::relay): its own relay's URL, and what
  // each source (the root seed, relays) gave, with why it was dropped.
  std::string relay;
  // Its relay fell behind its parent (a slower link than the chain's) and
  // moved to the end of the chain (docs/remote.md, "Relaying").
  bool relay_behind = false;
  struct Source {
    std::string url;
    uint64_t bytes = 0;
    std::string failure;
  };
  std::vector<Source> sources;
};

// Pulls the tensors for options.parallel from the first compatible peer,
// else loads them from disk; the same LoadedCheckpoint a disk load returns.
Result<LoadedCheckpoint> LoadFromPeer(const PeerKey& key, const PeerLoadOptions& options,
                                      PeerLoadReport* report = nullptr);

// LoadFromPeer, then (options.become_seed) serving what it got.
struct PeerLoad {
  std::shared_ptr<const LoadedCheckpoint> loaded;
  PeerLoadReport report;
  std::unique_ptr<PeerServer> seed;  // Null unless become_seed.
};
Result<PeerLoad> LoadFromPeerAndSeed(const PeerKey& key, const PeerLoadOptions& options);

// Ends the peer pulls of this process, as a stop signal should (tensorlift
// fetch calls it on SIGINT and SIGTERM): no get is posted any more, the gets
// in flight land, their endpoints close, and each pull fails ("stopped")
// without falling back to the disk; relays serving on after their load stop
// (WaitForRelays returns). A process that exits with gets in flight can
// abort its source: UCX's software RMA over TCP fails a fatal check when it
// replies into a connection closed under it (docs/security.md). For the
// rest of the process; async-signal-safe.
void StopPeerPulls();
bool PeerPullsStopped();

// Waits until the relays of this process's finished pulls have stopped
// (their children done, or a minute after their own load), at most
// `timeout_ms`; how many still serve then. A process that exits after a
// relaying pull (tensorlift fetch) calls it first.
int WaitForRelays(int timeout_ms);

}  // namespace tensorlift

#endif  // TENSORLIFT_REMOTE_H_
