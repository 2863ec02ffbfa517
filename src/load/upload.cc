#include "load/upload.h"

#include <chrono>
#include <utility>
#include <vector>

#include "load/checkpoint_builder.h"

namespace tensorlift {
namespace {

constexpr uint64_t kAlign = 256;  // cudaMalloc's, and enough for every dtype.

}  // namespace

Result<LoadedCheckpoint> UploadToDevice(LoadedCheckpoint&& host, std::shared_ptr<Device> device) {
  if (!device) return InvalidArgumentError("upload: no device");
  const auto start = std::chrono::steady_clock::now();
  const LoadedCheckpoint from = std::move(host);  // Released when this returns.
  std::vector<uint64_t> offsets;
  uint64_t total = 0;
  for (const LoadedTensor& t : from.tensors()) {
    if (t.device != DeviceType::kCpu) {
      return InvalidArgumentError("upload: tensor '" + t.name + "' is not in host memory");
    }
    offsets.push_back(total);
    total += (t.nbytes + kAlign - 1) / kAlign * kAlign;
  }
  std::shared_ptr<Buffer> whole;
  if (total > 0) {
    Result<std::shared_ptr<Buffer>> b = device->Allocate(total);
    if (!b.ok()) {
      return b.status().WithContext("upload: " + std::to_string(total) + " bytes on " +
                                    device->name());
    }
    whole = std::move(b).value();
    TL_ASSIGN_OR_RETURN(auto stream, device->CreateStream());
    for (size_t i = 0; i < from.tensors().size(); ++i) {
      const LoadedTensor& t = from.tensors()[i];
      if (t.nbytes == 0) continue;
      TL_RETURN_IF_ERROR(stream->CopyToDevice(whole->data() + offsets[i],
                                              static_cast<const std::byte*>(t.data), t.nbytes));
    }
    TL_RETURN_IF_ERROR(stream->Synchronize());
  }
  CheckpointBuilder out;
  out.set_device(device);
  out.Reserve(from.tensors().size());
  for (size_t i = 0; i < from.tensors().size(); ++i) {
    LoadedTensor t = from.tensors()[i];
    t.device = device->kind();
    t.device_index = device->ordinal();
    t.data = whole ? whole->data() + offsets[i] : nullptr;
    out.Add(std::move(t), whole);  // One buffer, shared by every tensor.
  }
  out.files() = from.files();
  out.device_plan().device_bytes = total;
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  return std::move(out).Finish(from.seconds() + took.count());
}

}  // namespace tensorlift
