// The CUDA device backend, GPUDirect Storage (cuFile) loading, and
// Capabilities().
//
// Tests that need a GPU skip (with OpenCudaDevice's reason) on machines
// without one; the others run everywhere and check that every missing piece
// is reported with a reason that names it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/vfs.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../common/assert_ok.h"
#include "../common/scratch_dir.h"
#include "../sparse/bitmask_test_util.h"
#include "device/device.h"
#include "io/cufile.h"
#include "io/direct_reader.h"
#include "io/read_op.h"
#include "kernels/convert.h"
#include "tensorlift/bitmask.h"
#include "tensorlift/capabilities.h"
#include "tensorlift/convert.h"

// Set by tests/CMakeLists.txt: whether the build found nvcc, and the path of
// a libcufile.so.0 found next to cufile.h at build time ("" if none).
#ifndef TL_TEST_EXPECT_CUDA
#error "TL_TEST_EXPECT_CUDA must be defined by the build"
#endif
#ifndef TL_TEST_CUFILE_LIB
#define TL_TEST_CUFILE_LIB ""
#endif

// Under AddressSanitizer, the CUDA driver needs the shadow gap unprotected
// (ASan reserves it PROT_NONE, where CUDA maps its unified address space);
// otherwise cuInit fails. $ASAN_OPTIONS still overrides. Unused without ASan.
extern "C" const char* __asan_default_options() { return "protect_shadow_gap=0"; }

namespace tensorlift {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

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

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = getenv(name)) old_ = old;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_.empty()) {
      unsetenv(name_);
    } else {
      setenv(name_, old_.c_str(), 1);
    }
  }

 private:
  const char* name_;
  std::string old_;
};

// ---------------------------------------------------------------------------
// Tests that need a GPU.

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto device = OpenCudaDevice(0);
    if (!device.ok()) GTEST_SKIP() << "no CUDA device: " << device.status().ToString();
    device_ = *device;
    stream_ = Take(device_->CreateStream());
  }

  std::shared_ptr<Device> device_;
  std::unique_ptr<DeviceStream> stream_;
};

TEST_F(CudaDeviceTest, Identity) {
  EXPECT_EQ(device_->kind(), DeviceType::kCuda);
  EXPECT_EQ(device_->name(), "cuda:0");
  EXPECT_EQ(device_->ordinal(), 0);
  EXPECT_EQ(device_->dlpack_device_type(), 2);
  EXPECT_GT(Take(device_->FreeMemory()), 0u);
}

TEST_F(CudaDeviceTest, RoundTripHostDeviceHost) {
  constexpr uint64_t kBytes = (64 << 20) + 123;
  auto src = Take(device_->AllocatePinned(kBytes));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(src->data()) % 4096, 0u);
  Fill(src->data(), kBytes, 1);
  auto a = Take(device_->Allocate(kBytes));
  auto b = Take(device_->Allocate(kBytes + 7));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % 256, 0u);
  auto out = Take(device_->AllocatePinned(kBytes));
  std::memset(out->data(), 0, kBytes);

  ASSERT_OK(stream_->CopyToDevice(a->data(), src->data(), kBytes));
  // Device to device at an odd offset, then back.
  ASSERT_OK(stream_->CopyOnDevice(b->data() + 7, a->data(), kBytes));
  ASSERT_OK(stream_->CopyToHost(out->data(), b->data() + 7, kBytes));
  ASSERT_OK(stream_->Synchronize());
  EXPECT_EQ(std::memcmp(out->data(), src->data(), kBytes), 0);

  // Pageable host memory works too (synchronously staged by CUDA).
  std::vector<std::byte> pageable(4099);
  Fill(pageable.data(), pageable.size(), 9);
  std::vector<std::byte> back(pageable.size());
  ASSERT_OK(stream_->CopyToDevice(a->data(), pageable.data(), pageable.size()));
  ASSERT_OK(stream_->CopyToHost(back.data(), a->data(), back.size()));
  ASSERT_OK(stream_->Synchronize());
  EXPECT_EQ(back, pageable);
}

