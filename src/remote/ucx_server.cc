// UcxServer (see ucx_transport.h): a context whose regions are mapped once,
// and workers that clients connect to, answered by one progress thread.
// Built when UCX is found.
#include <poll.h>
#ifdef __GLIBC__
#include <malloc.h>  // malloc_trim
#endif
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <list>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "common/checked_math.h"
#include "common/posix_file.h"
#include "remote/frame.h"
#include "remote/ucx_core.h"
#include "remote/ucx_transport.h"

namespace tensorlift::remote {
namespace {

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

}  // namespace

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

}  // namespace tensorlift::remote
