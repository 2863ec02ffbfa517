// The unit of work of the read engines and the pieces they share: a load's
// reads of its files run on an engine (the loader's, load/, or the one a
// checkpoint's store makes, format/store_reads.h); plain reads of a byte range
// are io/pread.h's. Every read of a file goes through src/io/.
#ifndef TENSORLIFT_IO_READ_OP_H_
#define TENSORLIFT_IO_READ_OP_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "io/pread.h"
#include "tensorlift/status.h"

namespace tensorlift {

// A file the engines read. An engine is made with its files; an op names one
// by its index among them (ReadOp::shard: the checkpoint's shard).
struct EngineFile {
  int fd = -1;                        // Not used by a store's engine.
  const std::string* path = nullptr;  // For messages; a store's engine reads by it.
};

// Read `length` bytes at `offset` of file `shard` into `dest`.
struct ReadOp {
  uint32_t shard = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::byte* dest = nullptr;
  // For an O_DIRECT fd whose range or destination is not aligned: read the
  // covering aligned span into a bounce buffer and copy the bytes out.
  bool bounce = false;
  // Rows (a tensor-parallel slice along a later dim): with row_bytes > 0,
  // `length / row_bytes` rows of row_bytes bytes, row i at offset + i *
  // row_stride, land one after another at dest. Read as the span covering
  // them, through a scratch buffer, then copied out (one read, not one a row);
  // not with `bounce`.
  uint64_t row_bytes = 0;
  uint64_t row_stride = 0;
  uint32_t id = 0;  // The caller's (e.g. which tensors it fills); engines ignore it.
};

// Shared between the engine and whoever watches it.
struct ReadProgress {
  std::atomic<uint64_t> bytes_done{0};
  // Called by the engine's calling thread now and then (and never
  // concurrently); may be empty.
  std::function<void()> tick;
  // Called once per op when all of its bytes are in, from whichever engine
  // thread finished it (possibly several at once); may be empty. Must be quick.
  std::function<void(const ReadOp&)> op_done;
};

// Executes ops on the files it was made with. Implementations: a pool of
// pread threads, io_uring, a checkpoint store's transfers
// (CheckpointStore::MakeReadEngine).
class ReadEngine {
 public:
  explicit ReadEngine(std::vector<EngineFile> files) : files_(std::move(files)) {}
  virtual ~ReadEngine() = default;
  // Reads every op; on the first error stops and returns it (prefixed with
  // the op's file). Ops may complete in any order.
  virtual Status Run(std::span<const ReadOp> ops, ReadProgress* progress) = 0;
  const std::vector<EngineFile>& files() const { return files_; }
  // `st` prefixed with the path of `op`'s file (as it is when it has none).
  Status InFileOf(const ReadOp& op, Status st) const;

 protected:
  // Op's file; an op naming no file of the engine's is a bug of the caller's
  // (checked where the op is read: ValidFile).
  const EngineFile& FileOf(const ReadOp& op) const { return files_[op.shard]; }
  Status ValidFile(const ReadOp& op) const;

 private:
  std::vector<EngineFile> files_;
};

std::unique_ptr<ReadEngine> MakeThreadPoolEngine(int threads, std::vector<EngineFile> files);
// Reads on the calling thread, one op after another: no start-up cost, for
// loads too small to gain from parallelism.
std::unique_ptr<ReadEngine> MakeInlineEngine(std::vector<EngineFile> files);
// Fails with Unimplemented when io_uring is not built in or the kernel
// refuses it (e.g. disabled by sysctl or seccomp).
Result<std::unique_ptr<ReadEngine>> MakeUringEngine(int queue_depth, std::vector<EngineFile> files);
bool UringBuiltIn();

// Reads one op synchronously with pread (retrying EINTR/EAGAIN and short
// reads; a premature end of file is ShortReadError); `scratch` is grown as
// needed for bounce and row ops (4 KiB aligned).
class OpReader {
 public:
  OpReader() = default;
  ~OpReader();
  OpReader(const OpReader&) = delete;
  OpReader& operator=(const OpReader&) = delete;
  // `op` from `fd`.
  Status Read(int fd, const ReadOp& op);

 private:
  Status Grow(uint64_t bytes);
  std::byte* scratch_ = nullptr;
  uint64_t scratch_size_ = 0;
};

}  // namespace tensorlift

#endif  // TENSORLIFT_IO_READ_OP_H_
