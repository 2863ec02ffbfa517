// Seed discovery on etcd (docs/remote.md, "Discovery"), over etcd's v3 JSON
// gateway (POST /v3/kv/put, /v3/kv/range, /v3/lease/grant, /v3/lease/keepalive,
// /v3/lease/revoke; keys and values base64). A seed puts
//   /tensorlift/seeds/<key digest>/<rank>/<seed id>  ->  {"url":..,"rank":..,"world":..,"load":..}
// under a lease it renews every TTL/3 from a thread; when the process dies the
// lease expires and the entry goes. Values read back are untrusted: bounded
// and validated; bad entries are skipped (and counted).
#ifndef TENSORLIFT_REMOTE_REGISTRY_H_
#define TENSORLIFT_REMOTE_REGISTRY_H_

#include <chrono>
#include <cstdint>
#include <memory>
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
};

class Registration {
 public:
  virtual ~Registration() = default;  // Revokes the lease (best effort, bounded wait).
  // Rewrites the value with a new load (same lease).
  virtual Status UpdateLoad(double load) = 0;
  // The renewal thread's last error, OK while renewals succeed.
  virtual Status health() const = 0;
};

class Registry {
 public:
  // `url`: "http://host:port" of an etcd member. Nothing is sent yet.
  // kInvalidArgument for a malformed URL.
  static Result<std::unique_ptr<Registry>> Connect(const std::string& url,
                                                   std::chrono::milliseconds timeout);
  virtual ~Registry() = default;
  // kUnavailable when etcd cannot be reached or answers with an error.
  virtual Result<std::unique_ptr<Registration>> Register(const SeedInfo& seed, int ttl_s) = 0;
  // Live seeds for `key_digest` (all ranks), least loaded first, ties by id.
  virtual Result<std::vector<SeedInfo>> List(std::string_view key_digest) = 0;
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

}  // namespace tensorlift::remote

#endif  // TENSORLIFT_REMOTE_REGISTRY_H_
