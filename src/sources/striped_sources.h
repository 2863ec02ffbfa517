// The sources of a striped load (private to sources/): the local files, a
// bucket and running peers, each filling pieces (striped_plan.h) into place.
// A source's Fetch may be called from its `workers` threads at once; the
// striped store (striped_store.h) guards the rest of its state with its own
// mutex.
#ifndef TENSORLIFT_SOURCES_STRIPED_SOURCES_H_
#define TENSORLIFT_SOURCES_STRIPED_SOURCES_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/posix_file.h"
#include "io/read_op.h"
#include "objstore/s3_client.h"
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
  // Its entry for a tensor of the layout; null: not served as the headers say.
  const remote::ManifestTensor* served(const LaidOut& t) const;

  Status Fetch(const std::vector<const Piece*>& pieces) override;

 private:
  using Source::Source;
  std::unique_ptr<remote::PeerSession> session_;
  remote::UcxClient::GetOptions get_;
  std::map<const LaidOut*, const remote::ManifestTensor*> served_;
};

}  // namespace tensorlift::sources

#endif  // TENSORLIFT_SOURCES_STRIPED_SOURCES_H_
