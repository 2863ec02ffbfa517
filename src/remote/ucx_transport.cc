// The UCX data plane (see ucx_transport.h). Built when UCX is found.
//
// Wire blobs. WorkerAddress() and PackedRkey() return UCX's bytes inside a
// small frame (remote/frame.h). UCX parses addresses and keys without a
// length, so Connect and AddRegion check the frame before UCX sees a byte:
// garbage is an InvalidArgument error, never a read past the end.
//
// Failure handling. Endpoints use UCP_ERR_HANDLING_MODE_PEER with an error
// handler, so a dead peer fails requests instead of hanging them. UCX cannot
// cancel RMA requests one by one, so a failed or stalled GetAll force-closes
// the endpoint, which completes every outstanding request, and progresses the
// worker until all of them are released. The client is then disconnected.
//
// Shared memory. In UCX 1.13 the posix and sysv transports refuse peer-failure
// detection, so over them the endpoint is made without it: a dead or frozen
// peer shows only as a stall (GetAll's stall_timeout). Its outstanding gets
// can then never be released, so the client abandons the connection: the
// endpoint is force-closed and the worker and context destroyed with the
// stuck requests in them (UCX warns that they were not returned). Over these
// transports a get's bytes are copied into the destination only while this
// process progresses its own worker (cma reads, or the replies of UCX's
// software RMA), so nothing writes to a destination after GetAll returns,
// even if the peer wakes up later.
#include "remote/ucx_transport.h"

#include <poll.h>
#ifdef __GLIBC__
#include <malloc.h>  // malloc_trim
#endif
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <list>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "common/checked_math.h"
#include "common/posix_file.h"
#include "remote/frame.h"
#include "remote/ucx_api.h"

namespace tensorlift::remote {
namespace {

using Clock = std::chrono::steady_clock;

Status UnavailableError(std::string message) {
  return Status(StatusCode::kUnavailable, std::move(message));
}

std::string UcsText(const UcxApi* api, ucs_status_t status) { return api->status_string(status); }

// --- Context and worker -------------------------------------------------------

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

