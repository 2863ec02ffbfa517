#include "load/planner.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "../common/assert_ok.h"
#include "io/pread.h"
#include "tensorlift/safetensors.h"

namespace tensorlift {
namespace {

// A header with tensors of the given dtypes and byte sizes, contiguous, and
// `lead` spaces before the JSON object.
Header MakeHeader(const std::vector<std::pair<Dtype, uint64_t>>& specs, size_t lead) {
  std::string json(lead, ' ');
  json += "{";
  uint64_t off = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto [d, bytes] = specs[i];
    const uint64_t elems = bytes * 8 / DtypeBits(d);
    json += (i ? ",\"t" : "\"t") + std::to_string(i) + "\":{\"dtype\":\"" +
            std::string(DtypeName(d)) + "\",\"shape\":[" + std::to_string(elems) +
            "],\"data_offsets\":[" + std::to_string(off) + "," + std::to_string(off + bytes) + "]}";
    off += bytes;
  }
  json += "}";
  std::vector<std::byte> file(8 + json.size() + off);
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) file[i] = static_cast<std::byte>(n >> (8 * i));
  std::memcpy(file.data() + 8, json.data(), json.size());
  auto h = Header::Parse(file);
  EXPECT_OK(h);
  return std::move(h).value();
}

std::vector<uint32_t> All(const Header& h) {
  std::vector<uint32_t> v(h.tensors().size());
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// Reads cover exactly the wanted bytes, once each, at the right arena place.
void CheckCoverage(const Header& h, const FilePlan& plan) {
  uint64_t total = 0;
  for (const auto& r : plan.reads) {
    total += r.length;
    EXPECT_LE(r.arena_offset + r.length, plan.arena_bytes);
    if (r.direct && !r.bounce) {
      EXPECT_EQ(r.file_offset % kDirectAlign, 0u);
      EXPECT_EQ(r.length % kDirectAlign, 0u);
      EXPECT_EQ(r.arena_offset % kDirectAlign, 0u);
    }
  }
  EXPECT_EQ(total, plan.tensor_bytes);
  for (const auto& pt : plan.tensors) {
    const TensorInfo& t = h.tensors()[pt.index];
    if (!pt.in_arena || t.nbytes() == 0) continue;
    EXPECT_EQ(pt.arena_offset % ElementAlignment(t.dtype), 0u) << t.name;
    // Some read puts the tensor's first byte at its arena offset.
    const uint64_t first = h.data_offset() + t.begin;
    bool found = false;
    for (const auto& r : plan.reads) {
      if (first >= r.file_offset && first < r.file_offset + r.length) {
        EXPECT_EQ(r.arena_offset + (first - r.file_offset), pt.arena_offset) << t.name;
        found = true;
      }
    }
    EXPECT_TRUE(found) << t.name;
  }
}

TEST(PlannerTest, AlignedFileIsOneRunWithoutRealignment) {
  Header h = MakeHeader({{Dtype::kF32, 1 << 20}, {Dtype::kBF16, 1 << 20}, {Dtype::kU8, 7}}, 0);
  for (IoMode m : {IoMode::kBuffered, IoMode::kDirect}) {
    FilePlan p = PlanFile(h, All(h), m, 256 << 10);
    CheckCoverage(h, p);
    // Buffered placement is data-relative, so aligned regardless of header size.
    if (m == IoMode::kBuffered) {
      EXPECT_EQ(p.realigned, 0u);
    }
    EXPECT_LE(p.arena_bytes, p.tensor_bytes + 4096 + 64);
  }
}

TEST(PlannerTest, OddHeaderSizeRealignsOnlyInDirectMode) {
  for (size_t lead = 0; lead < 8; ++lead) {
    Header h = MakeHeader({{Dtype::kF32, 64 << 10}, {Dtype::kF64, 64 << 10}}, lead);
    FilePlan buffered = PlanFile(h, All(h), IoMode::kBuffered, 1 << 20);
    EXPECT_EQ(buffered.realigned, 0u);
    CheckCoverage(h, buffered);
    FilePlan direct = PlanFile(h, All(h), IoMode::kDirect, 1 << 20);
    CheckCoverage(h, direct);
    const bool aligned = h.data_offset() % 8 == 0;
    EXPECT_EQ(direct.realigned, aligned ? 0u : (h.data_offset() % 4 == 0 ? 1u : 2u)) << lead;
  }
}

TEST(PlannerTest, MisalignedTensorIsReadOnItsOwn) {
  Header h = MakeHeader({{Dtype::kU8, 3}, {Dtype::kF32, 400}, {Dtype::kU8, 1}}, 0);
  FilePlan p = PlanFile(h, All(h), IoMode::kBuffered, 1 << 20);
  EXPECT_EQ(p.realigned, 1u);
  CheckCoverage(h, p);
}

TEST(PlannerTest, DirectSplitsHeadMiddleTail) {
  Header h = MakeHeader({{Dtype::kU8, 5}, {Dtype::kU8, 1 << 20}}, 1);
  FilePlan p = PlanFile(h, std::vector<uint32_t>{1}, IoMode::kDirect, 256 << 10);
  CheckCoverage(h, p);
  int bounce = 0, plain = 0;
  for (const auto& r : p.reads) (r.bounce ? bounce : plain)++;
  EXPECT_EQ(bounce, 2);  // Unaligned head and tail.
  EXPECT_EQ(plain, 4);   // 1 MiB less the unaligned ends, in 256 KiB blocks.
}

TEST(PlannerTest, FilteredTensorsLeaveGapsOut) {
  Header h =
      MakeHeader({{Dtype::kF32, 1 << 20}, {Dtype::kF32, 8 << 20}, {Dtype::kF32, 1 << 20}}, 0);
  FilePlan p = PlanFile(h, std::vector<uint32_t>{0, 2}, IoMode::kBuffered, 1 << 20);
  CheckCoverage(h, p);
  EXPECT_EQ(p.tensor_bytes, 2u << 20);
  EXPECT_LE(p.arena_bytes, (2u << 20) + 2 * 4096);
}

TEST(PlannerTest, MmapViewsAlignedTensorsAndCopiesTheRest) {
  Header h = MakeHeader({{Dtype::kU8, 3}, {Dtype::kF32, 400}}, 0);
  FilePlan p = PlanFile(h, All(h), IoMode::kMmap, 1 << 20);
  EXPECT_FALSE(p.tensors[0].in_arena);
  const bool f32_aligned = (h.data_offset() + 3) % 4 == 0;
  EXPECT_EQ(p.tensors[1].in_arena, !f32_aligned);
}

}  // namespace
}  // namespace tensorlift
