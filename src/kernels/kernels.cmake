# Leaf kernels shared by the device layer and sparse checkpoints
# (docs/architecture.md): dtype conversion (kernels/convert.h, on the host:
# tensorlift/convert.h) and the sparse-bitmask codec (tensorlift/bitmask.h:
# encode, validation, the scalar, AVX2 and AVX-512 decoders, chosen at run
# time; the SIMD files carry [[gnu::target]] on their functions and compile to
# nothing off x86-64). The CUDA kernels include the same element code.
add_library(tl_kernels STATIC
  kernels/bitmask.cc
  kernels/decode_avx2.cc
  kernels/decode_avx512.cc
  kernels/convert_host.cc
)
target_link_libraries(tl_kernels PUBLIC tl_common Threads::Threads)
# The device layer decodes and converts with them (DeviceStream::DecodeBitmask:
# the host device runs these decoders, the emulated device validates with them).
target_link_libraries(tl_device PUBLIC tl_kernels)
