// PeerSession (peer_session.h): one source rank's session and data plane.
#include "remote/peer_session.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "remote/registry.h"

namespace tensorlift::remote {

PeerSession::~PeerSession() {
  ucx.reset();
  if (!session_.empty()) {
    control_->Send("DELETE", "/v1/session/" + session_, std::to_string(pulled), 1024)
        .status()
        .IgnoreError();
  }
}

Status PeerSession::Open(const Control& control, const PeerInfo& info, const PeerKey& key,
                         uint64_t min_rate) {
  control_ = &control;
  TL_ASSIGN_OR_RETURN(std::string json, control.Send("POST", "/v1/session", "",
                                                     ManifestLimits().max_json_bytes, &session_));
  auto m = ParseManifest(json);
  if (!m.ok()) return m.status().WithContext(url());
  manifest = std::move(m).value();
  if (!manifest.key.Mismatch(key).empty()) {
    return InvalidArgumentError(url() + ": manifest key differs: " + key.Mismatch(manifest.key));
  }
  TL_RETURN_IF_ERROR(ManifestAgreesWithKey(info, manifest));
  return RateIsEnough(url(), manifest, min_rate);
}

Result<std::unique_ptr<PeerSession>> PeerSession::Dial(const std::string& url, const PeerKey& key,
                                                       const DialOptions& options, PeerInfo* info) {
  auto s = std::make_unique<PeerSession>();
  TL_ASSIGN_OR_RETURN(Control control,
                      Control::Make(url, options.token, options.request_timeout_ms));
  s->own_control_ = std::make_unique<Control>(std::move(control));
  TL_ASSIGN_OR_RETURN(PeerInfo said, AskKey(*s->own_control_, key));
  auto whole = [&](const TensorParallel& p) -> Status {
    if (!options.whole_only || p.size == 1) return Status::Ok();
    return UnimplementedError(url + ": serves rank " + std::to_string(p.rank) + " of " +
                              std::to_string(p.size) +
                              "; a striped load reads whole tensors, from sources of size 1");
  };
  TL_RETURN_IF_ERROR(whole(said.parallel));
  TL_RETURN_IF_ERROR(s->Open(*s->own_control_, said, key, options.min_rate));
  TL_RETURN_IF_ERROR(whole(s->manifest.parallel));
  if (options.connect)
    TL_RETURN_IF_ERROR(s->Connect(options.transports, options.connect_timeout_ms));
  if (info) *info = std::move(said);
  return s;
}

Status PeerSession::Connect(const std::string& transports, int connect_timeout_ms) {
  UcxOptions uo;
  uo.transports = transports;
  auto client = UcxClient::Connect(manifest.worker_address, uo,
                                   std::chrono::milliseconds(connect_timeout_ms));
  if (!client.ok()) return client.status().WithContext(url());
  ucx = std::move(client).value();
  for (const Region& region : manifest.regions) {
    if (region.rkey.empty()) {
      return PermissionDeniedError(url() + ": the manifest has no remote keys");
    }
    auto idx = ucx->AddRegion(region.rkey, region.address, region.bytes);
    if (!idx.ok()) return idx.status().WithContext(url());
    regions.push_back(*idx);
  }
  return Status::Ok();
}

Status PeerSession::GetAll(const std::vector<UcxClient::Get>& gets, UcxClient::GetOptions options) {
  if (gets.empty()) return Status::Ok();
  options.rate_limit = manifest.rate_limit;  // Its grant to this client.
  if (options.rate_limit > 0) {
    // A run paces its own gets from its start: runs one after another (a
    // load's blocks, a striped load's pieces) wait here until the bytes of
    // the runs before are due at the granted rate, or each run's first get
    // would go at once and the grant would hold for none of them.
    const auto now = std::chrono::steady_clock::now();
    if (paced_bytes_ == 0) paced_since_ = now;
    const auto due =
        paced_since_ + std::chrono::nanoseconds(static_cast<int64_t>(
                           static_cast<long double>(paced_bytes_) * 1e9L / options.rate_limit));
    if (due > now) std::this_thread::sleep_until(due);
    for (const UcxClient::Get& g : gets) paced_bytes_ += g.bytes;
  }
  return ucx->GetAll(gets, options).WithContext(url());
}

std::vector<std::string> PeerUrlsFor(const PeerKey& key, const std::vector<std::string>& peers,
                                     const std::string& registry, int timeout_ms,
                                     std::vector<std::string>* failures) {
  std::vector<std::string> urls;
  for (const std::string& p : peers) {
    if (std::find(urls.begin(), urls.end(), p) == urls.end()) urls.push_back(p);
  }
  if (registry.empty()) return urls;
  auto reg = Registry::Connect(registry, std::chrono::milliseconds(timeout_ms));
  Result<std::vector<SeedInfo>> seeds = reg.ok() ? (*reg)->List(key.Digest()) : reg.status();
  if (!seeds.ok()) {
    failures->push_back("registry " + registry + ": " + seeds.status().message());
  } else if (seeds->empty()) {
    failures->push_back("registry " + registry + ": no live seed for key " + key.Digest());
  } else {
    for (const SeedInfo& s : *seeds) {
      // A relay still receiving serves only what it holds: pulls that do not
      // relay (which read every chunk of one source) leave it out.
      if (s.partial) continue;
      if (std::find(urls.begin(), urls.end(), s.url) == urls.end()) urls.push_back(s.url);
    }
  }
  return urls;
}

}  // namespace tensorlift::remote
