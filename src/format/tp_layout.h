// Tensor-parallel layouts (docs/remote.md, "Layouts"): which tensors are split
// along which dim, how a dim is split among ranks, and which bytes of a source
// shard land where in a destination shard when the two sides' sizes differ.
#ifndef TENSORLIFT_FORMAT_TP_LAYOUT_H_
#define TENSORLIFT_FORMAT_TP_LAYOUT_H_

#include <cstdint>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "tensorlift/assign.h"
#include "tensorlift/loader.h"
#include "tensorlift/safetensors.h"
#include "tensorlift/status.h"

namespace tensorlift {

// InvalidArgument ("WHO: tensor parallel rank R of size N is out of range")
// unless 0 <= rank < size; `who` may be empty.
Status CheckRank(const TensorParallel& parallel, std::string_view who = {});

// Rules "REGEX=DIM" separated by ';' (the first rule whose ECMAScript regex
// matches anywhere in the name wins); e.g. the Llama layout
//   "(q|k|v|gate|up)_proj\.weight$=0;(o|down)_proj\.weight$=1;embed_tokens=0;lm_head=0"
// Names no rule matches are whole on every rank.
class ParallelLayout {
 public:
  ParallelLayout() = default;
  // InvalidArgument on a bad regex, a dim that is not 0..7, or an empty rule.
  static Result<ParallelLayout> Parse(std::string_view text);
  // The rules as given, re-joined with ';' (whitespace around them trimmed).
  const std::string& text() const { return text_; }
  // The dim `name` is split along, or -1.
  int DimFor(std::string_view name) const;
  bool empty() const { return rules_.empty(); }

 private:
  struct Rule {
    std::regex re;
    int dim;
  };
  std::string text_;
  std::vector<Rule> rules_;
};

// A rank's part of a dim is ShardRange's (tensorlift/assign.h, the project's
// one shard-range rule).

// A copy from a source shard's bytes to a destination shard's bytes.
struct CopyPiece {
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t bytes = 0;
};
// The pieces that move the overlap of a source shard [src.start, +length)
// and a destination shard [dst.start, +length) along `dim` of a row-major
// tensor of `full_shape` with elements of `elem_bits` bits, offsets relative
// to each shard's first byte; adjacent pieces merged (one piece for dim 0).
// Empty when they do not overlap. InvalidArgument for a dim out of range, a
// sub-byte inner row, or sizes that overflow.
Result<std::vector<CopyPiece>> SlicePieces(const std::vector<int64_t>& full_shape,
                                           uint32_t elem_bits, int dim, IndexRange src,
                                           IndexRange dst);

// A tensor's part for one tensor-parallel rank: its shape and the pieces of
// the tensor's stored bytes that make it (src_offset from the tensor's first
// byte, dst_offset from the slice's), in order. No pieces: the whole tensor.
struct TensorSlice {
  std::vector<uint64_t> shape;
  uint64_t elements = 0;
  uint64_t bytes = 0;
  std::vector<CopyPiece> pieces;
  bool whole() const { return pieces.empty(); }
};

// `info`'s slice for rank `rank` of `size` under `layout`: whole when no rule
// splits it (or its dim is beyond its shape), else ShardRange's part of the
// dim. InvalidArgument (naming the tensor) when the dim cannot be split so.
Result<TensorSlice> SliceFor(const TensorInfo& info, const ParallelLayout& layout, int rank,
                             int size);

}  // namespace tensorlift

#endif  // TENSORLIFT_FORMAT_TP_LAYOUT_H_