  static Result<UcxCore> Create(const UcxOptions& options, ucs_thread_mode_t thread_mode,
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

  // The UCX functions; set whenever a context is.
  const UcxApi* api() const { return api_; }
  ucp_context_h context() const { return context_; }
  ucp_worker_h worker() const { return worker_; }
  // Hands the worker to the caller, who destroys it before the context goes.
  ucp_worker_h TakeWorker() { return std::exchange(worker_, nullptr); }

 private:
  void Reset() {
    if (worker_ != nullptr) api_->worker_destroy(worker_);
    if (context_ != nullptr) api_->cleanup(context_);
    worker_ = nullptr;
    context_ = nullptr;
  }

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

// Waits until the worker has an event or `deadline` passes; returns at once
// when events are pending (the caller progresses and comes back).
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

// --- Server -----------------------------------------------------------------

// Whether `context` lists CUDA among its memory types.
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

// One of a server's workers: its clients connect to its address.
struct ServerWorker {
  uint64_t id = 0;
  ucp_worker_h handle = nullptr;
  int efd = -1;          // The worker's event fd (UCX owns it).
  std::string address;   // Framed.
  int leases = 0;        // Clients holding it now.
  uint64_t clients = 0;  // Leases ever taken.
};

// Describes `handle` (its event fd and framed address) as a server worker;
// destroys it on failure.
Result<ServerWorker> AdoptServerWorker(const UcxApi* api, ucp_worker_h handle) {
  ServerWorker w;
  w.handle = handle;
  ucs_status_t st = api->worker_get_efd(w.handle, &w.efd);
  if (st == UCS_OK) {
    ucp_address_t* addr = nullptr;
    size_t addr_len = 0;
    st = api->worker_get_address(w.handle, &addr, &addr_len);
    if (st == UCS_OK) {
      w.address = Frame('A', addr, addr_len);
      api->worker_release_address(w.handle, addr);
      return w;
    }
  }
  api->worker_destroy(w.handle);
  return InternalError("UCX server worker (event fd, address): " + UcsText(api, st));
}

// A further worker on `context`, made as UcxCore makes the first.
Result<ServerWorker> MakeServerWorker(const UcxApi* api, ucp_context_h context) {
  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_MULTI;
  ucp_worker_h handle = nullptr;
  const ucs_status_t st = api->worker_create(context, &wparams, &handle);
  if (st != UCS_OK) return InternalError("ucp_worker_create: " + UcsText(api, st));
  return AdoptServerWorker(api, handle);
}

class UcxServerImpl final : public UcxServer {
 public:
  UcxServerImpl(UcxCore core, ServerWorker first, PosixFile wake_fd, std::string transports,
                uint64_t clients_per_worker)
      : api_(core.api()),
        core_(std::move(core)),
        wake_fd_(std::move(wake_fd)),
        transports_(std::move(transports)),
        clients_per_worker_(clients_per_worker) {
    first.id = next_id_++;
    current_ = first.id;
    workers_.push_back(std::move(first));
    thread_ = std::thread([this] { ProgressLoop(); });
  }

  ~UcxServerImpl() override {
    stop_.store(true, std::memory_order_release);
    Wake();
    thread_.join();
    for (Region& r : regions_) api_->mem_unmap(core_.context(), r.memh);
    regions_.clear();
    for (ServerWorker& w : workers_) api_->worker_destroy(w.handle);
    workers_.clear();
    // core_ destroys the context.
  }

  bool MapsCudaMemory() const override { return ContextMapsCuda(api_, core_.context()); }

  Result<uint32_t> Register(const void* data, uint64_t bytes, UcxMemory memory) override {
    if (data == nullptr || bytes == 0) {
      return InvalidArgumentError("UCX Register: empty region (data " +
                                  std::string(data ? "set" : "null") + ", " +
                                  std::to_string(bytes) + " bytes)");
    }
    uint64_t end;
    if (!CheckedAdd(reinterpret_cast<uint64_t>(data), bytes, &end)) {
      return InvalidArgumentError("UCX Register: region of " + std::to_string(bytes) +
                                  " bytes wraps the address space");
    }
    ucp_mem_map_params_t params{};
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    params.address = const_cast<void*>(data);
    params.length = bytes;
    if (memory == UcxMemory::kCuda) {
      TL_RETURN_IF_ERROR(CheckMapsCuda(api_, core_.context(), "UCX Register"));
      params.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
      params.memory_type = UCS_MEMORY_TYPE_CUDA;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (regions_.size() >= UINT32_MAX)
      return ResourceExhaustedError("UCX Register: too many regions");
    ucp_mem_h memh = nullptr;
    const ucs_status_t st = api_->mem_map(core_.context(), &params, &memh);
    if (st != UCS_OK) {
      return ResourceExhaustedError("UCX Register: ucp_mem_map of " + std::to_string(bytes) +
                                    " bytes: " + UcsText(api_, st));
    }
    // The key is the context's: it stays good for every worker of it.
    void* rkey_buf = nullptr;
    size_t rkey_size = 0;
    const ucs_status_t pst = api_->rkey_pack(core_.context(), memh, &rkey_buf, &rkey_size);
    if (pst != UCS_OK) {
      api_->mem_unmap(core_.context(), memh);
      return InternalError("UCX Register: ucp_rkey_pack: " + UcsText(api_, pst));
    }
    std::string rkey = Frame('K', rkey_buf, rkey_size);
    api_->rkey_buffer_release(rkey_buf);
    regions_.push_back(Region{reinterpret_cast<uint64_t>(data), bytes, memh, std::move(rkey)});
    return static_cast<uint32_t>(regions_.size() - 1);
  }

  std::string WorkerAddress() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return FindLocked(current_)->address;
  }

  WorkerLease Lease() override {
    std::lock_guard<std::mutex> lock(mu_);
    ServerWorker* w = FindLocked(current_);
    if (clients_per_worker_ != 0 && w->clients >= clients_per_worker_) {
      // Retire it: new clients go to a fresh worker. If one cannot be made
      // (out of memory, file descriptors), the old one serves on.
      Result<ServerWorker> fresh = MakeServerWorker(api_, core_.context());
      if (fresh.ok()) {
        fresh->id = next_id_++;
        current_ = fresh->id;
        workers_.push_back(std::move(*fresh));
        w = &workers_.back();
        Wake();  // The progress thread polls the new worker's fd.
      } else {
        w->clients = 0;  // Try again after as many clients.
      }
    }
    ++w->leases;
    ++w->clients;
    return WorkerLease{w->id, w->address};
  }

  void Unlease(uint64_t worker) override {
    std::lock_guard<std::mutex> lock(mu_);
    ServerWorker* w = FindLocked(worker);
    if (w == nullptr || w->leases == 0) return;
    if (--w->leases == 0 && w->id != current_) Wake();  // Destroyed by the progress thread.
  }

  int LiveWorkers() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(workers_.size());
  }

  Result<std::string> PackedRkey(uint32_t region) const override {
    std::lock_guard<std::mutex> lock(mu_);
    if (region >= regions_.size()) {
      return OutOfRangeError("UCX region " + std::to_string(region) + " does not exist (" +
                             std::to_string(regions_.size()) + " registered)");
    }
    return regions_[region].rkey;
  }

  uint64_t RegionAddress(uint32_t region) const override {
    std::lock_guard<std::mutex> lock(mu_);
    return region < regions_.size() ? regions_[region].address : 0;
  }

  uint64_t RegionBytes(uint32_t region) const override {
    std::lock_guard<std::mutex> lock(mu_);
    return region < regions_.size() ? regions_[region].bytes : 0;
  }

  std::string TransportsInUse() const override { return transports_; }

 private:
  struct Region {
    uint64_t address;
    uint64_t bytes;
    ucp_mem_h memh;
    std::string rkey;  // Framed.
  };

  ServerWorker* FindLocked(uint64_t id) {
    for (ServerWorker& w : workers_)
      if (w.id == id) return &w;
    return nullptr;
  }
  const ServerWorker* FindLocked(uint64_t id) const {
    return const_cast<UcxServerImpl*>(this)->FindLocked(id);
  }

  void Wake() {
    const uint64_t one = 1;
    ssize_t n;
    do {
      n = ::write(wake_fd_.fd(), &one, sizeof(one));
    } while (n < 0 && errno == EINTR);
  }

  // Answers emulated gets and wireup on every worker; sleeps in poll() on
  // the workers' event fds and the wake eventfd between events. Only this
  // thread progresses and destroys workers: a retired worker without
  // leases is taken out of workers_ under mu_ and destroyed here.
  void ProgressLoop() {
    std::vector<std::pair<ucp_worker_h, int>> live;  // Handle and event fd.
    std::vector<pollfd> fds;
    while (!stop_.load(std::memory_order_acquire)) {
      std::vector<ucp_worker_h> done;
      live.clear();
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (auto it = workers_.begin(); it != workers_.end();) {
          if (it->id != current_ && it->leases == 0) {
            done.push_back(it->handle);
            it = workers_.erase(it);
          } else {
            live.emplace_back(it->handle, it->efd);
            ++it;
          }
        }
      }
      for (ucp_worker_h w : done) api_->worker_destroy(w);
#ifdef __GLIBC__
      // What a destroyed worker frees is mostly small blocks whose pages
      // glibc would keep (about 1 KB of RSS per worker without a client,
      // hundreds with a thousand); give them back (docs/security.md, "Soak").
      if (!done.empty()) malloc_trim(0);
#endif
      bool busy = false;
      bool armed = true;
      fds.clear();
      for (const auto& [worker, efd] : live) {
        while (api_->worker_progress(worker) != 0) {
        }
        const ucs_status_t st = api_->worker_arm(worker);
        if (st == UCS_ERR_BUSY) busy = true;
        if (st != UCS_OK && st != UCS_ERR_BUSY) armed = false;
        fds.push_back({efd, POLLIN, 0});
      }
      if (busy) continue;
      fds.push_back({wake_fd_.fd(), POLLIN, 0});
      // If a worker cannot be armed, poll every millisecond instead.
      // Armed, they are still progressed every 10 ms: UCX 1.13 can miss a
      // wakeup (seen with two clients wiring up to two servers of one host
      // over tcp and shared memory at once), and a server asleep with a
      // wireup pending left its client spinning inside ucp_ep_rkey_unpack.
      const int n = ::poll(fds.data(), fds.size(), armed ? 10 : 1);
      if (n < 0 && errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (n > 0 && (fds.back().revents & POLLIN)) {
        uint64_t v;
        const ssize_t r = ::read(wake_fd_.fd(), &v, sizeof(v));  // Non-blocking: resets it.
        (void)r;
      }
    }
  }

  const UcxApi* const api_;
  UcxCore core_;  // The context (its first worker moved into workers_).
  PosixFile wake_fd_;
  const std::string transports_;
  const uint64_t clients_per_worker_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::vector<Region> regions_;      // Guarded by mu_.
  std::list<ServerWorker> workers_;  // Guarded by mu_; stable addresses.
  uint64_t current_ = 0;             // Guarded by mu_.
  uint64_t next_id_ = 1;             // Guarded by mu_.
  std::thread thread_;
};

// --- Client -----------------------------------------------------------------

class UcxClientImpl final : public UcxClient {
 public:
  explicit UcxClientImpl(UcxCore core, int efd)
      : api_(core.api()), core_(std::move(core)), efd_(efd) {}

