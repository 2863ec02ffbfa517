// Reads of a checkpoint's files through the store that opened it
// (Checkpoint::store(): a bucket, ...): the default of the engine a store makes
// (CheckpointStore::MakeReadEngine, defined in store_reads.cc: every op to the
// store's ReadRanges in one call), and the single reads of the GPU pipeline's
// readers. The loader plans a store's files as buffered local files; only the
// reads differ.
#ifndef TENSORLIFT_FORMAT_STORE_READS_H_
#define TENSORLIFT_FORMAT_STORE_READS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "tensorlift/checkpoint.h"

namespace tensorlift {

// Bytes [offset, offset + length) of `path` into `dest` through `store`.
Status ReadFromStore(CheckpointStore& store, const std::string& path, uint64_t offset,
                     uint64_t length, std::byte* dest);

}  // namespace tensorlift

#endif  // TENSORLIFT_FORMAT_STORE_READS_H_
