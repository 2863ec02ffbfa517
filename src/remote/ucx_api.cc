#include "remote/ucx_api.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <string_view>
#include <utility>

#include "common/dynamic_library.h"
#include "tensorlift/crash.h"

namespace tensorlift::remote {
namespace {

constexpr const char* kDefaultLib = "libucp.so.0";

// The libraries beside a libucp.so.0 that it needs, in the order PyPI's
// libucx/load.py loads them (libucs_signal is optional: older builds lack
// it). libucs comes first: libucm calls into libucs without naming it as a
// dependency, so libucm opens only as libucs's dependency (found through
// libucs's $ORIGIN rpath). Loading them by full path first binds libucp to
// these files, not to whatever libucs.so.0 the loader's search path finds.
constexpr const char* kSiblings[] = {"libucs.so.0", "libucs_signal.so.0", "libucm.so.0",
                                     "libuct.so.0"};

Status OpenSiblings(const std::string& libucp) {
  const size_t slash = libucp.rfind('/');
  if (slash == std::string::npos) return Status::Ok();  // A bare name: the loader's search.
  const std::string dir = libucp.substr(0, slash + 1);
  for (const char* name : kSiblings) {
    const std::string path = dir + name;
    if (::access(path.c_str(), F_OK) != 0) {
      if (std::string_view(name) == "libucs_signal.so.0") continue;
      return UnavailableError(std::string("UCX library ") + path + " not found beside " + libucp +
                              " (" + kUcxLibEnv + " must name a libucp.so.0 in a complete UCX " +
                              "lib/ directory)");
    }
    TL_ASSIGN_OR_RETURN(DynamicLibrary lib,
                        DynamicLibrary::Open(nullptr, path, "UCX library " + path, ""));
    lib.Keep();
  }
  return Status::Ok();
}

// The CUDA major version the driver supports (cuDriverGetVersion), 0 without
// a driver.
int CudaDriverMajor() {
  Result<DynamicLibrary> cuda = DynamicLibrary::Open(nullptr, "libcuda.so.1", "CUDA driver", "");
  if (!cuda.ok()) return 0;
  int (*get_version)(int*) = nullptr;
  int version = 0;
  if (!cuda->Symbol("cuDriverGetVersion", &get_version).ok() || get_version(&version) != 0)
    return 0;
  cuda->Keep();  // The driver stays loaded, as CUDA itself keeps it.
  return version / 1000;
}

struct UcxChoice {
  std::string path;  // Empty: the system's libucp.so.0.
  std::string why;
};

// Without TENSORLIFT_UCX_LIB: PyPI's CUDA build of UCX (libucx-cu12 or
// libucx-cu13, whose libraries are <site-packages>/libucx/lib/) when it is
// installed beside tensorlift's own package and fits the machine's CUDA
// driver (its CUDA major at most the driver's); else the system's
// libucp.so.0. Without a driver a CUDA build brings nothing, so the system's
// is kept then.
UcxChoice ChooseUcx() {
  // The package's files: <site-packages>/tensorlift/_tensorlift*.so (the Python
  // module) or <site-packages>/tensorlift/_bin/tensorlift (the CLI).
  const auto package_at = [](const std::string& file) {
    const size_t bin = file.rfind("/tensorlift/_bin/tensorlift");
    if (bin != std::string::npos) return bin;
    const size_t module = file.rfind("/tensorlift/_tensorlift");
    return module;
  };
  std::string self = DynamicLibrary::Where(reinterpret_cast<const void*>(&ChooseUcx));
  if (package_at(self) == std::string::npos) {  // The CLI: the executable itself.
    char buf[4096];
    const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n > 0) self.assign(buf, static_cast<size_t>(n));
  }
  const size_t at = package_at(self);
  if (at == std::string::npos)
    return {"", "the system's (tensorlift is not a Python package here)"};
  const std::string site = self.substr(0, at);
  const std::string lib = site + "/libucx/lib/" + kDefaultLib;
  if (::access(lib.c_str(), F_OK) != 0) {
    return {"", "the system's (no PyPI libucx beside tensorlift in " + site + ")"};
  }
  int flavour = 0;  // libucx_cu13-1.22.0.dist-info: 13.
  if (DIR* dir = ::opendir(site.c_str())) {
    while (const dirent* e = ::readdir(dir)) {
      const std::string_view name(e->d_name);
      if (name.substr(0, 9) == "libucx_cu" && name.size() > 10 &&
          name.substr(name.size() - 10) == ".dist-info") {
        flavour = std::atoi(e->d_name + 9);
      }
    }
    ::closedir(dir);
  }
  const std::string package =
      flavour > 0 ? "PyPI's libucx-cu" + std::to_string(flavour) : std::string("PyPI's libucx");
  const int driver = CudaDriverMajor();
  if (driver == 0) {
    return {"", "the system's: " + package + " beside tensorlift (" + lib +
                    ") is a CUDA build, and there is no CUDA driver here"};
  }
  if (flavour > driver) {
    return {"", "the system's: " + package + " beside tensorlift needs a CUDA " +
                    std::to_string(flavour) + " driver, and this one supports CUDA " +
                    std::to_string(driver)};
  }
  return {lib,
          package + " beside tensorlift (the driver supports CUDA " + std::to_string(driver) + ")"};
}

Result<UcxApi> Load() {
  // UCX's memory hooks (UCM) rewrite the code of mmap, munmap, madvise, ...
  // in place ("bistro" mode) when UCX starts in a process. A thread inside
  // one of them at that moment returns into half-rewritten code: PopulateAhead
  // faults a peer load's fresh memory in with madvise while the load
  // connects, and a 2 GB pull crashed with SIGSEGV in madvise in 5 of 66 runs
  // (0 of 30 with the hooks off). tensorlift needs no memory events (each
  // registration lives as long as its buffer), so the hooks are off unless
  // the environment already chooses a mode. Set before libucm is loaded,
  // which reads it.
  if (std::getenv("UCX_MEM_MMAP_HOOK_MODE") == nullptr) {
    ::setenv("UCX_MEM_MMAP_HOOK_MODE", "none", 0);
  }
  // UCX logs to stdout by default: a peer that dies mid-connect put UCX's
  // "connect() failed" lines into `tensorlift fetch --checksum`'s output.
  // Diagnostics go to stderr unless the environment says otherwise.
  if (std::getenv("UCX_LOG_FILE") == nullptr) ::setenv("UCX_LOG_FILE", "stderr", 0);
  const char* env = std::getenv(kUcxLibEnv);
  const bool named = env != nullptr && env[0] != '\0';
  const UcxChoice chosen =
      named ? UcxChoice{env, std::string("named by ") + kUcxLibEnv} : ChooseUcx();
  const std::string path = chosen.path.empty() ? kDefaultLib : chosen.path;
  if (!chosen.path.empty()) TL_RETURN_IF_ERROR(OpenSiblings(path));
  TL_ASSIGN_OR_RETURN(
      DynamicLibrary lib,
      named ? DynamicLibrary::Open(kUcxLibEnv, kDefaultLib, "UCX (" + path + ")", "")
            : DynamicLibrary::Open(nullptr, path, "UCX (" + path + ")",
                                   " (install Debian's libucx0, or PyPI's libucx-cu12 or "
                                   "libucx-cu13 beside tensorlift, or set TENSORLIFT_UCX_LIB to "
                                   "the path of another UCX build's libucp.so.0)"));
  UcxApi api{};
  // dlsym on libucp's handle also searches its dependencies (libucs, ...).
#define TL_UCX_SYMBOL(field, symbol) TL_RETURN_IF_ERROR(lib.Symbol(#symbol, &api.field))
  TL_UCX_SYMBOL(init_version, ucp_init_version);
  TL_UCX_SYMBOL(get_version, ucp_get_version);
  TL_UCX_SYMBOL(cleanup, ucp_cleanup);
  TL_UCX_SYMBOL(config_read, ucp_config_read);
  TL_UCX_SYMBOL(config_modify, ucp_config_modify);
  TL_UCX_SYMBOL(config_release, ucp_config_release);
  TL_UCX_SYMBOL(context_print_info, ucp_context_print_info);
  TL_UCX_SYMBOL(context_query, ucp_context_query);
  TL_UCX_SYMBOL(worker_create, ucp_worker_create);
  TL_UCX_SYMBOL(worker_destroy, ucp_worker_destroy);
  TL_UCX_SYMBOL(worker_query, ucp_worker_query);
  TL_UCX_SYMBOL(worker_progress, ucp_worker_progress);
  TL_UCX_SYMBOL(worker_arm, ucp_worker_arm);
  TL_UCX_SYMBOL(worker_get_efd, ucp_worker_get_efd);
  TL_UCX_SYMBOL(worker_get_address, ucp_worker_get_address);
  TL_UCX_SYMBOL(worker_release_address, ucp_worker_release_address);
  TL_UCX_SYMBOL(ep_create, ucp_ep_create);
  TL_UCX_SYMBOL(ep_close_nbx, ucp_ep_close_nbx);
  TL_UCX_SYMBOL(ep_flush_nbx, ucp_ep_flush_nbx);
  TL_UCX_SYMBOL(ep_print_info, ucp_ep_print_info);
  TL_UCX_SYMBOL(ep_rkey_unpack, ucp_ep_rkey_unpack);
  TL_UCX_SYMBOL(rkey_destroy, ucp_rkey_destroy);
  TL_UCX_SYMBOL(rkey_pack, ucp_rkey_pack);
  TL_UCX_SYMBOL(rkey_buffer_release, ucp_rkey_buffer_release);
  TL_UCX_SYMBOL(mem_map, ucp_mem_map);
  TL_UCX_SYMBOL(mem_unmap, ucp_mem_unmap);
  TL_UCX_SYMBOL(get_nbx, ucp_get_nbx);
  TL_UCX_SYMBOL(request_check_status, ucp_request_check_status);
  TL_UCX_SYMBOL(request_free, ucp_request_free);
  TL_UCX_SYMBOL(status_string, ucs_status_string);
  TL_UCX_SYMBOL(global_opts_get_value, ucs_global_opts_get_value);
  TL_UCX_SYMBOL(global_opts_set_value, ucs_global_opts_set_value);
#undef TL_UCX_SYMBOL
  unsigned major = 0, minor = 0, release = 0;
  api.get_version(&major, &minor, &release);
  api.path = DynamicLibrary::Where(reinterpret_cast<const void*>(api.get_version));
  if (api.path.empty()) api.path = path;
  api.version = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
  api.choice = chosen.why;
  // The structs and flags come from the headers tensorlift was built with;
  // an older library may not know all of them.
  if (major != UCP_API_MAJOR || minor < UCP_API_MINOR) {
    return UnavailableError("UCX " + api.version + " (" + path +
                            ") is not compatible with the UCX headers tensorlift was built with (" +
                            std::to_string(UCP_API_MAJOR) + "." + std::to_string(UCP_API_MINOR) +
                            "): it needs " + std::to_string(UCP_API_MAJOR) +
                            ".x, x >= " + std::to_string(UCP_API_MINOR));
  }
  lib.Keep();
  // A crash in UCX (or anywhere after it is loaded) names the build that was in use.
  SetCrashContext("UCX", api.version + " (" + api.path + ")");
  return api;
}

}  // namespace

Result<const UcxApi*> LoadUcx() {
  static std::mutex mu;
  static const Result<UcxApi>* loaded = nullptr;  // Never freed: UCX stays loaded.
  std::lock_guard<std::mutex> lock(mu);
  if (loaded == nullptr) loaded = new Result<UcxApi>(Load());
  if (!loaded->ok()) return loaded->status();
  return &**loaded;
}

}  // namespace tensorlift::remote
