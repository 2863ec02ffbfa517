// Loading sparse-bitmask checkpoints (src/load/sparse_load.cc): Load returns
// the dense tensors, bit-exact, in every read mode, through the emulated
// device, with filters on the dense names; bad groups fail with Corruption.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "../common/assert_ok.h"
#include "../common/scratch_dir.h"
#include "load/loader_internal.h"
#include "tensorlift/bitmask.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/loader.h"
#include "tensorlift/safetensors.h"
#include "tensorlift/sparsify.h"

namespace tensorlift {
namespace {

struct Dense {
  std::string name;
  Dtype dtype;
  std::vector<uint64_t> shape;
  std::vector<std::byte> bytes;
};

// Random elements, about `density` of them non-zero; -0.0 (0x8000) among the
// 16-bit ones, which must survive (a zero is all-zero bits only).
Dense MakeDense(std::string name, Dtype dtype, uint64_t rows, uint64_t cols, double density,
                uint32_t seed) {
  Dense d{std::move(name), dtype, {rows, cols}, {}};
  const uint32_t w = DtypeBits(dtype) / 8;
  d.bytes.resize(rows * cols * w);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  for (uint64_t e = 0; e < rows * cols; ++e) {
    if (u(rng) >= density) continue;
    for (uint32_t b = 0; b < w; ++b) d.bytes[e * w + b] = static_cast<std::byte>(rng() & 0xff);
    if (w == 2 && e % 97 == 0) {
      d.bytes[e * w] = std::byte{0};
      d.bytes[e * w + 1] = std::byte{0x80};
    }
  }
  return d;
}

// The four parts of `d` under `prefix`, as compressed-tensors writes them.
struct Parts {
  std::vector<std::byte> values, shape;
  std::vector<uint8_t> mask;
  std::vector<int64_t> offsets;
  uint64_t nnz = 0;
};
Parts Encode(const Dense& d) {
  Parts p;
  sparse::BitmaskShape s{d.shape[0], d.shape[1], static_cast<uint32_t>(DtypeBits(d.dtype) / 8)};
  p.nnz = sparse::CountNonZero(d.bytes.data(), s);
  p.values.resize(p.nnz * s.elem_bytes);
  p.mask.resize(s.mask_bytes());
  p.offsets.resize(s.rows);
  EXPECT_EQ(sparse::Encode(d.bytes.data(), s, p.values.data(), p.mask.data(), p.offsets.data()),
            p.nnz);
  const int64_t dims[2] = {static_cast<int64_t>(d.shape[0]), static_cast<int64_t>(d.shape[1])};
  p.shape.resize(16);
  std::memcpy(p.shape.data(), dims, 16);
  return p;
}

std::span<const std::byte> AsBytes(const std::vector<uint8_t>& v) {
  return {reinterpret_cast<const std::byte*>(v.data()), v.size()};
}
std::span<const std::byte> AsBytes(const std::vector<int64_t>& v) {
  return {reinterpret_cast<const std::byte*>(v.data()), v.size() * sizeof(int64_t)};
}

class SparseLoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = scratch_.path();
    dense_ = {
        MakeDense("model.layers.0.mlp.down_proj.weight", Dtype::kBF16, 67, 133, 0.5, 1),
        MakeDense("model.layers.0.mlp.up_proj.weight", Dtype::kF32, 33, 64, 0.3, 2),
        MakeDense("model.layers.1.mlp.down_proj.weight", Dtype::kF16, 1, 9, 0.0, 3),
        MakeDense("model.layers.1.self_attn.q_proj.weight", Dtype::kF8_E4M3, 40, 1000, 0.9, 4),
        MakeDense("model.layers.1.mlp.gate.weight", Dtype::kF64, 5, 7, 1.0, 5),
        MakeDense("model.norm.weight", Dtype::kBF16, 1, 64, 1.0, 6),
    };
    dense_.back().shape = {64};  // A plain 1-D tensor, stored as is.
  }

