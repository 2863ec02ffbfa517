// libFuzzer target for what a peer sends in the handshake and on the wire,
// besides the manifest (manifest_fuzz.cc):
//   selector 0: GET /v1/key's answer (remote::ParseKeyJson);
//   selector 1: a framed UCX worker address or packed remote key
//               (remote::Unframe, kinds 'A' and 'K');
//   selector 2: the X-Tensorlift-Auth header a server verifies
//               (remote::RequestVerifier::Verify);
//   selector 3: a peer URL from the registry or the user (remote::ParseHttpUrl).
// The first byte picks the decoder (mod 4); the rest is the input.
//
// Checks: a rejection has the documented code (Corruption for /v1/key,
// InvalidArgument for frames and URLs, PermissionDenied for the header);
// what is accepted keeps its promises (a valid key, 1 <= size, 0 <= rank <
// size; a frame's payload is exactly the bytes after the header and frames
// again to the same blob; a header is accepted at most once (no replay); a
// URL's port is 1..65535 and its host non-empty). Any broken invariant aborts
// with a message (a finding).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "remote/auth.h"
#include "remote/control.h"
#include "remote/frame.h"
#include "remote/server.h"

namespace {

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "peer_wire_fuzz: invariant broken: %s: %s\n", what, detail.c_str());
  std::abort();
}

using tensorlift::StatusCode;

void KeyJson(std::string_view in) {
  auto info = tensorlift::remote::ParseKeyJson("http://127.0.0.1:1", std::string(in));
  if (!info.ok()) {
    if (info.status().code() != StatusCode::kCorruption) Fail("key code", info.status().ToString());
    return;
  }
  if (!info->key.Validate().ok()) Fail("key valid", info->key.Validate().ToString());
  if (info->parallel.size < 1 || info->parallel.rank < 0 ||
      info->parallel.rank >= info->parallel.size) {
    Fail("parallel",
         std::to_string(info->parallel.size) + "/" + std::to_string(info->parallel.rank));
  }
  if (!(info->load >= 0)) Fail("load", std::to_string(info->load));
}

void Frames(std::string_view in) {
  for (char kind : {'A', 'K'}) {
    auto payload = tensorlift::remote::Unframe(in, kind, "fuzz");
    if (!payload.ok()) {
      if (payload.status().code() != StatusCode::kInvalidArgument) {
        Fail("frame code", payload.status().ToString());
      }
      continue;
    }
    if (payload->empty() || payload->size() > tensorlift::remote::kMaxFramePayload ||
        payload->size() + tensorlift::remote::kFrameHeader != in.size() ||
        std::string_view(*payload) != in.substr(tensorlift::remote::kFrameHeader)) {
      Fail("frame payload", std::to_string(payload->size()));
    }
    if (tensorlift::remote::Frame(kind, payload->data(), payload->size()) != in) {
      Fail("frame round trip", std::to_string(in.size()));
    }
  }
}

void AuthHeader(std::string_view in) {
  constexpr int64_t kNow = 1'800'000'000;
  tensorlift::remote::RequestVerifier verifier("fuzz-token");
  // Once as given, then the same again: a second acceptance is a replay.
  for (int round = 0; round < 2; ++round) {
    tensorlift::Status s = verifier.Verify(in, "POST", "/v1/session", kNow);
    if (s.ok()) {
      if (round == 1) Fail("replay accepted", std::string(in.substr(0, 200)));
      continue;
    }
    if (s.code() != StatusCode::kPermissionDenied) Fail("auth code", s.ToString());
  }
  // A correctly signed header is accepted (the verifier is not vacuous).
  const std::string good = tensorlift::remote::SignRequest(
      "fuzz-token", "POST", "/v1/session", kNow, "0123456789abcdef0123456789abcdef");
  if (in != good && !verifier.Verify(good, "POST", "/v1/session", kNow).ok()) {
    Fail("good header refused", good);
  }
}

void HttpUrl(std::string_view in) {
  std::string host;
  int port = 0;
  tensorlift::Status s = tensorlift::remote::ParseHttpUrl(std::string(in), &host, &port);
  if (!s.ok()) {
    if (s.code() != StatusCode::kInvalidArgument) Fail("url code", s.ToString());
    return;
  }
  if (host.empty() || port < 1 || port > 65535) Fail("url", host + ":" + std::to_string(port));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0:
      KeyJson(in);
      break;
    case 1:
      Frames(in);
      break;
    case 2:
      AuthHeader(in);
      break;
    default:
      HttpUrl(in);
      break;
  }
  return 0;
}
