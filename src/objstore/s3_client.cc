// The S3 client over libcurl's multi interface (see s3_client.h).
//
// Each call checks a Session (a curl multi handle and its easy handles) out
// of a small pool and runs all its requests in one multi loop on the calling
// thread; the multi handle's connection cache keeps connections alive from
// call to call. DNS answers and TLS sessions are shared between sessions
// through a lock-protected curl share. (Connections are not put in the share:
// libcurl does not support sharing them between concurrent threads.)
//
// Signing: CURLOPT_AWS_SIGV4 "aws:amz:<region>:s3" with the key pair, plus
// the x-amz-content-sha256 header S3 requires and x-amz-security-token for
// session credentials. libcurl 7.88 signs the path and the query exactly as
// given, so both are built here already in AWS's canonical form: every byte
// but the RFC 3986 unreserved ones percent-encoded (uppercase hex), '/' kept
// in paths, query parameters sorted by name.
//
// Every answer is untrusted: status lines, Content-Range and Content-Length
// are checked against the request before a byte is stored, a ranged body is
// written only inside its destination, listings and error bodies are parsed
// (libxml2, no network, no entity expansion) with size limits.
#include "objstore/s3_client.h"

// libcurl is opened at run time (curl_api.h): every curl_* call below goes
// through the table LoadCurl fills.
#define CURL_DISABLE_TYPECHECK
#include <curl/curl.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "objstore/curl_api.h"
#include "objstore/s3_answers.h"
#include "tensorlift/text.h"

namespace tensorlift::objstore {

// Objects per ListObjectsV2 page (S3's maximum is 1000). Tests lower it to
// exercise pagination; not part of the public interface.
void SetS3ListPageKeysForTesting(int keys);

namespace {

constexpr size_t kMaxListPages = 100000;
constexpr long kBufferBytes = 512 * 1024;
constexpr int kMaxBackoffMs = 5000;
constexpr int kMaxPollMs = 1000;
constexpr size_t kMaxIdleSessions = 4;
constexpr size_t kMaxKeyBytes = 1024;

std::atomic<int> g_list_page_keys{1000};

using Clock = std::chrono::steady_clock;

// curl_global_init once per process; its result for every caller.
CURLcode GlobalInit() {
  static std::once_flag once;
  static CURLcode code = CURLE_OK;
  std::call_once(once, [] {
    code = curl_global_init(CURL_GLOBAL_DEFAULT);
    InitXml();
  });
  return code;
}

bool IsUnreserved(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_' || c == '~';
}

// AWS's UriEncode: unreserved bytes as they are, the rest as %XX; '/' kept
// when `keep_slash` (object keys in paths).
std::string UriEncode(std::string_view s, bool keep_slash) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size() * 3);
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (IsUnreserved(c) || (keep_slash && c == '/')) {
      out += ch;
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string_view TrimSpace(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() &&
         (s.back() == ' ' || s.back() == '\t' || s.back() == '\r' || s.back() == '\n')) {
    s.remove_suffix(1);
  }
  return s;
}

bool EqualsNoCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x + 32);
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y + 32);
    if (x != y) return false;
  }
  return true;
}

// Backoff before retry `attempt` (1-based): base * 2^(attempt-1), capped,
// with jitter (uniform in the upper half).
std::chrono::milliseconds Backoff(int base_ms, int attempt) {
  int64_t ms = std::max(base_ms, 1);
  for (int i = 1; i < attempt && ms < kMaxBackoffMs; ++i) ms *= 2;
  ms = std::min<int64_t>(ms, kMaxBackoffMs);
  thread_local std::minstd_rand rng(std::random_device{}());
  std::uniform_int_distribution<int64_t> jitter(ms / 2, ms);
  return std::chrono::milliseconds(jitter(rng));
}

bool IsTransientCurlError(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_PARTIAL_FILE:
    case CURLE_GOT_NOTHING:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
      return true;
    default:
      return false;
  }
}

enum class Method { kGet, kHead };

class CurlS3Client;

// One request and the state of its current attempt. Addresses must stay put
// while it runs (CURLOPT_PRIVATE and the callbacks point at it).
struct Transfer {
  // The request.
  Method method = Method::kGet;
  std::string bucket, key;  // `key` may be empty (a listing).
  std::string url;
  std::string what;  // "GET s3://b/k bytes [a, b)", for messages.
  bool ranged = false;
  uint64_t offset = 0, bytes = 0;
  std::byte* dst = nullptr;     // Ranged: receives exactly `bytes`.
  std::string* body = nullptr;  // Not ranged: the body, at most `limit`.
  uint64_t limit = 0;
  size_t index = 0;          // For on_done.
  bool count_bytes = false;  // Object data, counted in bytes_received().
  std::string range;         // CURLOPT_RANGE, "first-last".
  int attempt = 0;           // Attempts finished so far.
  CurlS3Client* client = nullptr;

