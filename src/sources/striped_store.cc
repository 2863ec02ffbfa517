// The striped store (striped_store.h).
#include "sources/striped_store.h"

#include <algorithm>
#include <cstring>

namespace tensorlift::sources {

struct StripedStore::Read {
  explicit Read(std::span<const Range> r) : ranges(r) {}
  std::span<const Range> ranges;
  std::vector<Run> runs;
  std::vector<Piece> pieces;
  size_t left = 0;                                  // Pieces not landed yet.
  size_t in_flight = 0;                             // Pieces a worker is fetching now.
  std::vector<std::pair<size_t, uint64_t>> landed;  // Not yet told the caller.
  // File bytes [file_offset, +bytes) of run `run` are in place.
  void Landed(uint64_t file_offset, uint64_t bytes, size_t run) {
    Attribute(runs[run], ranges, file_offset, bytes,
              [this](size_t range, uint64_t n) { landed.emplace_back(range, n); });
  }
};

StripedStore::StripedStore(Layout layout, std::vector<std::unique_ptr<Source>> sources,
                           Options options)
    : layout_(std::move(layout)), sources_(std::move(sources)), options_(std::move(options)) {
  alive_ = static_cast<int>(sources_.size());
  // Each source's workers in turn, so every source starts at once.
  int most = 0;
  for (auto& s : sources_) most = std::max(most, s->workers);
  for (int w = 0; w < most; ++w) {
    for (auto& s : sources_) {
      if (w < s->workers) worker_source_.push_back(s.get());
    }
  }
  first_.resize(worker_source_.size());
  // Dealt a first batch: each source's first worker (the first of the round-robin).
  dealt_.assign(worker_source_.size(), true);
  for (size_t k = 0; k < worker_source_.size() && k < sources_.size(); ++k) dealt_[k] = false;
  for (auto& s : sources_) s->changed = [this] { Changed(); };
  for (size_t k = 0; k < worker_source_.size(); ++k)
    threads_.emplace_back([this, k] { Work(*worker_source_[k], k); });
}

void StripedStore::Changed() {
  {
    // Taken so that a worker between its check and its wait sees the change.
    std::lock_guard<std::mutex> lock(mu_);
  }
  work_cv_.notify_all();
}

Source* StripedStore::AddSource(std::unique_ptr<Source> source) {
  std::lock_guard<std::mutex> lock(mu_);
  Source* src = source.get();
  src->changed = [this] { Changed(); };
  sources_.push_back(std::move(source));
  ++alive_;
  if (stop_) return src;
  for (int w = 0; w < src->workers; ++w) {
    const size_t k = worker_source_.size();
    worker_source_.push_back(src);
    first_.emplace_back();
    dealt_.push_back(w != 0);
    threads_.emplace_back([this, k, src] { Work(*src, k); });
  }
  DealFirstBatches();
  work_cv_.notify_all();
  return src;
}

void StripedStore::Drop(Source* source, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (source->dead) return;
    source->dead = true;
    source->report.failure = why;
    --alive_;
  }
  read_cv_.notify_all();
  work_cv_.notify_all();
}

void StripedStore::Retire(Source* source) { SetRetired(source, true); }
void StripedStore::Unretire(Source* source) { SetRetired(source, false); }

void StripedStore::SetRetired(Source* source, bool retired) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& s : sources_) {
      if (s.get() == source) s->retired = retired;
    }
  }
  work_cv_.notify_all();
}

StripedStore::~StripedStore() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : threads_) t.join();
  // Now, while the store is whole: a relay source's thread may be telling it
  // that what the relay holds changed.
  sources_.clear();
}

