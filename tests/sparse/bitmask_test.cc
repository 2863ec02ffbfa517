// The sparse-bitmask codec (tensorlift/bitmask.h): every decoder this CPU runs
// gives back the encoded tensor bit for bit (and the scalar decoder's bytes),
// for every element width, density and row shape; reads stay inside the
// values and the mask (exactly-sized vectors for ASan, and guard pages for
// every build); threading; validation of untrusted encodings; dispatch.
#include "tensorlift/bitmask.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "../common/assert_ok.h"
#include "bitmask_test_util.h"

namespace tensorlift::sparse {
namespace {

using test::Encoded;
using test::EncodeDense;
using test::RandomDense;
using ::testing::HasSubstr;

// The ISAs this CPU runs.
std::vector<DecodeIsa> Isas() {
  std::vector<DecodeIsa> isas;
  for (DecodeIsa isa : {DecodeIsa::kScalar, DecodeIsa::kAvx2, DecodeIsa::kAvx512}) {
    if (Supported(isa)) isas.push_back(isa);
  }
  return isas;
}

constexpr uint32_t kWidths[] = {1, 2, 4, 8};
constexpr uint64_t kCols[] = {1, 7, 8, 9, 31, 32, 33, 63, 64, 65, 100, 1000, 4099};
// -1: a random density per row.
constexpr double kDensities[] = {0.0, 1.0, 0.5, 0.1, 0.9, -1.0};

// Decodes rows [r0, r1) with `isa` into a buffer of sentinel bytes; checks
// those rows against `dense` and that no other byte changed.
void ExpectDecodes(DecodeIsa isa, const Encoded& e, const std::vector<std::byte>& dense,
                   uint64_t r0, uint64_t r1) {
  const BitmaskShape& s = e.shape;
  std::vector<std::byte> out(s.dense_bytes(), std::byte{0xCD});
  DecodeRows(isa, e.values.data(), e.bitmask.data(), e.row_offsets.data(), s, r0, r1, out.data());
  const uint64_t row_bytes = s.cols * s.elem_bytes;
  for (uint64_t r = 0; r < s.rows; ++r) {
    const std::byte* got = out.data() + r * row_bytes;
    if (r >= r0 && r < r1) {
      ASSERT_EQ(std::memcmp(got, dense.data() + r * row_bytes, row_bytes), 0)
          << IsaName(isa) << " row " << r;
    } else {
      for (uint64_t i = 0; i < row_bytes; ++i) {
        ASSERT_EQ(got[i], std::byte{0xCD}) << IsaName(isa) << " wrote row " << r;
      }
    }
  }
}

TEST(BitmaskTest, EveryIsaDecodesEveryShape) {
  std::mt19937_64 rng(1);
  for (uint32_t w : kWidths) {
    for (uint64_t cols : kCols) {
      for (uint64_t rows : {uint64_t{0}, uint64_t{1}, uint64_t{13}}) {
        for (double density : kDensities) {
          SCOPED_TRACE(testing::Message() << "w " << w << " cols " << cols << " rows " << rows
                                          << " density " << density);
          const BitmaskShape s{.rows = rows, .cols = cols, .elem_bytes = w};
          const std::vector<std::byte> dense = RandomDense(s, density, rng);
          const Encoded e = EncodeDense(dense, s);
          ASSERT_OK(Validate(e.bitmask.data(), e.row_offsets.data(), s, e.nnz()));
          for (DecodeIsa isa : Isas()) {
            ExpectDecodes(isa, e, dense, 0, rows);
            if (rows > 2) ExpectDecodes(isa, e, dense, 1, rows - 1);  // Interior rows only.
          }
        }
      }
    }
  }
}

// Random shapes and densities against the scalar decoder's bytes.
TEST(BitmaskTest, SimdMatchesScalarOnRandomShapes) {
  std::mt19937_64 rng(2);
  for (int iter = 0; iter < 300; ++iter) {
    const BitmaskShape s{
        .rows = rng() % 9, .cols = 1 + rng() % 300, .elem_bytes = kWidths[rng() % 4]};
    const double density = std::uniform_real_distribution<double>(0, 1)(rng);
    const std::vector<std::byte> dense = RandomDense(s, density, rng);
    const Encoded e = EncodeDense(dense, s);
    std::vector<std::byte> scalar(s.dense_bytes());
    DecodeRows(DecodeIsa::kScalar, e.values.data(), e.bitmask.data(), e.row_offsets.data(), s, 0,
               s.rows, scalar.data());
    ASSERT_EQ(scalar, dense);
    for (DecodeIsa isa : Isas()) {
      std::vector<std::byte> out(s.dense_bytes(), std::byte{0xCD});
      DecodeRows(isa, e.values.data(), e.bitmask.data(), e.row_offsets.data(), s, 0, s.rows,
                 out.data());
      ASSERT_EQ(out, scalar) << IsaName(isa) << " iteration " << iter;
    }
  }
}

// -0.0 and NaN payloads are non-zeros and come back bit for bit.
TEST(BitmaskTest, NegativeZeroAndNanPayloadsSurvive) {
  const uint16_t bf16[] = {0x8000, 0x0000, 0x7FC1, 0xFF81, 0x0001, 0x0000, 0x7F80, 0x8000, 0xFFFF};
  const uint32_t f32[] = {0x80000000u, 0, 0x7FA00001u, 0xFFC00123u, 0, 0x00000001u};
  const uint64_t f64[] = {0x8000000000000000ull, 0, 0x7FF0000000000001ull, 0xFFF8DEADBEEF0001ull};
  const uint8_t fp8[] = {0x80, 0, 0x7F, 0xFF, 0, 0x01};
  auto check = [](const void* data, uint64_t count, uint32_t w) {
    const BitmaskShape s{.rows = 1, .cols = count, .elem_bytes = w};
    std::vector<std::byte> dense(count * w);
    std::memcpy(dense.data(), data, dense.size());
    const Encoded e = EncodeDense(dense, s);
    uint64_t zeros = 0;
    for (uint64_t i = 0; i < count; ++i) {
      bool zero = true;
      for (uint32_t b = 0; b < w; ++b) zero = zero && dense[i * w + b] == std::byte{0};
      zeros += zero;
    }
    EXPECT_EQ(e.nnz(), count - zeros) << "w " << w;  // Only all-zero bits count as zero.
    for (DecodeIsa isa : Isas()) {
      std::vector<std::byte> out(dense.size(), std::byte{0xCD});
      ASSERT_TRUE(Decode(e.values.data(), e.nnz(), e.bitmask.data(), e.row_offsets.data(), s,
                         out.data(), 1, isa)
                      .ok());
      EXPECT_EQ(out, dense) << IsaName(isa) << " w " << w;
    }
  };
  check(bf16, std::size(bf16), 2);
  check(f32, std::size(f32), 4);
  check(f64, std::size(f64), 8);
  check(fp8, std::size(fp8), 1);
}

// Memory of `bytes` bytes that ends exactly at an inaccessible page: a read
// past the end faults in any build (ASan does not see SIMD builtins such as
// the expand-loads).
class GuardedBytes {
 public:
  explicit GuardedBytes(uint64_t bytes) : page_(static_cast<uint64_t>(sysconf(_SC_PAGESIZE))) {
    const uint64_t data_pages = (bytes + page_ - 1) / page_;
    mapped_ = (data_pages + 1) * page_;
    void* p = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) std::abort();
    base_ = static_cast<std::byte*>(p);
    if (mprotect(base_ + data_pages * page_, page_, PROT_NONE) != 0) std::abort();
    data_ = base_ + data_pages * page_ - bytes;
  }
  ~GuardedBytes() { munmap(base_, mapped_); }
  GuardedBytes(const GuardedBytes&) = delete;
  GuardedBytes& operator=(const GuardedBytes&) = delete;
  std::byte* data() { return data_; }

