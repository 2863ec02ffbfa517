// The streams and events of the host-emulated device (see
// emulated_stream.h): stream work (copies, conversions, bitmask decoding,
// event records) runs on a worker thread in stream order, each operand
// translated to the worker mapping (and checked) when it runs.
#include "device/emulated_stream.h"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <utility>

#include "common/checked_math.h"
#include "common/clock.h"
#include "device/stream_checks.h"
#include "kernels/bitmask_kernel.h"
#include "kernels/convert.h"
#include "tensorlift/bitmask.h"
#include "tensorlift/convert.h"

namespace tensorlift::emulated {
namespace {

// What an event knows; shared with the stream ops that complete it.
struct EventState {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;   // Generation of the last Record().
  uint64_t completed = 0;  // Highest generation completed.
  double completed_at = 0;
  Status status;
};

class EmulatedEvent final : public DeviceEvent {
 public:
  EmulatedEvent() : state_(std::make_shared<EventState>()) {}

  Status Synchronize() override {
    std::unique_lock lock(state_->mu);
    state_->cv.wait(lock, [&] { return state_->completed >= state_->recorded; });
    return state_->status;
  }
  bool Done() override {
    std::lock_guard lock(state_->mu);
    return state_->completed >= state_->recorded;
  }
  double CompletedAtMicros() override {
    std::lock_guard lock(state_->mu);
    return state_->completed_at;
  }

  // Starts a new generation; returns it and the state to complete.
  std::pair<uint64_t, std::shared_ptr<EventState>> NewRecord() {
    std::lock_guard lock(state_->mu);
    return {++state_->recorded, state_};
  }

 private:
  std::shared_ptr<EventState> state_;
};

// One unit of stream work.
struct Op {
  enum class Kind { kToDevice, kOnDevice, kToHost, kConvert, kDecodeBitmask, kRecord };
  Kind kind = Kind::kRecord;
  std::byte* dst = nullptr;
  const std::byte* src = nullptr;
  uint64_t dst_bytes = 0;
  uint64_t src_bytes = 0;
  Dtype to = Dtype::kU8;
  Dtype from = Dtype::kU8;
  uint64_t count = 0;  // Elements to convert; non-zeros to decode.
  uint64_t generation = 0;
  std::shared_ptr<EventState> event = nullptr;
  // DecodeBitmask: src is the values (src_bytes), dst the output (dst_bytes).
  const uint8_t* bitmask = nullptr;
  const int64_t* row_offsets = nullptr;
  sparse::BitmaskShape shape = {};
};

// Bytes of `count` elements of `dtype`; false when they overflow or do not
// fill whole bytes.
bool RangeBytes(Dtype dtype, uint64_t count, uint64_t* out) {
  uint64_t bits = 0;
  if (!CheckedMul(count, static_cast<uint64_t>(DtypeBits(dtype)), &bits) || bits % 8 != 0)
    return false;
  *out = bits / 8;
  return true;
}

class EmulatedStream final : public DeviceStream {
 public:
  explicit EmulatedStream(std::shared_ptr<DeviceState> device)
      : device_(std::move(device)), worker_([this] { Work(); }) {}

  ~EmulatedStream() override {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    work_cv_.notify_one();
    worker_.join();  // The worker finishes what was enqueued first.
  }
  EmulatedStream(const EmulatedStream&) = delete;
  EmulatedStream& operator=(const EmulatedStream&) = delete;

  Status CopyToDevice(std::byte* dst, const std::byte* src, uint64_t bytes) override {
    TL_RETURN_IF_ERROR(CheckCopyArgs("CopyToDevice", dst, src, bytes));
    return Enqueue(Op{.kind = Op::Kind::kToDevice,
                      .dst = dst,
                      .src = src,
                      .dst_bytes = bytes,
                      .src_bytes = bytes});
  }

  Status CopyOnDevice(std::byte* dst, const std::byte* src, uint64_t bytes) override {
    TL_RETURN_IF_ERROR(CheckCopyArgs("CopyOnDevice", dst, src, bytes));
    if (Overlap(dst, bytes, src, bytes)) {
      return InvalidArgumentError("CopyOnDevice: destination " + RangeText(dst, bytes) +
                                  " overlaps source " + RangeText(src, bytes));
    }
    return Enqueue(Op{.kind = Op::Kind::kOnDevice,
                      .dst = dst,
                      .src = src,
                      .dst_bytes = bytes,
                      .src_bytes = bytes});
  }

  Status CopyToHost(std::byte* dst, const std::byte* src, uint64_t bytes) override {
    TL_RETURN_IF_ERROR(CheckCopyArgs("CopyToHost", dst, src, bytes));
    return Enqueue(Op{
        .kind = Op::Kind::kToHost, .dst = dst, .src = src, .dst_bytes = bytes, .src_bytes = bytes});
  }