  // The current attempt.
  long status = 0;
  bool have_content_range = false;
  std::string content_range;
  bool have_content_length = false;
  uint64_t content_length = 0;
  std::string etag;
  std::string bucket_region;
  bool checked = false;       // The status and headers were checked (first body byte).
  bool size_unknown = false;  // A 416 that did not say the object's size.
  Status abort;               // Why a callback stopped the transfer (permanent).
  uint64_t received = 0;
  std::string error_body;
  char errbuf[CURL_ERROR_SIZE] = {};

  void ResetAttempt() {
    status = 0;
    ResetHeaders();
    checked = false;
    size_unknown = false;
    abort = Status::Ok();
    received = 0;
    error_body.clear();
    errbuf[0] = '\0';
    if (body != nullptr) body->clear();
  }
  void ResetHeaders() {
    have_content_range = false;
    content_range.clear();
    have_content_length = false;
    content_length = 0;
    etag.clear();
    bucket_region.clear();
  }
  std::string RangeText() const {
    return "[" + std::to_string(offset) + ", " + std::to_string(offset + bytes) + ")";
  }
};

// A multi handle with its easy handles, used by one call at a time.
struct Session {
  CURLM* multi = nullptr;
  std::vector<CURL*> idle;  // Easy handles not in the multi handle now.
  ~Session() {
    for (CURL* e : idle) curl_easy_cleanup(e);
    if (multi != nullptr) curl_multi_cleanup(multi);
  }
};

enum class Outcome { kDone, kRetry, kFail };

class CurlS3Client final : public S3Client {
 public:
  explicit CurlS3Client(S3Settings settings) : S3Client(std::move(settings)) {}
  ~CurlS3Client() override {
    {
      std::lock_guard<std::mutex> lock(pool_mu_);
      pool_.clear();  // Easy handles go before the share they use.
    }
    if (share_ != nullptr) curl_share_cleanup(share_);
    if (headers_ != nullptr) curl_slist_free_all(headers_);
  }

  Status Init();

  Result<std::vector<ObjectInfo>> List(const std::string& bucket, const std::string& prefix,
                                       const std::string& delimiter) override;
  Result<ObjectInfo> Head(const std::string& bucket, const std::string& key) override;
  Result<std::string> Get(const std::string& bucket, const std::string& key,
                          uint64_t limit) override;
  Status GetRanges(std::span<const RangeRequest> requests,
                   const std::function<void(size_t)>& on_done) override;

  uint64_t bytes_received() const override { return bytes_received_.load(); }
  uint64_t retries() const override { return retries_.load(); }

 private:
  static void Lock(CURL*, curl_lock_data data, curl_lock_access, void* user) {
    static_cast<CurlS3Client*>(user)->share_locks_[data % kLocks].lock();
  }
  static void Unlock(CURL*, curl_lock_data data, void* user) {
    static_cast<CurlS3Client*>(user)->share_locks_[data % kLocks].unlock();
  }
  static size_t OnHeader(char* p, size_t size, size_t n, void* user);
  static size_t OnBody(char* p, size_t size, size_t n, void* user);

  std::string Scheme() const {
    return settings_.endpoint == "https://storage.googleapis.com" ? "gs" : "s3";
  }
  std::string Name(const std::string& bucket, const std::string& key) const {
    return Scheme() + "://" + bucket + "/" + key;
  }
  bool PathStyle(const std::string& bucket) const {
    return settings_.path_style || !IsDnsSafeBucketName(bucket);
  }
  // The URL of bucket/key (key already checked); `query` already canonical.
  std::string Url(const std::string& bucket, const std::string& key,
                  const std::string& query) const;
  Status CheckBucket(const std::string& bucket) const;
  Status CheckKey(const std::string& bucket, const std::string& key) const;

  std::unique_ptr<Session> Checkout();
  void Checkin(std::unique_ptr<Session> session);
  Status Configure(CURL* easy, Transfer& t);
  // Checks the status and headers of a 2xx answer before its body is stored.
  Status CheckStart(Transfer& t);
  Outcome Finish(Transfer& t, CURLcode result, Status* error, std::string* retry_reason);
  Status HttpError(Transfer& t, Outcome* outcome, std::string* retry_reason);
  Status ShortObject(const Transfer& t, bool size_known, uint64_t size) const;
  // Runs every transfer; returns the first permanent error, or the error of
  // one that ran out of retries (its index in `*failed` when given).
  Status Run(std::vector<Transfer>& transfers, const std::function<void(size_t)>& on_done,
             size_t* failed = nullptr);

  Result<bool> ListPage(const std::string& bucket, const std::string& prefix,
                        const std::string& delimiter, std::string* token,
                        std::vector<ObjectInfo>* out);

  static constexpr int kLocks = CURL_LOCK_DATA_LAST;
  CURLSH* share_ = nullptr;
  std::mutex share_locks_[kLocks];
  curl_slist* headers_ = nullptr;  // Read-only once built.
  std::string sigv4_;
  std::mutex pool_mu_;
  std::vector<std::unique_ptr<Session>> pool_;
  std::atomic<uint64_t> bytes_received_{0};
  std::atomic<uint64_t> retries_{0};
};

