// A striped load's store (private to sources/): a CheckpointStore whose reads
// are shared among several sources at once (the local files, a bucket,
// running peers). The loader runs its usual plan, host path or GPU pipeline
// over it; every read it issues is cut into pieces (striped_plan.h) that the
// sources' workers take from one queue, so a faster source takes more (work
// stealing); near the end a slow source leaves the queue to faster ones that
// would drain what is left of the load sooner. Each piece's chunks are checked where they land
// against the reference peer's manifest, whichever source fetched them; a
// source that fails or whose bytes do not match is dropped and its pieces go
// to the others. A read fails only when every source has.
//
// Thread safety: ReadRanges may be called from several threads at once (the
// GPU pipeline's readers); the sources' workers live as long as the store.
#ifndef TENSORLIFT_SOURCES_STRIPED_STORE_H_
#define TENSORLIFT_SOURCES_STRIPED_STORE_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "sources/striped_plan.h"
#include "sources/striped_sources.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/striped.h"

namespace tensorlift::sources {

class StripedStore final : public CheckpointStore {
 public:
  struct Options {
    uint64_t piece_bytes = 8ull << 20;  // The most bytes one piece holds.
    std::function<void(const std::string& source, uint64_t bytes)> on_range;
    // A read fails once nothing has landed for this long while no source
    // fetches its pieces (relays that stopped receiving) and none is retired
    // (retired ones alive take pieces again first); 0: it waits.
    std::chrono::milliseconds idle_timeout{0};
    // Called (under the store's lock: it must not block) once a checked chunk
    // of a tensor is whole in the loader's memory: a relay then serves it.
    std::function<void(const LaidOut& tensor, int64_t chunk)> on_chunk;
  };
  // `layout`'s tensors are checked against `reference`'s entries (set by the
  // caller) when layout.chunk_bytes is not 0. Starts every source's workers.
  StripedStore(Layout layout, std::vector<std::unique_ptr<Source>> sources, Options options);
  // Stops the workers (no read is in progress by then), then closes the sources.
  ~StripedStore() override;

  // The checkpoint was opened before (from the local copy or the bucket):
  // these refuse.
  Result<bool> IsDirectory(const std::string& path) override;
  Result<std::vector<Entry>> List(const std::string& path) override;
  Result<std::string> ReadSmall(const std::string& path, uint64_t limit) override;
  Result<Header> ReadHeader(const std::string& path, FileIdentity* identity) override;

  Status ReadRanges(std::span<const Range> ranges,
                    const std::function<void(size_t range, uint64_t bytes)>& landed) override;
  std::string Describe(const std::string& path) const override;
  bool WantsFileAlignment() const override { return true; }

  // A source joining while the reads go on (a relay found after the load
  // began): its workers start now. The store owns it; the pointer stays valid
  // as long as the store.
  Source* AddSource(std::unique_ptr<Source> source);
  // A source that takes no more pieces (those it holds still land): a relay's
  // parent replaced by a closer one.
  void Retire(Source* source);
  // A source found gone by other means than a fetch (a relay whose chunk map
  // can no longer be read): dead, with `why` in its report, as a failed fetch
  // leaves it.
  void Drop(Source* source, const std::string& why);
  // A retired source takes pieces again (the closer relay that replaced it
  // went away; or, by the store itself, a read idle for idle_timeout).
  void Unretire(Source* source);

  // A source's rate now (Source::Rate: bytes per second while it holds
  // pieces; 0 before any landed) and the bytes it has delivered.
  std::pair<double, uint64_t> Measured(const Source* source) const;

  // The layout the pieces point into (a source joining maps its tensors).
  const Layout& layout() const { return layout_; }

  // After the reads: each source's report, pieces fetched again after their
  // source failed, and pieces cut.
  std::vector<StripeSourceReport> SourceReports() const;
  uint64_t refetched() const;
  uint64_t pieces() const;

 private:
  struct Read;  // One ReadRanges call's pieces, and what has landed of them.
  struct Queued {
    Read* read;
    size_t piece;
  };
  using Clock = std::chrono::steady_clock;

