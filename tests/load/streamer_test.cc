// LayerStreamer (include/tensorlift/streamer.h): the layers it hands out are the bytes
// a plain Load gives, for dense and sparse-bitmask checkpoints; the
// resident/streamed split follows the budget; acquiring in order hits the
// prefetch, across passes too (wrap-around); a budget too small and a file
// that disappears mid-stream are clean errors.
#include "tensorlift/streamer.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../common/assert_ok.h"
#include "../common/scratch_dir.h"
#include "device/device.h"
#include "device/emulated_device.h"
#include "tensorlift/bitmask.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/loader.h"
#include "tensorlift/safetensors.h"

namespace tensorlift {
namespace {

constexpr size_t kLayers = 4;
constexpr uint64_t kRows = 24, kCols = 40;

std::span<const std::byte> AsBytes(const std::vector<uint8_t>& v) {
  return {reinterpret_cast<const std::byte*>(v.data()), v.size()};
}
std::span<const std::byte> AsBytes(const std::vector<int64_t>& v) {
  return {reinterpret_cast<const std::byte*>(v.data()), v.size() * sizeof(int64_t)};
}

// Random BF16 elements, about half of them zero.
std::vector<std::byte> RandomBf16(uint64_t count, uint32_t seed) {
  std::vector<std::byte> out(count * 2);
  std::mt19937 rng(seed);
  for (uint64_t e = 0; e < count; ++e) {
    if (rng() % 2 == 0) continue;
    out[2 * e] = static_cast<std::byte>(rng() & 0xff);
    out[2 * e + 1] = static_cast<std::byte>(rng() & 0xff);
  }
  return out;
}

// The four parts of a [kRows, kCols] BF16 weight, as compressed-tensors writes them.
struct Parts {
  std::vector<std::byte> values, shape;
  std::vector<uint8_t> mask;
  std::vector<int64_t> offsets;
  uint64_t nnz = 0;
};
Parts Encode(const std::vector<std::byte>& dense) {
  Parts p;
  sparse::BitmaskShape s{kRows, kCols, 2};
  p.nnz = sparse::CountNonZero(dense.data(), s);
  p.values.resize(p.nnz * 2);
  p.mask.resize(s.mask_bytes());
  p.offsets.resize(kRows);
  EXPECT_EQ(sparse::Encode(dense.data(), s, p.values.data(), p.mask.data(), p.offsets.data()),
            p.nnz);
  const int64_t dims[2] = {static_cast<int64_t>(kRows), static_cast<int64_t>(kCols)};
  p.shape.resize(16);
  std::memcpy(p.shape.data(), dims, 16);
  return p;
}

std::string WeightName(size_t i) {
  return "model.layers." + std::to_string(i) + ".mlp.down_proj.weight";
}
std::string NormName(size_t i) {
  return "model.layers." + std::to_string(i) + ".input_layernorm.weight";
}

// Four layers of a weight (a sparse group, or plain) and a plain norm; layers
// 0-1 in a.safetensors, 2 and layer 3's weight in b.safetensors, layer 3's
// norm alone in c.safetensors (a file without groups: a sparse Load scans
// every group's shape in every file, so only such a file can vanish without
// failing the loads of the other layers).
struct StreamerParam {
  bool sparse;
  bool device;  // Onto the emulated device.
};

class StreamerTest : public ::testing::TestWithParam<StreamerParam> {
 protected:
  void SetUp() override {
    dir_ = scratch_.path();
    const bool sparse = GetParam().sparse;
    std::vector<std::vector<std::byte>> weights, norms;
    std::vector<Parts> parts;
    for (size_t i = 0; i < kLayers; ++i) {
      weights.push_back(RandomBf16(kRows * kCols, 10 + i));
      norms.push_back(RandomBf16(kCols, 20 + i));
      parts.push_back(Encode(weights.back()));
    }
    std::vector<TensorView> a, b, c;
    for (size_t i = 0; i < kLayers; ++i) {
      auto& views = i < 2 ? a : b;
      (i == 3 ? c : views).push_back({NormName(i), Dtype::kBF16, {kCols}, norms[i]});
      if (!sparse) {
        views.push_back({WeightName(i), Dtype::kBF16, {kRows, kCols}, weights[i]});
        continue;
      }
      const std::string prefix = "model.layers." + std::to_string(i) + ".mlp.down_proj";
      views.push_back({prefix + ".shape", Dtype::kI64, {2}, parts[i].shape});
      views.push_back(
          {prefix + ".bitmask", Dtype::kU8, {kRows, (kCols + 7) / 8}, AsBytes(parts[i].mask)});
      views.push_back({prefix + ".row_offsets", Dtype::kI64, {kRows}, AsBytes(parts[i].offsets)});
      views.push_back({prefix + ".compressed", Dtype::kBF16, {parts[i].nnz}, parts[i].values});
    }
    ASSERT_OK(WriteFile(dir_ + "/a.safetensors", a, std::nullopt));
    ASSERT_OK(WriteFile(dir_ + "/b.safetensors", b, std::nullopt));
    ASSERT_OK(WriteFile(dir_ + "/c.safetensors", c, std::nullopt));
    auto ckpt = Checkpoint::Open(dir_);
    ASSERT_OK(ckpt);
    ckpt_ = std::move(ckpt).value();
    for (size_t i = 0; i < kLayers; ++i) layers_.push_back({WeightName(i), NormName(i)});
    options_.mode = IoMode::kDirect;  // As streaming uses it; falls back where refused.
    if (GetParam().device) {
      options_.device = DeviceId::Emulated();
      options_.staging_bytes = 64 << 10;
      options_.staging_buffers = 3;
    }
  }