Result<bool> StripedStore::IsDirectory(const std::string& path) {
  return UnimplementedError(path + ": a striped store reads tensor bytes; it opens no checkpoint");
}
Result<std::vector<CheckpointStore::Entry>> StripedStore::List(const std::string& path) {
  return UnimplementedError(path + ": a striped store reads tensor bytes; it opens no checkpoint");
}
Result<std::string> StripedStore::ReadSmall(const std::string& path, uint64_t) {
  return UnimplementedError(path + ": a striped store reads tensor bytes; it opens no checkpoint");
}
Result<Header> StripedStore::ReadHeader(const std::string& path, FileIdentity*) {
  return UnimplementedError(path + ": a striped store reads tensor bytes; it opens no checkpoint");
}

std::string StripedStore::Describe(const std::string&) const {
  return "striped over " + std::to_string(sources_.size()) + " source(s)";
}

Status StripedStore::ReadRanges(std::span<const Range> ranges,
                                const std::function<void(size_t range, uint64_t bytes)>& landed) {
  Read read(ranges);
  TL_ASSIGN_OR_RETURN(Cut cut, CutPieces(layout_, ranges, options_.piece_bytes));
  read.runs = std::move(cut.runs);
  read.pieces = std::move(cut.pieces);
  if (landed) {
    for (size_t i = 0; i < cut.zeroed.size(); ++i) {
      if (cut.zeroed[i]) landed(i, cut.zeroed[i]);
    }
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (!started_) {
    started_ = true;
    start_ = Clock::now();
  }
  if (alive_ == 0) return UnavailableError("striped load: every source failed:" + EveryFailure());
  pieces_ += read.pieces.size();
  for (size_t i = 0; i < read.pieces.size(); ++i) {
    Piece& p = read.pieces[i];
    if (FromKept(p, read)) continue;
    if (p.whole) {
      auto [it, fresh] = fetching_.try_emplace({p.units[0].tensor, p.units[0].chunk});
      if (!fresh) {  // Another read's piece is fetching the chunk.
        it->second.waiting.push_back({&read, i});
        ++read.left;
        continue;
      }
      it->second.read = &read;
    }
    queue_.push_back({&read, i});
    queued_bytes_ += read.pieces[i].bytes;
    ++read.left;
  }
  DealFirstBatches();
  work_cv_.notify_all();
  for (;;) {
    auto ready = [&] {
      return !read.landed.empty() || read.left == 0 || (alive_ == 0 && read.in_flight == 0);
    };
    if (options_.idle_timeout.count() == 0) {
      read_cv_.wait(lock, ready);
    } else if (!read_cv_.wait_for(lock, options_.idle_timeout, ready) && read.in_flight == 0 &&
               Clock::now() - last_landed_ >= options_.idle_timeout) {
      // Nothing landed for idle_timeout and no source fetches this read's
      // pieces: none holds them (relays that stopped receiving). Retired
      // sources still alive take pieces again first (a relay's root seed,
      // while the chain above it went quiet).
      bool revived = false;
      for (auto& s : sources_) {
        if (s->retired && !s->dead) revived = true;
        if (!s->dead) s->retired = false;
      }
      if (revived) {
        last_landed_ = Clock::now();
        DealFirstBatches();
        work_cv_.notify_all();
        continue;
      }
      std::erase_if(queue_, [&](const Queued& q) { return q.read == &read; });
      Forget(read);
      return UnavailableError("striped load: no source holds the pieces left (nothing landed for " +
                              std::to_string(options_.idle_timeout.count()) +
                              " ms):" + EveryFailure());
    }
    std::vector<std::pair<size_t, uint64_t>> now;
    now.swap(read.landed);
    if (landed && !now.empty()) {
      lock.unlock();
      for (const auto& [range, bytes] : now) landed(range, bytes);
      lock.lock();
    }
    if (read.left == 0 && read.landed.empty()) return Status::Ok();
    if (alive_ == 0 && read.in_flight == 0) {
      // Its pieces still queued go (no worker takes them any more).
      std::erase_if(queue_, [&](const Queued& q) { return q.read == &read; });
      Forget(read);
      return UnavailableError("striped load: every source failed:" + EveryFailure());
    }
  }
}

bool StripedStore::FromKept(Piece& p, Read& read) {
  if (!p.whole) return false;
  auto it = kept_.find({p.units[0].tensor, p.units[0].chunk});
  if (it == kept_.end()) return false;
  Kept& k = it->second;
  uint64_t bytes = 0;
  for (const Delivery& d : p.deliveries) {
    std::memcpy(d.to, k.bytes.get() + d.from, d.bytes);
    read.Landed(p.file_offset + d.from, d.bytes, d.run);
    bytes += d.bytes;
  }
  sources_[k.source]->report.bytes += bytes;
  landed_bytes_ += bytes;
  PartsDelivered(p, nullptr);
  return true;
}

void StripedStore::PartsDelivered(const Piece& p, const Source* fetched_by) {
  const auto key = std::make_pair(p.units[0].tensor, p.units[0].chunk);
  uint64_t& done = delivered_[key];
  done += p.Delivers();
  if (done >= p.bytes) {  // Every part of the chunk has been asked for and delivered.
    delivered_.erase(key);
    kept_.erase(key);
    if (options_.on_chunk) options_.on_chunk(*key.first, key.second);
    return;
  }
  if (fetched_by == nullptr || kept_.count(key)) return;
  // The rest of the chunk, for a later read that asks for it.
  size_t source = 0;
  while (sources_[source].get() != fetched_by) ++source;
  kept_[key] = Kept{p.whole, source};
}

void StripedStore::ServeWaiting(const Piece& p) {
  auto it = fetching_.find({p.units[0].tensor, p.units[0].chunk});
  if (it == fetching_.end()) return;
  std::vector<Queued> waiting = std::move(it->second.waiting);
  fetching_.erase(it);
  for (const Queued& q : waiting) {
    // Kept while parts of it are still to be delivered (theirs are).
    if (FromKept(q.read->pieces[q.piece], *q.read)) {
      --q.read->left;
      continue;
    }
    queue_.push_back(q);  // (Not kept: fetched after all.)
    queued_bytes_ += q.read->pieces[q.piece].bytes;
  }
}

void StripedStore::Forget(Read& read) {
  for (auto it = fetching_.begin(); it != fetching_.end();) {
    std::erase_if(it->second.waiting, [&](const Queued& q) { return q.read == &read; });
    it = it->second.read == &read ? fetching_.erase(it) : std::next(it);
  }
}

void StripedStore::DealFirstBatches() {
  for (size_t k = 0; k < worker_source_.size() && !queue_.empty(); ++k) {
    Source& src = *worker_source_[k];
    if (dealt_[k] || src.dead || src.retired) continue;
    // One piece: the probe that measures the source (a slow source's batch of
    // `take` pieces could outlast the whole load); the first it holds.
    auto it = std::find_if(queue_.begin(), queue_.end(),
                           [&](const Queued& q) { return src.Holds(q.read->pieces[q.piece]); });
    if (it == queue_.end()) continue;  // Dealt once it holds one.
    dealt_[k] = true;
    const Queued q = *it;
    queue_.erase(it);
    queued_bytes_ -= q.read->pieces[q.piece].bytes;
    ++q.read->in_flight;
    first_[k].push_back(q);
    Hold(src, first_[k]);
  }
}

void StripedStore::Hold(Source& src, const std::vector<Queued>& ids) {
  if (ids.empty()) return;
  if (src.fetching++ == 0) src.active_since = Clock::now();
  for (const Queued& q : ids) src.fetching_bytes += q.read->pieces[q.piece].bytes;
}

void StripedStore::Release(Source& src, const std::vector<Queued>& ids) {
  if (ids.empty()) return;
  for (const Queued& q : ids) src.fetching_bytes -= q.read->pieces[q.piece].bytes;
  if (--src.fetching == 0)
    src.active_s += std::chrono::duration<double>(Clock::now() - src.active_since).count();
}

void StripedStore::Work(Source& src, size_t worker) {
  // This thread's first allocation maps its malloc arena: now, before any
  // read, not while the loader's fault threads hold the mmap lock.
  std::vector<const Piece*> pieces;
  pieces.reserve(static_cast<size_t>(src.take));
  for (;;) {
    std::vector<Queued> mine;
    {
      std::unique_lock<std::mutex> lock(mu_);
      mine = Take(src, worker, lock);
      if (mine.empty()) return;
    }
    pieces.clear();
    for (const Queued& q : mine) pieces.push_back(&q.read->pieces[q.piece]);
    Status st = src.Fetch(pieces);
    for (size_t k = 0; st.ok() && k < pieces.size(); ++k)
      st = CheckPiece(*pieces[k], src.report.name);
    // A chunk fetched whole: its parts copied out (the destinations are the read's).
    for (size_t k = 0; st.ok() && k < pieces.size(); ++k) {
      for (const Delivery& d : pieces[k]->deliveries)
        std::memcpy(d.to, pieces[k]->dst + d.from, d.bytes);
    }
    if (st.ok()) {
      Landed(src, mine);
    } else {
      Failed(src, mine, st);
      return;
    }
  }
}

std::vector<StripedStore::Queued> StripedStore::Take(Source& src, size_t worker,
                                                     std::unique_lock<std::mutex>& lock) {
  std::vector<Queued> ids;
  work_cv_.wait(lock, [&] {
    return stop_ || src.dead || !first_[worker].empty() ||
           (!queue_.empty() && MayTake(src) > 0 && HoldsAny(src));
  });
  if (stop_) return ids;  // No read is in progress: nothing was dealt.
  if (src.dead) {
    // A batch dealt to it goes back to the others.
    std::vector<Queued>& first = first_[worker];
    Release(src, first);
    for (auto it = first.rbegin(); it != first.rend(); ++it) {
      --it->read->in_flight;
      queue_.push_front(*it);
      queued_bytes_ += it->read->pieces[it->piece].bytes;
    }
    if (!first.empty()) {
      first.clear();
      read_cv_.notify_all();
      work_cv_.notify_all();
    }
    return ids;
  }
  if (!first_[worker].empty()) {
    ids.swap(first_[worker]);
    return ids;
  }
  const int want = MayTake(src);
  // The first pieces in the queue that the source holds (a relay holds only
  // what it has received).
  for (auto it = queue_.begin(); it != queue_.end() && static_cast<int>(ids.size()) < want;) {
    if (!src.Holds(it->read->pieces[it->piece])) {
      ++it;
      continue;
    }
    const Queued q = *it;
    it = queue_.erase(it);
    queued_bytes_ -= q.read->pieces[q.piece].bytes;
    ++q.read->in_flight;
    ids.push_back(q);
  }
  Hold(src, ids);
  return ids;
}

void StripedStore::Landed(Source& src, const std::vector<Queued>& mine) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t bytes = 0;
  for (const Queued& q : mine) {
    Piece& p = q.read->pieces[q.piece];
    if (p.deliveries.empty()) {
      q.read->Landed(p.file_offset, p.bytes, p.run);
      if (options_.on_chunk) {
        for (const Unit& u : p.units) {
          if (u.chunk >= 0) options_.on_chunk(*u.tensor, u.chunk);
        }
      }
    } else {
      for (const Delivery& d : p.deliveries) q.read->Landed(p.file_offset + d.from, d.bytes, d.run);
      PartsDelivered(p, &src);
      ServeWaiting(p);
    }
    bytes += p.Delivers();
    --q.read->in_flight;
    --q.read->left;
  }
  src.report.bytes += bytes;
  Release(src, mine);
  landed_bytes_ += bytes;
  last_landed_ = Clock::now();
  src.report.ranges += mine.size();
  src.report.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
  if (options_.on_range) options_.on_range(src.report.name, bytes);
  read_cv_.notify_all();
  // Rates changed: workers that left the queue to the others ask again.
  work_cv_.notify_all();
}

