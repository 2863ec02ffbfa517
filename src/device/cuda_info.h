// The CUDA part of Capabilities() (tensorlift/capabilities.h), answered by
// the backend that was built: cuda/cuda_device.cc (the CUDA runtime's view)
// or cuda_none.cc (built without CUDA). No CUDA header here.
#ifndef TENSORLIFT_DEVICE_CUDA_INFO_H_
#define TENSORLIFT_DEVICE_CUDA_INFO_H_

#include "tensorlift/capabilities.h"

namespace tensorlift {

// Runtime and driver versions and the GPUs, each with the reason when
// missing. Never fails; thread-safe.
CudaCapabilities QueryCudaCapabilities();

}  // namespace tensorlift

#endif  // TENSORLIFT_DEVICE_CUDA_INFO_H_
