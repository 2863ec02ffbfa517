#include <algorithm>
#include <cstring>
#include <new>
#include <string>
#include <utility>

#include "common/posix_file.h"
#include "io/read_op.h"
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

}  // namespace

struct DistributedCheckpoint::State {
  // Buffers of the pieces one rank read from one file.
  struct Group {
    int reader = 0;
    uint32_t shard = 0;
    uint32_t remaining = 0;  // Needed tensors not yet handed out.
    bool dropped = false;
  };
  const Checkpoint* ckpt = nullptr;
  Communicator* comm = nullptr;
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

Result<HostTensor> DistributedCheckpoint::GetTensor(std::string_view name) {
  State& s = *state_;
  TL_ASSIGN_OR_RETURN(const uint32_t t, s.Lookup(name));
  if (s.PerRankRead(t)) {
    Result<HostTensor> r = s.ReadSlice(t, -1);
    TL_RETURN_IF_ERROR(s.comm->Agree(r.status()));
    return r;
  }
  TL_RETURN_IF_ERROR(s.CheckBuffer(t));
  const TensorInfo& info = s.Info(t);
  const int reader = s.GroupOf(t).reader;
  HostTensor out = Describe(info, -1, 0);
  out.nbytes = info.nbytes();
  Status local = Status::Ok();
  auto buf = Allocate(out.nbytes, Quoted(name));
  if (buf.ok()) {
    out.data = std::move(buf).value();
    if (s.comm->rank() == reader && out.nbytes > 0) {
      const std::byte* src = s.Source(t);
      if (src == nullptr) {
        local = InternalError(Quoted(name) + " is missing from its reader's buffer");
      } else {
        std::memcpy(out.data.get(), src, out.nbytes);
      }
    }
  } else {
    local = buf.status();
  }
  // Allocation is local: agree before moving data, so no rank is left waiting.
  TL_RETURN_IF_ERROR(s.comm->Agree(local));
  TL_RETURN_IF_ERROR(s.comm->Broadcast(out.data.get(), out.nbytes, reader));
  s.HandOut(t);
  return out;
}

Result<HostTensor> DistributedCheckpoint::GetSharded(std::string_view name, int dim) {
  if (dim == -1) return GetTensor(name);
  State& s = *state_;
  TL_ASSIGN_OR_RETURN(const uint32_t t, s.Lookup(name));
  const TensorInfo& info = s.Info(t);
  const int world = s.comm->size();
  const int me = s.comm->rank();
  TL_ASSIGN_OR_RETURN(const SliceGeometry g, Geometry(info, dim, world));
  if (s.PerRankRead(t)) {
    Result<HostTensor> r = s.ReadSlice(t, dim);
    TL_RETURN_IF_ERROR(s.comm->Agree(r.status()));
    return r;
  }
  TL_RETURN_IF_ERROR(s.CheckBuffer(t));
  const int reader = s.GroupOf(t).reader;
  const uint64_t block_bytes = g.outer * g.rows.block * g.unit;
  const uint64_t lo = g.rows.Lo(me), hi = g.rows.Hi(me);
  HostTensor out = Describe(info, dim, hi - lo);
  out.nbytes = g.outer * (hi - lo) * g.unit;

  Status local = Status::Ok();
  auto recv = Allocate(block_bytes, Quoted(name) + "'s slice");
  if (recv.ok()) {
    out.data = std::move(recv).value();
  } else {
    local = recv.status();
  }
  // The reader's send buffer: world padded blocks, or the tensor itself when
  // its rows split evenly along dim 0.
  std::unique_ptr<std::byte[]> packed;
  const std::byte* send = nullptr;
  if (me == reader && local.ok() && block_bytes > 0) {
    const std::byte* src = s.Source(t);
    if (src == nullptr) {
      local = InternalError(Quoted(name) + " is missing from its reader's buffer");
    } else if (g.outer == 1 && g.rows.block * world == g.rows.size) {
      send = src;
    } else {
      auto p = Allocate(block_bytes * world, Quoted(name) + "'s packed slices");
      if (p.ok()) {
        packed = std::move(p).value();
        for (int r = 0; r < world; ++r) {
          const uint64_t rlo = g.rows.Lo(r), len = (g.rows.Hi(r) - rlo) * g.unit;
          std::byte* dst = packed.get() + r * block_bytes;
          for (uint64_t o = 0; o < g.outer && len > 0; ++o) {
            std::memcpy(dst + o * len, src + (o * g.rows.size + rlo) * g.unit, len);
          }
        }
        send = packed.get();
      } else {
        local = p.status();
      }
    }
  }
  TL_RETURN_IF_ERROR(s.comm->Agree(local));
  TL_RETURN_IF_ERROR(s.comm->Scatter(send, out.data.get(), block_bytes, reader));
  packed.reset();
  s.HandOut(t);
  return out;
}

Result<HostTensor> DistributedCheckpoint::GetShardedByRead(std::string_view name) {
  State& s = *state_;
  TL_ASSIGN_OR_RETURN(const uint32_t t, s.Lookup(name));
  // Every rank counts the hand-out, whatever its read does, so that the
  // ranks' bookkeeping stays the same.
  s.HandOut(t);
  return s.ReadSlice(t, 0);
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
  Status local = Status::Ok();
  if (options.device != "cpu") {
    local = InvalidArgumentError(
        "LoadDistributed loads into host memory only (device \"cpu\"), not \"" + options.device +
        "\"");
  } else if (options.dtype.has_value()) {
    local = InvalidArgumentError("LoadDistributed does not convert dtypes (LoadOptions::dtype)");
  } else if (options.on_tensor) {
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
