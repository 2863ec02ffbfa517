# Third-party dependencies, all from Debian's -dev packages (scripts/setup.sh
# installs them). Nothing is vendored.
find_package(PkgConfig REQUIRED)
find_package(simdjson REQUIRED CONFIG)
find_package(Threads REQUIRED)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)

if(TENSORLIFT_BUILD_TOOLS)
  find_package(CLI11 REQUIRED CONFIG)
endif()
if(TENSORLIFT_BUILD_TESTS)
  find_package(GTest REQUIRED CONFIG)
endif()
if(TENSORLIFT_BUILD_BENCH)
  find_package(benchmark REQUIRED CONFIG)
endif()

# io_uring: TENSORLIFT_WITH_URING = AUTO (found means built) | ON | OFF.
set(TENSORLIFT_WITH_URING AUTO CACHE STRING "Build the io_uring engine: AUTO, ON or OFF")
set(TENSORLIFT_HAVE_URING OFF)
if(NOT TENSORLIFT_WITH_URING STREQUAL "OFF")
  pkg_check_modules(LIBURING IMPORTED_TARGET liburing)
  if(LIBURING_FOUND)
    set(TENSORLIFT_HAVE_URING ON)
  elseif(TENSORLIFT_WITH_URING STREQUAL "ON")
    message(FATAL_ERROR "TENSORLIFT_WITH_URING=ON but liburing was not found")
  else()
    message(STATUS "tensorlift: liburing not found; building without io_uring")
  endif()
endif()

# DLPack 1.x header (dlpack/dlpack.h). Debian's libdlpack-dev is 0.6, which
# lacks DLManagedTensorVersioned; the apache-tvm-ffi wheel (the DLPack
# maintainers' FFI project) ships the current header, installed into the venv
# by scripts/setup.sh. TENSORLIFT_DLPACK_INCLUDE_DIR overrides.
foreach(_tl_py IN ITEMS "${Python_EXECUTABLE}" "${PROJECT_SOURCE_DIR}/.venv/bin/python")
  if(TENSORLIFT_DLPACK_INCLUDE_DIR OR NOT _tl_py OR NOT EXISTS "${_tl_py}")
    continue()
  endif()
  execute_process(
    COMMAND "${_tl_py}" -c "import os, tvm_ffi; print(os.path.join(os.path.dirname(tvm_ffi.__file__), 'include'))"
    OUTPUT_VARIABLE _tl_dlpack_dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(EXISTS "${_tl_dlpack_dir}/dlpack/dlpack.h")
    set(TENSORLIFT_DLPACK_INCLUDE_DIR "${_tl_dlpack_dir}" CACHE PATH "Directory holding dlpack/dlpack.h (1.x)")
  endif()
endforeach()
if(NOT TENSORLIFT_DLPACK_INCLUDE_DIR)
  message(FATAL_ERROR "dlpack/dlpack.h (DLPack 1.x) not found: run scripts/setup.sh, or set TENSORLIFT_DLPACK_INCLUDE_DIR")
endif()