  // Two shards: the first 3 groups (current naming) and the plain tensor in
  // one, the others (old naming, ".weight" kept) in another; optionally with
  // one group's values in the other shard.
  void Write(bool split_group = false, int64_t corrupt_offset = 0) {
    std::vector<Parts> parts;  // Of the groups: every tensor but the last (plain, 1-D).
    for (size_t i = 0; i + 1 < dense_.size(); ++i) parts.push_back(Encode(dense_[i]));
    if (corrupt_offset != 0) parts[0].offsets[parts[0].offsets.size() / 2] += corrupt_offset;
    std::vector<TensorView> a, b;
    for (size_t i = 0; i + 1 < dense_.size(); ++i) {
      const Dense& d = dense_[i];
      const bool old = i >= 3;
      std::string prefix = old ? d.name : d.name.substr(0, d.name.size() - 7);
      auto& views = old ? b : a;
      views.push_back({prefix + ".shape", Dtype::kI64, {2}, parts[i].shape});
      views.push_back({prefix + ".bitmask",
                       Dtype::kU8,
                       {d.shape[0], (d.shape[1] + 7) / 8},
                       AsBytes(parts[i].mask)});
      views.push_back(
          {prefix + ".row_offsets", Dtype::kI64, {d.shape[0]}, AsBytes(parts[i].offsets)});
      auto& values_views = split_group && i == 0 ? b : views;
      values_views.push_back({prefix + ".compressed", d.dtype, {parts[i].nnz}, parts[i].values});
    }
    a.push_back(
        {dense_.back().name, dense_.back().dtype, dense_.back().shape, dense_.back().bytes});
    ASSERT_OK(WriteFile(dir_ + "/a.safetensors", a, std::nullopt));
    ASSERT_OK(WriteFile(dir_ + "/b.safetensors", b, std::nullopt));
  }

  void ExpectDense(const LoadedCheckpoint& l, const std::vector<std::string>& only = {}) {
    size_t expected = 0;
    for (const Dense& d : dense_) {
      if (!only.empty() && std::find(only.begin(), only.end(), d.name) == only.end()) {
        EXPECT_EQ(l.Find(d.name), nullptr) << d.name;
        continue;
      }
      ++expected;
      const LoadedTensor* t = l.Find(d.name);
      ASSERT_NE(t, nullptr) << d.name;
      EXPECT_EQ(t->dtype, d.dtype) << d.name;
      EXPECT_EQ(std::vector<uint64_t>(t->shape.begin(), t->shape.end()), d.shape) << d.name;
      ASSERT_EQ(t->nbytes, d.bytes.size()) << d.name;
      std::vector<std::byte> host(t->nbytes);
      ASSERT_OK(l.CopyToHost(d.name, host.data()));
      EXPECT_EQ(host, d.bytes) << d.name;
    }
    EXPECT_EQ(l.tensors().size(), expected);
    for (size_t i = 1; i < l.tensors().size(); ++i) {
      EXPECT_LT(l.tensors()[i - 1].name, l.tensors()[i].name);
    }
  }

  test::ScratchDir scratch_{"tl_sparse_load"};
  std::string dir_;
  std::vector<Dense> dense_;
};

TEST_F(SparseLoadTest, EveryModeReturnsTheDenseTensorsBitExact) {
  Write();
  for (IoMode mode : {IoMode::kAuto, IoMode::kBuffered, IoMode::kDirect, IoMode::kMmap}) {
    LoadOptions options;
    options.mode = mode;
    auto l = Load(dir_, options);
    ASSERT_OK(l);
    ExpectDense(*l);
    uint32_t decoded = 0;
    for (const auto& f : l->files()) decoded += f.decoded;
    EXPECT_EQ(decoded, dense_.size() - 1);
  }
}

TEST_F(SparseLoadTest, GroupAcrossShardsAndFilterOnDenseNames) {
  Write(/*split_group=*/true);
  auto all = Load(dir_);
  ASSERT_OK(all);
  ExpectDense(*all);
  LoadOptions options;
  auto re = TensorFilter::Regex("down_proj|norm");
  ASSERT_OK(re);
  options.filter = *re;
  auto some = Load(dir_, options);
  ASSERT_OK(some);
  ExpectDense(*some, {"model.layers.0.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight",
                      "model.norm.weight"});
}

