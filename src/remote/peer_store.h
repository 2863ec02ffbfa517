// A pull from a group of source ranks as a checkpoint store (private to
// remote/): the destination's tensors (Wanted, this rank's slices) laid out
// one after another as one safetensors file that exists only here, whose
// bytes the store gets from the source ranks that hold them, every chunk
// checked against its manifest before the loader is told it landed. The
// loader reads it as any store's file (host memory, the GPU pipeline,
// on_tensor, progress); onto a device whose memory UCX can write, the store's
// DirectReader lands the gets there, each chunk checked on a staged copy.
// docs/remote.md, "Pulling".
#ifndef TENSORLIFT_REMOTE_PEER_STORE_H_
#define TENSORLIFT_REMOTE_PEER_STORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "format/tp_layout.h"
#include "remote/manifest.h"
#include "remote/peer_session.h"
#include "remote/ucx_transport.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/remote.h"

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
};

// The number of elements of a tensor of `shape`.
uint64_t Elements(const std::vector<int64_t>& shape);

// The pull's file (PeerStore::kPath): `wanted` one after another in name
// order, as a safetensors header and the file's size; each tensor's offset in
// the data section. `url` names the source in errors.
struct PullFile {
  std::string header;  // Its length and JSON.
  uint64_t size = 0;
  std::vector<uint64_t> begins;
};
Result<PullFile> MakePullFile(const std::vector<Wanted>& wanted, const std::string& url);
// The pull's file opened through a store that only opens it (its reads are
// another store's: Checkpoint::WithStore), e.g. a relaying pull's
// (sources/relay.h).
Result<Checkpoint> OpenPullFile(const std::vector<Wanted>& wanted, const std::string& url);

struct FetchTarget;  // Where a fetch's gets land (peer_store.cc).

class PeerStore final : public CheckpointStore {
 public:
  // The file's name (Checkpoint::Open's path).
  static constexpr const char* kPath = "peer-pull.safetensors";

  struct Options {
    UcxClient::GetOptions get;  // on_done and cancelled are the store's.
    int parallel_rank = 0;      // The destination's rank (who sends whole tensors).
    int fault_threads = 0;      // LoadOptions::fault_threads, for device memory the host maps.
  };

  // `wanted` in name order; `sources` by rank (open sessions, whose
  // manifests the puller checked; connected before the reads of a rank that
  // Uses()), counting in each what it got (pulled, staged).
  static Result<std::shared_ptr<PeerStore>> Make(std::vector<Wanted> wanted,
                                                 std::vector<PeerSession>* sources,
                                                 const Options& options);
  // Whether source rank r holds any byte the destination wants.
  bool Uses(int r) const;

  Result<bool> IsDirectory(const std::string& path) override;
  Result<std::vector<Entry>> List(const std::string& path) override;
  Result<std::string> ReadSmall(const std::string& path, uint64_t limit) override;
  Result<Header> ReadHeader(const std::string& path, FileIdentity* identity) override;
  Status ReadRanges(std::span<const Range> ranges,
                    const std::function<void(size_t range, uint64_t bytes)>& landed) override;
  std::string Describe(const std::string& path) const override;
  // Onto `device` when UCX can write its memory (a GPU's with a CUDA build
  // of UCX, the emulated device's through its host mapping); Unavailable
  // otherwise (the pipeline's pinned staging then).
  Result<std::unique_ptr<DirectReader>> MakeDirectReader(const std::shared_ptr<Device>& device,
                                                         size_t files) override;

  const std::vector<Wanted>& wanted() const { return wanted_; }
  // The source rank whose fetch failed last ("" while none did).
  std::string failed_url() {
    std::lock_guard<std::mutex> lock(mu_);
    return failed_url_;
  }

 private:
  class Direct;
  // What rank r gives of one wanted tensor: its entry and the pieces (rank
  // r's bytes -> the slice's), increasing.
  struct Part {
    const ManifestTensor* tensor = nullptr;
    std::vector<CopyPiece> pieces;
  };
  // Bytes of a source tensor for a place in memory (host, or a device's as
  // UCX sees it), counted for range `range` once checked.
  struct Seg {
    uint64_t src = 0;
    uint64_t bytes = 0;
    std::byte* dst = nullptr;
    size_t range = 0;
  };
  PeerStore() = default;
  // The segments of data-section bytes [begin, begin + bytes) landing at
  // `dst`, per rank and source tensor.
  void Map(uint64_t begin, uint64_t bytes, std::byte* dst, size_t range,
           std::vector<std::vector<std::vector<Seg>>>* segs) const;
  // Gets the segments, every chunk checked; `landed(range, n)` once checked.
  // `lock` holds mu_; a device target's checks run with it released (the
  // next read's gets go on beside them), so the target is the caller's alone.
  Status Fetch(std::vector<std::vector<std::vector<Seg>>>& segs, FetchTarget& target,
               const std::function<void(size_t range, uint64_t bytes)>& landed,
               std::unique_lock<std::mutex>& lock);
  // Maps the memory `ranges` land in for each source's UCX client (their
  // span, once; the loader's arena for a host load, a staging slot).
  void MapDestinations(std::span<const Range> ranges);
  // Source rank r's part of a Fetch.
  Status FetchFrom(PeerSession& src, size_t r, std::vector<std::vector<std::vector<Seg>>>& segs,
                   FetchTarget& target,
                   const std::function<void(size_t range, uint64_t bytes)>& done,
                   std::unique_lock<std::mutex>& lock);

  std::vector<Wanted> wanted_;
  std::vector<uint64_t> begin_;           // Of each wanted tensor in the data section.
  std::vector<std::vector<Part>> parts_;  // [wanted][rank].
  std::vector<PeerSession>* sources_ = nullptr;
  Options options_;
  std::string header_;  // The file's first bytes (length and JSON).
  uint64_t file_size_ = 0;
  std::mutex mu_;  // One fetch at a time (the clients are serialized).
  std::string failed_url_;
  std::vector<std::pair<uintptr_t, uintptr_t>> mapped_;  // Host spans mapped for UCX.
  // Staged chunks (checked) that a read got whole for part of them, kept
  // until the reads of their other parts: by (rank, tensor, chunk), the
  // bytes and how many of them are still to deliver.
  struct Kept {
    std::shared_ptr<std::byte[]> bytes;
    uint64_t needed = 0;
  };
  std::map<std::tuple<size_t, const ManifestTensor*, uint64_t>, Kept> partial_;
};

}  // namespace tensorlift::remote

#endif  // TENSORLIFT_REMOTE_PEER_STORE_H_
