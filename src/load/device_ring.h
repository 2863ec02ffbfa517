// Device memory of a layer streamer on a device (include/tensorlift/streamer.h):
// what a layer's load allocates there, and a device whose allocations are
// carved out of one buffer that the streamer allocated once (a slot of its
// ring, or a resident layer's buffer), so that streaming never allocates
// device memory per layer.
#ifndef TENSORLIFT_LOAD_DEVICE_RING_H_
#define TENSORLIFT_LOAD_DEVICE_RING_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "device/device.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/loader.h"
#include "tensorlift/sparse.h"
#include "tensorlift/status.h"

namespace tensorlift {

// Bytes of device memory a load onto a device with `options` allocates for
// the plain tensors `plain` and the sparse-bitmask groups `groups` of `ckpt`
// (decoded: options.decode_sparse): the files' buffers, the conversion slots
// and the decoded groups' buffer, each allocation rounded up to
// kDeviceAlign, as the pipeline (device_pipeline.cc) and the sparse device
// load (sparse_load.cc) allocate them. From the headers alone; conversion
// slots are counted for blocks of O_DIRECT's size, the larger case.
uint64_t DeviceLoadBytes(const Checkpoint& ckpt, const std::vector<std::string>& plain,
                         const std::vector<const sparse::SparseTensor*>& groups,
                         const LoadOptions& options);

// A device that is `base` except for Allocate(): consecutive 256-byte aligned
// pieces of `slot` (memory of `base`), starting over at the slot's start
// whenever none of the pieces handed out is alive. FreeMemory() is what is
// left of the slot. A piece holds the slot (and this device's state) alive.
class SlotDevice final : public Device {
 public:
  SlotDevice(std::shared_ptr<Device> base, std::shared_ptr<Buffer> slot);

  // A piece of the slot is alive (a tensor of the layer loaded into it).
  bool InUse() const;

  DeviceType kind() const override { return base_->kind(); }
  int ordinal() const override { return base_->ordinal(); }
  std::string name() const override { return base_->name(); }
  int dlpack_device_type() const override { return base_->dlpack_device_type(); }
  Result<std::shared_ptr<Buffer>> Allocate(uint64_t bytes) override;
  Result<std::shared_ptr<Buffer>> AllocatePinned(uint64_t bytes) override {
    return base_->AllocatePinned(bytes);
  }
  Result<std::unique_ptr<DeviceStream>> CreateStream() override { return base_->CreateStream(); }
  Result<std::unique_ptr<DeviceEvent>> CreateEvent() override { return base_->CreateEvent(); }
  Result<uint64_t> FreeMemory() override;
  Result<std::byte*> HostMapping(const std::byte* p, uint64_t bytes) override {
    return base_->HostMapping(p, bytes);
  }
  Status RecordExternal(DeviceEvent& event, uint64_t stream) override {
    return base_->RecordExternal(event, stream);
  }
  std::string identity() const override { return base_->identity(); }

  struct State;

 private:
  std::shared_ptr<Device> base_;
  std::shared_ptr<State> state_;
};

}  // namespace tensorlift

#endif  // TENSORLIFT_LOAD_DEVICE_RING_H_
