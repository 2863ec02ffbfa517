// Reads of a checkpoint's files through the store that opened it
// (Checkpoint::store(): a bucket, ...): the read engine the loader runs a
// store's ops on, and the single reads of the GPU pipeline's readers. The
// loader plans a store's files as buffered local files; only the reads differ.
#ifndef TENSORLIFT_LOAD_STORE_READS_H_
#define TENSORLIFT_LOAD_STORE_READS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "io/read_op.h"
#include "tensorlift/checkpoint.h"

namespace tensorlift {

// An engine whose ops name a store's file by ReadOp::path (their fd is not
// used): every op goes to store.ReadRanges in one call; op_done once all of
// its bytes have landed, progress as they land.
std::unique_ptr<ReadEngine> MakeStoreEngine(CheckpointStore& store);

// Bytes [offset, offset + length) of `path` into `dest` through `store`.
Status ReadFromStore(CheckpointStore& store, const std::string& path, uint64_t offset,
                     uint64_t length, std::byte* dest);

}  // namespace tensorlift

#endif  // TENSORLIFT_LOAD_STORE_READS_H_
