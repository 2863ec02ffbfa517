#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <functional>
#include <map>

#include "sparse/shard_files.h"
#include "tensorlift/sparse.h"
#include "tensorlift/text.h"

namespace tensorlift::sparse {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; big-endian hosts would need byte swaps");

enum Part { kShape, kValues, kBitmask, kRowOffsets, kNumParts };
constexpr std::array<std::string_view, kNumParts> kSuffixes = {kShapeSuffix, kValuesSuffix,
                                                               kBitmaskSuffix, kRowOffsetsSuffix};

struct Candidate {
  std::array<std::optional<Checkpoint::Location>, kNumParts> parts;
  int count() const {
    return static_cast<int>(
        std::count_if(parts.begin(), parts.end(), [](const auto& p) { return p.has_value(); }));
  }
};

std::string DtypeShape(const TensorInfo& t) {
  return std::string(DtypeName(t.dtype)) + " " + ShapeString(t.shape);
}

// Checks one complete group and reads its shape. Errors name the group; the
// caller adds the file.
Result<SparseTensor> ReadGroup(const Checkpoint& ckpt, const std::string& prefix,
                               const Candidate& cand, ShardFiles* files) {
  SparseTensor st;
  st.prefix = prefix;
  st.name = DenseName(prefix);
  st.shape_tensor = *cand.parts[kShape];
  st.values = *cand.parts[kValues];
  st.bitmask = *cand.parts[kBitmask];
  st.row_offsets = *cand.parts[kRowOffsets];
  const TensorInfo& shape_info = ckpt.info(st.shape_tensor);
  const TensorInfo& values_info = ckpt.info(st.values);
  const TensorInfo& bitmask_info = ckpt.info(st.bitmask);
  const TensorInfo& offsets_info = ckpt.info(st.row_offsets);
  const std::string who =
      "sparse group " + QuoteName(prefix) + " (dense " + QuoteName(st.name) + ")";
  const std::string& shape_file = ckpt.shards()[st.shape_tensor.shard].path;

  const bool one_d = shape_info.shape == std::vector<uint64_t>{1};
  if (shape_info.dtype != Dtype::kI64 || (!one_d && shape_info.shape != std::vector<uint64_t>{2})) {
    std::string why;
    if (shape_info.shape == std::vector<uint64_t>{2, 1}) {
      why = " ([2, 1] is sparse-24-bitmask's, which is not read)";
    } else if (shape_info.dtype == Dtype::kI64 && shape_info.shape.size() == 1 &&
               shape_info.shape[0] > 2) {
      why = " (only 1-D and 2-D tensors are read)";
    }
    return CorruptionError(shape_file + ": " + who + ": " + QuoteName(shape_info.name) + " is " +
                           DtypeShape(shape_info) + ", expected I64 [2] (or [1] for a 1-D tensor)" +
                           why);
  }
  // The file's int64s are little-endian, as this host's (static_assert above).
  int64_t dims[2] = {1, 0};
  TL_RETURN_IF_ERROR(files->Read(st.shape_tensor, 0, one_d ? dims + 1 : dims,
                                 one_d ? sizeof(int64_t) : 2 * sizeof(int64_t)));
  if (dims[0] < 0 || dims[1] < 0) {
    return CorruptionError(
        shape_file + ": " + who + ": " + QuoteName(shape_info.name) + " holds " +
        (one_d ? "[" + std::to_string(dims[1]) + "]"
               : "[" + std::to_string(dims[0]) + ", " + std::to_string(dims[1]) + "]") +
        ", a negative dimension");
  }

  const std::string& values_file = ckpt.shards()[st.values.shard].path;
  const int bits = DtypeBits(values_info.dtype);
  if (values_info.shape.size() != 1) {
    return CorruptionError(values_file + ": " + who + ": " + QuoteName(values_info.name) + " is " +
                           DtypeShape(values_info) + ", expected a 1-D tensor of the non-zeros");
  }
  if (bits % 8 != 0 || (bits != 8 && bits != 16 && bits != 32 && bits != 64)) {
    return CorruptionError(values_file + ": " + who + ": " + QuoteName(values_info.name) + " is " +
                           std::string(DtypeName(values_info.dtype)) + ", whose " +
                           std::to_string(bits) +
                           "-bit elements the bitmask cannot address (1, 2, 4 or 8 bytes)");
  }
  st.dtype = values_info.dtype;
  st.shape = {static_cast<uint64_t>(dims[0]), static_cast<uint64_t>(dims[1]),
              static_cast<uint32_t>(bits / 8)};
  if (Status s = CheckShape(st.shape); !s.ok()) {
    return CorruptionError(shape_file + ": " + who + ": " + QuoteName(shape_info.name) + ": " +
                           s.message());
  }
  st.dense_shape = one_d ? std::vector<uint64_t>{st.shape.cols}
                         : std::vector<uint64_t>{st.shape.rows, st.shape.cols};
  st.nnz = values_info.shape[0];
  if (st.nnz > st.shape.rows * st.shape.cols) {
    return CorruptionError(values_file + ": " + who + ": " + QuoteName(values_info.name) +
                           " holds " + std::to_string(st.nnz) + " values, more than the " +
                           std::to_string(st.shape.rows * st.shape.cols) + " elements of " +
                           ShapeString(st.dense_shape));
  }

  const std::vector<uint64_t> mask_shape =
      one_d ? std::vector<uint64_t>{st.shape.mask_row_bytes()}
            : std::vector<uint64_t>{st.shape.rows, st.shape.mask_row_bytes()};
  if (bitmask_info.dtype != Dtype::kU8 || bitmask_info.shape != mask_shape) {
    return CorruptionError(ckpt.shards()[st.bitmask.shard].path + ": " + who + ": " +
                           QuoteName(bitmask_info.name) + " is " + DtypeShape(bitmask_info) +
                           ", expected U8 " + ShapeString(mask_shape) + " for a dense " +
                           ShapeString(st.dense_shape));
  }
  // A 1-D tensor's is a scalar: compressed-tensors sums its one row to a 0-D count.
  const std::vector<uint64_t> offsets_shape =
      one_d ? std::vector<uint64_t>{} : std::vector<uint64_t>{st.shape.rows};
  if (offsets_info.dtype != Dtype::kI64 || offsets_info.shape != offsets_shape) {
    return CorruptionError(ckpt.shards()[st.row_offsets.shard].path + ": " + who + ": " +
                           QuoteName(offsets_info.name) + " is " + DtypeShape(offsets_info) +
                           ", expected I64 " + ShapeString(offsets_shape) +
                           (one_d ? " (a scalar for a 1-D tensor)" : " (one per row)"));
  }
  st.stored_bytes =
      shape_info.nbytes() + values_info.nbytes() + bitmask_info.nbytes() + offsets_info.nbytes();
  return st;
}

}  // namespace

