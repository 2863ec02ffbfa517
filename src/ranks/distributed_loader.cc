// LoadDistributed: the ranks agree on the checkpoint and the options, share
// the reads (AssignByBytes), and each reads its pieces; DistributedCheckpoint
// then hands the tensors out (distributed_state.h).
#include <algorithm>
#include <string>
#include <utility>

#include "device/device.h"
#include "load/checkpoint_builder.h"
#include "ranks/distributed_state.h"
#include "tensorlift/checksum.h"
#include "tensorlift/distributed.h"

namespace tensorlift {

using ranks::Allocate;
using ranks::kNotLoaded;
using ranks::kPerRankRead;
using ranks::Quoted;

namespace {

// A digest of what the ranks must agree on: every shard's tensors (names,
// dtypes, shapes, byte ranges) in the checkpoint's order.
uint64_t HeaderDigest(const Checkpoint& ckpt) {
  std::string s;
  s += std::to_string(ckpt.shards().size()) + ";";
  for (const auto loc : ckpt.tensors()) {
    const TensorInfo& info = ckpt.info(loc);
    s += info.name;
    s += '\0';
    s += std::to_string(loc.shard) + "," + std::string(DtypeName(info.dtype)) + ",";
    for (uint64_t d : info.shape) s += std::to_string(d) + "x";
    s += ',';
    s += std::to_string(info.begin);
    s += ',';
    s += std::to_string(info.end);
    s += ';';
  }
  return Xxh3_64(s.data(), s.size());
}

const char* MemoryName(DeviceType type) {
  switch (type) {
    case DeviceType::kCpu:
      return "host memory";
    case DeviceType::kCuda:
      return "CUDA device memory";
    case DeviceType::kEmulated:
      return "emulated device memory";
  }
  return "unknown memory";
}

// The device of a load onto one (null for a host load), and the checks of
// the communicator that will move its tensors. Local.
Status OpenDeviceFor(const LoadOptions& options, const Communicator& comm,
                     const Communicator* device_comm, std::shared_ptr<Device>& device) {
  const DeviceId& dev = options.device;
  if (dev.on_host()) {
    if (device_comm != nullptr) {
      return InvalidArgumentError(
          "DistributedOptions::device_comm is for loads onto a device; this load is into host "
          "memory (device \"cpu\"), whose tensors move with the communicator passed to "
          "LoadDistributed");
    }
    return Status::Ok();
  }
  const std::string where = "a load onto \"" + dev.Name() + "\"";
  if (device_comm == nullptr) {
    return InvalidArgumentError(where +
                                " needs DistributedOptions::device_comm, a communicator over that "
                                "device's memory (NCCL for CUDA)");
  }
  if (device_comm->memory() != dev.type) {
    return InvalidArgumentError(where + ": DistributedOptions::device_comm moves " +
                                MemoryName(device_comm->memory()) + ", not " +
                                MemoryName(dev.type));
  }
  if (device_comm->size() != comm.size() || device_comm->rank() != comm.rank()) {
    return InvalidArgumentError(where + ": DistributedOptions::device_comm is rank " +
                                std::to_string(device_comm->rank()) + " of " +
                                std::to_string(device_comm->size()) + ", the communicator rank " +
                                std::to_string(comm.rank()) + " of " + std::to_string(comm.size()) +
                                " (they must list the same ranks in the same order)");
  }
  TL_ASSIGN_OR_RETURN(device, OpenDevice(dev.type, dev.index));
  return Status::Ok();
}

}  // namespace

DistributedCheckpoint::DistributedCheckpoint(std::unique_ptr<State> state)
    : state_(std::move(state)) {}
DistributedCheckpoint::DistributedCheckpoint(DistributedCheckpoint&&) noexcept = default;
DistributedCheckpoint& DistributedCheckpoint::operator=(DistributedCheckpoint&&) noexcept = default;
DistributedCheckpoint::~DistributedCheckpoint() = default;

int DistributedCheckpoint::rank() const { return state_->comm->rank(); }
int DistributedCheckpoint::world() const { return state_->comm->size(); }
uint64_t DistributedCheckpoint::bytes_read() const {
  return state_->load_bytes + state_->direct_bytes;
}
uint64_t DistributedCheckpoint::load_bytes() const { return state_->load_bytes; }
uint64_t DistributedCheckpoint::buffer_bytes() const {
  uint64_t total = 0;
  for (const auto& l : state_->loaded) total += l.buffer_bytes();
  return total;
}
const Assignment& DistributedCheckpoint::assignment() const { return state_->assignment; }

std::vector<std::string> DistributedCheckpoint::loaded_names() const {
  std::vector<std::string> names;
  for (size_t t = 0; t < state_->group_of.size(); ++t) {
    if (state_->group_of[t] != kNotLoaded) names.push_back(state_->Info(t).name);
  }
  return names;
}

std::vector<std::string> DistributedCheckpoint::per_rank_read_names() const {
  std::vector<std::string> names;
  for (size_t t = 0; t < state_->group_of.size(); ++t) {
    if (state_->PerRankRead(t)) names.push_back(state_->Info(t).name);
  }
  return names;
}

void DistributedCheckpoint::Release() {
  for (auto& g : state_->groups) g.dropped = true;
  for (auto& l : state_->loaded) l = LoadedCheckpoint();
}

Result<HostTensor> DeviceTensor::ToHost() const {
  HostTensor out;
  out.name = name;
  out.dtype = dtype;
  out.shape = shape;
  out.nbytes = nbytes;
  if (nbytes == 0) return out;
  if (!on || data == nullptr) return InvalidArgumentError(Quoted(name) + ": no device bytes");
  TL_ASSIGN_OR_RETURN(out.data, Allocate(nbytes, Quoted(name) + "'s host copy"));
  TL_ASSIGN_OR_RETURN(auto stream, on->CreateStream());
  TL_RETURN_IF_ERROR(
      stream->CopyToHost(out.data.get(), static_cast<const std::byte*>(data), nbytes));
  TL_RETURN_IF_ERROR(stream->Synchronize());
  return out;
}

Result<HostTensor> DistributedCheckpoint::GetTensor(std::string_view name) {
  TL_RETURN_IF_ERROR(state_->Require(false, "GetTensor"));
  TL_ASSIGN_OR_RETURN(State::Placed p, state_->Whole(name));
  return std::move(p.t);
}

Result<HostTensor> DistributedCheckpoint::GetSharded(std::string_view name, int dim) {
  TL_RETURN_IF_ERROR(state_->Require(false, "GetSharded"));
  TL_ASSIGN_OR_RETURN(State::Placed p, state_->Sharded(name, dim));
  return std::move(p.t);
}

Result<HostTensor> DistributedCheckpoint::GetShardedByRead(std::string_view name) {
  TL_RETURN_IF_ERROR(state_->Require(false, "GetShardedByRead"));
  TL_ASSIGN_OR_RETURN(State::Placed p, state_->ByRead(name));
  return std::move(p.t);
}

Result<DeviceTensor> DistributedCheckpoint::GetDeviceTensor(std::string_view name) {
  TL_RETURN_IF_ERROR(state_->Require(true, "GetDeviceTensor"));
  TL_ASSIGN_OR_RETURN(State::Placed p, state_->Whole(name));
  return state_->OnDevice(std::move(p));
}

Result<DeviceTensor> DistributedCheckpoint::GetDeviceSharded(std::string_view name, int dim) {
  TL_RETURN_IF_ERROR(state_->Require(true, "GetDeviceSharded"));
  TL_ASSIGN_OR_RETURN(State::Placed p, state_->Sharded(name, dim));
  return state_->OnDevice(std::move(p));
}

Result<DeviceTensor> DistributedCheckpoint::GetDeviceShardedByRead(std::string_view name) {
  TL_RETURN_IF_ERROR(state_->Require(true, "GetDeviceShardedByRead"));
  TL_ASSIGN_OR_RETURN(State::Placed p, state_->ByRead(name));
  return state_->OnDevice(std::move(p));
}

Result<DLManagedTensorVersioned*> DeviceTensor::ToDLPackVersioned(bool raw_bytes) const {
  LoadedTensor t;
  t.name = name;
  t.dtype = dtype;
  t.shape.assign(shape.begin(), shape.end());
  SetRowMajorStrides(&t);
  t.data = data;
  t.nbytes = nbytes;
  t.device = device;
  t.device_index = device_index;
  return StreamedTensor(t, owner).ToDLPackVersioned(raw_bytes);
}

DeviceType DistributedCheckpoint::device() const {
  return state_->device ? state_->device->kind() : DeviceType::kCpu;
}

Result<DistributedCheckpoint> LoadDistributed(const Checkpoint& ckpt, const LoadOptions& options,
                                              Communicator& comm, const DistributedOptions& dopts) {
  const int world = comm.size();
  const int me = comm.rank();
  const auto& tensors = ckpt.tensors();

  // 1. Options (local) and headers (the ranks must have opened the same
  //    checkpoint): agreed before any exchange sized by the headers.
  std::shared_ptr<Device> device;
  Status local = OpenDeviceFor(options, comm, dopts.device_comm, device);
  if (local.ok() && ckpt.store()) {
    local = InvalidArgumentError(
        "LoadDistributed reads local files; " + ckpt.path() +
        " is read through its store (each rank can Load it, or load its slices from the bucket)");
  } else if (local.ok() && options.dtype.has_value()) {
    local = InvalidArgumentError("LoadDistributed does not convert dtypes (LoadOptions::dtype)");
  } else if (local.ok() && options.on_tensor) {
    local = InvalidArgumentError(
        "LoadDistributed hands out no tensors while it loads (LoadOptions::on_tensor)");
  }
  const uint64_t mine[2] = {HeaderDigest(ckpt), tensors.size()};
  std::vector<uint64_t> all(2 * static_cast<size_t>(world));
  TL_RETURN_IF_ERROR(comm.AllGather(mine, all.data(), sizeof(mine)));
  if (local.ok() && (all[0] != mine[0] || all[1] != mine[1])) {
    local = InvalidArgumentError("rank " + std::to_string(me) + " opened a checkpoint (" +
                                 ckpt.path() + ", " + std::to_string(tensors.size()) +
                                 " tensors) whose headers differ from rank 0's (" +
                                 std::to_string(all[1]) + " tensors)");
  }
  TL_RETURN_IF_ERROR(comm.Agree(local));

  // 2. The needed and dim-0-sharded unions: two bitmaps over ckpt.tensors()
  //    from every rank.
  const size_t n = tensors.size();
  const size_t map_bytes = (n + 7) / 8;
  std::vector<uint8_t> my_map(2 * map_bytes, 0), maps(2 * map_bytes * world, 0);
  for (size_t t = 0; t < n; ++t) {
    const std::string& name = ckpt.info(tensors[t]).name;
    if (options.filter.Matches(name) && dopts.needed.Matches(name)) my_map[t / 8] |= 1u << (t % 8);
    if (dopts.dim0_sharded.Matches(name)) my_map[map_bytes + t / 8] |= 1u << (t % 8);
  }
  TL_RETURN_IF_ERROR(comm.AllGather(my_map.data(), maps.data(), 2 * map_bytes));
  auto any_rank = [&](size_t t, size_t map) {
    for (int r = 0; r < world; ++r) {
      if ((maps[(2 * r + map) * map_bytes + t / 8] >> (t % 8)) & 1u) return true;
    }
    return false;
  };
  // Per-rank reads: the declared tensors the mode picks. Rank 0's mode and
  // threshold decide, so that every rank makes the same choice.
  uint64_t mode_and_threshold[2] = {static_cast<uint64_t>(dopts.dim0), dopts.dim0_read_threshold};
  TL_RETURN_IF_ERROR(comm.Broadcast(mode_and_threshold, sizeof(mode_and_threshold), 0));
  const auto mode = static_cast<Dim0Mode>(mode_and_threshold[0]);
  std::vector<bool> needed(n, false), per_rank(n, false);
  for (size_t t = 0; t < n; ++t) {
    needed[t] = any_rank(t, 0);
    if (!needed[t] || !any_rank(t, 1)) continue;
    const uint64_t bytes = ckpt.info(tensors[t]).nbytes();
    per_rank[t] =
        mode == Dim0Mode::kRead || (mode == Dim0Mode::kAuto && bytes > mode_and_threshold[1]);
  }

  // 3. The same assignment everywhere: tensors nobody needs weigh nothing
  //    and are skipped by every reader.
  auto state = std::make_unique<DistributedCheckpoint::State>();
  state->ckpt = &ckpt;
  state->comm = &comm;
  state->data_comm = device ? dopts.device_comm : &comm;
  state->device = std::move(device);
  state->dopts = dopts;
  const auto& shards = ckpt.shards();
  state->position.resize(shards.size());
  std::vector<std::vector<uint64_t>> weights(shards.size());
  for (size_t f = 0; f < shards.size(); ++f) {
    const size_t count = shards[f].header.tensors().size();
    state->position[f].assign(count, UINT32_MAX);
    weights[f].assign(count, 0);
  }
  for (size_t t = 0; t < n; ++t) {
    state->position[tensors[t].shard][tensors[t].index] = static_cast<uint32_t>(t);
    if (needed[t] && !per_rank[t]) {
      weights[tensors[t].shard][tensors[t].index] = ckpt.info(tensors[t]).nbytes();
    }
  }
  TL_ASSIGN_OR_RETURN(state->assignment, AssignByBytes(weights, world, dopts.assign));
  state->group_of.assign(n, kNotLoaded);
  for (size_t t = 0; t < n; ++t) {
    if (per_rank[t]) state->group_of[t] = kPerRankRead;
  }
  state->handed_out.assign(n, false);
  state->loaded.resize(shards.size());
  std::vector<std::vector<std::string>> my_names(shards.size());
  for (int r = 0; r < world; ++r) {
    for (const ReadPiece& p : state->assignment.ranks[r].pieces) {
      int32_t group = kNotLoaded;
      for (uint32_t i = p.first; i <= p.last; ++i) {
        const uint32_t t = state->position[p.file][i];
        if (t == UINT32_MAX || !needed[t] || per_rank[t]) continue;
        if (group == kNotLoaded) {
          // One group per (reader, file): pieces of a rank are sorted by file.
          auto& gs = state->groups;
          if (gs.empty() || gs.back().reader != r || gs.back().shard != p.file) {
            gs.push_back({r, p.file, 0, false});
          }
          group = static_cast<int32_t>(gs.size() - 1);
        }
        state->group_of[t] = group;
        ++state->groups[group].remaining;
        if (r == me) {
          my_names[p.file].push_back(ckpt.info(tensors[t]).name);
          state->load_bytes += ckpt.info(tensors[t]).nbytes();
        }
      }
    }
  }

  // 4. This rank's pieces, one load per file (so that each file's buffer can
  //    be dropped on its own); then every rank learns whether all succeeded.
  local = Status::Ok();
  for (size_t f = 0; f < shards.size() && local.ok(); ++f) {
    if (my_names[f].empty()) continue;
    LoadOptions opts = options;
    opts.filter = TensorFilter::Names(std::move(my_names[f]));
    Result<LoadedCheckpoint> r = Load(ckpt, opts);
    if (r.ok()) {
      state->loaded[f] = std::move(r).value();
    } else {
      local = r.status();
    }
  }
  if (!local.ok()) {
    for (auto& l : state->loaded) l = LoadedCheckpoint();
  }
  TL_RETURN_IF_ERROR(comm.Agree(local));
  return DistributedCheckpoint(std::move(state));
}

}  // namespace tensorlift
