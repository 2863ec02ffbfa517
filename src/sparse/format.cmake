# Sparse checkpoints (tensorlift/sparse.h): finding the
# compressed-tensors groups in a checkpoint, writing them (sparse/sparsify.h),
# pruning.
add_library(tl_sparse STATIC
  sparse/shard_files.cc
  sparse/sparse_checkpoint.cc
  sparse/sparsify.cc
)
target_link_libraries(tl_sparse PUBLIC tl_kernels tl_format tl_common PRIVATE simdjson::simdjson)
# simdjson 3.0's inline code trips g++ 12's flow-based warnings (false
# positives inside simdjson.h), as in src/CMakeLists.txt.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  set_source_files_properties(sparse/sparsify.cc PROPERTIES COMPILE_OPTIONS "-Wno-maybe-uninitialized")
endif()