 private:
  uint64_t page_;
  uint64_t mapped_ = 0;
  std::byte* base_ = nullptr;
  std::byte* data_ = nullptr;
};

TEST(BitmaskTest, ReadsStopAtTheEndOfValuesAndMask) {
  std::mt19937_64 rng(3);
  for (uint32_t w : kWidths) {
    for (uint64_t cols : {uint64_t{5}, uint64_t{64}, uint64_t{100}, uint64_t{777}}) {
      for (double density : {0.5, 1.0, 0.02}) {
        const BitmaskShape s{.rows = 6, .cols = cols, .elem_bytes = w};
        std::vector<std::byte> dense = RandomDense(s, density, rng);
        // The last two rows end in zeros: the values run out long before
        // the columns do.
        for (uint64_t r = s.rows - 2; r < s.rows; ++r) {
          std::memset(dense.data() + (r * cols + cols / 3) * w, 0, (cols - cols / 3) * w);
        }
        const Encoded e = EncodeDense(dense, s);
        GuardedBytes values(e.values.size());
        if (!e.values.empty()) std::memcpy(values.data(), e.values.data(), e.values.size());
        GuardedBytes mask(e.bitmask.size());
        std::memcpy(mask.data(), e.bitmask.data(), e.bitmask.size());
        for (DecodeIsa isa : Isas()) {
          for (uint64_t r0 : {uint64_t{0}, s.rows - 1}) {
            std::vector<std::byte> out(s.dense_bytes());
            DecodeRows(isa, values.data(), reinterpret_cast<const uint8_t*>(mask.data()),
                       e.row_offsets.data(), s, r0, s.rows, out.data());
            const uint64_t skip = r0 * cols * w;
            ASSERT_EQ(std::memcmp(out.data() + skip, dense.data() + skip, out.size() - skip), 0)
                << IsaName(isa) << " w " << w << " cols " << cols;
          }
        }
      }
    }
  }
}

TEST(BitmaskTest, MultiThreadedDecodeEqualsSingleThreaded) {
  std::mt19937_64 rng(4);
  for (uint32_t w : {1u, 2u, 8u}) {
    // Over 1 MiB of dense output, so that Decode does split it.
    const BitmaskShape s{.rows = 301, .cols = 4099 / w, .elem_bytes = w};
    const std::vector<std::byte> dense = RandomDense(s, -1.0, rng);
    ASSERT_GT(s.dense_bytes(), 1u << 20);
    const Encoded e = EncodeDense(dense, s);
    for (DecodeIsa isa : Isas()) {
      for (int threads : {1, 2, 3, 7, 0, 1000}) {
        std::vector<std::byte> out(s.dense_bytes(), std::byte{0xCD});
        ASSERT_TRUE(Decode(e.values.data(), e.nnz(), e.bitmask.data(), e.row_offsets.data(), s,
                           out.data(), threads, isa)
                        .ok());
        ASSERT_EQ(out, dense) << IsaName(isa) << " threads " << threads;
      }
    }
  }
}

TEST(BitmaskTest, DecodeOfEmptyShapes) {
  for (const BitmaskShape& s : {BitmaskShape{.rows = 0, .cols = 5, .elem_bytes = 2},
                                BitmaskShape{.rows = 3, .cols = 0, .elem_bytes = 2}}) {
    const std::vector<int64_t> offsets(s.rows, 0);
    EXPECT_OK(Decode(nullptr, 0, nullptr, offsets.data(), s, nullptr));
  }
}

// --- Validation of untrusted encodings.

class BitmaskValidateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937_64 rng(5);
    dense_ = RandomDense(shape_, 0.5, rng);
    e_ = EncodeDense(dense_, shape_);
    ASSERT_OK(Check());
  }

  // Validate, and Decode, which must fail the same way without writing.
  Status Check() {
    const Status v = Validate(e_.bitmask.data(), e_.row_offsets.data(), e_.shape, nnz());
    std::vector<std::byte> out(e_.shape.dense_bytes(), std::byte{0xCD});
    const Status d = Decode(e_.values.data(), nnz(), e_.bitmask.data(), e_.row_offsets.data(),
                            e_.shape, out.data());
    EXPECT_EQ(v.code(), d.code()) << v.ToString() << " / " << d.ToString();
    if (!d.ok()) {
      EXPECT_EQ(out, std::vector<std::byte>(out.size(), std::byte{0xCD}));
    }
    return v;
  }
  uint64_t nnz() const { return nnz_override_ ? *nnz_override_ : e_.nnz(); }

  BitmaskShape shape_{.rows = 5, .cols = 21, .elem_bytes = 2};  // 3 mask bytes a row.
  std::vector<std::byte> dense_;
  Encoded e_;
  std::optional<uint64_t> nnz_override_;
};

