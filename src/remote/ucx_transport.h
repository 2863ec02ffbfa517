// The data plane over UCX (docs/remote.md, "Data plane"): the source maps its
// memory once in a few large regions and publishes its worker address and
// packed remote keys; a client connects an endpoint and reads one-sided
// (ucp_get_nbx), so the source does no per-tensor work. Over transports
// without hardware RMA (TCP) UCX emulates the get, which the source's
// progress thread answers; it sleeps in ucp_worker_wait between events.
//
// Built from ucx_transport.cc when UCX is found (TENSORLIFT_WITH_UCX), else
// from ucx_none.cc, whose functions return kUnimplemented "built without
// UCX ...". UCX itself is loaded at run time (remote/ucx_api.h): Debian's
// libucp.so.0, or the build TENSORLIFT_UCX_LIB names; when it cannot be
// loaded, UcxServer::Create and UcxClient::Connect return kUnavailable.
// Thread safety: UcxServer's methods may be called from any thread; a
// UcxClient is used by one thread at a time.
#ifndef TENSORLIFT_REMOTE_UCX_TRANSPORT_H_
#define TENSORLIFT_REMOTE_UCX_TRANSPORT_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tensorlift/status.h"

namespace tensorlift::remote {

// Built with UCX's headers (the library is loaded at run time).
bool UcxBuilt();
// Whether the loaded UCX can map CUDA memory (UcxServer::MapsCudaMemory of a
// context with default options; asked once per process). False when UCX
// cannot be loaded.
bool UcxMapsCudaMemory();
// The loaded UCX's version and file ("1.13.1 (libucp.so.0)"), loading it
// if needed; "not loadable: <why>" when it cannot be loaded; why not built.
std::string UcxVersion();
// The transports of the loaded UCX (a default context's resources: "tcp, sysv,
// posix, self, cma"); empty when UCX cannot be loaded. Asked once per process.
std::string UcxTransports();
// Why the loaded UCX build was chosen (TENSORLIFT_UCX_LIB, PyPI's libucx-cuNN
// beside tensorlift, or the system's, and why); empty when none loads.
std::string UcxChoiceReason();
// The loaded UCX build's CUDA transport module (<libucp's folder>/ucx/libuct_cuda.so.0)
// when it ships one, else empty.
std::string UcxCudaModule();

struct UcxOptions {
  // UCX_TLS syntax ("tcp", "sm,self", "rc,cuda_copy"); empty: UCX's default
  // or the UCX_TLS environment variable. Applied through ucp_config_modify,
  // not the environment.
  std::string transports;
  // Servers only: how many clients (leases, below) a worker takes before new
  // clients go to a fresh worker; the old one is destroyed once its last
  // lease ends. UCX keeps a few dozen bytes for every peer a worker has met
  // until the worker is destroyed (its connection-matching table), so a
  // source that serves for days needs this to stay flat. 0: one worker for
  // the server's life.
  uint64_t clients_per_worker = 1024;
};

// Where a region's bytes live: host memory, or a CUDA device's memory
// (ucp_mem_map with UCS_MEMORY_TYPE_CUDA; needs a UCX built with CUDA, such as
// PyPI's libucx-cu12 through TENSORLIFT_UCX_LIB).
enum class UcxMemory { kHost, kCuda };

class UcxServer {
 public:
  // A context and worker with a progress thread.
  static Result<std::unique_ptr<UcxServer>> Create(const UcxOptions& options);
  virtual ~UcxServer() = default;
  // Maps [data, data + bytes) for remote reads (ucp_mem_map); the memory must
  // stay valid until the server is destroyed. Returns the region's index.
  // kCuda memory is refused (kUnimplemented, before the address is
  // used) when the loaded UCX has no CUDA support.
  virtual Result<uint32_t> Register(const void* data, uint64_t bytes,
                                    UcxMemory memory = UcxMemory::kHost) = 0;
  // Whether the loaded UCX can map CUDA memory (its context reports
  // UCS_MEMORY_TYPE_CUDA among its memory types).
  virtual bool MapsCudaMemory() const = 0;
  // The address of the worker new clients are given (Lease). Framed bytes.
  virtual std::string WorkerAddress() const = 0;
  // A client's hold on a worker: its address stays served until Unlease.
  // Every client connects through a lease (one per session), so that a
  // worker is destroyed only when no client can still be using it.
  struct WorkerLease {
    uint64_t worker = 0;  // The worker's id, for Unlease.
    std::string address;  // Framed, as WorkerAddress().
  };
  virtual WorkerLease Lease() = 0;
  virtual void Unlease(uint64_t worker) = 0;
  // Workers alive now (the current one and retired ones with leases).
  virtual int LiveWorkers() const = 0;
  virtual Result<std::string> PackedRkey(uint32_t region) const = 0;  // Raw bytes.
  virtual uint64_t RegionAddress(uint32_t region) const = 0;
  virtual uint64_t RegionBytes(uint32_t region) const = 0;
  // Transports UCX chose ("tcp", "posix,cma", ...), for reports.
  virtual std::string TransportsInUse() const = 0;
};

class UcxClient {
 public:
  // Connects to a server's worker; kUnavailable after `timeout`.
  static Result<std::unique_ptr<UcxClient>> Connect(std::string_view worker_address,
                                                    const UcxOptions& options,
                                                    std::chrono::milliseconds timeout);
  virtual ~UcxClient() = default;
  // Unpacks a region's remote key; returns its index for Get::region.
  virtual Result<uint32_t> AddRegion(std::string_view packed_rkey, uint64_t remote_address,
                                     uint64_t bytes) = 0;
  // Maps local memory that gets land in (optional for host memory, where it
  // makes gets zero-copy; needed for kCuda memory, refused with
  // kUnimplemented when the loaded UCX has no CUDA support).
  virtual Status MapLocal(void* data, uint64_t bytes, UcxMemory memory = UcxMemory::kHost) = 0;

