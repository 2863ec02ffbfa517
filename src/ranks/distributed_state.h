// One rank's state of a multi-rank load (private to ranks/): which rank read
// which tensors into which buffers, and the hand-out of tensors to every rank
// (whole, sliced along a dim, or read by each rank itself) over the load's
// communicators, in host or device memory (distributed_state.cc).
// DistributedCheckpoint (distributed_loader.cc) holds it; not thread-safe
// (every rank calls the same Get* in the same order).
#ifndef TENSORLIFT_RANKS_DISTRIBUTED_STATE_H_
#define TENSORLIFT_RANKS_DISTRIBUTED_STATE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "device/device.h"
#include "tensorlift/distributed.h"

namespace tensorlift {
namespace ranks {

// State::group_of of a tensor nobody needs.
inline constexpr int32_t kNotLoaded = -1;
// Needed, but read by each rank when asked (Dim0Mode): no reader, no buffer.
inline constexpr int32_t kPerRankRead = -2;

// A buffer of `bytes` bytes, or ResourceExhausted (never throws).
Result<std::unique_ptr<std::byte[]>> Allocate(uint64_t bytes, std::string_view what);

// "tensor '<name>'", for messages.
inline std::string Quoted(std::string_view name) { return "tensor '" + std::string(name) + "'"; }

}  // namespace ranks

struct DistributedCheckpoint::State {
  // Buffers of the pieces one rank read from one file.
  struct Group {
    int reader = 0;
    uint32_t shard = 0;
    uint32_t remaining = 0;  // Needed tensors not yet handed out.
    bool dropped = false;
  };
  // One Get*'s result: in host memory (t.data) for a host load, in the
  // load's device memory (on_device) for a device load.
  struct Placed {
    HostTensor t;  // name, dtype, shape, nbytes; and the bytes of a host load.
    std::shared_ptr<Buffer> on_device;
    std::byte* data() const { return on_device ? on_device->data() : t.data.get(); }
  };
  const Checkpoint* ckpt = nullptr;
  Communicator* comm = nullptr;          // Host memory: headers, needs, Agree.
  Communicator* data_comm = nullptr;     // Tensors: comm, or DistributedOptions::device_comm.
  std::shared_ptr<Device> device;        // Null for a host load.
  std::unique_ptr<DeviceStream> stream;  // Copies within `device`, created when first needed.
  DistributedOptions dopts;
  Assignment assignment;
  // Per tensor (index into ckpt->tensors()): the group that read it,
  // ranks::kNotLoaded or ranks::kPerRankRead; whether it was handed out.
  std::vector<int32_t> group_of;
  std::vector<bool> handed_out;
  std::vector<Group> groups;
  // [shard][index in its header] -> index into ckpt->tensors().
  std::vector<std::vector<uint32_t>> position;
  // This rank's buffers, per shard (empty where it read nothing or dropped).
  std::vector<LoadedCheckpoint> loaded;
  uint64_t load_bytes = 0;
  uint64_t direct_bytes = 0;

  // The tensor's index into ckpt->tensors(), or NotFound.
  Result<uint32_t> Lookup(std::string_view name) const {
    const auto loc = ckpt->Find(name);
    if (!loc) return NotFoundError(ranks::Quoted(name) + " is not in the checkpoint");
    const uint32_t t = position[loc->shard][loc->index];
    if (group_of[t] == ranks::kNotLoaded) {
      return NotFoundError(ranks::Quoted(name) +
                           " was not loaded (filtered out, or needed by no rank)");
    }
    return t;
  }
  const TensorInfo& Info(uint32_t t) const { return ckpt->info(ckpt->tensors()[t]); }
  bool PerRankRead(uint32_t t) const { return group_of[t] == ranks::kPerRankRead; }
  const Group& GroupOf(uint32_t t) const { return groups[group_of[t]]; }

  // This rank's slice of tensor t along dim (-1: all of it), read from its
  // file by this rank alone (no collective).
  Result<HostTensor> ReadSlice(uint32_t t, int dim);
  // ReadSlice, copied up to the device for a device load.
  Result<Placed> ReadPlaced(uint32_t t, int dim);

  // GetTensor, GetSharded and GetShardedByRead, wherever the load went.
  Result<Placed> Whole(std::string_view name);
  Result<Placed> Sharded(std::string_view name, int dim);
  Result<Placed> ByRead(std::string_view name);

  // `bytes` bytes for p in host or device memory (local; ResourceExhausted).
  Status AllocateFor(Placed& p, uint64_t bytes, std::string_view what);
  // Copies within the load's memory (device copies are complete at Flush()).
  Status CopyWithin(std::byte* dst, const std::byte* src, uint64_t bytes);
  Status Stream();
  Status Flush();
  // InvalidArgument unless the load went to a device (on_device) or not.
  Status Require(bool on_device, const char* what) const;
  DeviceTensor OnDevice(Placed&& p) const;

  Status CheckBuffer(uint32_t t) const {
    const Group& g = GroupOf(t);
    if (!g.dropped) return Status::Ok();
    return InvalidArgumentError(ranks::Quoted(Info(t).name) + ": rank " + std::to_string(g.reader) +
                                " already released its buffer of " + ckpt->shards()[g.shard].path +
                                " (its tensors were all handed out, or Release() was called; "
                                "DistributedOptions::keep_buffers keeps them)");
  }

  // Where this rank holds tensor t's bytes (this rank must be its reader).
  const std::byte* Source(uint32_t t) const {
    const LoadedTensor* lt = loaded[GroupOf(t).shard].Find(Info(t).name);
    return lt ? static_cast<const std::byte*>(lt->data) : nullptr;
  }

  // Marks t handed out; drops the reader's buffer when it was the last one.
  void HandOut(uint32_t t) {
    if (handed_out[t] || PerRankRead(t)) return;
    handed_out[t] = true;
    Group& g = groups[group_of[t]];
    if (--g.remaining > 0 || dopts.keep_buffers || g.dropped) return;
    g.dropped = true;
    if (g.reader == comm->rank()) loaded[g.shard] = LoadedCheckpoint();
  }
};

}  // namespace tensorlift

#endif  // TENSORLIFT_RANKS_DISTRIBUTED_STATE_H_
