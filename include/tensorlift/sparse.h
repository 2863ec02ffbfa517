// Sparse checkpoints: compressed-tensors' "sparse-bitmask" groups found in a
// safetensors checkpoint (tensorlift/bitmask.h has the layout). A group of prefix
// P stands for a dense [rows, cols] tensor as four tensors:
//   P.shape        I64 [2]            the dense [rows, cols]
//   P.compressed   dtype [nnz]        the non-zeros, row-major
//   P.bitmask      U8 [rows, ceil(cols/8)]
//   P.row_offsets  I64 [rows]
// or, for a dense 1-D [n] tensor (compressed-tensors <= 0.8.1 compressed
// biases and norms too), P.shape I64 [1], P.bitmask U8 [ceil(n/8)] and
// P.row_offsets I64 [] (a scalar 0): the layout of one row of n.
// The dense tensor is named P when P ends in ".weight" or ".bias"
// (compressed-tensors <= 0.8.1 kept the parameter name and compressed every
// tensor) and P.weight otherwise (>= 0.9 strips ".weight" from the module's
// weight and compresses nothing else).
// Every part is untrusted: shapes, dtypes and sizes are checked against each
// other before anything is allocated. The contents of bitmask and
// row_offsets are checked by Validate (bitmask.h) when a group is decoded.
//
// The results are values; FindSparse may run concurrently on one Checkpoint.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tensorlift/bitmask.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/status.h"

namespace tensorlift::sparse {

// The suffixes of a group's parts, in the order of SparseTensor's locations.
inline constexpr std::string_view kShapeSuffix = ".shape";
inline constexpr std::string_view kValuesSuffix = ".compressed";
inline constexpr std::string_view kBitmaskSuffix = ".bitmask";
inline constexpr std::string_view kRowOffsetsSuffix = ".row_offsets";

// The dense name a group of prefix `prefix` stands for (see above).
std::string DenseName(std::string_view prefix);
// The prefix sparsify writes for `dense_name`: the current generation's
// (".weight" stripped) where that reads back as `dense_name`, else the name
// itself (old generation: "X.bias", or "X.weight.weight", whose stripped
// prefix would read back as "X.weight"). nullopt when no prefix reads back as
// `dense_name` (a name ending in neither ".weight" nor ".bias").
std::optional<std::string> PrefixFor(std::string_view dense_name);

// Bytes of the four parts of a 2-D group: the shape (16), the values, the
// bitmask and the row offsets (8 per row). For 16-bit values at density d
// that is (d * 16 + 1) / 16 of the dense bytes, plus 8 per row and 16.
uint64_t EncodedBytes(const BitmaskShape& shape, uint64_t nnz);

struct SparseTensor {
  std::string name;                   // The dense tensor's name.
  std::string prefix;                 // P, as stored.
  Dtype dtype = Dtype::kU8;           // The dense (and values') dtype.
  BitmaskShape shape;                 // rows, cols, elem_bytes (rows = 1 for 1-D).
  std::vector<uint64_t> dense_shape;  // [rows, cols], or [n] for 1-D.
  uint64_t nnz = 0;
  Checkpoint::Location values, bitmask, row_offsets, shape_tensor;
  // Bytes stored (the four parts) and the dense bytes they stand for.
  uint64_t stored_bytes = 0;
  uint64_t dense_bytes() const { return shape.dense_bytes(); }
  // nnz / (rows * cols); 0 for an empty tensor.
  double density() const;
};

// The sparse groups of a checkpoint and the tensors that are not part of one.
struct SparseCatalog {
  std::vector<SparseTensor> sparse;         // In dense-name order.
  std::vector<Checkpoint::Location> dense;  // Plain tensors, name order.
  bool empty() const { return sparse.empty(); }
  const SparseTensor* Find(std::string_view dense_name) const;
};

// Finds every group (reading each P.shape's 16 bytes from its file). Two or
// more tensors sharing a prefix with part suffixes make a group, which must
// then have all four parts; a lone tensor with one of the suffixes (say
// "rope.shape") is a plain tensor. The parts of a group may lie in different
// shards. Corruption names the file, the group and what is wrong: a missing
// part, a dtype or shape that does not fit the others, sub-byte values, a
// dense tensor of 3 or more dimensions (compressed-tensors' row_offsets for
// those are not a prefix sum over rows), a compressed-tensors
// "sparse-24-bitmask" group (no row_offsets; not read), a plain tensor or
// another group with the same dense name.
//
// With `wanted`, only the groups and plain tensors whose (dense) names it
// accepts are in the result, and only their shapes are read: a load of a few
// tensors reads nothing for the others. The structure of every group and the
// name checks (headers only) still cover them all.
Result<SparseCatalog> FindSparse(const Checkpoint& ckpt,
                                 const std::function<bool(std::string_view)>& wanted = {});

}  // namespace tensorlift::sparse
