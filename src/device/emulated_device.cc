// The host-emulated device (device.h, MakeEmulatedDevice; how it works is in
// emulated_device.h).
//
// The device itself: allocations, streams and events, export and import of
// memory. Its memory (and the state it shares with everything it made) is
// emulated_memory.h's, its streams and events emulated_stream.h's.
#include "device/emulated_device.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <utility>

#include "device/emulated_memory.h"
#include "device/emulated_stream.h"

namespace tensorlift {
namespace {

using emulated::DeviceBuffer;
using emulated::DeviceState;
using emulated::PinnedBuffer;
using emulated::RangeText;
using emulated::Region;
using emulated::RoundUp;
using emulated::Translated;

constexpr uint64_t kDeviceAlign = 256;
constexpr int kDlpackExtDev = 12;  // kDLExtDev.

class EmulatedDevice final : public Device {
 public:
  explicit EmulatedDevice(std::shared_ptr<DeviceState> state) : state_(std::move(state)) {}

  DeviceType kind() const override { return DeviceType::kEmulated; }
  int ordinal() const override { return 0; }
  std::string name() const override { return "emulated:0"; }
  int dlpack_device_type() const override { return kDlpackExtDev; }

  Result<std::shared_ptr<Buffer>> Allocate(uint64_t bytes) override {
    if (bytes > state_->memory_bytes()) {
      return ResourceExhaustedError("emulated:0: cannot allocate " + std::to_string(bytes) +
                                    " bytes of device memory: the device has " +
                                    std::to_string(state_->memory_bytes()));
    }
    const uint64_t accounted = RoundUp(bytes, kDeviceAlign);
    TL_RETURN_IF_ERROR(state_->Reserve(bytes, accounted));
    Result<std::shared_ptr<Region>> region = Region::Create(bytes, state_->arena());
    if (!region.ok()) {
      state_->Unreserve(accounted);
      return ResourceExhaustedError("emulated:0: cannot allocate " + std::to_string(bytes) +
                                    " bytes of device memory: " + region.status().message());
    }
    std::shared_ptr<Buffer> buffer(new (std::nothrow) DeviceBuffer(state_, *region, accounted));
    if (!buffer) {
      state_->Unreserve(accounted);
      return ResourceExhaustedError("out of memory");
    }
    // Registered last: from here the buffer's destructor frees it.
    state_->AddLive(std::move(*region));
    return buffer;
  }

  Result<std::shared_ptr<Buffer>> AllocatePinned(uint64_t bytes) override {
    return PinnedBuffer::Allocate(state_, bytes);
  }

  Result<std::unique_ptr<DeviceStream>> CreateStream() override {
    std::unique_ptr<DeviceStream> stream = emulated::NewStream(state_);
    if (!stream) return ResourceExhaustedError("out of memory");
    return stream;
  }

  Result<std::unique_ptr<DeviceEvent>> CreateEvent() override {
    std::unique_ptr<DeviceEvent> event = emulated::NewEvent();
    if (!event) return ResourceExhaustedError("out of memory");
    return event;
  }

  Result<uint64_t> FreeMemory() override { return state_->FreeBytes(); }

  Result<std::byte*> HostMapping(const std::byte* p, uint64_t bytes) override {
    TL_ASSIGN_OR_RETURN(Translated t, state_->Translate(p, bytes, "emulated:0: memory"));
    return t.ptr;
  }

  std::string identity() const override { return state_->identity(); }

  Result<ExportedMemory> Export(const Buffer& buffer) override {
    TL_ASSIGN_OR_RETURN(Translated t,
                        state_->Translate(buffer.data(), buffer.size(), "emulated:0: Export"));
    if (t.hold->device() != buffer.data() || t.hold->size() != buffer.size()) {
      return InvalidArgumentError("emulated:0: Export " + RangeText(buffer.data(), buffer.size()) +
                                  " is not a whole allocation " +
                                  RangeText(t.hold->device(), t.hold->size()));
    }
    ExportedMemory out;
    TL_ASSIGN_OR_RETURN(out.fd, t.hold->Share());
    out.device_id = state_->identity();
    out.bytes = buffer.size();
    out.pid = ::getpid();
    return out;
  }

  Result<std::shared_ptr<Buffer>> Import(ExportedMemory memory) override {
    if (memory.device_id != state_->identity()) {
      return InvalidArgumentError("emulated:0: memory of device '" + memory.device_id +
                                  "' cannot be mapped here: this device is '" + state_->identity() +
                                  "'");
    }
    if (memory.fd < 0) return InvalidArgumentError("emulated:0: imported memory has no memfd");
    TL_ASSIGN_OR_RETURN(std::shared_ptr<Region> region,
                        Region::Import(std::exchange(memory.fd, -1), memory.bytes));
    std::shared_ptr<Buffer> buffer(new (std::nothrow) DeviceBuffer(state_, region, 0));
    if (!buffer) return ResourceExhaustedError("out of memory");
    state_->AddLive(std::move(region));
    return buffer;
  }

  DeviceState& state() { return *state_; }

 private:
  std::shared_ptr<DeviceState> state_;
};

}  // namespace

std::shared_ptr<Device> MakeEmulatedDeviceWithQuarantine(const EmulatedDeviceOptions& options,
                                                         uint64_t quarantine_bytes) {
  std::shared_ptr<emulated::Arena> arena;
  if (options.prefault_bytes > 0) {
    // Without it, allocations get fresh memory: slower, not wrong.
    Result<std::shared_ptr<emulated::Arena>> made =
        emulated::Arena::Create(std::min(options.prefault_bytes, options.memory_bytes));
    if (made.ok()) arena = std::move(made).value();
  }
  return std::make_shared<EmulatedDevice>(
      std::make_shared<DeviceState>(options, quarantine_bytes, std::move(arena)));
}

std::shared_ptr<Device> MakeEmulatedDevice(const EmulatedDeviceOptions& options) {
  return MakeEmulatedDeviceWithQuarantine(options, kEmulatedQuarantineBytes);
}

Result<EmulatedDeviceCounts> GetEmulatedDeviceCounts(Device& device) {
  auto* emulated = dynamic_cast<EmulatedDevice*>(&device);
  if (emulated == nullptr)
    return InvalidArgumentError(device.name() + " is not an emulated device");
  return emulated->state().Counts();
}

Status PeekEmulatedDevice(Device& device, std::byte* dst, const std::byte* src, uint64_t bytes) {
  auto* emulated = dynamic_cast<EmulatedDevice*>(&device);
  if (emulated == nullptr)
    return InvalidArgumentError(device.name() + " is not an emulated device");
  if (dst == nullptr || src == nullptr || bytes == 0) {
    return InvalidArgumentError("PeekEmulatedDevice: null address or zero bytes");
  }
  TL_ASSIGN_OR_RETURN(Translated from,
                      emulated->state().Translate(src, bytes, "peek source", true));
  std::memcpy(dst, from.ptr, bytes);
  return Status::Ok();
}

}  // namespace tensorlift