TEST_F(SparseLoadTest, RawModeReturnsTheStoredParts) {
  Write();
  LoadOptions options;
  options.decode_sparse = false;
  auto l = Load(dir_, options);
  ASSERT_OK(l);
  EXPECT_EQ(l->tensors().size(), 4 * (dense_.size() - 1) + 1);
  EXPECT_NE(l->Find("model.layers.0.mlp.down_proj.bitmask"), nullptr);
  EXPECT_EQ(l->Find("model.layers.0.mlp.down_proj.weight"), nullptr);
}

TEST_F(SparseLoadTest, EmulatedDeviceDecodesOnTheDevice) {
  Write(/*split_group=*/true);
  LoadOptions options;
  options.device = DeviceId::Emulated();
  options.staging_bytes = 4096;  // Many blocks.
  auto l = Load(dir_, options);
  ASSERT_OK(l);
  ExpectDense(*l);
  for (const auto& t : l->tensors()) EXPECT_EQ(t.device, DeviceType::kEmulated) << t.name;
}

TEST_F(SparseLoadTest, LyingRowOffsetsAreCorruptionOnHostAndDevice) {
  Write(/*split_group=*/false, /*corrupt_offset=*/3);
  for (const DeviceId device : {DeviceId::Cpu(), DeviceId::Emulated()}) {
    for (IoMode mode : {IoMode::kBuffered, IoMode::kMmap}) {
      LoadOptions options;
      options.device = device;
      options.mode = mode;
      auto l = Load(dir_, options);
      ASSERT_FALSE(l.ok()) << device.Name();
      EXPECT_EQ(l.status().code(), StatusCode::kCorruption) << l.status().ToString();
      EXPECT_NE(l.status().message().find("model.layers.0.mlp.down_proj.weight"), std::string::npos)
          << l.status().ToString();
    }
  }
}

TEST_F(SparseLoadTest, ReadErrorMidLoadStopsTheDecoders) {
  Write();
  int calls = 0;
  auto wrap = [&](std::unique_ptr<ReadEngine> inner) -> std::unique_ptr<ReadEngine> {
    struct Failing final : ReadEngine {
      using ReadEngine::ReadEngine;
      std::unique_ptr<ReadEngine> inner;
      int* calls;
      Status Run(std::span<const ReadOp> ops, ReadProgress* progress) override {
        if ((*calls)++ == 0) return IOError("injected");
        return inner->Run(ops, progress);
      }
    };
    auto f = std::make_unique<Failing>(inner->files());
    f->inner = std::move(inner);
    f->calls = &calls;
    return f;
  };
  auto ckpt = Checkpoint::Open(dir_);
  ASSERT_OK(ckpt);
  LoadOptions options;
  options.mode = IoMode::kBuffered;
  auto l = LoadWithEngineWrapper(*ckpt, options, wrap);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("injected"), std::string::npos);
}

TEST_F(SparseLoadTest, SparsifiedShardsLoadAsTheOriginal) {
  // A dense checkpoint (no pruning, every target encoded), sparsified into
  // small shards, loads back as the original.
  std::vector<TensorView> views;
  for (const Dense& d : dense_) views.push_back({d.name, d.dtype, d.shape, d.bytes});
  ASSERT_TRUE(std::filesystem::create_directory(dir_ + "/in"));
  ASSERT_OK(WriteFile(dir_ + "/in/model.safetensors", views, std::nullopt));
  sparse::SparsifyOptions options;
  options.min_sparsity = 0;
  options.max_shard_bytes = 20000;
  auto report = sparse::Sparsify(dir_ + "/in", dir_ + "/out", options);
  ASSERT_OK(report);
  EXPECT_GT(report->files.size(), 2u);
  auto l = Load(dir_ + "/out");
  ASSERT_OK(l);
  ExpectDense(*l);
}

}  // namespace
}  // namespace tensorlift
