#include "tensorlift/checkpoint.h"

#include <simdjson.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <map>

#include "common/posix_file.h"
#include "io/pread.h"
#include "tensorlift/text.h"

namespace tensorlift {
namespace {

namespace fs = std::filesystem;

std::string Join(const std::string& dir, std::string_view name) {
  if (dir.empty()) return std::string(name);
  return dir.back() == '/' ? dir + std::string(name) : dir + "/" + std::string(name);
}

std::string DirName(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return "";
  return path.substr(0, slash + 1);
}

// A shard name from an index must stay inside the index's directory.
Status CheckShardName(std::string_view name) {
  if (name.empty()) return CorruptionError("the weight_map names an empty file name");
  if (name.find('\0') != std::string_view::npos || name.front() == '/') {
    return CorruptionError("the weight_map names the file " + QuoteName(name) +
                           ", which is not a relative path");
  }
  size_t start = 0;
  while (start <= name.size()) {
    size_t end = name.find('/', start);
    if (end == std::string_view::npos) end = name.size();
    if (name.substr(start, end - start) == "..") {
      return CorruptionError("the weight_map names the file " + QuoteName(name) +
                             ", which leaves the checkpoint's directory");
    }
    start = end + 1;
  }
  return Status::Ok();
}

Result<std::string> ReadSmallFile(const std::string& path, uint64_t limit) {
  TL_ASSIGN_OR_RETURN(PosixFile file, PosixFile::OpenForRead(path));
  TL_ASSIGN_OR_RETURN(uint64_t size, file.Size());
  if (size > limit) {
    return CorruptionError("the file has " + std::to_string(size) + " bytes, over the limit of " +
                           std::to_string(limit) + " for an index");
  }
  std::string data(size, '\0');
  TL_RETURN_IF_ERROR(ReadExactlyAt(file.fd(), 0, data.data(), size));
  return data;
}

// The local filesystem.
class LocalStore final : public CheckpointStore {
 public:
  Result<bool> IsDirectory(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return PosixError("cannot open", errno).WithContext(path);
    return S_ISDIR(st.st_mode);
  }
  Result<std::vector<Entry>> List(const std::string& path) override {
    std::vector<Entry> entries;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(path, ec)) {
      entries.push_back({entry.path().filename().string(), entry.is_directory()});
    }
    if (ec) return PosixError("cannot list the directory", ec.value()).WithContext(path);
    return entries;
  }
  Result<std::string> ReadSmall(const std::string& path, uint64_t limit) override {
    return ReadSmallFile(path, limit);
  }
  Result<Header> ReadHeader(const std::string& path, FileIdentity* identity) override {
    return Header::ReadFile(path, identity);
  }
};

}  // namespace

Status CheckpointStore::ReadRanges(std::span<const Range> ranges,
                                   const std::function<void(size_t, uint64_t)>& /*landed*/) {
  if (ranges.empty()) return Status::Ok();
  return UnimplementedError(
             "this checkpoint store opens checkpoints but does not read tensor "
             "bytes (it has no ReadRanges)")
      .WithContext(*ranges.front().path);
}

std::string CheckpointStore::Describe(const std::string& /*path*/) const {
  return "read through its store";
}

Result<Checkpoint> Checkpoint::Open(const std::string& path) {
  LocalStore local;
  return Open(path, local);
}

Result<Checkpoint> Checkpoint::Open(const std::string& path,
                                    std::shared_ptr<CheckpointStore> store) {
  if (!store) return Open(path);
  TL_ASSIGN_OR_RETURN(Checkpoint ckpt, Open(path, *store));
  ckpt.store_ = std::move(store);
  return ckpt;
}

Checkpoint Checkpoint::WithStore(std::shared_ptr<CheckpointStore> store) const {
  Checkpoint copy = *this;
  copy.store_ = std::move(store);
  return copy;
}

