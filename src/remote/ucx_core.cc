// UCX's context and worker, and the helpers both sides of the data plane
// share (see ucx_core.h). Built when UCX is found.
#include "remote/ucx_core.h"

#include <poll.h>
#include <time.h>

#include <set>
#include <string_view>
#include <vector>

namespace tensorlift::remote {

using Clock = std::chrono::steady_clock;

Result<UcxCore> UcxCore::Create(const UcxOptions& options, ucs_thread_mode_t thread_mode,
                                bool shared_context, const char* name) {
  TL_ASSIGN_OR_RETURN(const UcxApi* api, LoadUcx());
  ucp_config_t* config = nullptr;
  ucs_status_t st = api->config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return InternalError("ucp_config_read: " + UcsText(api, st));
  if (!options.transports.empty()) {
    st = api->config_modify(config, "TLS", options.transports.c_str());
    if (st != UCS_OK) {
      api->config_release(config);
      return InvalidArgumentError("UCX rejected transports '" + options.transports +
                                  "': " + UcsText(api, st));
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  params.name = name;
  if (shared_context) {
    params.field_mask |= UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    params.mt_workers_shared = 1;
  }
  UcxCore core;
  core.api_ = api;
  st = api->Init(&params, config, &core.context_);
  api->config_release(config);
  if (st != UCS_OK) {
    core.context_ = nullptr;
    return UnimplementedError(
        "ucp_init with transports '" +
        (options.transports.empty() ? std::string("default") : options.transports) +
        "': " + UcsText(api, st));
  }
  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = thread_mode;
  st = api->worker_create(core.context_, &wparams, &core.worker_);
  if (st != UCS_OK) {
    core.worker_ = nullptr;
    return UnimplementedError("ucp_worker_create with transports '" + options.transports +
                              "': " + UcsText(api, st));
  }
  if (thread_mode == UCS_THREAD_MODE_MULTI) {
    ucp_worker_attr_t attr{};
    attr.field_mask = UCP_WORKER_ATTR_FIELD_THREAD_MODE;
    if (api->worker_query(core.worker_, &attr) == UCS_OK &&
        attr.thread_mode != UCS_THREAD_MODE_MULTI) {
      return UnimplementedError("this UCX was built without multi-thread support (--enable-mt)");
    }
  }
  return core;
}

void UcxCore::Reset() {
  if (worker_ != nullptr) api_->worker_destroy(worker_);
  if (context_ != nullptr) api_->cleanup(context_);
  worker_ = nullptr;
  context_ = nullptr;
}

std::string ParseTransports(const std::string& text, bool lanes) {
  std::vector<std::string> names;
  std::set<std::string> seen;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    size_t start;
    if (lanes) {
      const size_t lane = line.find("lane[");
      if (lane == std::string_view::npos) continue;
      start = line.find(':', line.find("]:", lane) + 2);
      if (start == std::string_view::npos) continue;
      ++start;
    } else {
      if (line.find("resource") == std::string_view::npos) continue;
      start = line.find("-- ");
      if (start == std::string_view::npos) continue;
      start += 3;
    }
    const size_t slash = line.find('/', start);
    if (slash == std::string_view::npos || slash == start) continue;
    std::string name(line.substr(start, slash - start));
    if (name.find_first_of(" :") != std::string::npos) continue;
    if (seen.insert(name).second) names.push_back(name);
  }
  std::string out;
  for (const std::string& n : names) {
    if (!out.empty()) out += ',';
    out += n;
  }
  return out;
}

void WaitForWorker(const UcxApi* api, ucp_worker_h worker, int efd, Clock::time_point deadline) {
  if (api->worker_arm(worker) != UCS_OK) return;  // Busy: events are pending.
  const auto now = Clock::now();
  if (deadline <= now) return;
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now).count();
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(ns / 1000000000);
  ts.tv_nsec = static_cast<long>(ns % 1000000000);
  pollfd pfd{efd, POLLIN, 0};
  (void)ppoll(&pfd, 1, &ts, nullptr);  // EINTR or timeout: the caller loops.
}

bool ContextMapsCuda(const UcxApi* api, ucp_context_h context) {
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (api->context_query(context, &attr) != UCS_OK) return false;
  return (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
}

// kUnimplemented, saying what to do, when `context` cannot map CUDA memory.
Status CheckMapsCuda(const UcxApi* api, ucp_context_h context, const char* what) {
  if (ContextMapsCuda(api, context)) return Status::Ok();
  return UnimplementedError(std::string(what) + ": UCX " + api->version + " (" + api->path +
                            ") cannot map GPU memory (it has no CUDA support): set " + kUcxLibEnv +
                            " to the libucp.so.0 of a CUDA build, e.g. PyPI's libucx-cu12 "
                            "(docs/remote.md, \"Devices\")");
}

}  // namespace tensorlift::remote
