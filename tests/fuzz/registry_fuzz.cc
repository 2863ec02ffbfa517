// libFuzzer target for etcd's answers to a seed lookup (remote::ParseRangePage:
// a /v3/kv/range reply, whose keys and values are base64 and whose values are
// JSON seed entries put there by anyone who can write to etcd).
//
// The first byte picks how the rest is used:
//   even: the reply's JSON as it arrives;
//   odd:  lines "KEY-SUFFIX<TAB>VALUE" wrapped here into a well-formed reply
//         (keys under the digest's prefix, both base64-encoded), so that the
//         fuzzer reaches the entry parser without having to learn base64.
// Checks: a rejection is Corruption; an accepted page has at most `limit`
// entries, each either a seed or skipped; every seed is valid (http:// URL,
// 0 <= rank < world <= 65536, finite load >= 0, 1 to 64 lowercase hex digits
// of id) and its key agrees with it; the last key is under the prefix. Any
// broken invariant aborts with a message (a finding).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "remote/registry.h"

namespace {

constexpr std::string_view kDigest = "0123456789abcdef";
constexpr std::string_view kPrefix = "/tensorlift/seeds/0123456789abcdef/";
constexpr size_t kLimit = 500;

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "registry_fuzz: invariant broken: %s: %s\n", what, detail.c_str());
  std::abort();
}

std::string Base64(std::string_view in) {
  static constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += kB64[v & 63];
  }
  if (i + 1 == in.size()) {
    const uint32_t v = uint8_t(in[i]) << 16;
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

std::string Wrap(std::string_view lines) {
  std::string kvs;
  while (!lines.empty()) {
    const size_t nl = lines.find('\n');
    std::string_view line = lines.substr(0, nl);
    lines = nl == std::string_view::npos ? std::string_view() : lines.substr(nl + 1);
    const size_t tab = line.find('\t');
    if (tab == std::string_view::npos) continue;
    if (!kvs.empty()) kvs += ',';
    kvs += "{\"key\":\"" + Base64(std::string(kPrefix) + std::string(line.substr(0, tab))) +
           "\",\"value\":\"" + Base64(line.substr(tab + 1)) + "\"}";
  }
  return "{\"header\":{},\"kvs\":[" + kvs + "],\"count\":\"1\"}";
}

bool LowerHex(std::string_view s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::string reply = data[0] % 2 == 0 ? std::string(in) : Wrap(in);
  auto page = tensorlift::remote::ParseRangePage(reply, kDigest, kLimit);
  if (!page.ok()) {
    if (page.status().code() != tensorlift::StatusCode::kCorruption) {
      Fail("error code", page.status().ToString());
    }
    return 0;
  }
  if (page->entries > kLimit || page->seeds.size() + page->skipped != page->entries) {
    Fail("counts", std::to_string(page->entries) + " entries, " +
                       std::to_string(page->seeds.size()) + " seeds, " +
                       std::to_string(page->skipped) + " skipped");
  }
  if (page->entries > 0 && page->last_key.compare(0, kPrefix.size(), kPrefix) != 0) {
    Fail("last key", page->last_key.substr(0, 200));
  }
  for (const auto& s : page->seeds) {
    if (s.key_digest != kDigest) Fail("digest", s.key_digest);
    if (s.url.rfind("http://", 0) != 0 || s.url.size() <= 7 || s.url.size() > 1024) {
      Fail("url", s.url.substr(0, 200));
    }
    if (s.world < 1 || s.world > 65536 || s.rank < 0 || s.rank >= s.world) {
      Fail("rank", std::to_string(s.rank) + "/" + std::to_string(s.world));
    }
    if (!std::isfinite(s.load) || s.load < 0) Fail("load", std::to_string(s.load));
    if (s.id.empty() || s.id.size() > 64 || !LowerHex(s.id)) Fail("id", s.id.substr(0, 100));
  }
  return 0;
}
