// LoadFromPeer without relaying (peer_load.cc), for the public entry points
// (sources/peer_entry.cc), which relay first where they can
// (sources/relay.h). Private to the library.
#ifndef TENSORLIFT_REMOTE_PEER_LOAD_H_
#define TENSORLIFT_REMOTE_PEER_LOAD_H_

#include <vector>

#include "remote/peer_access.h"
#include "tensorlift/remote.h"

namespace tensorlift::remote {

// The load from the first group of sources that works, else from the
// fallback; each tensor's shard (for become-a-seed).
Result<LoadedCheckpoint> LoadFromPeerWithShards(const PeerKey& key, const PeerLoadOptions& options,
                                                PeerLoadReport* report,
                                                std::vector<ShardOf>* shards);
// LoadFromPeerWithShards, then (become_seed) serving it.
Result<PeerLoad> PullAndSeed(const PeerKey& key, const PeerLoadOptions& options);
// What a seed made of a pull serves with: options.seed, with the registry,
// token and transports of the pull where it names none, at the pull's rank.
ServeOptions SeedOptions(const PeerLoadOptions& options);

}  // namespace tensorlift::remote

#endif  // TENSORLIFT_REMOTE_PEER_LOAD_H_