  // What a resident layer costs: its dense bytes, or on a device its buffer.
  static uint64_t ResidentCost(const LayerStreamer& s, size_t i) {
    return GetParam().device ? s.device_bytes(i) : s.dense_bytes(i);
  }

  Result<LayerStreamer> Open(uint64_t budget) {
    return LayerStreamer::Open(ckpt_, layers_, budget, options_);
  }

  // A budget that makes layer 0 resident and streams the others.
  uint64_t OneResidentBudget() {
    auto all = Open(~uint64_t{0});
    EXPECT_OK(all);
    uint64_t largest = 0;
    for (size_t i = 1; i < kLayers; ++i) largest = std::max(largest, all->peak_bytes(i));
    return ResidentCost(*all, 0) + 2 * largest;
  }

  test::ScratchDir scratch_{"tl_streamer"};
  std::string dir_;
  Checkpoint ckpt_;
  std::vector<std::vector<std::string>> layers_;
  LoadOptions options_;
};

std::vector<std::byte> HostBytes(const LoadedCheckpoint& l, const std::string& name) {
  const LoadedTensor* t = l.Find(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return {};
  std::vector<std::byte> out(t->nbytes);
  EXPECT_OK(l.CopyToHost(name, out.data()));
  return out;
}

TEST_P(StreamerTest, LayersAreTheBytesOfAPlainLoad) {
  auto full = Load(ckpt_);
  ASSERT_OK(full);
  auto s = Open(OneResidentBudget());
  ASSERT_OK(s);
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < kLayers; ++i) {
      auto layer = s->Acquire(i);
      ASSERT_OK(layer);
      EXPECT_EQ((*layer)->tensors().size(), 2u);
      for (const std::string& name : layers_[i]) {
        EXPECT_EQ(HostBytes(**layer, name), HostBytes(*full, name)) << name;
        EXPECT_EQ((*layer)->Find(name)->shape, full->Find(name)->shape) << name;
      }
      EXPECT_OK(s->Release(i));
    }
  }
}

TEST_P(StreamerTest, ResidentSplitFollowsTheBudget) {
  auto all = Open(~uint64_t{0});
  ASSERT_OK(all);
  for (size_t i = 0; i < kLayers; ++i) {
    EXPECT_TRUE(all->resident(i));
    EXPECT_EQ(all->dense_bytes(i), (kRows * kCols + kCols) * 2);
    if (GetParam().device) {
      // Its buffer on the device: every allocation of its load (the tensors
      // aligned; a sparse group's stored parts beside its decoded tensor).
      EXPECT_GE(all->device_bytes(i), all->dense_bytes(i));
      if (GetParam().sparse) {  // The parts but P.shape, and the decoded weight.
        EXPECT_GE(all->device_bytes(i),
                  all->dense_bytes(i) + all->stored_bytes(i) - kCols * 2 - 16);
      }
      EXPECT_EQ(all->peak_bytes(i), all->device_bytes(i));
      EXPECT_EQ(all->device_bytes(i) % 256, 0u);
    } else if (GetParam().sparse) {
      // The four parts, not the dense bytes; held beside the dense ones while decoding.
      EXPECT_NE(all->stored_bytes(i), all->dense_bytes(i));
      EXPECT_EQ(all->peak_bytes(i), all->dense_bytes(i) + all->stored_bytes(i) - kCols * 2);
    } else {
      EXPECT_EQ(all->stored_bytes(i), all->dense_bytes(i));
      EXPECT_EQ(all->peak_bytes(i), all->dense_bytes(i));  // Read in place.
    }
  }
  auto one = Open(OneResidentBudget());
  ASSERT_OK(one);
  EXPECT_TRUE(one->resident(0));
  for (size_t i = 1; i < kLayers; ++i) EXPECT_FALSE(one->resident(i)) << i;
  auto none = Open(OneResidentBudget() - 1);
  ASSERT_OK(none);
  for (size_t i = 0; i < kLayers; ++i) EXPECT_FALSE(none->resident(i)) << i;
}

// A layer past the last: the queries say false or 0 and Acquire OutOfRange,
// never an exception (they used .at(), which threw std::out_of_range).
TEST_P(StreamerTest, ALayerPastTheLastIsNoLayerNotAnException) {
  auto s = Open(~uint64_t{0});
  ASSERT_OK(s);
  ASSERT_EQ(s->num_layers(), kLayers);
  for (size_t bad : {kLayers, kLayers + 1, ~size_t{0}}) {
    EXPECT_FALSE(s->resident(bad)) << bad;
    EXPECT_FALSE(s->in_memory(bad)) << bad;
    EXPECT_EQ(s->dense_bytes(bad), 0u) << bad;
    EXPECT_EQ(s->stored_bytes(bad), 0u) << bad;
    EXPECT_EQ(s->peak_bytes(bad), 0u) << bad;
    EXPECT_EQ(s->device_bytes(bad), 0u) << bad;
    EXPECT_EQ(s->Acquire(bad).status().code(), StatusCode::kOutOfRange) << bad;
  }
  EXPECT_TRUE(s->resident(kLayers - 1));
}

TEST_P(StreamerTest, InOrderAcquiresHitThePrefetchAcrossPasses) {
  auto s = Open(OneResidentBudget());
  ASSERT_OK(s);
  constexpr int kPasses = 3;
  for (int pass = 0; pass < kPasses; ++pass) {
    for (size_t i = 0; i < kLayers; ++i) {
      ASSERT_OK(s->Acquire(i));
      EXPECT_OK(s->Release(i));
    }
  }
  const LayerStreamer::Stats st = s->stats();
  // Every streamed Acquire was prefetched, including layer 1 of each later
  // pass, which the last layer's Acquire prefetched (wrap-around).
  EXPECT_EQ(st.prefetch_hits, kPasses * (kLayers - 1));
  EXPECT_EQ(st.prefetch_misses, 0u);
  // Layer 0 once (resident) and the others every pass, plus what the last
  // layer prefetched for a pass that never came: layer 1, and layer 2 when
  // layer 1 was loaded before the streamer was dropped (two slots free).
  const uint64_t min_loads = 1 + kPasses * (kLayers - 1);
  EXPECT_GE(st.loads, min_loads + 1);
  EXPECT_LE(st.loads, min_loads + 2);
  uint64_t min_bytes = s->stored_bytes(0) + s->stored_bytes(1);
  for (size_t i = 1; i < kLayers; ++i) min_bytes += kPasses * s->stored_bytes(i);
  EXPECT_GE(st.bytes_read, min_bytes);
  EXPECT_LE(st.bytes_read, min_bytes + s->stored_bytes(2));
  EXPECT_GE(st.wait_seconds, 0.0);
}

TEST_P(StreamerTest, OutOfOrderAcquireLoadsOnTheSpot) {
  auto s = Open(OneResidentBudget());
  ASSERT_OK(s);
  auto layer = s->Acquire(2);
  ASSERT_OK(layer);
  EXPECT_NE((*layer)->Find(WeightName(2)), nullptr);
  EXPECT_EQ(s->stats().prefetch_misses, 1u);
  // Releasing drops the streamer's reference only: the caller's stays valid.
  EXPECT_OK(s->Release(2));
  EXPECT_EQ(HostBytes(**layer, NormName(2)).size(), kCols * 2);
  EXPECT_OK(s->Acquire(1));
  EXPECT_EQ(s->Acquire(kLayers).status().code(), StatusCode::kOutOfRange);
}

TEST_P(StreamerTest, BudgetBelowTwoStreamedLayersIsAnError) {
  auto all = Open(~uint64_t{0});
  ASSERT_OK(all);
  uint64_t largest = 0;
  for (size_t i = 0; i < kLayers; ++i) largest = std::max(largest, all->peak_bytes(i));
  EXPECT_OK(Open(2 * largest));
  auto small = Open(2 * largest - 1);
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(
      small.status().message().find("a budget of " + std::to_string(2 * largest - 1) + " bytes"),
      std::string::npos)
      << small.status().message();
  EXPECT_NE(small.status().message().find(std::to_string(largest) + " bytes"), std::string::npos)
      << small.status().message();
}

TEST_P(StreamerTest, UnknownOrRepeatedNamesAreErrors) {
  layers_[1].push_back("model.layers.9.mlp.down_proj.weight");
  EXPECT_EQ(Open(~uint64_t{0}).status().code(), StatusCode::kNotFound);
  layers_[1].back() = NormName(0);
  EXPECT_EQ(Open(~uint64_t{0}).status().code(), StatusCode::kInvalidArgument);
}

TEST_P(StreamerTest, AMissingFileFailsThatAcquireOnly) {
  auto s = Open(OneResidentBudget());
  ASSERT_OK(s);
  std::filesystem::remove(dir_ + "/c.safetensors");  // Layer 3's norm.
  for (size_t i = 0; i < 3; ++i) {
    auto layer = s->Acquire(i);
    ASSERT_OK(layer) << i;
    EXPECT_OK(s->Release(i));
  }
  for (int attempt = 0; attempt < 2; ++attempt) {  // Reported again, not cached as success.
    auto failed = s->Acquire(3);
    ASSERT_FALSE(failed.ok());
    EXPECT_NE(failed.status().message().find("layer 3"), std::string::npos)
        << failed.status().message();
    EXPECT_NE(failed.status().message().find("c.safetensors"), std::string::npos)
        << failed.status().message();
  }
  // The layers whose file is still there keep working.
  auto again = s->Acquire(1);
  ASSERT_OK(again);
  EXPECT_NE((*again)->Find(WeightName(1)), nullptr);
}

// On a device only: the ring, its reuse, the prefetch order, a tensor kept
// past its release, and a conversion on the device.
class DeviceStreamerTest : public StreamerTest {
 protected:
  static std::shared_ptr<Device> Emulated() {
    auto d = OpenDevice(DeviceType::kEmulated, 0);
    EXPECT_OK(d);
    return d.ok() ? *d : nullptr;
  }
  // The lowest address of a loaded layer's tensors.
  static uintptr_t Base(const LoadedCheckpoint& l) {
    uintptr_t lo = UINTPTR_MAX;
    for (const auto& t : l.tensors()) lo = std::min(lo, reinterpret_cast<uintptr_t>(t.data));
    return lo;
  }
  // Waits for `pred`, which the streamer's background thread makes true when
  // it has loaded a layer; false after 60 s, a watchdog, not a measure.
  template <typename F>
  static bool Eventually(F pred) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!pred()) {
      if (std::chrono::steady_clock::now() > deadline) return pred();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
  }
};

