# objstore: weights from object storage, s3:// and gs:// (include/tensorlift/objstore.h).
#   s3_settings.cc  URLs, credentials and endpoints, found as AWS's tools find them
#   s3_answers.cc   parsers for S3's answers (listings, <Error> bodies, Content-Range), fuzzed
#   s3_client.cc    the S3 client over libcurl's multi interface (TENSORLIFT_WITH_CURL =
#                   AUTO | ON | OFF), else s3_none.cc says "built without libcurl" at run time
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
  target_link_libraries(tl_objstore PRIVATE PkgConfig::CURL)
endif()