  ~UcxClientImpl() override {
    if (abandoned_) return;  // Everything went with the abandoned worker.
    for (RemoteRegion& r : regions_) api_->rkey_destroy(r.rkey);
    regions_.clear();
    if (ep_ != nullptr) {
      // A graceful close when the peer is healthy (it then drops its side
      // without errors); forced when it is not. Bounded: the worker's
      // destruction below releases anything left.
      CloseEndpoint(/*force=*/ep_status_ != UCS_OK, std::chrono::seconds(2));
    }
    for (LocalMap& m : local_) api_->mem_unmap(core_.context(), m.memh);
    local_.clear();
  }

  // `address` is the unframed UCX worker address.
  Status Connect(const std::string& address, const std::string& /*transports_name*/,
                 std::chrono::milliseconds timeout) {
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address = reinterpret_cast<const ucp_address_t*>(address.data());
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &UcxClientImpl::OnEndpointError;
    params.err_handler.arg = this;
    ucs_status_t st;
    {
      // UCX logs the shared-memory transports' refusal (below) as an error,
      // on stdout; it is expected here, so quiet for this one call.
      char level[64] = "";
      const bool saved = api_->global_opts_get_value("LOG_LEVEL", level, sizeof level) == UCS_OK;
      if (saved) (void)api_->global_opts_set_value("LOG_LEVEL", "fatal");
      st = api_->ep_create(core_.worker(), &params, &ep_);
      if (saved) (void)api_->global_opts_set_value("LOG_LEVEL", level);
    }
    if (st == UCS_ERR_UNREACHABLE) {
      // Shared memory (see the top of this file): no peer-failure detection;
      // stalls end the pull, and a failed client abandons its worker.
      ep_ = nullptr;
      params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
      params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
      st = api_->ep_create(core_.worker(), &params, &ep_);
      if (st == UCS_OK) detects_failures_ = false;
    }
    if (st != UCS_OK) {
      ep_ = nullptr;
      return UnavailableError("UCX connect: ucp_ep_create: " + UcsText(api_, st));
    }
    // Creating an endpoint does not contact the peer; a flush waits for the
    // wireup to finish, so it fails or times out when the peer is not there.
    ucp_request_param_t fparam{};
    void* req = api_->ep_flush_nbx(ep_, &fparam);
    ucs_status_t result = UCS_OK;
    const auto deadline = Clock::now() + timeout;
    if (UCS_PTR_IS_ERR(req)) {
      result = UCS_PTR_STATUS(req);
    } else if (req != nullptr) {
      for (;;) {
        while (api_->worker_progress(core_.worker()) != 0) {
        }
        result = api_->request_check_status(req);
        if (result != UCS_INPROGRESS) break;
        if (Clock::now() >= deadline) break;
        WaitForWorker(api_, core_.worker(), efd_,
                      std::min(deadline, Clock::now() + std::chrono::milliseconds(50)));
      }
      if (result == UCS_INPROGRESS) {
        if (!detects_failures_) {
          Abandon();
          return UnavailableError("UCX connect: the peer did not answer within " +
                                  std::to_string(timeout.count()) + " ms");
        }
        // Timed out: the forced close completes the flush with an error.
        CloseEndpoint(/*force=*/true, std::chrono::seconds(30));
        api_->request_free(req);  // Released now or when UCX completes it.
        return UnavailableError("UCX connect: the peer did not answer within " +
                                std::to_string(timeout.count()) + " ms");
      }
      api_->request_free(req);
    }
    if (result == UCS_OK && ep_status_ != UCS_OK) result = ep_status_;
    if (result != UCS_OK) {
      CloseEndpoint(/*force=*/true, std::chrono::seconds(30));
      return UnavailableError("UCX connect: " + UcsText(api_, result));
    }
    transports_ = ParseTransports(CaptureUcxPrint([this](FILE* f) { api_->ep_print_info(ep_, f); }),
                                  /*lanes=*/true);
    return Status::Ok();
  }

