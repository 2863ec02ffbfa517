// Tensor-parallel layouts: rules that pick a shard dim per tensor name, the
// split of a dim among ranks, and the byte pieces between shards of two
// different splits.
#include "format/tp_layout.h"

#include <algorithm>
#include <string>

#include "common/checked_math.h"
#include "tensorlift/text.h"

namespace tensorlift {

Status CheckRank(const TensorParallel& parallel, std::string_view who) {
  if (parallel.size >= 1 && parallel.rank >= 0 && parallel.rank < parallel.size) {
    return Status::Ok();
  }
  return InvalidArgumentError((who.empty() ? "" : std::string(who) + ": ") +
                              "tensor parallel rank " + std::to_string(parallel.rank) +
                              " of size " + std::to_string(parallel.size) + " is out of range");
}
namespace {

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && IsSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsSpace(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace

Result<ParallelLayout> ParallelLayout::Parse(std::string_view text) {
  ParallelLayout layout;
  if (Trim(text).empty()) return layout;  // Every tensor whole.
  size_t rule_index = 0;
  while (true) {
    const size_t semi = text.find(';');
    const std::string_view raw = semi == std::string_view::npos ? text : text.substr(0, semi);
    const std::string_view rule = Trim(raw);
    const std::string where = "layout rule " + std::to_string(rule_index) + " " + QuoteName(rule);
    if (rule.empty())
      return InvalidArgumentError("layout rule " + std::to_string(rule_index) + " is empty");
    // The dim follows the last '=' (a regex may contain '=').
    const size_t eq = rule.rfind('=');
    if (eq == std::string_view::npos) return InvalidArgumentError(where + ": expected REGEX=DIM");
    const std::string_view pattern = Trim(rule.substr(0, eq));
    const std::string_view dim_text = Trim(rule.substr(eq + 1));
    if (pattern.empty()) return InvalidArgumentError(where + ": the regex is empty");
    if (dim_text.size() != 1 || dim_text[0] < '0' || dim_text[0] > '7') {
      return InvalidArgumentError(where + ": the dim must be 0..7, found " + QuoteName(dim_text));
    }
    Rule r;
    r.dim = dim_text[0] - '0';
    // std::regex reports a bad pattern only by throwing; nothing escapes here.
    try {
      r.re = std::regex(std::string(pattern), std::regex::ECMAScript | std::regex::optimize);
    } catch (const std::regex_error& e) {
      return InvalidArgumentError(where + ": bad regex: " + e.what());
    }
    layout.rules_.push_back(std::move(r));
    if (!layout.text_.empty()) layout.text_ += ';';
    layout.text_ += rule;
    ++rule_index;
    if (semi == std::string_view::npos) break;
    text.remove_prefix(semi + 1);
  }
  return layout;
}

int ParallelLayout::DimFor(std::string_view name) const {
  for (const Rule& rule : rules_) {
    bool match = false;
    try {
      match = std::regex_search(name.begin(), name.end(), rule.re);
    } catch (const std::regex_error&) {
      // Too complex for this name: the rule does not apply.
      match = false;
    }
    if (match) return rule.dim;
  }
  return -1;
}

Result<std::vector<CopyPiece>> SlicePieces(const std::vector<int64_t>& full_shape,
                                           uint32_t elem_bits, int dim, IndexRange src,
                                           IndexRange dst) {
  const int ndims = static_cast<int>(full_shape.size());
  if (dim < 0 || dim >= ndims) {
    return InvalidArgumentError("slice: dim " + std::to_string(dim) + " is out of range for " +
                                std::to_string(ndims) + " dims");
  }
  if (elem_bits == 0) return InvalidArgumentError("slice: elements of 0 bits");
  for (int64_t d : full_shape) {
    if (d < 0) return InvalidArgumentError("slice: negative dim in the full shape");
  }
  const uint64_t extent = static_cast<uint64_t>(full_shape[dim]);
  for (const IndexRange* r : {&src, &dst}) {
    uint64_t end;
    if (r->start < 0 || r->length < 0 ||
        !CheckedAdd(static_cast<uint64_t>(r->start), static_cast<uint64_t>(r->length), &end) ||
        end > extent) {
      return InvalidArgumentError("slice: range [" + std::to_string(r->start) + ", +" +
                                  std::to_string(r->length) + ") is not inside dim " +
                                  std::to_string(dim) + " of extent " + std::to_string(extent));
    }
  }
  // Elements before `dim` (outer rows) and bits of one index along `dim`.
  uint64_t outer = 1, inner = 1, row_bits;
  bool ok = true;
  for (int i = 0; i < dim; ++i)
    ok = ok && CheckedMul(outer, static_cast<uint64_t>(full_shape[i]), &outer);
  for (int i = dim + 1; i < ndims; ++i)
    ok = ok && CheckedMul(inner, static_cast<uint64_t>(full_shape[i]), &inner);
  ok = ok && CheckedMul(inner, elem_bits, &row_bits);
  if (!ok) return InvalidArgumentError("slice: the sizes of the full shape overflow 64 bits");
  if (row_bits % 8 != 0) {
    return InvalidArgumentError("slice: a row after dim " + std::to_string(dim) + " is " +
                                std::to_string(row_bits) + " bits, not a whole number of bytes");
  }
  const uint64_t row_bytes = row_bits / 8;
  // Each shard's whole size must be addressable.
  uint64_t size;
  for (const IndexRange* r : {&src, &dst}) {
    if (!CheckedMul(outer, static_cast<uint64_t>(r->length), &size) ||
        !CheckedMul(size, row_bytes, &size)) {
      return InvalidArgumentError("slice: the shard's size overflows 64 bits");
    }
  }

  std::vector<CopyPiece> pieces;
  const int64_t lo = std::max(src.start, dst.start);
  const int64_t hi = std::min(src.start + src.length, dst.start + dst.length);
  if (lo >= hi || outer == 0 || row_bytes == 0) return pieces;
  const uint64_t bytes = static_cast<uint64_t>(hi - lo) * row_bytes;
  const uint64_t src_stride = static_cast<uint64_t>(src.length) * row_bytes;
  const uint64_t dst_stride = static_cast<uint64_t>(dst.length) * row_bytes;
  const uint64_t src_first = static_cast<uint64_t>(lo - src.start) * row_bytes;
  const uint64_t dst_first = static_cast<uint64_t>(lo - dst.start) * row_bytes;
  // Every outer row's pieces continue the previous one exactly when both
  // strides equal the piece: then the whole copy is one piece.
  if (src_stride == bytes && dst_stride == bytes) {
    pieces.push_back({src_first, dst_first, bytes * outer});
    return pieces;
  }
  pieces.reserve(outer);
  for (uint64_t o = 0; o < outer; ++o) {
    pieces.push_back({o * src_stride + src_first, o * dst_stride + dst_first, bytes});
  }
  return pieces;
}

// (tensorlift/assign.h) The one shard-range rule, here so that every layer can slice.
Result<IndexRange> ShardRange(int64_t extent, int rank, int world) {
  if (world < 1) {
    return InvalidArgumentError("shard range: world size " + std::to_string(world) + " < 1");
  }
  if (rank < 0 || rank >= world) {
    return InvalidArgumentError("shard range: rank " + std::to_string(rank) + " is not in [0, " +
                                std::to_string(world) + ")");
  }
  if (extent < 0) {
    return InvalidArgumentError("shard range: negative extent " + std::to_string(extent));
  }
  const uint64_t n = static_cast<uint64_t>(extent);
  const uint64_t block = n / world + (n % world != 0);
  // rank * block <= (world - 1) * ceil(n / world) < n + world < 2^64.
  const uint64_t start = std::min(static_cast<uint64_t>(rank) * block, n);
  return IndexRange{static_cast<int64_t>(start), static_cast<int64_t>(std::min(block, n - start))};
}

Result<TensorSlice> SliceFor(const TensorInfo& info, const ParallelLayout& layout, int rank,
                             int size) {
  TensorSlice slice;
  const int dim = size > 1 ? layout.DimFor(info.name) : -1;
  if (dim < 0 || dim >= static_cast<int>(info.shape.size())) return slice;
  std::vector<int64_t> full(info.shape.begin(), info.shape.end());
  auto where = [&](const Status& st) {
    return st.WithContext("tensor " + QuoteName(info.name) + " (split along dim " +
                          std::to_string(dim) + ")");
  };
  Result<IndexRange> mine = ShardRange(full[dim], rank, size);
  if (!mine.ok()) return where(mine.status());
  Result<std::vector<CopyPiece>> pieces = SlicePieces(
      full, static_cast<uint32_t>(DtypeBits(info.dtype)), dim, IndexRange{0, full[dim]}, *mine);
  if (!pieces.ok()) return where(pieces.status());
  slice.shape.assign(info.shape.begin(), info.shape.end());
  slice.shape[dim] = static_cast<uint64_t>(mine->length);
  slice.elements = 1;
  for (uint64_t d : slice.shape) slice.elements *= d;  // At most the tensor's: no overflow.
  for (const CopyPiece& p : *pieces) slice.bytes += p.bytes;
  slice.pieces = std::move(pieces).value();
  // A rank with no rows of it: one empty piece, so that it is still a slice.
  if (slice.pieces.empty()) slice.pieces.push_back({0, 0, 0});
  return slice;
}

}  // namespace tensorlift
