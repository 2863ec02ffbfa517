# Sparse checkpoints: FindSparse (both naming generations, broken groups) and
# sparsify (round trips, pruning, shards, config.json).
tl_sparse_test(sparse_checkpoint_test sparse_checkpoint_test.cc)
tl_sparse_test(sparsify_test sparsify_test.cc)
# sparsify_test reads config.json back with simdjson, whose inline code trips
# g++ 12's flow-based warnings (as in src/CMakeLists.txt).
target_link_libraries(sparsify_test PRIVATE simdjson::simdjson)
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  target_compile_options(sparsify_test PRIVATE -Wno-maybe-uninitialized)
endif()
