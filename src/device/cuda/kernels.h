// Launchers of the CUDA kernels of the device layer (kernels.cu), callable
// from plain C++ (cuda_device.cc): only the CUDA runtime's types appear here.
#ifndef TENSORLIFT_DEVICE_CUDA_KERNELS_H_
#define TENSORLIFT_DEVICE_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tensorlift/dtype.h"

namespace tensorlift::cuda {

// Enqueues on `stream` the conversion of `count` elements at device address
// `src` (dtype `from`) into `to` at device address `dst`, element by element
// with convert.h's ConvertElement (so the bits equal ConvertOnHost's). The
// caller has checked the arguments: ConversionSupported(from, to), count > 0,
// no overlap. Returns the launch's error (cudaGetLastError, which it also
// clears); errors of the kernel itself surface at the stream's next
// synchronisation.
cudaError_t LaunchConvert(void* dst, Dtype to, const void* src, Dtype from, uint64_t count,
                          cudaStream_t stream);

// Enqueues on `stream` the decode of a sparse-bitmask tensor (layout:
// tensorlift/bitmask.h; kernel: kernels/bitmask_kernel.h) of rows x cols elements
// of elem_bytes (1, 2, 4 or 8) bytes into `dst`; all pointers are device
// addresses. The caller has checked the arguments and validated the
// encoding (the kernel trusts row_offsets and the mask). Returns the
// launch's error, as LaunchConvert does.
cudaError_t LaunchDecodeBitmask(void* dst, const void* values, const uint8_t* bitmask,
                                const int64_t* row_offsets, uint64_t rows, uint64_t cols,
                                uint32_t elem_bytes, cudaStream_t stream);

}  // namespace tensorlift::cuda

#endif  // TENSORLIFT_DEVICE_CUDA_KERNELS_H_
