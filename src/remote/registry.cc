// Seed discovery on etcd over its v3 JSON gateway (see registry.h).
//
// Requests (all POST, JSON bodies, keys and values base64, int64 as strings):
//   /v3/lease/grant      {"TTL":n}                         -> {"ID":"..","TTL":".."}
//   /v3/kv/put           {"key":b64,"value":b64,"lease":"id"}
//   /v3/kv/range         {"key":b64,"range_end":b64,"limit":"n"}
//                                                          -> {"kvs":[..],"more":bool}
//   /v3/lease/keepalive  {"ID":"id"}                       -> {"result":{"TTL":".."}}
//                        (no TTL, or "0": the lease is gone)
//   /v3/lease/revoke     {"ID":"id"}
// Each request uses its own connection, with connect, read and write each
// bounded by the timeout given to Connect, and a bounded response size.
//
// The entries' keys, values and checks: registry_entry.h. A seed's id is the
// caller's SeedInfo::id when given (it must be 1 to 64 lowercase hex digits),
// else 16 random hex digits.
#include "remote/registry.h"

#include <httplib.h>
#include <simdjson.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>

#include "remote/http_deadline.h"
#include "remote/registry_entry.h"

namespace tensorlift::remote {
namespace {

constexpr size_t kMaxEntriesConsidered = 10000;
constexpr size_t kRangePageEntries = 500;
constexpr size_t kMaxSmallResponseBytes = size_t{64} << 10;
constexpr int kMaxTtlSeconds = 86400;
constexpr std::chrono::milliseconds kMaxTimeout{600000};

std::string DescribeError(httplib::Error error, std::chrono::milliseconds timeout,
                          size_t max_bytes) {
  const std::string ms = std::to_string(timeout.count()) + " ms";
  switch (error) {
    case httplib::Error::Connection:
      return "connection refused or host unreachable";
    case httplib::Error::ConnectionTimeout:
      return "no connection within " + ms;
    case httplib::Error::Read:
      return "no complete response within " + ms + " (read failed or timed out)";
    case httplib::Error::Write:
      return "sending the request failed (write failed or timed out)";
    case httplib::Error::Canceled:
      return "response larger than " + std::to_string(max_bytes) + " bytes";
    default:
      return "HTTP client error " + httplib::to_string(error);
  }
}

// One etcd member's JSON gateway. A value type: copies share nothing, and
// each request opens its own connection, so it may be used from any thread.
class EtcdGateway {
 public:
  EtcdGateway(std::string url, std::string host, int port, std::chrono::milliseconds timeout)
      : url_(std::move(url)), host_(std::move(host)), port_(port), timeout_(timeout) {}

  const std::string& url() const { return url_; }

  struct Reply {
    int http_status = 0;
    std::string body;
  };

  // Sends the request; an error only when no complete reply came back.
  Result<Reply> Send(std::string_view path, const std::string& body, size_t max_bytes) const {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    httplib::Client client(host_, port_);
    client.set_connection_timeout(timeout_);
    client.set_read_timeout(timeout_);
    client.set_write_timeout(timeout_);
    client.set_keep_alive(false);
    httplib::Request req;
    req.method = "POST";
    req.path = std::string(path);
    req.headers.emplace("Content-Type", "application/json");
    req.body = body;
    Reply reply;
    req.content_receiver = [&reply, max_bytes](const char* data, size_t n, uint64_t, uint64_t) {
      if (n > max_bytes - reply.body.size()) return false;
      reply.body.append(data, n);
      return true;
    };
    // The status line, seen before the body is read.
    req.response_handler = [&reply](const httplib::Response& res) {
      reply.http_status = res.status;
      return true;
    };
    httplib::Response res;
    httplib::Error error = httplib::Error::Success;
    bool expired = false;
    if (SendBefore(client, req, res, error, deadline, &expired) &&
        error == httplib::Error::Success) {
      return reply;
    }
    // A reply that did not complete within the time-out (say, one that
    // dribbles in a byte at a time) is no reply.
    if (expired) {
      return Fail(path, "no complete response within " + std::to_string(timeout_.count()) +
                            " ms (the request time-out)");
    }
    // etcd's error replies are chunked and end in a trailer
    // (Grpc-Trailer-Content-Type), which cpp-httplib before 0.12 cannot read
    // (yhirose/cpp-httplib#1486): the whole body has arrived when the read
    // fails. Such a reply counts when it is a complete JSON object.
    if (error == httplib::Error::Read && reply.http_status >= 300 && IsJsonObject(reply.body)) {
      return reply;
    }
    return Fail(path, DescribeError(error, timeout_, max_bytes));
  }

