// libcurl, opened at run time (dlopen) rather than linked: the S3 client is
// optional, and a wheel must import and load from disk on machines without
// libcurl. The client (s3_client.cc, s3_transfers.cc, s3_transfer_checks.cc)
// is written against curl.h as usual; this header, included after curl.h,
// points each curl_* call it makes at the table that LoadCurl fills.
//
// Where libcurl is looked for, in order: $TENSORLIFT_CURL_LIB; the system's
// libcurl.so.4; the libcurl that PyPI's pycurl wheel carries
// (site-packages/pycurl.libs/libcurl-*.so*, next to this tensorlift package:
// `pip install tensorlift[s3]`).
#ifndef TENSORLIFT_OBJSTORE_CURL_API_H_
#define TENSORLIFT_OBJSTORE_CURL_API_H_

#ifndef CURL_DISABLE_TYPECHECK
#error "define CURL_DISABLE_TYPECHECK before including curl/curl.h"
#endif
#include <curl/curl.h>

#include <string>

#include "tensorlift/status.h"

namespace tensorlift::objstore {

struct CurlApi {
  decltype(&::curl_global_init) global_init;
  decltype(&::curl_version_info) version_info;
  decltype(&::curl_easy_strerror) easy_strerror;
  decltype(&::curl_easy_init) easy_init;
  decltype(&::curl_easy_cleanup) easy_cleanup;
  decltype(&::curl_easy_reset) easy_reset;
  decltype(&::curl_easy_setopt) easy_setopt;
  decltype(&::curl_easy_getinfo) easy_getinfo;
  decltype(&::curl_share_init) share_init;
  decltype(&::curl_share_setopt) share_setopt;
  decltype(&::curl_share_cleanup) share_cleanup;
  decltype(&::curl_slist_append) slist_append;
  decltype(&::curl_slist_free_all) slist_free_all;
  decltype(&::curl_multi_init) multi_init;
  decltype(&::curl_multi_setopt) multi_setopt;
  decltype(&::curl_multi_cleanup) multi_cleanup;
  decltype(&::curl_multi_add_handle) multi_add_handle;
  decltype(&::curl_multi_remove_handle) multi_remove_handle;
  decltype(&::curl_multi_perform) multi_perform;
  decltype(&::curl_multi_poll) multi_poll;
  decltype(&::curl_multi_info_read) multi_info_read;
  decltype(&::curl_multi_strerror) multi_strerror;
  std::string path;  // The library that was opened.
};

// Opens libcurl once per process (later calls return the first result):
// Unavailable, saying where it looked and what to install, when none is
// found or one lacks a function tensorlift needs.
Result<const CurlApi*> LoadCurl();

// The table; only after LoadCurl succeeded.
const CurlApi& Curl();

}  // namespace tensorlift::objstore

// curl.h's own checks of the argument count, replaced by the table's calls.
#undef curl_easy_setopt
#undef curl_easy_getinfo
#undef curl_share_setopt
#undef curl_multi_setopt
#define curl_global_init(...) ::tensorlift::objstore::Curl().global_init(__VA_ARGS__)
#define curl_version_info(...) ::tensorlift::objstore::Curl().version_info(__VA_ARGS__)
#define curl_easy_strerror(...) ::tensorlift::objstore::Curl().easy_strerror(__VA_ARGS__)
#define curl_easy_init(...) ::tensorlift::objstore::Curl().easy_init(__VA_ARGS__)
#define curl_easy_cleanup(...) ::tensorlift::objstore::Curl().easy_cleanup(__VA_ARGS__)
#define curl_easy_reset(...) ::tensorlift::objstore::Curl().easy_reset(__VA_ARGS__)
#define curl_easy_setopt(...) ::tensorlift::objstore::Curl().easy_setopt(__VA_ARGS__)
#define curl_easy_getinfo(...) ::tensorlift::objstore::Curl().easy_getinfo(__VA_ARGS__)
#define curl_share_init(...) ::tensorlift::objstore::Curl().share_init(__VA_ARGS__)
#define curl_share_setopt(...) ::tensorlift::objstore::Curl().share_setopt(__VA_ARGS__)
#define curl_share_cleanup(...) ::tensorlift::objstore::Curl().share_cleanup(__VA_ARGS__)
#define curl_slist_append(...) ::tensorlift::objstore::Curl().slist_append(__VA_ARGS__)
#define curl_slist_free_all(...) ::tensorlift::objstore::Curl().slist_free_all(__VA_ARGS__)
#define curl_multi_init(...) ::tensorlift::objstore::Curl().multi_init(__VA_ARGS__)
#define curl_multi_setopt(...) ::tensorlift::objstore::Curl().multi_setopt(__VA_ARGS__)
#define curl_multi_cleanup(...) ::tensorlift::objstore::Curl().multi_cleanup(__VA_ARGS__)
#define curl_multi_add_handle(...) ::tensorlift::objstore::Curl().multi_add_handle(__VA_ARGS__)
#define curl_multi_remove_handle(...) \
  ::tensorlift::objstore::Curl().multi_remove_handle(__VA_ARGS__)
#define curl_multi_perform(...) ::tensorlift::objstore::Curl().multi_perform(__VA_ARGS__)
#define curl_multi_poll(...) ::tensorlift::objstore::Curl().multi_poll(__VA_ARGS__)
#define curl_multi_info_read(...) ::tensorlift::objstore::Curl().multi_info_read(__VA_ARGS__)
#define curl_multi_strerror(...) ::tensorlift::objstore::Curl().multi_strerror(__VA_ARGS__)

#endif  // TENSORLIFT_OBJSTORE_CURL_API_H_