std::string DenseName(std::string_view prefix) {
  if (prefix.ends_with(".weight") || prefix.ends_with(".bias")) return std::string(prefix);
  return std::string(prefix) + ".weight";
}

std::optional<std::string> PrefixFor(std::string_view dense_name) {
  constexpr std::string_view kWeight = ".weight";
  if (dense_name.ends_with(kWeight)) {
    std::string stripped(dense_name.substr(0, dense_name.size() - kWeight.size()));
    if (!stripped.empty() && DenseName(stripped) == dense_name) return stripped;
  }
  if (DenseName(dense_name) == dense_name) return std::string(dense_name);
  return std::nullopt;
}

uint64_t EncodedBytes(const BitmaskShape& shape, uint64_t nnz) {
  return 2 * sizeof(int64_t) + nnz * shape.elem_bytes + shape.mask_bytes() +
         shape.rows * sizeof(int64_t);
}

double SparseTensor::density() const {
  const uint64_t n = shape.rows * shape.cols;
  return n == 0 ? 0.0 : static_cast<double>(nnz) / static_cast<double>(n);
}

const SparseTensor* SparseCatalog::Find(std::string_view dense_name) const {
  auto it = std::lower_bound(sparse.begin(), sparse.end(), dense_name,
                             [](const SparseTensor& t, std::string_view n) { return t.name < n; });
  return it != sparse.end() && it->name == dense_name ? &*it : nullptr;
}