  Result<uint32_t> AddRegion(std::string_view packed_rkey, uint64_t remote_address,
                             uint64_t bytes) override {
    TL_RETURN_IF_ERROR(CheckConnected());
    TL_ASSIGN_OR_RETURN(std::string rkey_bytes, Unframe(packed_rkey, 'K', "UCX remote key"));
    uint64_t end;
    if (bytes == 0 || !CheckedAdd(remote_address, bytes, &end)) {
      return InvalidArgumentError("UCX remote region [" + std::to_string(remote_address) + ", +" +
                                  std::to_string(bytes) + ") is empty or wraps the address space");
    }
    if (regions_.size() >= UINT32_MAX)
      return ResourceExhaustedError("UCX AddRegion: too many regions");
    ucp_rkey_h rkey = nullptr;
    const ucs_status_t st = api_->ep_rkey_unpack(ep_, rkey_bytes.data(), &rkey);
    if (st != UCS_OK)
      return InvalidArgumentError("UCX remote key: ucp_ep_rkey_unpack: " + UcsText(api_, st));
    regions_.push_back(RemoteRegion{rkey, remote_address, bytes});
    return static_cast<uint32_t>(regions_.size() - 1);
  }

  Status MapLocal(void* data, uint64_t bytes, UcxMemory memory) override {
    uint64_t end;
    if (data == nullptr || bytes == 0 ||
        !CheckedAdd(reinterpret_cast<uint64_t>(data), bytes, &end)) {
      return InvalidArgumentError("UCX MapLocal: empty or wrapping range of " +
                                  std::to_string(bytes) + " bytes");
    }
    ucp_mem_map_params_t params{};
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    params.address = data;
    params.length = bytes;
    if (memory == UcxMemory::kCuda) {
      TL_RETURN_IF_ERROR(CheckMapsCuda(api_, core_.context(), "UCX MapLocal"));
      params.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
      params.memory_type = UCS_MEMORY_TYPE_CUDA;
    }
    ucp_mem_h memh = nullptr;
    const ucs_status_t st = api_->mem_map(core_.context(), &params, &memh);
    if (st != UCS_OK) {
      return ResourceExhaustedError("UCX MapLocal: ucp_mem_map of " + std::to_string(bytes) +
                                    " bytes: " + UcsText(api_, st));
    }
    local_.push_back(LocalMap{reinterpret_cast<uint64_t>(data), end, memh});
    return Status::Ok();
  }

