// An S3 client for object-storage sources: AWS S3 and any store with its API
// (MinIO, Ceph, SeaweedFS, rclone, GCS's XML API with HMAC keys), over
// libcurl's multi interface (Debian's libcurl4-openssl-dev) with OpenSSL TLS.
//
//   auto settings = ResolveS3Settings("s3", {});          // env + ~/.aws files
//   auto client = S3Client::Create(*settings);
//   auto objects = (*client)->List("bucket", "models/llama/");
//   (*client)->GetRanges(requests);                       // parallel ranged GETs
//
// Requests are signed with AWS SigV4 (CURLOPT_AWS_SIGV4, with the
// x-amz-content-sha256 header S3 wants and the query parameters sorted), or
// sent unsigned (public buckets). Every answer is untrusted input: listings
// and error bodies are parsed with limits, Content-Range and lengths are
// checked against the request, and nothing is written outside a request's
// destination.
//
// Thread safety: an S3Client may be used from several threads at once (each
// call checks its own curl multi handle out of a pool, whose connection cache
// keeps connections alive from call to call; DNS answers and TLS sessions
// are shared through a lock-protected curl share). Connections themselves are
// not put in the share: libcurl does not support that across threads.
#ifndef TENSORLIFT_OBJSTORE_S3_CLIENT_H_
#define TENSORLIFT_OBJSTORE_S3_CLIENT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "objstore/object_info.h"
#include "tensorlift/status.h"

namespace tensorlift::objstore {

// s3://bucket/key and gs://bucket/key (key may be empty or a prefix).
struct ObjectUrl {
  std::string scheme;  // "s3" or "gs"
  std::string bucket;
  std::string key;  // Without a leading '/'.
  std::string ToString() const { return scheme + "://" + bucket + "/" + key; }
};
// True for "s3://" and "gs://" paths.
bool IsObjectUrl(std::string_view path);
// InvalidArgument naming the URL when it is not scheme://bucket[/key] with a
// valid bucket name (and a key of at most 1024 bytes, no control characters).
Result<ObjectUrl> ParseObjectUrl(std::string_view url);
// S3's bucket naming rules (3 to 63 lowercase letters, digits, '.' and '-',
// letter or digit at both ends, no "..", not an IPv4 address), plus the
// uppercase and '_' of legacy S3 buckets and GCS's dotted names of up to 222.
bool IsValidBucketName(std::string_view bucket);
// Valid and usable as a DNS label under TLS (no dots, no uppercase, no '_'):
// only such buckets are addressed virtual-hosted style.
bool IsDnsSafeBucketName(std::string_view bucket);

// Settings that override what the environment says (empty: not given).
struct S3Overrides {
  std::string endpoint;  // "http://127.0.0.1:9000", "https://s3.eu-west-1.amazonaws.com"
  std::string region;
  std::string profile;
  std::string access_key, secret_key, session_token;
  bool anonymous = false;  // Unsigned requests (public buckets).
  // "auto" (path-style for custom endpoints and for bucket names that are not
  // DNS-safe, virtual-hosted for AWS), "path" or "virtual".
  std::string addressing = "auto";
};

// Where requests go and how they are signed, found the way AWS's own tools
// find them: overrides first, then the variables AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION (AWS_DEFAULT_REGION),
// AWS_ENDPOINT_URL (AWS_ENDPOINT_URL_S3 first), AWS_PROFILE, AWS_CA_BUNDLE,
// then ~/.aws/credentials and ~/.aws/config (AWS_SHARED_CREDENTIALS_FILE,
// AWS_CONFIG_FILE) for the profile ("default" unless named). gs: the endpoint
// is https://storage.googleapis.com and the region "auto" unless overridden
// (the AWS endpoint and region variables and config keys are not used for gs;
// the credentials are, as GCS HMAC keys). A named profile found in neither
// file is NotFound naming both. No credentials anywhere means unsigned
// requests. Also read: config's region, endpoint_url, ca_bundle and nested
// "s3 =" endpoint_url / addressing_style (used when addressing is "auto").
struct S3Settings {
  std::string endpoint;  // Scheme, host and port; no trailing '/'.
  std::string region = "us-east-1";
  std::string access_key, secret_key, session_token;
  bool anonymous = false;
  bool path_style = true;
  std::string ca_bundle;  // Empty: the system's CAs.
  // Where the credentials came from, for messages: "environment",
  // "~/.aws/credentials [profile]", "given", "none (unsigned)".
  std::string credential_source;
  // Transfers.
  int max_connections = 16;  // Requests in flight at once.
  int retries = 5;           // Per request, on 5xx, throttling, timeouts, resets.
  int connect_timeout_ms = 10000;
  // A transfer slower than min_rate bytes/s for low_speed_timeout_s is a time-out (retried);
  // 0 s: none.
  int low_speed_timeout_s = 30;
  uint64_t min_rate = 64 << 10;  // 0: 1 byte/s.
  int retry_base_ms = 100;       // Backoff: base * 2^attempt, with jitter, capped at 5 s.
};
Result<S3Settings> ResolveS3Settings(std::string_view scheme, const S3Overrides& overrides);

// One ranged GET: bytes [offset, offset + bytes) of bucket/key land in
// dst[0, bytes). A range past the object's end is an error ("short object").
struct RangeRequest {
  std::string bucket;
  std::string key;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  std::byte* dst = nullptr;
};

// "libcurl 7.88.1, OpenSSL/3.0.19" (the library loaded, and its TLS), or
// Unimplemented with the reason when built without the client.
Result<std::string> S3ClientVersion();

class S3Client {
 public:
  static Result<std::unique_ptr<S3Client>> Create(const S3Settings& settings);
  virtual ~S3Client() = default;

  const S3Settings& settings() const { return settings_; }

  // Every object under `prefix` (ListObjectsV2, all pages). With `delimiter`
  // "/" only the objects directly under it (sub-prefixes are left out).
  virtual Result<std::vector<ObjectInfo>> List(const std::string& bucket, const std::string& prefix,
                                               const std::string& delimiter = "") = 0;
  // HEAD: the object's size and ETag. NotFound naming the key when missing.
  virtual Result<ObjectInfo> Head(const std::string& bucket, const std::string& key) = 0;
  // The whole object, when at most `limit` bytes (else an error naming both).
  virtual Result<std::string> Get(const std::string& bucket, const std::string& key,
                                  uint64_t limit) = 0;
  // Every request, up to settings().max_connections at once over kept-alive
  // connections, each written straight into its destination; a request that
  // fails with a transient error (5xx, 429/SlowDown, a timeout, a reset, a
  // short body) is retried from its start with backoff. Returns the first
  // permanent error (403 naming the credential source and the endpoint, 404
  // naming the key, a short object saying so), after cancelling the rest.
  // `on_done(i)` (may be empty) is called once per completed request, from
  // the calling thread.
  virtual Status GetRanges(std::span<const RangeRequest> requests,
                           const std::function<void(size_t)>& on_done = {}) = 0;

  // Bytes of object data received so far (all calls, retries included).
  virtual uint64_t bytes_received() const = 0;
  // Requests retried so far.
  virtual uint64_t retries() const = 0;

 protected:
  explicit S3Client(S3Settings settings) : settings_(std::move(settings)) {}
  S3Settings settings_;
};

}  // namespace tensorlift::objstore

#endif  // TENSORLIFT_OBJSTORE_S3_CLIENT_H_
