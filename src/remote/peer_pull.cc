// Puller's pull (peer_pull.h): the handover or the gets of each source rank,
// every chunk checked as it lands, and the result. docs/remote.md, "Pulling".
#include "remote/peer_pull.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <utility>

#include "device/populate.h"
#include "remote/handover.h"
#include "remote/peer_content.h"
#include "remote/peer_faults.h"
#include "tensorlift/checksum.h"

namespace tensorlift::remote {
namespace {

using Clock = std::chrono::steady_clock;

// A bounced pull's window of pinned host memory, at least (a chunk's bytes if more).
constexpr uint64_t kBounceWindow = 32ull << 20;

std::atomic<uint64_t> bounce_for_testing{0};

// Closes every session a pull opened (DELETE, with the bytes pulled), whatever
// happens.
struct SessionCloser {
  std::vector<Source>* s;
  ~SessionCloser() {
    for (Source& src : *s) {
      src.ucx.reset();
      if (!src.session.empty()) {
        src.control->Send("DELETE", "/v1/session/" + src.session, std::to_string(src.pulled), 1024)
            .status()
            .IgnoreError();
      }
    }
  }
};

}  // namespace

Result<LoadedCheckpoint> Puller::Pull(const std::vector<const Control*>& group,
                                      const std::vector<const PeerInfo*>& infos,
                                      std::vector<ShardOf>* shards, PeerLoadReport* report,
                                      std::string* failed_url) {
  const auto t0 = Clock::now();
  const int n = static_cast<int>(group.size());
  TL_ASSIGN_OR_RETURN(ParallelLayout layout, ParallelLayout::Parse(key_.layout));
  std::vector<Source> sources(n);
  // Declared before the closer, so that on an error the UCX clients (which
  // map it) are closed before the buffer is freed.
  Landing landing;
  SessionCloser closer{&sources};
  for (int r = 0; r < n; ++r) sources[r].info = infos[r];
  TL_RETURN_IF_ERROR(OpenSessions(group, &sources, failed_url));

  *failed_url = group[0]->url();
  TL_ASSIGN_OR_RETURN(std::vector<Wanted> wanted, PlanWanted(group, sources, layout, failed_url));
  if (HandsOverWhole(sources, wanted)) {
    TakeOptions take;
    take.token = options_.token;
    take.timeout_ms = options_.connect_timeout_ms;
    take.copy_on_write = options_.handover_copy_on_write;
    take.verify = options_.handover_verify;
    take.device = device_;
    Result<LoadedCheckpoint> taken =
        TakeHandover(sources[0].manifest, group[0]->url(), sources[0].session, take);
    if (taken.ok() && !key_.content.empty()) {
      // The mapped bytes, hashed here: a seed could publish a matching root over other bytes.
      TL_RETURN_IF_ERROR(CheckContent(*taken, key_.content, &sources[0].manifest,
                                      group[0]->url() + " (handover)"));
    }
    if (taken.ok()) {
      sources[0].pulled = taken->total_bytes();  // Counted as served when the session closes.
      shards->clear();
      for (const Wanted& w : wanted)
        shards->push_back({w.dim, w.dim >= 0 ? w.range.start : 0, w.full_shape});
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
  TL_ASSIGN_OR_RETURN(uint64_t total, PlaceWanted(group[0]->url(), &wanted));
  TL_RETURN_IF_ERROR(Allocate(total, &landing));
  // Fresh host memory is faulted in by helper threads ahead of the gets, as
  // a disk load does (docs/loading.md, "Memory"): first touches cost more
  // than the transfer itself on the machine measured (docs/remote.md).
  // That includes the emulated device's memory, which UCX writes through
  // the host's mapping; a GPU's memory is not the host's to fault.
  std::vector<PopulateAhead::Region> fresh;
  if (landing.memory == UcxMemory::kHost && !landing.bounced) {
    fresh.push_back({landing.visible, landing.size});
  }
  PopulateAhead populate(fresh, FaultThreadCount(options_.fallback_load.fault_threads));

  int ranks_used = 0;
  uint64_t pulled = 0;
  for (int r = 0; r < n; ++r) {
    *failed_url = group[r]->url();
    TL_ASSIGN_OR_RETURN(bool used, PullRank(r, n, group[r]->url(), wanted, landing, &sources[r]));
    if (!used) continue;
    ++ranks_used;
    pulled += sources[r].pulled;
  }

  CheckpointBuilder out;
  AddPulledTensors(wanted, landing, &out, shards);
  AddSourceReports(group, sources, landing, &out);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!key_.content.empty()) {
    // Every byte received, hashed (the chunk checks only say that the bytes are the seed's).
    LoadedCheckpoint result = std::move(out).Finish(seconds);
    TL_RETURN_IF_ERROR(CheckContent(result, key_.content, n == 1 ? &sources[0].manifest : nullptr,
                                    group[0]->url()));
    report->bytes = pulled;
    report->seconds = seconds;
    report->source_ranks = ranks_used;
    failed_url->clear();
    return result;
  }
  report->bytes = pulled;
  report->seconds = seconds;
  report->source_ranks = ranks_used;
  failed_url->clear();
  return std::move(out).Finish(seconds);
}

Result<bool> Puller::PullRank(int r, int n, const std::string& url,
                              const std::vector<Wanted>& wanted, Landing& landing,
                              Source* src) const {
  RankPlan plan;
  const bool sends_whole = r == options_.parallel.rank % n;
  TL_RETURN_IF_ERROR(PlanRankGets(src->manifest, wanted, sends_whole, landing.visible, &plan));
  if (plan.gets.empty()) return false;
  TL_RETURN_IF_ERROR(ConnectSource(url, src));
  for (auto& g : plan.gets) g.region = src->regions[g.region];
  Status got = Status::Ok();
  if (landing.bounced) {
    const uint64_t window = std::max(BounceDevicePulls() ? BounceDevicePulls() : kBounceWindow,
                                     src->manifest.chunk_bytes);
    if (!landing.bounce || landing.bounce->size() < 2 * window) {
      landing.bounce.reset();
      TL_ASSIGN_OR_RETURN(landing.bounce, landing.device->AllocatePinned(2 * window));
    }
    TL_RETURN_IF_ERROR(
        src->ucx->MapLocal(landing.bounce->data(), landing.bounce->size(), UcxMemory::kHost));
    got = GetBounced(url, plan, landing, src);
  } else {
    TL_RETURN_IF_ERROR(src->ucx->MapLocal(landing.visible, landing.size, landing.memory));
    got = GetVerified(url, plan, landing, src);
  }
  if (!got.ok()) {
    // No copy of this pull may still run when the buffer is freed.
    if (landing.stream) landing.stream->Synchronize().IgnoreError();
    return got;
  }
  TL_RETURN_IF_ERROR(CopyStaged(plan.staged, landing));
  src->transports = src->ucx->TransportsInUse();
  src->ucx.reset();
  return true;
}

Status Puller::ConnectSource(const std::string& url, Source* src) const {
  UcxOptions uo;
  uo.transports = options_.transports;
  auto ucx = UcxClient::Connect(src->manifest.worker_address, uo,
                                std::chrono::milliseconds(options_.connect_timeout_ms));
  if (!ucx.ok()) return ucx.status().WithContext(url);  // Name the source.
  src->ucx = std::move(ucx).value();
  for (const Region& region : src->manifest.regions) {
    if (region.rkey.empty()) {
      return PermissionDeniedError(url + ": the manifest has no remote keys");
    }
    auto idx = src->ucx->AddRegion(region.rkey, region.address, region.bytes);
    if (!idx.ok()) return idx.status().WithContext(url);
    src->regions.push_back(*idx);
  }
  return Status::Ok();
}

Status Puller::GetVerified(const std::string& url, const RankPlan& plan, Landing& landing,
                           Source* src) const {
  const Manifest& mf = src->manifest;
  const std::vector<UcxClient::Get>& gets = plan.gets;
  UcxClient::GetOptions go;
  go.max_in_flight = options_.max_in_flight;
  go.max_get_bytes = options_.batch_bytes;
  go.rate_limit = mf.rate_limit;
  go.stall_timeout = std::chrono::milliseconds(options_.stall_timeout_ms);
  go.min_rate = options_.min_rate;
  Status bad = Status::Ok();
  std::vector<size_t> on_device;  // Gets landed in device memory: checked after.
  go.on_done = [&](size_t i) {
    const RankPlan::Chunk& c = plan.chunks[i];
    src->pulled += gets[i].bytes;
    if (!bad.ok()) return;
    if (landing.OnDevice(c.dst)) {
      on_device.push_back(i);
      return;
    }
    bad = CheckChunk(url, mf, c, gets[i].bytes, Xxh3_64(c.dst, gets[i].bytes));
  };
  // A chunk that failed its check ends the pull: the rest is not worth pulling.
  go.cancelled = [&] { return !bad.ok(); };
  Status got = src->ucx->GetAll(gets, go).WithContext(url);
  TL_RETURN_IF_ERROR(bad);
  TL_RETURN_IF_ERROR(got);
  return CheckStaged(url, mf, plan, on_device, landing);
}

Status Puller::GetBounced(const std::string& url, const RankPlan& plan, Landing& landing,
                          Source* src) const {
  // The gets into staging chunks land where planned; those into the device's
  // buffer, in its order, window by window.
  RankPlan host;
  std::vector<size_t> order;
  for (size_t i = 0; i < plan.gets.size(); ++i) {
    if (landing.OnDevice(static_cast<const std::byte*>(plan.gets[i].dst))) {
      order.push_back(i);
    } else {
      host.gets.push_back(plan.gets[i]);
      host.chunks.push_back(plan.chunks[i]);
    }
  }
  if (!host.gets.empty()) TL_RETURN_IF_ERROR(GetVerified(url, host, landing, src));
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return plan.gets[a].dst < plan.gets[b].dst; });
  const uint64_t window = landing.bounce->size() / 2;
  std::unique_ptr<DeviceEvent> copied[2];
  for (auto& event : copied) {
    TL_ASSIGN_OR_RETURN(event, landing.device->CreateEvent());
  }
  bool pending[2] = {false, false};
  auto run = [&]() -> Status {
    int half = 0;
    for (size_t k = 0; k < order.size(); half ^= 1) {
      // The gets from k on whose bytes lie within a window of the first's.
      const auto* lo = static_cast<const std::byte*>(plan.gets[order[k]].dst);
      std::byte* into = landing.bounce->data() + half * window;
      RankPlan w;
      for (; k < order.size(); ++k) {
        UcxClient::Get g = plan.gets[order[k]];
        const auto* dst = static_cast<const std::byte*>(g.dst);
        if (dst + g.bytes > lo + window) break;
        g.dst = into + (dst - lo);
        RankPlan::Chunk c = plan.chunks[order[k]];
        c.dst = static_cast<std::byte*>(g.dst);
        w.gets.push_back(g);
        w.chunks.push_back(c);
      }
      if (w.gets.empty()) return InternalError(url + ": a get larger than the bounce window");
      // The copies out of this half, two windows ago, are done before it is refilled.
      if (pending[half]) TL_RETURN_IF_ERROR(copied[half]->Synchronize());
      TL_RETURN_IF_ERROR(GetVerified(url, w, landing, src));  // Checked on the host.
      // Up to the device in runs: gets next to each other are one copy.
      for (size_t j = 0; j < w.gets.size();) {
        const auto* at = static_cast<const std::byte*>(w.gets[j].dst);
        uint64_t bytes = 0;
        for (; j < w.gets.size() && static_cast<const std::byte*>(w.gets[j].dst) == at + bytes;
             ++j) {
          bytes += w.gets[j].bytes;
        }
        TL_RETURN_IF_ERROR(
            landing.stream->CopyToDevice(landing.DeviceAddress(lo + (at - into)), at, bytes));
      }
      TL_RETURN_IF_ERROR(landing.stream->Record(*copied[half]));
      pending[half] = true;
    }
    return Status::Ok();
  };
  const Status ran = run();
  // No copy out of the windows may run once they are freed or refilled.
  const Status drained = landing.stream->Synchronize();
  return ran.ok() ? drained : ran;
}