TEST_P(DeviceStreamerTest, TheRingIsAllocatedOnceAndReused) {
  auto device = Emulated();
  ASSERT_NE(device, nullptr);
  auto before = GetEmulatedDeviceCounts(*device);
  ASSERT_OK(before);
  auto s = Open(OneResidentBudget());
  ASSERT_OK(s);
  EXPECT_EQ(s->device(), DeviceId::Emulated());
  uint64_t largest = 0;
  for (size_t i = 1; i < kLayers; ++i) largest = std::max(largest, s->device_bytes(i));
  EXPECT_EQ(s->device_memory(), s->device_bytes(0) + 2 * largest);
  EXPECT_LE(s->device_memory(), OneResidentBudget());
  auto opened = GetEmulatedDeviceCounts(*device);
  ASSERT_OK(opened);
  // Layer 0's buffer and the ring's two.
  EXPECT_EQ(opened->live_allocations, before->live_allocations + 3);
  EXPECT_GE(opened->live_bytes - before->live_bytes, s->device_memory());
  std::map<std::pair<size_t, int>, uintptr_t> base;  // (layer, pass) -> where it was.
  constexpr int kPasses = 4;
  for (int pass = 0; pass < kPasses; ++pass) {
    for (size_t i = 0; i < kLayers; ++i) {
      auto layer = s->Acquire(i);
      ASSERT_OK(layer);
      base[std::make_pair(i, pass)] = Base(**layer);
      auto now = GetEmulatedDeviceCounts(*device);
      ASSERT_OK(now);
      EXPECT_EQ(now->live_allocations, opened->live_allocations)
          << "pass " << pass << " layer " << i;
      layer->reset();
      EXPECT_OK(s->Release(i));
    }
  }
  // Three streamed layers take the two buffers in turn (1 A, 2 B, 3 A, 1 B,
  // ...): each is where it was two passes before, and not where it was in the
  // pass before; layer 0 never moves.
  for (int pass = 2; pass < kPasses; ++pass) {
    for (size_t i = 1; i < kLayers; ++i) {
      EXPECT_EQ(base[std::make_pair(i, pass)], base[std::make_pair(i, pass - 2)])
          << "layer " << i << " pass " << pass;
      EXPECT_NE(base[std::make_pair(i, pass)], base[std::make_pair(i, pass - 1)])
          << "layer " << i << " pass " << pass;
    }
    EXPECT_EQ(base[std::make_pair(size_t{0}, pass)], base[std::make_pair(size_t{0}, 0)]);
  }
}

