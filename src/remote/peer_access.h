// Building and reading LoadedCheckpoints from peer loading (a friend of
// LoadedCheckpoint), and cutting a rank's slices out of a whole checkpoint.
#ifndef TENSORLIFT_REMOTE_PEER_ACCESS_H_
#define TENSORLIFT_REMOTE_PEER_ACCESS_H_

#include <memory>
#include <vector>

#include "device/host_buffer.h"
#include "remote/layout.h"
#include "tensorlift/loader.h"
#include "tensorlift/remote.h"

namespace tensorlift {

class PeerAccess {
 public:
  // A host checkpoint over `tensors` (sorted here by name), tensors[i] owned
  // by owners[i].
  static LoadedCheckpoint Make(std::vector<LoadedTensor> tensors, std::vector<std::shared_ptr<Buffer>> owners,
                               std::vector<FileReport> files, double seconds);
  // Sets t->strides to the row-major strides (in elements) of t->shape.
  static void SetRowMajorStrides(LoadedTensor* t);
  // The buffer owning each of checkpoint.tensors()[i].
  static const std::vector<std::shared_ptr<Buffer>>& Owners(const LoadedCheckpoint& checkpoint);
};

namespace remote {

// Where a tensor of a rank sits in its full tensor.
struct ShardOf {
  int dim = -1;                  // -1: whole.
  int64_t start = 0;
  std::vector<int64_t> full_shape;
};
// The shard of a tensor named `name` with `full_shape` for `parallel`
// under `layout` (dim -1 when the layout does not split it, or when
// parallel.size == 1).
Result<ShardOf> ShardFor(const Layout& layout, std::string_view name, const std::vector<int64_t>& full_shape,
                         const TensorParallel& parallel);

// A host checkpoint of `parallel`'s slices of `whole` (copied into one new
// buffer); `whole` itself when parallel.size == 1 or the layout is empty.
// `shards` (optional) gets each result tensor's ShardOf, in result order.
Result<LoadedCheckpoint> SliceForRank(LoadedCheckpoint whole, const Layout& layout, const TensorParallel& parallel,
                                      std::vector<ShardOf>* shards = nullptr);

}  // namespace remote
}  // namespace tensorlift

#endif  // TENSORLIFT_REMOTE_PEER_ACCESS_H_
