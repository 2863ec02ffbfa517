// The hand-out of a multi-rank load's tensors (see distributed_state.h):
// GetTensor, GetSharded and GetShardedByRead on every rank, wherever the
// load went.
#include "ranks/distributed_state.h"

#include <cstring>
#include <new>
#include <string>
#include <utility>

#include "common/posix_file.h"
#include "io/pread.h"

namespace tensorlift {
namespace ranks {

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

}  // namespace ranks

using ranks::Allocate;
using ranks::kNotLoaded;
using ranks::kPerRankRead;
using ranks::Quoted;

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

}  // namespace tensorlift
