// LoadFromPeer's pull from one group of source ranks (Puller), private to
// remote/: the steps are defined in peer_check.cc (sessions, and what the
// sources serve checked against the key, each other and the fallback
// checkpoint) and peer_pull.cc (a handover, or the load of the pull's store,
// peer_store.h, and the result).
#ifndef TENSORLIFT_REMOTE_PEER_PULL_H_
#define TENSORLIFT_REMOTE_PEER_PULL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "device/device.h"
#include "format/tp_layout.h"
#include "load/checkpoint_builder.h"
#include "remote/control.h"
#include "remote/manifest.h"
#include "remote/peer_access.h"
#include "remote/peer_session.h"
#include "remote/peer_store.h"
#include "remote/ucx_transport.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/loader.h"
#include "tensorlift/remote.h"

namespace tensorlift::remote {

// A tensor as the fallback checkpoint's headers give it (what a disk load
// would hand out: sparse groups by their dense names).
struct Expected {
  std::string name;
  Dtype dtype;
  std::vector<int64_t> shape;
};

// Pulls a checkpoint from a group of source ranks (one endpoint per rank):
// one per LoadFromPeer, tried on group after group.
class Puller {
 public:
  // Reads the fallback checkpoint's tensors (FallbackTensors, peer_check.cc).
  Puller(const PeerKey& key, const PeerLoadOptions& options, std::shared_ptr<Device> device);

  // Pulls from `group` (one endpoint per source rank, index = rank). On
  // failure `failed_url` names the endpoint to blame (empty: the first).
  Result<LoadedCheckpoint> Pull(const std::vector<const Control*>& group,
                                const std::vector<const PeerInfo*>& infos,
                                std::vector<ShardOf>* shards, PeerLoadReport* report,
                                std::string* failed_url);

 private:
  // Opens a session on each source rank and checks its manifest: the key,
  // and the rank and size it says against the group's.
  Status OpenSessions(const std::vector<const Control*>& group,
                      const std::vector<const PeerInfo*>& infos, std::vector<PeerSession>* sources,
                      std::string* failed_url) const;

  // Whether the one source rank offers this host a handover of exactly the
  // tensors wanted, whole (PeerLoadOptions::handover).
  bool HandsOverWhole(const std::vector<PeerSession>& sources,
                      const std::vector<Wanted>& wanted) const;

  // The destination's tensors (rank 0's list), checked across the source
  // ranks; `failed_url` is set to the rank that disagrees.
  Result<std::vector<Wanted>> PlanWanted(const std::vector<const Control*>& group,
                                         const std::vector<PeerSession>& sources,
                                         const ParallelLayout& layout,
                                         std::string* failed_url) const;

  // A peer whose tensors (names, full shapes, and dtypes unless the key
  // converts them) are not the fallback checkpoint's serves another model
  // under this key: its checksums only say that its bytes are its own.
  Status MatchesFallback(const std::string& url, const std::vector<Wanted>& wanted) const;

  // Rank 0's tensor `t` as the destination wants it: split as the layout
  // says, every rank holding its part, and this rank's part of it.
  Result<Wanted> WantedFor(const ManifestTensor& t, const std::vector<const Control*>& group,
                           const std::vector<PeerSession>& sources, const ParallelLayout& layout,
                           std::string* failed_url) const;

  // Every source rank holds rank 0's tensor `t` (same dtype, full shape and
  // split dim) and, when it is split, its own part of it.
  static Status CheckRanksAgree(const ManifestTensor& t, const std::vector<const Control*>& group,
                                const std::vector<PeerSession>& sources, std::string* failed_url);

  // The load of the pull's file: the fallback's options but those that shape
  // the tensors (the key's), onto the destination.
  LoadOptions PullLoadOptions() const;

  // One file report per source rank: its endpoint, transports and bytes.
  void AddSourceReports(const std::vector<const Control*>& group,
                        const std::vector<PeerSession>& sources, bool direct,
                        CheckpointBuilder* out) const;

  const PeerKey& key_;
  const PeerLoadOptions& options_;
  std::shared_ptr<Device> device_;  // The destination's; null: host memory.
  // The fallback checkpoint's tensors, which a peer's must be (MatchesFallback).
  std::optional<std::vector<Expected>> expected_;
};

}  // namespace tensorlift::remote

#endif  // TENSORLIFT_REMOTE_PEER_PULL_H_