  Status Convert(std::byte* dst, Dtype to, const std::byte* src, Dtype from,
                 uint64_t count) override {
    if (dst == nullptr || src == nullptr) return InvalidArgumentError("Convert: null address");
    if (count == 0) return InvalidArgumentError("Convert: zero elements");
    if (!convert::ConversionSupported(from, to)) {
      return InvalidArgumentError("Convert: no conversion from " + std::string(DtypeName(from)) +
                                  " to " + std::string(DtypeName(to)));
    }
    uint64_t dst_bytes = 0;
    uint64_t src_bytes = 0;
    uint64_t end = 0;
    if (!RangeBytes(to, count, &dst_bytes) || !RangeBytes(from, count, &src_bytes) ||
        !CheckedAdd(reinterpret_cast<uintptr_t>(dst), dst_bytes, &end) ||
        !CheckedAdd(reinterpret_cast<uintptr_t>(src), src_bytes, &end)) {
      return InvalidArgumentError("Convert: " + std::to_string(count) + " " +
                                  std::string(DtypeName(from)) +
                                  " elements are not whole bytes or wrap around the address space");
    }
    if (Overlap(dst, dst_bytes, src, src_bytes)) {
      return InvalidArgumentError("Convert: destination " + RangeText(dst, dst_bytes) +
                                  " overlaps source " + RangeText(src, src_bytes));
    }
    return Enqueue(Op{.kind = Op::Kind::kConvert,
                      .dst = dst,
                      .src = src,
                      .dst_bytes = dst_bytes,
                      .src_bytes = src_bytes,
                      .to = to,
                      .from = from,
                      .count = count});
  }

  Status DecodeBitmask(std::byte* dst, const std::byte* values, uint64_t nnz,
                       const uint8_t* bitmask, const int64_t* row_offsets, uint64_t rows,
                       uint64_t cols, uint32_t elem_bytes) override {
    TL_ASSIGN_OR_RETURN(
        DecodeBitmaskBytes bytes,
        CheckDecodeBitmaskArgs(dst, values, nnz, bitmask, row_offsets, rows, cols, elem_bytes));
    return Enqueue(Op{.kind = Op::Kind::kDecodeBitmask,
                      .dst = dst,
                      .src = values,
                      .dst_bytes = bytes.dst,
                      .src_bytes = bytes.values,
                      .count = nnz,
                      .bitmask = bitmask,
                      .row_offsets = row_offsets,
                      .shape = {.rows = rows, .cols = cols, .elem_bytes = elem_bytes}});
  }

  Status Record(DeviceEvent& event) override {
    auto* emulated = dynamic_cast<EmulatedEvent*>(&event);
    if (emulated == nullptr) {
      return InvalidArgumentError("Record: the event is not from the emulated device");
    }
    auto [generation, state] = emulated->NewRecord();
    return Enqueue(
        Op{.kind = Op::Kind::kRecord, .generation = generation, .event = std::move(state)});
  }

  Status Synchronize() override {
    std::unique_lock lock(mu_);
    const uint64_t target = enqueued_;
    done_cv_.wait(lock, [&] { return finished_ >= target; });
    return error_;
  }

 private:
  Status Enqueue(Op op) {
    {
      std::lock_guard lock(mu_);
      queue_.push_back(std::move(op));
      ++enqueued_;
    }
    work_cv_.notify_one();
    return Status::Ok();
  }

  // The worker thread: runs the ops in order until stopped and drained.
  void Work() {
    Status sticky;  // The worker's copy of error_.
    for (;;) {
      Op op;
      {
        std::unique_lock lock(mu_);
        work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        op = std::move(queue_.front());
        queue_.pop_front();
      }
      if (op.kind == Op::Kind::kRecord) {
        Complete(op, sticky);
      } else if (sticky.ok()) {
        sticky = Run(op);
      }
      {
        std::lock_guard lock(mu_);
        if (error_.ok()) error_ = sticky;
        ++finished_;
      }
      done_cv_.notify_all();
    }
  }

  static void Complete(const Op& op, const Status& status) {
    EventState& event = *op.event;
    {
      std::lock_guard lock(event.mu);
      if (op.generation > event.completed) {
        event.completed = op.generation;
        event.completed_at = NowMicros();
        event.status = status;
      }
    }
    event.cv.notify_all();
  }