TEST_F(BitmaskValidateTest, FirstOffsetNotZero) {
  e_.row_offsets[0] = 1;
  EXPECT_EQ(Check().code(), StatusCode::kCorruption);
  EXPECT_THAT(Check().message(), HasSubstr("row_offsets[0]"));
}

TEST_F(BitmaskValidateTest, OffsetTooLargeOrTooSmall) {
  e_.row_offsets[2] += 1;
  EXPECT_EQ(Check().code(), StatusCode::kCorruption);
  EXPECT_THAT(Check().message(), HasSubstr("row_offsets[2]"));
  e_.row_offsets[2] -= 2;
  EXPECT_EQ(Check().code(), StatusCode::kCorruption);
}

TEST_F(BitmaskValidateTest, OffsetsNotIncreasing) {
  std::swap(e_.row_offsets[1], e_.row_offsets[3]);
  EXPECT_EQ(Check().code(), StatusCode::kCorruption);
}

TEST_F(BitmaskValidateTest, NegativeOffset) {
  e_.row_offsets[4] = -1;
  EXPECT_EQ(Check().code(), StatusCode::kCorruption);
  e_.row_offsets[4] = INT64_MIN;
  EXPECT_EQ(Check().code(), StatusCode::kCorruption);
}

TEST_F(BitmaskValidateTest, PaddingBitsSet) {
  // Columns 21..23 of row 3 are padding: bits 5..7 of its last mask byte.
  e_.bitmask[3 * 3 + 2] |= 0x40;
  // Keep the count right, so that only the padding is wrong.
  nnz_override_ = e_.nnz() + 1;
  e_.values.resize(e_.values.size() + 2);
  for (uint64_t r = 4; r < shape_.rows; ++r) e_.row_offsets[r] += 1;
  EXPECT_EQ(Check().code(), StatusCode::kCorruption);
  EXPECT_THAT(Check().message(), HasSubstr("padding"));
}

