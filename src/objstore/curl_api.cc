// libcurl by dlopen (curl_api.h).
#define CURL_DISABLE_TYPECHECK
#include "objstore/curl_api.h"

#include <curl/curl.h>
#include <dirent.h>
#include <dlfcn.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "common/dynamic_library.h"

namespace tensorlift::objstore {
namespace {

constexpr const char* kCurlLibEnv = "TENSORLIFT_CURL_LIB";
constexpr const char* kHint =
    " (install libcurl: Debian and Ubuntu `apt install libcurl4`, Fedora and RHEL `dnf install "
    "libcurl`; or `pip install tensorlift[s3]`, whose pycurl wheel carries one; or set "
    "TENSORLIFT_CURL_LIB to a libcurl.so.4)";

// pycurl's wheel grafts its libcurl into site-packages/pycurl.libs/ as
// libcurl-<hash>.so.4.x. This library (the Python extension, or the CLI a
// wheel carries in tensorlift/_bin/) lives one or two folders below
// site-packages.
std::string PycurlLibcurl() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&LoadCurl), &info) == 0 || info.dli_fname == nullptr)
    return "";
  std::string dir = info.dli_fname;
  for (int up = 0; up < 3; ++up) {
    const size_t slash = dir.rfind('/');
    if (slash == std::string::npos || slash == 0) return "";
    dir.resize(slash);
    const std::string libs = dir + "/pycurl.libs";
    DIR* d = ::opendir(libs.c_str());
    if (d == nullptr) continue;
    std::vector<std::string> found;
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.rfind("libcurl-", 0) == 0 && name.find(".so") != std::string::npos) {
        found.push_back(libs + "/" + name);
      }
    }
    ::closedir(d);
    if (!found.empty()) return *std::min_element(found.begin(), found.end());
  }
  return "";
}

Result<DynamicLibrary> OpenLibcurl() {
  Result<DynamicLibrary> lib = DynamicLibrary::Open(kCurlLibEnv, "libcurl.so.4", "libcurl", kHint);
  const char* env = std::getenv(kCurlLibEnv);
  if (lib.ok() || (env != nullptr && env[0] != '\0')) return lib;
  const std::string pycurl = PycurlLibcurl();
  if (pycurl.empty()) return lib;
  Result<DynamicLibrary> bundled = DynamicLibrary::Open(nullptr, pycurl, "libcurl (pycurl's)", "");
  if (bundled.ok()) return bundled;
  return Status(StatusCode::kUnavailable,
                lib.status().message() + "; also " + bundled.status().message());
}

Result<CurlApi> Load() {
  TL_ASSIGN_OR_RETURN(DynamicLibrary lib, OpenLibcurl());
  CurlApi api{};
#define TL_CURL_SYMBOL(field, symbol) TL_RETURN_IF_ERROR(lib.Symbol(#symbol, &api.field))
  TL_CURL_SYMBOL(global_init, curl_global_init);
  TL_CURL_SYMBOL(version_info, curl_version_info);
  TL_CURL_SYMBOL(easy_strerror, curl_easy_strerror);
  TL_CURL_SYMBOL(easy_init, curl_easy_init);
  TL_CURL_SYMBOL(easy_cleanup, curl_easy_cleanup);
  TL_CURL_SYMBOL(easy_reset, curl_easy_reset);
  TL_CURL_SYMBOL(easy_setopt, curl_easy_setopt);
  TL_CURL_SYMBOL(easy_getinfo, curl_easy_getinfo);
  TL_CURL_SYMBOL(share_init, curl_share_init);
  TL_CURL_SYMBOL(share_setopt, curl_share_setopt);
  TL_CURL_SYMBOL(share_cleanup, curl_share_cleanup);
  TL_CURL_SYMBOL(slist_append, curl_slist_append);
  TL_CURL_SYMBOL(slist_free_all, curl_slist_free_all);
  TL_CURL_SYMBOL(multi_init, curl_multi_init);
  TL_CURL_SYMBOL(multi_setopt, curl_multi_setopt);
  TL_CURL_SYMBOL(multi_cleanup, curl_multi_cleanup);
  TL_CURL_SYMBOL(multi_add_handle, curl_multi_add_handle);
  TL_CURL_SYMBOL(multi_remove_handle, curl_multi_remove_handle);
  TL_CURL_SYMBOL(multi_perform, curl_multi_perform);
  TL_CURL_SYMBOL(multi_poll, curl_multi_poll);
  TL_CURL_SYMBOL(multi_info_read, curl_multi_info_read);
  TL_CURL_SYMBOL(multi_strerror, curl_multi_strerror);
#undef TL_CURL_SYMBOL
  api.path = DynamicLibrary::Where(reinterpret_cast<const void*>(api.version_info));
  if (api.path.empty()) api.path = lib.name();
  lib.Keep();  // Its functions are in use for the life of the process.
  return api;
}

CurlApi g_api{};

}  // namespace

Result<const CurlApi*> LoadCurl() {
  static std::once_flag once;
  static Status status;
  std::call_once(once, [] {
    Result<CurlApi> api = Load();
    if (api.ok()) {
      g_api = std::move(api).value();
    } else {
      status = api.status();
    }
  });
  if (!status.ok()) return status;
  return &g_api;
}

const CurlApi& Curl() { return g_api; }

}  // namespace tensorlift::objstore
