// Puller's pull (peer_pull.h): the handover, or the load of the pull's file
// (peer_store.h: the gets of each source rank, every chunk checked as it
// lands), and the result. docs/remote.md, "Pulling".
#include "remote/peer_pull.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <utility>

#include "remote/handover.h"
#include "remote/peer_content.h"
#include "remote/peer_faults.h"
#include "tensorlift/checksum.h"

namespace tensorlift::remote {
namespace {

using Clock = std::chrono::steady_clock;

std::atomic<uint64_t> bounce_for_testing{0};

}  // namespace

Result<LoadedCheckpoint> Puller::Pull(const std::vector<const Control*>& group,
                                      const std::vector<const PeerInfo*>& infos,
                                      std::vector<ShardOf>* shards, PeerLoadReport* report,
                                      std::string* failed_url) {
  const auto t0 = Clock::now();
  const int n = static_cast<int>(group.size());
  TL_ASSIGN_OR_RETURN(ParallelLayout layout, ParallelLayout::Parse(key_.layout));
  std::vector<PeerSession> sources(n);  // Each closes its session, whatever happens.
  TL_RETURN_IF_ERROR(OpenSessions(group, infos, &sources, failed_url));

  *failed_url = group[0]->url();
  TL_ASSIGN_OR_RETURN(std::vector<Wanted> wanted, PlanWanted(group, sources, layout, failed_url));
  shards->clear();
  for (const Wanted& w : wanted)
    shards->push_back({w.dim, w.dim >= 0 ? w.range.start : 0, w.full_shape});
  if (HandsOverWhole(sources, wanted)) {
    TakeOptions take;
    take.token = options_.token;
    take.timeout_ms = options_.connect_timeout_ms;
    take.copy_on_write = options_.handover_copy_on_write;
    take.verify = options_.handover_verify;
    take.device = device_;
    Result<LoadedCheckpoint> taken =
        TakeHandover(sources[0].manifest, group[0]->url(), sources[0].id(), take);
    if (taken.ok() && !key_.content.empty()) {
      // The mapped bytes, hashed here: a seed could publish a matching root over other bytes.
      TL_RETURN_IF_ERROR(CheckContent(*taken, key_.content, &sources[0].manifest,
                                      group[0]->url() + " (handover)"));
    }
    if (taken.ok()) {
      sources[0].pulled = taken->total_bytes();  // Counted as served when the session closes.
      report->bytes = taken->total_bytes();
      report->seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      report->source_ranks = 1;
      report->handover = true;
      failed_url->clear();
      return taken;
    }
    // Not a failure of the source: its bytes come over UCX instead.
    report->failures.push_back(group[0]->url() + ": no handover (" + taken.status().message() +
                               "); pulled over UCX");
  }

  // The destination's tensors as a store's file, loaded as any checkpoint.
  PeerStore::Options so;
  so.get.max_in_flight = options_.max_in_flight;
  so.get.max_get_bytes = options_.batch_bytes;
  so.get.stall_timeout = std::chrono::milliseconds(options_.stall_timeout_ms);
  so.get.min_rate = options_.min_rate;
  so.parallel_rank = options_.parallel.rank;
  so.fault_threads = options_.fallback_load.fault_threads;
  TL_ASSIGN_OR_RETURN(std::shared_ptr<PeerStore> store,
                      PeerStore::Make(std::move(wanted), &sources, so));
  int ranks_used = 0;
  for (int r = 0; r < n; ++r) {
    if (!store->Uses(r)) continue;
    *failed_url = group[r]->url();
    TL_RETURN_IF_ERROR(sources[r].Connect(options_.transports, options_.connect_timeout_ms));
    ++ranks_used;
  }
  *failed_url = group[0]->url();
  Result<LoadedCheckpoint> loaded = [&]() -> Result<LoadedCheckpoint> {
    TL_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::Open(PeerStore::kPath, store));
    return Load(ckpt, PullLoadOptions());
  }();
  uint64_t pulled = 0;
  for (const PeerSession& src : sources) pulled += src.pulled;
  if (!loaded.ok()) {
    if (!store->failed_url().empty()) *failed_url = store->failed_url();
    return loaded.status();
  }
  const bool direct = !loaded->files().empty() && loaded->files()[0].gds;
  CheckpointBuilder out(std::move(loaded).value());
  out.files().clear();
  AddSourceReports(group, sources, direct, &out);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  LoadedCheckpoint result = std::move(out).Finish(seconds);
  if (!key_.content.empty()) {
    // Every byte received, hashed (the chunk checks only say that the bytes are the seed's).
    TL_RETURN_IF_ERROR(CheckContent(result, key_.content, n == 1 ? &sources[0].manifest : nullptr,
                                    group[0]->url()));
  }
  report->bytes = pulled;
  report->seconds = seconds;
  report->source_ranks = ranks_used;
  failed_url->clear();
  return result;
}

LoadOptions Puller::PullLoadOptions() const {
  LoadOptions o = options_.fallback_load;
  o.filter = TensorFilter();
  o.dtype.reset();  // The seed's tensors are the key's dtype already.
  o.parallel = TensorParallel();
  o.layout.clear();  // The file holds this rank's slices.
  o.mode = IoMode::kAuto;
  o.engine = IoEngine::kAuto;
  o.threads = 0;
  o.device = options_.device;
  // The chunks are checked against the seeds' manifests as they land; the
  // content identity is hashed only when asked for (kOn), or checked against
  // PeerKey::content after the pull.
  if (o.content_hash == ContentHashMode::kAuto) o.content_hash = ContentHashMode::kOff;
  return o;
}

void BounceDevicePullsForTesting(uint64_t window) { bounce_for_testing = window; }
uint64_t BounceDevicePulls() { return bounce_for_testing; }

void Puller::AddSourceReports(const std::vector<const Control*>& group,
                              const std::vector<PeerSession>& sources, bool direct,
                              CheckpointBuilder* out) const {
  const int n = static_cast<int>(group.size());
  for (int r = 0; r < n; ++r) {
    FileReport f;
    f.path = group[r]->url();
    const std::string transports = sources[r].ucx ? sources[r].ucx->TransportsInUse() : "";
    f.reason = "peer rank " + std::to_string(r) + " of " + std::to_string(n) +
               (transports.empty() ? "" : " over UCX " + transports) +
               (device_ ? " into " + device_->name() + "'s memory" : "") +
               (device_ && !direct ? " through pinned host windows" : "") +
               (sources[r].staged == 0 ? ""
                                       : ", " + std::to_string(sources[r].staged) +
                                             " chunks split between places (got whole into "
                                             "host memory, checked, copied out)");
    f.bytes = sources[r].pulled;
    f.gds = direct;
    out->files().push_back(std::move(f));
  }
}

}  // namespace tensorlift::remote