Status CurlS3Client::Init() {
  const CURLcode init = GlobalInit();
  if (init != CURLE_OK) {
    return InternalError(std::string("curl_global_init failed: ") + curl_easy_strerror(init));
  }
  const curl_version_info_data* info = curl_version_info(CURLVERSION_NOW);
  if (info == nullptr || (info->features & CURL_VERSION_SSL) == 0) {
    if (settings_.endpoint.rfind("https://", 0) == 0) {
      return UnimplementedError("the libcurl found at run time has no TLS support; " +
                                settings_.endpoint + " needs it");
    }
  }
  share_ = curl_share_init();
  if (share_ == nullptr) return ResourceExhaustedError("curl_share_init failed");
  if (curl_share_setopt(share_, CURLSHOPT_LOCKFUNC, &CurlS3Client::Lock) != CURLSHE_OK ||
      curl_share_setopt(share_, CURLSHOPT_UNLOCKFUNC, &CurlS3Client::Unlock) != CURLSHE_OK ||
      curl_share_setopt(share_, CURLSHOPT_USERDATA, this) != CURLSHE_OK ||
      curl_share_setopt(share_, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS) != CURLSHE_OK ||
      curl_share_setopt(share_, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION) != CURLSHE_OK) {
    return InternalError("cannot set up the curl share (DNS, TLS sessions)");
  }
  if (!settings_.anonymous) {
    if (settings_.access_key.empty() || settings_.secret_key.empty()) {
      return InvalidArgumentError(
          "S3 settings: signed requests need an access key and a secret "
          "key (credentials from " +
          settings_.credential_source + ")");
    }
    sigv4_ = "aws:amz:" + settings_.region + ":s3";
    // GET and HEAD have empty bodies; S3 takes UNSIGNED-PAYLOAD for them.
    headers_ = curl_slist_append(headers_, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
    if (!settings_.session_token.empty()) {
      curl_slist* h =
          curl_slist_append(headers_, ("x-amz-security-token: " + settings_.session_token).c_str());
      if (h != nullptr) headers_ = h;
    }
    if (headers_ == nullptr) return ResourceExhaustedError("curl_slist_append failed");
  }
  return Status::Ok();
}

std::string CurlS3Client::Url(const std::string& bucket, const std::string& key,
                              const std::string& query) const {
  std::string url;
  if (PathStyle(bucket)) {
    url = settings_.endpoint + "/" + bucket;
    if (!key.empty() || query.empty()) url += "/";
  } else {
    const size_t host = settings_.endpoint.find("://") + 3;
    url = settings_.endpoint.substr(0, host) + bucket + "." + settings_.endpoint.substr(host) + "/";
  }
  url += UriEncode(key, /*keep_slash=*/true);
  if (!query.empty()) url += "?" + query;
  return url;
}

Status CurlS3Client::CheckBucket(const std::string& bucket) const {
  if (!IsValidBucketName(bucket)) {
    return InvalidArgumentError("S3: " + QuoteName(bucket) + " is not a valid bucket name");
  }
  return Status::Ok();
}

Status CurlS3Client::CheckKey(const std::string& bucket, const std::string& key) const {
  TL_RETURN_IF_ERROR(CheckBucket(bucket));
  if (key.empty()) {
    return InvalidArgumentError("S3: an empty object key in bucket " + QuoteName(bucket));
  }
  if (key.size() > kMaxKeyBytes) {
    return InvalidArgumentError("S3: object key " + QuoteName(key) + " is " +
                                std::to_string(key.size()) + " bytes, more than S3's 1024");
  }
  return Status::Ok();
}

std::unique_ptr<Session> CurlS3Client::Checkout() {
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    if (!pool_.empty()) {
      auto s = std::move(pool_.back());
      pool_.pop_back();
      return s;
    }
  }
  auto s = std::make_unique<Session>();
  s->multi = curl_multi_init();
  if (s->multi == nullptr) return nullptr;
  curl_multi_setopt(s->multi, CURLMOPT_MAXCONNECTS,
                    static_cast<long>(std::max(settings_.max_connections, 1)));
  return s;
}

void CurlS3Client::Checkin(std::unique_ptr<Session> session) {
  std::lock_guard<std::mutex> lock(pool_mu_);
  if (pool_.size() < kMaxIdleSessions) pool_.push_back(std::move(session));
}

size_t CurlS3Client::OnHeader(char* p, size_t size, size_t n, void* user) {
  auto& t = *static_cast<Transfer*>(user);
  const size_t len = size * n;
  const std::string_view line(p, len);
  if (line.substr(0, 5) == "HTTP/") {  // A new response (after 1xx or a redirect).
    t.ResetHeaders();
    const size_t sp = line.find(' ');
    uint64_t code = 0;
    if (sp != std::string_view::npos && ParseU64(line.substr(sp + 1, 3), &code)) {
      t.status = static_cast<long>(code);
    }
    return len;
  }
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos) return len;
  const std::string_view name = line.substr(0, colon);
  const std::string_view value = TrimSpace(line.substr(colon + 1));
  if (EqualsNoCase(name, "content-range")) {
    t.have_content_range = true;
    t.content_range = std::string(value.substr(0, 200));
  } else if (EqualsNoCase(name, "content-length")) {
    t.have_content_length = ParseU64(value, &t.content_length);
  } else if (EqualsNoCase(name, "etag")) {
    t.etag = StripQuotes(value.substr(0, 200));
  } else if (EqualsNoCase(name, "x-amz-bucket-region")) {
    t.bucket_region = std::string(value.substr(0, 64));
  }
  return len;
}

