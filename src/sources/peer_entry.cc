// The public peer loads (include/tensorlift/remote.h): a pull with a registry
// relays where it can (relay.h), else, and when relaying finds no whole seed
// or fails, it loads as remote/peer_load.cc does (a group of source ranks,
// then the fallback). Here, above both, because a relaying pull is a
// striped load over the root seed and the relays.
#include <optional>

#include "remote/peer_load.h"
#include "sources/relay.h"
#include "tensorlift/remote.h"

namespace tensorlift {
namespace {

constexpr int kLingerMs = 60000;  // The longest a finished relay serves on.

// The relaying pull when it applies and works; else nullopt, with what it met
// in `met` (the usual pull's report leads with it).
std::optional<sources::Relayed> TryRelay(const PeerKey& key, const PeerLoadOptions& options,
                                         PeerLoadReport* report, std::vector<std::string>* met) {
  if (!sources::WhyNotRelay(key, options).empty()) return std::nullopt;
  Result<sources::Relayed> r = sources::RelayPull(key, options, report);
  if (!r.ok()) {
    *met = report->failures;
    // A same-host root: handed over by the usual pull, not a failure.
    if (r.status().code() != StatusCode::kUnimplemented) met->push_back(r.status().message());
    *report = PeerLoadReport();
    return std::nullopt;
  }
  report->bytes = r->loaded.total_bytes();
  for (const PeerLoadReport::Source& s : report->sources) {
    if (s.bytes) report->source += (report->source.empty() ? "" : ",") + s.url;
  }
  return std::move(r).value();
}

void Lead(std::vector<std::string> met, PeerLoadReport* report) {
  met.insert(met.end(), report->failures.begin(), report->failures.end());
  report->failures = std::move(met);
}

}  // namespace

Result<LoadedCheckpoint> LoadFromPeer(const PeerKey& key, const PeerLoadOptions& options,
                                      PeerLoadReport* report) {
  if (options.fallback_load.on_tensor) {
    return InvalidArgumentError(
        "peer loading: LoadOptions::on_tensor applies to Load, not to peer loads");
  }
  PeerLoadReport local;
  if (!report) report = &local;
  *report = PeerLoadReport();
  std::vector<std::string> met;
  if (std::optional<sources::Relayed> r = TryRelay(key, options, report, &met)) {
    // It serves the holders still pulling from it; the tensors' memory is kept
    // alive by it too meanwhile, and never written again.
    sources::Linger(*r, kLingerMs);
    return std::move(r->loaded);
  }
  if (PeerPullsStopped()) return UnavailableError("peer load: stopped (StopPeerPulls)");
  std::vector<remote::ShardOf> shards;
  Result<LoadedCheckpoint> loaded = remote::LoadFromPeerWithShards(key, options, report, &shards);
  Lead(std::move(met), report);
  return loaded;
}

Result<PeerLoad> LoadFromPeerAndSeed(const PeerKey& key, const PeerLoadOptions& options) {
  if (options.fallback_load.on_tensor) {
    return InvalidArgumentError(
        "peer loading: LoadOptions::on_tensor applies to Load, not to peer loads");
  }
  PeerLoad out;
  std::vector<std::string> met;
  if (std::optional<sources::Relayed> r = TryRelay(key, options, &out.report, &met)) {
    out.loaded = std::make_shared<const LoadedCheckpoint>(std::move(r->loaded));
    if (options.become_seed && r->relay) {
      out.seed = std::move(r->relay);  // Whole now: the seed it was asked to be.
    } else {
      sources::Linger(*r, kLingerMs);
    }
    return out;
  }
  if (PeerPullsStopped()) return UnavailableError("peer load: stopped (StopPeerPulls)");
  Result<PeerLoad> plain = remote::PullAndSeed(key, options);
  if (plain.ok()) Lead(std::move(met), &plain->report);
  return plain;
}

}  // namespace tensorlift
