// Request authentication for the control endpoint (docs/remote.md,
// "Security"): a shared token; each request carries
//   X-Tensorlift-Auth: v1:<unix seconds>:<nonce>:<hex HMAC-SHA256>
// where the MAC is over "v1\n<METHOD>\n<path with query>\n<seconds>\n<nonce>"
// keyed with the token. The server accepts a timestamp within max_skew of its
// clock and each nonce once (within the skew window).
#ifndef TENSORLIFT_REMOTE_AUTH_H_
#define TENSORLIFT_REMOTE_AUTH_H_

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "tensorlift/status.h"

namespace tensorlift::remote {

inline constexpr const char* kAuthHeader = "X-Tensorlift-Auth";

// Lowercase hex of HMAC-SHA256(token, message).
std::string HmacSha256Hex(std::string_view token, std::string_view message);
// 32 hex digits from the OS's random source.
std::string RandomNonce();
// The system clock in whole seconds since the epoch (what requests carry).
int64_t UnixSeconds();
// The header value for a request.
std::string SignRequest(std::string_view token, std::string_view method, std::string_view path,
                        int64_t unix_seconds, std::string_view nonce);

// Checks requests' headers. Thread-safe.
class RequestVerifier {
 public:
  explicit RequestVerifier(std::string token, int64_t max_skew_s = 60);
  // kPermissionDenied with the reason (missing, malformed, stale, bad MAC,
  // replayed); the MAC is compared in constant time.
  Status Verify(std::string_view header, std::string_view method, std::string_view path,
                int64_t now_unix_seconds);

 private:
  std::string token_;
  int64_t max_skew_s_;
  std::mutex mu_;
  std::unordered_map<std::string, int64_t> seen_;  // nonce -> timestamp; pruned past the window.
};

}  // namespace tensorlift::remote

#endif  // TENSORLIFT_REMOTE_AUTH_H_
