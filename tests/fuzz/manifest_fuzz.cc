// libFuzzer target for the peer manifest parser (remote::ParseManifest): a
// manifest arrives from the network and is validated like a file header.
//
// Each input is a manifest's JSON. The target checks that:
//   1. a rejection is a kCorruption status (never another code, a crash or
//      an allocation out of proportion: libFuzzer's -malloc_limit_mb and
//      the sanitizers watch the rest);
//   2. an accepted manifest keeps its promises: tensors sorted by name and
//      unique, each inside its region, total_bytes the sum of nbytes, one
//      checksum per chunk;
//   3. ToJson of it parses again to the same JSON (a fixed point).
// Any broken invariant aborts with a message (a finding).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "remote/manifest.h"

namespace {

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "manifest_fuzz: invariant broken: %s: %s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tensorlift;
  using namespace tensorlift::remote;
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  auto m = ParseManifest(json);
  if (!m.ok()) {
    if (m.status().code() != StatusCode::kCorruption) Fail("error code", m.status().ToString());
    return 0;
  }
  uint64_t total = 0;
  for (size_t i = 0; i < m->tensors.size(); ++i) {
    const ManifestTensor& t = m->tensors[i];
    if (i > 0 && !(m->tensors[i - 1].name < t.name)) Fail("order", t.name);
    if (t.nbytes > 0) {
      if (t.region >= m->regions.size()) Fail("region", t.name);
      if (t.offset > m->regions[t.region].bytes ||
          t.nbytes > m->regions[t.region].bytes - t.offset) {
        Fail("bounds", t.name);
      }
    }
    const uint64_t chunks = t.nbytes == 0 ? 0 : (t.nbytes - 1) / m->chunk_bytes + 1;
    if (t.chunk_xxh3.size() != chunks) Fail("chunks", t.name);
    total += t.nbytes;
  }
  if (total != m->total_bytes) Fail("total_bytes", std::to_string(total));
  const std::string once = m->ToJson();
  auto again = ParseManifest(once);
  if (!again.ok()) Fail("re-parse", again.status().ToString());
  if (again->ToJson() != once) Fail("fixed point", once.substr(0, 200));
  return 0;
}
