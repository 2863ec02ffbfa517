// Same-host handover (docs/remote.md, "Same-host handover"): a seed whose
// tensors are in sealed shared memory (HostBuffer::Seal) passes the
// descriptors of its regions over an abstract Unix socket (SCM_RIGHTS) to a
// client on the same host, which maps them: no bytes are copied.
//
// Protocol (SOCK_SEQPACKET, one request and one answer per connection):
//   client -> seed  "TLHANDOVER1 <session id> <X-Tensorlift-Auth value or ->"
//   seed -> client  "OK <n>" then packets of one byte carrying up to 64
//                   descriptors each, n in all (region order); or "ERR <why>".
//                   Device memory (the manifest's handover "device"): "OK <n>"
//                   then n packets, one a region, each the text
//                   "D <bytes> <pid> <handle as hex, or ->" (Device::Export)
//                   with the region's descriptor, if it has one, attached.
// The seed hands over only for a session open on its control endpoint, and
// only to a process of its own user (or root), or, with a token, to one that
// signs the request (method HANDOVER, path /v1/handover/<session>).
//
// Thread safety: a HandoverServer serves from its own thread;
// ReceiveHandover may run concurrently.
#ifndef TENSORLIFT_REMOTE_HANDOVER_H_
#define TENSORLIFT_REMOTE_HANDOVER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "device/device.h"
#include "remote/manifest.h"
#include "tensorlift/loader.h"
#include "tensorlift/status.h"

namespace tensorlift::remote {

// This host, as handover knows it: the kernel's boot id (the same for every
// process of this boot, containers included), "" when it cannot be read.
std::string HandoverHostId();

class HandoverServer {
 public:
  // Listens on a new abstract Unix socket. `fds[i]` is region i's sealed
  // descriptor (borrowed: valid while the server lives); `session_open(id)`
  // says whether a control session `id` is open; `token` as
  // ServeOptions::token. With `device` (exported device memory, one per
  // region; borrowed likewise), each region goes as a device record, its
  // fd (-1: none) attached, and `fds` is ignored.
  static Result<std::unique_ptr<HandoverServer>> Start(
      std::vector<int> fds, std::string token, std::function<bool(const std::string&)> session_open,
      const std::vector<ExportedMemory>* device = nullptr);
  ~HandoverServer();
  HandoverServer(const HandoverServer&) = delete;
  HandoverServer& operator=(const HandoverServer&) = delete;

  // The socket's name as the manifest carries it ("@" + the abstract name).
  const std::string& socket() const { return socket_; }
  // Handovers made so far.
  uint64_t handed_over() const { return handed_over_; }

 private:
  HandoverServer() = default;
  void Loop();
  void Serve(int conn);

  std::vector<int> fds_;
  std::vector<std::string> records_;  // Device memory: one "D ..." record a region.
  std::string token_;
  std::function<bool(const std::string&)> session_open_;
  std::string socket_;
  int listen_fd_ = -1;
  int stop_fd_ = -1;  // An eventfd: written to stop the loop.
  std::thread thread_;
  std::atomic<uint64_t> handed_over_{0};
};

// The client's side: asks `socket` (a manifest's handover socket) for
// `regions` descriptors for `session`, signing with `token` when non-empty;
// each step bounded by `timeout_ms`. The descriptors are the caller's (close
// them); on any error none is left open. kUnavailable when the socket cannot
// be reached (another host, another network namespace), kPermissionDenied
// when the seed refuses, kCorruption when its answer is malformed.
Result<std::vector<int>> ReceiveHandover(const std::string& socket, const std::string& session,
                                         const std::string& token, int timeout_ms, size_t regions);

// Whether `socket` (a manifest's handover socket) can be reached from here:
// the seed is on this host and in this network namespace (a connection
// opened and closed, nothing asked).
bool HandoverReachable(const std::string& socket, int timeout_ms);

// ReceiveHandover for device memory: each region's exported allocation
// (device_id left empty), its descriptor owned by it. kCorruption for a
// malformed record (every field bounded).
Result<std::vector<ExportedMemory>> ReceiveDeviceHandover(const std::string& socket,
                                                          const std::string& session,
                                                          const std::string& token, int timeout_ms,
                                                          size_t regions);

// XXH3 of each `chunk_bytes` chunk of [data, data + nbytes) on `device`,
// computed on copies staged through the first `window` bytes of `staging`
// (pinned host memory; window a multiple of chunk_bytes) with `stream`.
Result<std::vector<uint64_t>> StagedChunkChecksums(const std::byte* data, uint64_t nbytes,
                                                   uint64_t chunk_bytes, DeviceStream& stream,
                                                   Buffer& staging, uint64_t window);

// A resident seed's announcement on this host (ServeOptions::resident): an
// abstract socket named after the key's digest and the seed's tensor-parallel
// position, which answers each connection with the seed's URL. Another seed
// of the same key and position already announced: kUnavailable (AlreadyUsed).
class LocalAnnouncement {
 public:
  static Result<std::unique_ptr<LocalAnnouncement>> Start(const std::string& digest, int rank,
                                                          int size, std::string url);
  ~LocalAnnouncement();
  LocalAnnouncement(const LocalAnnouncement&) = delete;
  LocalAnnouncement& operator=(const LocalAnnouncement&) = delete;
  const std::string& name() const { return name_; }

 private:
  LocalAnnouncement() = default;
  std::string name_, url_;
  int listen_fd_ = -1;
  int stop_fd_ = -1;
  std::thread thread_;
};

// The URL of the resident seed on this host for the key `digest` at
// position (rank, size); kNotFound when there is none.
Result<std::string> FindLocalSeed(const std::string& digest, int rank, int size, int timeout_ms);

// Whether `manifest` offers a handover this process can take: a socket, and
// the host this one is.
bool HandoverOffered(const Manifest& manifest);

struct TakeOptions {
  std::string token;
  int timeout_ms = 5000;
  bool copy_on_write = false;  // PeerLoadOptions::handover_copy_on_write.
  bool verify = false;         // PeerLoadOptions::handover_verify.
  // The destination (PeerLoadOptions::device); null: host memory. Device
  // memory is handed over only to the same device.
  std::shared_ptr<Device> device;
};

// Takes the handover `manifest` offers for `session` of the seed at `url`:
// maps each region's sealed shared memory (HostBuffer::MapShared) and returns
// the manifest's tensors, whole, as views of it (host memory; no byte
// copied). With `verify`, every chunk is checked against the manifest's
// checksums first (kCorruption naming the tensor and chunk otherwise). The
// mappings stay valid when the seed exits.
//
// Device memory (manifest.handover_device set): each region's allocation is
// imported into `options.device` (Device::Import: CUDA IPC, or the emulated
// device's memfd) and the tensors are views of it on that device, no byte
// copied; with `copy_on_write`, each region is copied once, device to
// device, into this process's own allocation and the seed's is let go at
// once. InvalidArgument when the destination is host memory or another
// device (the caller pulls instead). On a GPU (legacy CUDA IPC) the seed's
// memory must outlive the mapping: a seed that exits while a client maps it
// leaves that mapping undefined; the copy does not depend on it.
Result<LoadedCheckpoint> TakeHandover(const Manifest& manifest, const std::string& url,
                                      const std::string& session, const TakeOptions& options);

}  // namespace tensorlift::remote

#endif  // TENSORLIFT_REMOTE_HANDOVER_H_