  // Checks every get, then issues pieces and progresses the worker until all
  // have landed, the run fails, or it stalls (FailGets cleans up).
  Status GetAll(const std::vector<Get>& gets, const GetOptions& options) override {
    TL_RETURN_IF_ERROR(CheckGets(gets, options));
    GetRun run(gets, options);
    run.SkipEmpty();
    while ((run.next_get < gets.size() || !run.in_flight.empty()) && run.failure == UCS_OK) {
      if (options.cancelled && options.cancelled()) {
        run.failure = UCS_ERR_CANCELED;
        break;
      }
      const Clock::time_point rate_wait = IssueGets(&run);
      if (run.failure != UCS_OK) break;
      if (!ProgressGets(&run, rate_wait)) break;
    }
    if (run.failure == UCS_OK && !run.stalled) return Status::Ok();
    // Ended by this side (cancelled, or too slow) while the peer still answers:
    // let the gets in flight land (in the staging they were aimed at) before the
    // endpoint is closed. A reply that UCX 1.13's software RMA sends into a
    // connection closed under it aborts the *source* ("ucp_request.inl:346
    // Fatal: unexpected error: Endpoint timeout" in ucp_get_req_handler).
    if (run.failure == UCS_ERR_CANCELED || run.too_slow) Drain(&run);
    return FailGets(&run);
  }

  std::string TransportsInUse() const override { return transports_; }

 private:
  struct RemoteRegion {
    ucp_rkey_h rkey;
    uint64_t address;
    uint64_t bytes;
  };
  struct LocalMap {
    uint64_t begin;
    uint64_t end;
    ucp_mem_h memh;
  };

  // A get request issued and not yet released: a piece of gets[get].
  struct InFlight {
    void* request;
    size_t get;
    uint64_t bytes;
  };

  // One GetAll's state: the cursor of the next piece to issue, the requests
  // in flight, and how the run ended (failed or stalled).
  struct GetRun {
    GetRun(const std::vector<Get>& g, const GetOptions& o) : gets(g), options(o) {
      in_flight.reserve(static_cast<size_t>(options.max_in_flight));
      remaining.resize(gets.size());
      for (size_t i = 0; i < gets.size(); ++i) remaining[i] = gets[i].bytes;
      start = Clock::now();
      last_event = start;
    }

    // Counts a landed piece; reports its get once all of it has landed.
    void FinishPiece(size_t get, uint64_t bytes) {
      landed_bytes += bytes;
      remaining[get] -= bytes;
      if (remaining[get] == 0 && options.on_done) options.on_done(get);
    }

    // Skips (and reports) empty gets at the cursor.
    void SkipEmpty() {
      while (next_get < gets.size() && gets[next_get].bytes == 0) {
        if (options.on_done) options.on_done(next_get);
        ++next_get;
      }
    }

    const std::vector<Get>& gets;
    const GetOptions& options;
    std::vector<InFlight> in_flight;
    std::vector<uint64_t> remaining;  // Bytes of each get not landed yet.
    size_t next_get = 0;              // The get being split and issued.
    uint64_t next_offset = 0;         // Within it.
    uint64_t issued_bytes = 0;        // For the rate limit.
    uint64_t landed_bytes = 0;        // For the minimum rate.
    Clock::time_point start;
    Clock::time_point last_event;  // Last completion, or first issue after idle.
    ucs_status_t failure = UCS_OK;
    bool stalled = false;
    bool too_slow = false;  // Below min_rate (counts as stalled).
  };

  // GetAll's arguments: positive limits, a connection, and every get inside
  // its region with a destination, checked before any is issued.
  Status CheckGets(const std::vector<Get>& gets, const GetOptions& options) const {
    if (options.max_in_flight < 1 || options.max_get_bytes == 0 ||
        options.stall_timeout.count() <= 0) {
      return InvalidArgumentError(
          "UCX GetAll: max_in_flight " + std::to_string(options.max_in_flight) +
          ", max_get_bytes " + std::to_string(options.max_get_bytes) + " and stall_timeout " +
          std::to_string(options.stall_timeout.count()) + " ms must all be positive");
    }
    TL_RETURN_IF_ERROR(CheckConnected());
    for (size_t i = 0; i < gets.size(); ++i) {
      const Get& g = gets[i];
      if (g.region >= regions_.size()) {
        return OutOfRangeError("UCX get " + std::to_string(i) + ": region " +
                               std::to_string(g.region) + " does not exist (" +
                               std::to_string(regions_.size()) + " added)");
      }
      uint64_t end;
      if (!CheckedAdd(g.offset, g.bytes, &end) || end > regions_[g.region].bytes) {
        return OutOfRangeError("UCX get " + std::to_string(i) + ": [" + std::to_string(g.offset) +
                               ", +" + std::to_string(g.bytes) + ") runs past the end of region " +
                               std::to_string(g.region) + " (" +
                               std::to_string(regions_[g.region].bytes) + " bytes)");
      }
      uint64_t dst_end;
      if (g.bytes > 0 &&
          (g.dst == nullptr || !CheckedAdd(reinterpret_cast<uint64_t>(g.dst), g.bytes, &dst_end))) {
        return InvalidArgumentError("UCX get " + std::to_string(i) +
                                    ": null or wrapping destination");
      }
    }
    return Status::Ok();
  }

