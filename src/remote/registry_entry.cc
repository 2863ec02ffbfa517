// The registry's seed entries: keys, values, their checks and etcd's range
// replies (see registry_entry.h). Entry values are untrusted: each is bounded
// and validated, and entries that fail are skipped.
#include "remote/registry_entry.h"

#include <openssl/rand.h>
#include <simdjson.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <utility>

#include "tensorlift/content.h"
#include "tensorlift/text.h"

namespace tensorlift::remote {
namespace {

constexpr std::string_view kKeyRoot = "/tensorlift/seeds/";
constexpr size_t kMaxValueBytes = 4096;
constexpr size_t kMaxIdHexDigits = 64;
constexpr int64_t kMaxWorld = 65536;

bool IsLowerHex(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// Printable ASCII without spaces, quotes or backslashes: what a URL holds.
bool IsUrlText(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return c > ' ' && c < 0x7f && c != '"' && c != '\\'; });
}

constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int Base64Value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Strict decoding: length a multiple of 4, padding only at the end.
bool Base64Decode(std::string_view in, std::string* out) {
  out->clear();
  if (in.size() % 4 != 0) return false;
  out->reserve(in.size() / 4 * 3);
  for (size_t i = 0; i < in.size(); i += 4) {
    const bool last = i + 4 == in.size();
    const size_t pad = last ? (in[i + 3] == '=') + (in[i + 3] == '=' && in[i + 2] == '=') : 0;
    uint32_t v = 0;
    for (size_t j = 0; j < 4; ++j) {
      int d = 0;
      if (j < 4 - pad) {
        d = Base64Value(in[i + j]);
        if (d < 0) return false;
      }
      v = (v << 6) | static_cast<uint32_t>(d);
    }
    out->push_back(static_cast<char>(v >> 16));
    if (pad < 2) out->push_back(static_cast<char>((v >> 8) & 0xff));
    if (pad < 1) out->push_back(static_cast<char>(v & 0xff));
  }
  return true;
}

}  // namespace

std::string Printable(std::string_view s, size_t max_bytes) {
  std::string out;
  for (char c : s.substr(0, max_bytes)) out += (c >= ' ' && c < 0x7f) ? c : '?';
  if (s.size() > max_bytes) out += "...";
  return out;
}