TEST_F(CudaDeviceTest, ArgumentsAreCheckedAtOnce) {
  auto a = Take(device_->Allocate(4096));
  auto host = Take(device_->AllocatePinned(4096));
  EXPECT_EQ(stream_->CopyToDevice(a->data(), host->data(), 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(stream_->CopyToDevice(nullptr, host->data(), 16).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(stream_->CopyToHost(host->data(), nullptr, 16).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(stream_->CopyOnDevice(a->data() + 8, a->data(), 16).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(stream_->Convert(a->data() + 2048, Dtype::kI32, a->data(), Dtype::kF32, 16).code(),
            StatusCode::kInvalidArgument);  // No such conversion.
  EXPECT_EQ(stream_->Convert(a->data() + 8, Dtype::kF32, a->data(), Dtype::kBF16, 16).code(),
            StatusCode::kInvalidArgument);  // Overlap.
  EXPECT_EQ(stream_->Convert(a->data() + 2048, Dtype::kF32, a->data(), Dtype::kBF16, 0).code(),
            StatusCode::kInvalidArgument);
  auto emulated = MakeEmulatedDevice({.memory_bytes = 1 << 20});
  auto foreign = Take(emulated->CreateEvent());
  EXPECT_EQ(stream_->Record(*foreign).code(), StatusCode::kInvalidArgument);
  // The stream still works.
  ASSERT_OK(stream_->CopyToDevice(a->data(), host->data(), 4096));
  EXPECT_OK(stream_->Synchronize());
}

TEST_F(CudaDeviceTest, TooMuchMemoryIsResourceExhausted) {
  auto huge = device_->Allocate(uint64_t{1} << 50);  // 1 PiB.
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted) << huge.status().ToString();
  EXPECT_THAT(huge.status().message(), HasSubstr("cudaMalloc"));
  // The device is still usable afterwards.
  EXPECT_OK(device_->Allocate(4096));
}

// Converts `src` (count elements of `from`) on the GPU and on the host, and
// compares the bits.
void ExpectSameAsHost(Device& device, DeviceStream& stream, const std::vector<std::byte>& src,
                      Dtype from, Dtype to, uint64_t count) {
  SCOPED_TRACE(std::string(DtypeName(from)) + " -> " + std::string(DtypeName(to)));
  const uint64_t src_bytes = src.size();
  const uint64_t dst_bytes = count * DtypeBits(to) / 8;
  auto d_src = Take(device.Allocate(src_bytes));
  auto d_dst = Take(device.Allocate(dst_bytes));
  std::vector<std::byte> expected(dst_bytes);
  ASSERT_OK(ConvertOnHost(expected.data(), to, src.data(), from, count));
  std::vector<std::byte> got(dst_bytes, std::byte{0x5A});
  ASSERT_OK(stream.CopyToDevice(d_src->data(), src.data(), src_bytes));
  ASSERT_OK(stream.Convert(d_dst->data(), to, d_src->data(), from, count));
  ASSERT_OK(stream.CopyToHost(got.data(), d_dst->data(), dst_bytes));
  ASSERT_OK(stream.Synchronize());
  uint64_t mismatches = 0;
  const uint64_t width = DtypeBits(to) / 8;
  for (uint64_t i = 0; i < count && mismatches < 10; ++i) {
    if (std::memcmp(got.data() + i * width, expected.data() + i * width, width) != 0) {
      ++mismatches;
      ADD_FAILURE() << "element " << i << " differs";
    }
  }
  EXPECT_EQ(got, expected);
}

TEST_F(CudaDeviceTest, ConvertMatchesHostOnEveryBf16AndF16Pattern) {
  std::vector<std::byte> all16(65536 * 2);
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t v = static_cast<uint16_t>(i);
    std::memcpy(all16.data() + 2 * i, &v, 2);
  }
  for (Dtype from : {Dtype::kBF16, Dtype::kF16}) {
    for (Dtype to : {Dtype::kF32, Dtype::kF16, Dtype::kBF16}) {
      ExpectSameAsHost(*device_, *stream_, all16, from, to, 65536);
    }
  }
}

TEST_F(CudaDeviceTest, ConvertMatchesHostOnFp8AndF32) {
  std::vector<std::byte> all8(256);
  for (int i = 0; i < 256; ++i) all8[i] = static_cast<std::byte>(i);
  for (Dtype from : {Dtype::kF8_E4M3, Dtype::kF8_E5M2}) {
    for (Dtype to : {Dtype::kF32, Dtype::kF16, Dtype::kBF16}) {
      ExpectSameAsHost(*device_, *stream_, all8, from, to, 256);
    }
  }
  // f32: random bits plus the edges of every rounding; more elements than
  // one grid covers (kernels.cu caps it at 8192 x 256), so the grid-stride
  // loop runs.
  constexpr uint64_t kCount = 8192 * 256 * 2 + 77;
  std::vector<std::byte> f32(kCount * 4);
  std::mt19937 rng(42);
  for (uint64_t i = 0; i < kCount; ++i) {
    uint32_t u = static_cast<uint32_t>(rng());
    if (i % 7 == 0) u = (u & 0xFFFF0000u) | 0x8000u;   // bf16 ties.
    if (i % 11 == 0) u = (u & 0xFFFFE000u) | 0x1000u;  // f16 ties.
    std::memcpy(f32.data() + 4 * i, &u, 4);
  }
  for (Dtype to : {Dtype::kBF16, Dtype::kF16, Dtype::kF32}) {
    ExpectSameAsHost(*device_, *stream_, f32, Dtype::kF32, to, kCount);
  }
}

TEST_F(CudaDeviceTest, ConvertIdentityOfSubByteDtypeCopiesBytes) {
  // 1001 F4 elements do not fill whole bytes; 1000 do (500 bytes).
  std::vector<std::byte> packed(500);
  Fill(packed.data(), packed.size(), 3);
  ExpectSameAsHost(*device_, *stream_, packed, Dtype::kF4, Dtype::kF4, 1000);
}

// Decodes `e` on the GPU, its values and output at the given offsets into
// their allocations (which choose the kernel's access mode: 16-byte stores,
// element or byte accesses), and compares with the CPU's scalar decoder.
void ExpectDecodeSameAsCpu(Device& device, DeviceStream& stream, const sparse::test::Encoded& e,
                           uint64_t values_at, uint64_t out_at) {
  const sparse::BitmaskShape& s = e.shape;
  SCOPED_TRACE(testing::Message() << s.rows << " x " << s.cols << " x " << s.elem_bytes
                                  << " bytes, nnz " << e.nnz() << ", values at +" << values_at
                                  << ", output at +" << out_at);
  std::vector<std::byte> expected(s.dense_bytes());
  sparse::DecodeRows(sparse::DecodeIsa::kScalar, e.values.data(), e.bitmask.data(),
                     e.row_offsets.data(), s, 0, s.rows, expected.data());
  auto d_offsets = Take(device.Allocate(e.row_offsets.size() * sizeof(int64_t)));
  auto d_mask = Take(device.Allocate(e.bitmask.size()));
  auto d_values = Take(device.Allocate(values_at + e.values.size()));
  auto d_out = Take(device.Allocate(out_at + s.dense_bytes()));
  ASSERT_TRUE(stream
                  .CopyToDevice(d_offsets->data(),
                                reinterpret_cast<const std::byte*>(e.row_offsets.data()),
                                d_offsets->size())
                  .ok());
  ASSERT_TRUE(stream
                  .CopyToDevice(d_mask->data(),
                                reinterpret_cast<const std::byte*>(e.bitmask.data()),
                                e.bitmask.size())
                  .ok());
  if (!e.values.empty()) {
    ASSERT_TRUE(
        stream.CopyToDevice(d_values->data() + values_at, e.values.data(), e.values.size()).ok());
  }
  ASSERT_TRUE(stream
                  .DecodeBitmask(d_out->data() + out_at, d_values->data() + values_at, e.nnz(),
                                 reinterpret_cast<const uint8_t*>(d_mask->data()),
                                 reinterpret_cast<const int64_t*>(d_offsets->data()), s.rows,
                                 s.cols, s.elem_bytes)
                  .ok());
  std::vector<std::byte> got(s.dense_bytes(), std::byte{0x5A});
  ASSERT_OK(stream.CopyToHost(got.data(), d_out->data() + out_at, got.size()));
  ASSERT_OK(stream.Synchronize());
  EXPECT_TRUE(got == expected);
}

TEST_F(CudaDeviceTest, DecodeBitmaskMatchesTheCpu) {
  std::mt19937_64 rng(7);
  for (uint32_t w : {1u, 2u, 4u, 8u}) {
    for (uint64_t cols : {1, 8, 33, 1000, 1024, 1025, 4096, 4099}) {
      for (double density : {0.0, 1.0, 0.5, -1.0}) {
        const sparse::BitmaskShape s{.rows = 37, .cols = cols, .elem_bytes = w};
        const auto e = sparse::test::EncodeDense(sparse::test::RandomDense(s, density, rng), s);
        ExpectDecodeSameAsCpu(*device_, *stream_, e, 0, 0);  // Aligned.
        ExpectDecodeSameAsCpu(*device_, *stream_, e, 0, w);  // Output only W-aligned.
        ExpectDecodeSameAsCpu(*device_, *stream_, e, 1, 3);  // Byte accesses.
      }
    }
  }
  // More rows than the grid has warps (8192 blocks x 8): the grid-stride
  // loop runs; and a 4096 x 4096 bf16 matrix at 50 %.
  for (const sparse::BitmaskShape& s :
       {sparse::BitmaskShape{.rows = 70001, .cols = 40, .elem_bytes = 2},
        sparse::BitmaskShape{.rows = 4096, .cols = 4096, .elem_bytes = 2}}) {
    const auto e = sparse::test::EncodeDense(sparse::test::RandomDense(s, 0.5, rng), s);
    ExpectDecodeSameAsCpu(*device_, *stream_, e, 0, 0);
  }
}

TEST_F(CudaDeviceTest, DecodeBitmaskArgumentsAreCheckedAtOnce) {
  auto a = Take(device_->Allocate(1 << 16));
  std::byte* out = a->data();
  const auto* offsets = reinterpret_cast<const int64_t*>(a->data() + 4096);
  const auto* mask = reinterpret_cast<const uint8_t*>(a->data() + 8192);
  const std::byte* values = a->data() + 12288;
  EXPECT_EQ(stream_->DecodeBitmask(out, values, 4, mask, offsets, 8, 16, 3).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(stream_->DecodeBitmask(out, values, 4, mask, offsets + 0, 0, 16, 2).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(stream_->DecodeBitmask(out, out + 2, 4, mask, offsets, 8, 16, 2).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(stream_
                ->DecodeBitmask(out, values, 4, mask,
                                reinterpret_cast<const int64_t*>(a->data() + 4100), 8, 16, 2)
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_OK(stream_->Synchronize());
}

TEST_F(CudaDeviceTest, EventsCompleteInStreamOrder) {
  constexpr uint64_t kBytes = 256 << 20;
  auto host = Take(device_->AllocatePinned(kBytes));
  std::memset(host->data(), 1, kBytes);
  auto dev = Take(device_->Allocate(kBytes));
  auto never = Take(device_->CreateEvent());
  EXPECT_TRUE(never->Done());
  EXPECT_OK(never->Synchronize());

  auto first = Take(device_->CreateEvent());
  auto second = Take(device_->CreateEvent());
  ASSERT_OK(stream_->CopyToDevice(dev->data(), host->data(), 4096));
  ASSERT_OK(stream_->Record(*first));
  ASSERT_OK(stream_->CopyToDevice(dev->data(), host->data(), kBytes));
  ASSERT_OK(stream_->Record(*second));
  ASSERT_OK(second->Synchronize());
  EXPECT_TRUE(first->Done());
  EXPECT_TRUE(second->Done());
  ASSERT_OK(first->Synchronize());
  const double t1 = first->CompletedAtMicros();
  const double t2 = second->CompletedAtMicros();
  EXPECT_FALSE(std::isnan(t1));
  EXPECT_GE(t1, 0);
  // 256 MiB over PCIe takes well over 100 us.
  EXPECT_GT(t2 - t1, 100) << t1 << " " << t2;

  // Events on two streams share one clock.
  auto other = Take(device_->CreateStream());
  auto third = Take(device_->CreateEvent());
  ASSERT_OK(other->Record(*third));
  ASSERT_OK(third->Synchronize());
  EXPECT_GE(third->CompletedAtMicros(), t2);

  // Reusable: Record() moves the event.
  ASSERT_OK(stream_->CopyToDevice(dev->data(), host->data(), 4096));
  ASSERT_OK(stream_->Record(*first));
  ASSERT_OK(first->Synchronize());
  EXPECT_GE(first->CompletedAtMicros(), t2);
}

TEST_F(CudaDeviceTest, BadOrdinalIsInvalidArgument) {
  EXPECT_EQ(OpenCudaDevice(-1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenCudaDevice(1 << 20).status().code(), StatusCode::kInvalidArgument);
}

// OpenDevice gives the one Device of a GPU while a holder keeps it: a seed
// matches its tensors to its registered regions by device (remote/peer_server.cc),
// which failed on a GPU ("tensor ... is in no registered region") while each
// call made a Device of its own.
TEST_F(CudaDeviceTest, OpenDeviceGivesTheSameDeviceWhileOneIsHeld) {
  auto a = OpenDevice(DeviceType::kCuda, 0);
  auto b = OpenDevice(DeviceType::kCuda, 0);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(a->get(), b->get());
  EXPECT_EQ(OpenDevice(DeviceType::kCuda, 1 << 20).status().code(), StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------
// Tests that run everywhere.

// Without the nvidia-fs module, cuFile would run in its compatibility mode,
// slower than pinned staging (it made the default GPU load 1.3x slower cold
// and 1.8x warm on an H200): the loader does not take it for GDS.
TEST(CuFileReaderTest, NotUsedWithoutTheNvidiaFsModule) {
  auto reader = OpenCuFileReader(1, "/nonexistent/proc/driver/nvidia-fs");
  ASSERT_FALSE(reader.ok());
  if (!CuFileBuiltIn()) {
    EXPECT_EQ(reader.status().code(), StatusCode::kUnimplemented);
    return;
  }
  EXPECT_EQ(reader.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(reader.status().message(),
              ::testing::HasSubstr("nvidia-fs kernel module is not loaded"));
}

TEST(CudaBackendTest, BuiltWhenNvccWasFound) { EXPECT_EQ(CudaBuiltIn(), TL_TEST_EXPECT_CUDA != 0); }

TEST(CudaBackendTest, OpenSaysWhyThereIsNoDevice) {
  auto device = OpenCudaDevice(0);
  if (device.ok()) GTEST_SKIP() << "this machine has a GPU";
  if (!CudaBuiltIn()) {
    EXPECT_EQ(device.status().code(), StatusCode::kUnimplemented);
    EXPECT_THAT(device.status().message(), HasSubstr("built without CUDA"));
    return;
  }
  EXPECT_EQ(device.status().code(), StatusCode::kUnavailable) << device.status().ToString();
  // The CUDA call and its message, e.g. "cudaGetDeviceCount: no CUDA-capable
  // device is detected (cudaErrorNoDevice)".
  EXPECT_THAT(device.status().message(), HasSubstr("cudaGetDeviceCount: "));
  EXPECT_THAT(device.status().message(), HasSubstr("(cudaError"));
  // Asking again gives the same answer, without crashing.
  EXPECT_EQ(OpenCudaDevice(0).status().code(), StatusCode::kUnavailable);
}

TEST(CuFileTest, OpenFailsHereWithTheMissingPiece) {
  auto driver = CuFileDriver::Open();
  if (driver.ok()) GTEST_SKIP() << "cuFile's driver opens on this machine";
  const std::string message = driver.status().message();
  if (!CuFileBuiltIn()) {
    EXPECT_EQ(driver.status().code(), StatusCode::kUnimplemented);
    EXPECT_THAT(message, HasSubstr("built without GPUDirect Storage"));
    return;
  }
  EXPECT_EQ(driver.status().code(), StatusCode::kUnavailable) << message;
  // Either the library is missing (named, with dlerror's message) or the
  // driver refused to open (cuFile's error code).
  EXPECT_THAT(message,
              AnyOf(HasSubstr("cuFile library not found: dlopen("), HasSubstr("cuFileDriverOpen")));
  if (!LoadCuFileLibrary().ok()) {
    EXPECT_THAT(message, HasSubstr("libcufile.so"));
  }
}

TEST(CuFileTest, MissingLibraryIsNamed) {
  if (!CuFileBuiltIn()) GTEST_SKIP() << "built without GPUDirect Storage";
  if (LoadCuFileLibrary().ok())
    GTEST_SKIP() << "a cuFile library is already loaded in this process";
  ScopedEnv env("TENSORLIFT_CUFILE_LIB", "/nonexistent/libcufile.so.0");
  auto library = LoadCuFileLibrary();
  ASSERT_FALSE(library.ok());
  EXPECT_EQ(library.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(library.status().message(),
              HasSubstr("cuFile library not found: dlopen(/nonexistent/libcufile.so.0)"));
  EXPECT_THAT(library.status().message(), HasSubstr("No such file"));
  EXPECT_EQ(CuFileDriver::Open().status().code(), StatusCode::kUnavailable);
}

TEST(CuFileTest, MissingSymbolIsNamed) {
  if (!CuFileBuiltIn()) GTEST_SKIP() << "built without GPUDirect Storage";
  if (LoadCuFileLibrary().ok())
    GTEST_SKIP() << "a cuFile library is already loaded in this process";
  ScopedEnv env("TENSORLIFT_CUFILE_LIB", "libc.so.6");  // Loads, but is not cuFile.
  auto library = LoadCuFileLibrary();
  ASSERT_FALSE(library.ok());
  EXPECT_EQ(library.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(library.status().message(),
              HasSubstr("libc.so.6: cuFile library lacks symbol cuFileDriverOpen"));
}

// With NVIDIA's real libcufile.so.0 (from the venv's wheel, where the build
// found cufile.h): the library loads; on a machine without nvidia-fs and a
// GPU, the driver does not open, and says why.
TEST(CuFileTest, RealLibraryLoadsAndTheDriverSaysWhy) {
  if (!CuFileBuiltIn()) GTEST_SKIP() << "built without GPUDirect Storage";
  const std::string lib = TL_TEST_CUFILE_LIB;
  if (lib.empty()) GTEST_SKIP() << "no libcufile.so.0 was found next to cufile.h at build time";
  ScopedEnv env("TENSORLIFT_CUFILE_LIB", lib);
  auto library = LoadCuFileLibrary();
  ASSERT_OK(library);
  EXPECT_THAT(library->path, HasSubstr("libcufile.so"));
  EXPECT_GT(library->version, 0);
  auto driver = CuFileDriver::Open();
  if (driver.ok()) {
    // A GDS machine (or compatibility mode): registration of a bad fd fails cleanly.
    EXPECT_FALSE((*driver)->Register(-1).ok());
    return;
  }
  EXPECT_EQ(driver.status().code(), StatusCode::kUnavailable) << driver.status().ToString();
  struct stat st {};
  if (::stat("/proc/modules", &st) != 0) {
    // cuFile would hang here: it is not called.
    EXPECT_THAT(driver.status().message(),
                HasSubstr("cuFileDriverOpen not called: open(/proc/modules): "));
  } else {
    EXPECT_THAT(driver.status().message(), HasSubstr("cuFileDriverOpen: "));
    EXPECT_THAT(driver.status().message(), HasSubstr("(cuFile error 50"));
  }
}

TEST(CapabilitiesTest, ConsistentWithTheBuildAndTheMachine) {
  const CapabilityReport r = Capabilities();
  EXPECT_FALSE(r.version.empty());

  EXPECT_EQ(r.cuda.built, CudaBuiltIn());
  EXPECT_EQ(r.cuda.built, TL_TEST_EXPECT_CUDA != 0);
  if (r.cuda.built) {
    EXPECT_TRUE(r.cuda.not_built_reason.empty());
    EXPECT_GE(r.cuda.runtime_version, 12000) << r.cuda.runtime_reason;
    if (r.cuda.driver_version == 0) {
      EXPECT_FALSE(r.cuda.driver_reason.empty());
    }
  } else {
    EXPECT_THAT(r.cuda.not_built_reason, HasSubstr("built without CUDA"));
    EXPECT_FALSE(r.cuda.gpus_reason.empty());
  }
  const bool have_gpu = OpenCudaDevice(0).ok();
  EXPECT_EQ(!r.cuda.gpus.empty(), have_gpu);
  if (r.cuda.gpus.empty()) {
    // e.g. "cudaGetDeviceCount: no CUDA-capable device is detected (cudaErrorNoDevice)".
    EXPECT_FALSE(r.cuda.gpus_reason.empty());
    if (r.cuda.built) {
      EXPECT_THAT(r.cuda.gpus_reason, HasSubstr("cudaGetDeviceCount"));
    }
  }
  for (const GpuInfo& gpu : r.cuda.gpus) {
    EXPECT_FALSE(gpu.name.empty());
    EXPECT_GT(gpu.memory_bytes, 0u);
    EXPECT_GE(gpu.compute_major, 7);
    EXPECT_FALSE(gpu.pci_bus_id.empty());
  }

  EXPECT_EQ(r.io_uring.built, UringBuiltIn());
  EXPECT_EQ(r.io_uring.usable, MakeUringEngine(1, {}).ok());
  if (!r.io_uring.usable) {
    EXPECT_FALSE(r.io_uring.reason.empty());
  }

  const GdsCapabilities& g = r.gds;
  EXPECT_EQ(g.built, CuFileBuiltIn());
  if (!g.built) {
    EXPECT_THAT(g.not_built_reason, HasSubstr("built without GPUDirect Storage"));
  }
  struct stat st {};
  EXPECT_EQ(g.nvidia_fs, ::stat("/proc/driver/nvidia-fs", &st) == 0);
  if (!g.nvidia_fs) {
    EXPECT_THAT(g.nvidia_fs_reason, HasSubstr("nvidia-fs kernel module"));
  }
  if (!g.library_loaded) {
    EXPECT_FALSE(g.library_reason.empty());
  }
  if (g.library_loaded) {
    EXPECT_FALSE(g.library.empty());
  }
  if (!g.driver_open) {
    EXPECT_FALSE(g.driver_reason.empty());
  }
  EXPECT_EQ(g.ready, g.library_loaded && g.nvidia_fs && g.driver_open);
  if (!have_gpu) {
    EXPECT_FALSE(g.ready);
  }
  EXPECT_TRUE(g.path.empty());
}

TEST(CapabilitiesTest, FilesystemOfAPath) {
  test::ScratchDir dir("tl_caps");
  const CapabilityReport r = Capabilities(dir.path());
  EXPECT_EQ(r.gds.path, dir.path());
  EXPECT_FALSE(r.gds.filesystem.empty());
  EXPECT_FALSE(r.gds.filesystem_reason.empty());
  struct statfs fs {};
  ASSERT_EQ(statfs(dir.path().c_str(), &fs), 0);
  if (fs.f_type == 0xEF53) {
    EXPECT_EQ(r.gds.filesystem, "ext4");
  }
  if (fs.f_type == 0x58465342) {
    EXPECT_EQ(r.gds.filesystem, "xfs");
  }
  if (fs.f_type == 0x01021994) {
    EXPECT_EQ(r.gds.filesystem, "tmpfs");
  }
  if (fs.f_type == 0xEF53 || fs.f_type == 0x58465342) {
    EXPECT_TRUE(r.gds.filesystem_supported);
  }
  if (!r.gds.filesystem_supported) {
    EXPECT_FALSE(r.gds.ready);
  }

  // /dev/shm is tmpfs: never GDS.
  if (statfs("/dev/shm", &fs) == 0 && fs.f_type == 0x01021994) {
    const CapabilityReport shm = Capabilities("/dev/shm");
    EXPECT_EQ(shm.gds.filesystem, "tmpfs");
    EXPECT_FALSE(shm.gds.filesystem_supported);
    EXPECT_THAT(shm.gds.filesystem_reason, HasSubstr("not supported"));
    EXPECT_FALSE(shm.gds.ready);
  }

  const CapabilityReport missing = Capabilities("/nonexistent/weights");
  EXPECT_FALSE(missing.gds.filesystem_supported);
  EXPECT_THAT(missing.gds.filesystem_reason, HasSubstr("statfs(/nonexistent/weights)"));
}

}  // namespace
}  // namespace tensorlift
