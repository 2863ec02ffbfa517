// The control-plane client (remote/control.h).
#include "remote/control.h"

#include <httplib.h>
#include <simdjson.h>

#include <algorithm>
#include <cctype>

#include "remote/auth.h"
#include "remote/http_deadline.h"
#include "remote/server.h"
#include "tensorlift/content.h"
#include "tensorlift/text.h"

namespace tensorlift::remote {

Result<Control> Control::Make(const std::string& url, const std::string& token, int timeout_ms) {
  Control c;
  c.url_ = url;
  c.token_ = token;
  c.timeout_ms_ = timeout_ms;
  TL_RETURN_IF_ERROR(ParseHttpUrl(url, &c.host_, &c.port_));
  return c;
}

Result<std::string> Control::Send(const std::string& method, const std::string& path,
                                  const std::string& body, uint64_t max_body,
                                  std::string* session) const {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
  httplib::Client cli(host_, port_);
  const time_t s = timeout_ms_ / 1000;
  const time_t us = (timeout_ms_ % 1000) * 1000;
  cli.set_connection_timeout(s, us);
  cli.set_read_timeout(s, us);
  cli.set_write_timeout(s, us);
  httplib::Request req;
  req.method = method;
  req.path = path;
  req.body = body;
  if (!body.empty()) req.set_header("Content-Type", "text/plain");
  if (!token_.empty())
    req.set_header(kAuthHeader, SignRequest(token_, method, path, UnixSeconds(), RandomNonce()));
  std::string received;
  bool too_big = false;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (received.size() + n > max_body) {
      too_big = true;
      return false;
    }
    received.append(data, n);
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  bool expired = false;
  const bool ok = SendBefore(cli, req, res, err, deadline, &expired);
  if (too_big) {
    return CorruptionError(url_ + ": " + method + " " + path + ": response larger than " +
                           std::to_string(max_body) + " bytes");
  }
  if (expired) {
    return UnavailableError(url_ + ": " + method + " " + path + ": no complete answer within " +
                            std::to_string(timeout_ms_) + " ms (the request time-out)");
  }
  if (!ok) {
    return UnavailableError(url_ + ": " + method + " " + path + ": " + httplib::to_string(err));
  }
  if (res.status != 200) {
    std::string what = received.substr(0, 300);
    const std::string m = url_ + ": " + method + " " + path + ": HTTP " +
                          std::to_string(res.status) + (what.empty() ? "" : " (" + what + ")");
    if (res.status == 401 || res.status == 403) return PermissionDeniedError(m);
    return UnavailableError(m);
  }
  if (session) {
    *session = res.get_header_value("X-Tensorlift-Session");
    if (session->empty() || session->size() > 64 ||
        !std::all_of(session->begin(), session->end(),
                     [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); })) {
      return CorruptionError(url_ + ": bad or missing session id");
    }
  }
  return received;
}

// The DOM parser validates the whole document before any field is read.
// (simdjson's On-Demand API does not: a field looked up out of order on
// malformed JSON runs into its "already validated" assumptions, undefined
// behaviour found by tests/fuzz/peer_wire_fuzz.cc.)
Result<PeerInfo> ParseKeyJson(const std::string& url, const std::string& json) {
  PeerInfo info;
  info.url = url;
  auto bad = [&](const std::string& what) {
    return CorruptionError(url + ": GET /v1/key: " + what);
  };
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (parser.parse(json).get(doc)) return bad("not JSON");
  simdjson::dom::object root;
  if (doc.get_object().get(root)) return bad("not a JSON object");
  simdjson::dom::object key;
  if (root["key"].get_object().get(key)) return bad("no \"key\" object");
  auto str = [&](simdjson::dom::object& o, const char* field, std::string* out) -> Status {
    std::string_view v;
    if (o[field].get_string().get(v))
      return bad(std::string("key.") + field + " missing or not a string");
    *out = std::string(v);
    return Status::Ok();
  };
  TL_RETURN_IF_ERROR(str(key, "model", &info.key.model));
  TL_RETURN_IF_ERROR(str(key, "revision", &info.key.revision));
  std::string dtype;
  TL_RETURN_IF_ERROR(str(key, "dtype", &dtype));
  auto parsed_dtype = ParsePeerKeyDtype(dtype);
  if (!parsed_dtype.ok()) return bad("key.dtype " + QuoteName(dtype) + " is not a dtype");
  info.key.dtype = *parsed_dtype;
  TL_RETURN_IF_ERROR(str(key, "quantization", &info.key.quantization));
  TL_RETURN_IF_ERROR(str(key, "layout", &info.key.layout));
  int64_t protocol = 0;
  if (key["protocol"].get_int64().get(protocol) || protocol < 0 || protocol > 1000000) {
    return bad("key.protocol missing or out of range");
  }
  info.key.protocol = static_cast<int>(protocol);
  Status valid = info.key.Validate();
  if (!valid.ok()) return bad(valid.message());
  simdjson::dom::object par;
  if (root["parallel"].get_object().get(par)) return bad("no \"parallel\" object");
  int64_t size = 0, rank = 0;
  if (par["size"].get_int64().get(size) || par["rank"].get_int64().get(rank) || size < 1 ||
      size > (1 << 16) || rank < 0 || rank >= size) {
    return bad("parallel size/rank missing or out of range");
  }
  info.parallel = {static_cast<int>(size), static_cast<int>(rank)};
  // What the manifest must then list (OpenSessions checks it).
  uint64_t tensors = 0, total_bytes = 0;
  if (root["tensors"].get_uint64().get(tensors) ||
      root["total_bytes"].get_uint64().get(total_bytes)) {
    return bad("tensors or total_bytes missing or not an unsigned integer");
  }
  info.tensors = tensors;
  info.total_bytes = total_bytes;
  int64_t sessions = 0;
  if (!root["sessions"].get_int64().get(sessions) && sessions >= 0)
    info.load = static_cast<double>(sessions);
  std::string_view content;
  if (!root["content"].get_string().get(content)) {
    if (!Hash128::IsCanonicalHex(content)) return bad("content is not 32 lowercase hex digits");
    info.content = std::string(content);
  }
  return info;
}

Status ManifestAgreesWithKey(const PeerInfo& info, const Manifest& manifest) {
  if (manifest.tensors.size() == info.tensors && manifest.total_bytes == info.total_bytes) {
    return Status::Ok();
  }
  return CorruptionError(info.url + ": the manifest lists " +
                         std::to_string(manifest.tensors.size()) + " tensors of " +
                         std::to_string(manifest.total_bytes) + " bytes, GET /v1/key said " +
                         std::to_string(info.tensors) + " of " + std::to_string(info.total_bytes));
}

Status RateIsEnough(const std::string& url, const Manifest& manifest, uint64_t min_rate) {
  if (min_rate == 0 || manifest.rate_limit == 0 || manifest.rate_limit >= min_rate) {
    return Status::Ok();
  }
  return UnavailableError(url + ": grants " + std::to_string(manifest.rate_limit) +
                          " bytes/s, below the minimum of " + std::to_string(min_rate) +
                          " (min_rate)");
}

Result<PeerInfo> AskKey(const Control& control, const PeerKey& key) {
  TL_ASSIGN_OR_RETURN(std::string body, control.Send("GET", "/v1/key", "", 64 << 10));
  TL_ASSIGN_OR_RETURN(PeerInfo info, ParseKeyJson(control.url(), body));
  const std::string mismatch = key.Mismatch(info.key);
  if (!mismatch.empty()) return InvalidArgumentError(control.url() + ": incompatible: " + mismatch);
  return info;
}

}  // namespace tensorlift::remote