  // Sends the request and parses a 200 reply into `parser`'s document.
  Result<simdjson::dom::element> Call(std::string_view path, const std::string& body,
                                      simdjson::dom::parser& parser,
                                      size_t max_bytes = kMaxSmallResponseBytes) const {
    TL_ASSIGN_OR_RETURN(Reply reply, Send(path, body, max_bytes));
    if (reply.http_status != 200) return Fail(path, HttpProblem(reply));
    simdjson::dom::element root;
    if (parser.parse(reply.body).get(root) != simdjson::SUCCESS || !root.is_object()) {
      return Fail(path, "reply is not a JSON object: '" + Printable(reply.body) + "'");
    }
    return root;
  }

  static bool IsJsonObject(const std::string& text) {
    simdjson::dom::parser parser;
    simdjson::dom::element root;
    return parser.parse(text).get(root) == simdjson::SUCCESS && root.is_object();
  }

  // "HTTP 404: etcdserver: requested lease not found".
  static std::string HttpProblem(const Reply& reply) {
    std::string out = "HTTP " + std::to_string(reply.http_status);
    simdjson::dom::parser parser;
    std::string_view message;
    simdjson::dom::element root;
    if (parser.parse(reply.body).get(root) == simdjson::SUCCESS &&
        root["message"].get(message) == simdjson::SUCCESS) {
      return out + ": " + Printable(message);
    }
    if (!reply.body.empty()) out += ": '" + Printable(reply.body) + "'";
    return out;
  }

  // etcd's reply to an operation on a lease that expired or was revoked.
  static bool IsLeaseNotFound(const Reply& reply) {
    return reply.http_status == 404 && reply.body.find("lease not found") != std::string::npos;
  }

  Status Fail(std::string_view path, std::string_view what) const {
    return UnavailableError("etcd " + url_ + ": " + std::string(what) + " (POST " +
                            std::string(path) + ")");
  }

 private:
  std::string url_;
  std::string host_;
  int port_;
  std::chrono::milliseconds timeout_;
};

struct Lease {
  int64_t id = 0;
  int64_t ttl_s = 0;  // As granted (etcd may raise a short TTL to its minimum).
};

Result<Lease> GrantLease(const EtcdGateway& etcd, int ttl_s) {
  constexpr std::string_view kPath = "/v3/lease/grant";
  simdjson::dom::parser parser;
  TL_ASSIGN_OR_RETURN(simdjson::dom::element root,
                      etcd.Call(kPath, "{\"TTL\":" + std::to_string(ttl_s) + "}", parser));
  std::string_view id_text, ttl_text;
  Lease lease;
  if (root["ID"].get(id_text) != simdjson::SUCCESS || !ParseInt64(id_text, &lease.id) ||
      root["TTL"].get(ttl_text) != simdjson::SUCCESS || !ParseInt64(ttl_text, &lease.ttl_s) ||
      lease.ttl_s <= 0) {
    std::string_view error;
    if (root["error"].get(error) == simdjson::SUCCESS) return etcd.Fail(kPath, Printable(error));
    return etcd.Fail(kPath, "reply lacks a lease ID and a positive TTL");
  }
  lease.ttl_s = std::min<int64_t>(lease.ttl_s, kMaxTtlSeconds);
  return lease;
}

void RevokeLease(const EtcdGateway& etcd, int64_t lease_id) {
  etcd.Send("/v3/lease/revoke", "{\"ID\":\"" + std::to_string(lease_id) + "\"}",
            kMaxSmallResponseBytes)
      .status()
      .IgnoreError();
}

// Puts key -> value under `lease_id`. *lease_gone is set when etcd says the
// lease no longer exists.
Status PutUnderLease(const EtcdGateway& etcd, const std::string& key, const std::string& value,
                     int64_t lease_id, bool* lease_gone) {
  constexpr std::string_view kPath = "/v3/kv/put";
  *lease_gone = false;
  const std::string body = "{\"key\":\"" + Base64Encode(key) + "\",\"value\":\"" +
                           Base64Encode(value) + "\",\"lease\":\"" + std::to_string(lease_id) +
                           "\"}";
  TL_ASSIGN_OR_RETURN(EtcdGateway::Reply reply, etcd.Send(kPath, body, kMaxSmallResponseBytes));
  if (reply.http_status != 200) {
    *lease_gone = EtcdGateway::IsLeaseNotFound(reply);
    return etcd.Fail(kPath, EtcdGateway::HttpProblem(reply));
  }
  return Status::Ok();
}

class EtcdRegistration final : public Registration {
 public:
  EtcdRegistration(EtcdGateway etcd, SeedInfo seed, int ttl_s)
      : etcd_(std::move(etcd)), seed_(std::move(seed)), key_(EntryKey(seed_)), ttl_s_(ttl_s) {}

  ~EtcdRegistration() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();  // At most one request's timeouts.
    std::lock_guard<std::mutex> op_lock(op_mu_);
    if (lease_.id != 0) RevokeLease(etcd_, lease_.id);
  }

