// The verbs of the tensorlift CLI. Each returns the process exit code:
// 0 ok, 1 invalid input (a bad file, a missing path), 2 usage.
#ifndef TENSORLIFT_TOOLS_COMMANDS_H_
#define TENSORLIFT_TOOLS_COMMANDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "tensorlift/checkpoint.h"
#include "tensorlift/loader.h"
#include "tensorlift/objstore.h"

namespace tensorlift::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitInvalid = 1;
inline constexpr int kExitUsage = 2;

// Object storage (s3://, gs:// paths): overrides of what the environment says.
struct StoreArgs {
  std::string endpoint;  // --endpoint-url
  std::string region;
  std::string profile;
  bool no_sign = false;   // --no-sign-request: public buckets.
  std::string cache_dir;  // --cache-dir (load): a write-through cache of whole objects.
  // load: this tensor-parallel rank's slices only (--tp-size, --tp-rank, --layout).
  int tp_size = 1;
  int tp_rank = 0;
  std::string layout;
  ObjectStoreOptions ToOptions() const;
};
// A checkpoint on local disk or, for s3:// and gs:// paths, in a bucket.
Result<Checkpoint> OpenCheckpoint(const std::string& path, const StoreArgs& store);
// Loads a local or object-storage path.
Result<LoadedCheckpoint> LoadPath(const std::string& path, const LoadOptions& options,
                                  const StoreArgs& store);

int RunInspect(const std::string& path, bool json, const StoreArgs& store);
// sha256_source (--sha256): empty, "hub", or a digest list (tools/sha256.h).
int RunVerify(const std::vector<std::string>& paths, bool quiet, const StoreArgs& store,
              const std::string& sha256_source);

struct LoadArgs {
  std::string path;
  std::string filter;  // Regex; empty: all.
  std::string mode = "auto";
  std::string engine = "auto";
  // The numeric defaults are LoadOptions' (include/tensorlift/loader.h), written once there.
  int threads = tensorlift::LoadOptions{}.threads;
  int queue_depth = tensorlift::LoadOptions{}.queue_depth;
  uint64_t block_mib = tensorlift::LoadOptions{}.block_size >> 20;
  bool checksum = false;
  bool progress = true;  // Only drawn on a terminal.
  std::string device = "cpu";
  std::string dtype;  // Empty: keep each tensor's.
  int staging_buffers = tensorlift::LoadOptions{}.staging_buffers;
  uint64_t staging_mib = tensorlift::LoadOptions{}.staging_bytes >> 20;
  bool gds = tensorlift::LoadOptions{}.gds;
  bool content_hash = true;  // LoadOptions::content_hash auto (true) or off.
  bool copy = false;         // auto: owned copies of page-cached files, not views.
  bool mpi = false;          // One rank of an MPI job (mpirun): read this rank's share.
  StoreArgs store;
};
int RunLoad(const LoadArgs& args);
// RunLoad with --mpi (load_mpi.cc): `opts` already parsed from `args`.
int RunLoadMpi(const LoadArgs& args, const LoadOptions& opts);

struct SparsifyArgs {
  std::string input;
  std::string output;
  std::string prune = "none";  // "none" or "magnitude:FRACTION".
  double min_sparsity = 0.3;
  std::string targets = R"(\.weight$)";
  std::string max_shard_size = "5GB";  // Bytes, or with KB/MB/GB/KiB/MiB/GiB.
  bool no_sparsity_config = false;     // Leave config.json as it is.
};
// Writes a sparse-bitmask copy of a checkpoint and prints what it did.
int RunSparsify(const SparsifyArgs& args);

// "12.3 MiB": bytes for people.
std::string HumanBytes(uint64_t bytes);

// Peer loading: the key's fields and this side's position (serve, fetch).
struct PeerArgs {
  std::string model;     // Default: the checkpoint's name.
  std::string revision;  // Default: a digest of the checkpoint's headers.
  std::string dtype = "as-stored";
  std::string quantization = "none";
  std::string layout;  // Sharding rules ("" = whole tensors).
  int tp_size = 1;
  int tp_rank = 0;
  std::string transports;  // UCX_TLS syntax; empty: UCX's default.
};
struct ServeArgs {
  std::string path;
  PeerArgs peer;
  std::string host = "127.0.0.1";
  int port = 0;
  std::string registry;
  int registry_ttl_s = 10;
  std::string token_file;
  double rate_limit_mbps = 0;  // MB/s for all clients; 0: none.
  uint64_t chunk_bytes = 0;    // ServeOptions::chunk_bytes (0: AutoChunkBytes).
  int max_sessions = 16;
  uint64_t clients_per_worker = 1024;
  std::string ready_file;      // Written with the URL once serving.
  std::string device = "cpu";  // Where the served tensors live.
  bool no_handover = false;    // ServeOptions::handover off.
  bool resident = false;       // ServeOptions::resident.
};
// Loads a checkpoint and serves it until SIGINT/SIGTERM.
int RunServe(const ServeArgs& args);
struct FetchArgs {
  std::vector<std::string> urls;
  PeerArgs peer;
  std::string registry;
  std::string token_file;
  // Checkpoint to load when no peer works (a path or an s3:// URL); with
  // --stripe, a local path and/or a URL used together with the peers.
  std::vector<std::string> fallback;
  bool stripe = false;         // Every source at once (LoadStriped), not one after another.
  bool stripe_cached = false;  // Stripe even when the local copy is in the page cache.
  StoreArgs store;             // For an s3:// fallback.
  std::string out;             // Directory to write model.safetensors into.
  std::string content;         // PeerKey::content: exactly these bytes.
  bool checksum = false;
  int timeout_ms = 10000;
  double min_rate_mbps = 1;  // PeerLoadOptions::min_rate, in MB/s.
  // Then serve what was pulled (become a seed) until SIGINT/SIGTERM.
  bool seed = false;
  // The address a seed or relay listens on and advertises; empty: 127.0.0.1
  // for a seed, and for a relay the address toward the registry unless that
  // is loopback (PeerLoadOptions::relay_host).
  std::string seed_host;
  bool no_relay = false;        // PeerLoadOptions::relay off.
  double relay_rate_limit = 0;  // PeerLoadOptions::relay_rate_limit, in MB/s.
  int registry_ttl_s = 10;
  std::string ready_file;         // Written with the seed's URL once serving.
  std::string device = "cpu";     // Where the tensors go.
  std::string handover = "auto";  // PeerLoadOptions::handover.
  bool handover_verify = false;
  bool copy_on_write = false;  // PeerLoadOptions::handover_copy_on_write.
  bool no_local = false;       // PeerLoadOptions::local off.
};
// Pulls a checkpoint from peers (or the fallback) and writes or checksums it.
int RunFetch(const FetchArgs& args);

// Prints "name<TAB>XXH3-64" per tensor, in name order (device tensors are
// copied to the host first); kExitInvalid when a copy fails.
int PrintChecksums(const LoadedCheckpoint& loaded);

// Prints what was built and what works here (Capabilities()); always 0.
int RunDoctor(const std::string& path, bool json);

}  // namespace tensorlift::cli

#endif  // TENSORLIFT_TOOLS_COMMANDS_H_
