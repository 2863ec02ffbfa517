#include "load/device_ring.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_set>
#include <utility>

#include "common/checked_math.h"
#include "load/device_pipeline.h"
#include "load/device_plan.h"
#include "load/file_job.h"
#include "load/sparse_load.h"

namespace tensorlift {
uint64_t DeviceLoadBytes(const Checkpoint& ckpt, const std::vector<std::string>& plain,
                         const std::vector<const sparse::SparseTensor*>& groups,
                         const LoadOptions& options) {
  // What goes through the pipeline: the plain tensors and the groups' parts.
  std::unordered_set<std::string> stored(plain.begin(), plain.end());
  uint64_t dense_total = 0;
  for (const sparse::SparseTensor* g : groups) {
    for (auto loc : {g->values, g->bitmask, g->row_offsets}) stored.insert(ckpt.info(loc).name);
    sparse::BitmaskShape shape = g->shape;
    shape.elem_bytes = static_cast<uint32_t>(
        DtypeBits(TargetDtype(ckpt.info(g->values).dtype, options.dtype)) / 8);
    dense_total = AlignUp(dense_total + shape.dense_bytes(), kDenseAlign);
  }
  std::vector<OpenedFile> jobs;
  SelectTensors(ckpt, TensorFilter::Names({stored.begin(), stored.end()}), jobs);
  uint64_t total = 0, scratch = 0;
  for (const OpenedFile& job : jobs) {
    if (job.wanted.empty()) continue;
    const DeviceFilePlan plan = PlanDeviceFile(job.shard->header, job.wanted, options.dtype,
                                               /*direct=*/true, options.staging_bytes);
    total += AlignUp(plan.device_bytes, kDeviceAlign);
    scratch = std::max(scratch, plan.scratch_bytes);
  }
  if (scratch > 0) {
    total += AlignUp(AlignUp(scratch, kDeviceAlign) * static_cast<uint64_t>(StagingSlots(options)),
                     kDeviceAlign);
  }
  if (!groups.empty() && dense_total > 0) total += AlignUp(dense_total, kDeviceAlign);
  return total;
}

struct SlotDevice::State {
  std::shared_ptr<Buffer> slot;
  std::atomic<int64_t> live{0};  // Pieces alive.
  std::mutex mu;
  uint64_t next = 0;  // Where the next piece may start (guarded by mu).
};

namespace {

// A piece of a slot: keeps the slot alive, and counts as alive in it.
class SlotPiece final : public Buffer {
 public:
  SlotPiece(std::shared_ptr<SlotDevice::State> state, uint64_t offset, uint64_t bytes)
      : state_(std::move(state)), offset_(offset) {
    data_ = state_->slot->data() + offset;
    size_ = bytes;
    state_->live.fetch_add(1, std::memory_order_relaxed);
  }
  ~SlotPiece() override { state_->live.fetch_sub(1, std::memory_order_release); }
  std::byte* host_mapping() const override {
    std::byte* base = state_->slot->host_mapping();
    return base == nullptr ? nullptr : base + offset_;
  }

 private:
  std::shared_ptr<SlotDevice::State> state_;
  uint64_t offset_;
};

}  // namespace

SlotDevice::SlotDevice(std::shared_ptr<Device> base, std::shared_ptr<Buffer> slot)
    : base_(std::move(base)), state_(std::make_shared<State>()) {
  state_->slot = std::move(slot);
}

bool SlotDevice::InUse() const { return state_->live.load(std::memory_order_acquire) > 0; }

Result<std::shared_ptr<Buffer>> SlotDevice::Allocate(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (!InUse()) state_->next = 0;
  const uint64_t offset = AlignUp(state_->next, kDeviceAlign);
  const uint64_t size = state_->slot->size();
  if (offset > size || bytes > size - offset) {
    return ResourceExhaustedError(
        "a layer's buffer of " + std::to_string(bytes) + " bytes does not fit the " +
        std::to_string(size - std::min(offset, size)) + " bytes left of its " +
        std::to_string(size) + "-byte slot of device memory on " + name() +
        " (the streamer counted the layer's allocations wrong)");
  }
  state_->next = offset + bytes;
  return std::shared_ptr<Buffer>(std::make_shared<SlotPiece>(state_, offset, bytes));
}

Result<uint64_t> SlotDevice::FreeMemory() {
  std::lock_guard<std::mutex> lock(state_->mu);
  const uint64_t used = InUse() ? AlignUp(state_->next, kDeviceAlign) : 0;
  const uint64_t size = state_->slot->size();
  return used >= size ? 0 : size - used;
}

}  // namespace tensorlift
