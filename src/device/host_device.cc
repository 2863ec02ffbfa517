// The host as a device: synchronous, over plain host memory (device.h).
#include <cstring>

#include "common/clock.h"
#include "device/device.h"
#include "device/stream_checks.h"
#include "tensorlift/bitmask.h"
#include "tensorlift/convert.h"

namespace tensorlift {
namespace {

class HostEvent final : public DeviceEvent {
 public:
  Status Synchronize() override { return Status::Ok(); }
  bool Done() override { return true; }
  double CompletedAtMicros() override { return at_; }
  void Mark() { at_ = NowMicros(); }

 private:
  double at_ = 0;
};

class HostStream final : public DeviceStream {
 public:
  Status CopyToDevice(std::byte* dst, const std::byte* src, uint64_t bytes) override {
    return Copy(dst, src, bytes);
  }
  Status CopyOnDevice(std::byte* dst, const std::byte* src, uint64_t bytes) override {
    return Copy(dst, src, bytes);
  }
  Status CopyToHost(std::byte* dst, const std::byte* src, uint64_t bytes) override {
    return Copy(dst, src, bytes);
  }
  Status Convert(std::byte* dst, Dtype to, const std::byte* src, Dtype from,
                 uint64_t count) override {
    if (count > 0 && (dst == nullptr || src == nullptr))
      return InvalidArgumentError("convert: null address");
    return ConvertOnHost(dst, to, src, from, count);
  }
  // The CPU decoder (the best ISA), on the calling thread as everything here.
  Status DecodeBitmask(std::byte* dst, const std::byte* values, uint64_t nnz,
                       const uint8_t* bitmask, const int64_t* row_offsets, uint64_t rows,
                       uint64_t cols, uint32_t elem_bytes) override {
    TL_RETURN_IF_ERROR(
        CheckDecodeBitmaskArgs(dst, values, nnz, bitmask, row_offsets, rows, cols, elem_bytes)
            .status());
    const sparse::BitmaskShape shape{.rows = rows, .cols = cols, .elem_bytes = elem_bytes};
    sparse::DecodeRows(sparse::BestDecodeIsa(), values, bitmask, row_offsets, shape, 0, rows, dst);
    return Status::Ok();
  }
  Status Record(DeviceEvent& event) override {
    static_cast<HostEvent&>(event).Mark();
    return Status::Ok();
  }
  Status Synchronize() override { return Status::Ok(); }

 private:
  static Status Copy(std::byte* dst, const std::byte* src, uint64_t bytes) {
    if (bytes == 0) return Status::Ok();
    if (dst == nullptr || src == nullptr) return InvalidArgumentError("copy: null address");
    std::memcpy(dst, src, bytes);
    return Status::Ok();
  }
};

class HostDevice final : public Device {
 public:
  DeviceType kind() const override { return DeviceType::kCpu; }
  int ordinal() const override { return 0; }
  std::string name() const override { return "cpu"; }
  int dlpack_device_type() const override { return 1; }  // kDLCPU
  Result<std::shared_ptr<Buffer>> Allocate(uint64_t bytes) override {
    TL_ASSIGN_OR_RETURN(auto b, HostBuffer::Allocate(bytes));
    return std::shared_ptr<Buffer>(std::move(b));
  }
  Result<std::shared_ptr<Buffer>> AllocatePinned(uint64_t bytes) override {
    return Allocate(bytes);
  }
  Result<std::unique_ptr<DeviceStream>> CreateStream() override {
    return std::unique_ptr<DeviceStream>(std::make_unique<HostStream>());
  }
  Result<std::unique_ptr<DeviceEvent>> CreateEvent() override {
    return std::unique_ptr<DeviceEvent>(std::make_unique<HostEvent>());
  }
  Result<uint64_t> FreeMemory() override { return UINT64_MAX; }
};

}  // namespace

std::shared_ptr<Device> MakeHostDevice() { return std::make_shared<HostDevice>(); }

}  // namespace tensorlift
