// A checkpoint: one safetensors file, or a sharded model described by
// model.safetensors.index.json, or a directory of shards.
//
// Open() reads every shard's header and checks the index against them:
//   - every file the index names exists and is a valid safetensors file;
//   - every tensor the index names is in the shard it names;
//   - no tensor is in more than one shard;
// Tensors that a shard holds but the index does not name are not an error
// (loaders following the index never see them); they are listed in
// warnings(). A Checkpoint that exists passed all of this.
//
// Checkpoints are immutable values and may be shared between threads.
#ifndef TENSORLIFT_CHECKPOINT_H_
#define TENSORLIFT_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tensorlift/safetensors.h"
#include "tensorlift/status.h"

namespace tensorlift {

class ReadEngine;    // The library's (src/io/read_op.h): how a load's reads are run.
class DirectReader;  // The library's (src/io/direct_reader.h): reads into device memory.
class Device;

// The limit on the size of an index file (real ones are well under 1 MB).
inline constexpr uint64_t kMaxIndexSize = 256ull << 20;

// Where a checkpoint's files are read from: the local filesystem (the
// default of Checkpoint::Open), or another store such as a bucket
// (include/tensorlift/objstore.h). Paths are the store's own ("dir/file",
// "s3://bucket/prefix/file"); a directory's entries are joined with '/'.
//
// A checkpoint opened through a store it keeps (Open with a shared_ptr) is
// loaded through the store's ReadRanges: the loader plans it as it plans local
// files and every load option works for it (docs/loading.md, "Sources"). A
// store must then be safe to call from several threads at once.
class CheckpointStore {
 public:
  virtual ~CheckpointStore() = default;
  // A byte range of one of the store's files, and where it lands.
  struct Range {
    const std::string* path = nullptr;
    uint64_t offset = 0;
    uint64_t length = 0;
    std::byte* dest = nullptr;
  };
  struct Entry {
    std::string name;  // Without the directory.
    bool directory = false;
  };
  // Whether `path` is a directory (else a file); an error naming it when it
  // is neither.
  virtual Result<bool> IsDirectory(const std::string& path) = 0;
  // The entries directly inside directory `path`.
  virtual Result<std::vector<Entry>> List(const std::string& path) = 0;
  // The whole file, refused when over `limit` bytes.
  virtual Result<std::string> ReadSmall(const std::string& path, uint64_t limit) = 0;
  // The file's header, read and validated as Header::ReadFile does (errors
  // start with the path), and its identity (at least its size).
  virtual Result<Header> ReadHeader(const std::string& path, FileIdentity* identity) = 0;
  // Reads every range, any number at once, in any order. `landed(i, n)` (may
  // be empty), from the calling thread only: n more bytes of range i are in
  // place; range i is complete when they sum to its length. A range past the
  // file's end is an error (OutOfRange, naming the file); so is any failure,
  // after which the rest may be cancelled. The default refuses: a store that
  // only opens checkpoints (headers, indexes) is not a source of tensor bytes.
  virtual Status ReadRanges(std::span<const Range> ranges,
                            const std::function<void(size_t range, uint64_t bytes)>& landed);
  // How this store reads `path`, for the load's FileReport::reason
  // ("object storage: ranged GETs").
  virtual std::string Describe(const std::string& path) const;
  // The engine a load runs its reads of this store's files on; `paths`: the
  // files, by the index its reads name them with (the checkpoint's shards).
  // The default issues them through ReadRanges, many at once.
  virtual std::unique_ptr<ReadEngine> MakeReadEngine(std::vector<std::string> paths);
  // Reads of this store's files (`files` of them, numbered as the
  // checkpoint's shards) straight into `device`'s memory, for a load onto it
  // (LoadOptions::gds: off never asks); an error says why not, and the load
  // then goes through pinned host staging. The default: Unimplemented.
  virtual Result<std::unique_ptr<DirectReader>> MakeDirectReader(
      const std::shared_ptr<Device>& device, size_t files);
  // Whether reads should land at addresses congruent to their file offsets
  // modulo 4 KiB (a store that reads local files with O_DIRECT): the loader
  // then places a file's tensors as it does for O_DIRECT reads.
  virtual bool WantsFileAlignment() const { return false; }
};

class Checkpoint {
 public:
  enum class Kind { kFile, kIndex, kDirectory };

  struct Shard {
    std::string path;  // As opened (directory joined with the file name).
    Header header;
    FileIdentity identity;  // The file as its header was read; Load checks it.
  };
  // Where a tensor lives.
  struct Location {
    uint32_t shard;  // Index into shards().
    uint32_t index;  // Index into shards()[shard].header.tensors().
  };

  // `path` is a .safetensors file, an index JSON file, or a directory. A
  // directory with model.safetensors.index.json (or exactly one
  // *.safetensors.index.json) is opened through the index; otherwise all its
  // *.safetensors files are the shards. Errors name the file concerned.
  static Result<Checkpoint> Open(const std::string& path);
  // The same, reading through `store` (not kept).
  static Result<Checkpoint> Open(const std::string& path, CheckpointStore& store);
  // The same, keeping `store`: loads read the tensors' bytes through it.
  static Result<Checkpoint> Open(const std::string& path, std::shared_ptr<CheckpointStore> store);
  // Opens `path` as one safetensors file, whatever its name.
  static Result<Checkpoint> OpenFile(const std::string& path);
  // Opens several safetensors files as the shards of one checkpoint (kind
  // kDirectory, path the first file's): a caller's list of shards loads in one
  // go, as a directory of them does. A tensor in two of them is an error
  // naming both; so is an empty list or a file named twice.
  static Result<Checkpoint> OpenFiles(const std::vector<std::string>& paths);

  Kind kind() const { return kind_; }
  // The store its files are read from; null for local files.
  const std::shared_ptr<CheckpointStore>& store() const { return store_; }
  // This checkpoint read through `store` instead (the same files, e.g. a
  // bucket through other transfer settings); null: as local files.
  Checkpoint WithStore(std::shared_ptr<CheckpointStore> store) const;
  const std::string& path() const { return path_; }
  const std::vector<Shard>& shards() const { return shards_; }
  // The index's "metadata" object, flattened to strings (numbers are kept as
  // their JSON text); empty for a single file or a plain directory.
  const Metadata& index_metadata() const { return index_metadata_; }
  const std::vector<std::string>& warnings() const { return warnings_; }

  // All tensors of the checkpoint in name order (for an index: those it names).
  const std::vector<Location>& tensors() const { return tensors_; }
  // Looks up a tensor by name.
  std::optional<Location> Find(std::string_view name) const;
  const TensorInfo& info(Location loc) const {
    return shards_[loc.shard].header.tensors()[loc.index];
  }
  // Sum of the shards' data sections (only indexed tensors for an index).
  uint64_t total_bytes() const;

 private:
  Status ReadIndex(const std::string& index_path, CheckpointStore& store);
  Status IndexAllTensors();
  Kind kind_ = Kind::kFile;
  std::string path_;
  std::vector<Shard> shards_;
  Metadata index_metadata_;
  std::vector<std::string> warnings_;
  std::vector<Location> tensors_;
  std::shared_ptr<CheckpointStore> store_;
};

}  // namespace tensorlift

#endif  // TENSORLIFT_CHECKPOINT_H_
