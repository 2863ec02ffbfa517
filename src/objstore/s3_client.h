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
// Object URLs, bucket names and S3Settings are in s3_settings.h (included).
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
#include "objstore/s3_settings.h"
#include "tensorlift/status.h"

namespace tensorlift::objstore {

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
