// The one place where CUDA runtime errors become Status values.
#ifndef TENSORLIFT_DEVICE_CUDA_CUDA_STATUS_H_
#define TENSORLIFT_DEVICE_CUDA_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include "tensorlift/status.h"

namespace tensorlift {

// OK for cudaSuccess. Otherwise "`what`: <cudaGetErrorString> (<error name>)"
// with the code: Unavailable when there is no usable GPU or driver (no
// device, insufficient or mismatched driver, devices busy or unavailable,
// the driver stub library, system not ready), ResourceExhausted when memory
// ran out (device or pinned), Internal for everything else.
Status CudaStatus(cudaError_t err, const char* what);

}  // namespace tensorlift

#endif  // TENSORLIFT_DEVICE_CUDA_CUDA_STATUS_H_