Result<Checkpoint> Checkpoint::Open(const std::string& path, CheckpointStore& store) {
  Checkpoint ckpt;
  ckpt.path_ = path;
  TL_ASSIGN_OR_RETURN(const bool directory, store.IsDirectory(path));

  if (directory) {
    std::vector<std::string> indexes, files;
    TL_ASSIGN_OR_RETURN(const auto entries, store.List(path));
    for (const auto& entry : entries) {
      const std::string& name = entry.name;
      if (name.ends_with(".safetensors.index.json"))
        indexes.push_back(name);
      else if (name.ends_with(".safetensors") && !entry.directory)
        files.push_back(name);
    }
    std::sort(indexes.begin(), indexes.end());
    std::sort(files.begin(), files.end());
    std::string index;
    if (std::find(indexes.begin(), indexes.end(), "model.safetensors.index.json") !=
        indexes.end()) {
      index = "model.safetensors.index.json";
    } else if (indexes.size() == 1) {
      index = indexes[0];
    } else if (indexes.size() > 1) {
      return InvalidArgumentError("the directory holds " + std::to_string(indexes.size()) +
                                  " index files and none is model.safetensors.index.json; "
                                  "name the one to use")
          .WithContext(path);
    }
    if (!index.empty()) {
      ckpt.kind_ = Kind::kIndex;
      TL_RETURN_IF_ERROR(ckpt.ReadIndex(Join(path, index), store));
      return ckpt;
    }
    if (files.empty())
      return NotFoundError("no .safetensors files in the directory").WithContext(path);
    ckpt.kind_ = Kind::kDirectory;
    for (const auto& f : files) {
      std::string shard_path = Join(path, f);
      FileIdentity id;
      TL_ASSIGN_OR_RETURN(Header h, store.ReadHeader(shard_path, &id));
      ckpt.shards_.push_back({shard_path, std::move(h), id});
    }
    TL_RETURN_IF_ERROR(ckpt.IndexAllTensors());
    return ckpt;
  }

  if (path.ends_with(".json")) {
    ckpt.kind_ = Kind::kIndex;
    TL_RETURN_IF_ERROR(ckpt.ReadIndex(path, store));
    return ckpt;
  }
  ckpt.kind_ = Kind::kFile;
  FileIdentity id;
  TL_ASSIGN_OR_RETURN(Header h, store.ReadHeader(path, &id));
  ckpt.shards_.push_back({path, std::move(h), id});
  TL_RETURN_IF_ERROR(ckpt.IndexAllTensors());
  return ckpt;
}

Result<Checkpoint> Checkpoint::OpenFile(const std::string& path) {
  Checkpoint ckpt;
  ckpt.path_ = path;
  ckpt.kind_ = Kind::kFile;
  FileIdentity id;
  TL_ASSIGN_OR_RETURN(Header h, Header::ReadFile(path, &id));
  ckpt.shards_.push_back({path, std::move(h), id});
  TL_RETURN_IF_ERROR(ckpt.IndexAllTensors());
  return ckpt;
}

Result<Checkpoint> Checkpoint::OpenFiles(const std::vector<std::string>& paths) {
  if (paths.empty()) return InvalidArgumentError("no files to open");
  if (paths.size() == 1) return OpenFile(paths[0]);
  Checkpoint ckpt;
  ckpt.path_ = paths[0];
  ckpt.kind_ = Kind::kDirectory;
  for (const auto& path : paths) {
    FileIdentity id;
    TL_ASSIGN_OR_RETURN(Header h, Header::ReadFile(path, &id));
    for (const auto& other : ckpt.shards_) {
      if (other.identity.device == id.device && other.identity.inode == id.inode) {
        return InvalidArgumentError("the file is named twice (also as " + other.path + ")")
            .WithContext(path);
      }
    }
    ckpt.shards_.push_back({path, std::move(h), id});
  }
  // The caller's files, not a broken checkpoint: a name in two of them is the
  // caller's error (InvalidArgument), named with both files.
  std::vector<std::pair<std::string_view, uint32_t>> names;
  for (uint32_t s = 0; s < ckpt.shards_.size(); ++s) {
    for (const auto& t : ckpt.shards_[s].header.tensors()) names.emplace_back(t.name, s);
  }
  std::sort(names.begin(), names.end());
  for (size_t i = 1; i < names.size(); ++i) {
    if (names[i].first == names[i - 1].first) {
      return InvalidArgumentError(
          "tensor " + QuoteName(names[i].first) + " is in more than one of the files: " +
          ckpt.shards_[names[i - 1].second].path + " and " + ckpt.shards_[names[i].second].path);
    }
  }
  TL_RETURN_IF_ERROR(ckpt.IndexAllTensors());
  return ckpt;
}

// Every tensor of every shard, each in exactly one shard.
Status Checkpoint::IndexAllTensors() {
  tensors_.clear();
  for (uint32_t s = 0; s < shards_.size(); ++s) {
    for (uint32_t i = 0; i < shards_[s].header.tensors().size(); ++i) tensors_.push_back({s, i});
  }
  std::sort(tensors_.begin(), tensors_.end(),
            [&](Location a, Location b) { return info(a).name < info(b).name; });
  for (size_t i = 1; i < tensors_.size(); ++i) {
    if (info(tensors_[i]).name == info(tensors_[i - 1]).name) {
      return CorruptionError("tensor " + QuoteName(info(tensors_[i]).name) + " is in both " +
                             shards_[tensors_[i - 1].shard].path + " and " +
                             shards_[tensors_[i].shard].path)
          .WithContext(path_);
    }
  }
  return Status::Ok();
}

