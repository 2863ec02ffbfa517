// The sources of a striped load (private to sources/): the local files, a
// bucket and running peers, each filling pieces (striped_plan.h) into place.
// A source's Fetch may be called from its `workers` threads at once; the
// striped store (striped_store.h) guards the rest of its state with its own
// mutex.
#ifndef TENSORLIFT_SOURCES_STRIPED_SOURCES_H_
#define TENSORLIFT_SOURCES_STRIPED_SOURCES_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/posix_file.h"
#include "io/read_op.h"
#include "objstore/s3_client.h"
#include "remote/availability.h"
#include "remote/control.h"
#include "remote/peer_session.h"
#include "sources/striped_plan.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/objstore.h"
#include "tensorlift/status.h"
#include "tensorlift/striped.h"

namespace tensorlift::sources {

class Source {
 public:
  explicit Source(std::string name) { report.name = std::move(name); }
  virtual ~Source() = default;
  // Fills every piece; may be called from `workers` threads at once.
  virtual Status Fetch(const std::vector<const Piece*>& pieces) = 0;
  // Whether it holds `p`'s bytes now (a relay: the chunks it has received);
  // called under the store's mutex, so it must not block.
  virtual bool Holds(const Piece& /*p*/) const { return true; }
  // Set by the store: call when what it holds changed.
  std::function<void()> changed;
  int workers = 1;
  int take = 1;  // Pieces a worker takes together.
  // Guarded by the scheduler's mutex.
  bool dead = false;
  bool retired = false;         // Takes no more pieces (StripedStore::Retire).
  int fetching = 0;             // Batches its workers hold (taken, not landed).
  uint64_t fetching_bytes = 0;  // Their bytes.
  double active_s = 0;          // Seconds it has held a batch, ended spans.
  std::chrono::steady_clock::time_point active_since{};  // Start of the span now (fetching > 0).
  StripeSourceReport report;
  // Bytes per second it delivers while it holds batches, its workers
  // together (0: nothing landed yet). Not per worker: a source behind one
  // capped link gives no more with more workers.
  double Rate(std::chrono::steady_clock::time_point now) const {
    const double s =
        active_s + (fetching > 0 ? std::chrono::duration<double>(now - active_since).count() : 0);
    return report.bytes > 0 && s > 0 ? report.bytes / s : 0;
  }
};

// The local files of the checkpoint, as opened (each checked to be the file
// its header was read from), read by the loader's read engines: a fetch's
// pieces are one engine run (io_uring where the kernel has it, else one read
// after another on the worker's thread), so `workers` fetches keep workers x
// take pieces in flight; each worker's engine is made at Open.
// A piece's whole 4 KiB blocks are read with O_DIRECT when it lands at an
// address congruent to its file offset modulo 4 KiB (the loader places a
// striped store's tensors so), its unaligned ends through a bounce block
// (other pieces, and chunks fetched whole for parts of them: buffered):
// cold bytes come from the disk at its speed, without filling the page cache,
// as a disk load's do. Files on a filesystem without O_DIRECT (tmpfs) are
// read buffered.
class DiskSource final : public Source {
 public:
  static Result<std::unique_ptr<DiskSource>> Open(const Checkpoint& ckpt, int workers, int take);
  ~DiskSource() override;
  Status Fetch(const std::vector<const Piece*>& pieces) override;

 private:
  using Source::Source;
  Result<std::unique_ptr<ReadEngine>> MakeEngine() const;
  // An engine no fetch is using (made when there is none).
  Result<std::unique_ptr<ReadEngine>> TakeEngine();
  std::vector<PosixFile> files_;  // O_DIRECT where the filesystem has it.
  // Of each file opened O_DIRECT, for unaligned pieces (none: files_ is buffered).
  std::vector<PosixFile> buffered_;
  std::vector<std::string> paths_;
  std::mutex mu_;
  std::vector<std::unique_ptr<ReadEngine>> idle_;  // Guarded by mu_.
};

// The checkpoint's copy in a bucket: ranged GETs straight into place.
class ObjectSource final : public Source {
 public:
  // `shard_of[s]`: the bucket checkpoint's shard holding the local plan's shard s.
  static Result<std::unique_ptr<ObjectSource>> Open(const Checkpoint& bucket,
                                                    const std::vector<uint32_t>& shard_of,
                                                    const ObjectStoreOptions& store, int threads);
  Status Fetch(const std::vector<const Piece*>& pieces) override;

