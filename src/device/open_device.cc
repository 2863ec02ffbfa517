#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "device/device.h"

namespace tensorlift {

Result<std::byte*> Device::HostMapping(const std::byte*, uint64_t) {
  return UnimplementedError("the memory of " + name() + " has no host mapping");
}

Status Device::RecordExternal(DeviceEvent&, uint64_t stream) {
  if (stream == 0) return Status::Ok();
  return InvalidArgumentError(name() + " has no streams of other libraries (stream " +
                              std::to_string(stream) + "); pass 0");
}

ExportedMemory::~ExportedMemory() {
  if (fd >= 0) ::close(fd);
}

ExportedMemory::ExportedMemory(ExportedMemory&& other) noexcept
    : device_id(std::move(other.device_id)),
      handle(std::move(other.handle)),
      fd(std::exchange(other.fd, -1)),
      bytes(other.bytes),
      pid(other.pid) {}

ExportedMemory& ExportedMemory::operator=(ExportedMemory&& other) noexcept {
  if (this != &other) {
    if (fd >= 0) ::close(fd);
    device_id = std::move(other.device_id);
    handle = std::move(other.handle);
    fd = std::exchange(other.fd, -1);
    bytes = other.bytes;
    pid = other.pid;
  }
  return *this;
}

Result<ExportedMemory> Device::Export(const Buffer&) {
  return UnimplementedError("the memory of " + name() +
                            " cannot be exported to another process (no handover of it)");
}

Result<std::shared_ptr<Buffer>> Device::Import(ExportedMemory memory) {
  return UnimplementedError(name() + " cannot import memory of another process (from " +
                            (memory.device_id.empty() ? "an unnamed device" : memory.device_id) +
                            ")");
}

namespace {

// The environment variable `name` as a non-negative number, or `fallback`
// when it is unset or empty.
Result<double> NonNegativeFromEnvironment(const char* name, double fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text, &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(v) || v < 0) {
    return InvalidArgumentError(std::string(name) + "=" + text + ": expected a number >= 0");
  }
  return v;
}

}  // namespace

Result<EmulatedDeviceOptions> EmulatedDeviceOptionsFromEnvironment() {
  EmulatedDeviceOptions o;
  TL_ASSIGN_OR_RETURN(const double gbps,
                      NonNegativeFromEnvironment("TENSORLIFT_EMULATED_H2D_GBPS", 54.8));
  TL_ASSIGN_OR_RETURN(const double latency_us,
                      NonNegativeFromEnvironment("TENSORLIFT_EMULATED_COPY_LATENCY_US", 0));
  TL_ASSIGN_OR_RETURN(const double prefault_gb,
                      NonNegativeFromEnvironment("TENSORLIFT_EMULATED_PREFAULT_GB", 0));
  o.copy_bytes_per_second = gbps * 1e9;
  o.copy_latency_seconds = latency_us * 1e-6;
  o.prefault_bytes = static_cast<uint64_t>(prefault_gb * 1e9);
  const char* discard = std::getenv("TENSORLIFT_EMULATED_DISCARD_COPIES");
  if (discard != nullptr && *discard != '\0') {
    if (std::string_view(discard) != "0" && std::string_view(discard) != "1") {
      return InvalidArgumentError(std::string("TENSORLIFT_EMULATED_DISCARD_COPIES=") + discard +
                                  ": expected 0 or 1");
    }
    o.discard_copies = std::string_view(discard) == "1";
  }
  const char* id = std::getenv("TENSORLIFT_EMULATED_DEVICE_ID");
  if (id != nullptr && *id != '\0') {
    const std::string_view v(id);
    if (v.size() > 200 ||
        !std::all_of(v.begin(), v.end(), [](char c) { return c > ' ' && c < 127; })) {
      return InvalidArgumentError(
          "TENSORLIFT_EMULATED_DEVICE_ID: expected 1 to 200 printable characters without spaces");
    }
    o.id = std::string(v);
  }
  return o;
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
      // Made at the first call that finds valid options in the environment.
      static auto* mu = new std::mutex;
      static auto* emulated = new std::shared_ptr<Device>;
      std::lock_guard<std::mutex> lock(*mu);
      if (!*emulated) {
        TL_ASSIGN_OR_RETURN(EmulatedDeviceOptions options, EmulatedDeviceOptionsFromEnvironment());
        *emulated = MakeEmulatedDevice(options);
      }
      return *emulated;
    }
  }
  return InvalidArgumentError("unknown device type " + std::to_string(static_cast<int>(type)));
}

}  // namespace tensorlift
