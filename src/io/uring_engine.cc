// io_uring: one ring, up to queue_depth reads in flight, driven by the
// calling thread. Short reads are resubmitted for the remainder; -EAGAIN and
// -EINTR are retried. Bounce ops (small, unaligned O_DIRECT pieces) are read
// synchronously with pread between completions.
#include <liburing.h>

#include <cstring>
#include <utility>
#include <vector>

#include "common/posix_file.h"
#include "io/faults.h"
#include "io/read_op.h"

namespace tensorlift {
namespace {

// The largest single io_uring read (the length field is 32 bits).
constexpr uint64_t kMaxSqeRead = 1u << 30;

class UringEngine final : public ReadEngine {
 public:
  UringEngine(int queue_depth, std::vector<EngineFile> files)
      : ReadEngine(std::move(files)), depth_(queue_depth) {}
  ~UringEngine() override {
    if (initialized_) io_uring_queue_exit(&ring_);
  }

  Status Init() {
    int r = io_uring_queue_init(static_cast<unsigned>(depth_), &ring_, 0);
    if (r < 0)
      return UnimplementedError("io_uring is not available here: " +
                                PosixError("io_uring_setup", -r).message());
    initialized_ = true;
    return Status::Ok();
  }

  Status Run(std::span<const ReadOp> ops, ReadProgress* progress) override {
    struct Slot {
      size_t op = 0;
      uint64_t done = 0;
    };
    std::vector<Slot> slots(depth_);
    std::vector<int> free_slots;
    for (int i = depth_ - 1; i >= 0; --i) free_slots.push_back(i);
    size_t next = 0;
    int in_flight = 0;
    OpReader sync_reader;
    Status error;

    auto submit = [&](int s) -> Status {
      const ReadOp& op = ops[slots[s].op];
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) return InternalError("io_uring submission queue full");
      const uint64_t left = op.length - slots[s].done;
      io_uring_prep_read(sqe, FileOf(op).fd, op.dest + slots[s].done,
                         static_cast<unsigned>(std::min(left, kMaxSqeRead)),
                         op.offset + slots[s].done);
      io_uring_sqe_set_data64(sqe, static_cast<uint64_t>(s));
      ++in_flight;
      return Status::Ok();
    };

    while ((next < ops.size() && error.ok()) || in_flight > 0) {
      // Fill the queue.
      bool queued = false;
      while (error.ok() && next < ops.size() && !free_slots.empty()) {
        const ReadOp& op = ops[next];
        if (Status valid = ValidFile(op); !valid.ok()) {
          error = valid;
          break;
        }
        if (op.bounce || op.row_bytes > 0 || op.length == 0) {
          Status st = sync_reader.Read(FileOf(op).fd, op);
          if (!st.ok()) {
            error = InFileOf(op, st);
            break;
          }
          progress->bytes_done.fetch_add(op.length, std::memory_order_relaxed);
          if (progress->op_done) progress->op_done(op);
          ++next;
          continue;
        }
        int s = free_slots.back();
        free_slots.pop_back();
        slots[s] = {next++, 0};
        Status st = submit(s);
        if (!st.ok()) {
          error = st;
          break;
        }
        queued = true;
      }
      if (queued) {
        int r = io_uring_submit(&ring_);
        if (r < 0 && error.ok()) error = PosixError("io_uring_submit", -r);
      }
      if (in_flight == 0) continue;
      io_uring_cqe* cqe = nullptr;
      int r = io_uring_wait_cqe(&ring_, &cqe);
      if (r == -EINTR) continue;
      if (r < 0) {
        // Without completions we cannot safely reuse the buffers; stop here.
        return PosixError("io_uring_wait_cqe", -r);
      }
      const int s = static_cast<int>(io_uring_cqe_get_data64(cqe));
      const ReadOp& op = ops[slots[s].op];
      const int res =
          io::ReadResult(FileOf(op).fd, cqe->res, std::min(op.length - slots[s].done, kMaxSqeRead));
      io_uring_cqe_seen(&ring_, cqe);
      --in_flight;
      if (res == -EAGAIN || res == -EINTR) {
        if (error.ok()) {
          Status st = submit(s);
          if (st.ok()) {
            int sr = io_uring_submit(&ring_);
            if (sr < 0) st = PosixError("io_uring_submit", -sr);
          }
          if (!st.ok())
            error = st;
          else
            continue;
        }
        free_slots.push_back(s);
        continue;
      }
      if (res < 0 || res == 0) {
        if (error.ok()) {
          Status st =
              res < 0
                  ? PosixError("read at offset " + std::to_string(op.offset + slots[s].done), -res)
                  : ShortReadError(slots[s].done, op.length, op.offset);
          error = InFileOf(op, st);
        }
        free_slots.push_back(s);
        continue;
      }
      slots[s].done += static_cast<uint64_t>(res);
      progress->bytes_done.fetch_add(static_cast<uint64_t>(res), std::memory_order_relaxed);
      if (slots[s].done < op.length && error.ok()) {
        Status st = submit(s);
        if (st.ok()) {
          int sr = io_uring_submit(&ring_);
          if (sr < 0) st = PosixError("io_uring_submit", -sr);
        }
        if (st.ok()) continue;
        error = st;
      }
      if (slots[s].done == op.length && progress->op_done) progress->op_done(op);
      free_slots.push_back(s);
      if (progress->tick) progress->tick();  // The callee throttles.
    }
    if (progress->tick) progress->tick();
    return error;
  }

 private:
  int depth_;
  io_uring ring_{};
  bool initialized_ = false;
};

}  // namespace

bool UringBuiltIn() { return true; }

Result<std::unique_ptr<ReadEngine>> MakeUringEngine(int queue_depth,
                                                    std::vector<EngineFile> files) {
  auto engine =
      std::make_unique<UringEngine>(std::max(1, std::min(queue_depth, 4096)), std::move(files));
  TL_RETURN_IF_ERROR(engine->Init());
  return std::unique_ptr<ReadEngine>(std::move(engine));
}

}  // namespace tensorlift
