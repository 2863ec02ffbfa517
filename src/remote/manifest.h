// The per-rank manifest a peer publishes (docs/remote.md, "Manifest"): every
// tensor's name, dtype, shape, bytes, where it sits in the registered
// regions, its sharding, and an XXH3-64 per chunk; plus the data plane's
// handles (UCX worker address, packed remote keys).
//
// A manifest arrives from the network: ParseManifest validates all of it
// (sizes, counts, names, offsets, total bytes, bounded by ManifestLimits)
// before returning, like a file header. A Manifest that exists is valid.
#ifndef TENSORLIFT_REMOTE_MANIFEST_H_
#define TENSORLIFT_REMOTE_MANIFEST_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tensorlift/content.h"
#include "tensorlift/dtype.h"
#include "tensorlift/remote.h"
#include "tensorlift/status.h"

namespace tensorlift::remote {

// One registered memory region of the source.
struct Region {
  uint64_t address = 0;  // The source's virtual address (for the remote key).
  uint64_t bytes = 0;
  std::string rkey;  // Packed UCX remote key (raw bytes); empty when withheld.
};

struct ManifestTensor {
  std::string name;
  Dtype dtype = Dtype::kU8;
  std::vector<int64_t> shape;  // This rank's (shard's) shape.
  uint64_t nbytes = 0;         // = elements(shape) * bits / 8.
  uint32_t region = 0;         // Index into Manifest::regions.
  uint64_t offset = 0;         // Byte offset in the region.
  // Sharding: -1 = the whole tensor; else this shard covers
  // [shard_start, shard_start + shape[shard_dim]) of full_shape[shard_dim],
  // and every other dim equals full_shape's.
  int shard_dim = -1;
  int64_t shard_start = 0;
  std::vector<int64_t> full_shape;  // Equals shape when shard_dim == -1.
  // XXH3-64 of each chunk_bytes piece of the tensor's bytes, from its start
  // (the last may be shorter): ceil(nbytes / chunk_bytes) entries.
  std::vector<uint64_t> chunk_xxh3;
  // Its content hash (tensorlift/content.h: XXH3-128 over its 4 MiB pieces'
  // XXH3-128s) when the manifest has a content identity ("xxh128").
  std::optional<Hash128> xxh128;
};

struct Manifest {
  PeerKey key;
  TensorParallel parallel;  // The source's size and rank.
  uint64_t chunk_bytes = 4ull << 20;
  std::string worker_address;  // UCX worker address (raw bytes).
  uint64_t rate_limit = 0;     // Bytes/s granted to this client (0: unlimited).
  std::vector<Region> regions;
  std::vector<ManifestTensor> tensors;  // In name order, names unique.
  uint64_t total_bytes = 0;             // Sum of nbytes.
  // Same-host handover (docs/remote.md, "Same-host handover"): when the
  // source offers it, its host (the kernel's boot id) and the abstract Unix
  // socket that hands its regions over as sealed shared memory; both empty
  // otherwise.
  std::string handover_host;
  std::string handover_socket;
  // When the regions are device memory: the device they are on
  // (Device::identity(), "GPU-<uuid>" or "emulated:0@<boot id>"); the socket
  // then hands over exported allocations (Device::Export), which only a
  // client on that same device can map. Empty for host memory.
  std::string handover_device;
  // The content identity root over the tensors listed (their names, dtypes,
  // shapes and xxh128), when the source computed it ("content"); every tensor
  // then has its xxh128, and the root is checked against them on parsing.
  // Absent in manifests of older sources and of sources whose tensors are in
  // device memory.
  std::optional<Hash128> content;

  // Compact JSON; binary fields (rkey, worker_address) as lowercase hex,
  // checksums as 16-hex-digit strings, u64 as JSON integers.
  std::string ToJson() const;
  const ManifestTensor* Find(std::string_view name) const;
};

struct ManifestLimits {
  uint64_t max_json_bytes = 256ull << 20;
  uint64_t max_tensors = 1u << 20;
  uint64_t max_regions = 1u << 16;
  uint64_t max_name_bytes = 4096;
  uint64_t max_binary_bytes = 64u << 10;  // Per rkey / worker address.
  uint64_t max_total_bytes = 1ull << 44;  // 16 TiB.
  int max_dims = 8;
  int max_world = 1 << 16;
};

// Parses and validates a manifest. Errors are kCorruption and name the
// field, the tensor and the numbers ("manifest: tensor 'w': offset 96 +
// nbytes 64 past region 0's 128 bytes").
Result<Manifest> ParseManifest(std::string_view json, const ManifestLimits& limits = {});

// Chunk checksums of `nbytes` bytes at `data` (what the source publishes).
std::vector<uint64_t> ChunkChecksums(const void* data, uint64_t nbytes, uint64_t chunk_bytes);

// "[2, 3]": a shape as the manifest's and the peer loader's messages print it.
std::string ShapeText(const std::vector<int64_t>& shape);

}  // namespace tensorlift::remote

#endif  // TENSORLIFT_REMOTE_MANIFEST_H_
