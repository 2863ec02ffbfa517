// Reads tensor bytes of a Checkpoint's shards with pread (through its store
// when it has one: Checkpoint::store()), for the sparse
// code that needs a few bytes (a group's shape) or one tensor at a time
// (sparsify) rather than a whole Load.
//
// Not thread safe: one reader per thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/posix_file.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/status.h"

namespace tensorlift::sparse {

class ShardFiles {
 public:
  // `ckpt` must outlive this.
  explicit ShardFiles(const Checkpoint& ckpt) : ckpt_(ckpt), files_(ckpt.shards().size()) {}

  // Reads `n` bytes of tensor `loc` from byte `pos` of its data. Each shard
  // is opened on first use and must still be the file its header was read
  // from (Checkpoint::Shard::identity), else IOError. Errors name the file.
  Status Read(Checkpoint::Location loc, uint64_t pos, void* buf, size_t n);

 private:
  const Checkpoint& ckpt_;
  std::vector<std::unique_ptr<PosixFile>> files_;
};

}  // namespace tensorlift::sparse
