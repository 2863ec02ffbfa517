// UCX's context and worker (UcxCore), and what the data plane's two sides
// share: ucx_server.cc (UcxServer) and ucx_client.cc (UcxClient). Private to
// remote/: the interface is ucx_transport.h. Built when UCX is found.
#ifndef TENSORLIFT_REMOTE_UCX_CORE_H_
#define TENSORLIFT_REMOTE_UCX_CORE_H_

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "remote/ucx_api.h"
#include "remote/ucx_transport.h"
#include "tensorlift/status.h"

namespace tensorlift::remote {

inline std::string UcsText(const UcxApi* api, ucs_status_t status) {
  return api->status_string(status);
}

// Owns a UCP context and one worker; destroys them in order.
class UcxCore {
 public:
  UcxCore() = default;
  ~UcxCore() { Reset(); }
  UcxCore(UcxCore&& other) noexcept
      : api_(other.api_),
        context_(std::exchange(other.context_, nullptr)),
        worker_(std::exchange(other.worker_, nullptr)) {}
  UcxCore& operator=(UcxCore&& other) noexcept {
    if (this != &other) {
      Reset();
      api_ = other.api_;
      context_ = std::exchange(other.context_, nullptr);
      worker_ = std::exchange(other.worker_, nullptr);
    }
    return *this;
  }
  UcxCore(const UcxCore&) = delete;
  UcxCore& operator=(const UcxCore&) = delete;

  // Loads UCX and makes a context (RMA and wakeup; `options.transports`) and
  // one worker in `thread_mode`; `shared_context` for several workers on it.
  static Result<UcxCore> Create(const UcxOptions& options, ucs_thread_mode_t thread_mode,
                                bool shared_context, const char* name);

  // The UCX functions; set whenever a context is.
  const UcxApi* api() const { return api_; }
  ucp_context_h context() const { return context_; }
  ucp_worker_h worker() const { return worker_; }
  // Hands the worker to the caller, who destroys it before the context goes.
  ucp_worker_h TakeWorker() { return std::exchange(worker_, nullptr); }

 private:
  void Reset();

  const UcxApi* api_ = nullptr;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
};

// Runs a UCX print function into a string.
template <typename F>
std::string CaptureUcxPrint(F&& print) {
  char* buf = nullptr;
  size_t size = 0;
  FILE* f = open_memstream(&buf, &size);
  if (f == nullptr) return {};
  print(f);
  std::fclose(f);
  std::string out(buf != nullptr ? buf : "", size);
  std::free(buf);
  return out;
}

// Collects transport names, in order and without repeats, from UCX's printed
// info: endpoint lanes ("#  lane[0]:  0:tcp/lo.0 md[0] ...") or context
// resources ("#  resource 1  :  md 1  dev 1  flags -- tcp/lo").
std::string ParseTransports(const std::string& text, bool lanes);

// Waits until the worker has an event or `deadline` passes; returns at once
// when events are pending (the caller progresses and comes back).
void WaitForWorker(const UcxApi* api, ucp_worker_h worker, int efd,
                   std::chrono::steady_clock::time_point deadline);

// Whether `context` lists CUDA among its memory types.
bool ContextMapsCuda(const UcxApi* api, ucp_context_h context);

// kUnimplemented, saying what to do, when `context` cannot map CUDA memory.
Status CheckMapsCuda(const UcxApi* api, ucp_context_h context, const char* what);

}  // namespace tensorlift::remote

#endif  // TENSORLIFT_REMOTE_UCX_CORE_H_