  void Work(Source& src, size_t worker);
  // Under mu_: takes the pieces `src`'s next fetch gets (none: it stops).
  std::vector<Queued> Take(Source& src, size_t worker, std::unique_lock<std::mutex>& lock);
  // Under mu_: a piece from the queue for the first worker of each source
  // that has had none yet, dealt round-robin over the sources, so that every
  // source is used (and measured) from the start however fast the others are.
  void DealFirstBatches();
  // Under mu_: `ids` taken by a worker of `src` (its rate counts their time).
  void Hold(Source& src, const std::vector<Queued>& ids);
  // Under mu_: a batch `src` held has landed or failed.
  void Release(Source& src, const std::vector<Queued>& ids);
  void Landed(Source& src, const std::vector<Queued>& mine);
  void Failed(Source& src, const std::vector<Queued>& mine, const Status& why);
  // Under mu_: how many pieces a worker of `src` may take now (0: none).
  int MayTake(const Source& src) const;
  // Under mu_: whether `src` holds a queued piece.
  bool HoldsAny(const Source& src) const;
  // What a source holds changed: its workers look at the queue again.
  void Changed();
  void SetRetired(Source* source, bool retired);
  // A chunk fetched whole earlier for part of it: copies out what `p` needs.
  bool FromKept(Piece& p, Read& read);
  // Under mu_: `p`'s parts of its chunk are delivered; keeps the chunk
  // (fetched by `fetched_by`, null: it was already kept) while parts remain.
  void PartsDelivered(const Piece& p, const Source* fetched_by);
  // Under mu_: the chunk `p` fetched whole has landed: the pieces waiting
  // for it are served from it.
  void ServeWaiting(const Piece& p);
  // Under mu_: a read that ends takes its entries out of fetching_.
  void Forget(Read& read);
  std::string EveryFailure() const;

  const Layout layout_;
  std::vector<std::unique_ptr<Source>> sources_;
  const Options options_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // Workers: the queue or the sources changed.
  std::condition_variable read_cv_;  // Readers: bytes landed, or every source failed.
  std::deque<Queued> queue_;
  uint64_t queued_bytes_ = 0;  // Of the pieces in queue_.
  // Chunks fetched whole of which parts are still to be asked for, and the
  // source that fetched them; a chunk goes once all its parts are delivered
  // (delivered_: the bytes of each chunk delivered in parts so far, whichever
  // fetch of it delivered them), so what is kept is bounded by the reads in
  // flight, not by the load.
  struct Kept {
    std::shared_ptr<std::byte[]> bytes;
    size_t source = 0;
  };
  std::map<std::pair<const LaidOut*, int64_t>, Kept> kept_;
  std::map<std::pair<const LaidOut*, int64_t>, uint64_t> delivered_;
  // Chunks a read's piece is fetching whole (queued or in flight), and the
  // pieces of later reads that need parts of them: served from the chunk
  // once it lands, not fetched again (a GPU pipeline's blocks are read
  // several at once, and a chunk that two blocks share would be).
  struct Fetching {
    Read* read = nullptr;
    std::vector<Queued> waiting;
  };
  std::map<std::pair<const LaidOut*, int64_t>, Fetching> fetching_;
  int alive_ = 0;
  bool stop_ = false;
  bool started_ = false;
  Clock::time_point start_;
  uint64_t refetched_ = 0;
  uint64_t pieces_ = 0;
  uint64_t landed_bytes_ = 0;  // Delivered by every source so far.
  Clock::time_point last_landed_ = Clock::now();
  std::vector<std::thread> threads_;
  std::vector<Source*> worker_source_;      // Per worker.
  std::vector<std::vector<Queued>> first_;  // Per worker: its dealt batch.
  std::vector<bool> dealt_;                 // Per worker: it has had one (or is not dealt one).
};

}  // namespace tensorlift::sources

#endif  // TENSORLIFT_SOURCES_STRIPED_STORE_H_
