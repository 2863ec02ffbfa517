// The one place that builds a LoadedCheckpoint (docs/architecture.md): every
// load path (host, GPU, sparse, peer, a rank's slices) adds its tensors, each
// with the owner of its bytes, and its file reports, then calls Finish.
#ifndef TENSORLIFT_LOAD_CHECKPOINT_BUILDER_H_
#define TENSORLIFT_LOAD_CHECKPOINT_BUILDER_H_

#include <functional>
#include <memory>
#include <vector>

#include "device/host_buffer.h"
#include "tensorlift/loader.h"

namespace tensorlift {

class Device;

// Row-major strides (in elements) of t->shape into t->strides.
void SetRowMajorStrides(LoadedTensor* t);

class CheckpointBuilder {
 public:
  CheckpointBuilder() = default;
  // A finished checkpoint taken apart, to drop tensors from it or add to it.
  explicit CheckpointBuilder(LoadedCheckpoint&& from);

  // The device the tensors are on (none for host memory).
  void set_device(std::shared_ptr<Device> device) { device_ = std::move(device); }
  const std::shared_ptr<Device>& device() const { return device_; }
  DeviceMemoryPlan& device_plan() { return plan_; }

  void Reserve(size_t tensors);
  // `owner` keeps `tensor`'s bytes alive (tensors of one buffer share it).
  void Add(LoadedTensor tensor, std::shared_ptr<Buffer> owner);
  // Drops the tensors for which drop(tensor, owner) is true.
  void RemoveIf(
      const std::function<bool(const LoadedTensor&, const std::shared_ptr<Buffer>&)>& drop);
  // The tensors so far, in the order added (LoadOptions::on_tensor hands them
  // out by index while the load runs), and their owners.
  const std::vector<LoadedTensor>& tensors() const { return tensors_; }
  const std::vector<std::shared_ptr<Buffer>>& owners() const { return owners_; }
  std::vector<FileReport>& files() { return files_; }
  // The tensors' content identity (null: none). A builder made from a
  // checkpoint keeps its identity until a tensor is added or removed.
  void set_content(std::shared_ptr<const ContentIdentity> content) {
    content_ = std::move(content);
  }
  const std::shared_ptr<const ContentIdentity>& content() const { return content_; }

  // The checkpoint: tensors in name order, the total of their bytes, and
  // `seconds` as the load's time.
  LoadedCheckpoint Finish(double seconds) &&;

  // The buffer owning each of loaded.tensors()[i].
  static const std::vector<std::shared_ptr<Buffer>>& Owners(const LoadedCheckpoint& loaded);

 private:
  std::vector<LoadedTensor> tensors_;
  std::vector<std::shared_ptr<Buffer>> owners_;
  std::vector<FileReport> files_;
  std::shared_ptr<Device> device_;
  DeviceMemoryPlan plan_;
  std::shared_ptr<const ContentIdentity> content_;
};

}  // namespace tensorlift

#endif  // TENSORLIFT_LOAD_CHECKPOINT_BUILDER_H_