Status Puller::CheckChunk(const std::string& url, const Manifest& mf, const RankPlan::Chunk& c,
                          uint64_t bytes, uint64_t sum) {
  if (sum == c.t->chunk_xxh3[c.index]) return Status::Ok();
  return CorruptionError(url + ": tensor '" + c.t->name + "' chunk " + std::to_string(c.index) +
                         " (bytes " + std::to_string(c.index * mf.chunk_bytes) + ".." +
                         std::to_string(c.index * mf.chunk_bytes + bytes) + "): XXH3 " +
                         HexU64(sum) + ", the manifest says " + HexU64(c.t->chunk_xxh3[c.index]));
}

Status Puller::CheckStaged(const std::string& url, const Manifest& mf, const RankPlan& plan,
                           const std::vector<size_t>& gets, Landing& landing) {
  if (gets.empty()) return Status::Ok();
  uint64_t largest = 0;
  for (size_t i : gets) largest = std::max(largest, plan.gets[i].bytes);
  const uint64_t window = std::max<uint64_t>(largest, 16ull << 20);
  // Windows: runs of gets (in landing order) whose bytes fit in one window.
  std::vector<std::pair<size_t, size_t>> windows;  // [begin, end) in `gets`.
  for (size_t b = 0; b < gets.size();) {
    size_t e = b;
    for (uint64_t used = 0; e < gets.size() && used + plan.gets[gets[e]].bytes <= window; ++e) {
      used += plan.gets[gets[e]].bytes;
    }
    windows.push_back({b, e});
    b = e;
  }
  std::shared_ptr<Buffer> staging[2];
  std::unique_ptr<DeviceEvent> copied[2];
  for (int k = 0; k < 2 && k < static_cast<int>(windows.size()); ++k) {
    TL_ASSIGN_OR_RETURN(staging[k], landing.device->AllocatePinned(window));
    TL_ASSIGN_OR_RETURN(copied[k], landing.device->CreateEvent());
  }
  auto issue = [&](size_t w) -> Status {
    std::byte* to = staging[w % 2]->data();
    for (size_t j = windows[w].first; j < windows[w].second; ++j) {
      const UcxClient::Get& g = plan.gets[gets[j]];
      TL_RETURN_IF_ERROR(landing.stream->CopyToHost(
          to, landing.DeviceAddress(static_cast<const std::byte*>(g.dst)), g.bytes));
      to += g.bytes;
    }
    return landing.stream->Record(*copied[w % 2]);
  };
  auto check = [&]() -> Status {
    TL_RETURN_IF_ERROR(issue(0));
    for (size_t w = 0; w < windows.size(); ++w) {
      TL_RETURN_IF_ERROR(copied[w % 2]->Synchronize());
      if (w + 1 < windows.size()) TL_RETURN_IF_ERROR(issue(w + 1));
      const std::byte* at = staging[w % 2]->data();
      for (size_t j = windows[w].first; j < windows[w].second; ++j) {
        const uint64_t bytes = plan.gets[gets[j]].bytes;
        TL_RETURN_IF_ERROR(CheckChunk(url, mf, plan.chunks[gets[j]], bytes, Xxh3_64(at, bytes)));
        at += bytes;
      }
    }
    return Status::Ok();
  };
  const Status checked = check();
  // No copy into the staging buffers may run once they are freed.
  const Status drained = landing.stream->Synchronize();
  return checked.ok() ? drained : checked;
}