  // Grants a lease, puts the entry and starts the renewal thread.
  Status Start() {
    {
      std::lock_guard<std::mutex> op_lock(op_mu_);
      TL_RETURN_IF_ERROR(RegrantLocked());
    }
    thread_ = std::thread([this] { RenewLoop(); });
    return Status::Ok();
  }

  Status UpdateLoad(double load) override {
    if (!std::isfinite(load) || load < 0) {
      return InvalidArgumentError("registry: load " + FormatDouble(load) +
                                  " is not finite and >= 0");
    }
    std::lock_guard<std::mutex> op_lock(op_mu_);
    seed_.load = load;
    bool lease_gone = false;
    Status status = PutUnderLease(etcd_, key_, EntryValue(seed_), lease_.id, &lease_gone);
    if (lease_gone) status = RegrantLocked();
    return status;
  }

  Status UpdateProgress(bool partial, double progress, bool behind) override {
    if (!std::isfinite(progress) || progress < 0 || progress > 1) {
      return InvalidArgumentError("registry: progress " + FormatDouble(progress) +
                                  " is not in [0, 1]");
    }
    std::lock_guard<std::mutex> op_lock(op_mu_);
    seed_.partial = partial;
    seed_.progress = partial ? progress : 1;
    seed_.behind = behind;
    bool lease_gone = false;
    Status status = PutUnderLease(etcd_, key_, EntryValue(seed_), lease_.id, &lease_gone);
    if (lease_gone) status = RegrantLocked();
    return status;
  }

  Status health() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return health_;
  }

 private:
  // Grants a fresh lease and puts the entry under it. Requires op_mu_.
  Status RegrantLocked() {
    TL_ASSIGN_OR_RETURN(Lease lease, GrantLease(etcd_, ttl_s_));
    bool lease_gone = false;
    Status status = PutUnderLease(etcd_, key_, EntryValue(seed_), lease.id, &lease_gone);
    if (!status.ok()) {
      RevokeLease(etcd_, lease.id);
      return status;
    }
    lease_ = lease;
    return Status::Ok();
  }

  // Renews the lease; re-registers when etcd says it is gone.
  Status RenewOnce() {
    constexpr std::string_view kPath = "/v3/lease/keepalive";
    std::lock_guard<std::mutex> op_lock(op_mu_);
    simdjson::dom::parser parser;
    auto root = etcd_.Call(kPath, "{\"ID\":\"" + std::to_string(lease_.id) + "\"}", parser);
    if (!root.ok()) return root.status();
    std::string_view ttl_text;
    int64_t ttl = 0;
    if ((*root)["result"]["TTL"].get(ttl_text) == simdjson::SUCCESS && ParseInt64(ttl_text, &ttl) &&
        ttl > 0) {
      return Status::Ok();
    }
    return RegrantLocked();  // No TTL: the lease expired or was revoked.
  }

  std::chrono::milliseconds Interval() {
    std::lock_guard<std::mutex> op_lock(op_mu_);
    return std::chrono::milliseconds(std::max<int64_t>(lease_.ttl_s * 1000 / 3, 100));
  }

  void RenewLoop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      lock.unlock();
      const std::chrono::milliseconds interval = Interval();
      lock.lock();
      if (cv_.wait_for(lock, interval, [this] { return stop_; })) return;
      lock.unlock();
      Status status = RenewOnce();
      lock.lock();
      health_ = std::move(status);
    }
  }

  const EtcdGateway etcd_;
  // Serializes etcd operations that change the entry or the lease.
  std::mutex op_mu_;
  SeedInfo seed_;  // Guarded by op_mu_.
  const std::string key_;
  const int ttl_s_;
  Lease lease_;  // Guarded by op_mu_.

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // Guarded by mu_.
  Status health_;      // Guarded by mu_.
  std::thread thread_;
};

class EtcdRegistry final : public Registry {
 public:
  explicit EtcdRegistry(EtcdGateway etcd) : etcd_(std::move(etcd)) {}

  Result<std::unique_ptr<Registration>> Register(const SeedInfo& seed, int ttl_s) override {
    TL_RETURN_IF_ERROR(ValidateDigest(seed.key_digest));
    if (ttl_s < 1 || ttl_s > kMaxTtlSeconds) {
      return InvalidArgumentError("registry: ttl " + std::to_string(ttl_s) +
                                  " s is not in [1, 86400]");
    }
    SeedInfo entry = seed;
    if (entry.id.empty()) {
      TL_ASSIGN_OR_RETURN(entry.id, RandomHex(kDigestHexDigits / 2));
    }
    if (std::string problem = SeedProblem(entry); !problem.empty()) {
      return InvalidArgumentError("registry: seed: " + problem);
    }
    auto registration = std::make_unique<EtcdRegistration>(etcd_, std::move(entry), ttl_s);
    TL_RETURN_IF_ERROR(registration->Start());
    return std::unique_ptr<Registration>(std::move(registration));
  }