size_t CurlS3Client::OnBody(char* p, size_t size, size_t n, void* user) {
  auto& t = *static_cast<Transfer*>(user);
  const size_t len = size * n;
  if (t.status < 200 || t.status > 299) {  // An error body: keep its start.
    const size_t room = kMaxErrorBodyBytes - std::min(kMaxErrorBodyBytes, t.error_body.size());
    t.error_body.append(p, std::min(room, len));
    return len;
  }
  if (!t.checked) {
    t.checked = true;
    t.abort = t.client->CheckStart(t);
    if (!t.abort.ok()) return CURL_WRITEFUNC_ERROR;
  }
  if (t.ranged) {
    if (len > t.bytes - t.received) {
      t.abort = IOError(t.what + ": the server sent more than the " + std::to_string(t.bytes) +
                        " bytes requested");
      return CURL_WRITEFUNC_ERROR;
    }
    std::memcpy(t.dst + t.received, p, len);
    t.received += len;
  } else if (t.body != nullptr) {
    if (len > t.limit - t.body->size()) {
      t.abort = ResourceExhaustedError(t.what + ": the object is more than the limit of " +
                                       std::to_string(t.limit) + " bytes");
      return CURL_WRITEFUNC_ERROR;
    }
    t.body->append(p, len);
    t.received += len;
  }
  if (t.count_bytes) t.client->bytes_received_.fetch_add(len, std::memory_order_relaxed);
  return len;
}

Status CurlS3Client::ShortObject(const Transfer& t, bool size_known, uint64_t size) const {
  const std::string name = Name(t.bucket, t.key);
  if (size_known) {
    return OutOfRangeError("short object: " + name + " is " + std::to_string(size) +
                           " bytes, but bytes " + t.RangeText() + " were requested");
  }
  return OutOfRangeError("short object: " + name + " ends before the requested bytes " +
                         t.RangeText() + " (size not reported)");
}

Status CurlS3Client::CheckStart(Transfer& t) {
  if (t.method == Method::kHead) return Status::Ok();
  if (!t.ranged) {
    if (t.body != nullptr && t.have_content_length && t.content_length > t.limit) {
      return ResourceExhaustedError(t.what + ": the object is " + std::to_string(t.content_length) +
                                    " bytes, more than the limit of " + std::to_string(t.limit));
    }
    return Status::Ok();
  }
  const uint64_t end = t.offset + t.bytes;
  if (t.have_content_range) {
    ContentRange cr;
    if (!ParseContentRange(t.content_range, &cr) || !cr.has_range) {
      return IOError(t.what + ": the server answered with an unreadable Content-Range '" +
                     Printable(t.content_range) + "'");
    }
    if (cr.first == t.offset && cr.last + 1 < end && cr.has_total && cr.last + 1 == cr.total) {
      return ShortObject(t, true, cr.total);
    }
    if (cr.first != t.offset || cr.last + 1 != end) {
      return IOError(t.what + ": the server answered with Content-Range '" +
                     Printable(t.content_range) + "', not the requested range");
    }
    if (t.have_content_length && t.content_length != t.bytes) {
      return IOError(t.what + ": the server answered with Content-Length " +
                     std::to_string(t.content_length) + " for " + std::to_string(t.bytes) +
                     " requested bytes");
    }
    return Status::Ok();
  }
  if (t.status == 206) return IOError(t.what + ": the server answered 206 without Content-Range");
  // 200 without Content-Range: the body is the whole object.
  if (t.have_content_length && t.content_length < end) {
    return ShortObject(t, true, t.content_length);
  }
  if (t.offset != 0 || (t.have_content_length && t.content_length != t.bytes)) {
    return IOError(t.what + ": the server ignored the Range header and sent the whole object" +
                   (t.have_content_length ? " (" + std::to_string(t.content_length) + " bytes)"
                                          : std::string()));
  }
  return Status::Ok();
}