Status Puller::Allocate(uint64_t total, Landing* landing) const {
  if (device_) {
    Result<std::shared_ptr<Buffer>> b = device_->Allocate(total);
    if (!b.ok()) {
      return b.status().WithContext("peer load: " + std::to_string(total) + " bytes on " +
                                    device_->name());
    }
    const bool cuda = device_->kind() == DeviceType::kCuda;
    std::byte* visible =
        cuda ? (UcxMapsCudaMemory() ? (*b)->data() : nullptr) : (*b)->host_mapping();
    if (BounceDevicePulls() != 0) visible = nullptr;
    TL_ASSIGN_OR_RETURN(landing->stream, device_->CreateStream());
    landing->buffer = std::move(b).value();
    landing->size = landing->buffer->size();
    landing->device = device_;
    landing->bounced = visible == nullptr;
    // Bounced: the plan's addresses are the device's, never written by UCX.
    landing->visible = landing->bounced ? landing->buffer->data() : visible;
    landing->memory = cuda && !landing->bounced ? UcxMemory::kCuda : UcxMemory::kHost;
    return Status::Ok();
  }
  TL_ASSIGN_OR_RETURN(std::shared_ptr<HostBuffer> host, HostBuffer::Allocate(total));
  landing->visible = host->data();
  landing->size = host->size();
  landing->buffer = std::move(host);
  return Status::Ok();
}

