// Weights from object storage: s3://bucket/key-or-prefix on AWS S3 or any
// store with its API (MinIO, Ceph, SeaweedFS), and gs://bucket/... through
// GCS's S3-interoperable XML API with HMAC keys (public API).
//
//   tensorlift::ObjectStoreOptions store;               // settings as AWS's tools find them
//   auto ckpt = tensorlift::LoadFromObjectStore("s3://models/llama-7b/", {}, store);
//
// A path is a .safetensors object, an index json, or a prefix holding either
// (the rules of a local directory: model.safetensors.index.json, else one
// *.safetensors.index.json, else every *.safetensors directly under it).
// Headers come from one small ranged GET per file and are validated as a
// local file's are; then the planned byte ranges are fetched with many
// ranged GETs in parallel over kept-alive connections, each written straight
// into the tensors' final host buffer (never a second copy of the model).
// Transient failures (5xx, throttling, timeouts, resets, short bodies) are
// retried per range with backoff; anything else is one clear error, and a
// failed load returns no tensors.
//
// Settings (ObjectStoreOptions, else the environment): AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION, AWS_ENDPOINT_URL,
// AWS_PROFILE, AWS_CA_BUNDLE, ~/.aws/credentials and ~/.aws/config; no
// credentials means unsigned requests (public buckets). docs/object-storage.md.
#ifndef TENSORLIFT_OBJSTORE_H_
#define TENSORLIFT_OBJSTORE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "tensorlift/checkpoint.h"
#include "tensorlift/loader.h"
#include "tensorlift/remote.h"  // TensorParallel
#include "tensorlift/status.h"

namespace tensorlift {

// True for "s3://..." and "gs://..." paths.
bool IsObjectStoreUrl(std::string_view path);

struct ObjectStoreOptions {
  // Overrides of the environment's settings (empty: from the environment).
  std::string endpoint;  // "http://127.0.0.1:9000", "https://s3.eu-west-1.amazonaws.com"
  std::string region;
  std::string profile;              // Of ~/.aws/credentials and ~/.aws/config.
  bool anonymous = false;           // Unsigned requests, even with credentials around.
  std::string addressing = "auto";  // "auto", "path" or "virtual" (hosted).
  // Transfers: each ranged GET fetches up to request_bytes; at most
  // max_in_flight_bytes are requested at once (connections = that / request_bytes,
  // at most `connections`).
  int connections = 16;
  uint64_t request_bytes = 16ull << 20;
  uint64_t max_in_flight_bytes = 256ull << 20;
  int retries = 5;  // Per range, on transient errors.
  // The slowest a connection may deliver, in bytes/s: a transfer under it for 30 s is a
  // time-out (and retried), so an attempt at a range ends within request_bytes / min_rate
  // + 30 s (16 MiB: under 5 minutes), however a server trickles. 0: no floor but 1 byte/s.
  uint64_t min_rate = 64 << 10;
  // Tensor-parallel ranks: what LoadOptions::parallel and layout do (given
  // here or there, the same in both when in both): the tensors `layout`
  // splits come back as this rank's slice, only its bytes fetched (rows of a
  // slice within 1 MiB of each other as one GET of their span).
  TensorParallel parallel;
  std::string layout;
  // A write-through cache directory ("": none). An object whose every tensor
  // a load fetched is written to DIR/BUCKET/KEY (with KEY.tl-etag: its size
  // and ETag); a later load reads that copy from disk while the bucket lists
  // the same size and ETag for the object. Whole-object loads only (not with
  // parallel.size > 1), and LoadFromObjectStore(url) only.
  std::string cache_dir;
};

// What a load from object storage did.
struct ObjectStoreReport {
  std::string endpoint;
  std::string credential_source;  // "environment", "~/.aws/credentials [default]", ...
  uint64_t bytes = 0;             // Object bytes received (headers and retries included).
  uint64_t requests = 0;          // Ranged GETs of tensor data.
  uint64_t retries = 0;
  int connections = 0;
};

// The checkpoint at `url`, its headers fetched and validated (Checkpoint::
// Open's rules). Its shards' paths are URLs.
Result<Checkpoint> OpenObjectStoreCheckpoint(const std::string& url,
                                             const ObjectStoreOptions& store = {});

// Loads the tensors of `url` that pass options.filter into host memory, or
// onto options.device through the GPU pipeline's staging slots (host memory
// bounded by them, not by the checkpoint). It is Load over the checkpoint
// opened through the bucket, so every option works as Load's rule for
// sources says (loader.h): the ones about local files' reads (mode, engine,
// threads) are refused when set, never ignored. options.progress is called
// with the bytes fetched.
Result<LoadedCheckpoint> LoadFromObjectStore(const std::string& url,
                                             const LoadOptions& options = {},
                                             const ObjectStoreOptions& store = {},
                                             ObjectStoreReport* report = nullptr);
// The same for a checkpoint opened with OpenObjectStoreCheckpoint (its
// headers are not fetched again).
Result<LoadedCheckpoint> LoadFromObjectStore(const Checkpoint& checkpoint,
                                             const LoadOptions& options = {},
                                             const ObjectStoreOptions& store = {},
                                             ObjectStoreReport* report = nullptr);

// Bytes [offset, offset + bytes) of the object at `url` into `dst` (ranged
// GETs, retried as a load's are): for reads of part of a tensor (safe_open's
// slices). An error when the object is shorter.
Status ReadObjectStoreRange(const std::string& url, uint64_t offset, uint64_t bytes, void* dst,
                            const ObjectStoreOptions& store = {});

// A fallback loader for peer loads (PeerLoadOptions::fallback_loader): s3://
// and gs:// paths through LoadFromObjectStore with `store`, others through
// Load. Its tensor-parallel loads are whole tensors cut in host memory (the
// peer load needs their full shapes): prefer ObjectStoreOpener, unless
// store.cache_dir should keep the objects.
std::function<Result<LoadedCheckpoint>(const std::string& path, const LoadOptions& options)>
ObjectStoreFallback(const ObjectStoreOptions& store = {});

// An opener for peer loads' fallback (PeerLoadOptions::fallback_open): s3://
// and gs:// paths through OpenObjectStoreCheckpoint with `store`, others
// through Checkpoint::Open; the peer load then reads the rank's slices, and
// only those, straight onto its device. store.cache_dir, parallel and layout
// are LoadFromObjectStore's: refused here (InvalidArgument when called).
std::function<Result<Checkpoint>(const std::string& path)> ObjectStoreOpener(
    const ObjectStoreOptions& store = {});

}  // namespace tensorlift

#endif  // TENSORLIFT_OBJSTORE_H_