  // Issues pieces (of at most max_get_bytes) while slots and the rate limit
  // allow; sets run->failure when UCX refuses one. Returns when the rate
  // limit allows the next piece (time_point::max() when it did not stop it).
  Clock::time_point IssueGets(GetRun* run) {
    const GetOptions& options = run->options;
    const auto now = Clock::now();
    while (run->next_get < run->gets.size() &&
           run->in_flight.size() < static_cast<size_t>(options.max_in_flight)) {
      if (options.rate_limit > 0) {
        const long double ns =
            static_cast<long double>(run->issued_bytes) * 1e9L / options.rate_limit;
        const auto allowed = run->start + std::chrono::nanoseconds(static_cast<int64_t>(ns));
        if (allowed > now) return allowed;
      }
      const Get& g = run->gets[run->next_get];
      const uint64_t piece = std::min(options.max_get_bytes, g.bytes - run->next_offset);
      void* req = PostGet(g, run->next_offset, piece);
      if (UCS_PTR_IS_ERR(req)) {
        run->failure = UCS_PTR_STATUS(req);
        break;
      }
      if (run->in_flight.empty()) run->last_event = now;
      run->issued_bytes += piece;
      const size_t get_index = run->next_get;
      run->next_offset += piece;
      if (run->next_offset == g.bytes) {
        ++run->next_get;
        run->next_offset = 0;
      }
      if (req == nullptr) {
        run->FinishPiece(get_index, piece);
        run->last_event = now;
      } else {
        run->in_flight.push_back(InFlight{req, get_index, piece});
      }
      run->SkipEmpty();
    }
    return Clock::time_point::max();
  }

  // Posts the get of `bytes` at `offset` within `g`: a request, null when it
  // completed at once, or an error pointer.
  void* PostGet(const Get& g, uint64_t offset, uint64_t bytes) {
    const RemoteRegion& r = regions_[g.region];
    char* dst = static_cast<char*>(g.dst) + offset;
    ucp_request_param_t param{};
    if (ucp_mem_h memh = LocalMemh(dst, bytes)) {
      param.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
      param.memh = memh;
    }
    return api_->get_nbx(ep_, dst, bytes, r.address + g.offset + offset, r.rkey, &param);
  }

  // Progresses the worker and takes in the completed requests; when nothing
  // happened, sleeps until an event, `rate_wait`, or the stall deadline (at
  // most 50 ms). False when the run failed or stalled.
  bool ProgressGets(GetRun* run, Clock::time_point rate_wait) {
    unsigned progressed = 0;
    for (int i = 0; i < 64; ++i) {
      const unsigned n = api_->worker_progress(core_.worker());
      progressed += n;
      if (n == 0) break;
    }
    const bool completed = ReapCompleted(run);
    if (run->failure != UCS_OK) return false;
    if (ep_status_ != UCS_OK) {
      run->failure = ep_status_;
      return false;
    }
    const auto now = Clock::now();
    if (TooSlow(*run, now)) {
      run->stalled = run->too_slow = true;
      return false;
    }
    if (completed) {
      run->last_event = now;
      return true;
    }
    const auto stall_timeout = run->options.stall_timeout;
    if (!run->in_flight.empty() && now - run->last_event >= stall_timeout) {
      run->stalled = true;
      return false;
    }
    if (progressed > 0) return true;
    auto deadline = now + std::chrono::milliseconds(50);
    if (!run->in_flight.empty()) deadline = std::min(deadline, run->last_event + stall_timeout);
    if (rate_wait != Clock::time_point::max()) deadline = std::min(deadline, rate_wait);
    WaitForWorker(api_, core_.worker(), efd_, deadline);
    return true;
  }

  // Progresses the worker until the run's gets in flight have all finished (or
  // failed), for at most stall_timeout; issues nothing new.
  void Drain(GetRun* run) {
    const auto deadline = Clock::now() + run->options.stall_timeout;
    const ucs_status_t ended = run->failure;
    while (!run->in_flight.empty() && Clock::now() < deadline && ep_status_ == UCS_OK) {
      for (int i = 0; i < 64 && api_->worker_progress(core_.worker()) > 0; ++i) {
      }
      ReapCompleted(run);
      if (!run->in_flight.empty()) {
        WaitForWorker(api_, core_.worker(), efd_,
                      std::min(deadline, Clock::now() + std::chrono::milliseconds(50)));
      }
    }
    run->failure = ended;  // Why the run ended, not how a drained get did.
  }

  // Once a run is stall_timeout old, it must have averaged min_rate: a peer
  // that lets a get finish just often enough never stalls (a slowloris).
  static bool TooSlow(const GetRun& run, Clock::time_point now) {
    const uint64_t min_rate = run.options.min_rate;
    const auto elapsed = now - run.start;
    if (min_rate == 0 || elapsed < run.options.stall_timeout) return false;
    const long double seconds = std::chrono::duration<long double>(elapsed).count();
    return static_cast<long double>(run.landed_bytes) <
           static_cast<long double>(min_rate) * seconds;
  }

  // Releases the requests that have finished, counting the pieces that landed
  // and keeping the first error in run->failure; true when any piece landed.
  bool ReapCompleted(GetRun* run) const {
    std::vector<InFlight>& in_flight = run->in_flight;
    bool completed = false;
    for (size_t i = 0; i < in_flight.size();) {
      const ucs_status_t st = api_->request_check_status(in_flight[i].request);
      if (st == UCS_INPROGRESS) {
        ++i;
        continue;
      }
      api_->request_free(in_flight[i].request);
      const InFlight done = in_flight[i];
      in_flight[i] = in_flight.back();
      in_flight.pop_back();
      if (st != UCS_OK) {
        if (run->failure == UCS_OK) run->failure = st;
        continue;
      }
      completed = true;
      run->FinishPiece(done.get, done.bytes);
    }
    return completed;
  }

