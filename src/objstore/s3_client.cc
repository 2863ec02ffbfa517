// The S3 client over libcurl's multi interface (see s3_client.h): the
// requests of each call (ListObjectsV2 pages, HEAD, GET, ranged GETs), their
// URLs and checks of bucket names and keys. Running them (the session pool,
// signing, the multi loop, retries, the checks of every answer) is
// s3_transfers.h's.
//
// libcurl 7.88 signs the path and the query exactly as given, so both are
// built here already in AWS's canonical form: every byte but the RFC 3986
// unreserved ones percent-encoded (uppercase hex), '/' kept in paths, query
// parameters sorted by name.
#include "objstore/s3_client.h"

// libcurl is opened at run time (curl_api.h): every curl_* call below goes
// through the table LoadCurl fills.
#define CURL_DISABLE_TYPECHECK
#include <curl/curl.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "objstore/curl_api.h"
#include "objstore/s3_answers.h"
#include "objstore/s3_transfers.h"
#include "tensorlift/text.h"

namespace tensorlift::objstore {

// Objects per ListObjectsV2 page (S3's maximum is 1000). Tests lower it to
// exercise pagination; not part of the public interface.
void SetS3ListPageKeysForTesting(int keys);

namespace {

constexpr size_t kMaxListPages = 100000;
constexpr size_t kMaxKeyBytes = 1024;

std::atomic<int> g_list_page_keys{1000};

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

class CurlS3Client final : public S3Client {
 public:
  explicit CurlS3Client(S3Settings settings)
      : S3Client(std::move(settings)), transfers_(settings_) {}

  Status Init() { return transfers_.Init(); }

  Result<std::vector<ObjectInfo>> List(const std::string& bucket, const std::string& prefix,
                                       const std::string& delimiter) override;
  Result<ObjectInfo> Head(const std::string& bucket, const std::string& key) override;
  Result<std::string> Get(const std::string& bucket, const std::string& key,
                          uint64_t limit) override;
  Status GetRanges(std::span<const RangeRequest> requests,
                   const std::function<void(size_t)>& on_done) override;

  uint64_t bytes_received() const override { return transfers_.bytes_received(); }
  uint64_t retries() const override { return transfers_.retries(); }

 private:
  std::string Name(const std::string& bucket, const std::string& key) const {
    return transfers_.Name(bucket, key);
  }
  bool PathStyle(const std::string& bucket) const {
    return settings_.path_style || !IsDnsSafeBucketName(bucket);
  }
  // The URL of bucket/key (key already checked); `query` already canonical.
  std::string Url(const std::string& bucket, const std::string& key,
                  const std::string& query) const;
  Status CheckBucket(const std::string& bucket) const;
  Status CheckKey(const std::string& bucket, const std::string& key) const;
  Status Run(std::vector<Transfer>& transfers, const std::function<void(size_t)>& on_done,
             size_t* failed = nullptr) {
    return transfers_.Run(transfers, on_done, failed);
  }

  Result<bool> ListPage(const std::string& bucket, const std::string& prefix,
                        const std::string& delimiter, std::string* token,
                        std::vector<ObjectInfo>* out);

  S3Transfers transfers_;
};

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
    if (info.ok()) return transfers_.ShortObject(t, true, info->size);
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
