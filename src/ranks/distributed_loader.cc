#include <algorithm>
#include <cstring>
#include <new>
#include <string>
#include <utility>

#include "common/posix_file.h"
#include "device/device.h"
#include "io/read_op.h"
#include "load/checkpoint_builder.h"
#include "tensorlift/checksum.h"
#include "tensorlift/distributed.h"

namespace tensorlift {
namespace {

constexpr int32_t kNotLoaded = -1;
// Needed, but read by each rank when asked (Dim0Mode): no reader, no buffer.
constexpr int32_t kPerRankRead = -2;

// A buffer of `bytes` bytes, or ResourceExhausted (never throws).
Result<std::unique_ptr<std::byte[]>> Allocate(uint64_t bytes, std::string_view what) {
  if (bytes == 0) return std::unique_ptr<std::byte[]>();
  std::unique_ptr<std::byte[]> p(new (std::nothrow) std::byte[bytes]);
  if (!p) {
    return ResourceExhaustedError("cannot allocate " + std::to_string(bytes) + " bytes for " +
                                  std::string(what));
  }
  return p;
}

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

std::string Quoted(std::string_view name) { return "tensor '" + std::string(name) + "'"; }

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
  TL_ASSIGN_OR_RETURN(const auto dev, ParseDevice(options.device));
  if (dev.first == DeviceType::kCpu) {
    if (device_comm != nullptr) {
      return InvalidArgumentError(
          "DistributedOptions::device_comm is for loads onto a device; this load is into host "
          "memory (device \"cpu\"), whose tensors move with the communicator passed to "
          "LoadDistributed");
    }
    return Status::Ok();
  }
  const std::string where = "a load onto \"" + options.device + "\"";
  if (device_comm == nullptr) {
    return InvalidArgumentError(where +
                                " needs DistributedOptions::device_comm, a communicator over that "
                                "device's memory (NCCL for CUDA)");
  }
  if (device_comm->memory() != dev.first) {
    return InvalidArgumentError(where + ": DistributedOptions::device_comm moves " +
                                MemoryName(device_comm->memory()) + ", not " +
                                MemoryName(dev.first));
  }
  if (device_comm->size() != comm.size() || device_comm->rank() != comm.rank()) {
    return InvalidArgumentError(where + ": DistributedOptions::device_comm is rank " +
                                std::to_string(device_comm->rank()) + " of " +
                                std::to_string(device_comm->size()) + ", the communicator rank " +
                                std::to_string(comm.rank()) + " of " + std::to_string(comm.size()) +
                                " (they must list the same ranks in the same order)");
  }
  TL_ASSIGN_OR_RETURN(device, OpenDevice(dev.first, dev.second));
  return Status::Ok();
}

}  // namespace

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
  // kNotLoaded or kPerRankRead; whether it was handed out.
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
    if (!loc) return NotFoundError(Quoted(name) + " is not in the checkpoint");
    const uint32_t t = position[loc->shard][loc->index];
    if (group_of[t] == kNotLoaded) {
      return NotFoundError(Quoted(name) + " was not loaded (filtered out, or needed by no rank)");
    }
    return t;
  }
  const TensorInfo& Info(uint32_t t) const { return ckpt->info(ckpt->tensors()[t]); }
  bool PerRankRead(uint32_t t) const { return group_of[t] == kPerRankRead; }
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
    return InvalidArgumentError(Quoted(Info(t).name) + ": rank " + std::to_string(g.reader) +
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

namespace {

// Rank r's rows [Lo(r), Hi(r)) of a dimension of `size` rows (ShardRange,
// assign.h); `block` is the first rank's, which every other rank's fits in.
struct Rows {
  uint64_t size = 0;
  int world = 1;
  uint64_t block = 0;
  IndexRange Of(int r) const {
    // size and world were checked (a tensor's dim, a communicator's size).
    return ShardRange(static_cast<int64_t>(size), r, world).value();
  }
  uint64_t Lo(int r) const { return static_cast<uint64_t>(Of(r).start); }
  uint64_t Hi(int r) const { return static_cast<uint64_t>(Of(r).start + Of(r).length); }
};

// The geometry of slicing a tensor along `dim`: outer x size x unit bytes.
struct SliceGeometry {
  uint64_t outer = 1;  // Product of the dims before dim.
  uint64_t unit = 0;   // Bytes of one index of dim (the dims after it).
  Rows rows;
};

Result<SliceGeometry> Geometry(const TensorInfo& info, int dim, int world) {
  const int ndim = static_cast<int>(info.shape.size());
  if (dim < -1 || dim >= ndim) {
    return InvalidArgumentError(Quoted(info.name) + ": cannot shard along dim " +
                                std::to_string(dim) + " of a tensor of " + std::to_string(ndim) +
                                " dims (dims are -1 for the whole tensor, or 0.." +
                                std::to_string(ndim - 1) + ")");
  }
  SliceGeometry g;
  g.rows.size = info.shape[dim];
  g.rows.world = world;
  g.rows.block = static_cast<uint64_t>(g.rows.Of(0).length);
  if (info.num_elements == 0) return g;  // Every slice is empty: no bytes.
  for (int d = 0; d < dim; ++d) g.outer *= info.shape[d];
  uint64_t inner = 1;
  for (int d = dim + 1; d < ndim; ++d) inner *= info.shape[d];
  // inner <= num_elements, whose bits fit (the file holds them).
  const uint64_t bits = inner * static_cast<uint64_t>(DtypeBits(info.dtype));
  if (bits % 8 != 0) {
    return InvalidArgumentError(Quoted(info.name) + ": slices along dim " + std::to_string(dim) +
                                " of " + std::string(DtypeName(info.dtype)) +
                                " would not start on a byte (" + std::to_string(bits) +
                                " bits per index)");
  }
  g.unit = bits / 8;
  return g;
}

// Reads `bytes` bytes at `offset` within tensor `info`'s data from `shard`'s
// file into dst, checking the file is still the one whose header was read.
Status ReadFromFile(const Checkpoint::Shard& shard, const TensorInfo& info, uint64_t offset,
                    std::byte* dst, uint64_t bytes) {
  auto read = [&]() -> Status {
    TL_ASSIGN_OR_RETURN(PosixFile file, PosixFile::OpenForRead(shard.path));
    TL_ASSIGN_OR_RETURN(const FileIdentity id, file.Identity());
    if (!(id == shard.identity)) {
      return IOError("the file changed since its header was read (size " +
                     std::to_string(shard.identity.size) + " -> " + std::to_string(id.size) + ")");
    }
    Status st =
        ReadExactlyAt(file.fd(), shard.header.data_offset() + info.begin + offset, dst, bytes);
    if (!st.ok()) {
      return st.WithContext(Quoted(info.name) + " bytes [" + std::to_string(offset) + ", " +
                            std::to_string(offset + bytes) + ")");
    }
    return Status::Ok();
  };
  Status st = read();
  return st.ok() ? st : st.WithContext(shard.path);
}

// An owned tensor with `name`'s dtype and shape (shape[dim] = extent).
HostTensor Describe(const TensorInfo& info, int dim, uint64_t extent) {
  HostTensor out;
  out.name = info.name;
  out.dtype = info.dtype;
  out.shape = info.shape;
  if (dim >= 0) out.shape[dim] = extent;
  return out;
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

Result<DistributedCheckpoint::State::Placed> DistributedCheckpoint::State::Whole(
    std::string_view name) {
  TL_ASSIGN_OR_RETURN(const uint32_t t, Lookup(name));
  if (PerRankRead(t)) {
    Result<Placed> r = ReadPlaced(t, -1);
    TL_RETURN_IF_ERROR(comm->Agree(r.status()));
    return r;
  }
  TL_RETURN_IF_ERROR(CheckBuffer(t));
  const TensorInfo& info = Info(t);
  const int reader = GroupOf(t).reader;
  Placed out;
  out.t = Describe(info, -1, 0);
  Status local = AllocateFor(out, info.nbytes(), Quoted(name));
  if (local.ok() && comm->rank() == reader && out.t.nbytes > 0) {
    const std::byte* src = Source(t);
    local = src == nullptr ? InternalError(Quoted(name) + " is missing from its reader's buffer")
                           : CopyWithin(out.data(), src, out.t.nbytes);
    if (local.ok()) local = Flush();
  }
  // Allocation is local: agree before moving data, so no rank is left waiting.
  TL_RETURN_IF_ERROR(comm->Agree(local));
  TL_RETURN_IF_ERROR(data_comm->Broadcast(out.data(), out.t.nbytes, reader));
  HandOut(t);
  return out;
}

Result<DistributedCheckpoint::State::Placed> DistributedCheckpoint::State::Sharded(
    std::string_view name, int dim) {
  if (dim == -1) return Whole(name);
  TL_ASSIGN_OR_RETURN(const uint32_t t, Lookup(name));
  const TensorInfo& info = Info(t);
  const int world = comm->size();
  const int me = comm->rank();
  TL_ASSIGN_OR_RETURN(const SliceGeometry g, Geometry(info, dim, world));
  if (PerRankRead(t)) {
    Result<Placed> r = ReadPlaced(t, dim);
    TL_RETURN_IF_ERROR(comm->Agree(r.status()));
    return r;
  }
  TL_RETURN_IF_ERROR(CheckBuffer(t));
  const int reader = GroupOf(t).reader;
  const uint64_t block_bytes = g.outer * g.rows.block * g.unit;
  const uint64_t lo = g.rows.Lo(me), hi = g.rows.Hi(me);
  Placed out;
  out.t = Describe(info, dim, hi - lo);
  // Every rank receives a whole (padded) block; the tensor is its first bytes.
  Status local = AllocateFor(out, block_bytes, Quoted(name) + "'s slice");
  out.t.nbytes = g.outer * (hi - lo) * g.unit;
  // The reader's send buffer: world padded blocks, or the tensor itself when
  // its rows split evenly along dim 0.
  Placed packed;
  const std::byte* send = nullptr;
  if (me == reader && local.ok() && block_bytes > 0) {
    const std::byte* src = Source(t);
    if (src == nullptr) {
      local = InternalError(Quoted(name) + " is missing from its reader's buffer");
    } else if (g.outer == 1 && g.rows.block * world == g.rows.size) {
      send = src;
    } else {
      local = AllocateFor(packed, block_bytes * world, Quoted(name) + "'s packed slices");
      for (int r = 0; r < world && local.ok(); ++r) {
        const uint64_t rlo = g.rows.Lo(r), len = (g.rows.Hi(r) - rlo) * g.unit;
        std::byte* dst = packed.data() + r * block_bytes;
        for (uint64_t o = 0; o < g.outer && len > 0 && local.ok(); ++o) {
          local = CopyWithin(dst + o * len, src + (o * g.rows.size + rlo) * g.unit, len);
        }
      }
      if (local.ok()) local = Flush();
      send = packed.data();
    }
  }
  TL_RETURN_IF_ERROR(comm->Agree(local));
  TL_RETURN_IF_ERROR(data_comm->Scatter(send, out.data(), block_bytes, reader));
  HandOut(t);
  return out;
}

Result<DistributedCheckpoint::State::Placed> DistributedCheckpoint::State::ReadPlaced(uint32_t t,
                                                                                      int dim) {
  Placed out;
  TL_ASSIGN_OR_RETURN(out.t, ReadSlice(t, dim));
  if (!device || out.t.nbytes == 0) return out;
  // A device load: up from the host copy.
  TL_ASSIGN_OR_RETURN(out.on_device, device->Allocate(out.t.nbytes));
  TL_RETURN_IF_ERROR(Stream());
  TL_RETURN_IF_ERROR(stream->CopyToDevice(out.on_device->data(), out.t.data.get(), out.t.nbytes));
  TL_RETURN_IF_ERROR(Flush());
  out.t.data.reset();
  return out;
}

Status DistributedCheckpoint::State::AllocateFor(Placed& p, uint64_t bytes, std::string_view what) {
  p.t.nbytes = bytes;
  if (bytes == 0) return Status::Ok();
  if (!device) {
    TL_ASSIGN_OR_RETURN(p.t.data, Allocate(bytes, what));
    return Status::Ok();
  }
  Result<std::shared_ptr<Buffer>> b = device->Allocate(bytes);
  if (!b.ok()) return b.status().WithContext(std::string(what) + " on " + device->name());
  p.on_device = std::move(b).value();
  return Status::Ok();
}

Status DistributedCheckpoint::State::Stream() {
  if (!stream) {
    TL_ASSIGN_OR_RETURN(stream, device->CreateStream());
  }
  return Status::Ok();
}

Status DistributedCheckpoint::State::CopyWithin(std::byte* dst, const std::byte* src,
                                                uint64_t bytes) {
  if (bytes == 0) return Status::Ok();
  if (!device) {
    std::memcpy(dst, src, bytes);
    return Status::Ok();
  }
  TL_RETURN_IF_ERROR(Stream());
  return stream->CopyOnDevice(dst, src, bytes);
}

Status DistributedCheckpoint::State::Flush() {
  return stream ? stream->Synchronize() : Status::Ok();
}

Status DistributedCheckpoint::State::Require(bool on_device, const char* what) const {
  if (on_device == (device != nullptr)) return Status::Ok();
  if (on_device) {
    return InvalidArgumentError(std::string(what) +
                                ": this checkpoint was loaded into host memory; use the host form "
                                "(GetTensor, GetSharded, GetShardedByRead)");
  }
  return InvalidArgumentError(std::string(what) + ": this checkpoint was loaded onto " +
                              device->name() +
                              "; use GetDeviceTensor, GetDeviceSharded or GetDeviceShardedByRead");
}

DeviceTensor DistributedCheckpoint::State::OnDevice(Placed&& p) const {
  DeviceTensor d;
  d.name = std::move(p.t.name);
  d.dtype = p.t.dtype;
  d.shape = std::move(p.t.shape);
  d.nbytes = p.t.nbytes;
  d.data = d.nbytes > 0 ? p.on_device->data() : nullptr;
  d.owner = std::move(p.on_device);
  d.device = device->kind();
  d.device_index = device->ordinal();
  d.on = device;
  return d;
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

Result<DistributedCheckpoint::State::Placed> DistributedCheckpoint::State::ByRead(
    std::string_view name) {
  TL_ASSIGN_OR_RETURN(const uint32_t t, Lookup(name));
  // Every rank counts the hand-out, whatever its read does, so that the
  // ranks' bookkeeping stays the same.
  HandOut(t);
  return ReadPlaced(t, 0);
}

Result<HostTensor> DistributedCheckpoint::State::ReadSlice(uint32_t t, int dim) {
  const TensorInfo& info = Info(t);
  const Checkpoint::Shard& shard = ckpt->shards()[ckpt->tensors()[t].shard];
  const int me = comm->rank();
  if (dim == -1) {
    HostTensor out = Describe(info, -1, 0);
    out.nbytes = info.nbytes();
    if (out.nbytes == 0) return out;
    TL_ASSIGN_OR_RETURN(out.data, Allocate(out.nbytes, Quoted(info.name)));
    TL_RETURN_IF_ERROR(ReadFromFile(shard, info, 0, out.data.get(), out.nbytes));
    direct_bytes += out.nbytes;
    return out;
  }
  TL_ASSIGN_OR_RETURN(const SliceGeometry g, Geometry(info, dim, comm->size()));
  const uint64_t lo = g.rows.Lo(me), hi = g.rows.Hi(me);
  HostTensor out = Describe(info, dim, hi - lo);
  out.nbytes = g.outer * (hi - lo) * g.unit;
  if (out.nbytes == 0) return out;
  TL_ASSIGN_OR_RETURN(out.data, Allocate(out.nbytes, Quoted(info.name) + "'s slice"));
  if (g.outer == 1) {  // Contiguous (dim 0, or leading dims of 1): just this rank's bytes.
    TL_RETURN_IF_ERROR(ReadFromFile(shard, info, lo * g.unit, out.data.get(), out.nbytes));
    direct_bytes += out.nbytes;
    return out;
  }
  // Strided: the whole tensor, then this rank's slice of each outer index.
  TL_ASSIGN_OR_RETURN(auto whole, Allocate(info.nbytes(), Quoted(info.name)));
  TL_RETURN_IF_ERROR(ReadFromFile(shard, info, 0, whole.get(), info.nbytes()));
  direct_bytes += info.nbytes();
  const uint64_t len = (hi - lo) * g.unit;
  for (uint64_t o = 0; o < g.outer; ++o) {
    std::memcpy(out.data.get() + o * len, whole.get() + (o * g.rows.size + lo) * g.unit, len);
  }
  return out;
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
  if (local.ok() && options.dtype.has_value()) {
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
