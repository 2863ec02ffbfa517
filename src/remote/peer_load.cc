// LoadFromPeer: find compatible sources, check the key before any byte moves,
// validate each manifest, pull one-sided in bounded batches, verify every
// chunk, and fall back (next source, then disk) on any failure, discarding
// what was pulled. docs/remote.md, "Pulling".
//
// The steps: peer_pull.h (Puller: a pull from one group of source ranks),
// peer_store.h (the pull as a store's file, loaded by Load), peer_content.h
// (the content check); here, finding the sources, trying them, and the
// fallback.
#include "remote/peer_load.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <set>

#include "device/device.h"
#include "format/tp_layout.h"
#include "load/upload.h"
#include "remote/control.h"
#include "remote/handover.h"
#include "remote/manifest.h"
#include "remote/peer_access.h"
#include "remote/peer_content.h"
#include "remote/peer_pull.h"
#include "remote/peer_session.h"
#include "remote/server.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/checksum.h"
#include "tensorlift/dtype.h"

namespace tensorlift {
namespace remote {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

// The device of PeerLoadOptions::device, or null for host memory.
Result<std::shared_ptr<Device>> DestinationDevice(const PeerLoadOptions& options) {
  const DeviceId& dev = options.device;
  const DeviceId& fallback = options.fallback_load.device;
  if (!fallback.on_host() && fallback != dev) {
    return InvalidArgumentError("peer load: fallback_load.device \"" + fallback.Name() +
                                "\" differs from PeerLoadOptions::device \"" + dev.Name() +
                                "\" (set PeerLoadOptions::device: it applies to peers and disk)");
  }
  if (dev.on_host()) return std::shared_ptr<Device>();
  return OpenDevice(dev.type, dev.index);
}

namespace {

// One rule for the peers and the disk fallback: the options that shape the
// tensors (which ones, their dtype) are the key's, so that a load gives the
// same tensors from a peer or from disk; the fallback's others are its own.
// The dtype the fallback converts to (the key's), or what is refused.
Result<std::optional<Dtype>> FallbackDtype(const PeerKey& key, const PeerLoadOptions& options) {
  const LoadOptions& disk = options.fallback_load;
  if (!disk.filter.all()) {
    return InvalidArgumentError(
        "peer load: fallback_load.filter: a peer load takes every tensor its key names, from a "
        "peer or from disk (filter the result, or Load the files)");
  }
  // The key's dtype is what a seed converted to: the fallback converts to it
  // when the loader converts to it (F32, F16, BF16), and takes any other as
  // stored.
  std::optional<Dtype> want;
  if (key.dtype == Dtype::kF32 || key.dtype == Dtype::kF16 || key.dtype == Dtype::kBF16) {
    want = key.dtype;
  }
  if (disk.dtype && disk.dtype != want) {
    return InvalidArgumentError(
        "peer load: fallback_load.dtype " + std::string(DtypeName(*disk.dtype)) +
        " differs from PeerKey::dtype " + std::string(PeerKeyDtypeName(key.dtype)) +
        " (set PeerKey::dtype: it applies to peers and disk)");
  }
  return want;
}

// The checks before anything is asked of a peer.
Status CheckPeerLoad(const PeerKey& key, const ParallelLayout& layout,
                     const PeerLoadOptions& options) {
  if (!key.content.empty() && options.parallel.size > 1 && !layout.empty()) {
    return InvalidArgumentError(
        "peer load: key.content names a whole checkpoint's bytes; tensor parallel rank " +
        std::to_string(options.parallel.rank) + " of " + std::to_string(options.parallel.size) +
        " receives slices of it and cannot check it");
  }
  return CheckRank(options.parallel, "peer load");
}

// The endpoints that can serve `key`, each with its control connection and
// what it said of itself: this host's resident seed, the given ones, then the
// registry's live seeds. Those that cannot are listed in report->failures.
struct Endpoints {
  std::vector<std::string> urls;
  std::vector<Control> controls;
  std::vector<PeerInfo> infos;
};

Endpoints FindEndpoints(const PeerKey& key, const PeerLoadOptions& options,
                        PeerLoadReport* report) {
  Endpoints e;
  e.urls = PeerUrlsFor(key, options.peers, options.registry, options.request_timeout_ms,
                       &report->failures);
  if (options.local) {
    // This rank's seed, else a seed of the whole model.
    for (const TensorParallel& at : {options.parallel, TensorParallel{1, 0}}) {
      Result<std::string> local =
          FindLocalSeed(key.Digest(), at.rank, at.size, options.request_timeout_ms);
      if (!local.ok()) continue;
      if (std::find(e.urls.begin(), e.urls.end(), *local) == e.urls.end())
        e.urls.insert(e.urls.begin(), *local);
      break;
    }
  }
  e.controls.reserve(e.urls.size());
  for (const std::string& url : e.urls) {
    auto c = Control::Make(url, options.token, options.request_timeout_ms);
    if (!c.ok()) {
      report->failures.push_back(url + ": " + c.status().message());
      continue;
    }
    Result<PeerInfo> info = AskKey(*c, key);
    if (!info.ok()) {
      report->failures.push_back(info.status().message());
      continue;
    }
    if (!key.content.empty() && info->parallel.size == 1 && !info->content.empty() &&
        info->content != key.content) {
      report->failures.push_back(url + ": content differs: expected " + key.content +
                                 ", the seed's is " + info->content);
      continue;
    }
    e.controls.push_back(std::move(c).value());
    e.infos.push_back(std::move(info).value());
  }
  return e;
}

// A seed's host memory handed over (mapped, not copied) and a fallback
// loader's sliced load are in host memory: a device destination gets a copy.
Result<LoadedCheckpoint> Place(Result<LoadedCheckpoint> r, const std::shared_ptr<Device>& device) {
  if (!r.ok() || !device || r->tensors().empty() ||
      r->tensors().front().device != DeviceType::kCpu) {
    return r;
  }
  return UploadToDevice(std::move(r).value(), device);
}

// Pulls from source groups by size (the destination's own size first), each
// rank's endpoints least loaded first; a failed endpoint is dropped and the
// group tried again while every rank still has one. Empty: no group worked
// (each failure in report->failures).
std::optional<LoadedCheckpoint> PullFromGroups(const PeerKey& key, const PeerLoadOptions& options,
                                               const std::shared_ptr<Device>& device,
                                               const Endpoints& e, PeerLoadReport* report,
                                               std::vector<ShardOf>* shards) {
  std::map<int, std::vector<std::vector<size_t>>> groups;  // size -> rank -> endpoint indexes.
  for (size_t i = 0; i < e.infos.size(); ++i) {
    auto& g = groups[e.infos[i].parallel.size];
    g.resize(e.infos[i].parallel.size);
    g[e.infos[i].parallel.rank].push_back(i);
  }
  std::vector<int> sizes;
  if (groups.count(options.parallel.size)) sizes.push_back(options.parallel.size);
  for (const auto& [size, g] : groups) {
    if (size != options.parallel.size) sizes.push_back(size);
  }
  std::set<size_t> failed;
  Puller puller(key, options, device);
  std::vector<const PeerInfo*> pick_infos;
  for (int size : sizes) {
    auto& g = groups[size];
    for (auto& endpoints : g) {
      std::stable_sort(endpoints.begin(), endpoints.end(),
                       [&](size_t a, size_t b) { return e.infos[a].load < e.infos[b].load; });
    }
    for (;;) {
      std::vector<const Control*> pick;
      pick_infos.clear();
      std::string missing;
      for (int r = 0; r < size; ++r) {
        auto it =
            std::find_if(g[r].begin(), g[r].end(), [&](size_t i) { return !failed.count(i); });
        if (it == g[r].end()) {
          missing = "rank " + std::to_string(r);
          break;
        }
        pick.push_back(&e.controls[*it]);
        pick_infos.push_back(&e.infos[*it]);
      }
      if (!missing.empty()) {
        report->failures.push_back("sources of size " + std::to_string(size) +
                                   ": no live endpoint for " + missing);
        break;
      }
      std::string failed_url;
      auto loaded = Place(puller.Pull(pick, pick_infos, shards, report, &failed_url), device);
      if (loaded.ok()) {
        std::string used;
        for (const Control* c : pick) used += (used.empty() ? "" : ",") + c->url();
        report->source = used;
        return std::move(loaded).value();
      }
      report->failures.push_back(loaded.status().message());
      size_t culprit = 0;
      for (int r = 0; r < size; ++r) {
        if (pick[r]->url() == failed_url)
          culprit = static_cast<size_t>(pick[r] - e.controls.data());
      }
      if (failed_url.empty()) culprit = static_cast<size_t>(pick[0] - e.controls.data());
      failed.insert(culprit);
    }
  }
  return std::nullopt;
}

// No peer worked: the files at fallback_path, as a peer would have sent them
// (the key's dtype, this rank's slices). A path opened here (Checkpoint::Open
// or fallback_open) is loaded by Load, slices and all, straight to the
// destination; a fallback loader's load is whole, cut on the host when sliced
// (its tensors' full shapes are the seed's to serve).
Result<LoadedCheckpoint> LoadFallback(const PeerKey& key, const ParallelLayout& layout,
                                      const PeerLoadOptions& options, std::optional<Dtype> dtype,
                                      const std::shared_ptr<Device>& device, PeerLoadReport* report,
                                      std::vector<ShardOf>* shards) {
  if (PeerPullsStopped()) return UnavailableError("peer load: stopped (StopPeerPulls)");
  if (options.fallback_path.empty()) {
    std::string why;
    for (const auto& f : report->failures) why += "\n  " + f;
    return UnavailableError("peer load: no peer worked and there is no fallback path:" + why);
  }
  LoadOptions disk = options.fallback_load;
  disk.dtype = dtype;  // The key's: the tensors a peer would have sent.
  disk.device = options.device;
  std::optional<LoadedCheckpoint> mine;
  if (!options.fallback_loader) {
    const std::string source =
        options.fallback_open ? options.fallback_path : "disk:" + options.fallback_path;
    TL_ASSIGN_OR_RETURN(Checkpoint ckpt, options.fallback_open
                                             ? options.fallback_open(options.fallback_path)
                                             : Checkpoint::Open(options.fallback_path));
    TL_ASSIGN_OR_RETURN(*shards, ShardsOf(ckpt, disk.filter, layout, options.parallel));
    if (!layout.empty()) {
      disk.parallel = options.parallel;
      disk.layout = key.layout;
    }
    TL_ASSIGN_OR_RETURN(mine, Load(ckpt, disk));
    if (!key.content.empty()) {  // Never with slices (CheckPeerLoad).
      TL_RETURN_IF_ERROR(CheckContent(*mine, key.content, nullptr, source));
    }
    report->source = source;
  } else {
    const bool whole_tensors = options.parallel.size == 1 || layout.empty();
    if (!whole_tensors) disk.device = DeviceId::Cpu();
    TL_ASSIGN_OR_RETURN(LoadedCheckpoint whole,
                        options.fallback_loader(options.fallback_path, disk));
    if (!key.content.empty()) {
      TL_RETURN_IF_ERROR(
          CheckContent(whole, key.content, nullptr, "disk:" + options.fallback_path));
    }
    TL_ASSIGN_OR_RETURN(
        mine, Place(SliceForRank(std::move(whole), layout, options.parallel, shards), device));
    report->source = options.fallback_path;
  }
  report->bytes = mine->total_bytes();
  report->source_ranks = 0;
  return std::move(*mine);
}

}  // namespace

// The load, and each tensor's shard (for become-a-seed).
Result<LoadedCheckpoint> LoadFromPeerWithShards(const PeerKey& key, const PeerLoadOptions& options,
                                                PeerLoadReport* report,
                                                std::vector<ShardOf>* shards) {
  const auto t0 = Clock::now();
  PeerLoadReport local;
  if (!report) report = &local;
  *report = PeerLoadReport();
  TL_RETURN_IF_ERROR(key.Validate());
  TL_ASSIGN_OR_RETURN(ParallelLayout layout, ParallelLayout::Parse(key.layout));
  TL_RETURN_IF_ERROR(CheckPeerLoad(key, layout, options));
  TL_ASSIGN_OR_RETURN(const std::shared_ptr<Device> device, DestinationDevice(options));
  TL_ASSIGN_OR_RETURN(const std::optional<Dtype> dtype, FallbackDtype(key, options));
  const Endpoints endpoints = FindEndpoints(key, options, report);
  std::optional<LoadedCheckpoint> pulled =
      PullFromGroups(key, options, device, endpoints, report, shards);
  if (!pulled) {
    if (endpoints.urls.empty()) report->failures.push_back("no peers given and none found");
    Result<LoadedCheckpoint> disk =
        LoadFallback(key, layout, options, dtype, device, report, shards);
    if (!disk.ok()) return disk.status();
    pulled = std::move(disk).value();
  }
  report->seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return std::move(*pulled);
}

}  // namespace remote

namespace remote {

Result<PeerLoad> PullAndSeed(const PeerKey& key, const PeerLoadOptions& options) {
  PeerLoad out;
  std::vector<ShardOf> shards;
  TL_ASSIGN_OR_RETURN(LoadedCheckpoint loaded,
                      LoadFromPeerWithShards(key, options, &out.report, &shards));
  out.loaded = std::make_shared<const LoadedCheckpoint>(std::move(loaded));
  if (options.become_seed) {
    TL_ASSIGN_OR_RETURN(out.seed,
                        ServeShards(out.loaded, std::move(shards), key, SeedOptions(options)));
  }
  return out;
}

ServeOptions SeedOptions(const PeerLoadOptions& options) {
  ServeOptions seed = options.seed;
  if (seed.registry.empty()) seed.registry = options.registry;
  if (seed.token.empty()) seed.token = options.token;
  if (seed.transports.empty()) seed.transports = options.transports;
  seed.parallel = options.parallel;
  return seed;
}

}  // namespace remote

Result<PeerKey> PeerKeyForCheckpoint(const std::string& path) {
  TL_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::Open(path));
  return PeerKeyForCheckpoint(ckpt);
}

