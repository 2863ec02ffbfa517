// Where an S3 client's requests go and how they are signed: object URLs
// (s3://, gs://), bucket names, and the settings found the way AWS's own
// tools find them (s3_settings.cc). Pure functions of their inputs and the
// environment; thread-safe.
#ifndef TENSORLIFT_OBJSTORE_S3_SETTINGS_H_
#define TENSORLIFT_OBJSTORE_S3_SETTINGS_H_

#include <cstdint>
#include <string>
#include <string_view>

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

}  // namespace tensorlift::objstore

#endif  // TENSORLIFT_OBJSTORE_S3_SETTINGS_H_