void StripedStore::Failed(Source& src, const std::vector<Queued>& mine, const Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  Release(src, mine);
  if (!src.dead) {
    src.dead = true;
    src.report.failure = why.message();
    --alive_;
  }
  // Back to the front: the others take them next.
  for (auto it = mine.rbegin(); it != mine.rend(); ++it) {
    --it->read->in_flight;
    queue_.push_front(*it);
    queued_bytes_ += it->read->pieces[it->piece].bytes;
  }
  refetched_ += mine.size();
  read_cv_.notify_all();
  work_cv_.notify_all();
}

// How many pieces a worker of `src` may take now (0: it leaves them to the
// others). A source not measured yet fetches one piece at a time until it is.
// Then the fastest source always takes (so the queue is always drained).
// Another takes a batch when it would deliver it, after what it holds, no
// later than the others would, after what they hold and what is queued: the
// GPU pipeline queues a few blocks at a time and waits for each, so a piece
// held by a slow source holds up its staging slot. Otherwise it may still
// fetch one piece at a time (it keeps helping, and its rate stays measured)
// while that piece would land before the others delivered all that is left
// of the load, and leaves the load's tail to them. Re-asked whenever the
// queue or the sources change.
bool StripedStore::HoldsAny(const Source& src) const {
  for (const Queued& q : queue_) {
    if (src.Holds(q.read->pieces[q.piece])) return true;
  }
  return false;
}

