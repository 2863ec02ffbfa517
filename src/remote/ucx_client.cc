// UcxClient (see ucx_transport.h): one endpoint to a server's worker and
// one-sided gets from its regions. Built when UCX is found.
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
#include <algorithm>
#include <chrono>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/checked_math.h"
#include "remote/frame.h"
#include "remote/ucx_core.h"
#include "remote/ucx_transport.h"
#include "tensorlift/remote.h"

namespace tensorlift::remote {
namespace {

using Clock = std::chrono::steady_clock;

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
      if ((options.cancelled && options.cancelled()) || PeerPullsStopped()) {
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
    // When it was judged so, what had landed and what was in flight.
    Clock::time_point too_slow_at;
    uint64_t too_slow_landed = 0;
    uint64_t too_slow_in_flight = 0;
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
      // Nothing is posted on an endpoint found failed (UCX 1.22 aborted a
      // process that posted a get on one its keepalive had timed out).
      if (ep_status_ != UCS_OK) {
        run->failure = ep_status_;
        break;
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
      run->too_slow_at = now;
      run->too_slow_landed = run->landed_bytes;
      for (const InFlight& f : run->in_flight) run->too_slow_in_flight += f.bytes;
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
    uint64_t in_flight = 0;
    for (const InFlight& f : run.in_flight) in_flight += f.bytes;
    return BelowMinRate(run.options, run.landed_bytes, in_flight, now - run.start);
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
            ? "too slow: " + std::to_string(run->too_slow_landed) + " bytes landed (and " +
                  std::to_string(run->too_slow_in_flight) + " in flight) in " +
                  std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                     run->too_slow_at - run->start)
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

bool BelowMinRate(const UcxClient::GetOptions& options, uint64_t landed, uint64_t in_flight,
                  std::chrono::steady_clock::duration elapsed) {
  if (options.min_rate == 0 || elapsed < options.stall_timeout) return false;
  const long double seconds = std::chrono::duration<long double>(elapsed).count();
  return static_cast<long double>(landed) + static_cast<long double>(in_flight) <
         static_cast<long double>(options.min_rate) * seconds;
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
