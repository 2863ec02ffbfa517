// The S3 client's transfers over libcurl's multi interface (private to
// objstore/; used by s3_client.cc).
//
// S3Transfers runs a batch of requests in one multi loop on the calling
// thread: it checks a Session (a curl multi handle and its easy handles) out
// of a small pool, whose connection cache keeps connections alive from call
// to call; DNS answers and TLS sessions are shared between sessions through a
// lock-protected curl share. (Connections are not put in the share: libcurl
// does not support sharing them between concurrent threads.) A transient
// failure is retried with backoff; the first permanent one cancels the rest.
//
// Every answer is untrusted (s3_transfer_checks.cc): status lines,
// Content-Range and Content-Length are checked against the request before a
// byte is stored, a ranged body is written only inside its destination, and
// error bodies are kept only up to kMaxErrorBodyBytes.
//
// Thread safety: Run may be called from several threads at once.
#ifndef TENSORLIFT_OBJSTORE_S3_TRANSFERS_H_
#define TENSORLIFT_OBJSTORE_S3_TRANSFERS_H_

// libcurl is opened at run time (curl_api.h): every curl_* call goes through
// the table LoadCurl fills.
#ifndef CURL_DISABLE_TYPECHECK
#define CURL_DISABLE_TYPECHECK
#endif
#include <curl/curl.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "objstore/s3_settings.h"
#include "tensorlift/status.h"

namespace tensorlift::objstore {

enum class Method { kGet, kHead };

class S3Transfers;

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
  size_t index = 0;               // For on_done.
  bool count_bytes = false;       // Object data, counted in bytes_received().
  std::string range;              // CURLOPT_RANGE, "first-last".
  int attempt = 0;                // Attempts finished so far.
  S3Transfers* client = nullptr;  // Set by S3Transfers::Run.

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
  ~Session();
};

enum class Outcome { kDone, kRetry, kFail };

class S3Transfers {
 public:
  // `settings` must outlive this object (the client's own).
  explicit S3Transfers(const S3Settings& settings) : settings_(settings) {}
  ~S3Transfers();
  S3Transfers(const S3Transfers&) = delete;
  S3Transfers& operator=(const S3Transfers&) = delete;

  // curl_global_init (once per process), the share and the signing headers.
  // Only after LoadCurl succeeded.
  Status Init();

  // Runs every transfer; returns the first permanent error, or the error of
  // one that ran out of retries (its index in `*failed` when given).
  Status Run(std::vector<Transfer>& transfers, const std::function<void(size_t)>& on_done,
             size_t* failed = nullptr);

  // "s3://bucket/key" ("gs://" for GCS's endpoint), for messages.
  std::string Name(const std::string& bucket, const std::string& key) const;
  // OutOfRange "short object: ..." for a ranged transfer past the object's end.
  Status ShortObject(const Transfer& t, bool size_known, uint64_t size) const;

  uint64_t bytes_received() const { return bytes_received_.load(); }
  uint64_t retries() const { return retries_.load(); }

 private:
  static void Lock(CURL*, curl_lock_data data, curl_lock_access, void* user) {
    static_cast<S3Transfers*>(user)->share_locks_[data % kLocks].lock();
  }
  static void Unlock(CURL*, curl_lock_data data, void* user) {
    static_cast<S3Transfers*>(user)->share_locks_[data % kLocks].unlock();
  }
  static size_t OnHeader(char* p, size_t size, size_t n, void* user);
  static size_t OnBody(char* p, size_t size, size_t n, void* user);

  std::unique_ptr<Session> Checkout();
  void Checkin(std::unique_ptr<Session> session);
  Status Configure(CURL* easy, Transfer& t);

  // Answer checks (s3_transfer_checks.cc).
  // Checks the status and headers of a 2xx answer before its body is stored.
  Status CheckStart(Transfer& t);
  Outcome Finish(Transfer& t, CURLcode result, Status* error, std::string* retry_reason);
  Status HttpError(Transfer& t, Outcome* outcome, std::string* retry_reason);

  static constexpr int kLocks = CURL_LOCK_DATA_LAST;
  const S3Settings& settings_;
  CURLSH* share_ = nullptr;
  std::mutex share_locks_[kLocks];
  curl_slist* headers_ = nullptr;  // Read-only once built.
  std::string sigv4_;
  std::mutex pool_mu_;
  std::vector<std::unique_ptr<Session>> pool_;
  std::atomic<uint64_t> bytes_received_{0};
  std::atomic<uint64_t> retries_{0};
};

}  // namespace tensorlift::objstore

#endif  // TENSORLIFT_OBJSTORE_S3_TRANSFERS_H_
