// ArenaPool (include/tensorlift/loader.h): host buffers kept between loads.
#include "load/arena_pool.h"

#include <algorithm>
#include <mutex>

#include "device/host_buffer.h"
#include "tensorlift/loader.h"

namespace tensorlift {

struct ArenaPool::State {
  mutable std::mutex mu;
  int max_free;
  bool closed = false;
  std::vector<std::unique_ptr<HostBuffer>> free;
  uint64_t fresh = 0, reused = 0;

  // Takes back a buffer whose last owner is gone; frees it (outside the lock)
  // when the pool is closed or full.
  void Put(HostBuffer* raw) {
    std::unique_ptr<HostBuffer> b(raw);
    std::lock_guard<std::mutex> lock(mu);
    if (closed || static_cast<int>(free.size()) >= max_free)
      return;  // b is freed after the unlock.
    free.push_back(std::move(b));
  }
};

ArenaPool::ArenaPool(int max_free) : state_(std::make_shared<State>()) {
  state_->max_free = std::max(0, max_free);
}

ArenaPool::~ArenaPool() {
  std::vector<std::unique_ptr<HostBuffer>> drop;
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->closed = true;
  drop.swap(state_->free);
}

ArenaPool::Stats ArenaPool::stats() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  Stats s;
  s.fresh = state_->fresh;
  s.reused = state_->reused;
  s.free = state_->free.size();
  for (const auto& b : state_->free) s.free_bytes += b->size();
  return s;
}

void ArenaPool::Trim() {
  std::vector<std::unique_ptr<HostBuffer>> drop;
  std::lock_guard<std::mutex> lock(state_->mu);
  drop.swap(state_->free);
}

Result<std::shared_ptr<HostBuffer>> TakeArena(const std::shared_ptr<ArenaPool>& pool,
                                              uint64_t bytes) {
  if (!pool) return HostBuffer::Allocate(bytes);
  const std::shared_ptr<ArenaPool::State>& st = pool->state();
  std::unique_ptr<HostBuffer> buf;
  {
    std::lock_guard<std::mutex> lock(st->mu);
    // The smallest free buffer that holds `bytes`, else the largest (grown): ordered by
    // (does not fit, capacity), with the capacities of those that do not fit negated.
    auto rank = [&](const std::unique_ptr<HostBuffer>& b) {
      const bool fits = b->capacity() >= bytes;
      return std::pair<bool, int64_t>(
          !fits, fits ? static_cast<int64_t>(b->capacity()) : -static_cast<int64_t>(b->capacity()));
    };
    auto best = std::min_element(st->free.begin(), st->free.end(),
                                 [&](const auto& a, const auto& b) { return rank(a) < rank(b); });
    if (best != st->free.end()) {
      buf = std::move(*best);
      st->free.erase(best);
      ++st->reused;
    } else {
      ++st->fresh;
    }
  }
  if (buf) {
    TL_RETURN_IF_ERROR(buf->Resize(bytes));
  } else {
    TL_ASSIGN_OR_RETURN(buf, HostBuffer::AllocateOwned(bytes));
  }
  std::weak_ptr<ArenaPool::State> weak = st;
  return std::shared_ptr<HostBuffer>(buf.release(), [weak](HostBuffer* b) {
    if (auto s = weak.lock()) {
      s->Put(b);
    } else {
      delete b;
    }
  });
}

}  // namespace tensorlift
