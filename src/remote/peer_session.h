// A session with one source rank (private to remote/ and sources/): the
// manifest it opened with, checked against the key and the rank's GET /v1/key
// answer, and once connected its UCX client with the manifest's regions.
// A pull (peer_pull.h, one per source rank) and a striped load's peer source
// (sources/striped_sources.h) read through it. Ending it (the destructor)
// closes the client, then the session, reporting the bytes got.
//
// Thread safety: used by one thread at a time.
#ifndef TENSORLIFT_REMOTE_PEER_SESSION_H_
#define TENSORLIFT_REMOTE_PEER_SESSION_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "remote/control.h"
#include "remote/manifest.h"
#include "remote/ucx_transport.h"
#include "tensorlift/remote.h"
#include "tensorlift/status.h"

namespace tensorlift::remote {

class PeerSession {
 public:
  PeerSession() = default;
  ~PeerSession();
  PeerSession(const PeerSession&) = delete;
  PeerSession& operator=(const PeerSession&) = delete;

  // POST /v1/session on `control` (which must outlive the session): its
  // manifest's key must be `key`'s (kInvalidArgument), its tensors and bytes
  // what `info` said (kCorruption), and its rate grant at least `min_rate`
  // (kUnavailable). Every error names the endpoint.
  Status Open(const Control& control, const PeerInfo& info, const PeerKey& key, uint64_t min_rate);
  // Connects to the source's UCX worker and adds the manifest's regions.
  Status Connect(const std::string& transports, int connect_timeout_ms);
  // A session with the rank at `url` on its own control endpoint: GET
  // /v1/key (its key must be `key`'s: kInvalidArgument), then Open and
  // Connect; `info` (optional) gets what GET /v1/key said.
  struct DialOptions {
    std::string token;
    int request_timeout_ms = 5000;
    int connect_timeout_ms = 5000;
    uint64_t min_rate = 0;
    std::string transports;
    // Only a source of tensor-parallel size 1 (every tensor whole), as a
    // striped load reads: kUnimplemented, before any session, otherwise.
    bool whole_only = false;
    // Connect the data plane now; false: the caller connects (Connect) when
    // it first reads, if ever (a relaying pull's root, asked for its manifest
    // and read from only by the first relay).
    bool connect = true;
  };
  static Result<std::unique_ptr<PeerSession>> Dial(const std::string& url, const PeerKey& key,
                                                   const DialOptions& options,
                                                   PeerInfo* info = nullptr);
  const std::string& url() const { return control_->url(); }
  const std::string& id() const { return session_; }  // The session's, as the source named it.

  // The gets `gets` (whose region indices are the client's: regions[t.region]
  // for a manifest tensor t), at the manifest's rate grant.
  Status GetAll(const std::vector<UcxClient::Get>& gets, UcxClient::GetOptions options);

  Manifest manifest;
  std::unique_ptr<UcxClient> ucx;
  std::vector<uint32_t> regions;  // Manifest region -> client region index.
  uint64_t pulled = 0;            // Bytes got (reported when it closes).
  uint64_t staged = 0;  // Chunks got into host memory of their own (split between places).

 private:
  std::unique_ptr<Control> own_control_;  // Dial's.
  // The rate grant's pacing across GetAll calls: bytes asked for since.
  std::chrono::steady_clock::time_point paced_since_;
  uint64_t paced_bytes_ = 0;
  const Control* control_ = nullptr;
  std::string session_;
};

// The endpoints to try for `key`: `peers`, then the live seeds the etcd
// `registry` lists for it (when not empty; relays still receiving left out),
// each once. What could not be
// asked is added to `failures` (one line each).
std::vector<std::string> PeerUrlsFor(const PeerKey& key, const std::vector<std::string>& peers,
                                     const std::string& registry, int timeout_ms,
                                     std::vector<std::string>* failures);

}  // namespace tensorlift::remote

#endif  // TENSORLIFT_REMOTE_PEER_SESSION_H_
