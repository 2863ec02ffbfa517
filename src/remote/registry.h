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

#include "remote/registry_entry.h"
#include "tensorlift/status.h"

namespace tensorlift::remote {

// SeedInfo, RangePage and ParseRangePage: registry_entry.h.

class Registration {
 public:
  virtual ~Registration() = default;  // Revokes the lease (best effort, bounded wait).
  // Rewrites the value with a new load (same lease).
  virtual Status UpdateLoad(double load) = 0;
  // Rewrites the value as a relay's (SeedInfo::partial, progress, behind)
  // or, with partial false, a whole seed's.
  virtual Status UpdateProgress(bool partial, double progress, bool behind = false) = 0;
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

}  // namespace tensorlift::remote

#endif  // TENSORLIFT_REMOTE_REGISTRY_H_