  struct Get {
    uint32_t region = 0;
    uint64_t offset = 0;  // In the region.
    uint64_t bytes = 0;
    void* dst = nullptr;
  };
  struct GetOptions {
    int max_in_flight = 16;
    uint64_t max_get_bytes = 8ull << 20;  // Larger gets are split.
    uint64_t rate_limit = 0;              // Bytes/s this client paces itself to (0: none).
    std::chrono::milliseconds stall_timeout{10000};  // Longest wait with no get finishing.
    // Bytes/s the run must average once it is stall_timeout old (0: no floor),
    // its gets in flight counted as arriving; below it the run ends as a
    // stall would.
    uint64_t min_rate = 0;
    // Called (on this thread) as each Get of `gets` has fully landed.
    std::function<void(size_t index)> on_done;
    // Asked between progress rounds: true ends the run at once, its
    // outstanding gets cancelled (kUnavailable, "cancelled"), e.g. once a
    // landed chunk failed its check and the rest are not worth pulling.
    std::function<bool()> cancelled;
  };
  // Reads every get; bounds-checked against its region (kOutOfRange) before
  // any is issued. kUnavailable when a get fails (peer gone) or stalls; the
  // outstanding requests are cancelled before returning, so no get writes to
  // `dst` after this returns.
  virtual Status GetAll(const std::vector<Get>& gets, const GetOptions& options) = 0;
  virtual std::string TransportsInUse() const = 0;
};

// Whether a run `elapsed` old, of which `landed` bytes have landed and
// `in_flight` are in gets not yet finished, is below options.min_rate
// (GetAll ends it then). A piece counts once it has landed whole, and a
// source serving several clients (or many pieces of one) may send the pieces'
// bytes interleaved, so that they land late and together: the bytes in flight
// count as arriving. An honest link at min_rate or more is never judged too
// slow; a slowloris is, once what it holds in flight (max_in_flight x
// max_get_bytes at most) no longer covers its time at min_rate.
bool BelowMinRate(const UcxClient::GetOptions& options, uint64_t landed, uint64_t in_flight,
                  std::chrono::steady_clock::duration elapsed);

}  // namespace tensorlift::remote

#endif  // TENSORLIFT_REMOTE_UCX_TRANSPORT_H_