void BounceDevicePullsForTesting(uint64_t window) { bounce_for_testing = window; }
uint64_t BounceDevicePulls() { return bounce_for_testing; }

void Puller::AddPulledTensors(const std::vector<Wanted>& wanted, const Landing& landing,
                              CheckpointBuilder* out, std::vector<ShardOf>* shards) {
  out->Reserve(wanted.size());
  shards->clear();
  if (landing.device) out->set_device(landing.device);
  for (const Wanted& w : wanted) {
    LoadedTensor t;
    t.name = w.name;
    t.dtype = w.dtype;
    t.shape = w.shape;
    SetRowMajorStrides(&t);
    t.data = landing.buffer->data() + w.offset;
    t.nbytes = w.nbytes;
    if (landing.device) {
      t.device = landing.device->kind();
      t.device_index = landing.device->ordinal();
    }
    out->Add(std::move(t), landing.buffer);
    shards->push_back({w.dim, w.dim >= 0 ? w.range.start : 0, w.full_shape});
  }
}

void Puller::AddSourceReports(const std::vector<const Control*>& group,
                              const std::vector<Source>& sources, const Landing& landing,
                              CheckpointBuilder* out) {
  const int n = static_cast<int>(group.size());
  for (int r = 0; r < n; ++r) {
    FileReport f;
    f.path = group[r]->url();
    f.reason = "peer rank " + std::to_string(r) + " of " + std::to_string(n) +
               (sources[r].transports.empty() ? "" : " over UCX " + sources[r].transports) +
               (landing.device ? " into " + landing.device->name() + "'s memory" : "") +
               (landing.bounced ? " through pinned host windows" : "");
    f.bytes = sources[r].pulled;
    out->files().push_back(std::move(f));
  }
}

}  // namespace tensorlift::remote
