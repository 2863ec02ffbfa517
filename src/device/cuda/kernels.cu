// The CUDA kernels of the device layer. Conversions run convert.h's
// ConvertElement, the same code ConvertOnHost runs, so a GPU gives the same
// bits as the CPU.
#include "device/convert.h"
#include "device/cuda/kernels.h"

namespace tensorlift::cuda {
namespace {

constexpr int kThreadsPerBlock = 256;
// Enough blocks to fill the largest GPUs several times over; the grid-stride
// loop covers any count beyond.
constexpr uint64_t kMaxBlocks = 8192;

// One ConvertElement call per index in [0, units), grid-stride. Each unit is
// a whole number of bytes (convert.h: ConvertUnits), so no two threads write
// the same byte.
__global__ void ConvertKernel(std::byte* __restrict__ dst, Dtype to,
                              const std::byte* __restrict__ src, Dtype from, uint64_t units) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < units;
       i += stride) {
    convert::ConvertElement(dst, to, src, from, i);
  }
}

}  // namespace

cudaError_t LaunchConvert(void* dst, Dtype to, const void* src, Dtype from, uint64_t count,
                          cudaStream_t stream) {
  const uint64_t units = convert::ConvertUnits(from, to, count);
  if (units == 0) return cudaSuccess;
  uint64_t blocks = units / kThreadsPerBlock + (units % kThreadsPerBlock != 0);
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  // Clear an earlier call's non-sticky error (e.g. a failed cudaMalloc), so
  // that the error returned below is this launch's.
  (void)cudaGetLastError();
  ConvertKernel<<<static_cast<unsigned>(blocks), kThreadsPerBlock, 0, stream>>>(
      static_cast<std::byte*>(dst), to, static_cast<const std::byte*>(src), from, units);
  return cudaGetLastError();
}

}  // namespace tensorlift::cuda
