// Byte ranges of a running peer's tensors, read one-sided into local host
// memory: the peer source of a striped load (sources/striped_load.cc), which
// checks what lands itself. LoadFromPeer (remote.h) is the whole-load path.
//
// Thread safety: a PeerReader is used by one thread at a time.
#ifndef TENSORLIFT_REMOTE_PEER_READER_H_
#define TENSORLIFT_REMOTE_PEER_READER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "remote/manifest.h"
#include "tensorlift/remote.h"
#include "tensorlift/status.h"

namespace tensorlift::remote {

struct PeerReaderOptions {
  std::string token;  // As PeerLoadOptions::token.
  int request_timeout_ms = 5000;
  int connect_timeout_ms = 5000;
  int stall_timeout_ms = 10000;
  uint64_t min_rate = 1000000;        // As PeerLoadOptions::min_rate.
  uint64_t batch_bytes = 8ull << 20;  // The largest single get.
  int max_in_flight = 16;
  std::string transports;  // UCX_TLS syntax; empty: UCX's defaults.
};

// The endpoints to try for `key`: `peers`, then the live seeds the etcd
// `registry` lists for it (when not empty), each once. What could not be
// asked is added to `failures` (one line each).
std::vector<std::string> PeerUrlsFor(const PeerKey& key, const std::vector<std::string>& peers,
                                     const std::string& registry, int timeout_ms,
                                     std::vector<std::string>* failures);

class PeerReader {
 public:
  // Opens a session with the peer at `url`: its key must equal `key`, and it
  // must serve every tensor whole (a source of tensor-parallel size 1;
  // kUnimplemented otherwise). Then connects its data plane.
  static Result<std::unique_ptr<PeerReader>> Open(const std::string& url, const PeerKey& key,
                                                  const PeerReaderOptions& options);
  // Closes the data plane, then the session (reporting the bytes read).
  ~PeerReader();
  PeerReader(const PeerReader&) = delete;
  PeerReader& operator=(const PeerReader&) = delete;

  const std::string& url() const;
  // The peer's manifest: its tensors, with their chunks' XXH3s.
  const Manifest& manifest() const;
  // Registers local host memory that reads land in (zero-copy gets).
  Status MapLocal(void* data, uint64_t bytes);

  struct Piece {
    const ManifestTensor* tensor = nullptr;  // From manifest().
    uint64_t offset = 0;                     // In the tensor's bytes.
    uint64_t bytes = 0;
    void* dst = nullptr;
  };
  // Reads every piece (bounds-checked against its tensor first: kOutOfRange);
  // kUnavailable when the peer goes away or stalls. No read writes to a dst
  // after this returns. The bytes are not checked here.
  Status Read(const std::vector<Piece>& pieces);
  uint64_t bytes_read() const;

 private:
  struct State;
  explicit PeerReader(std::unique_ptr<State> state);
  std::unique_ptr<State> s_;
};

}  // namespace tensorlift::remote

#endif  // TENSORLIFT_REMOTE_PEER_READER_H_
