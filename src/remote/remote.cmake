# remote: loading from a running peer (include/tensorlift/remote.h).
#   key.cc           PeerKey
#   manifest.cc      the per-rank manifest (untrusted input: ParseManifest)
#   auth.cc          HMAC-SHA256 request signing (OpenSSL's libcrypto)
#   layout.cc        tensor-parallel layouts and slice arithmetic
#   slice.cc         a rank's slices of a loaded checkpoint (PeerAccess)
#   registry.cc      seed discovery on etcd (v3 JSON gateway, cpp-httplib)
#   server.cc        PeerServer: control endpoint (cpp-httplib) + UCX regions
#   peer_load.cc     LoadFromPeer: key check, manifest, pulls, checksums, fallback
#   ucx_transport.cc the UCX data plane (TENSORLIFT_WITH_UCX = AUTO | ON | OFF),
#                    else ucx_none.cc says "built without UCX" at run time.
find_package(OpenSSL REQUIRED COMPONENTS Crypto)
# Debian's cpp-httplib is a compiled library whose build macros (OpenSSL, zlib,
# brotli support) change its classes' layout: take them from pkg-config with
# the library, in every file that includes httplib.h.
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET GLOBAL cpp-httplib)
add_library(tl_remote STATIC
  remote/key.cc
  remote/manifest.cc
  remote/auth.cc
  remote/layout.cc
  remote/slice.cc
  remote/registry.cc
  remote/server.cc
  remote/peer_load.cc
)
target_link_libraries(tl_remote PUBLIC tl_load tl_format tl_common
                      PRIVATE PkgConfig::HTTPLIB OpenSSL::Crypto simdjson::simdjson Threads::Threads PkgConfig::XXHASH)
set(TENSORLIFT_WITH_UCX AUTO CACHE STRING "Build the UCX data plane: AUTO, ON or OFF")
set(TENSORLIFT_HAVE_UCX OFF)
set(_tl_no_ucx_reason "TENSORLIFT_WITH_UCX=OFF")
if(NOT TENSORLIFT_WITH_UCX STREQUAL "OFF")
  pkg_check_modules(UCX IMPORTED_TARGET ucx)
  if(UCX_FOUND)
    set(TENSORLIFT_HAVE_UCX ON)
    message(STATUS "tensorlift: building the UCX data plane (UCX ${UCX_VERSION})")
  elseif(TENSORLIFT_WITH_UCX STREQUAL "ON")
    message(FATAL_ERROR "TENSORLIFT_WITH_UCX=ON but UCX (pkg-config ucx) was not found")
  else()
    set(_tl_no_ucx_reason "UCX (libucx-dev) was not found at build time")
    message(STATUS "tensorlift: UCX not found; building without the peer data plane")
  endif()
endif()
set(TENSORLIFT_HAVE_UCX ${TENSORLIFT_HAVE_UCX} PARENT_SCOPE)
if(TENSORLIFT_HAVE_UCX)
  target_sources(tl_remote PRIVATE remote/ucx_transport.cc)
  target_link_libraries(tl_remote PRIVATE PkgConfig::UCX)
  set_source_files_properties(remote/ucx_transport.cc PROPERTIES
    COMPILE_DEFINITIONS "TENSORLIFT_UCX_VERSION=\"${UCX_VERSION}\"")
else()
  target_sources(tl_remote PRIVATE remote/ucx_none.cc)
  set_source_files_properties(remote/ucx_none.cc PROPERTIES
    COMPILE_DEFINITIONS "TENSORLIFT_NO_UCX_REASON=\"${_tl_no_ucx_reason}\"")
endif()
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  # (and libstdc++'s <regex> under -fsanitize: layout.cc)
  set_source_files_properties(remote/manifest.cc remote/registry.cc remote/server.cc remote/peer_load.cc remote/layout.cc remote/slice.cc
    PROPERTIES COMPILE_OPTIONS "-Wno-maybe-uninitialized")
endif()