std::string Base64Encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= in.size(); i += 3) {
    const uint32_t v = (uint32_t{static_cast<uint8_t>(in[i])} << 16) |
                       (uint32_t{static_cast<uint8_t>(in[i + 1])} << 8) |
                       static_cast<uint8_t>(in[i + 2]);
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += kB64[v & 63];
  }
  const size_t rest = in.size() - i;
  if (rest > 0) {
    uint32_t v = uint32_t{static_cast<uint8_t>(in[i])} << 16;
    if (rest == 2) v |= uint32_t{static_cast<uint8_t>(in[i + 1])} << 8;
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += rest == 2 ? kB64[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string FormatDouble(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

bool ParseInt64(std::string_view s, int64_t* out) {
  if (s.empty() || s.size() > 20) return false;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), *out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

Result<std::string> RandomHex(size_t bytes) {
  unsigned char buf[32];
  if (bytes > sizeof(buf) || RAND_bytes(buf, static_cast<int>(bytes)) != 1) {
    return InternalError("cannot draw " + std::to_string(bytes) + " random bytes (RAND_bytes)");
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < bytes; ++i) {
    out += kHex[buf[i] >> 4];
    out += kHex[buf[i] & 0xf];
  }
  return out;
}

Status ValidateDigest(std::string_view digest) {
  if (digest.size() != kDigestHexDigits || !IsLowerHex(digest)) {
    return InvalidArgumentError("registry: key digest '" + Printable(digest, 64) +
                                "' is not 16 lowercase hex digits");
  }
  return Status::Ok();
}

std::string DigestPrefix(std::string_view digest) {
  std::string prefix(kKeyRoot);
  prefix += digest;
  prefix += '/';
  return prefix;
}

std::string EntryKey(const SeedInfo& seed) {
  return DigestPrefix(seed.key_digest) + std::to_string(seed.rank) + "/" + seed.id;
}

std::string EntryValue(const SeedInfo& seed) {
  return "{\"url\":" + JsonString(seed.url) + ",\"rank\":" + std::to_string(seed.rank) +
         ",\"world\":" + std::to_string(seed.world) + ",\"load\":" + FormatDouble(seed.load) +
         ",\"id\":" + JsonString(seed.id) +
         (seed.content.empty() ? "" : ",\"content\":" + JsonString(seed.content)) +
         (seed.partial ? ",\"partial\":true,\"progress\":" + FormatDouble(seed.progress) : "") +
         (seed.behind ? ",\"behind\":true" : "") + "}";
}

std::string SeedProblem(const SeedInfo& s) {
  if (s.url.size() > kMaxUrlBytes) return "url longer than 1024 bytes";
  if (s.url.rfind("http://", 0) != 0 || s.url.size() == 7 || !IsUrlText(s.url)) {
    return "url '" + Printable(s.url, 100) + "' is not http://host:port";
  }
  if (s.world < 1 || s.world > kMaxWorld) {
    return "world " + std::to_string(s.world) + " is not in [1, 65536]";
  }
  if (s.rank < 0 || s.rank >= s.world) {
    return "rank " + std::to_string(s.rank) + " is not in [0, " + std::to_string(s.world) + ")";
  }
  if (!std::isfinite(s.load) || s.load < 0) {
    return "load " + FormatDouble(s.load) + " is not finite and >= 0";
  }
  if (s.id.empty() || s.id.size() > kMaxIdHexDigits || !IsLowerHex(s.id)) {
    return "id '" + Printable(s.id, 100) + "' is not 1 to 64 lowercase hex digits";
  }
  if (!s.content.empty() && !Hash128::IsCanonicalHex(s.content)) {
    return "content '" + Printable(s.content, 100) + "' is not 32 lowercase hex digits";
  }
  if (!std::isfinite(s.progress) || s.progress < 0 || s.progress > 1) {
    return "progress " + FormatDouble(s.progress) + " is not in [0, 1]";
  }
  return "";
}

namespace {

// Parses one entry's value; false (skip it) unless every field is valid and
// the key's "<rank>/<id>" suffix agrees with the value.
bool ParseEntry(simdjson::dom::parser& parser, std::string_view digest, std::string_view key_suffix,
                std::string_view value, SeedInfo* out) {
  if (value.size() > kMaxValueBytes) return false;
  simdjson::dom::element root;
  if (parser.parse(value.data(), value.size(), /*realloc_if_needed=*/true).get(root) !=
      simdjson::SUCCESS) {
    return false;
  }
  simdjson::dom::object obj;
  if (root.get(obj) != simdjson::SUCCESS) return false;
  std::string_view url, id;
  int64_t rank = 0, world = 0;
  double load = 0;
  if (obj["url"].get(url) != simdjson::SUCCESS || obj["id"].get(id) != simdjson::SUCCESS ||
      obj["rank"].get(rank) != simdjson::SUCCESS || obj["world"].get(world) != simdjson::SUCCESS ||
      obj["load"].get(load) != simdjson::SUCCESS) {
    return false;
  }
  if (world < 1 || world > kMaxWorld || rank < 0 || rank >= world) return false;
  SeedInfo seed;
  seed.key_digest = std::string(digest);
  seed.url = std::string(url.substr(0, kMaxUrlBytes + 1));
  seed.rank = static_cast<int>(rank);
  seed.world = static_cast<int>(world);
  seed.load = load;
  seed.id = std::string(id.substr(0, kMaxIdHexDigits + 1));
  // Optional; when present, a string that SeedProblem checks (another type is skipped too).
  simdjson::dom::element content_el;
  if (obj["content"].get(content_el) == simdjson::SUCCESS) {
    std::string_view content;
    if (content_el.get(content) != simdjson::SUCCESS || content.empty()) return false;
    seed.content = std::string(content.substr(0, 33));
  }
  // Optional: a relay still receiving, and how far it is.
  simdjson::dom::element partial_el;
  if (obj["partial"].get(partial_el) == simdjson::SUCCESS) {
    if (partial_el.get(seed.partial) != simdjson::SUCCESS ||
        obj["progress"].get(seed.progress) != simdjson::SUCCESS) {
      return false;
    }
  }
  simdjson::dom::element behind_el;
  if (obj["behind"].get(behind_el) == simdjson::SUCCESS &&
      behind_el.get(seed.behind) != simdjson::SUCCESS) {
    return false;
  }
  if (!SeedProblem(seed).empty()) return false;
  if (key_suffix != std::to_string(seed.rank) + "/" + seed.id) return false;
  *out = std::move(seed);
  return true;
}

}  // namespace

Result<RangePage> ParseRangePage(std::string_view reply, std::string_view key_digest, size_t limit,
                                 std::string last_key) {
  TL_RETURN_IF_ERROR(ValidateDigest(key_digest));
  const std::string prefix = DigestPrefix(key_digest);
  simdjson::dom::parser reply_parser, value_parser;
  simdjson::dom::element root;
  if (reply.size() > kMaxRangeResponseBytes ||
      reply_parser.parse(reply.data(), reply.size(), /*realloc_if_needed=*/true).get(root) !=
          simdjson::SUCCESS ||
      !root.is_object()) {
    return CorruptionError("reply is not a JSON object: '" + Printable(reply) + "'");
  }
  RangePage page;
  page.last_key = std::move(last_key);
  bool more_flag = false;
  page.more = root["more"].get(more_flag) == simdjson::SUCCESS && more_flag;
  simdjson::dom::array kvs;
  if (root["kvs"].get(kvs) != simdjson::SUCCESS) return page;  // Absent: no entries.
  std::string key, value;
  for (simdjson::dom::element kv : kvs) {
    if (++page.entries > limit) return CorruptionError("more entries than the limit asked for");
    std::string_view key_b64, value_b64;
    if (kv["key"].get(key_b64) != simdjson::SUCCESS || !Base64Decode(key_b64, &key) ||
        key.compare(0, prefix.size(), prefix) != 0 || key <= page.last_key) {
      return CorruptionError("reply holds a key outside the range asked for");
    }
    page.last_key = key;
    SeedInfo seed;
    if (kv["value"].get(value_b64) != simdjson::SUCCESS ||
        value_b64.size() > (kMaxValueBytes + 2) / 3 * 4 || !Base64Decode(value_b64, &value) ||
        !ParseEntry(value_parser, key_digest, std::string_view(key).substr(prefix.size()), value,
                    &seed)) {
      ++page.skipped;
      continue;  // Invalid entries are skipped.
    }
    // etcd's JSON gateway writes int64 as strings.
    std::string_view created;
    int64_t created_n = 0;
    if (kv["create_revision"].get(created) == simdjson::SUCCESS) {
      std::from_chars(created.data(), created.data() + created.size(), seed.created);
    } else if (kv["create_revision"].get(created_n) == simdjson::SUCCESS) {
      seed.created = created_n;
    }
    page.seeds.push_back(std::move(seed));
  }
  return page;
}

}  // namespace tensorlift::remote
