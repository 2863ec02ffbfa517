// The running peer server (PeerServerImpl, peer_server.cc): its memory
// registered with UCX, the manifest and its checksums, the control endpoint
// and its sessions, same-host handover, the registry entry. Private to
// remote/: server.cc turns checkpoints and buffers into what it serves.
#ifndef TENSORLIFT_REMOTE_PEER_SERVER_H_
#define TENSORLIFT_REMOTE_PEER_SERVER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "device/device.h"
#include "remote/peer_access.h"
#include "remote/ucx_transport.h"
#include "tensorlift/content.h"
#include "tensorlift/dtype.h"
#include "tensorlift/remote.h"

namespace tensorlift::remote {

class Availability;
struct Manifest;

// A tensor to serve.
struct Served {
  std::string name;
  Dtype dtype = Dtype::kU8;
  std::vector<int64_t> shape;
  std::byte* data = nullptr;  // A device address when `device` is set.
  uint64_t nbytes = 0;
  ShardOf shard;
  std::shared_ptr<Device> device;  // Null: host memory.
};

// Memory to register: [data, data + bytes) on `device` (null: host), which
// UCX maps at `map_at` (data, or the host's mapping of a device's memory:
// Buffer::host_mapping). `shared_fd`: sealed shared memory mapped at data
// from its offset 0 (HostBuffer::shared_fd), which same-host clients may be
// handed; -1 otherwise.
struct Span {
  std::byte* data = nullptr;
  uint64_t bytes = 0;
  std::shared_ptr<Device> device;
  std::byte* map_at = nullptr;
  int shared_fd = -1;
  const Buffer* buffer = nullptr;  // A device allocation, whole: exportable for handover.
};

// How UCX must map memory of `device`: the emulated device's memory is host
// memory; a GPU's is CUDA memory.
UcxMemory MemoryOf(const Device* device);

// A relay (docs/remote.md, "Relaying"): a server of memory that a pull is
// still filling. Its chunk size, checksums and content root are the
// reference's (the root seed's manifest: every tensor served must be its
// whole tensor), GET /v1/have lists the chunks `have` holds, and its registry
// entry is partial (SeedInfo::partial) until UpdateRelayEntry finds every
// chunk held. No handover: the memory is still written.
struct RelayOf {
  const Manifest* reference = nullptr;
  std::shared_ptr<Availability> have;
};

// Starts serving `tensors` (names unique) from `regions` (none: the tensors'
// own ranges, merged where they touch), keeping `keep_alive` until the server
// is destroyed. `known`: the tensors' content identity when their load
// computed it (may be null). Every server answers GET /v1/have; a whole
// seed's map holds every chunk.
Result<std::unique_ptr<PeerServer>> StartPeerServer(const PeerKey& key, const ServeOptions& options,
                                                    std::vector<Served> tensors,
                                                    std::vector<Span> regions,
                                                    std::shared_ptr<const void> keep_alive,
                                                    const ContentIdentity* known = nullptr,
                                                    const RelayOf* relay = nullptr);

// A relay's registry entry rewritten with its progress (whole once it holds
// every chunk) and whether it fell behind its parent (SeedInfo::behind). OK
// for a server without a registry.
Status UpdateRelayEntry(PeerServer& server, bool behind = false);

}  // namespace tensorlift::remote

#endif  // TENSORLIFT_REMOTE_PEER_SERVER_H_