Status CurlS3Client::HttpError(Transfer& t, Outcome* outcome, std::string* retry_reason) {
  std::string code, message;
  ParseS3Error(t.error_body, &code, &message);
  std::string detail = "HTTP " + std::to_string(t.status);
  if (!code.empty()) detail += " " + Printable(code, 64);
  if (!message.empty()) detail += ": " + Printable(message);
  const std::string& endpoint = settings_.endpoint;
  *outcome = Outcome::kFail;
  if (t.status == 429 || t.status == 500 || t.status == 502 || t.status == 503 || t.status == 504 ||
      code == "SlowDown" || code == "RequestTimeout" || code == "InternalError") {
    *outcome = Outcome::kRetry;
    *retry_reason = detail;
    return Status::Ok();
  }
  // Unsigned requests to a store that wants signatures: rclone answers 400
  // UnsupportedAlgorithm, others 400 MissingSecurityHeader or 403.
  const bool unsigned_refused =
      settings_.anonymous && t.status == 400 &&
      (code == "UnsupportedAlgorithm" || code == "MissingSecurityHeader" || code == "AccessDenied");
  if (t.status == 401 || t.status == 403 || unsigned_refused) {
    std::string hint;
    if (settings_.anonymous) {
      hint =
          "; the request was unsigned: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or "
          "AWS_PROFILE for a private bucket";
    }
    return PermissionDeniedError(t.what + ": access denied (" + detail + "); credentials from " +
                                 settings_.credential_source + ", endpoint " + endpoint +
                                 ", region " + settings_.region + hint);
  }
  if (t.status == 404) {
    if (code == "NoSuchBucket") {
      return NotFoundError("bucket " + QuoteName(t.bucket) + " does not exist at " + endpoint +
                           " (" + detail + ")");
    }
    if (t.key.empty())
      return NotFoundError(t.what + ": not found at " + endpoint + " (" + detail + ")");
    return NotFoundError(Name(t.bucket, t.key) + " does not exist at " + endpoint + " (" + detail +
                         ")");
  }
  if (t.status == 416) {
    ContentRange cr;
    const bool known =
        t.have_content_range && ParseContentRange(t.content_range, &cr) && cr.has_total;
    t.size_unknown = !known;
    return ShortObject(t, known, cr.total);
  }
  if (!t.bucket_region.empty() && t.bucket_region != settings_.region &&
      (t.status == 301 || t.status == 307 || t.status == 400)) {
    return InvalidArgumentError("bucket " + QuoteName(t.bucket) + " is in region " +
                                Printable(t.bucket_region, 64) + ", not " + settings_.region +
                                " (set AWS_REGION=" + Printable(t.bucket_region, 64) + "; " +
                                detail + ")");
  }
  if (t.status == 301 || t.status == 307 || t.status == 400) {
    return InvalidArgumentError(t.what + ": " + detail + " (endpoint " + endpoint + ", region " +
                                settings_.region + ", credentials from " +
                                settings_.credential_source + ")");
  }
  return IOError(t.what + ": " + detail + " from " + endpoint);
}

Outcome CurlS3Client::Finish(Transfer& t, CURLcode result, Status* error,
                             std::string* retry_reason) {
  if (!t.abort.ok()) {
    *error = t.abort;
    return Outcome::kFail;
  }
  if (result != CURLE_OK) {
    std::string why = curl_easy_strerror(result);
    if (t.errbuf[0] != '\0') why += " (" + Printable(t.errbuf) + ")";
    if (IsTransientCurlError(result)) {
      *retry_reason = why;
      return Outcome::kRetry;
    }
    *error = UnavailableError(t.what + " from " + settings_.endpoint + ": " + why);
    return Outcome::kFail;
  }
  if (t.status < 200 || t.status > 299) {
    Outcome outcome;
    *error = HttpError(t, &outcome, retry_reason);
    return outcome;
  }
  if (!t.checked) {  // No body came: check the headers now.
    t.checked = true;
    *error = CheckStart(t);
    if (!error->ok()) return Outcome::kFail;
  }
  const bool short_ranged = t.ranged && t.received != t.bytes;
  const bool short_body = !t.ranged && t.method == Method::kGet && t.have_content_length &&
                          t.received != t.content_length;
  if (short_ranged || short_body) {
    *retry_reason = "short body: " + std::to_string(t.received) + " of " +
                    std::to_string(t.ranged ? t.bytes : t.content_length) + " bytes";
    return Outcome::kRetry;
  }
  return Outcome::kDone;
}

