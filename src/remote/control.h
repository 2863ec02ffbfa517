// A peer's control endpoint, as a client sees it: signed HTTP requests with
// time-outs and bounded bodies (docs/remote.md, "Control plane"), and what
// GET /v1/key says. Used by LoadFromPeer and by the striper's peer source.
#ifndef TENSORLIFT_REMOTE_CONTROL_H_
#define TENSORLIFT_REMOTE_CONTROL_H_

#include <string>

#include "remote/manifest.h"
#include "tensorlift/remote.h"
#include "tensorlift/status.h"

namespace tensorlift::remote {

// One control endpoint: signed requests with time-outs and bounded bodies.
class Control {
 public:
  // kInvalidArgument unless `url` is "http://host:port".
  static Result<Control> Make(const std::string& url, const std::string& token, int timeout_ms);
  const std::string& url() const { return url_; }

  // The response body (at most max_body bytes); `header` (when non-null) gets
  // X-Tensorlift-Session.
  Result<std::string> Send(const std::string& method, const std::string& path,
                           const std::string& body, uint64_t max_body,
                           std::string* session = nullptr) const;

 private:
  std::string url_, token_, host_;
  int port_ = 0;
  int timeout_ms_ = 5000;
};

// What GET /v1/key says.
struct PeerInfo {
  std::string url;
  PeerKey key;
  TensorParallel parallel;
  // The tensors this rank serves and their bytes: its manifest must agree.
  uint64_t tensors = 0;
  uint64_t total_bytes = 0;
  double load = 0;
  // Its content identity root (32 lowercase hex digits), when it says one.
  std::string content;
};

// A manifest must list what its GET /v1/key answer said: as many tensors and
// bytes (kCorruption naming both otherwise).
Status ManifestAgreesWithKey(const PeerInfo& info, const Manifest& manifest);

// kUnavailable when the manifest grants this client less than `min_rate`
// bytes per second (PeerLoadOptions::min_rate; 0 accepts any rate).
Status RateIsEnough(const std::string& url, const Manifest& manifest, uint64_t min_rate);

// Parses GET /v1/key's answer from `url` (untrusted: every field checked).
Result<PeerInfo> ParseKeyJson(const std::string& url, const std::string& json);

// GET /v1/key on `control`, parsed; kInvalidArgument ("URL: incompatible:
// ...") when its key is not `key`'s.
Result<PeerInfo> AskKey(const Control& control, const PeerKey& key);

}  // namespace tensorlift::remote

#endif  // TENSORLIFT_REMOTE_CONTROL_H_