  // Ends a failed or stalled run: closes the endpoint so UCX completes every
  // outstanding request, then releases them; nothing writes to a destination
  // after this. Over shared memory the connection is abandoned instead.
  Status FailGets(GetRun* run) {
    const bool stalled = run->stalled;
    const ucs_status_t failure = run->failure;
    const std::string stall_why =
        run->too_slow
            ? "too slow: " + std::to_string(run->landed_bytes) + " bytes landed in " +
                  std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                     Clock::now() - run->start)
                                     .count()) +
                  " ms, below the minimum of " + std::to_string(run->options.min_rate) + " bytes/s"
            : "no get finished within " + std::to_string(run->options.stall_timeout.count()) +
                  " ms";
    const size_t outstanding = run->in_flight.size();
    if (!detects_failures_) {
      Abandon();  // Never progressed again: its gets cannot land.
      return UnavailableError(
          "UCX GetAll: " +
          std::string(stalled ? stall_why : "get failed: " + UcsText(api_, failure)) + " (" +
          std::to_string(outstanding) +
          " outstanding gets abandoned with the connection: shared memory "
          "has no peer-failure detection)");
    }
    const ucs_status_t ep_status = ep_status_;
    CloseEndpoint(/*force=*/true, std::chrono::hours(24));  // Forced close always completes.
    if (!ReleaseAfterClose(&run->in_flight, Clock::now() + std::chrono::seconds(30))) {
      return InternalError("UCX GetAll: " + std::to_string(run->in_flight.size()) +
                           " requests were not released after the endpoint was closed");
    }
    const std::string cancelled =
        " (" + std::to_string(outstanding) + " outstanding gets cancelled)";
    if (stalled) {
      return UnavailableError("UCX GetAll: " + stall_why + cancelled);
    }
    const ucs_status_t shown = ep_status != UCS_OK ? ep_status : failure;
    return UnavailableError("UCX GetAll: get failed: " + UcsText(api_, shown) + cancelled);
  }

  // Progresses the worker until every request of `in_flight` (on a closed
  // endpoint) has completed, freeing each; false when some are still there at
  // `deadline`.
  bool ReleaseAfterClose(std::vector<InFlight>* in_flight, Clock::time_point deadline) {
    while (!in_flight->empty()) {
      api_->worker_progress(core_.worker());
      for (size_t i = 0; i < in_flight->size();) {
        if (api_->request_check_status((*in_flight)[i].request) == UCS_INPROGRESS) {
          ++i;
          continue;
        }
        api_->request_free((*in_flight)[i].request);
        (*in_flight)[i] = in_flight->back();
        in_flight->pop_back();
      }
      if (!in_flight->empty() && Clock::now() > deadline) return false;
    }
    return true;
  }

  // Gives up the connection over a transport without peer-failure
  // detection: the endpoint is closed (forced, not waited for) and the worker
  // and context destroyed with the stuck gets inside them, so nothing can
  // progress them again; UCX reports their requests as not returned.
  void Abandon() {
    if (ep_ != nullptr) {
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      param.flags = UCP_EP_CLOSE_FLAG_FORCE;
      void* req = api_->ep_close_nbx(ep_, &param);
      (void)req;  // Released with the worker.
      ep_ = nullptr;
    }
    for (RemoteRegion& r : regions_) api_->rkey_destroy(r.rkey);
    regions_.clear();
    for (LocalMap& m : local_) api_->mem_unmap(core_.context(), m.memh);
    local_.clear();
    core_ = UcxCore();  // ucp_worker_destroy, ucp_cleanup.
    abandoned_ = true;
    if (ep_status_ == UCS_OK) ep_status_ = UCS_ERR_NOT_CONNECTED;
  }

  static void OnEndpointError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
    auto* self = static_cast<UcxClientImpl*>(arg);
    if (self->ep_status_ == UCS_OK)
      self->ep_status_ = status == UCS_OK ? UCS_ERR_CONNECTION_RESET : status;
  }

  Status CheckConnected() const {
    if (ep_ == nullptr) {
      return UnavailableError(
          "UCX: the connection to the peer was closed after an earlier error (" +
          UcsText(api_, ep_status_ != UCS_OK ? ep_status_ : UCS_ERR_NOT_CONNECTED) + ")");
    }
    return Status::Ok();
  }

  ucp_mem_h LocalMemh(const void* dst, uint64_t bytes) const {
    const uint64_t begin = reinterpret_cast<uint64_t>(dst);
    for (const LocalMap& m : local_) {
      if (begin >= m.begin && begin + bytes <= m.end) return m.memh;
    }
    return nullptr;
  }

  // Closes ep_ and progresses until the close completes or `limit` passes.
  void CloseEndpoint(bool force, std::chrono::milliseconds limit) {
    if (ep_ == nullptr) return;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    void* req = api_->ep_close_nbx(ep_, &param);
    ep_ = nullptr;
    if (ep_status_ == UCS_OK) ep_status_ = UCS_ERR_NOT_CONNECTED;
    if (req == nullptr || UCS_PTR_IS_ERR(req)) return;
    const auto deadline = Clock::now() + limit;
    while (api_->request_check_status(req) == UCS_INPROGRESS && Clock::now() < deadline) {
      if (api_->worker_progress(core_.worker()) == 0) {
        WaitForWorker(api_, core_.worker(), efd_,
                      std::min(deadline, Clock::now() + std::chrono::milliseconds(10)));
      }
    }
    if (api_->request_check_status(req) != UCS_INPROGRESS) api_->request_free(req);
    // Else the worker's destruction releases it.
  }

  const UcxApi* const api_;  // Outlives core_: UCX stays loaded.
  UcxCore core_;
  int efd_;
  bool detects_failures_ = true;  // False over shared memory (see the top).
  bool abandoned_ = false;
  ucp_ep_h ep_ = nullptr;
  ucs_status_t ep_status_ = UCS_OK;  // First endpoint error; set by the error handler.
  std::vector<RemoteRegion> regions_;
  std::vector<LocalMap> local_;
  std::string transports_;
};