#define TL_CURL_SET(easy, option, value)                                               \
  do {                                                                                 \
    if (curl_easy_setopt(easy, option, value) != CURLE_OK) {                           \
      return InternalError("curl_easy_setopt(" #option ") failed (libcurl too old?)"); \
    }                                                                                  \
  } while (0)

Status CurlS3Client::Configure(CURL* e, Transfer& t) {
  curl_easy_reset(e);
  TL_CURL_SET(e, CURLOPT_URL, t.url.c_str());
  TL_CURL_SET(e, CURLOPT_PRIVATE, static_cast<void*>(&t));
  TL_CURL_SET(e, CURLOPT_SHARE, share_);
  TL_CURL_SET(e, CURLOPT_NOSIGNAL, 1L);
  TL_CURL_SET(e, CURLOPT_PATH_AS_IS, 1L);  // Keys may hold "./" and "../".
  TL_CURL_SET(e, CURLOPT_PROTOCOLS_STR, "http,https");
  TL_CURL_SET(e, CURLOPT_FOLLOWLOCATION, 0L);
  TL_CURL_SET(e, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));
  TL_CURL_SET(e, CURLOPT_BUFFERSIZE, kBufferBytes);
  TL_CURL_SET(e, CURLOPT_TCP_KEEPALIVE, 1L);
  TL_CURL_SET(e, CURLOPT_TCP_NODELAY, 1L);
  TL_CURL_SET(e, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(settings_.connect_timeout_ms));
  if (settings_.low_speed_timeout_s > 0) {
    TL_CURL_SET(e, CURLOPT_LOW_SPEED_LIMIT,
                static_cast<long>(std::max<uint64_t>(1, settings_.min_rate)));
    TL_CURL_SET(e, CURLOPT_LOW_SPEED_TIME, static_cast<long>(settings_.low_speed_timeout_s));
  }
  TL_CURL_SET(e, CURLOPT_ERRORBUFFER, t.errbuf);
  TL_CURL_SET(e, CURLOPT_HEADERFUNCTION, &CurlS3Client::OnHeader);
  TL_CURL_SET(e, CURLOPT_HEADERDATA, static_cast<void*>(&t));
  TL_CURL_SET(e, CURLOPT_WRITEFUNCTION, &CurlS3Client::OnBody);
  TL_CURL_SET(e, CURLOPT_WRITEDATA, static_cast<void*>(&t));
  TL_CURL_SET(e, CURLOPT_USERAGENT, "tensorlift");
  if (t.method == Method::kHead) TL_CURL_SET(e, CURLOPT_NOBODY, 1L);
  if (t.ranged) TL_CURL_SET(e, CURLOPT_RANGE, t.range.c_str());
  if (!settings_.ca_bundle.empty()) TL_CURL_SET(e, CURLOPT_CAINFO, settings_.ca_bundle.c_str());
  if (!settings_.anonymous) {
    TL_CURL_SET(e, CURLOPT_AWS_SIGV4, sigv4_.c_str());
    TL_CURL_SET(e, CURLOPT_USERNAME, settings_.access_key.c_str());
    TL_CURL_SET(e, CURLOPT_PASSWORD, settings_.secret_key.c_str());
    TL_CURL_SET(e, CURLOPT_HTTPHEADER, headers_);
  }
  return Status::Ok();
}

#undef TL_CURL_SET

Status CurlS3Client::Run(std::vector<Transfer>& transfers,
                         const std::function<void(size_t)>& on_done, size_t* failed) {
  std::unique_ptr<Session> session = Checkout();
  if (session == nullptr || session->multi == nullptr) {
    return ResourceExhaustedError("curl_multi_init failed");
  }
  const size_t max_in_flight = static_cast<size_t>(std::max(settings_.max_connections, 1));
  std::deque<size_t> ready;
  for (size_t i = 0; i < transfers.size(); ++i) ready.push_back(i);
  std::vector<std::pair<Clock::time_point, size_t>> waiting;  // Retries, after their backoff.
  std::vector<CURL*> active;
  Status failure;

  while (failure.ok()) {
    const auto now = Clock::now();
    for (auto it = waiting.begin(); it != waiting.end();) {
      if (it->first <= now) {
        ready.push_front(it->second);
        it = waiting.erase(it);
      } else {
        ++it;
      }
    }
    while (failure.ok() && active.size() < max_in_flight && !ready.empty()) {
      Transfer& t = transfers[ready.front()];
      ready.pop_front();
      CURL* e = nullptr;
      if (!session->idle.empty()) {
        e = session->idle.back();
        session->idle.pop_back();
      } else if ((e = curl_easy_init()) == nullptr) {
        failure = ResourceExhaustedError("curl_easy_init failed");
        break;
      }
      t.ResetAttempt();
      failure = Configure(e, t);
      if (failure.ok() && curl_multi_add_handle(session->multi, e) != CURLM_OK) {
        failure = InternalError("curl_multi_add_handle failed");
      }
      if (!failure.ok()) {
        session->idle.push_back(e);
        break;
      }
      active.push_back(e);
    }
    if (!failure.ok()) break;
    if (active.empty() && ready.empty() && waiting.empty()) break;

    if (!active.empty()) {
      int running = 0;
      const CURLMcode mc = curl_multi_perform(session->multi, &running);
      if (mc != CURLM_OK) {
        failure = InternalError(std::string("curl_multi_perform: ") + curl_multi_strerror(mc));
        break;
      }
    }
    int left = 0;
    while (failure.ok()) {
      CURLMsg* msg = curl_multi_info_read(session->multi, &left);
      if (msg == nullptr) break;
      if (msg->msg != CURLMSG_DONE) continue;
      CURL* e = msg->easy_handle;
      const CURLcode result = msg->data.result;  // msg dies with remove_handle.
      char* priv = nullptr;
      curl_easy_getinfo(e, CURLINFO_PRIVATE, &priv);
      Transfer& t = *reinterpret_cast<Transfer*>(priv);
      curl_multi_remove_handle(session->multi, e);
      active.erase(std::find(active.begin(), active.end(), e));
      session->idle.push_back(e);
      ++t.attempt;
      Status error;
      std::string reason;
      switch (Finish(t, result, &error, &reason)) {
        case Outcome::kDone:
          if (on_done) on_done(t.index);
          break;
        case Outcome::kRetry:
          if (t.attempt > settings_.retries) {
            failure = UnavailableError(t.what + " from " + settings_.endpoint + ": failed " +
                                       std::to_string(t.attempt) + " time" +
                                       (t.attempt == 1 ? "" : "s") + ", the last time: " + reason);
          } else {
            retries_.fetch_add(1, std::memory_order_relaxed);
            waiting.emplace_back(Clock::now() + Backoff(settings_.retry_base_ms, t.attempt),
                                 static_cast<size_t>(&t - transfers.data()));
          }
          break;
        case Outcome::kFail:
          failure = error;
          break;
      }
      if (!failure.ok() && failed != nullptr) *failed = static_cast<size_t>(&t - transfers.data());
    }
    if (!failure.ok()) break;
    if (active.empty() && ready.empty() && waiting.empty()) break;

    int timeout_ms = kMaxPollMs;
    if (!waiting.empty()) {
      auto first = waiting.front().first;
      for (const auto& w : waiting) first = std::min(first, w.first);
      const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(first - Clock::now());
      timeout_ms = static_cast<int>(std::clamp<int64_t>(wait.count(), 0, kMaxPollMs));
    }
    if (!active.empty()) {
      curl_multi_poll(session->multi, nullptr, 0, timeout_ms, nullptr);
    } else if (ready.empty()) {  // Only retries left, waiting out their backoff.
      std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
    }
  }
  // Cancel what is still running (a permanent error, or a broken loop).
  for (CURL* e : active) {
    curl_multi_remove_handle(session->multi, e);
    session->idle.push_back(e);
  }
  Checkin(std::move(session));
  return failure;
}

