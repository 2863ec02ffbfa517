// The S3 client's transfers over libcurl's multi interface (see
// s3_transfers.h): the session pool, the curl options of a request, the
// header and body callbacks, and the multi loop with its retries.
//
// Signing: CURLOPT_AWS_SIGV4 "aws:amz:<region>:s3" with the key pair, plus
// the x-amz-content-sha256 header S3 requires and x-amz-security-token for
// session credentials (the path and query are built canonical by
// s3_client.cc).
#include "objstore/s3_transfers.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "objstore/curl_api.h"
#include "objstore/s3_answers.h"

namespace tensorlift::objstore {
namespace {

constexpr long kBufferBytes = 512 * 1024;
constexpr int kMaxBackoffMs = 5000;
constexpr int kMaxPollMs = 1000;
constexpr size_t kMaxIdleSessions = 4;

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

}  // namespace

Session::~Session() {
  for (CURL* e : idle) curl_easy_cleanup(e);
  if (multi != nullptr) curl_multi_cleanup(multi);
}

S3Transfers::~S3Transfers() {
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    pool_.clear();  // Easy handles go before the share they use.
  }
  if (share_ != nullptr) curl_share_cleanup(share_);
  if (headers_ != nullptr) curl_slist_free_all(headers_);
}

Status S3Transfers::Init() {
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
  if (curl_share_setopt(share_, CURLSHOPT_LOCKFUNC, &S3Transfers::Lock) != CURLSHE_OK ||
      curl_share_setopt(share_, CURLSHOPT_UNLOCKFUNC, &S3Transfers::Unlock) != CURLSHE_OK ||
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

std::string S3Transfers::Name(const std::string& bucket, const std::string& key) const {
  const std::string scheme = settings_.endpoint == "https://storage.googleapis.com" ? "gs" : "s3";
  return scheme + "://" + bucket + "/" + key;
}

std::unique_ptr<Session> S3Transfers::Checkout() {
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

void S3Transfers::Checkin(std::unique_ptr<Session> session) {
  std::lock_guard<std::mutex> lock(pool_mu_);
  if (pool_.size() < kMaxIdleSessions) pool_.push_back(std::move(session));
}

size_t S3Transfers::OnHeader(char* p, size_t size, size_t n, void* user) {
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

size_t S3Transfers::OnBody(char* p, size_t size, size_t n, void* user) {
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

#define TL_CURL_SET(easy, option, value)                                               \
  do {                                                                                 \
    if (curl_easy_setopt(easy, option, value) != CURLE_OK) {                           \
      return InternalError("curl_easy_setopt(" #option ") failed (libcurl too old?)"); \
    }                                                                                  \
  } while (0)

Status S3Transfers::Configure(CURL* e, Transfer& t) {
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
  TL_CURL_SET(e, CURLOPT_HEADERFUNCTION, &S3Transfers::OnHeader);
  TL_CURL_SET(e, CURLOPT_HEADERDATA, static_cast<void*>(&t));
  TL_CURL_SET(e, CURLOPT_WRITEFUNCTION, &S3Transfers::OnBody);
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

Status S3Transfers::Run(std::vector<Transfer>& transfers,
                        const std::function<void(size_t)>& on_done, size_t* failed) {
  for (Transfer& t : transfers) t.client = this;
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

}  // namespace tensorlift::objstore
