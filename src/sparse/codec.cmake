# The sparse-bitmask codec (sparse/bitmask.h): encode, validation, the scalar,
# AVX2 and AVX-512 decoders (chosen at run time; the SIMD files carry
# [[gnu::target]] on their functions and compile to nothing off x86-64).
add_library(tl_sparse_codec STATIC
  sparse/bitmask.cc
  sparse/decode_avx2.cc
  sparse/decode_avx512.cc
)
target_link_libraries(tl_sparse_codec PUBLIC tl_common Threads::Threads)
# The device layer decodes with it (DeviceStream::DecodeBitmask: the host
# device runs these decoders, the emulated device validates with it).
target_link_libraries(tl_device PUBLIC tl_sparse_codec)