Status Checkpoint::ReadIndex(const std::string& index_path, CheckpointStore& store) {
  auto fail = [&](Status s) { return s.WithContext(index_path); };
  auto text = store.ReadSmall(index_path, kMaxIndexSize);
  if (!text.ok()) return fail(text.status());
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (auto err = parser.parse(*text).get(root)) {
    return fail(CorruptionError(std::string("invalid JSON: ") + simdjson::error_message(err)));
  }
  simdjson::dom::object obj;
  if (root.get_object().get(obj)) return fail(CorruptionError("the index must be a JSON object"));

  simdjson::dom::element meta;
  if (obj["metadata"].get(meta) == simdjson::SUCCESS && !meta.is_null()) {
    simdjson::dom::object mobj;
    if (meta.get_object().get(mobj)) return fail(CorruptionError("\"metadata\" must be an object"));
    for (auto field : mobj) {
      std::string_view s;
      index_metadata_[std::string(field.key)] = field.value.get_string().get(s) == simdjson::SUCCESS
                                                    ? std::string(s)
                                                    : simdjson::minify(field.value);
    }
  }
  simdjson::dom::object weight_map;
  if (obj["weight_map"].get_object().get(weight_map)) {
    return fail(CorruptionError("the index needs a \"weight_map\" object of tensor name to file"));
  }

  // Name -> file, in the order the files first appear.
  std::map<std::string, std::string, std::less<>> named;
  std::vector<std::string> files;
  std::map<std::string, uint32_t, std::less<>> file_ids;
  for (auto field : weight_map) {
    std::string_view file;
    if (field.value.get_string().get(file)) {
      return fail(CorruptionError("weight_map entry for tensor " + QuoteName(field.key) +
                                  " must be a file name string"));
    }
    TL_RETURN_IF_ERROR(fail(CheckShardName(file)));
    if (!named.emplace(std::string(field.key), std::string(file)).second) {
      return fail(CorruptionError("the weight_map names tensor " + QuoteName(field.key) +
                                  " more than once"));
    }
    if (file_ids.emplace(std::string(file), files.size()).second) files.emplace_back(file);
  }

  const std::string dir = DirName(index_path);
  for (const auto& f : files) {
    std::string shard_path = Join(dir, f);
    FileIdentity id;
    auto h = store.ReadHeader(shard_path, &id);
    if (!h.ok()) {
      Status s = h.status();
      if (s.code() == StatusCode::kNotFound) {
        return fail(NotFoundError("the index names the shard " + QuoteName(f) +
                                  ", which is missing: " + s.message()));
      }
      return s;
    }
    shards_.push_back({shard_path, std::move(h).value(), id});
  }

  // Each tensor in exactly one shard, across all shards.
  {
    std::map<std::string_view, uint32_t> seen;
    for (uint32_t s = 0; s < shards_.size(); ++s) {
      for (const auto& t : shards_[s].header.tensors()) {
        auto [it, inserted] = seen.emplace(t.name, s);
        if (!inserted) {
          return fail(CorruptionError("tensor " + QuoteName(t.name) + " is in both " +
                                      QuoteName(files[it->second]) + " and " +
                                      QuoteName(files[s])));
        }
        if (named.find(t.name) == named.end()) {
          warnings_.push_back("tensor " + QuoteName(t.name) + " in " + QuoteName(files[s]) +
                              " is not in the index");
        }
      }
    }
  }
  tensors_.clear();
  tensors_.reserve(named.size());
  for (const auto& [name, file] : named) {
    uint32_t s = file_ids.find(file)->second;
    const TensorInfo* t = shards_[s].header.Find(name);
    if (t == nullptr) {
      return fail(CorruptionError("the index puts tensor " + QuoteName(name) + " in " +
                                  QuoteName(file) + ", which does not hold it"));
    }
    tensors_.push_back({s, static_cast<uint32_t>(t - shards_[s].header.tensors().data())});
  }
  return Status::Ok();
}

std::optional<Checkpoint::Location> Checkpoint::Find(std::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [&](Location l, std::string_view n) { return info(l).name < n; });
  if (it == tensors_.end() || info(*it).name != name) return std::nullopt;
  return *it;
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t total = 0;
  for (Location l : tensors_) total += info(l).nbytes();
  return total;
}

}  // namespace tensorlift
