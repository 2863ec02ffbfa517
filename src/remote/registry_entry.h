// The registry's seed entries as etcd holds them (registry.h): what an entry
// says (SeedInfo), its key and value, the checks of what is read back, etcd's
// range replies (ParseRangePage), and the encodings etcd's JSON gateway uses.
// Defined in registry_entry.cc; the etcd client (registry.cc) uses them, and
// registry.h includes this header for SeedInfo.
#ifndef TENSORLIFT_REMOTE_REGISTRY_ENTRY_H_
#define TENSORLIFT_REMOTE_REGISTRY_ENTRY_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tensorlift/status.h"

namespace tensorlift::remote {

struct SeedInfo {
  std::string key_digest;  // PeerKey::Digest().
  std::string url;         // The seed's control endpoint, "http://host:port".
  int rank = 0;
  int world = 1;
  double load = 0;  // Active sessions (lower is better).
  std::string id;   // Unique per registration (random hex).
  // The content identity root of what it serves (32 lowercase hex digits),
  // or empty; an entry with any other value is skipped.
  std::string content;
  // A relay still receiving (docs/remote.md, "Relaying"): it serves only
  // the chunks its GET /v1/have lists, and `progress` (0..1) of its bytes are
  // in. Pullers that do not relay skip such entries.
  bool partial = false;
  double progress = 1;
  // A relay that fell behind its parent (a slower link than the chain's,
  // sources/relay.h BehindRule): the chain orders it after every relay that
  // did not, so that it slows none of them.
  bool behind = false;
  // etcd's create_revision of the entry (read back, never written): the
  // order relays registered in.
  int64_t created = 0;
};

// One page of etcd's reply to a range request for the seeds of `key_digest`
// (POST /v3/kv/range; the reply's JSON, untrusted; fuzzed by
// tests/fuzz/registry_fuzz.cc).
struct RangePage {
  std::vector<SeedInfo> seeds;  // The valid entries, in the reply's order.
  size_t entries = 0;           // Entries in the reply, valid or not.
  size_t skipped = 0;           // Entries left out as invalid.
  bool more = false;            // etcd has more after this page.
  std::string last_key;         // The page's last key; the one given when it has none.
};
// kCorruption (the reason) for a reply that is not a JSON object, holds more
// than `limit` entries, or a key outside the digest's prefix or not after
// `last_key` (the previous page's last key, "" for the first) and the key
// before it; kInvalidArgument for a malformed digest. An entry whose value is
// not a valid seed, or whose key disagrees with its value, is skipped.
Result<RangePage> ParseRangePage(std::string_view reply, std::string_view key_digest, size_t limit,
                                 std::string last_key = "");

constexpr size_t kDigestHexDigits = 16;
constexpr size_t kMaxUrlBytes = 1024;
// A page of valid entries is about 3 MiB; the rest is headroom for invalid
// (skipped) ones. Larger responses are refused, not truncated.
constexpr size_t kMaxRangeResponseBytes = size_t{16} << 20;

// Text from the network for a message: bounded, control characters as '?'.
std::string Printable(std::string_view s, size_t max_bytes = 200);

// Base64 (RFC 4648, with padding), as etcd's gateway encodes bytes.
std::string Base64Encode(std::string_view in);

// Shortest text that reads back as the same double.
std::string FormatDouble(double v);

// A decimal int64 (etcd's gateway sends them as strings), all of `s`.
bool ParseInt64(std::string_view s, int64_t* out);

// `bytes` random bytes (OpenSSL's RAND_bytes, at most 32) as lowercase hex.
Result<std::string> RandomHex(size_t bytes);

// kInvalidArgument unless `digest` is 16 lowercase hex digits.
Status ValidateDigest(std::string_view digest);

// The prefix of every entry of `digest`: "/tensorlift/seeds/<digest>/".
std::string DigestPrefix(std::string_view digest);

// An entry's key, "<prefix><rank>/<id>", and value (compact JSON).
std::string EntryKey(const SeedInfo& seed);
std::string EntryValue(const SeedInfo& seed);

// The checks a value read back must pass, as a reason ("" when valid).
std::string SeedProblem(const SeedInfo& s);

}  // namespace tensorlift::remote

#endif  // TENSORLIFT_REMOTE_REGISTRY_ENTRY_H_
