// The host-emulated device: separate device memory that host code cannot
// touch, asynchronous streams in order, sticky errors for bad addresses and
// use after free, poisoned and quarantined freed memory, memory limits.
//
// No wall-clock upper bounds: asynchrony is shown with throttled copies, which
// cannot be done before their throttle's time has passed since they were
// enqueued (the copy sleeps until then). A test that looked sooner, by the
// clock read after looking, must have seen them not done; one that a loaded
// machine held up past that time can tell nothing, and checks nothing there.
#include "device/emulated_device.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../common/assert_ok.h"
#include "device/device.h"

namespace tensorlift {
namespace {

using ::testing::HasSubstr;

// Test shorthand: the value of a Result, failing the test on an error.
template <typename T>
T Take(Result<T> result) {
  EXPECT_OK(result);
  if (!result.ok()) std::abort();
  return std::move(result).value();
}

void Fill(std::byte* p, uint64_t n, uint32_t seed) {
  for (uint64_t i = 0; i < n; ++i)
    p[i] = static_cast<std::byte>((i * 131 + seed * 7 + (i >> 9)) & 0xFF);
}

bool Overlaps(const Buffer& a, const Buffer& b) {
  return a.data() < b.data() + b.size() && b.data() < a.data() + a.size();
}

EmulatedDeviceCounts Counts(Device& device) { return Take(GetEmulatedDeviceCounts(device)); }

using Clock = std::chrono::steady_clock;

// The earliest time throttled work enqueued after `enqueued` can be done,
// when it moves `bytes` at `rate` bytes/s (a little less, for rounding).
Clock::time_point EarliestDone(Clock::time_point enqueued, double bytes, double rate) {
  return enqueued + std::chrono::duration_cast<Clock::duration>(
                        std::chrono::duration<double>(0.95 * bytes / rate));
}

// Expects `event` not done, where its work cannot be done before `earliest`:
// when the clock, read after looking, is still before it, Done() must have
// been false. Past it, nothing can be told, and nothing is checked.
void ExpectNotDoneBefore(DeviceEvent& event, Clock::time_point earliest, const char* what) {
  const bool done = event.Done();
  if (Clock::now() < earliest) {
    EXPECT_FALSE(done) << what;
  } else {
    std::printf("[ info ] %s: looked too late to tell\n", what);
  }
}

TEST(EmulatedDeviceTest, Identity) {
  auto device = MakeEmulatedDevice({.memory_bytes = 1 << 20});
  EXPECT_EQ(device->kind(), DeviceType::kEmulated);
  EXPECT_EQ(device->name(), "emulated:0");
  EXPECT_EQ(device->ordinal(), 0);
  EXPECT_EQ(device->dlpack_device_type(), 12);
  EXPECT_EQ(Take(device->FreeMemory()), 1u << 20);
}

TEST(EmulatedDeviceTest, RoundTripHostDeviceHost) {
  auto device = MakeEmulatedDevice();
  constexpr uint64_t kBytes = (1 << 20) + 123;
  auto src = Take(device->AllocatePinned(kBytes));
  Fill(src->data(), kBytes, 1);
  auto a = Take(device->Allocate(kBytes));
  auto b = Take(device->Allocate(kBytes));
  EXPECT_EQ(a->size(), kBytes);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % 256, 0u);
  EXPECT_FALSE(Overlaps(*a, *b));
  auto stream = Take(device->CreateStream());
  ASSERT_OK(stream->CopyToDevice(a->data(), src->data(), kBytes));
  ASSERT_OK(stream->CopyOnDevice(b->data(), a->data(), kBytes));
  std::vector<std::byte> back(kBytes);
  ASSERT_OK(stream->CopyToHost(back.data(), b->data(), kBytes));
  // A piece in the middle, into pinned memory.
  auto pinned = Take(device->AllocatePinned(1000));
  ASSERT_OK(stream->CopyToHost(pinned->data(), b->data() + 5000, 1000));
  ASSERT_OK(stream->Synchronize());
  EXPECT_EQ(std::memcmp(back.data(), src->data(), kBytes), 0);
  EXPECT_EQ(std::memcmp(pinned->data(), src->data() + 5000, 1000), 0);
}

TEST(EmulatedDeviceTest, EnqueueChecksArguments) {
  auto device = MakeEmulatedDevice();
  auto buf = Take(device->Allocate(4096));
  auto host = Take(device->AllocatePinned(4096));
  auto stream = Take(device->CreateStream());
  EXPECT_EQ(stream->CopyToDevice(nullptr, host->data(), 16).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(stream->CopyToDevice(buf->data(), nullptr, 16).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(stream->CopyToDevice(buf->data(), host->data(), 0).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(stream->CopyToHost(host->data(), buf->data(), 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(stream->CopyOnDevice(buf->data(), nullptr, 16).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(stream->CopyOnDevice(buf->data() + 8, buf->data(), 16).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(stream->Convert(nullptr, Dtype::kF32, buf->data(), Dtype::kBF16, 4).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(stream->Convert(buf->data() + 2048, Dtype::kF32, buf->data(), Dtype::kBF16, 0).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(stream->Convert(buf->data() + 2048, Dtype::kI32, buf->data(), Dtype::kBF16, 4).code(),
            StatusCode::kInvalidArgument);  // No such conversion.
  EXPECT_EQ(stream->Convert(buf->data() + 2048, Dtype::kF4, buf->data(), Dtype::kF4, 3).code(),
            StatusCode::kInvalidArgument);  // Not whole bytes.
  EXPECT_EQ(stream->CopyToDevice(buf->data(), host->data(), ~0ull).code(),
            StatusCode::kInvalidArgument);
  // None of these reached the stream.
  EXPECT_OK(stream->Synchronize());
}

// Throttled copies: enqueueing returns before the copy is done, events
// complete in stream order, and the copy takes at least bytes / rate.
TEST(EmulatedDeviceTest, StreamWorkIsAsynchronousAndInOrder) {
  constexpr double kRate = 1e6;        // 1 MB/s.
  constexpr uint64_t kBytes = 400000;  // 0.4 s per copy.
  auto device = MakeEmulatedDevice({.copy_bytes_per_second = kRate});
  auto src = Take(device->AllocatePinned(2 * kBytes));
  Fill(src->data(), 2 * kBytes, 2);
  auto dst = Take(device->Allocate(2 * kBytes));
  auto stream = Take(device->CreateStream());
  auto start = Take(device->CreateEvent());
  auto first = Take(device->CreateEvent());
  auto second = Take(device->CreateEvent());
  const Clock::time_point enqueued = Clock::now();
  ASSERT_OK(stream->Record(*start));
  ASSERT_OK(stream->CopyToDevice(dst->data(), src->data(), kBytes));
  ASSERT_OK(stream->Record(*first));
  ASSERT_OK(stream->CopyToDevice(dst->data() + kBytes, src->data() + kBytes, kBytes));
  ASSERT_OK(stream->Record(*second));
  // The first copy is done 0.4 s after it was enqueued at the earliest, the
  // second 0.4 s after the first.
  const Clock::time_point first_done = EarliestDone(enqueued, kBytes, kRate);
  const Clock::time_point second_done = EarliestDone(enqueued, 2 * kBytes, kRate);
  ExpectNotDoneBefore(*first, first_done, "first, as enqueued");
  ExpectNotDoneBefore(*second, second_done, "second, as enqueued");

  ASSERT_OK(first->Synchronize());
  EXPECT_TRUE(first->Done());
  ExpectNotDoneBefore(*second, second_done, "second, after the first");
  ASSERT_OK(second->Synchronize());
  EXPECT_TRUE(second->Done());
  ASSERT_OK(start->Synchronize());

  const double t0 = start->CompletedAtMicros();
  const double t1 = first->CompletedAtMicros();
  const double t2 = second->CompletedAtMicros();
  EXPECT_GT(t0, 0);
  EXPECT_LT(t0, t1);
  EXPECT_LT(t1, t2);
  // Lower bounds only: the throttle makes each copy last at least 0.4 s.
  EXPECT_GE(t1 - t0, 0.95 * kBytes / kRate * 1e6);
  EXPECT_GE(t2 - t1, 0.95 * kBytes / kRate * 1e6);

  std::vector<std::byte> back(2 * kBytes);
  ASSERT_OK(stream->CopyToHost(back.data(), dst->data(), 2 * kBytes));
  ASSERT_OK(stream->Synchronize());
  EXPECT_EQ(std::memcmp(back.data(), src->data(), 2 * kBytes), 0);
}

TEST(EmulatedDeviceTest, EventsNeverRecordedAndReused) {
  auto device = MakeEmulatedDevice();
  auto event = Take(device->CreateEvent());
  EXPECT_TRUE(event->Done());
  EXPECT_OK(event->Synchronize());
  auto stream = Take(device->CreateStream());
  ASSERT_OK(stream->Record(*event));
  ASSERT_OK(event->Synchronize());
  const double t1 = event->CompletedAtMicros();
  ASSERT_OK(stream->Record(*event));
  ASSERT_OK(event->Synchronize());
  EXPECT_GE(event->CompletedAtMicros(), t1);
}

TEST(EmulatedDeviceDeathTest, HostAccessToDeviceMemoryFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto device = MakeEmulatedDevice();
  auto buf = Take(device->Allocate(4096));
  volatile std::byte* p = buf->data();
  EXPECT_DEATH({ [[maybe_unused]] std::byte b = p[100]; }, "");
  EXPECT_DEATH({ p[0] = std::byte{1}; }, "");
}

TEST(EmulatedDeviceTest, IllegalAddressIsStickyAndReportedAtSynchronize) {
  auto device = MakeEmulatedDevice();
  auto buf = Take(device->Allocate(4096));
  auto host = Take(device->AllocatePinned(8192));
  auto stream = Take(device->CreateStream());
  auto before = Take(device->CreateEvent());
  auto after = Take(device->CreateEvent());
  ASSERT_OK(stream->CopyToDevice(buf->data(), host->data(), 4096));
  ASSERT_OK(stream->Record(*before));
  // Runs 10 bytes past the end of the allocation: accepted at enqueue.
  ASSERT_OK(stream->CopyToDevice(buf->data() + 4000, host->data(), 106));
  ASSERT_OK(stream->Record(*after));
  EXPECT_OK(before->Synchronize());
  // Skipped: the stream has failed.
  Fill(host->data(), 4096, 3);
  ASSERT_OK(stream->CopyToDevice(buf->data(), host->data(), 4096));

  Status status = after->Synchronize();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("illegal address"));
  EXPECT_THAT(status.message(), HasSubstr("runs past the end"));
  status = stream->Synchronize();
  EXPECT_THAT(status.message(), HasSubstr("illegal address"));
  // Sticky: later work is not run and later syncs report the same error.
  auto later = Take(device->CreateEvent());
  ASSERT_OK(stream->Record(*later));
  EXPECT_THAT(later->Synchronize().message(), HasSubstr("illegal address"));
  EXPECT_THAT(stream->Synchronize().message(), HasSubstr("illegal address"));

  // Another stream is unaffected, and sees that the skipped copy never ran.
  auto other = Take(device->CreateStream());
  std::vector<std::byte> back(4096);
  ASSERT_OK(other->CopyToHost(back.data(), buf->data(), 4096));
  ASSERT_OK(other->Synchronize());
  EXPECT_NE(std::memcmp(back.data(), host->data(), 4096), 0);
}

TEST(EmulatedDeviceTest, HostAddressesAreNotDeviceMemory) {
  auto device = MakeEmulatedDevice();
  auto buf = Take(device->Allocate(4096));
  auto host = Take(device->AllocatePinned(4096));
  {
    // A host address as the device destination.
    auto stream = Take(device->CreateStream());
    ASSERT_OK(stream->CopyToDevice(host->data(), host->data() + 2048, 16));
    Status status = stream->Synchronize();
    EXPECT_THAT(status.message(), HasSubstr("illegal address"));
    EXPECT_THAT(status.message(), HasSubstr("is not device memory"));
  }
  {
    // A device address as the host source (would fault on a worker).
    auto stream = Take(device->CreateStream());
    ASSERT_OK(stream->CopyToDevice(buf->data(), buf->data() + 100, 16));
    Status status = stream->Synchronize();
    EXPECT_THAT(status.message(), HasSubstr("illegal address: host source"));
  }
  {
    // A device address as the host destination.
    auto stream = Take(device->CreateStream());
    ASSERT_OK(stream->CopyToHost(buf->data() + 100, buf->data(), 16));
    EXPECT_THAT(stream->Synchronize().message(), HasSubstr("illegal address: host destination"));
  }
  {
    // Between two allocations' device ranges, on device.
    auto stream = Take(device->CreateStream());
    ASSERT_OK(stream->CopyOnDevice(buf->data(), buf->data() - 4096 * 64, 16));
    EXPECT_THAT(stream->Synchronize().message(), HasSubstr("illegal address"));
  }
}

TEST(EmulatedDeviceTest, UseAfterFreeIsReportedAndFreedMemoryIsPoisoned) {
  auto device = MakeEmulatedDevice();
  auto host = Take(device->AllocatePinned(8192));
  Fill(host->data(), 8192, 4);
  auto buf = Take(device->Allocate(8192));
  auto stream = Take(device->CreateStream());
  ASSERT_OK(stream->CopyToDevice(buf->data(), host->data(), 8192));
  ASSERT_OK(stream->Synchronize());
  std::byte* stale = buf->data();
  buf.reset();

  EmulatedDeviceCounts counts = Counts(*device);
  EXPECT_EQ(counts.live_allocations, 0u);
  EXPECT_EQ(counts.quarantined_allocations, 1u);
  std::vector<std::byte> peek(8192);
  ASSERT_OK(PeekEmulatedDevice(*device, peek.data(), stale, 8192));
  EXPECT_EQ(peek, std::vector<std::byte>(8192, kEmulatedPoison));

  std::vector<std::byte> back(100);
  ASSERT_OK(stream->CopyToHost(back.data(), stale + 10, 100));
  Status status = stream->Synchronize();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("use after free"));
  EXPECT_EQ(back, std::vector<std::byte>(100));  // Nothing was copied.

  auto writer = Take(device->CreateStream());
  ASSERT_OK(writer->CopyToDevice(stale, host->data(), 16));
  EXPECT_THAT(writer->Synchronize().message(), HasSubstr("use after free"));
}

TEST(EmulatedDeviceTest, NewAllocationsDoNotAliasQuarantinedOnes) {
  auto device = MakeEmulatedDevice();
  auto freed = Take(device->Allocate(1 << 16));
  const std::byte* stale = freed->data();
  const uint64_t stale_size = freed->size();
  freed.reset();
  std::vector<std::shared_ptr<Buffer>> fresh;
  for (int i = 0; i < 32; ++i) {
    fresh.push_back(Take(device->Allocate(1 << 16)));
    const std::byte* p = fresh.back()->data();
    EXPECT_FALSE(p < stale + stale_size && stale < p + fresh.back()->size()) << i;
  }
  std::byte b{};
  EXPECT_OK(PeekEmulatedDevice(*device, &b, stale, 1));
  EXPECT_EQ(b, kEmulatedPoison);
}

TEST(EmulatedDeviceTest, QuarantineIsBounded) {
  auto device = MakeEmulatedDeviceWithQuarantine({}, 3 * 4096);
  std::vector<std::shared_ptr<Buffer>> buffers;
  std::vector<std::byte*> stale;
  for (int i = 0; i < 5; ++i) {
    buffers.push_back(Take(device->Allocate(4096)));
    stale.push_back(buffers.back()->data());
  }
  for (auto& buffer : buffers) buffer.reset();  // Freed oldest first.
  EmulatedDeviceCounts counts = Counts(*device);
  EXPECT_EQ(counts.quarantined_allocations, 3u);
  EXPECT_EQ(counts.quarantined_bytes, 3u * 4096);
  std::byte b{};
  // The two oldest were unmapped; the three newest are poisoned.
  EXPECT_FALSE(PeekEmulatedDevice(*device, &b, stale[0], 1).ok());
  EXPECT_FALSE(PeekEmulatedDevice(*device, &b, stale[1], 1).ok());
  for (int i = 2; i < 5; ++i) {
    ASSERT_OK(PeekEmulatedDevice(*device, &b, stale[i] + 4095, 1)) << i;
    EXPECT_EQ(b, kEmulatedPoison);
  }
  // Larger than the whole quarantine: unmapped at once.
  { auto big = Take(device->Allocate(4 * 4096)); }
  EXPECT_EQ(Counts(*device).quarantined_allocations, 3u);
}

TEST(EmulatedDeviceTest, AllocationBeyondMemoryIsResourceExhausted) {
  auto device = MakeEmulatedDevice({.memory_bytes = 1 << 20});
  auto a = Take(device->Allocate(768 << 10));
  EXPECT_EQ(Take(device->FreeMemory()), 256u << 10);
  auto b = device->Allocate(512 << 10);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(b.status().message(), HasSubstr("524288"));
  EXPECT_EQ(device->Allocate(2 << 20).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(device->Allocate(~0ull).status().code(), StatusCode::kResourceExhausted);
  a.reset();  // Quarantined memory does not count.
  EXPECT_EQ(Take(device->FreeMemory()), 1u << 20);
  EXPECT_EQ(Counts(*device).quarantined_allocations, 1u);
  auto c = Take(device->Allocate(1 << 20));
  EXPECT_EQ(Take(device->FreeMemory()), 0u);
  // Sizes are counted in 256-byte units.
  c.reset();
  auto d = Take(device->Allocate(1));
  EXPECT_EQ(Take(device->FreeMemory()), (1u << 20) - 256);
}

TEST(EmulatedDeviceTest, PinnedMemoryIsTrackedAndFreed) {
  auto device = MakeEmulatedDevice();
  {
    auto a = Take(device->AllocatePinned(10000));
    auto b = Take(device->AllocatePinned(0));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % 4096, 0u);
    EXPECT_NE(b->data(), nullptr);
    std::memset(a->data(), 0x5A, 10000);  // Host memory: writable.
    EmulatedDeviceCounts counts = Counts(*device);
    EXPECT_EQ(counts.pinned_allocations, 2u);
    EXPECT_EQ(counts.pinned_bytes, 10000u);
  }
  EmulatedDeviceCounts counts = Counts(*device);
  EXPECT_EQ(counts.pinned_allocations, 0u);
  EXPECT_EQ(counts.pinned_bytes, 0u);
}

uint16_t Bf16Bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<uint16_t>(bits >> 16);
}

TEST(EmulatedDeviceTest, ConvertBf16ToF32) {
  auto device = MakeEmulatedDevice();
  const std::vector<float> values = {
      1.0f,   -2.5f, 0.0f, -0.0f, 3.140625f, 65280.0f, std::numeric_limits<float>::infinity(),
      -1e-38f};
  const uint64_t n = values.size();
  auto host = Take(device->AllocatePinned(n * 2));
  for (uint64_t i = 0; i < n; ++i) {
    const uint16_t h = Bf16Bits(values[i]);
    std::memcpy(host->data() + 2 * i, &h, 2);
  }
  auto src = Take(device->Allocate(n * 2));
  auto dst = Take(device->Allocate(n * 4));
  auto stream = Take(device->CreateStream());
  ASSERT_OK(stream->CopyToDevice(src->data(), host->data(), n * 2));
  ASSERT_OK(stream->Convert(dst->data(), Dtype::kF32, src->data(), Dtype::kBF16, n));
  std::vector<uint32_t> out(n);
  ASSERT_TRUE(
      stream->CopyToHost(reinterpret_cast<std::byte*>(out.data()), dst->data(), n * 4).ok());
  ASSERT_OK(stream->Synchronize());
  for (uint64_t i = 0; i < n; ++i) {
    EXPECT_EQ(out[i], static_cast<uint32_t>(Bf16Bits(values[i])) << 16) << i;
  }
  // Past the end of the destination: an asynchronous illegal address.
  ASSERT_OK(stream->Convert(dst->data() + 4, Dtype::kF32, src->data(), Dtype::kBF16, n));
  EXPECT_THAT(stream->Synchronize().message(), HasSubstr("illegal address"));
}

TEST(EmulatedDeviceTest, DestroyingAStreamWaitsForItsWork) {
  constexpr uint64_t kBytes = 50000;
  auto device = MakeEmulatedDevice({.copy_bytes_per_second = 1e6});  // 0.05 s per copy.
  auto host = Take(device->AllocatePinned(4 * kBytes));
  Fill(host->data(), 4 * kBytes, 5);
  auto buf = Take(device->Allocate(4 * kBytes));
  auto event = Take(device->CreateEvent());
  const Clock::time_point done = EarliestDone(Clock::now(), 4 * kBytes, 1e6);
  {
    auto stream = Take(device->CreateStream());
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE(
          stream->CopyToDevice(buf->data() + i * kBytes, host->data() + i * kBytes, kBytes).ok());
    }
    ASSERT_OK(stream->Record(*event));
    ExpectNotDoneBefore(*event, done, "before the stream goes");
  }
  // The destructor waited: it could not return before the copies were done.
  EXPECT_GE(Clock::now(), done);
  EXPECT_TRUE(event->Done());
  EXPECT_OK(event->Synchronize());
  auto stream = Take(device->CreateStream());
  std::vector<std::byte> back(4 * kBytes);
  ASSERT_OK(stream->CopyToHost(back.data(), buf->data(), 4 * kBytes));
  ASSERT_OK(stream->Synchronize());
  EXPECT_EQ(std::memcmp(back.data(), host->data(), 4 * kBytes), 0);
}

TEST(EmulatedDeviceTest, ObjectsOutliveTheDevice) {
  auto device = MakeEmulatedDevice();
  auto buf = Take(device->Allocate(4096));
  auto stream = Take(device->CreateStream());
  auto event = Take(device->CreateEvent());
  auto host = Take(device->AllocatePinned(4096));
  device.reset();
  Fill(host->data(), 4096, 6);
  std::vector<std::byte> back(4096);
  ASSERT_OK(stream->CopyToDevice(buf->data(), host->data(), 4096));
  ASSERT_OK(stream->CopyToHost(back.data(), buf->data(), 4096));
  ASSERT_OK(stream->Record(*event));
  ASSERT_OK(event->Synchronize());
  EXPECT_EQ(std::memcmp(back.data(), host->data(), 4096), 0);
}

TEST(EmulatedDeviceTest, ManyStreamsConcurrently) {
  constexpr int kThreads = 8;
  constexpr uint64_t kBytes = 256 << 10;
  auto device = MakeEmulatedDevice();
  std::vector<Status> results(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      results[t] = [&]() -> Status {
        TL_ASSIGN_OR_RETURN(auto stream, device->CreateStream());
        TL_ASSIGN_OR_RETURN(auto host, device->AllocatePinned(kBytes));
        TL_ASSIGN_OR_RETURN(auto a, device->Allocate(kBytes));
        TL_ASSIGN_OR_RETURN(auto b, device->Allocate(kBytes));
        std::vector<std::byte> back(kBytes);
        for (int round = 0; round < 4; ++round) {
          Fill(host->data(), kBytes, t * 16 + round);
          TL_RETURN_IF_ERROR(stream->CopyToDevice(a->data(), host->data(), kBytes));
          TL_RETURN_IF_ERROR(stream->CopyOnDevice(b->data(), a->data(), kBytes));
          TL_RETURN_IF_ERROR(stream->CopyToHost(back.data(), b->data(), kBytes));
          TL_RETURN_IF_ERROR(stream->Synchronize());
          if (std::memcmp(back.data(), host->data(), kBytes) != 0) {
            return InternalError("thread " + std::to_string(t) + " round " + std::to_string(round) +
                                 ": bytes differ");
          }
        }
        return Status::Ok();
      }();
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_OK(results[t]);
  EmulatedDeviceCounts counts = Counts(*device);
  EXPECT_EQ(counts.live_allocations, 0u);
  EXPECT_EQ(counts.live_bytes, 0u);
  EXPECT_EQ(counts.pinned_allocations, 0u);
  EXPECT_EQ(counts.quarantined_allocations, 2u * kThreads);
}

// EmulatedDeviceOptions::prefault_bytes: allocations are carved from memory
// faulted in when the device is made (best fit), given back when freed
// (neighbours merged), and those that do not fit get fresh memory.
TEST(EmulatedDeviceTest, PrefaultedMemoryIsCarvedAndGivenBack) {
  constexpr uint64_t kMiB = 1ull << 20;
  EmulatedDeviceOptions o;
  o.memory_bytes = 64 * kMiB;
  o.prefault_bytes = 8 * kMiB;
  auto device = MakeEmulatedDeviceWithQuarantine(o, 0);  // Freed memory goes back at once.
  auto where = [&](const std::shared_ptr<Buffer>& b) {
    return Take(device->HostMapping(b->data(), b->size()));
  };
  auto a = Take(device->Allocate(3 * kMiB));
  auto b = Take(device->Allocate(3 * kMiB));
  std::byte* const base = where(a);
  EXPECT_EQ(where(b), base + 3 * kMiB) << "carved one after the other";
  std::byte* const a_at = where(a);
  a.reset();
  auto c = Take(device->Allocate(3 * kMiB));
  EXPECT_EQ(where(c), a_at) << "the freed range is taken again";
  auto d = Take(device->Allocate(6 * kMiB));  // 2 MiB left in the arena: fresh memory.
  EXPECT_TRUE(where(d) < base || where(d) >= base + 8 * kMiB);
  // The bytes are the device's, wherever its memory came from.
  auto stream = Take(device->CreateStream());
  auto host = Take(device->AllocatePinned(6 * kMiB));
  std::vector<std::byte> back(6 * kMiB);
  for (const auto& buf : {c, d}) {
    Fill(host->data(), buf->size(), 5);
    ASSERT_OK(stream->CopyToDevice(buf->data(), host->data(), buf->size()));
    ASSERT_OK(stream->CopyToHost(back.data(), buf->data(), buf->size()));
    ASSERT_OK(stream->Synchronize());
    EXPECT_EQ(std::memcmp(back.data(), host->data(), buf->size()), 0);
  }
  b.reset();
  c.reset();
  auto whole = Take(device->Allocate(8 * kMiB));
  EXPECT_EQ(where(whole), base) << "the given-back ranges merged into the whole arena";
  EXPECT_EQ(Counts(*device).live_bytes, 14 * kMiB);
}

// EmulatedDeviceOptions::copy_latency_seconds: each copy to the device takes
// at least that long, on top of its bytes at copy_bytes_per_second.
TEST(EmulatedDeviceTest, CopiesTakeTheirLatencyAndBandwidth) {
  EmulatedDeviceOptions o;
  o.copy_latency_seconds = 0.004;
  o.copy_bytes_per_second = 1e9;
  auto device = MakeEmulatedDevice(o);
  auto stream = Take(device->CreateStream());
  auto host = Take(device->AllocatePinned(1 << 20));
  auto dev = Take(device->Allocate(1 << 20));
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 10; ++i) ASSERT_OK(stream->CopyToDevice(dev->data(), host->data(), 1 << 20));
  ASSERT_OK(stream->Synchronize());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(s, 10 * (0.004 + (1 << 20) / 1e9));  // 50.5 ms at least; no upper bound.
}

// Two streams share the device's bandwidth, as a GPU's copies share its bus:
// their copies together take at least all their bytes at the rate.
TEST(EmulatedDeviceTest, StreamsShareTheBandwidth) {
  EmulatedDeviceOptions o;
  o.copy_latency_seconds = 0.001;
  o.copy_bytes_per_second = 1e8;
  auto device = MakeEmulatedDevice(o);
  auto a = Take(device->CreateStream());
  auto b = Take(device->CreateStream());
  auto host = Take(device->AllocatePinned(1 << 20));
  auto dev = Take(device->Allocate(2 << 20));
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 5; ++i) {
    ASSERT_OK(a->CopyToDevice(dev->data(), host->data(), 1 << 20));
    ASSERT_OK(b->CopyToDevice(dev->data() + (1 << 20), host->data(), 1 << 20));
  }
  ASSERT_OK(a->Synchronize());
  ASSERT_OK(b->Synchronize());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(s, 10 * (1 << 20) / 1e8);  // 105 ms at least, not each stream's 5 copies' 57 ms.
}

// The process's emulated device ("emulated:0") takes its copy model from the
// environment; values that are not numbers >= 0 are refused by name.
TEST(EmulatedDeviceTest, OptionsFromTheEnvironment) {
  const char* names[] = {"TENSORLIFT_EMULATED_H2D_GBPS", "TENSORLIFT_EMULATED_COPY_LATENCY_US",
                         "TENSORLIFT_EMULATED_PREFAULT_GB"};
  for (const char* n : names) ::unsetenv(n);
  EmulatedDeviceOptions o = Take(EmulatedDeviceOptionsFromEnvironment());
  EXPECT_DOUBLE_EQ(o.copy_bytes_per_second, 54.8e9);
  EXPECT_EQ(o.copy_latency_seconds, 0);
  EXPECT_EQ(o.prefault_bytes, 0u);
  ::setenv(names[0], "12.5", 1);
  ::setenv(names[1], "8", 1);
  ::setenv(names[2], "0.5", 1);
  o = Take(EmulatedDeviceOptionsFromEnvironment());
  EXPECT_DOUBLE_EQ(o.copy_bytes_per_second, 12.5e9);
  EXPECT_DOUBLE_EQ(o.copy_latency_seconds, 8e-6);
  EXPECT_EQ(o.prefault_bytes, 500000000u);
  for (const char* bad : {"fast", "-1", "1e999", "3 GB", "nan"}) {
    ::setenv(names[1], bad, 1);
    Result<EmulatedDeviceOptions> r = EmulatedDeviceOptionsFromEnvironment();
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr(std::string(names[1]) + "=" + bad));
  }
  for (const char* n : names) ::unsetenv(n);
  ::unsetenv("TENSORLIFT_EMULATED_DISCARD_COPIES");
  EXPECT_FALSE(Take(EmulatedDeviceOptionsFromEnvironment()).discard_copies);
  ::setenv("TENSORLIFT_EMULATED_DISCARD_COPIES", "1", 1);
  EXPECT_TRUE(Take(EmulatedDeviceOptionsFromEnvironment()).discard_copies);
  ::setenv("TENSORLIFT_EMULATED_DISCARD_COPIES", "0", 1);
  EXPECT_FALSE(Take(EmulatedDeviceOptionsFromEnvironment()).discard_copies);
  for (const char* bad : {"yes", "2", "true"}) {
    ::setenv("TENSORLIFT_EMULATED_DISCARD_COPIES", bad, 1);
    Result<EmulatedDeviceOptions> r = EmulatedDeviceOptionsFromEnvironment();
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(),
                HasSubstr("TENSORLIFT_EMULATED_DISCARD_COPIES=" + std::string(bad)));
  }
  ::unsetenv("TENSORLIFT_EMULATED_DISCARD_COPIES");
}

// discard_copies (a benchmark's diagnostic): a host-to-device copy takes the
// copy model's time and checks its ranges, but the device memory keeps what
// it had; copies on the device and back to the host still move bytes.
// With copies discarded, freed memory is quarantined (a use after free is
// still reported) but not poisoned: poisoning would fault in every page of
// it, and a benchmark's peak RSS would count device memory freed at exit.
TEST(EmulatedDeviceTest, DiscardedCopiesLeaveFreedMemoryUntouched) {
  EmulatedDeviceOptions o;
  o.discard_copies = true;
  auto device = MakeEmulatedDevice(o);
  auto buf = Take(device->Allocate(8192));
  std::byte* stale = buf->data();
  buf.reset();
  EXPECT_EQ(Counts(*device).quarantined_allocations, 1u);
  std::vector<std::byte> peek(8192, std::byte{1});
  ASSERT_OK(PeekEmulatedDevice(*device, peek.data(), stale, 8192));
  EXPECT_EQ(peek, std::vector<std::byte>(8192)) << "never written, never poisoned";
  auto stream = Take(device->CreateStream());
  std::vector<std::byte> back(100);
  ASSERT_OK(stream->CopyToHost(back.data(), stale, 100));
  Status status = stream->Synchronize();
  EXPECT_THAT(status.message(), HasSubstr("use after free"));
}

TEST(EmulatedDeviceTest, DiscardedCopiesTakeTheirTimeAndMoveNothing) {
  EmulatedDeviceOptions o;
  o.copy_bytes_per_second = 1e8;
  o.discard_copies = true;
  auto device = MakeEmulatedDevice(o);
  auto buf = Take(device->Allocate(1 << 20));
  auto stream = Take(device->CreateStream());
  auto pinned = Take(device->AllocatePinned(1 << 20));
  std::memset(pinned->data(), 0x5a, 1 << 20);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_OK(stream->CopyToDevice(buf->data(), pinned->data(), 1 << 20));
  ASSERT_OK(stream->Synchronize());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(s, (1 << 20) / 1e8) << "a discarded copy still takes its bytes' time";
  std::vector<std::byte> back(1 << 20, std::byte{0xff});
  ASSERT_OK(stream->CopyToHost(back.data(), buf->data(), back.size()));
  ASSERT_OK(stream->Synchronize());
  EXPECT_EQ(std::count(back.begin(), back.end(), std::byte{0x5a}), 0) << "the bytes were moved";
  // Its ranges are still checked.
  Status past = stream->CopyToDevice(buf->data() + 4096, pinned->data(), 1 << 20);
  if (past.ok()) past = stream->Synchronize();
  EXPECT_FALSE(past.ok()) << "a copy past the buffer's end";
}

}  // namespace
}  // namespace tensorlift