Result<SparseCatalog> FindSparse(const Checkpoint& ckpt,
                                 const std::function<bool(std::string_view)>& wanted) {
  std::map<std::string, Candidate> candidates;
  for (auto loc : ckpt.tensors()) {
    const std::string& name = ckpt.info(loc).name;
    for (int p = 0; p < kNumParts; ++p) {
      if (name.size() > kSuffixes[p].size() && name.ends_with(kSuffixes[p])) {
        candidates[name.substr(0, name.size() - kSuffixes[p].size())].parts[p] = loc;
        break;
      }
    }
  }

  SparseCatalog catalog;
  ShardFiles files(ckpt);
  // Which tensors belong to a group, by (shard, index).
  std::vector<std::vector<bool>> grouped(ckpt.shards().size());
  for (size_t s = 0; s < ckpt.shards().size(); ++s) {
    grouped[s].assign(ckpt.shards()[s].header.tensors().size(), false);
  }
  // Every group's dense name and prefix (read or not), for the name checks.
  std::vector<std::pair<std::string, std::string>> names;
  for (const auto& [prefix, cand] : candidates) {
    const int count = cand.count();
    if (count == 1) continue;  // A plain tensor that happens to end in a part's suffix.
    if (count < kNumParts) {
      std::string have, lack;
      for (int p = 0; p < kNumParts; ++p) {
        std::string& list = cand.parts[p] ? have : lack;
        list += (list.empty() ? "" : ", ") + QuoteName(prefix + std::string(kSuffixes[p]));
      }
      const bool sparse24 = count == 3 && !cand.parts[kRowOffsets];
      return CorruptionError(
          ckpt.path() + ": sparse group " + QuoteName(prefix) + " has " + have + " but lacks " +
          lack +
          (sparse24 ? " (a compressed-tensors sparse-24-bitmask group, which is not read)" : ""));
    }
    for (const auto& loc : cand.parts) grouped[loc->shard][loc->index] = true;
    names.emplace_back(DenseName(prefix), prefix);
    if (wanted && !wanted(names.back().first)) continue;  // Not read: no I/O for it.
    TL_ASSIGN_OR_RETURN(SparseTensor st, ReadGroup(ckpt, prefix, cand, &files));
    catalog.sparse.push_back(std::move(st));
  }

  std::sort(catalog.sparse.begin(), catalog.sparse.end(),
            [](const SparseTensor& a, const SparseTensor& b) { return a.name < b.name; });
  std::sort(names.begin(), names.end());
  for (size_t i = 1; i < names.size(); ++i) {
    if (names[i].first == names[i - 1].first) {
      return CorruptionError(ckpt.path() + ": sparse groups " + QuoteName(names[i - 1].second) +
                             " and " + QuoteName(names[i].second) + " both stand for " +
                             QuoteName(names[i].first));
    }
  }
  for (auto loc : ckpt.tensors()) {
    if (grouped[loc.shard][loc.index]) continue;
    const std::string& name = ckpt.info(loc).name;
    auto it =
        std::lower_bound(names.begin(), names.end(), std::pair<std::string, std::string>(name, ""));
    if (it != names.end() && it->first == name) {
      return CorruptionError(ckpt.shards()[loc.shard].path + ": tensor " + QuoteName(name) +
                             " is stored both dense and as the sparse group " +
                             QuoteName(it->second));
    }
    if (!wanted || wanted(name)) catalog.dense.push_back(loc);
  }
  return catalog;
}

}  // namespace tensorlift::sparse