TEST_P(DeviceStreamerTest, PrefetchFollowsTheOrderWithinTheRing) {
  auto s = Open(OneResidentBudget());
  ASSERT_OK(s);
  ASSERT_TRUE(s->resident(0));
  ASSERT_OK(s->Acquire(0));
  // Layer 1 is prefetched; 2 too (the ring's second buffer); 3 has no buffer.
  EXPECT_TRUE(Eventually([&] { return s->in_memory(1) && s->in_memory(2); }));
  EXPECT_FALSE(s->in_memory(3));
  ASSERT_OK(s->Acquire(1));
  EXPECT_FALSE(s->in_memory(3));
  EXPECT_OK(s->Release(1));
  EXPECT_FALSE(s->in_memory(1));
  // Layer 1's buffer goes to layer 3, the next after 2.
  EXPECT_TRUE(Eventually([&] { return s->in_memory(3); }));
  ASSERT_OK(s->Acquire(2));
  EXPECT_OK(s->Release(2));
  // Wrap-around: layer 2's buffer goes to layer 1 of the next pass.
  EXPECT_TRUE(Eventually([&] { return s->in_memory(1); }));
  for (size_t i = 1; i < kLayers; ++i) {
    int live = 0;
    for (size_t k = 1; k < kLayers; ++k) live += s->in_memory(k);
    EXPECT_LE(live, 2);
  }
  ASSERT_OK(s->Acquire(3));
  EXPECT_OK(s->Release(3));
  EXPECT_EQ(s->stats().prefetch_misses, 0u);
  EXPECT_EQ(s->stats().prefetch_hits, 3u);
}

