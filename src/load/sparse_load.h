// Loads of sparse-bitmask checkpoints (sparse_load.cc): on the host through the
// host path (host_load.h), or onto a device through the staged pipeline
// (device_pipeline.h), decoded there.
#ifndef TENSORLIFT_LOAD_SPARSE_LOAD_H_
#define TENSORLIFT_LOAD_SPARSE_LOAD_H_

#include <cstdint>
#include <memory>

#include "load/host_load.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/loader.h"

namespace tensorlift {

class Device;

// Decoded groups are placed at this alignment in their buffer (a streamer on a
// device sizes its buffers by the same rule: device_ring.cc).
inline constexpr uint64_t kDenseAlign = 64;

// Whether `ckpt` has tensors named like sparse-bitmask parts (cheap; the
// catalog itself is sparse::FindSparse).
bool MayBeSparse(const Checkpoint& ckpt);

// A host load of a checkpoint with sparse-bitmask groups: the stored parts
// are read, each group is decoded into its dense tensor as soon as its files
// are in, and the parts' memory is given back.
Result<LoadedCheckpoint> LoadSparseOnHost(const Checkpoint& ckpt, const LoadOptions& options,
                                          const EngineWrapper& wrap);

// A sparse checkpoint onto `device`: the parts through the staged pipeline,
// validated on the host, decoded on the device.
Result<LoadedCheckpoint> LoadSparseThroughDevice(const Checkpoint& checkpoint,
                                                 const LoadOptions& options,
                                                 const std::shared_ptr<Device>& device);

}  // namespace tensorlift

#endif  // TENSORLIFT_LOAD_SPARSE_LOAD_H_