  Status Run(const Op& op) {
    switch (op.kind) {
      case Op::Kind::kToDevice: {
        const auto start = std::chrono::steady_clock::now();
        TL_RETURN_IF_ERROR(device_->CheckHost(op.src, op.src_bytes, "source"));
        TL_ASSIGN_OR_RETURN(Translated dst,
                            device_->Translate(op.dst, op.dst_bytes, "CopyToDevice destination"));
        if (!device_->discard_copies()) std::memcpy(dst.ptr, op.src, op.dst_bytes);
        // The GPU's copy model (CopyDone; the memcpy above counts toward it).
        std::this_thread::sleep_until(device_->CopyDone(start, op.dst_bytes));
        return Status::Ok();
      }
      case Op::Kind::kOnDevice: {
        TL_ASSIGN_OR_RETURN(Translated src,
                            device_->Translate(op.src, op.src_bytes, "CopyOnDevice source"));
        TL_ASSIGN_OR_RETURN(Translated dst,
                            device_->Translate(op.dst, op.dst_bytes, "CopyOnDevice destination"));
        std::memcpy(dst.ptr, src.ptr, op.dst_bytes);
        return Status::Ok();
      }
      case Op::Kind::kToHost: {
        TL_RETURN_IF_ERROR(device_->CheckHost(op.dst, op.dst_bytes, "destination"));
        TL_ASSIGN_OR_RETURN(Translated src,
                            device_->Translate(op.src, op.src_bytes, "CopyToHost source"));
        std::memcpy(op.dst, src.ptr, op.src_bytes);
        return Status::Ok();
      }
      case Op::Kind::kConvert: {
        TL_ASSIGN_OR_RETURN(Translated src,
                            device_->Translate(op.src, op.src_bytes, "Convert source"));
        TL_ASSIGN_OR_RETURN(Translated dst,
                            device_->Translate(op.dst, op.dst_bytes, "Convert destination"));
        return ConvertOnHost(dst.ptr, op.to, src.ptr, op.from, op.count);
      }
      case Op::Kind::kDecodeBitmask:
        return RunDecodeBitmask(op);
      case Op::Kind::kRecord:
        break;
    }
    return InternalError("emulated stream: unknown op");
  }

  // Runs the CUDA kernel's code (kernels/bitmask_kernel.h) with the warp
  // emulated, row by row. An encoding that was not validated, which the GPU
  // would decode out of bounds, fails the stream here instead.
  Status RunDecodeBitmask(const Op& op) {
    const sparse::BitmaskShape& shape = op.shape;
    TL_ASSIGN_OR_RETURN(Translated mask,
                        device_->Translate(reinterpret_cast<const std::byte*>(op.bitmask),
                                           shape.mask_bytes(), "DecodeBitmask bitmask"));
    TL_ASSIGN_OR_RETURN(
        Translated offsets,
        device_->Translate(reinterpret_cast<const std::byte*>(op.row_offsets),
                           shape.rows * sizeof(int64_t), "DecodeBitmask row_offsets"));
    Translated values;
    if (op.count > 0) {
      TL_ASSIGN_OR_RETURN(values, device_->Translate(op.src, op.src_bytes, "DecodeBitmask values"));
    }
    TL_ASSIGN_OR_RETURN(Translated dst,
                        device_->Translate(op.dst, op.dst_bytes, "DecodeBitmask destination"));
    const auto* bitmask = reinterpret_cast<const uint8_t*>(mask.ptr);
    const auto* row_offsets = reinterpret_cast<const int64_t*>(offsets.ptr);
    if (Status s = sparse::Validate(bitmask, row_offsets, shape, op.count); !s.ok()) {
      return s.WithContext("DecodeBitmask (an encoding not validated on the host)");
    }
    switch (shape.elem_bytes) {
      case 1:
        DecodeRowsEmulated<1>(values.ptr, bitmask, row_offsets, shape, dst.ptr);
        break;
      case 2:
        DecodeRowsEmulated<2>(values.ptr, bitmask, row_offsets, shape, dst.ptr);
        break;
      case 4:
        DecodeRowsEmulated<4>(values.ptr, bitmask, row_offsets, shape, dst.ptr);
        break;
      default:
        DecodeRowsEmulated<8>(values.ptr, bitmask, row_offsets, shape, dst.ptr);
        break;
    }
    return Status::Ok();
  }

  template <uint32_t W>
  static void DecodeRowsEmulated(const std::byte* values, const uint8_t* bitmask,
                                 const int64_t* row_offsets, const sparse::BitmaskShape& shape,
                                 std::byte* dst) {
    const uint64_t mrow = shape.mask_row_bytes();
    for (uint64_t r = 0; r < shape.rows; ++r) {
      sparse::kernel::DecodeRowEmulated<W>(bitmask + r * mrow, shape.cols,
                                           values + static_cast<uint64_t>(row_offsets[r]) * W,
                                           dst + r * shape.cols * W);
    }
  }

  std::shared_ptr<DeviceState> device_;
  std::mutex mu_;
  std::condition_variable work_cv_;  // The worker waits for ops or stopping_.
  std::condition_variable done_cv_;  // Synchronize() waits for finished_.
  std::deque<Op> queue_;
  uint64_t enqueued_ = 0;
  uint64_t finished_ = 0;
  bool stopping_ = false;
  Status error_;        // The first error; sticky.
  std::thread worker_;  // Last: started once the members above exist.
};

}  // namespace

std::unique_ptr<DeviceStream> NewStream(std::shared_ptr<DeviceState> device) {
  return std::unique_ptr<DeviceStream>(new (std::nothrow) EmulatedStream(std::move(device)));
}

std::unique_ptr<DeviceEvent> NewEvent() {
  return std::unique_ptr<DeviceEvent>(new (std::nothrow) EmulatedEvent());
}

}  // namespace tensorlift::emulated
