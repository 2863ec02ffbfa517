# objstore: weights from object storage, s3:// and gs:// (include/tensorlift/objstore.h).
#   s3_settings.cc  URLs, credentials and endpoints, found as AWS's tools find them
#   s3_answers.cc   parsers for S3's answers (listings, <Error> bodies, Content-Range), fuzzed
#   s3_settings.h   object URLs, bucket names and S3Settings (s3_settings.cc)
#   s3_client.cc    the S3 client over libcurl's multi interface (TENSORLIFT_WITH_CURL =
#                   AUTO | ON | OFF: whether curl.h is there at build time), else s3_none.cc
#                   says "built without libcurl" at run time: the requests of each call
#   s3_transfers.cc the client's transfers: session pool, curl options, callbacks, the multi
#                   loop with retries; s3_transfer_checks.cc checks every answer
#   curl_api.cc     libcurl by dlopen at run time: the system's, or pycurl's (tensorlift[s3])
#   s3_load.cc      checkpoints in a bucket (Checkpoint::Open through the client) and
#                   LoadFromObjectStore: runs of wanted bytes, ranged GETs into the final buffers
find_package(OpenSSL REQUIRED COMPONENTS Crypto)
pkg_check_modules(LIBXML2 REQUIRED IMPORTED_TARGET libxml-2.0)
add_library(tl_objstore STATIC
  objstore/s3_answers.cc
  objstore/s3_settings.cc
  objstore/s3_load.cc
)
target_link_libraries(tl_objstore PUBLIC tl_remote tl_load tl_device tl_format tl_common
                      PRIVATE PkgConfig::LIBXML2 OpenSSL::Crypto simdjson::simdjson Threads::Threads)
tl_backend_option(CURL "the S3 client (libcurl)")
if(NOT TENSORLIFT_WITH_CURL STREQUAL "OFF")
  pkg_check_modules(CURL IMPORTED_TARGET libcurl)
  tl_backend_found(CURL CURL_FOUND "libcurl ${CURL_VERSION}" "libcurl (libcurl4-openssl-dev) was not found at build time")
endif()
set(TENSORLIFT_HAVE_CURL ${TENSORLIFT_HAVE_CURL} PARENT_SCOPE)
tl_backend_sources(CURL tl_objstore objstore/s3_client.cc objstore/s3_none.cc TENSORLIFT_NO_CURL_REASON)
if(TENSORLIFT_HAVE_CURL)
  # curl.h only: libcurl itself is opened at run time (objstore/curl_api.h), so
  # that nothing but S3 needs it.
  target_sources(tl_objstore PRIVATE objstore/curl_api.cc objstore/s3_transfers.cc
                                     objstore/s3_transfer_checks.cc)
  target_include_directories(tl_objstore PRIVATE ${CURL_INCLUDE_DIRS})
  target_link_libraries(tl_objstore PRIVATE ${CMAKE_DL_LIBS})
endif()
