// Where a peer load's tensors go (Wanted, PlaceWanted), the gets from each
// source rank (RankPlan, PlanRankGets) and the memory they land in
// (Landing). Private to remote/: used by the pull (peer_pull.h).
#ifndef TENSORLIFT_REMOTE_PEER_PLAN_H_
#define TENSORLIFT_REMOTE_PEER_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "device/device.h"
#include "format/tp_layout.h"
#include "remote/manifest.h"
#include "remote/ucx_transport.h"
#include "tensorlift/dtype.h"

namespace tensorlift::remote {

// One destination tensor.
struct Wanted {
  std::string name;
  Dtype dtype;
  std::vector<int64_t> full_shape;
  int dim = -1;
  IndexRange range;  // Along dim (dim >= 0).
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
  uint64_t offset = 0;  // In the destination buffer.
};

// The number of elements of a tensor of `shape`.
uint64_t Elements(const std::vector<int64_t>& shape);

// Gives each wanted tensor its offset in the destination buffer (64-byte
// aligned); returns the buffer's size.
Result<uint64_t> PlaceWanted(const std::string& url, std::vector<Wanted>* wanted);

// One source rank's gets: one per manifest chunk, straight into the
// destination where the whole chunk lands in one place, else into a staging
// chunk copied out once every chunk has checked out.
struct RankPlan {
  struct Chunk {
    const ManifestTensor* t;
    uint64_t index;
    std::byte* dst;
  };
  struct Staged {
    std::byte* dst_base;                 // The destination tensor's bytes.
    std::vector<CopyPiece> pieces;       // Source-shard offsets -> destination offsets.
    uint64_t chunk_begin;                // Source-shard offset of the chunk.
    std::unique_ptr<std::byte[]> bytes;  // The chunk.
    uint64_t size;
  };
  std::vector<UcxClient::Get> gets;
  std::vector<Chunk> chunks;  // chunks[i] is what gets[i] fetches.
  std::vector<Staged> staged;

  // A staging chunk of `size` bytes at source-shard offset `begin`, whose
  // `pieces` go to `dst_base`; returns where the get lands.
  Result<std::byte*> AddStaged(std::byte* dst_base, std::vector<CopyPiece> pieces, uint64_t begin,
                               uint64_t size) {
    Staged s;
    s.dst_base = dst_base;
    s.pieces = std::move(pieces);
    s.chunk_begin = begin;
    s.size = size;
    s.bytes.reset(new (std::nothrow) std::byte[s.size]);
    if (!s.bytes) return ResourceExhaustedError("peer load: no memory for a staging chunk");
    std::byte* into = s.bytes.get();
    staged.push_back(std::move(s));
    return into;
  }
};

// Plans the gets from one source rank (manifest `mf`) into the destination
// buffer at `base`; `sends_whole`: this rank also sends the unsplit tensors.
Status PlanRankGets(const Manifest& mf, const std::vector<Wanted>& wanted, bool sends_whole,
                    std::byte* base, RankPlan* plan);

// Where a pull lands: host memory, or straight in a device's memory (UCX
// writes it at `visible`: a GPU's device addresses, mapped as CUDA memory, or
// the host's mapping of the emulated device's memory). Device bytes are
// checked on staged copies in pinned host memory, once a source rank's gets
// have all landed (CheckStaged). A device whose memory UCX cannot write (a
// GPU with a UCX built without CUDA) is `bounced`: the gets land in two
// windows of pinned host memory, are checked there and copied up while the
// next window's gets run (host memory: the windows, not the checkpoint).
struct Landing {
  std::shared_ptr<Buffer> buffer;  // Owns the destination bytes.
  std::byte* visible = nullptr;    // Where UCX writes them (bounced: the plan's addresses).
  uint64_t size = 0;
  std::shared_ptr<Device> device;  // Null: host memory.
  UcxMemory memory = UcxMemory::kHost;
  std::unique_ptr<DeviceStream> stream;
  bool bounced = false;
  std::shared_ptr<Buffer> bounce;  // Pinned: two windows of half its size.

  // Whether `p` is in the device's memory (not host memory, nor a staging
  // chunk).
  bool OnDevice(const std::byte* p) const { return device && p >= visible && p < visible + size; }
  // The device address of `p` (a UCX-visible address in the buffer).
  std::byte* DeviceAddress(const std::byte* p) const { return buffer->data() + (p - visible); }
  // Copies host bytes to UCX-visible address `dst` in the buffer.
  Status Put(std::byte* dst, const std::byte* src, uint64_t n) {
    if (!device) {
      std::memcpy(dst, src, n);
      return Status::Ok();
    }
    return stream->CopyToDevice(DeviceAddress(dst), src, n);
  }
};

// Copies the staging chunks' bytes to their destinations.
Status CopyStaged(const std::vector<RankPlan::Staged>& staged, Landing& landing);

}  // namespace tensorlift::remote

#endif  // TENSORLIFT_REMOTE_PEER_PLAN_H_
