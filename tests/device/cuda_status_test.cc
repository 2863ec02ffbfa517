// CudaStatus: the one mapping of CUDA runtime errors to Status codes. Built
// into cuda_device_test only with the CUDA backend (it needs the runtime's
// types); runs without a GPU.
#include "device/cuda/cuda_status.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "../common/assert_ok.h"

namespace tensorlift {
namespace {

using ::testing::HasSubstr;

TEST(CudaStatusTest, SuccessIsOk) { EXPECT_OK(CudaStatus(cudaSuccess, "cudaMalloc")); }

TEST(CudaStatusTest, NoGpuOrDriverIsUnavailable) {
  for (cudaError_t err : {cudaErrorNoDevice, cudaErrorInsufficientDriver, cudaErrorStubLibrary,
                          cudaErrorDevicesUnavailable, cudaErrorSystemDriverMismatch,
                          cudaErrorNoKernelImageForDevice}) {
    const Status s = CudaStatus(err, "cudaGetDeviceCount");
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr("cudaGetDeviceCount: "));
    EXPECT_THAT(s.message(), HasSubstr(cudaGetErrorString(err)));
    EXPECT_THAT(s.message(), HasSubstr(cudaGetErrorName(err)));
  }
  EXPECT_EQ(CudaStatus(cudaErrorNoDevice, "x").message(),
            "x: no CUDA-capable device is detected (cudaErrorNoDevice)");
}

TEST(CudaStatusTest, OutOfMemoryIsResourceExhausted) {
  const Status s = CudaStatus(cudaErrorMemoryAllocation, "cudaMalloc of 4096 bytes");
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(), "cudaMalloc of 4096 bytes: out of memory (cudaErrorMemoryAllocation)");
}

TEST(CudaStatusTest, EverythingElseIsInternal) {
  for (cudaError_t err : {cudaErrorInvalidValue, cudaErrorIllegalAddress, cudaErrorLaunchFailure,
                          cudaErrorInvalidResourceHandle}) {
    const Status s = CudaStatus(err, "cudaMemcpyAsync");
    EXPECT_EQ(s.code(), StatusCode::kInternal) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr(cudaGetErrorString(err)));
  }
}

}  // namespace
}  // namespace tensorlift
