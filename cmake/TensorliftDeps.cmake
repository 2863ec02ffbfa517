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

# CUDA: TENSORLIFT_WITH_CUDA = AUTO (nvcc found means built) | ON | OFF. The
# device backend (src/device/cuda/) links the static CUDA runtime, so the
# library loads, and loads to host memory, on machines with no GPU and no
# driver; OpenCudaDevice then says why there is none.
set(TENSORLIFT_WITH_CUDA AUTO CACHE STRING "Build the CUDA device backend: AUTO, ON or OFF")
set(TENSORLIFT_HAVE_CUDA OFF)
set(TENSORLIFT_NO_CUDA_REASON "TENSORLIFT_WITH_CUDA=OFF")
if(NOT TENSORLIFT_WITH_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  # nvcc from PATH, else from /usr/local/cuda/bin; CMAKE_CUDA_COMPILER or
  # $CUDACXX override. check_language() then checks that it works (through
  # $CUDACXX), so a broken nvcc means "without CUDA", not a failed build.
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    find_program(TENSORLIFT_NVCC nvcc PATHS /usr/local/cuda/bin)
    if(TENSORLIFT_NVCC)
      set(ENV{CUDACXX} "${TENSORLIFT_NVCC}")
    endif()
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    # C++20 as for the C++ files. CMake 3.25 does not know nvcc's C++20 flag
    # (nvcc >= 12 has it); tell it.
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    set(CMAKE_CUDA_EXTENSIONS OFF)
    find_package(CUDAToolkit)
  endif()
  if(CMAKE_CUDA_COMPILER AND TARGET CUDA::cudart_static)
    set(TENSORLIFT_HAVE_CUDA ON)
    message(STATUS "tensorlift: building the CUDA backend (nvcc ${CMAKE_CUDA_COMPILER_VERSION})")
  elseif(TENSORLIFT_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "TENSORLIFT_WITH_CUDA=ON but nvcc or the CUDA runtime (cudart_static) was not found")
  else()
    set(TENSORLIFT_NO_CUDA_REASON "nvcc was not found at build time")
    message(STATUS "tensorlift: nvcc not found; building without CUDA")
  endif()
endif()

# cuFile (GPUDirect Storage): libcufile.so.0 is dlopen'd at run time, so only
# its header is needed, for the real types: from the CUDA toolkit, or from
# NVIDIA's wheel in the venv (nvidia/cu13/include, as pip installs it).
# TENSORLIFT_CUFILE_INCLUDE_DIR overrides. Without CUDA, or without the
# header, GDS is not built and says why at run time.
set(TENSORLIFT_HAVE_CUFILE OFF)
set(TENSORLIFT_NO_CUFILE_REASON "no CUDA backend: ${TENSORLIFT_NO_CUDA_REASON}")
if(TENSORLIFT_HAVE_CUDA)
  foreach(_tl_dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
    if(NOT TENSORLIFT_CUFILE_INCLUDE_DIR AND EXISTS "${_tl_dir}/cufile.h")
      set(TENSORLIFT_CUFILE_INCLUDE_DIR "${_tl_dir}" CACHE PATH "Directory holding cufile.h")
    endif()
  endforeach()
  foreach(_tl_py IN ITEMS "${Python_EXECUTABLE}" "${PROJECT_SOURCE_DIR}/.venv/bin/python")
    if(TENSORLIFT_CUFILE_INCLUDE_DIR OR NOT _tl_py OR NOT EXISTS "${_tl_py}")
      continue()
    endif()
    execute_process(
      COMMAND "${_tl_py}" -c "import glob, os, nvidia; print(next(iter(sorted(os.path.dirname(h) for p in nvidia.__path__ for h in glob.glob(os.path.join(p, '*', 'include', 'cufile.h')))), ''))"
      OUTPUT_VARIABLE _tl_cufile_dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(_tl_cufile_dir AND EXISTS "${_tl_cufile_dir}/cufile.h")
      set(TENSORLIFT_CUFILE_INCLUDE_DIR "${_tl_cufile_dir}" CACHE PATH "Directory holding cufile.h")
    endif()
  endforeach()
  if(TENSORLIFT_CUFILE_INCLUDE_DIR AND EXISTS "${TENSORLIFT_CUFILE_INCLUDE_DIR}/cufile.h")
    set(TENSORLIFT_HAVE_CUFILE ON)
    message(STATUS "tensorlift: GPUDirect Storage through dlopen(libcufile.so.0), cufile.h from ${TENSORLIFT_CUFILE_INCLUDE_DIR}")
  else()
    set(TENSORLIFT_NO_CUFILE_REASON "cufile.h was not found at build time (install the nvidia-cufile wheel into .venv, or set TENSORLIFT_CUFILE_INCLUDE_DIR)")
    message(STATUS "tensorlift: cufile.h not found; building without GPUDirect Storage")
  endif()
endif()
