#include <map>
#include <memory>
#include <mutex>

#include "device/device.h"

namespace tensorlift {

Result<std::byte*> Device::HostMapping(const std::byte*, uint64_t) {
  return UnimplementedError("the memory of " + name() + " has no host mapping");
}

Result<std::shared_ptr<Device>> OpenDevice(DeviceType type, int index) {
  switch (type) {
    case DeviceType::kCpu:
      if (index != 0) return NotFoundError("there is only one host device, cpu");
      return MakeHostDevice();
    case DeviceType::kCuda: {
      // One Device per GPU while any holder keeps it, as for the emulated
      // device: code that meets a GPU twice (a seed's regions and its
      // tensors) may compare the two as the same memory. Never destroyed, so
      // that no static destructor runs after the CUDA runtime's teardown.
      static auto* mu = new std::mutex;
      static auto* open = new std::map<int, std::weak_ptr<Device>>;
      std::lock_guard<std::mutex> lock(*mu);
      if (auto it = open->find(index); it != open->end()) {
        if (std::shared_ptr<Device> d = it->second.lock()) return d;
      }
      Result<std::shared_ptr<Device>> d = OpenCudaDevice(index);
      if (d.ok()) (*open)[index] = *d;
      return d;
    }
    case DeviceType::kEmulated: {
      if (index != 0) return NotFoundError("there is only one emulated device, emulated:0");
      static const std::shared_ptr<Device> emulated = MakeEmulatedDevice();
      return emulated;
    }
  }
  return InvalidArgumentError("unknown device type " + std::to_string(static_cast<int>(type)));
}

}  // namespace tensorlift
