// Tensor-parallel slices (LoadOptions::parallel) planned by the loader's
// planners: every rank's tensors against slices cut from the file's plain
// bytes, with every option on the host path and the GPU pipeline (the
// emulated device), and the shared rule's refusals.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

#include "../common/assert_ok.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/loader.h"
#include "test_files.h"

namespace tensorlift {
namespace {

using test::ScratchDir;
using ::testing::HasSubstr;
using testing::RawTensor;

constexpr char kLayout[] = "\\.w$=0;proj$=1";

// The split dim of `name` under kLayout (as the loader reads it), or -1.
int DimOf(const std::string& name, size_t ndims) {
  const int dim = name.ends_with(".w") ? 0 : name.ends_with("proj") ? 1 : -1;
  return dim < static_cast<int>(ndims) ? dim : -1;
}

// Rank `rank` of `size`'s part of `bytes` (a row-major tensor of `shape`,
// elements of `esize` bytes) along `dim`, cut plainly, with its shape.
std::vector<uint8_t> Cut(const std::vector<uint8_t>& bytes, std::vector<uint64_t>* shape,
                         uint64_t esize, int dim, int rank, int size) {
  if (dim < 0) return bytes;
  const uint64_t extent = (*shape)[dim];
  const uint64_t block = (extent + size - 1) / size;
  const uint64_t lo = std::min<uint64_t>(extent, block * rank);
  const uint64_t hi = std::min<uint64_t>(extent, lo + block);
  uint64_t outer = 1, inner = esize;
  for (int d = 0; d < dim; ++d) outer *= (*shape)[d];
  for (size_t d = dim + 1; d < shape->size(); ++d) inner *= (*shape)[d];
  std::vector<uint8_t> out;
  for (uint64_t o = 0; o < outer; ++o) {
    const uint8_t* row = bytes.data() + o * extent * inner;
    out.insert(out.end(), row + lo * inner, row + hi * inner);
  }
  (*shape)[dim] = hi - lo;
  return out;
}

std::vector<RawTensor> Tensors() {
  using testing::Random;
  return {
      Random("a.q.w", Dtype::kF16, {37, 300}, 1),      // Dim 0: one piece.
      Random("b.odd", Dtype::kU8, {3}, 2),             // Misaligns what follows.
      Random("c.o_proj", Dtype::kBF16, {41, 513}, 3),  // Dim 1: a piece per row.
      Random("d.emb.w", Dtype::kF32, {700, 512}, 4),   // 1.4 MB: O_DIRECT middles.
      Random("e.down_proj", Dtype::kF32, {64, 3000}, 5),
      Random("f.norm", Dtype::kF32, {513}, 6),     // Whole.
      Random("g.bias_proj", Dtype::kF32, {9}, 7),  // Dim 1 of a 1-D tensor: whole.
      Random("h.t3_proj", Dtype::kF16, {4, 6, 10}, 8),
      Random("i.small.w", Dtype::kI32, {2, 5}, 9),  // Rank 2 of 3 gets no rows.
      Random("j.empty_proj", Dtype::kF32, {0, 4}, 10),
  };
}

class SlicesTest : public ::testing::TestWithParam<size_t> {
 protected:
  void SetUp() override {
    path_ = dir_.File("m.safetensors");
    raw_ = Tensors();
    testing::WriteRaw(path_, raw_, GetParam());  // Header sizes shift the data section.
  }

  // Rank `rank` of `size`'s tensors, from `whole` (a load of every tensor
  // with the same dtype, cut plainly), by name.
  static std::map<std::string, std::pair<std::vector<uint64_t>, std::vector<uint8_t>>> Expected(
      const LoadedCheckpoint& whole, int rank, int size) {
    std::map<std::string, std::pair<std::vector<uint64_t>, std::vector<uint8_t>>> out;
    for (const LoadedTensor& t : whole.tensors()) {
      std::vector<uint8_t> bytes(t.nbytes);
      EXPECT_OK(whole.CopyToHost(t.name, bytes.data()));
      std::vector<uint64_t> shape(t.shape.begin(), t.shape.end());
      std::vector<uint8_t> cut =
          Cut(bytes, &shape, DtypeBits(t.dtype) / 8, DimOf(t.name, shape.size()), rank, size);
      out[t.name] = {shape, std::move(cut)};
    }
    return out;
  }

  void ExpectRank(const LoadedCheckpoint& got, const LoadedCheckpoint& whole, int rank, int size,
                  const std::string& ctx) {
    const auto want = Expected(whole, rank, size);
    ASSERT_EQ(got.tensors().size(), want.size()) << ctx;
    for (const LoadedTensor& t : got.tensors()) {
      SCOPED_TRACE(ctx + " " + t.name);
      auto it = want.find(t.name);
      ASSERT_NE(it, want.end());
      EXPECT_EQ(std::vector<uint64_t>(t.shape.begin(), t.shape.end()), it->second.first);
      ASSERT_EQ(t.nbytes, it->second.second.size());
      std::vector<uint8_t> bytes(t.nbytes);
      ASSERT_OK(got.CopyToHost(t.name, bytes.data()));
      EXPECT_TRUE(bytes == it->second.second);
      if (t.nbytes > 0 && t.device == DeviceType::kCpu) {
        const uint64_t align = std::clamp<uint64_t>(DtypeBits(t.dtype) / 8, 1, 8);
        EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % align, 0u);
      }
    }
  }

