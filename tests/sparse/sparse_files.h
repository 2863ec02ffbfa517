// Helpers for the sparse checkpoint tests: scratch directories, tensors held
// as bytes and written with the library's writer, groups built the way
// compressed-tensors builds them, and an independent reference decoder.
#ifndef TENSORLIFT_TESTS_SPARSE_SPARSE_FILES_H_
#define TENSORLIFT_TESTS_SPARSE_SPARSE_FILES_H_

#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "../common/assert_ok.h"
#include "../common/scratch_dir.h"
#include "gtest/gtest.h"
#include "tensorlift/dtype.h"
#include "tensorlift/loader.h"
#include "tensorlift/safetensors.h"

namespace tensorlift::sparse_testing {

using ::tensorlift::test::ScratchDir;

struct Tensor {
  std::string name;
  Dtype dtype = Dtype::kU8;
  std::vector<uint64_t> shape;
  std::vector<std::byte> bytes;
};

inline uint64_t Elements(const std::vector<uint64_t>& shape) {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

template <typename T>
Tensor Make(std::string name, Dtype dtype, std::vector<uint64_t> shape,
            const std::vector<T>& values) {
  Tensor t{std::move(name), dtype, std::move(shape), {}};
  t.bytes.resize(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

// rows x cols elements of `width` bytes: random bits, each element all-zero
// with probability `zero_fraction`.
inline Tensor RandomSparse(std::string name, Dtype dtype, uint64_t rows, uint64_t cols,
                           double zero_fraction, uint32_t seed) {
  const uint32_t width = static_cast<uint32_t>(DtypeBits(dtype) / 8);
  Tensor t{std::move(name), dtype, {rows, cols}, std::vector<std::byte>(rows * cols * width)};
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  for (uint64_t i = 0; i < rows * cols; ++i) {
    if (u(rng) < zero_fraction) continue;
    for (uint32_t b = 0; b < width; ++b) t.bytes[i * width + b] = static_cast<std::byte>(rng());
    // Never all-zero by chance: the count of zeros stays as drawn.
    t.bytes[i * width] |= std::byte{1};
  }
  return t;
}

inline Status Write(const std::string& path, const std::vector<Tensor>& tensors,
                    const std::optional<Metadata>& metadata = std::nullopt) {
  std::vector<TensorView> views;
  for (const auto& t : tensors) views.push_back({t.name, t.dtype, t.shape, t.bytes});
  return WriteFile(path, views, metadata);
}

inline void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  ASSERT_TRUE(out) << path;
}

inline std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The four parts of a group as compressed-tensors makes them (mask: the
// element's bits are not all zero; bits LSB first; rows padded to bytes;
// row_offsets the exclusive prefix sum), named prefix + suffix.
inline std::vector<Tensor> Group(const std::string& prefix, const Tensor& dense) {
  const uint64_t rows = dense.shape[0], cols = dense.shape[1];
  const uint32_t w = static_cast<uint32_t>(DtypeBits(dense.dtype) / 8);
  const uint64_t mrow = (cols + 7) / 8;
  std::vector<std::byte> values;
  std::vector<uint8_t> mask(rows * mrow, 0);
  std::vector<int64_t> offsets(rows);
  for (uint64_t r = 0; r < rows; ++r) {
    offsets[r] = static_cast<int64_t>(values.size() / w);
    for (uint64_t c = 0; c < cols; ++c) {
      const std::byte* e = dense.bytes.data() + (r * cols + c) * w;
      bool zero = true;
      for (uint32_t b = 0; b < w; ++b) zero = zero && e[b] == std::byte{0};
      if (zero) continue;
      mask[r * mrow + c / 8] |= static_cast<uint8_t>(1u << (c % 8));
      values.insert(values.end(), e, e + w);
    }
  }
  const uint64_t nnz = values.size() / w;
  return {Make(prefix + ".shape", Dtype::kI64, {2},
               std::vector<int64_t>{static_cast<int64_t>(rows), static_cast<int64_t>(cols)}),
          Tensor{prefix + ".compressed", dense.dtype, {nnz}, values},
          Make(prefix + ".bitmask", Dtype::kU8, {rows, mrow}, mask),
          Make(prefix + ".row_offsets", Dtype::kI64, {rows}, offsets)};
}

// A 1-D tensor's group as compressed-tensors <= 0.8.1 made it: shape I64 [1],
// bitmask U8 [ceil(n/8)], row_offsets an I64 scalar (0).
inline std::vector<Tensor> Group1D(const std::string& prefix, const Tensor& dense) {
  Tensor row = dense;
  row.shape = {1, dense.shape[0]};
  std::vector<Tensor> parts = Group(prefix, row);
  parts[0] = Make(prefix + ".shape", Dtype::kI64, {1},
                  std::vector<int64_t>{static_cast<int64_t>(dense.shape[0])});
  parts[2].shape = {parts[2].shape[1]};
  parts[3].shape = {};
  return parts;
}

// Decodes a group's parts with the reference algorithm (unpack the bits,
// scatter the values in row-major order), independent of the codec.
inline std::vector<std::byte> ReferenceDecode(const std::byte* values, const uint8_t* mask,
                                              uint64_t rows, uint64_t cols, uint32_t w) {
  std::vector<std::byte> dense(rows * cols * w);
  const uint64_t mrow = (cols + 7) / 8;
  uint64_t k = 0;
  for (uint64_t r = 0; r < rows; ++r) {
    for (uint64_t c = 0; c < cols; ++c) {
      if ((mask[r * mrow + c / 8] >> (c % 8)) & 1) {
        std::memcpy(dense.data() + (r * cols + c) * w, values + k * w, w);
        ++k;
      }
    }
  }
  return dense;
}

// Every tensor of a checkpoint, by name, as bytes: sparse groups as their
// stored parts, or, with `decode_sparse`, as the loader decodes them.
inline std::map<std::string, std::vector<std::byte>> LoadAll(const std::string& path,
                                                             bool decode_sparse = false) {
  std::map<std::string, std::vector<std::byte>> out;
  LoadOptions opts;
  opts.decode_sparse = decode_sparse;
  auto loaded = Load(path, opts);
  EXPECT_OK(loaded);
  if (!loaded.ok()) return out;
  for (const auto& t : loaded->tensors()) {
    const auto* p = static_cast<const std::byte*>(t.data);
    out[t.name] = std::vector<std::byte>(p, p + t.nbytes);
  }
  return out;
}

}  // namespace tensorlift::sparse_testing

#endif  // TENSORLIFT_TESTS_SPARSE_SPARSE_FILES_H_
