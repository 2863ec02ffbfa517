#include "load/checkpoint_builder.h"

#include <algorithm>
#include <numeric>

#include "load/owners.h"

namespace tensorlift {

void SetRowMajorStrides(LoadedTensor* t) {
  t->strides.resize(t->shape.size());
  int64_t stride = 1;
  for (size_t d = t->shape.size(); d-- > 0;) {
    t->strides[d] = stride;
    stride *= t->shape[d];
  }
}

CheckpointBuilder::CheckpointBuilder(LoadedCheckpoint&& from)
    : tensors_(std::move(from.tensors_)),
      owners_(std::move(from.owners_->buffers)),
      files_(std::move(from.files_)),
      device_(std::move(from.owners_->device)),
      plan_(from.device_plan_),
      content_(std::move(from.content_)) {
  from.total_bytes_ = 0;
}

void CheckpointBuilder::Reserve(size_t tensors) {
  tensors_.reserve(tensors);
  owners_.reserve(tensors);
}

void CheckpointBuilder::Add(LoadedTensor tensor, std::shared_ptr<Buffer> owner) {
  tensors_.push_back(std::move(tensor));
  owners_.push_back(std::move(owner));
  content_.reset();
}

void CheckpointBuilder::RemoveIf(
    const std::function<bool(const LoadedTensor&, const std::shared_ptr<Buffer>&)>& drop) {
  size_t kept = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (drop(tensors_[i], owners_[i])) continue;
    if (kept != i) {
      tensors_[kept] = std::move(tensors_[i]);
      owners_[kept] = std::move(owners_[i]);
    }
    ++kept;
  }
  if (kept != tensors_.size()) content_.reset();
  tensors_.resize(kept);
  owners_.resize(kept);
}

LoadedCheckpoint CheckpointBuilder::Finish(double seconds) && {
  auto by_name = [&](size_t a, size_t b) { return tensors_[a].name < tensors_[b].name; };
  std::vector<size_t> order(tensors_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  if (!std::is_sorted(order.begin(), order.end(), by_name)) {
    std::stable_sort(order.begin(), order.end(), by_name);
    std::vector<LoadedTensor> tensors;
    std::vector<std::shared_ptr<Buffer>> owners;
    tensors.reserve(order.size());
    owners.reserve(order.size());
    for (size_t i : order) {
      tensors.push_back(std::move(tensors_[i]));
      owners.push_back(std::move(owners_[i]));
    }
    tensors_ = std::move(tensors);
    owners_ = std::move(owners);
  }
  // Moved whole, so that the tensors keep their addresses (StreamedTensors handed
  // out while loading point at them).
  LoadedCheckpoint out;
  for (const LoadedTensor& t : tensors_) out.total_bytes_ += t.nbytes;
  out.tensors_ = std::move(tensors_);
  out.owners_->buffers = std::move(owners_);
  out.owners_->device = std::move(device_);
  out.files_ = std::move(files_);
  out.device_plan_ = plan_;
  out.seconds_ = seconds;
  out.content_ = std::move(content_);
  return out;
}

const std::vector<std::shared_ptr<Buffer>>& CheckpointBuilder::Owners(
    const LoadedCheckpoint& loaded) {
  return loaded.owners_->buffers;
}

}  // namespace tensorlift
