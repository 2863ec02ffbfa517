// DeviceStream::DecodeBitmask on the host-emulated device (the CUDA kernel's
// code with the warp emulated, on the stream's worker, over device memory
// the host cannot touch) and on the host device (the CPU decoders): the
// same bytes as the CPU decoder; arguments refused at enqueue; an encoding
// that was not validated fails the stream. (The GPU itself:
// tests/device/cuda_device_test.cc.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "../common/assert_ok.h"
#include "bitmask_test_util.h"
#include "device/device.h"
#include "device/emulated_device.h"
#include "tensorlift/bitmask.h"

namespace tensorlift {
namespace {

using sparse::BitmaskShape;
using sparse::test::Encoded;
using sparse::test::EncodeDense;
using sparse::test::RandomDense;
using ::testing::HasSubstr;

template <typename T>
T Take(Result<T> result) {
  EXPECT_OK(result);
  if (!result.ok()) std::abort();
  return std::move(result).value();
}

// An encoding copied into one device allocation (values at an odd offset,
// so that the layout is not conveniently aligned), plus the output buffer.
struct OnDevice {
  std::shared_ptr<Buffer> memory;
  std::shared_ptr<Buffer> out;
  std::byte* values = nullptr;
  uint8_t* bitmask = nullptr;
  int64_t* row_offsets = nullptr;
};

OnDevice Upload(Device& device, DeviceStream& stream, const Encoded& e) {
  OnDevice d;
  const uint64_t offsets_at = 0;
  const uint64_t mask_at = e.row_offsets.size() * sizeof(int64_t) + 3;
  const uint64_t values_at = mask_at + e.bitmask.size() + 1;
  d.memory = Take(device.Allocate(values_at + e.values.size()));
  d.out = Take(device.Allocate(e.shape.dense_bytes()));
  d.row_offsets = reinterpret_cast<int64_t*>(d.memory->data() + offsets_at);
  d.bitmask = reinterpret_cast<uint8_t*>(d.memory->data() + mask_at);
  d.values = d.memory->data() + values_at;
  EXPECT_TRUE(stream
                  .CopyToDevice(reinterpret_cast<std::byte*>(d.row_offsets),
                                reinterpret_cast<const std::byte*>(e.row_offsets.data()),
                                e.row_offsets.size() * sizeof(int64_t))
                  .ok());
  EXPECT_TRUE(stream
                  .CopyToDevice(reinterpret_cast<std::byte*>(d.bitmask),
                                reinterpret_cast<const std::byte*>(e.bitmask.data()),
                                e.bitmask.size())
                  .ok());
  if (!e.values.empty()) {
    EXPECT_OK(stream.CopyToDevice(d.values, e.values.data(), e.values.size()));
  }
  return d;
}

Status DecodeOn(DeviceStream& stream, const OnDevice& d, const Encoded& e) {
  return stream.DecodeBitmask(d.out->data(), d.values, e.nnz(), d.bitmask, d.row_offsets,
                              e.shape.rows, e.shape.cols, e.shape.elem_bytes);
}

TEST(BitmaskDeviceTest, EmulatedDeviceDecodesLikeTheCpu) {
  auto device = MakeEmulatedDevice();
  auto stream = Take(device->CreateStream());
  std::mt19937_64 rng(21);
  for (uint32_t w : {1u, 2u, 4u, 8u}) {
    for (uint64_t cols : {1, 9, 33, 1000, 1025, 4099}) {
      for (double density : {0.0, 1.0, 0.5, -1.0}) {
        SCOPED_TRACE(testing::Message() << "w " << w << " cols " << cols << " density " << density);
        const BitmaskShape s{.rows = 7, .cols = cols, .elem_bytes = w};
        const std::vector<std::byte> dense = RandomDense(s, density, rng);
        const Encoded e = EncodeDense(dense, s);
        std::vector<std::byte> cpu(s.dense_bytes());
        ASSERT_TRUE(sparse::Decode(e.values.data(), e.nnz(), e.bitmask.data(), e.row_offsets.data(),
                                   s, cpu.data())
                        .ok());
        ASSERT_EQ(cpu, dense);

        const OnDevice d = Upload(*device, *stream, e);
        ASSERT_OK(DecodeOn(*stream, d, e));
        std::vector<std::byte> back(s.dense_bytes(), std::byte{0xCD});
        ASSERT_OK(stream->CopyToHost(back.data(), d.out->data(), back.size()));
        ASSERT_OK(stream->Synchronize());
        ASSERT_EQ(back, cpu);
      }
    }
  }
}

TEST(BitmaskDeviceTest, HostDeviceDecodesLikeTheCpu) {
  auto device = MakeHostDevice();
  auto stream = Take(device->CreateStream());
  std::mt19937_64 rng(22);
  for (uint32_t w : {1u, 2u, 4u, 8u}) {
    const BitmaskShape s{.rows = 9, .cols = 333, .elem_bytes = w};
    const std::vector<std::byte> dense = RandomDense(s, 0.5, rng);
    const Encoded e = EncodeDense(dense, s);
    std::vector<std::byte> out(s.dense_bytes(), std::byte{0xCD});
    ASSERT_TRUE(stream
                    ->DecodeBitmask(out.data(), e.values.data(), e.nnz(), e.bitmask.data(),
                                    e.row_offsets.data(), s.rows, s.cols, w)
                    .ok());
    EXPECT_EQ(out, dense) << w;
  }
}

TEST(BitmaskDeviceTest, ArgumentsAreCheckedAtEnqueue) {
  auto emulated = MakeEmulatedDevice();
  for (const std::shared_ptr<Device>& device : {emulated, MakeHostDevice()}) {
    SCOPED_TRACE(device->name());
    auto stream = Take(device->CreateStream());
    auto memory = Take(device->Allocate(1 << 16));
    std::byte* base = memory->data();
    std::byte* out = base;  // 8 x 16 bf16: 256 bytes.
    auto* offsets = reinterpret_cast<const int64_t*>(base + 4096);
    auto* mask = reinterpret_cast<const uint8_t*>(base + 8192);
    const std::byte* values = base + 12288;
    auto decode = [&](std::byte* dst, const std::byte* v, uint64_t nnz, const uint8_t* m,
                      const int64_t* o, uint64_t rows, uint64_t cols, uint32_t w) {
      return stream->DecodeBitmask(dst, v, nnz, m, o, rows, cols, w).code();
    };
    constexpr auto kBad = StatusCode::kInvalidArgument;
    EXPECT_EQ(decode(nullptr, values, 4, mask, offsets, 8, 16, 2), kBad);
    EXPECT_EQ(decode(out, nullptr, 4, mask, offsets, 8, 16, 2), kBad);
    EXPECT_EQ(decode(out, values, 4, nullptr, offsets, 8, 16, 2), kBad);
    EXPECT_EQ(decode(out, values, 4, mask, nullptr, 8, 16, 2), kBad);
    EXPECT_EQ(decode(out, values, 0, mask, offsets, 0, 16, 2), kBad);  // No elements.
    EXPECT_EQ(decode(out, values, 0, mask, offsets, 8, 0, 2), kBad);
    EXPECT_EQ(decode(out, values, 4, mask, offsets, 8, 16, 3), kBad);    // Element size.
    EXPECT_EQ(decode(out, values, 129, mask, offsets, 8, 16, 2), kBad);  // nnz > elements.
    EXPECT_EQ(decode(out, values, 4, mask, offsets, 1ull << 40, 1ull << 40, 2), kBad);
    EXPECT_EQ(decode(out, values, 4, mask, reinterpret_cast<const int64_t*>(base + 4097), 8, 16, 2),
              kBad);                                                           // Alignment.
    EXPECT_EQ(decode(out, out + 8, 4, mask, offsets, 8, 16, 2), kBad);         // Overlaps values.
    EXPECT_EQ(decode(base + 8000, values, 4, mask, offsets, 8, 16, 2), kBad);  // Overlaps mask.
    EXPECT_EQ(decode(base + 4000, values, 4, mask, offsets, 8, 16, 2), kBad);  // Overlaps offsets.
    EXPECT_OK(stream->Synchronize());  // Nothing was enqueued.
  }
}

TEST(BitmaskDeviceTest, EmulatedDeviceFailsTheStreamOnAnUnvalidatedEncoding) {
  auto device = MakeEmulatedDevice();
  auto stream = Take(device->CreateStream());
  std::mt19937_64 rng(23);
  const BitmaskShape s{.rows = 4, .cols = 50, .elem_bytes = 2};
  const std::vector<std::byte> dense = RandomDense(s, 0.5, rng);
  Encoded e = EncodeDense(dense, s);
  e.row_offsets[2] += 1;  // A GPU would read the wrong values, or out of bounds.
  const OnDevice d = Upload(*device, *stream, e);
  ASSERT_OK(DecodeOn(*stream, d, e));  // Asynchronous: reported later.
  const Status status = stream->Synchronize();
  EXPECT_EQ(status.code(), StatusCode::kCorruption);
  EXPECT_THAT(status.message(), HasSubstr("row_offsets[2]"));
}

TEST(BitmaskDeviceTest, EmulatedDeviceChecksEveryRange) {
  auto device = MakeEmulatedDevice();
  auto stream = Take(device->CreateStream());
  auto memory = Take(device->Allocate(4096));
  auto small = Take(device->Allocate(100));
  // The output (8 x 16 x 2 = 256 bytes) runs past the 100-byte allocation.
  ASSERT_TRUE(stream
                  ->DecodeBitmask(small->data(), memory->data() + 2048, 0,
                                  reinterpret_cast<const uint8_t*>(memory->data() + 1024),
                                  reinterpret_cast<const int64_t*>(memory->data()), 8, 16, 2)
                  .ok());
  const Status status = stream->Synchronize();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("DecodeBitmask destination"));
}

}  // namespace
}  // namespace tensorlift
