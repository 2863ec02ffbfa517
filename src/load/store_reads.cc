// Reads through a checkpoint's store (store_reads.h).
#include "load/store_reads.h"

#include <vector>

namespace tensorlift {
namespace {

// A store's range past its file's end (OutOfRange) is the loads' one verdict
// on a short read (read_op.h, ShortReadError): IOError, "short read".
Status ShortReadVerdict(Status st) {
  if (st.code() != StatusCode::kOutOfRange) return st;
  return IOError("short read: " + st.message() + " (the file was truncated during the load)");
}

class StoreEngine final : public ReadEngine {
 public:
  explicit StoreEngine(CheckpointStore& store) : store_(store) {}

  Status Run(std::span<const ReadOp> ops, ReadProgress* progress) override {
    // A range per op, or per row of a row op; owner[k]: range k's op.
    std::vector<CheckpointStore::Range> ranges;
    std::vector<uint32_t> owner;
    ranges.reserve(ops.size());
    for (size_t i = 0; i < ops.size(); ++i) {
      const ReadOp& op = ops[i];
      if (op.path == nullptr) return InvalidArgumentError("a store's read names no file");
      const uint64_t rows = op.row_bytes > 0 ? op.length / op.row_bytes : 1;
      const uint64_t row = op.row_bytes > 0 ? op.row_bytes : op.length;
      for (uint64_t r = 0; r < rows; ++r) {
        ranges.push_back({op.path, op.offset + r * op.row_stride, row, op.dest + r * row});
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
};

}  // namespace

std::unique_ptr<ReadEngine> MakeStoreEngine(CheckpointStore& store) {
  return std::make_unique<StoreEngine>(store);
}

Status ReadFromStore(CheckpointStore& store, const std::string& path, uint64_t offset,
                     uint64_t length, std::byte* dest) {
  const CheckpointStore::Range range{&path, offset, length, dest};
  return ShortReadVerdict(store.ReadRanges({&range, 1}, {}));
}

}  // namespace tensorlift
