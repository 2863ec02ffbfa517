// PeerServer internals shared with peer_load.cc (become-a-seed).
#ifndef TENSORLIFT_REMOTE_SERVER_H_
#define TENSORLIFT_REMOTE_SERVER_H_

#include <memory>
#include <string_view>
#include <vector>

#include "remote/peer_access.h"
#include "tensorlift/remote.h"

namespace tensorlift::remote {

// Serves `loaded`, whose tensors[i] is the shard shards[i] of its full
// tensor (the shards of options.parallel under key.layout).
Result<std::unique_ptr<PeerServer>> ServeShards(std::shared_ptr<const LoadedCheckpoint> loaded,
                                                std::vector<ShardOf> shards, const PeerKey& key,
                                                const ServeOptions& options);

// "http://host:port" -> host, port. kInvalidArgument otherwise.
Status ParseHttpUrl(const std::string& url, std::string* host, int* port);

// The bytes of a caller's buffer (PeerServer::ServeBuffers, ShareTensors):
// its shape's elements times its dtype's size, checked. kInvalidArgument,
// starting with `what` ("serve", "share"), for a negative or overflowing
// shape, a size that is not whole bytes, or bytes without data.
Result<uint64_t> BufferBytes(const PeerServer::Tensor& t, std::string_view what);

}  // namespace tensorlift::remote

#endif  // TENSORLIFT_REMOTE_SERVER_H_
