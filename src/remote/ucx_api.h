// The UCX functions the data plane calls, loaded at run time (dlopen) from
// one UCX build per process: Debian's libucp.so.0 by default, or the build
// whose libucp.so.0 the environment variable TENSORLIFT_UCX_LIB names (for
// example the CUDA-enabled UCX of PyPI's libucx-cu12 wheel, in its
// libucx/lib/). Two UCX builds share sonames (libucp.so.0, libucs.so.0, ...),
// so they cannot both be loaded in one process; tensorlift therefore does
// not link UCX and calls it only through this table (docs/remote.md,
// "Devices"). The types come from the UCX headers tensorlift is built with;
// UCX keeps its ABI within major version 1 (structs grow behind field masks).
#ifndef TENSORLIFT_REMOTE_UCX_API_H_
#define TENSORLIFT_REMOTE_UCX_API_H_

#include <ucp/api/ucp.h>
#include <ucs/config/global_opts.h>

#include <string>

#include "tensorlift/status.h"

namespace tensorlift::remote {

// One pointer per UCX function used, all non-null once loaded.
struct UcxApi {
  // ucp_init is an inline wrapper in the headers: call Init, which passes
  // the headers' API version to ucp_init_version.
  decltype(&ucp_init_version) init_version;
  decltype(&ucp_get_version) get_version;
  decltype(&ucp_cleanup) cleanup;
  decltype(&ucp_config_read) config_read;
  decltype(&ucp_config_modify) config_modify;
  decltype(&ucp_config_release) config_release;
  decltype(&ucp_context_print_info) context_print_info;
  decltype(&ucp_context_query) context_query;
  decltype(&ucp_worker_create) worker_create;
  decltype(&ucp_worker_destroy) worker_destroy;
  decltype(&ucp_worker_query) worker_query;
  decltype(&ucp_worker_progress) worker_progress;
  decltype(&ucp_worker_arm) worker_arm;
  decltype(&ucp_worker_get_efd) worker_get_efd;
  decltype(&ucp_worker_get_address) worker_get_address;
  decltype(&ucp_worker_release_address) worker_release_address;
  decltype(&ucp_ep_create) ep_create;
  decltype(&ucp_ep_close_nbx) ep_close_nbx;
  decltype(&ucp_ep_flush_nbx) ep_flush_nbx;
  decltype(&ucp_ep_print_info) ep_print_info;
  decltype(&ucp_ep_rkey_unpack) ep_rkey_unpack;
  decltype(&ucp_rkey_destroy) rkey_destroy;
  decltype(&ucp_rkey_pack) rkey_pack;
  decltype(&ucp_rkey_buffer_release) rkey_buffer_release;
  decltype(&ucp_mem_map) mem_map;
  decltype(&ucp_mem_unmap) mem_unmap;
  decltype(&ucp_get_nbx) get_nbx;
  decltype(&ucp_request_check_status) request_check_status;
  decltype(&ucp_request_free) request_free;
  decltype(&ucs_status_string) status_string;
  decltype(&ucs_global_opts_get_value) global_opts_get_value;
  decltype(&ucs_global_opts_set_value) global_opts_set_value;

  // The file it was loaded from (TENSORLIFT_UCX_LIB's value, or
  // "libucp.so.0") and the library's version ("1.13.1").
  std::string path;
  std::string version;
  // Why this build was loaded (ChooseUcx in ucx_api.cc): named by
  // TENSORLIFT_UCX_LIB, PyPI's libucx-cuNN beside tensorlift, or the system's.
  std::string choice;

  ucs_status_t Init(const ucp_params_t* params, const ucp_config_t* config,
                    ucp_context_h* context) const {
    return init_version(UCP_API_MAJOR, UCP_API_MINOR, params, config, context);
  }
};

// The environment variable that names another UCX build's libucp.so.0.
inline constexpr const char* kUcxLibEnv = "TENSORLIFT_UCX_LIB";

// Loads UCX on the first call (thread-safe) and returns the same table, or
// the same error, on every later call: kUnavailable naming the library that
// would not open or the symbol it lacks. The libraries stay loaded for the
// life of the process.
Result<const UcxApi*> LoadUcx();

}  // namespace tensorlift::remote

#endif  // TENSORLIFT_REMOTE_UCX_API_H_
