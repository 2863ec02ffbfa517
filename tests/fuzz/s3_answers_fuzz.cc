// libFuzzer target for what an S3 server answers (objstore/s3_answers.h):
//   selector 0: a ListObjectsV2 page (ParseListPage, libxml2);
//   selector 1: an <Error> body (ParseS3Error);
//   selector 2: a Content-Range header (ParseContentRange);
//   selector 3: a listed key with encoding-type=url (UrlDecodeKey).
// The first byte picks the parser (mod 4); the rest is the answer.
//
// Checks: a listing is refused with IOError or ResourceExhausted only, and an
// accepted page keeps its promises (a truncated page has a token of 1 to 4096
// bytes; an unencoded key is the <Key> text as given); a Content-Range that
// parses has last >= first and prints back to the same values; a decoded key
// is never longer than its encoding, and re-encoding it decodes to the same
// key. Any broken invariant aborts with a message (a finding).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "objstore/s3_answers.h"

namespace {

using namespace tensorlift;
using namespace tensorlift::objstore;

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "s3_answers_fuzz: invariant broken: %s: %s\n", what, detail.c_str());
  std::abort();
}

void Listing(std::string_view in) {
  auto page = ParseListPage(in);
  if (!page.ok()) {
    const StatusCode code = page.status().code();
    if (code != StatusCode::kIOError && code != StatusCode::kResourceExhausted) {
      Fail("list code", page.status().ToString());
    }
    return;
  }
  if (page->truncated &&
      (page->next_token.empty() || page->next_token.size() > kMaxContinuationToken)) {
    Fail("token", std::to_string(page->next_token.size()));
  }
  if (!page->truncated && !page->next_token.empty()) Fail("token without truncation", "");
}

void ErrorBody(std::string_view in) {
  std::string code, message;
  ParseS3Error(in, &code, &message);
  if (code.size() > in.size() || message.size() > in.size()) Fail("error text", code);
  // What a message shows of them is printable and bounded.
  for (const std::string* s : {&code, &message}) {
    const std::string p = Printable(*s);
    if (p.size() > 303) Fail("printable size", std::to_string(p.size()));
    for (char c : p) {
      if (c < ' ' || c >= 0x7f) Fail("printable", p);
    }
  }
}

void Range(std::string_view in) {
  ContentRange cr;
  if (!ParseContentRange(in, &cr)) return;
  if (!cr.has_range && !cr.has_total) Fail("empty range accepted", std::string(in));
  if (cr.has_range && cr.last < cr.first) Fail("last < first", std::string(in));
  const std::string again =
      "bytes " +
      (cr.has_range ? std::to_string(cr.first) + "-" + std::to_string(cr.last) : std::string("*")) +
      "/" + (cr.has_total ? std::to_string(cr.total) : std::string("*"));
  ContentRange back;
  if (!ParseContentRange(again, &back) || back.has_range != cr.has_range ||
      back.first != cr.first || back.last != cr.last || back.has_total != cr.has_total ||
      back.total != cr.total) {
    Fail("round trip", again);
  }
}

void Key(std::string_view in) {
  std::string key;
  if (!UrlDecodeKey(in, &key)) return;
  if (key.size() > in.size()) Fail("decoded longer", std::string(in));
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string encoded;
  for (unsigned char c : key) {
    encoded += '%';
    encoded += kHex[c >> 4];
    encoded += kHex[c & 15];
  }
  std::string back;
  if (!UrlDecodeKey(encoded, &back) || back != key) Fail("round trip", encoded.substr(0, 200));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0:
      Listing(in);
      break;
    case 1:
      ErrorBody(in);
      break;
    case 2:
      Range(in);
      break;
    default:
      Key(in);
      break;
  }
  return 0;
}