Result<int> WorkerEventFd(const UcxCore& core) {
  int efd = -1;
  const ucs_status_t st = core.api()->worker_get_efd(core.worker(), &efd);
  if (st != UCS_OK)
    return UnimplementedError("UCX worker has no event fd: " + UcsText(core.api(), st));
  return efd;
}

}  // namespace

bool UcxBuilt() { return true; }

namespace {

// What a context with default options says of the loaded UCX, asked once per
// process (one context for both answers).
struct UcxProbe {
  bool maps_cuda = false;
  std::string transports;
};

const UcxProbe& Probe() {
  static const UcxProbe probe = [] {
    UcxProbe p;
    if (!LoadUcx().ok()) return p;
    Result<std::unique_ptr<UcxServer>> server = UcxServer::Create(UcxOptions{});
    if (server.ok()) {
      p.maps_cuda = (*server)->MapsCudaMemory();
      p.transports = (*server)->TransportsInUse();
    }
    return p;
  }();
  return probe;
}

}  // namespace

bool UcxMapsCudaMemory() { return Probe().maps_cuda; }

std::string UcxChoiceReason() {
  Result<const UcxApi*> api = LoadUcx();
  return api.ok() ? (*api)->choice : std::string();
}

std::string UcxTransports() { return Probe().transports; }

std::string UcxCudaModule() {
  Result<const UcxApi*> api = LoadUcx();
  if (!api.ok()) return {};
  const std::string& lib = (*api)->path;
  const size_t slash = lib.rfind('/');
  if (slash == std::string::npos) return {};
  const std::string module = lib.substr(0, slash) + "/ucx/libuct_cuda.so.0";
  return ::access(module.c_str(), F_OK) == 0 ? module : std::string();
}

std::string UcxVersion() {
  Result<const UcxApi*> api = LoadUcx();
  if (!api.ok()) return "not loadable: " + std::string(api.status().message());
  return (*api)->version + " (" + (*api)->path + ")";
}

Result<std::unique_ptr<UcxServer>> UcxServer::Create(const UcxOptions& options) {
  TL_ASSIGN_OR_RETURN(UcxCore core, UcxCore::Create(options, UCS_THREAD_MODE_MULTI,
                                                    /*shared_context=*/true, "tensorlift-server"));
  const UcxApi* api = core.api();
  TL_ASSIGN_OR_RETURN(ServerWorker first, AdoptServerWorker(api, core.TakeWorker()));
  const int wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    api->worker_destroy(first.handle);
    return PosixError("eventfd", errno);
  }
  PosixFile wake_fd = PosixFile::Adopt(wake);
  std::string transports =
      ParseTransports(CaptureUcxPrint([&](FILE* f) { api->context_print_info(core.context(), f); }),
                      /*lanes=*/false);
  if (transports.empty()) transports = options.transports.empty() ? "default" : options.transports;
  return std::unique_ptr<UcxServer>(new UcxServerImpl(std::move(core), std::move(first),
                                                      std::move(wake_fd), std::move(transports),
                                                      options.clients_per_worker));
}

Result<std::unique_ptr<UcxClient>> UcxClient::Connect(std::string_view worker_address,
                                                      const UcxOptions& options,
                                                      std::chrono::milliseconds timeout) {
  // Checked before UCX is started: garbage costs nothing.
  TL_ASSIGN_OR_RETURN(std::string address, Unframe(worker_address, 'A', "UCX worker address"));
  TL_ASSIGN_OR_RETURN(UcxCore core, UcxCore::Create(options, UCS_THREAD_MODE_SERIALIZED,
                                                    /*shared_context=*/false, "tensorlift-client"));
  TL_ASSIGN_OR_RETURN(int efd, WorkerEventFd(core));
  auto client = std::make_unique<UcxClientImpl>(std::move(core), efd);
  TL_RETURN_IF_ERROR(client->Connect(
      address, options.transports.empty() ? "default" : options.transports, timeout));
  return std::unique_ptr<UcxClient>(std::move(client));
}

}  // namespace tensorlift::remote
