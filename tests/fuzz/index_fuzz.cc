// libFuzzer target for the sharded index json (model.safetensors.index.json),
// read through Checkpoint::Open with an in-memory CheckpointStore: the input
// is the index, and the store holds three shards with known headers
//   /ckpt/model-00001-of-00002.safetensors   a, b
//   /ckpt/model-00002-of-00002.safetensors   c
//   /ckpt/sub/extra.safetensors              a   (a duplicate of a)
// Every other path is missing (NotFound), as on disk.
//
// Checks: a rejection is Corruption or NotFound; the store is never asked for
// a path outside /ckpt/ or with a ".." component (a weight_map entry must not
// lead out of the checkpoint's directory); an accepted checkpoint holds each
// tensor once, in name order, every location inside its shard's header, and
// Find agrees with tensors(). Any broken invariant aborts with a message.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tensorlift/checkpoint.h"
#include "tensorlift/safetensors.h"

namespace {

using namespace tensorlift;

constexpr std::string_view kIndexPath = "/ckpt/model.safetensors.index.json";

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "index_fuzz: invariant broken: %s: %s\n", what, detail.c_str());
  std::abort();
}

// A safetensors file holding one F32 [1] tensor per name.
std::vector<std::byte> MakeFile(const std::vector<std::string>& names) {
  std::string json = "{";
  for (size_t i = 0; i < names.size(); ++i) {
    if (i) json += ',';
    json += "\"" + names[i] + "\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[" +
            std::to_string(4 * i) + "," + std::to_string(4 * i + 4) + "]}";
  }
  json += "}";
  while (json.size() % 8) json += ' ';
  std::vector<std::byte> file(8 + json.size() + 4 * names.size());
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) file[i] = std::byte((n >> (8 * i)) & 0xff);
  std::memcpy(file.data() + 8, json.data(), json.size());
  return file;
}

void CheckPath(const std::string& path) {
  if (path.rfind("/ckpt/", 0) != 0) Fail("path outside the checkpoint", path);
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    if (path.compare(start, end - start, "..") == 0) Fail("path with ..", path);
    start = end + 1;
  }
}

class MemoryStore : public CheckpointStore {
 public:
  explicit MemoryStore(std::string_view index) : index_(index) {
    files_["/ckpt/model-00001-of-00002.safetensors"] = MakeFile({"a", "b"});
    files_["/ckpt/model-00002-of-00002.safetensors"] = MakeFile({"c"});
    files_["/ckpt/sub/extra.safetensors"] = MakeFile({"a"});
  }
  Result<bool> IsDirectory(const std::string& path) override {
    CheckPath(path);
    return path == "/ckpt" || path == "/ckpt/";
  }
  Result<std::vector<Entry>> List(const std::string& path) override {
    CheckPath(path);
    return std::vector<Entry>{};
  }
  Result<std::string> ReadSmall(const std::string& path, uint64_t limit) override {
    CheckPath(path);
    if (path != kIndexPath) return NotFoundError(path + ": no such file");
    if (index_.size() > limit) return CorruptionError(path + ": over the limit for an index");
    return std::string(index_);
  }
  Result<Header> ReadHeader(const std::string& path, FileIdentity* identity) override {
    CheckPath(path);
    auto it = files_.find(path);
    if (it == files_.end()) return NotFoundError(path + ": no such file");
    auto h = Header::Parse(std::span<const std::byte>(it->second));
    if (!h.ok()) Fail("fixture header", h.status().ToString());
    if (identity != nullptr) identity->size = it->second.size();
    return h;
  }

 private:
  std::string_view index_;
  std::map<std::string, std::vector<std::byte>> files_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  MemoryStore store(std::string_view(reinterpret_cast<const char*>(data), size));
  auto ckpt = Checkpoint::Open(std::string(kIndexPath), store);
  if (!ckpt.ok()) {
    const StatusCode code = ckpt.status().code();
    if (code != StatusCode::kCorruption && code != StatusCode::kNotFound) {
      Fail("error code", ckpt.status().ToString());
    }
    return 0;
  }
  const auto& locations = ckpt->tensors();
  for (size_t i = 0; i < locations.size(); ++i) {
    const auto loc = locations[i];
    if (loc.shard >= ckpt->shards().size() ||
        loc.index >= ckpt->shards()[loc.shard].header.tensors().size()) {
      Fail("location", std::to_string(loc.shard) + "/" + std::to_string(loc.index));
    }
    const std::string& name = ckpt->info(loc).name;
    if (i > 0 && !(ckpt->info(locations[i - 1]).name < name)) Fail("order or duplicate", name);
    auto found = ckpt->Find(name);
    if (!found || found->shard != loc.shard || found->index != loc.index) Fail("find", name);
  }
  if (ckpt->Find("no such tensor")) Fail("find absent", "");
  for (const auto& shard : ckpt->shards()) CheckPath(shard.path);
  return 0;
}