 private:
  using Source::Source;
  std::unique_ptr<objstore::S3Client> client_;
  std::vector<objstore::ObjectUrl> objects_;
};

// How a striped load dials a peer for whole tensors, from options that name a
// token, time-outs, a minimum rate and transports (StripeOptions,
// PeerLoadOptions).
template <typename Options>
remote::PeerSession::DialOptions WholeTensorDial(const Options& o) {
  remote::PeerSession::DialOptions d;
  d.token = o.token;
  d.request_timeout_ms = o.request_timeout_ms;
  d.connect_timeout_ms = o.connect_timeout_ms;
  d.min_rate = o.min_rate;
  d.transports = o.transports;
  d.whole_only = true;
  return d;
}

// A running peer serving the tensors whole (a session of its own,
// remote/peer_session.h): one-sided gets straight into place.
class PeerSource final : public Source {
 public:
  // Fails when the peer does not serve every tensor that `filter` passes as
  // the headers say (name, dtype, shape, whole). Pieces of a tensor it does
  // not serve so are a failed fetch.
  static Result<std::unique_ptr<PeerSource>> Open(std::unique_ptr<remote::PeerSession> session,
                                                  const Layout& layout, const TensorFilter& filter,
                                                  int take, remote::UcxClient::GetOptions get);
  const remote::Manifest& manifest() const { return session_->manifest; }
  // Its session's data plane is connected at its first fetch, with these
  // (for a session dialled without connecting: DialOptions::connect).
  void ConnectOnFirstFetch(std::string transports, int timeout_ms) {
    lazy_transports_ = std::move(transports);
    lazy_timeout_ms_ = timeout_ms;
  }
  // Its entry for a tensor of the layout; null: not served as the headers say.
  const remote::ManifestTensor* served(const LaidOut& t) const;

  Status Fetch(const std::vector<const Piece*>& pieces) override;

 private:
  using Source::Source;
  std::unique_ptr<remote::PeerSession> session_;
  remote::UcxClient::GetOptions get_;
  std::string lazy_transports_;
  int lazy_timeout_ms_ = 5000;
  std::map<const LaidOut*, const remote::ManifestTensor*> served_;
};

// A relay (a puller serving what it has received, docs/remote.md,
// "Relaying"): a peer source that holds only the chunks its GET /v1/have
// lists, which a thread of its own follows (a long poll). Once the map
// cannot be read (the relay is gone or cut off) it holds nothing and lost()
// says why.
class RelaySource final : public Source {
 public:
  // Each long poll of GET /v1/have waits this long at most for a change, so
  // a relay that does not answer within it and a margin (the control's
  // timeout, set by the caller) is lost: cut off, stalled, or gone.
  static constexpr int kHaveWaitMs = 500;
  // `session` is the relay's (its manifest the reference's chunks);
  // `control` its control endpoint (for GET /v1/have).
  static Result<std::unique_ptr<RelaySource>> Open(std::unique_ptr<remote::PeerSession> session,
                                                   remote::Control control, const Layout& layout,
                                                   const TensorFilter& filter, int take,
                                                   remote::UcxClient::GetOptions get);
  ~RelaySource() override;
  Status Fetch(const std::vector<const Piece*>& pieces) override { return peer_->Fetch(pieces); }
  bool Holds(const Piece& p) const override;
  std::string lost() const;
  // Chunks its map lists (as of its last answer; every chunk once complete).
  uint64_t held() const;
  void ConnectOnFirstFetch(std::string transports, int timeout_ms) {
    peer_->ConnectOnFirstFetch(std::move(transports), timeout_ms);
  }

 private:
  using Source::Source;
  void Follow();
  std::unique_ptr<PeerSource> peer_;
  std::unique_ptr<remote::Control> control_;
  std::vector<uint64_t> starts_;  // remote::ChunkStarts of its manifest.
  const remote::ManifestTensor* first_ = nullptr;
  mutable std::mutex mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  remote::HeldChunks held_;
  std::string lost_;
  std::thread follower_;
};

}  // namespace tensorlift::sources

#endif  // TENSORLIFT_SOURCES_STRIPED_SOURCES_H_
