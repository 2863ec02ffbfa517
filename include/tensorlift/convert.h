// Dtype conversion on the host, element by element with the functions of
// convert.h (the same ones the CUDA kernels run), so that a conversion gives
// the same bits on the CPU, on the emulated device and on a GPU.
#ifndef TENSORLIFT_CONVERT_H_
#define TENSORLIFT_CONVERT_H_

#include <cstddef>
#include <cstdint>

#include "tensorlift/dtype.h"
#include "tensorlift/status.h"

namespace tensorlift {

// Converts `count` elements at `src` (dtype `from`) into `to` at `dst`.
// InvalidArgument when the pair is not supported (ConversionSupported in
// convert.h). The ranges must not overlap. Thread-safe; runs on the calling
// thread.
Status ConvertOnHost(std::byte* dst, Dtype to, const std::byte* src, Dtype from, uint64_t count);

}  // namespace tensorlift

#endif  // TENSORLIFT_CONVERT_H_
