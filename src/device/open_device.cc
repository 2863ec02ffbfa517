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
    case DeviceType::kCuda:
      return OpenCudaDevice(index);
    case DeviceType::kEmulated: {
      if (index != 0) return NotFoundError("there is only one emulated device, emulated:0");
      static const std::shared_ptr<Device> emulated = MakeEmulatedDevice();
      return emulated;
    }
  }
  return InvalidArgumentError("unknown device type " + std::to_string(static_cast<int>(type)));
}

}  // namespace tensorlift