  ScratchDir dir_;
  std::string path_;
  std::vector<RawTensor> raw_;
};

struct Case {
  const char* name;
  void (*set)(LoadOptions&);
};

const Case kCases[] = {
    {"auto", [](LoadOptions&) {}},
    {"buffered", [](LoadOptions& o) { o.mode = IoMode::kBuffered; }},
    {"direct", [](LoadOptions& o) { o.mode = IoMode::kDirect; }},
    {"direct/uring small blocks",
     [](LoadOptions& o) {
       o.mode = IoMode::kDirect;
       o.engine = IoEngine::kUring;
       o.block_size = 64 << 10;
     }},
    {"mmap", [](LoadOptions& o) { o.mode = IoMode::kMmap; }},
    {"copy", [](LoadOptions& o) { o.copy = true; }},
    {"shared memory", [](LoadOptions& o) { o.shared_memory = true; }},
    {"arena pool", [](LoadOptions& o) { o.arena_pool = std::make_shared<ArenaPool>(); }},
    {"dtype", [](LoadOptions& o) { o.dtype = Dtype::kF32; }},
    {"device", [](LoadOptions& o) { o.device = DeviceId::Emulated(); }},
    {"device direct small slots",
     [](LoadOptions& o) {
       o.device = DeviceId::Emulated();
       o.mode = IoMode::kDirect;
       o.staging_bytes = 64 << 10;
     }},
    {"device dtype", [](LoadOptions& o) {
       o.device = DeviceId::Emulated();
       o.dtype = Dtype::kF16;
     }}};

TEST_P(SlicesTest, EveryRankGetsItsSlicesWithEveryOption) {
  for (const Case& c : kCases) {
    LoadOptions base;
    c.set(base);
    if (base.mode == IoMode::kDirect && base.device.on_host() && base.engine == IoEngine::kUring) {
      base.engine = IoEngine::kAuto;  // Where io_uring is refused, threads.
    }
    LoadOptions whole_options = base;
    whole_options.device = DeviceId::Cpu();
    whole_options.mode = IoMode::kBuffered;
    whole_options.engine = IoEngine::kAuto;
    whole_options.shared_memory = false;
    auto whole = Load(path_, whole_options);
    ASSERT_OK(whole) << c.name;
    for (int size : {2, 3}) {
      for (int rank = 0; rank < size; ++rank) {
        const std::string ctx =
            std::string(c.name) + " rank " + std::to_string(rank) + " of " + std::to_string(size);
        LoadOptions o = base;
        if (o.arena_pool) o.arena_pool = std::make_shared<ArenaPool>();
        o.parallel = {size, rank};
        o.layout = kLayout;
        auto got = Load(path_, o);
        ASSERT_OK(got) << ctx;
        ExpectRank(*got, *whole, rank, size, ctx);
        EXPECT_THAT(got->files()[0].reason,
                    HasSubstr("for rank " + std::to_string(rank) + " of " + std::to_string(size)))
            << ctx;
        EXPECT_EQ(got->content(), nullptr) << ctx;
      }
    }
  }
}

TEST_P(SlicesTest, OnTensorHandsOutTheSlices) {
  for (const char* device : {"cpu", "emulated:0"}) {
    auto whole = Load(path_);
    ASSERT_OK(whole);
    LoadOptions o;
    o.device = *ParseDevice(device);
    o.parallel = {2, 1};
    o.layout = kLayout;
    std::mutex mu;
    std::map<std::string, std::vector<uint64_t>> shapes;
    o.on_tensor = [&](const StreamedTensor& t) {
      std::lock_guard lock(mu);
      shapes[t.tensor().name].assign(t.tensor().shape.begin(), t.tensor().shape.end());
      return Status::Ok();
    };
    auto got = Load(path_, o);
    ASSERT_OK(got) << device;
    ExpectRank(*got, *whole, 1, 2, device);
    ASSERT_EQ(shapes.size(), raw_.size()) << device;
    for (const LoadedTensor& t : got->tensors()) {
      EXPECT_EQ(shapes[t.name], std::vector<uint64_t>(t.shape.begin(), t.shape.end())) << t.name;
    }
  }
}

TEST_P(SlicesTest, OnlyTheSlicesBytesAreRead) {
  LoadOptions o;
  o.mode = IoMode::kBuffered;
  o.parallel = {4, 3};
  o.layout = kLayout;
  uint64_t whole = 0;
  for (const RawTensor& t : raw_) whole += t.bytes.size();
  auto got = Load(path_, o);
  ASSERT_OK(got);
  EXPECT_LT(got->files()[0].bytes, whole * 4 / 10);
  EXPECT_EQ(got->files()[0].bytes, got->total_bytes());
}

TEST_P(SlicesTest, TheSharedRuleRefuses) {
  LoadOptions o;
  o.parallel = {2, 2};
  o.layout = kLayout;
  EXPECT_THAT(Load(path_, o).status().message(), HasSubstr("out of range"));
  o.parallel = {0, 0};
  EXPECT_FALSE(Load(path_, o).ok());
  o.parallel = {2, 0};
  o.layout = "(=0";
  EXPECT_EQ(Load(path_, o).status().code(), StatusCode::kInvalidArgument);
  o.layout = kLayout;
  o.content_hash = ContentHashMode::kOn;
  EXPECT_THAT(Load(path_, o).status().message(), HasSubstr("content_hash"));
  // A size of 1 slices nothing: the whole tensors.
  LoadOptions one;
  one.parallel = {1, 0};
  one.layout = kLayout;
  auto got = Load(path_, one);
  ASSERT_OK(got);
  auto whole = Load(path_);
  ASSERT_OK(whole);
  ExpectRank(*got, *whole, 0, 1, "size 1");
}

INSTANTIATE_TEST_SUITE_P(HeaderShift, SlicesTest, ::testing::Values<size_t>(0, 3, 6));

}  // namespace
}  // namespace tensorlift
