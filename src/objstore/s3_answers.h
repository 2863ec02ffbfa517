// Parsers for what an S3 server answers: ListObjectsV2 pages, <Error>
// bodies, Content-Range headers, and the small pieces they are made of.
// Everything here is untrusted input from the network, so each parser is
// bounded and fuzzed (tests/fuzz/s3_answers_fuzz.cc). None of it needs
// libcurl: the client (s3_client.cc, s3_transfer_checks.cc) calls these on
// the bytes it received.
#ifndef TENSORLIFT_OBJSTORE_S3_ANSWERS_H_
#define TENSORLIFT_OBJSTORE_S3_ANSWERS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "objstore/object_info.h"
#include "tensorlift/status.h"

namespace tensorlift::objstore {

// Limits on answers.
inline constexpr size_t kMaxListBodyBytes = size_t{64} << 20;   // One listing page.
inline constexpr size_t kMaxErrorBodyBytes = size_t{64} << 10;  // An <Error> body kept.
inline constexpr size_t kMaxListedObjects = size_t{10} << 20;   // All pages of one List.
inline constexpr size_t kMaxContinuationToken = 4096;

// libxml2's one-time initialisation (thread-safe; called by the parsers).
void InitXml();

// Text from the network for a message: at most `max_bytes`, control and
// non-ASCII bytes as '?', "..." when cut.
std::string Printable(std::string_view s, size_t max_bytes = 300);
// A decimal of at most 20 digits that fits in 64 bits, nothing else.
bool ParseU64(std::string_view s, uint64_t* out);
// Decodes a key from a listing with encoding-type=url: %XX and '+' (space),
// as S3 writes them. False on a malformed escape.
bool UrlDecodeKey(std::string_view s, std::string* out);
// `s` without one pair of surrounding double quotes (ETags).
std::string StripQuotes(std::string_view s);

// "bytes FIRST-LAST/TOTAL" (TOTAL may be '*'), or "bytes */TOTAL" (416).
struct ContentRange {
  bool has_range = false;
  uint64_t first = 0, last = 0;  // Inclusive; last >= first.
  bool has_total = false;
  uint64_t total = 0;
};
bool ParseContentRange(std::string_view v, ContentRange* out);

// The Code and Message of an S3 <Error> body ("" when it has none, or when
// the body is not such a document).
void ParseS3Error(std::string_view body, std::string* code, std::string* message);

// One ListObjectsV2 page (a ListBucketResult document).
struct ListPage {
  std::vector<ObjectInfo> objects;  // Keys decoded when EncodingType is "url".
  bool truncated = false;           // IsTruncated: another page follows.
  std::string next_token;           // NextContinuationToken (set when truncated).
};
// IOError (the message without the request's name) for a body that is not a
// ListBucketResult, an entry without a Key or a valid Size, a badly encoded
// key, or a truncated page without a token of 1 to kMaxContinuationToken
// bytes; ResourceExhausted when `listed_before` plus this page's objects
// exceed kMaxListedObjects.
Result<ListPage> ParseListPage(std::string_view body, size_t listed_before = 0);

}  // namespace tensorlift::objstore

#endif  // TENSORLIFT_OBJSTORE_S3_ANSWERS_H_
