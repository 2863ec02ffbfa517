// The CUDA kernels of the device layer. Conversions run convert.h's
// ConvertElement, the same code ConvertOnHost runs, so a GPU gives the same
// bits as the CPU. The sparse-bitmask decode runs kernels/bitmask_kernel.h,
// whose element code the host emulation (and its tests) run too.
#include "device/cuda/kernels.h"
#include "kernels/bitmask_kernel.h"
#include "kernels/convert.h"

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

namespace sk = sparse::kernel;

// Rows (warps) per block of the decode kernel.
constexpr uint32_t kDecodeRowsPerBlock = 8;
constexpr unsigned kFullWarp = 0xFFFFFFFFu;

// One warp per row, grid-stride over rows (bitmask_kernel.h describes the
// steps). Every loop bound is the same for the 32 lanes of a warp, so the
// full-warp shuffles always have all lanes present.
template <uint32_t W, sk::Access A>
__global__ void DecodeBitmaskKernel(std::byte* __restrict__ dst,
                                    const std::byte* __restrict__ values,
                                    const uint8_t* __restrict__ bitmask,
                                    const int64_t* __restrict__ row_offsets, uint64_t rows,
                                    uint64_t cols) {
  const uint32_t lane = threadIdx.x % sk::kWarp;
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * blockDim.x / sk::kWarp;
  const uint64_t mask_row_bytes = (cols + 7) / 8;
  for (uint64_t row = (static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / sk::kWarp;
       row < rows; row += warps) {
    const uint8_t* mask = bitmask + row * mask_row_bytes;
    const std::byte* v = values + static_cast<uint64_t>(row_offsets[row]) * W;
    std::byte* out = dst + row * cols * W;
    for (uint64_t chunk = 0; chunk < cols; chunk += sk::kChunkCols) {
      const uint32_t word = sk::MaskWord(mask, mask_row_bytes, chunk + lane * 32);
      const uint32_t count = sk::PopCount(word);
      uint32_t inclusive = count;
#pragma unroll
      for (uint32_t d = 1; d < sk::kWarp; d *= 2) {
        const uint32_t up = __shfl_up_sync(kFullWarp, inclusive, d);
        if (lane >= d) inclusive += up;
      }
      const uint32_t prefix = inclusive - count;
#pragma unroll
      for (uint32_t step = 0; step < sk::kStepsPerChunk<W>; ++step) {
        const uint32_t src = sk::GroupSourceLane<W>(step, lane);
        const uint32_t src_word = __shfl_sync(kFullWarp, word, src);
        const uint32_t src_prefix = __shfl_sync(kFullWarp, prefix, src);
        const uint64_t col = chunk + sk::GroupFirstColumn<W>(step, lane);
        if (col < cols) {
          const sk::Group g =
              sk::DecodeGroup<W, A>(v, src_word, src_prefix, sk::GroupFirstBit<W>(lane));
          sk::StoreGroup<W, A>(out + col * W, g, cols - col);
        }
      }
      v += static_cast<uint64_t>(__shfl_sync(kFullWarp, inclusive, sk::kWarp - 1)) * W;
    }
  }
}

// Picks the access mode by alignment: W-byte loads and stores need values
// and output W-aligned; 16-byte stores need every output row 16-aligned.
template <uint32_t W>
cudaError_t LaunchDecode(void* dst, const void* values, const uint8_t* bitmask,
                         const int64_t* row_offsets, uint64_t rows, uint64_t cols,
                         cudaStream_t stream) {
  const auto d = reinterpret_cast<uintptr_t>(dst);
  const auto v = reinterpret_cast<uintptr_t>(values);
  const bool elements = d % W == 0 && v % W == 0;
  const bool vectors = elements && d % sk::kGroupBytes == 0 && cols * W % sk::kGroupBytes == 0;
  uint64_t blocks = rows / kDecodeRowsPerBlock + (rows % kDecodeRowsPerBlock != 0);
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  const dim3 grid(static_cast<unsigned>(blocks));
  const dim3 block(kDecodeRowsPerBlock * sk::kWarp);
  auto* kernel = vectors    ? DecodeBitmaskKernel<W, sk::Access::kVectors>
                 : elements ? DecodeBitmaskKernel<W, sk::Access::kElements>
                            : DecodeBitmaskKernel<W, sk::Access::kBytes>;
  (void)cudaGetLastError();  // As in LaunchConvert: report this launch's error.
  kernel<<<grid, block, 0, stream>>>(static_cast<std::byte*>(dst),
                                     static_cast<const std::byte*>(values), bitmask, row_offsets,
                                     rows, cols);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchDecodeBitmask(void* dst, const void* values, const uint8_t* bitmask,
                                const int64_t* row_offsets, uint64_t rows, uint64_t cols,
                                uint32_t elem_bytes, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  switch (elem_bytes) {
    case 1:
      return LaunchDecode<1>(dst, values, bitmask, row_offsets, rows, cols, stream);
    case 2:
      return LaunchDecode<2>(dst, values, bitmask, row_offsets, rows, cols, stream);
    case 4:
      return LaunchDecode<4>(dst, values, bitmask, row_offsets, rows, cols, stream);
    case 8:
      return LaunchDecode<8>(dst, values, bitmask, row_offsets, rows, cols, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

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
