// A rank's slices of a whole checkpoint.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "common/checked_math.h"
#include "format/tp_layout.h"
#include "load/checkpoint_builder.h"
#include "remote/peer_access.h"

namespace tensorlift {

namespace remote {

Result<ShardOf> ShardFor(const ParallelLayout& layout, std::string_view name,
                         const std::vector<int64_t>& full_shape, const TensorParallel& parallel) {
  ShardOf s;
  s.full_shape = full_shape;
  const int dim = layout.DimFor(name);
  if (dim < 0) return s;
  if (dim >= static_cast<int>(full_shape.size())) {
    return InvalidArgumentError("tensor '" + std::string(name) + "': the layout splits dim " +
                                std::to_string(dim) + " but it has " +
                                std::to_string(full_shape.size()) + " dims");
  }
  TL_ASSIGN_OR_RETURN(IndexRange r, ShardRange(full_shape[dim], parallel.rank, parallel.size));
  s.dim = dim;
  s.start = r.start;
  return s;
}

Result<std::vector<ShardOf>> ShardsOf(const Checkpoint& ckpt, const TensorFilter& filter,
                                      const ParallelLayout& layout,
                                      const TensorParallel& parallel) {
  std::vector<ShardOf> shards;
  for (const auto loc : ckpt.tensors()) {
    const TensorInfo& t = ckpt.info(loc);
    if (!filter.Matches(t.name)) continue;
    TL_ASSIGN_OR_RETURN(
        ShardOf s,
        ShardFor(layout, t.name, std::vector<int64_t>(t.shape.begin(), t.shape.end()), parallel));
    shards.push_back(std::move(s));
  }
  return shards;
}

namespace {

std::vector<int64_t> ShardShape(const ShardOf& s, int64_t length) {
  std::vector<int64_t> shape = s.full_shape;
  if (s.dim >= 0) shape[s.dim] = length;
  return shape;
}

}  // namespace

Result<LoadedCheckpoint> SliceForRank(LoadedCheckpoint whole, const ParallelLayout& layout,
                                      const TensorParallel& parallel,
                                      std::vector<ShardOf>* shards) {
  TL_RETURN_IF_ERROR(CheckRank(parallel));
  std::vector<ShardOf> of(whole.tensors().size());
  std::vector<IndexRange> ranges(of.size());
  std::vector<uint64_t> offsets(of.size());
  uint64_t total = 0;
  bool any_split = false;
  for (size_t i = 0; i < of.size(); ++i) {
    const LoadedTensor& t = whole.tensors()[i];
    TL_ASSIGN_OR_RETURN(of[i], ShardFor(layout, t.name, t.shape, parallel));
    if (of[i].dim < 0) {
      ranges[i] = {0, t.shape.empty() ? 1 : t.shape[0]};
    } else {
      TL_ASSIGN_OR_RETURN(ranges[i], ShardRange(t.shape[of[i].dim], parallel.rank, parallel.size));
      any_split = any_split || parallel.size > 1;
    }
    total = (total + 63) / 64 * 64;
    offsets[i] = total;
    uint64_t bytes = t.nbytes;
    if (of[i].dim >= 0 && t.shape[of[i].dim] > 0) {
      bytes = t.nbytes / static_cast<uint64_t>(t.shape[of[i].dim]) *
              static_cast<uint64_t>(ranges[i].length);
    }
    total += bytes;
  }
  if (shards) *shards = of;
  if (!any_split) return whole;  // Wherever it is: nothing to cut.
  for (const LoadedTensor& t : whole.tensors()) {
    if (t.device != DeviceType::kCpu) {
      return UnimplementedError("tensor '" + t.name + "': slicing for a rank needs host tensors");
    }
  }

  TL_ASSIGN_OR_RETURN(std::shared_ptr<HostBuffer> buffer, HostBuffer::Allocate(total));
  CheckpointBuilder out;
  out.Reserve(of.size());
  for (size_t i = 0; i < of.size(); ++i) {
    const LoadedTensor& t = whole.tensors()[i];
    LoadedTensor s = t;
    std::byte* dst = buffer->data() + offsets[i];
    if (of[i].dim < 0) {
      if (t.nbytes) std::memcpy(dst, t.data, t.nbytes);
    } else {
      const IndexRange full{0, t.shape[of[i].dim]};
      TL_ASSIGN_OR_RETURN(auto pieces,
                          SlicePieces(t.shape, static_cast<uint32_t>(DtypeBits(t.dtype)), of[i].dim,
                                      full, ranges[i]));
      s.shape = ShardShape(of[i], ranges[i].length);
      s.nbytes = 0;
      for (const CopyPiece& p : pieces) {
        std::memcpy(dst + p.dst_offset, static_cast<const std::byte*>(t.data) + p.src_offset,
                    p.bytes);
        s.nbytes += p.bytes;
      }
      SetRowMajorStrides(&s);
    }
    s.data = dst;
    out.Add(std::move(s), buffer);
  }
  out.files() = whole.files();
  return std::move(out).Finish(whole.seconds());
}

}  // namespace remote
}  // namespace tensorlift