Result<PeerKey> PeerKeyForCheckpoint(const Checkpoint& ckpt) {
  const std::string& path = ckpt.path();
  std::string desc;
  for (const auto& loc : ckpt.tensors()) {
    const TensorInfo& t = ckpt.info(loc);
    desc += t.name;
    desc += '\0';
    desc += DtypeName(t.dtype);
    for (uint64_t d : t.shape) desc += "," + std::to_string(d);
    desc += ";" + std::to_string(t.nbytes()) + "\n";
  }
  PeerKey key;
  std::string name = path;
  while (name.size() > 1 && name.back() == '/') name.pop_back();
  name = name.substr(name.find_last_of('/') == std::string::npos ? 0 : name.find_last_of('/') + 1);
  for (const char* suffix : {".safetensors.index.json", ".safetensors"}) {
    const std::string s(suffix);
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
      name.resize(name.size() - s.size());
    }
  }
  if (name == "model" || name.empty()) {  // model.safetensors: the directory's name says more.
    std::string dir =
        path.substr(0, path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/'));
    const size_t slash = dir.find_last_of('/');
    if (!dir.empty()) name = dir.substr(slash == std::string::npos ? 0 : slash + 1);
  }
  key.model = name.empty() ? "model" : name;
  key.revision = "h:" + HexU64(Xxh3_64(desc.data(), desc.size()));
  return key;
}

Result<HandoverMode> ParseHandoverMode(std::string_view name) {
  if (name == "auto") return HandoverMode::kAuto;
  if (name == "off") return HandoverMode::kOff;
  return InvalidArgumentError("peer load: handover \"" + std::string(name) +
                              "\" is not \"auto\" or \"off\"");
}

std::string_view HandoverModeName(HandoverMode mode) {
  return mode == HandoverMode::kOff ? "off" : "auto";
}

namespace {
std::atomic<bool> pulls_stopped{false};  // StopPeerPulls.
}  // namespace

void StopPeerPulls() { pulls_stopped.store(true, std::memory_order_relaxed); }
bool PeerPullsStopped() { return pulls_stopped.load(std::memory_order_relaxed); }

}  // namespace tensorlift