Result<bool> CurlS3Client::ListPage(const std::string& bucket, const std::string& prefix,
                                    const std::string& delimiter, std::string* token,
                                    std::vector<ObjectInfo>* out) {
  std::vector<std::pair<std::string, std::string>> params;
  if (!token->empty()) params.emplace_back("continuation-token", *token);
  if (!delimiter.empty()) params.emplace_back("delimiter", delimiter);
  params.emplace_back("encoding-type", "url");
  params.emplace_back("list-type", "2");
  const int page_keys = g_list_page_keys.load();
  if (page_keys != 1000) params.emplace_back("max-keys", std::to_string(page_keys));
  if (!prefix.empty()) params.emplace_back("prefix", prefix);
  std::sort(params.begin(), params.end());  // AWS's canonical order.
  std::string query;
  for (const auto& [k, v] : params) {
    if (!query.empty()) query += '&';
    query += UriEncode(k, false) + "=" + UriEncode(v, false);
  }

  std::vector<Transfer> transfers(1);
  Transfer& t = transfers[0];
  std::string body;
  t.client = this;
  t.bucket = bucket;
  t.url = Url(bucket, "", query);
  t.what = "LIST " + Name(bucket, prefix);
  t.body = &body;
  t.limit = kMaxListBodyBytes;
  TL_RETURN_IF_ERROR(Run(transfers, {}));

  auto page = ParseListPage(body, out->size());
  if (!page.ok()) return page.status().WithContext(t.what);
  for (auto& info : page->objects) out->push_back(std::move(info));
  if (!page->truncated) return false;
  if (page->next_token == *token) {
    return IOError(t.what + ": a truncated listing without a new NextContinuationToken");
  }
  *token = std::move(page->next_token);
  return true;
}

Result<std::vector<ObjectInfo>> CurlS3Client::List(const std::string& bucket,
                                                   const std::string& prefix,
                                                   const std::string& delimiter) {
  TL_RETURN_IF_ERROR(CheckBucket(bucket));
  if (prefix.size() > kMaxKeyBytes || delimiter.size() > kMaxKeyBytes) {
    return InvalidArgumentError("S3: a prefix or delimiter longer than 1024 bytes");
  }
  std::vector<ObjectInfo> out;
  std::string token;
  for (size_t page = 0;; ++page) {
    if (page == kMaxListPages) {
      return ResourceExhaustedError("LIST " + Name(bucket, prefix) + ": more than " +
                                    std::to_string(kMaxListPages) + " pages");
    }
    TL_ASSIGN_OR_RETURN(const bool more, ListPage(bucket, prefix, delimiter, &token, &out));
    if (!more) break;
  }
  return out;
}

Result<ObjectInfo> CurlS3Client::Head(const std::string& bucket, const std::string& key) {
  TL_RETURN_IF_ERROR(CheckKey(bucket, key));
  std::vector<Transfer> transfers(1);
  Transfer& t = transfers[0];
  t.client = this;
  t.method = Method::kHead;
  t.bucket = bucket;
  t.key = key;
  t.url = Url(bucket, key, "");
  t.what = "HEAD " + Name(bucket, key);
  TL_RETURN_IF_ERROR(Run(transfers, {}));
  if (!t.have_content_length) return IOError(t.what + ": the answer has no Content-Length");
  return ObjectInfo{key, t.content_length, t.etag};
}

