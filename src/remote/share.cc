// ShareTensors (include/tensorlift/remote.h): host tensors copied once into
// sealed shared memory, and the same memory mapped copy-on-write for their
// owner.
#include <fcntl.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "common/posix_file.h"
#include "device/host_buffer.h"
#include "load/checkpoint_builder.h"
#include "remote/server.h"
#include "tensorlift/remote.h"

namespace tensorlift {
namespace {

constexpr uint64_t kAlign = 64;  // Each tensor's start in the shared memory.

uint64_t AlignUp(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

Result<SharedTensors> ShareTensors(const std::vector<PeerServer::Tensor>& tensors,
                                   const std::string& name) {
  std::set<std::string> names;
  std::vector<uint64_t> sizes;
  uint64_t total = 0;
  for (const PeerServer::Tensor& t : tensors) {
    if (!t.device.on_host()) {
      return InvalidArgumentError("share: tensor '" + t.name + "' is on " + t.device.Name() +
                                  ", not in host memory");
    }
    if (t.shard_dim >= 0) {
      return InvalidArgumentError("share: tensor '" + t.name +
                                  "' is a slice; shared tensors are whole");
    }
    if (!names.insert(t.name).second) {
      return InvalidArgumentError("share: tensor '" + t.name + "' is given twice");
    }
    TL_ASSIGN_OR_RETURN(const uint64_t bytes, remote::BufferBytes(t, "share"));
    sizes.push_back(bytes);
    const uint64_t start = AlignUp(total);
    if (start < total || start + bytes < start) {
      return InvalidArgumentError("share: the tensors' sizes overflow");
    }
    total = start + bytes;
  }
  TL_ASSIGN_OR_RETURN(std::shared_ptr<HostBuffer> shared,
                      HostBuffer::AllocateShared(std::max<uint64_t>(total, 1), name));
  std::vector<uint64_t> offsets;
  uint64_t at = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    at = AlignUp(at);
    offsets.push_back(at);
    if (sizes[i]) std::memcpy(shared->data() + at, tensors[i].data, sizes[i]);
    at += sizes[i];
  }
  TL_RETURN_IF_ERROR(shared->Seal());
  // The owner's view: a second mapping of the same memory, private.
  const int fd = ::fcntl(shared->shared_fd(), F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return PosixError("share: dup of the shared memory's descriptor", errno);
  TL_ASSIGN_OR_RETURN(std::shared_ptr<HostBuffer> mine,
                      HostBuffer::MapShared(fd, std::max<uint64_t>(total, 1), true));

  CheckpointBuilder sealed;
  CheckpointBuilder cow;
  sealed.Reserve(tensors.size());
  cow.Reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    LoadedTensor t;
    t.name = tensors[i].name;
    t.dtype = tensors[i].dtype;
    t.shape = tensors[i].shape;
    t.nbytes = sizes[i];
    SetRowMajorStrides(&t);
    t.data = shared->data() + offsets[i];
    sealed.Add(t, shared);
    t.data = mine->data() + offsets[i];
    cow.Add(std::move(t), mine);
  }
  SharedTensors out;
  out.sealed = std::make_shared<const LoadedCheckpoint>(std::move(sealed).Finish(0));
  out.copy_on_write = std::move(cow).Finish(0);
  return out;
}

}  // namespace tensorlift
