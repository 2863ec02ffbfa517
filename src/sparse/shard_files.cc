#include "sparse/shard_files.h"

#include <string>

#include "io/pread.h"

namespace tensorlift::sparse {

Status ShardFiles::Read(Checkpoint::Location loc, uint64_t pos, void* buf, size_t n) {
  const Checkpoint::Shard& shard = ckpt_.shards()[loc.shard];
  const TensorInfo& tensor = ckpt_.info(loc);
  if (ckpt_.store()) {  // A checkpoint in a bucket: through its store.
    if (pos > tensor.nbytes() || n > tensor.nbytes() - pos) {
      return InternalError(shard.path + ": read past the end of a tensor");
    }
    const CheckpointStore::Range range{&shard.path, shard.header.data_offset() + tensor.begin + pos,
                                       n, static_cast<std::byte*>(buf)};
    return ckpt_.store()->ReadRanges({&range, 1}, {});
  }
  std::unique_ptr<PosixFile>& file = files_[loc.shard];
  if (!file) {
    auto opened = PosixFile::OpenForRead(shard.path);
    if (!opened.ok()) return opened.status().WithContext(shard.path);
    auto identity = opened->Identity();
    if (!identity.ok()) return identity.status().WithContext(shard.path);
    if (!(*identity == shard.identity)) {
      return IOError(shard.path + ": the file changed after its header was read");
    }
    file = std::make_unique<PosixFile>(std::move(opened).value());
  }
  const TensorInfo& info = ckpt_.info(loc);
  if (pos > info.nbytes() || n > info.nbytes() - pos) {
    return InternalError(shard.path + ": read of " + std::to_string(n) + " bytes at " +
                         std::to_string(pos) + " past the end of a tensor of " +
                         std::to_string(info.nbytes()));
  }
  Status st = ReadExactlyAt(file->fd(), shard.header.data_offset() + info.begin + pos, buf, n);
  return st.ok() ? st : st.WithContext(shard.path);
}

}  // namespace tensorlift::sparse