Result<std::string> CurlS3Client::Get(const std::string& bucket, const std::string& key,
                                      uint64_t limit) {
  TL_RETURN_IF_ERROR(CheckKey(bucket, key));
  std::vector<Transfer> transfers(1);
  Transfer& t = transfers[0];
  std::string body;
  t.client = this;
  t.bucket = bucket;
  t.key = key;
  t.url = Url(bucket, key, "");
  t.what = "GET " + Name(bucket, key);
  t.body = &body;
  t.limit = limit;
  t.count_bytes = true;
  TL_RETURN_IF_ERROR(Run(transfers, {}));
  return body;
}

Status CurlS3Client::GetRanges(std::span<const RangeRequest> requests,
                               const std::function<void(size_t)>& on_done) {
  size_t count = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const RangeRequest& r = requests[i];
    TL_RETURN_IF_ERROR(CheckKey(r.bucket, r.key));
    if (r.bytes == 0) continue;
    if (r.dst == nullptr) {
      return InvalidArgumentError("S3 range request " + std::to_string(i) + " (" +
                                  Name(r.bucket, r.key) + ") has no destination");
    }
    if (r.offset > std::numeric_limits<uint64_t>::max() - r.bytes) {
      return InvalidArgumentError("S3 range request " + std::to_string(i) + " (" +
                                  Name(r.bucket, r.key) + "): offset " + std::to_string(r.offset) +
                                  " + " + std::to_string(r.bytes) + " bytes overflows");
    }
    ++count;
  }
  std::vector<Transfer> transfers(count);
  size_t next = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const RangeRequest& r = requests[i];
    if (r.bytes == 0) {
      if (on_done) on_done(i);
      continue;
    }
    Transfer& t = transfers[next++];
    t.client = this;
    t.bucket = r.bucket;
    t.key = r.key;
    t.url = Url(r.bucket, r.key, "");
    t.ranged = true;
    t.offset = r.offset;
    t.bytes = r.bytes;
    t.dst = r.dst;
    t.index = i;
    t.count_bytes = true;
    t.range = std::to_string(r.offset) + "-" + std::to_string(r.offset + r.bytes - 1);
    t.what = "GET " + Name(r.bucket, r.key) + " bytes " + t.RangeText();
  }
  size_t failed = 0;
  Status st = Run(transfers, on_done, &failed);
  if (st.code() == StatusCode::kOutOfRange && transfers[failed].size_unknown) {
    // The 416 did not say how long the object is; ask, for the message.
    const Transfer& t = transfers[failed];
    auto info = Head(t.bucket, t.key);
    if (info.ok()) return ShortObject(t, true, info->size);
  }
  return st;
}

}  // namespace

void SetS3ListPageKeysForTesting(int keys) { g_list_page_keys = std::clamp(keys, 1, 1000); }

Result<std::unique_ptr<S3Client>> S3Client::Create(const S3Settings& settings) {
  const std::string& e = settings.endpoint;
  if (e.rfind("http://", 0) != 0 && e.rfind("https://", 0) != 0) {
    return InvalidArgumentError("S3 settings: endpoint " + QuoteName(e) +
                                " is not http(s)://host[:port] (use ResolveS3Settings)");
  }
  if (settings.region.empty()) return InvalidArgumentError("S3 settings: the region is empty");
  auto out_of = [](const char* name, int v, int lo, int hi) {
    return InvalidArgumentError(std::string("S3 settings: ") + name + " " + std::to_string(v) +
                                " is not in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                                "]");
  };
  if (settings.max_connections < 1 || settings.max_connections > 1024) {
    return out_of("max_connections", settings.max_connections, 1, 1024);
  }
  if (settings.retries < 0 || settings.retries > 100) {
    return out_of("retries", settings.retries, 0, 100);
  }
  if (settings.connect_timeout_ms < 1 || settings.connect_timeout_ms > 600000) {
    return out_of("connect_timeout_ms", settings.connect_timeout_ms, 1, 600000);
  }
  if (settings.low_speed_timeout_s < 0 || settings.low_speed_timeout_s > 3600) {
    return out_of("low_speed_timeout_s", settings.low_speed_timeout_s, 0, 3600);
  }
  if (settings.min_rate > (uint64_t{1} << 40)) {
    return InvalidArgumentError("S3 settings: min_rate " + std::to_string(settings.min_rate) +
                                " bytes/s is over 1 TiB/s");
  }
  if (settings.retry_base_ms < 0 || settings.retry_base_ms > 60000) {
    return out_of("retry_base_ms", settings.retry_base_ms, 0, 60000);
  }
  TL_RETURN_IF_ERROR(LoadCurl().status());
  auto client = std::make_unique<CurlS3Client>(settings);
  TL_RETURN_IF_ERROR(client->Init());
  return std::unique_ptr<S3Client>(std::move(client));
}

Result<std::string> S3ClientVersion() {
  TL_ASSIGN_OR_RETURN(const CurlApi* api, LoadCurl());
  const curl_version_info_data* info = curl_version_info(CURLVERSION_NOW);
  if (info == nullptr) return InternalError("curl_version_info failed");
  std::string v = std::string("libcurl ") + (info->version ? info->version : "?");
  v += info->ssl_version ? std::string(", ") + info->ssl_version : std::string(", no TLS");
  return v + " (" + api->path + ")";
}

}  // namespace tensorlift::objstore
