// The CUDA kernels of the device layer. Conversions run convert.h's
// ConvertElement, the same code ConvertOnHost runs, so a GPU gives the same
// bits as the CPU; the common pairs run it through ConvertGroup, 8 elements a
// thread with 16-byte loads and stores, when both ends are 16-byte aligned. The sparse-bitmask
// decode runs kernels/bitmask_kernel.h, whose element code the host emulation (and its tests) run
// too.
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

// One ConvertGroup call per group in [0, groups), grid-stride.
template <Dtype From, Dtype To>
__global__ void ConvertGroupsKernel(std::byte* __restrict__ dst, const std::byte* __restrict__ src,
                                    uint64_t groups) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t g = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups;
       g += stride) {
    convert::ConvertGroup<From, To>(dst, src, g);
  }
}

uint64_t Blocks(uint64_t units) {
  const uint64_t blocks = units / kThreadsPerBlock + (units % kThreadsPerBlock != 0);
  return blocks > kMaxBlocks ? kMaxBlocks : blocks;
}

// The groups kernel for (from, to), or null for a pair it does not serve.
using GroupsKernel = void (*)(std::byte*, const std::byte*, uint64_t);
template <Dtype From>
GroupsKernel GroupsKernelTo(Dtype to) {
  switch (to) {
    case Dtype::kF32:
      return From == Dtype::kF32 ? nullptr : ConvertGroupsKernel<From, Dtype::kF32>;
    case Dtype::kF16:
      return From == Dtype::kF16 ? nullptr : ConvertGroupsKernel<From, Dtype::kF16>;
    case Dtype::kBF16:
      return From == Dtype::kBF16 ? nullptr : ConvertGroupsKernel<From, Dtype::kBF16>;
    default:
      return nullptr;
  }
}
GroupsKernel GroupsKernelFor(Dtype from, Dtype to) {
  switch (from) {
    case Dtype::kF32:
      return GroupsKernelTo<Dtype::kF32>(to);
    case Dtype::kF16:
      return GroupsKernelTo<Dtype::kF16>(to);
    case Dtype::kBF16:
      return GroupsKernelTo<Dtype::kBF16>(to);
    case Dtype::kF8_E4M3:
      return GroupsKernelTo<Dtype::kF8_E4M3>(to);
    case Dtype::kF8_E5M2:
      return GroupsKernelTo<Dtype::kF8_E5M2>(to);
    default:
      return nullptr;
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
  uint64_t units = convert::ConvertUnits(from, to, count);
  if (units == 0) return cudaSuccess;
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  // Clear an earlier call's non-sticky error (e.g. a failed cudaMalloc), so
  // that the error returned below is this launch's.
  (void)cudaGetLastError();
  // Whole groups through the vectorised kernel when both ends are 16-byte
  // aligned (a converted tensor's device slot is 256-byte aligned, and its
  // source in the staging slot 8-byte aligned: 16 in most plans); the rest,
  // and every other case, element by element.
  const GroupsKernel groups_kernel = GroupsKernelFor(from, to);
  const uint64_t groups = units / convert::kGroupElements;
  if (groups_kernel != nullptr && groups > 0 && reinterpret_cast<uintptr_t>(d) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(s) % 16 == 0) {
    groups_kernel<<<static_cast<unsigned>(Blocks(groups)), kThreadsPerBlock, 0, stream>>>(d, s,
                                                                                          groups);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    const uint64_t done = groups * convert::kGroupElements;
    d += done * convert::ElementBytes(to);
    s += done * convert::ElementBytes(from);
    units -= done;
    if (units == 0) return cudaSuccess;
  }
  ConvertKernel<<<static_cast<unsigned>(Blocks(units)), kThreadsPerBlock, 0, stream>>>(d, to, s,
                                                                                       from, units);
  return cudaGetLastError();
}

}  // namespace tensorlift::cuda
