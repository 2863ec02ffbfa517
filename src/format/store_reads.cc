// Reads through a checkpoint's store (store_reads.h).
#include "format/store_reads.h"

#include <memory>
#include <utility>
#include <vector>

#include "io/direct_reader.h"
#include "io/read_op.h"

namespace tensorlift {
namespace {

// A store's range past its file's end (OutOfRange) is the loads' one verdict
// on a short read (read_op.h, ShortReadError): IOError, "short read".
Status ShortReadVerdict(Status st) {
  if (st.code() != StatusCode::kOutOfRange) return st;
  return IOError("short read: " + st.message() + " (the file was truncated during the load)");
}

std::vector<EngineFile> FilesNamed(const std::vector<std::string>& paths) {
  std::vector<EngineFile> files(paths.size());
  for (size_t i = 0; i < paths.size(); ++i) files[i].path = &paths[i];
  return files;
}

class StoreEngine final : public ReadEngine {
 public:
  // `paths` is held on the heap so that the files' paths point at it from the start.
  StoreEngine(CheckpointStore& store, std::unique_ptr<const std::vector<std::string>> paths)
      : ReadEngine(FilesNamed(*paths)), store_(store), paths_(std::move(paths)) {}

  Status Run(std::span<const ReadOp> ops, ReadProgress* progress) override {
    // A range per op, or per row of a row op; owner[k]: range k's op.
    std::vector<CheckpointStore::Range> ranges;
    std::vector<uint32_t> owner;
    ranges.reserve(ops.size());
    for (size_t i = 0; i < ops.size(); ++i) {
      const ReadOp& op = ops[i];
      TL_RETURN_IF_ERROR(ValidFile(op));
      const std::string* path = FileOf(op).path;
      const uint64_t rows = op.row_bytes > 0 ? op.length / op.row_bytes : 1;
      const uint64_t row = op.row_bytes > 0 ? op.row_bytes : op.length;
      for (uint64_t r = 0; r < rows; ++r) {
        ranges.push_back({path, op.offset + r * op.row_stride, row, op.dest + r * row});
        owner.push_back(static_cast<uint32_t>(i));
      }
    }
    // Bytes still to land per op: op_done once its last bytes are in.
    std::vector<uint64_t> left(ops.size());
    for (size_t i = 0; i < ops.size(); ++i) {
      left[i] = ops[i].length;
      if (left[i] == 0 && progress && progress->op_done) progress->op_done(ops[i]);
    }
    Status st = store_.ReadRanges(ranges, [&](size_t k, uint64_t bytes) {
      if (progress == nullptr) return;
      const uint32_t i = owner[k];
      progress->bytes_done.fetch_add(bytes, std::memory_order_relaxed);
      left[i] -= std::min(left[i], bytes);
      if (left[i] == 0 && progress->op_done) progress->op_done(ops[i]);
      // ReadRanges calls back on this (the calling) thread: ticks may come from here.
      if (progress->tick) progress->tick();
    });
    return ShortReadVerdict(std::move(st));
  }

 private:
  CheckpointStore& store_;
  std::unique_ptr<const std::vector<std::string>> paths_;
};

}  // namespace

// Every op to the store's ReadRanges in one call, the file named by its path;
// op_done once all of its bytes have landed, progress as they land.
std::unique_ptr<ReadEngine> CheckpointStore::MakeReadEngine(std::vector<std::string> paths) {
  return std::make_unique<StoreEngine>(
      *this, std::make_unique<const std::vector<std::string>>(std::move(paths)));
}

Result<std::unique_ptr<DirectReader>> CheckpointStore::MakeDirectReader(
    const std::shared_ptr<Device>& /*device*/, size_t /*files*/) {
  return UnimplementedError("this store's bytes come through host memory");
}

Status ReadFromStore(CheckpointStore& store, const std::string& path, uint64_t offset,
                     uint64_t length, std::byte* dest) {
  const CheckpointStore::Range range{&path, offset, length, dest};
  return ShortReadVerdict(store.ReadRanges({&range, 1}, {}));
}

}  // namespace tensorlift