int StripedStore::MayTake(const Source& src) const {
  if (src.retired) return 0;
  const auto now = Clock::now();
  const double mine = src.Rate(now);
  if (mine <= 0) return src.fetching > 0 ? 0 : 1;
  double others = 0, fastest = 0;
  uint64_t others_hold = 0;
  for (const auto& s : sources_) {
    const double rate = s->dead || s->retired ? 0 : s->Rate(now);
    if (rate <= 0) continue;
    fastest = std::max(fastest, rate);
    if (s.get() == &src) continue;
    others += rate;
    others_hold += s->fetching_bytes;
  }
  if (others <= 0 || mine >= fastest) return src.take;
  uint64_t batch = 0, piece = 0;
  for (size_t k = 0; k < queue_.size() && static_cast<int>(k) < src.take; ++k) {
    batch += queue_[k].read->pieces[queue_[k].piece].bytes;
    if (k == 0) piece = batch;
  }
  // Hedged: a slow source's share is small, and a piece it holds too long is
  // waited for (rates measured early, or while it shares the CPUs, are rough),
  // so it holds what it delivers in half the others' time.
  constexpr double kHedge = 0.5;
  const double others_time = (others_hold + queued_bytes_) / others;
  if ((src.fetching_bytes + batch) / mine <= kHedge * others_time) return src.take;
  if (src.fetching > 0) return 0;
  // The bytes still to come: those queued, or, while the loader has more reads
  // to issue, what the checkpoint still holds beyond what has landed.
  const uint64_t landed = std::min(landed_bytes_, layout_.total_bytes);
  const uint64_t remaining = std::max(queued_bytes_, layout_.total_bytes - landed);
  return piece / mine <= kHedge * (remaining / others) ? 1 : 0;
}

std::string StripedStore::EveryFailure() const {
  std::string why;
  for (const auto& s : sources_) why += "\n  " + s->report.name + ": " + s->report.failure;
  return why;
}

std::vector<StripeSourceReport> StripedStore::SourceReports() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<StripeSourceReport> out;
  for (const auto& s : sources_) out.push_back(s->report);
  return out;
}

std::pair<double, uint64_t> StripedStore::Measured(const Source* source) const {
  std::lock_guard<std::mutex> lock(mu_);
  return {source->Rate(Clock::now()), source->report.bytes};
}

uint64_t StripedStore::refetched() const {
  std::lock_guard<std::mutex> lock(mu_);
  return refetched_;
}

uint64_t StripedStore::pieces() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pieces_;
}

}  // namespace tensorlift::sources