TEST_F(BitmaskValidateTest, NnzMismatch) {
  nnz_override_ = e_.nnz() - 1;
  EXPECT_EQ(Check().code(), StatusCode::kCorruption);
  nnz_override_ = e_.nnz() + 1;
  e_.values.resize(e_.values.size() + 2);
  EXPECT_EQ(Check().code(), StatusCode::kCorruption);
}

TEST_F(BitmaskValidateTest, MaskBitFlipped) {
  e_.bitmask[1] ^= 0x01;  // Row 0 gains or loses a non-zero.
  EXPECT_EQ(Check().code(), StatusCode::kCorruption);
}

TEST_F(BitmaskValidateTest, BadElementSize) {
  for (uint32_t w : {0u, 3u, 16u}) {
    e_.shape.elem_bytes = w;
    EXPECT_EQ(Check().code(), StatusCode::kInvalidArgument) << w;
  }
}

TEST(BitmaskShapeTest, Overflow) {
  EXPECT_OK(CheckShape({.rows = 1ull << 20, .cols = 1ull << 20, .elem_bytes = 8}));
  for (const BitmaskShape& s :
       {BitmaskShape{.rows = 1ull << 40, .cols = 1ull << 40, .elem_bytes = 1},
        BitmaskShape{.rows = 1ull << 31, .cols = 1ull << 31, .elem_bytes = 8},
        BitmaskShape{.rows = 2, .cols = UINT64_MAX, .elem_bytes = 1},
        BitmaskShape{.rows = 1, .cols = UINT64_MAX, .elem_bytes = 2}}) {
    EXPECT_EQ(CheckShape(s).code(), StatusCode::kInvalidArgument) << s.rows << " x " << s.cols;
    const int64_t offset = 0;
    const uint8_t mask = 0;
    std::byte out;
    EXPECT_EQ(Decode(nullptr, 0, &mask, &offset, s, &out).code(), StatusCode::kInvalidArgument);
  }
}

TEST(BitmaskDecodeTest, RefusesBadArguments) {
  const BitmaskShape s{.rows = 1, .cols = 8, .elem_bytes = 2};
  const uint8_t mask = 0x01;
  const int64_t offset = 0;
  const uint16_t value = 7;
  std::byte out[16];
  const auto* v = reinterpret_cast<const std::byte*>(&value);
  EXPECT_OK(Decode(v, 1, &mask, &offset, s, out));
  EXPECT_EQ(Decode(nullptr, 1, &mask, &offset, s, out).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Decode(v, 1, nullptr, &offset, s, out).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Decode(v, 1, &mask, nullptr, s, out).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Decode(v, 1, &mask, &offset, s, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Decode(v, 1, &mask, &offset, s, out, -1).code(), StatusCode::kInvalidArgument);
  for (DecodeIsa isa : {DecodeIsa::kAvx2, DecodeIsa::kAvx512}) {
    if (!Supported(isa)) {
      EXPECT_EQ(Decode(v, 1, &mask, &offset, s, out, 1, isa).code(), StatusCode::kInvalidArgument);
    }
  }
}

// --- Dispatch.

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = getenv(name)) old_ = old;
    had_ = getenv(name) != nullptr;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

TEST(BitmaskDispatchTest, BestIsaAndTheEnvironmentCap) {
  EXPECT_TRUE(Supported(DecodeIsa::kScalar));
  EXPECT_STREQ(IsaName(DecodeIsa::kScalar), "scalar");
  EXPECT_STREQ(IsaName(DecodeIsa::kAvx2), "avx2");
  EXPECT_STREQ(IsaName(DecodeIsa::kAvx512), "avx512");
  // AVX-512 here implies AVX2 (every AVX-512 CPU has it).
  if (Supported(DecodeIsa::kAvx512)) {
    EXPECT_TRUE(Supported(DecodeIsa::kAvx2));
  }
  const DecodeIsa best = Isas().back();
  {
    ScopedEnv env("TL_SPARSE_ISA", "avx512");
    EXPECT_EQ(BestDecodeIsa(), best);
  }
  {
    ScopedEnv env("TL_SPARSE_ISA", "nonsense");
    EXPECT_EQ(BestDecodeIsa(), best);
  }
  {
    ScopedEnv env("TL_SPARSE_ISA", "scalar");
    EXPECT_EQ(BestDecodeIsa(), DecodeIsa::kScalar);
  }
  {
    ScopedEnv env("TL_SPARSE_ISA", "avx2");
    EXPECT_EQ(BestDecodeIsa(), Supported(DecodeIsa::kAvx2) ? DecodeIsa::kAvx2 : DecodeIsa::kScalar);
  }
}

}  // namespace
}  // namespace tensorlift::sparse
