#include "load/shared_memory.h"

#include <cstring>
#include <unordered_set>
#include <vector>

#include "device/host_buffer.h"
#include "load/checkpoint_builder.h"

namespace tensorlift {

Status CheckSharedMemoryOptions(const LoadOptions& options) {
  if (!options.device.on_host()) {
    return InvalidArgumentError("shared_memory: tensors on \"" + options.device.Name() +
                                "\" are not host memory (shared_memory is for host loads)");
  }
  if (options.mode == IoMode::kMmap) {
    return InvalidArgumentError(
        "shared_memory: mode mmap hands out views of the file, not memory to share");
  }
  if (options.arena_pool) {
    return InvalidArgumentError("shared_memory: an arena_pool's buffers are not shared memory");
  }
  return Status::Ok();
}

Result<LoadedCheckpoint> IntoSharedMemory(LoadedCheckpoint loaded, const std::string& name) {
  const double seconds = loaded.seconds();
  CheckpointBuilder from(std::move(loaded));
  const std::vector<LoadedTensor>& tensors = from.tensors();
  const std::vector<std::shared_ptr<Buffer>>& owners = from.owners();
  // Which tensors stay where they are: those in a shared buffer, sealed now.
  std::vector<bool> stays(tensors.size(), false);
  std::unordered_set<HostBuffer*> sealed;
  uint64_t moved_bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].device != DeviceType::kCpu) {
      return InvalidArgumentError("shared_memory: tensor '" + tensors[i].name +
                                  "' is not in host memory");
    }
    HostBuffer* host = dynamic_cast<HostBuffer*>(owners[i].get());
    if (host && (host->shared_fd() >= 0 || sealed.count(host) || host->Seal().ok())) {
      sealed.insert(host);
      stays[i] = true;
      continue;
    }
    moved_bytes = (moved_bytes + 63) / 64 * 64 + tensors[i].nbytes;
  }
  std::shared_ptr<HostBuffer> fresh;
  if (moved_bytes > 0) {
    TL_ASSIGN_OR_RETURN(fresh, HostBuffer::AllocateShared(moved_bytes, name));
  }
  CheckpointBuilder out;
  out.Reserve(tensors.size());
  out.files() = std::move(from.files());
  uint64_t at = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    LoadedTensor t = tensors[i];
    if (stays[i]) {
      out.Add(std::move(t), owners[i]);
      continue;
    }
    at = (at + 63) / 64 * 64;
    if (t.nbytes) std::memcpy(fresh->data() + at, t.data, t.nbytes);
    t.data = fresh->data() + at;
    at += t.nbytes;
    out.Add(std::move(t), fresh);
  }
  if (fresh) TL_RETURN_IF_ERROR(fresh->Seal());
  out.set_content(from.content());  // The same bytes, moved.
  return std::move(out).Finish(seconds);
}

}  // namespace tensorlift
