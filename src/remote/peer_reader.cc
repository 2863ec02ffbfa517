// PeerReader: one session with a whole-tensor peer, for reading byte ranges
// of its tensors (remote/peer_reader.h).
#include "remote/peer_reader.h"

#include <algorithm>
#include <chrono>

#include "remote/control.h"
#include "remote/registry.h"
#include "remote/ucx_transport.h"

namespace tensorlift::remote {

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
      if (std::find(urls.begin(), urls.end(), s.url) == urls.end()) urls.push_back(s.url);
    }
  }
  return urls;
}

struct PeerReader::State {
  Control control;
  PeerReaderOptions options;
  std::string session;
  Manifest manifest;
  std::unique_ptr<UcxClient> ucx;
  std::vector<uint32_t> regions;  // Manifest region -> client region.
  uint64_t read = 0;
};

PeerReader::PeerReader(std::unique_ptr<State> state) : s_(std::move(state)) {}

PeerReader::~PeerReader() {
  if (!s_) return;
  s_->ucx.reset();
  if (!s_->session.empty()) {
    s_->control.Send("DELETE", "/v1/session/" + s_->session, std::to_string(s_->read), 1024)
        .status()
        .IgnoreError();
  }
}

Result<std::unique_ptr<PeerReader>> PeerReader::Open(const std::string& url, const PeerKey& key,
                                                     const PeerReaderOptions& options) {
  TL_ASSIGN_OR_RETURN(Control control,
                      Control::Make(url, options.token, options.request_timeout_ms));
  TL_ASSIGN_OR_RETURN(std::string body, control.Send("GET", "/v1/key", "", 64 << 10));
  TL_ASSIGN_OR_RETURN(PeerInfo info, ParseKeyJson(url, body));
  const std::string mismatch = key.Mismatch(info.key);
  if (!mismatch.empty()) return InvalidArgumentError(url + ": incompatible: " + mismatch);
  auto whole_only = [&](const TensorParallel& p) -> Status {
    if (p.size == 1) return Status::Ok();
    return UnimplementedError(url + ": serves rank " + std::to_string(p.rank) + " of " +
                              std::to_string(p.size) +
                              "; a striped load reads whole tensors, from sources of size 1");
  };
  TL_RETURN_IF_ERROR(whole_only(info.parallel));

  auto s = std::make_unique<State>();
  s->control = std::move(control);
  s->options = options;
  // The reader owns the session from here: its destructor closes it.
  std::unique_ptr<PeerReader> reader(new PeerReader(std::move(s)));
  State& st = *reader->s_;
  TL_ASSIGN_OR_RETURN(
      std::string json,
      st.control.Send("POST", "/v1/session", "", ManifestLimits().max_json_bytes, &st.session));
  auto m = ParseManifest(json);
  if (!m.ok()) return m.status().WithContext(url);
  st.manifest = std::move(m).value();
  if (!st.manifest.key.Mismatch(key).empty()) {
    return InvalidArgumentError(url + ": manifest key differs: " + key.Mismatch(st.manifest.key));
  }
  TL_RETURN_IF_ERROR(whole_only(st.manifest.parallel));
  TL_RETURN_IF_ERROR(ManifestAgreesWithKey(info, st.manifest));
  TL_RETURN_IF_ERROR(RateIsEnough(url, st.manifest, options.min_rate));
  UcxOptions uo;
  uo.transports = options.transports;
  auto ucx = UcxClient::Connect(st.manifest.worker_address, uo,
                                std::chrono::milliseconds(options.connect_timeout_ms));
  if (!ucx.ok()) return ucx.status().WithContext(url);
  st.ucx = std::move(ucx).value();
  for (const Region& region : st.manifest.regions) {
    if (region.rkey.empty())
      return PermissionDeniedError(url + ": the manifest has no remote keys");
    auto idx = st.ucx->AddRegion(region.rkey, region.address, region.bytes);
    if (!idx.ok()) return idx.status().WithContext(url);
    st.regions.push_back(*idx);
  }
  return reader;
}

const std::string& PeerReader::url() const { return s_->control.url(); }
const Manifest& PeerReader::manifest() const { return s_->manifest; }
uint64_t PeerReader::bytes_read() const { return s_->read; }

Status PeerReader::MapLocal(void* data, uint64_t bytes) {
  return s_->ucx->MapLocal(data, bytes, UcxMemory::kHost).WithContext(url());
}

Status PeerReader::Read(const std::vector<Piece>& pieces) {
  std::vector<UcxClient::Get> gets;
  gets.reserve(pieces.size());
  for (const Piece& p : pieces) {
    const ManifestTensor& t = *p.tensor;
    if (p.offset > t.nbytes || p.bytes > t.nbytes - p.offset) {
      return OutOfRangeError(url() + ": tensor '" + t.name + "': bytes [" +
                             std::to_string(p.offset) + ", +" + std::to_string(p.bytes) +
                             ") past its " + std::to_string(t.nbytes));
    }
    if (p.bytes == 0) continue;
    gets.push_back({s_->regions[t.region], t.offset + p.offset, p.bytes, p.dst});
  }
  UcxClient::GetOptions go;
  go.max_in_flight = s_->options.max_in_flight;
  go.max_get_bytes = s_->options.batch_bytes;
  go.rate_limit = s_->manifest.rate_limit;
  go.stall_timeout = std::chrono::milliseconds(s_->options.stall_timeout_ms);
  go.min_rate = s_->options.min_rate;
  go.on_done = [&](size_t i) { s_->read += gets[i].bytes; };
  return s_->ucx->GetAll(gets, go).WithContext(url());
}

}  // namespace tensorlift::remote
