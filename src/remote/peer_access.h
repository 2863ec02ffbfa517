// Cutting a rank's slices out of a whole checkpoint (LoadedCheckpoints are
// built with load/checkpoint_builder.h).
#ifndef TENSORLIFT_REMOTE_PEER_ACCESS_H_
#define TENSORLIFT_REMOTE_PEER_ACCESS_H_

#include <memory>
#include <vector>

#include "device/host_buffer.h"
#include "format/tp_layout.h"
#include "load/checkpoint_builder.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/loader.h"
#include "tensorlift/remote.h"

namespace tensorlift {

namespace remote {

// Where a tensor of a rank sits in its full tensor.
struct ShardOf {
  int dim = -1;  // -1: whole.
  int64_t start = 0;
  std::vector<int64_t> full_shape;
};
// The shard of a tensor named `name` with `full_shape` for `parallel`
// under `layout` (dim -1 when the layout does not split it, or when
// parallel.size == 1).
Result<ShardOf> ShardFor(const ParallelLayout& layout, std::string_view name,
                         const std::vector<int64_t>& full_shape, const TensorParallel& parallel);

// The shards of `ckpt`'s tensors that pass `filter`, in its (name) order: a
// load of them with LoadOptions::parallel = `parallel` and this layout.
Result<std::vector<ShardOf>> ShardsOf(const Checkpoint& ckpt, const TensorFilter& filter,
                                      const ParallelLayout& layout, const TensorParallel& parallel);

// A host checkpoint of `parallel`'s slices of `whole` (copied into one new
// buffer); `whole` itself when parallel.size == 1 or the layout is empty.
// `shards` (optional) gets each result tensor's ShardOf, in result order.
Result<LoadedCheckpoint> SliceForRank(LoadedCheckpoint whole, const ParallelLayout& layout,
                                      const TensorParallel& parallel,
                                      std::vector<ShardOf>* shards = nullptr);

}  // namespace remote
}  // namespace tensorlift

#endif  // TENSORLIFT_REMOTE_PEER_ACCESS_H_
