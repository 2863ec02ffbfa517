// Built instead of cuda/ when nvcc is not found (or TENSORLIFT_WITH_CUDA=OFF).
#include "device/cuda_info.h"
#include "device/device.h"

namespace tensorlift {

bool CudaBuiltIn() { return false; }

Result<std::shared_ptr<Device>> OpenCudaDevice(int) {
  return UnimplementedError("built without CUDA (" TENSORLIFT_NO_CUDA_REASON ")");
}

CudaCapabilities QueryCudaCapabilities() {
  CudaCapabilities cuda;
  cuda.not_built_reason = "built without CUDA (" TENSORLIFT_NO_CUDA_REASON ")";
  cuda.runtime_reason = cuda.not_built_reason;
  cuda.driver_reason = cuda.not_built_reason;
  cuda.gpus_reason = cuda.not_built_reason;
  return cuda;
}

}  // namespace tensorlift