  Result<std::vector<SeedInfo>> List(std::string_view key_digest) override {
    constexpr std::string_view kPath = "/v3/kv/range";
    TL_RETURN_IF_ERROR(ValidateDigest(key_digest));
    const std::string prefix = DigestPrefix(key_digest);
    std::string range_end = prefix;
    range_end.back() = static_cast<char>(range_end.back() + 1);  // '/' + 1 == '0'.
    const std::string range_end_b64 = Base64Encode(range_end);

    std::vector<SeedInfo> seeds;
    std::string start = prefix, last_key;
    size_t considered = 0;
    bool more = true;
    while (more && considered < kMaxEntriesConsidered) {
      const size_t limit = std::min(kRangePageEntries, kMaxEntriesConsidered - considered);
      const std::string body = "{\"key\":\"" + Base64Encode(start) + "\",\"range_end\":\"" +
                               range_end_b64 + "\",\"limit\":\"" + std::to_string(limit) + "\"}";
      TL_ASSIGN_OR_RETURN(EtcdGateway::Reply reply,
                          etcd_.Send(kPath, body, kMaxRangeResponseBytes));
      if (reply.http_status != 200) return etcd_.Fail(kPath, EtcdGateway::HttpProblem(reply));
      auto page = ParseRangePage(reply.body, key_digest, limit, last_key);
      if (!page.ok()) return etcd_.Fail(kPath, page.status().message());
      considered += page->entries;
      more = page->more;
      for (auto& seed : page->seeds) seeds.push_back(std::move(seed));
      if (page->entries == 0) break;
      last_key = std::move(page->last_key);
      start = last_key + '\0';  // The next page starts after this key.
    }
    std::sort(seeds.begin(), seeds.end(), [](const SeedInfo& a, const SeedInfo& b) {
      if (a.load != b.load) return a.load < b.load;
      if (a.id != b.id) return a.id < b.id;
      return a.rank < b.rank;
    });
    return seeds;
  }

 private:
  const EtcdGateway etcd_;
};

// Parses "http://host:port" (an optional trailing '/'); host is a name, an
// IPv4 address or a bracketed IPv6 address.
Status ParseUrl(const std::string& url, std::string* host, int* port) {
  auto bad = [&url](std::string_view why) {
    return InvalidArgumentError("registry: etcd URL '" + Printable(url, 200) + "' " +
                                std::string(why) + " (expected http://host:port)");
  };
  constexpr std::string_view kScheme = "http://";
  if (url.size() > kMaxUrlBytes) return bad("is longer than 1024 bytes");
  if (url.rfind(kScheme, 0) != 0) return bad("does not start with http://");
  std::string_view rest = std::string_view(url).substr(kScheme.size());
  if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  size_t colon;
  if (!rest.empty() && rest.front() == '[') {
    const size_t close = rest.find(']');
    if (close == std::string_view::npos || close == 1) return bad("has a malformed IPv6 host");
    *host = std::string(rest.substr(1, close - 1));
    for (char c : *host) {
      if (!(std::isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.')) {
        return bad("has a malformed IPv6 host");
      }
    }
    colon = close + 1;
    if (colon >= rest.size() || rest[colon] != ':') return bad("has no port");
  } else {
    colon = rest.rfind(':');
    if (colon == std::string_view::npos) return bad("has no port");
    *host = std::string(rest.substr(0, colon));
    if (host->empty()) return bad("has no host");
    for (char c : *host) {
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_')) {
        return bad("has a host with characters other than letters, digits, '.', '-' and '_'");
      }
    }
  }
  const std::string_view port_text = rest.substr(colon + 1);
  int64_t value = 0;
  if (port_text.empty() || port_text.size() > 5 ||
      !std::all_of(port_text.begin(), port_text.end(),
                   [](char c) { return c >= '0' && c <= '9'; }) ||
      !ParseInt64(port_text, &value) || value < 1 || value > 65535) {
    return bad("has no port in [1, 65535]");
  }
  *port = static_cast<int>(value);
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Registry>> Registry::Connect(const std::string& url,
                                                    std::chrono::milliseconds timeout) {
  std::string host;
  int port = 0;
  TL_RETURN_IF_ERROR(ParseUrl(url, &host, &port));
  if (timeout.count() <= 0 || timeout > kMaxTimeout) {
    return InvalidArgumentError("registry: timeout " + std::to_string(timeout.count()) +
                                " ms is not in [1, 600000]");
  }
  std::string clean = url;
  if (clean.back() == '/') clean.pop_back();
  return std::unique_ptr<Registry>(std::make_unique<EtcdRegistry>(
      EtcdGateway(std::move(clean), std::move(host), port, timeout)));
}

}  // namespace tensorlift::remote