TEST_P(DeviceStreamerTest, ATensorKeptPastReleaseHoldsItsBuffer) {
  auto s = Open(OneResidentBudget());
  ASSERT_OK(s);
  auto one = s->Acquire(1);
  ASSERT_OK(one);
  EXPECT_OK(s->Release(1));
  auto two = s->Acquire(2);
  ASSERT_OK(two);
  EXPECT_OK(s->Release(2));
  // Both buffers are still referenced: no room for layer 3, and no waiting.
  auto three = s->Acquire(3);
  ASSERT_FALSE(three.ok());
  EXPECT_EQ(three.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(three.status().message().find("still referenced"), std::string::npos)
      << three.status().message();
  one->reset();
  two->reset();
  auto again = s->Acquire(3);
  ASSERT_OK(again);
  EXPECT_NE((*again)->Find(WeightName(3)), nullptr);
  // A layer acquired and not released holds its buffer the same way.
  auto four = s->Acquire(1);
  ASSERT_OK(four);
  auto held = s->Acquire(2);
  EXPECT_EQ(held.status().code(), StatusCode::kResourceExhausted) << held.status().message();
  EXPECT_NE(held.status().message().find("layer(s) 1, 3"), std::string::npos)
      << held.status().message();
}

TEST_P(DeviceStreamerTest, AStreamTheDeviceDoesNotHaveIsRefused) {
  auto s = Open(OneResidentBudget());
  ASSERT_OK(s);
  ASSERT_OK(s->Acquire(1));
  Status st = s->Release(1, /*stream=*/42);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
  EXPECT_TRUE(s->in_memory(1));  // Still in use.
  EXPECT_OK(s->Release(1, 0));
  EXPECT_FALSE(s->in_memory(1));
}

TEST_P(DeviceStreamerTest, ConversionsOnTheDeviceFitTheRing) {
  options_.dtype = Dtype::kF32;
  auto s = Open(OneResidentBudget());
  ASSERT_OK(s);
  LoadOptions plain = options_;
  auto full = Load(ckpt_, plain);
  ASSERT_OK(full);
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < kLayers; ++i) {
      auto layer = s->Acquire(i);
      ASSERT_OK(layer);
      for (const std::string& name : layers_[i]) {
        EXPECT_EQ((*layer)->Find(name)->dtype, Dtype::kF32) << name;
        EXPECT_EQ(HostBytes(**layer, name), HostBytes(*full, name)) << name;
      }
      layer->reset();
      EXPECT_OK(s->Release(i));
    }
  }
}

TEST_P(DeviceStreamerTest, HostOnlyOptionsAreRefused) {
  const uint64_t budget = OneResidentBudget();
  options_.arena_pool = std::make_shared<ArenaPool>();
  auto s = Open(budget);
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << s.status().message();
}

INSTANTIATE_TEST_SUITE_P(DenseAndSparse, DeviceStreamerTest,
                         ::testing::Values(StreamerParam{false, true}, StreamerParam{true, true}),
                         [](const auto& info) {
                           return std::string(info.param.sparse ? "Sparse" : "Dense");
                         });

INSTANTIATE_TEST_SUITE_P(DenseAndSparse, StreamerTest,
                         ::testing::Values(StreamerParam{false, false}, StreamerParam{true, false},
                                           StreamerParam{false, true}, StreamerParam{true, true}),
                         [](const auto& info) {
                           return std::string(info.param.sparse ? "Sparse" : "Dense") +
                                  (info.param.device ? "OnDevice" : "");
                         });

}  // namespace
}  // namespace tensorlift
