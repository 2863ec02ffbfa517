// Helpers that write safetensors files for the loader tests, including ones
// the reference writer never produces (odd header sizes, misaligned tensors).
#ifndef TENSORLIFT_TESTS_LOAD_TEST_FILES_H_
#define TENSORLIFT_TESTS_LOAD_TEST_FILES_H_

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "../common/scratch_dir.h"
#include "tensorlift/dtype.h"

namespace tensorlift::testing {

struct RawTensor {
  std::string name;
  Dtype dtype;
  std::vector<uint64_t> shape;
  std::vector<uint8_t> bytes;  // Exactly dtype x shape.
};

inline uint64_t NumBytes(Dtype d, const std::vector<uint64_t>& shape) {
  uint64_t n = 1;
  for (auto s : shape) n *= s;
  return n * DtypeBits(d) / 8;
}

inline RawTensor Random(std::string name, Dtype d, std::vector<uint64_t> shape, uint32_t seed) {
  RawTensor t{std::move(name), d, std::move(shape), {}};
  t.bytes.resize(NumBytes(d, t.shape));
  std::mt19937 rng(seed);
  for (auto& b : t.bytes) b = static_cast<uint8_t>(rng());
  return t;
}

// Writes the tensors in the given order, contiguous, with `lead_spaces` of
// JSON whitespace before the header object (to make any header size) and no
// padding: the data section starts at 8 + N for whatever N results.
inline void WriteRaw(const std::string& path, const std::vector<RawTensor>& tensors,
                     size_t lead_spaces = 0) {
  std::string json(lead_spaces, ' ');
  json += "{";
  uint64_t off = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    if (i) json += ",";
    json += "\"" + t.name + "\":{\"dtype\":\"" + std::string(DtypeName(t.dtype)) + "\",\"shape\":[";
    for (size_t d = 0; d < t.shape.size(); ++d) json += (d ? "," : "") + std::to_string(t.shape[d]);
    json += "],\"data_offsets\":[" + std::to_string(off) + "," +
            std::to_string(off + t.bytes.size()) + "]}";
    off += t.bytes.size();
  }
  json += "}";
  FILE* f = std::fopen(path.c_str(), "wb");
  uint64_t n = json.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  std::fwrite(len, 1, 8, f);
  std::fwrite(json.data(), 1, json.size(), f);
  for (const auto& t : tensors) {
    if (!t.bytes.empty()) std::fwrite(t.bytes.data(), 1, t.bytes.size(), f);
  }
  std::fclose(f);
}

// A mix that exercises runs, realignment and zero-size tensors.
inline std::vector<RawTensor> MixedTensors(uint32_t seed) {
  return {
      Random("a.f32", Dtype::kF32, {33, 17}, seed + 1),
      Random("b.u8_odd", Dtype::kU8, {3}, seed + 2),  // Leaves the next one misaligned.
      Random("c.bf16", Dtype::kBF16, {5, 7}, seed + 3),
      Random("d.empty", Dtype::kF64, {0, 4}, seed + 4),
      Random("e.f64", Dtype::kF64, {9}, seed + 5),
      Random("f.scalar", Dtype::kI32, {}, seed + 6),
      Random("g.big", Dtype::kF16, {300, 1024}, seed + 7),  // 600 KiB: direct middle + bounce ends.
      Random("h.f4", Dtype::kF4, {2, 6}, seed + 8),
      Random("i.bool", Dtype::kBool, {5}, seed + 9),
      Random("j.c64", Dtype::kC64, {2, 3}, seed + 10),
  };
}

}  // namespace tensorlift::testing

#endif  // TENSORLIFT_TESTS_LOAD_TEST_FILES_H_
