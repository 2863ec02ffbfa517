# remote: loading from a running peer (include/tensorlift/remote.h).
#   key.cc           PeerKey
#   manifest.cc      the per-rank manifest: the type, its JSON, chunk checksums
#   manifest_parse.cc its validating parser (untrusted input: ParseManifest)
#   frame.cc         the frame around UCX's wire blobs (untrusted input: Unframe)
#   auth.cc          HMAC-SHA256 request signing (OpenSSL's libcrypto)
#   slice.cc         a rank's slices of a loaded checkpoint (PeerAccess)
#   registry.cc      seed discovery on etcd (v3 JSON gateway, cpp-httplib)
#   registry_entry.cc its entries: keys, values, their checks, etcd's range replies
#   server.cc        PeerServer's entry points: what to serve (checkpoints, tensors, buffers)
#   peer_server.cc   the running server: control endpoint (cpp-httplib) + UCX regions, sessions
#   handover.cc      same-host handover: sealed memfds over an abstract Unix socket
#   share.cc         ShareTensors: a process's tensors into sealed shared memory
#   control.cc       the control-plane client (signed requests, GET /v1/key)
#   availability.cc  which chunks a relay holds (GET /v1/have) and its children's view of it
#   peer_session.cc  PeerSession: one source rank's session and data plane (pulls and the striper's peer source)
#   peer_load.cc     LoadFromPeer: finding sources, trying them, the fallback; with
#   peer_pull.cc     Puller: a pull from one group of source ranks (gets, chunk checks),
#   peer_check.cc    its sessions and manifests checked against the key, each other, the fallback,
#   peer_store.cc    the pull as a store's file: gets from each source rank, each chunk checked,
#   peer_content.cc  PeerKey::content checked on the bytes received.
#   ucx_transport.cc the UCX data plane (TENSORLIFT_WITH_UCX = AUTO | ON | OFF),
#                    else ucx_none.cc says "built without UCX" at run time; with
#   ucx_core.cc      UCX's context and worker, shared by the two sides,
#   ucx_server.cc    UcxServer (mapped regions, workers, the progress thread),
#   ucx_client.cc    UcxClient (an endpoint, one-sided gets).
#   ucx_api.cc       UCX's functions, loaded at run time (dlopen; UCX is not linked).
find_package(OpenSSL REQUIRED COMPONENTS Crypto)
# Debian's cpp-httplib is a compiled library whose build macros (OpenSSL, zlib,
# brotli support) change its classes' layout: take them from pkg-config with
# the library, in every file that includes httplib.h.
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET GLOBAL cpp-httplib)
add_library(tl_remote STATIC
  remote/key.cc
  remote/manifest.cc
  remote/manifest_parse.cc
  remote/frame.cc
  remote/auth.cc
  remote/slice.cc
  remote/registry.cc
  remote/registry_entry.cc
  remote/server.cc
  remote/peer_server.cc
  remote/handover.cc
  remote/share.cc
  remote/control.cc
  remote/availability.cc
  remote/peer_load.cc
  remote/peer_pull.cc
  remote/peer_check.cc
  remote/peer_store.cc
  remote/peer_content.cc
  remote/peer_session.cc
)
target_link_libraries(tl_remote PUBLIC tl_load tl_format tl_common
                      PRIVATE tl_sparse PkgConfig::HTTPLIB OpenSSL::Crypto simdjson::simdjson Threads::Threads PkgConfig::XXHASH)
tl_backend_option(UCX "the UCX data plane")
if(NOT TENSORLIFT_WITH_UCX STREQUAL "OFF")
  pkg_check_modules(UCX IMPORTED_TARGET ucx)
  tl_backend_found(UCX UCX_FOUND "UCX ${UCX_VERSION}" "UCX (libucx-dev) was not found at build time")
endif()
set(TENSORLIFT_HAVE_UCX ${TENSORLIFT_HAVE_UCX} PARENT_SCOPE)
tl_backend_sources(UCX tl_remote remote/ucx_transport.cc remote/ucx_none.cc TENSORLIFT_NO_UCX_REASON)
if(TENSORLIFT_HAVE_UCX)
  # UCX's headers only: the library is loaded at run time (ucx_api.cc), one
  # build per process, Debian's libucp.so.0 or $TENSORLIFT_UCX_LIB, so that a
  # CUDA build of UCX can replace it (docs/remote.md, "Devices").
  target_sources(tl_remote PRIVATE remote/ucx_api.cc remote/ucx_core.cc remote/ucx_server.cc
                                   remote/ucx_client.cc)
  target_include_directories(tl_remote PRIVATE ${UCX_INCLUDE_DIRS})
  target_compile_options(tl_remote PRIVATE ${UCX_CFLAGS_OTHER})
  target_link_libraries(tl_remote PRIVATE ${CMAKE_DL_LIBS})
endif()
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  # (and libstdc++'s <regex> under -fsanitize: layout.cc)
  set_source_files_properties(remote/manifest.cc remote/manifest_parse.cc remote/registry.cc remote/registry_entry.cc remote/server.cc remote/peer_server.cc remote/control.cc remote/peer_session.cc remote/peer_load.cc remote/peer_pull.cc remote/peer_check.cc remote/peer_store.cc remote/peer_content.cc remote/slice.cc
    PROPERTIES COMPILE_OPTIONS "-Wno-maybe-uninitialized")
endif()
