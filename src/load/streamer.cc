#include "tensorlift/streamer.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "tensorlift/sparse.h"

namespace tensorlift {
namespace {

// How many streamed layers may be live at once: the one in use and the one
// prefetching (the budget reserves room for exactly these).
constexpr int kStreamSlots = 2;

std::string Bytes(uint64_t n) { return std::to_string(n) + " bytes"; }

}  // namespace

struct LayerStreamer::Impl {
  // kEmpty -> kLoading -> kReady (-> kInUse for streamed layers) -> kEmpty on
  // Release; a failed load leaves kFailed until its Acquire reports it.
  enum class State { kEmpty, kLoading, kReady, kInUse, kFailed };
  struct Layer {
    std::vector<std::string> names;
    uint64_t dense_bytes = 0;
    uint64_t stored_bytes = 0;
    uint64_t peak_bytes = 0;
    bool resident = false;
    State state = State::kEmpty;
    std::shared_ptr<const LoadedCheckpoint> loaded;
    Status error;
  };

  Checkpoint checkpoint;
  LoadOptions options;
  std::vector<Layer> layers;

  mutable std::mutex mu;
  std::condition_variable cv;  // A load finished, or a job was queued, or stop.
  std::optional<size_t> job;   // The layer the worker should load next.
  bool worker_busy = false;    // A job is queued or loading.
  bool stop = false;
  Stats stats;
  std::thread worker;

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    if (worker.joinable()) worker.join();
  }

  // Loads layer `i` without the lock held (its state is kLoading, so nobody
  // else touches it).
  Result<std::shared_ptr<const LoadedCheckpoint>> LoadLayer(size_t i) {
    LoadOptions opts = options;
    opts.filter = TensorFilter::Names(layers[i].names);
    auto r = Load(checkpoint, opts);
    if (!r.ok()) return r.status().WithContext("layer " + std::to_string(i));
    return std::make_shared<const LoadedCheckpoint>(std::move(r).value());
  }

  // Stores the result of a load of layer `i` (lock held).
  void Finish(size_t i, Result<std::shared_ptr<const LoadedCheckpoint>> r) {
    Layer& l = layers[i];
    if (r.ok()) {
      l.loaded = std::move(r).value();
      l.state = State::kReady;
    } else {
      l.error = std::move(r).status();
      l.state = State::kFailed;
    }
  }

  void WorkerLoop() {
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      cv.wait(lock, [&] { return stop || job.has_value(); });
      if (stop) return;
      const size_t i = *job;
      job.reset();
      lock.unlock();
      auto r = LoadLayer(i);
      lock.lock();
      const bool ok = r.ok();
      Finish(i, std::move(r));
      worker_busy = false;
      cv.notify_all();
      // Keep going while there is room: resident layers load ahead of their
      // first use, and a streamed prefetch that found the worker busy starts.
      if (ok) Prefetch(i);
    }
  }

  int LiveStreamed() const {
    int n = 0;
    for (const Layer& l : layers) {
      if (!l.resident &&
          (l.state == State::kLoading || l.state == State::kReady || l.state == State::kInUse))
        ++n;
    }
    return n;
  }

  // Starts loading the first layer after `after` (cyclically) that is neither
  // loaded nor loading, unless the worker is busy or that layer is streamed
  // and both stream slots are taken (Release and the worker call this again).
  // Lock held.
  void Prefetch(size_t after) {
    if (worker_busy || stop) return;
    const size_t n = layers.size();
    for (size_t step = 1; step < n; ++step) {
      const size_t k = (after + step) % n;
      Layer& l = layers[k];
      if (l.state != State::kEmpty) continue;
      if (!l.resident && LiveStreamed() >= kStreamSlots) return;
      l.state = State::kLoading;
      ++stats.loads;
      stats.bytes_read += l.stored_bytes;
      job = k;
      worker_busy = true;
      if (!worker.joinable()) worker = std::thread([this] { WorkerLoop(); });
      cv.notify_all();
      return;
    }
  }
};

LayerStreamer::LayerStreamer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LayerStreamer::LayerStreamer(LayerStreamer&&) noexcept = default;
LayerStreamer& LayerStreamer::operator=(LayerStreamer&&) noexcept = default;
LayerStreamer::~LayerStreamer() = default;

Result<LayerStreamer> LayerStreamer::Open(const Checkpoint& checkpoint,
                                          std::vector<std::vector<std::string>> layers,
                                          uint64_t budget_bytes, LoadOptions options) {
  if (layers.empty()) return InvalidArgumentError("layer streamer: no layers");
  if (options.on_tensor) {
    return InvalidArgumentError(
        "layer streamer: LoadOptions::on_tensor is not taken (Acquire hands out the layers)");
  }
  // Sizes from the headers: a sparse group's dense bytes and its four parts'
  // (which are also held while it decodes); a plain tensor's bytes, read in
  // place. With decode_sparse off, every tensor is plain (the groups' parts
  // are loaded as stored).
  struct Size {
    uint64_t dense, stored, transient;
  };
  std::unordered_map<std::string, Size> sizes;
  if (options.decode_sparse) {
    TL_ASSIGN_OR_RETURN(sparse::SparseCatalog catalog, sparse::FindSparse(checkpoint));
    for (const auto& g : catalog.sparse)
      sizes[g.name] = {g.dense_bytes(), g.stored_bytes, g.stored_bytes};
    for (auto loc : catalog.dense) {
      const TensorInfo& t = checkpoint.info(loc);
      sizes[t.name] = {t.nbytes(), t.nbytes(), 0};
    }
  } else {
    for (auto loc : checkpoint.tensors()) {
      const TensorInfo& t = checkpoint.info(loc);
      sizes[t.name] = {t.nbytes(), t.nbytes(), 0};
    }
  }

  auto impl = std::make_unique<Impl>();
  impl->checkpoint = checkpoint;
  impl->options = std::move(options);
  std::unordered_set<std::string> seen;
  for (size_t i = 0; i < layers.size(); ++i) {
    Impl::Layer l;
    for (const std::string& name : layers[i]) {
      auto it = sizes.find(name);
      if (it == sizes.end()) {
        return NotFoundError("layer streamer: layer " + std::to_string(i) + ": tensor '" + name +
                             "' is not in the checkpoint");
      }
      if (!seen.insert(name).second) {
        return InvalidArgumentError("layer streamer: layer " + std::to_string(i) + ": tensor '" +
                                    name + "' is named twice");
      }
      l.dense_bytes += it->second.dense;
      l.stored_bytes += it->second.stored;
      l.peak_bytes += it->second.dense + it->second.transient;
    }
    l.names = std::move(layers[i]);
    impl->layers.push_back(std::move(l));
  }

  // Resident layers in order while they fit beside two of the largest
  // streamed layer's peak. Making a layer resident can only lower the largest
  // streamed cost, so the reserve is recomputed over the layers still
  // streamed after each choice.
  const size_t n = impl->layers.size();
  auto cost = [&](size_t i) { return impl->layers[i].peak_bytes; };
  auto reserve_from = [&](size_t first) {
    uint64_t largest = 0;
    for (size_t i = first; i < n; ++i) largest = std::max(largest, cost(i));
    return kStreamSlots * largest;
  };
  uint64_t resident_bytes = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t with = resident_bytes + impl->layers[i].dense_bytes;
    if (with + reserve_from(i + 1) > budget_bytes) break;
    impl->layers[i].resident = true;
    resident_bytes = with;
  }
  size_t first_streamed = 0;
  while (first_streamed < n && impl->layers[first_streamed].resident) ++first_streamed;
  const uint64_t reserve = reserve_from(first_streamed);
  if (resident_bytes + reserve > budget_bytes) {
    return InvalidArgumentError(
        "layer streamer: a budget of " + Bytes(budget_bytes) +
        " is below two of the largest streamed layer (" + std::to_string(kStreamSlots) + " x " +
        Bytes(reserve / kStreamSlots) +
        ": its dense bytes plus its sparse groups' stored parts, held while it "
        "loads)");
  }
  return LayerStreamer(std::move(impl));
}

Result<std::shared_ptr<const LoadedCheckpoint>> LayerStreamer::Acquire(size_t layer) {
  Impl& s = *impl_;
  if (layer >= s.layers.size()) {
    return OutOfRangeError("layer streamer: layer " + std::to_string(layer) + " of " +
                           std::to_string(s.layers.size()));
  }
  std::unique_lock<std::mutex> lock(s.mu);
  Impl::Layer& l = s.layers[layer];
  const auto start = std::chrono::steady_clock::now();
  if (!l.resident) {
    if (l.state == Impl::State::kEmpty) {
      ++s.stats.prefetch_misses;
    } else if (l.state == Impl::State::kLoading || l.state == Impl::State::kReady) {
      ++s.stats.prefetch_hits;
    }
  }
  if (l.state == Impl::State::kEmpty) {
    // A streamed miss means the order broke: drop prefetched layers nobody
    // acquired, to keep to the slots.
    if (!l.resident) {
      for (Impl::Layer& other : s.layers) {
        if (!other.resident && other.state == Impl::State::kReady) {
          other.loaded.reset();
          other.state = Impl::State::kEmpty;
        }
      }
    }
    l.state = Impl::State::kLoading;
    ++s.stats.loads;
    s.stats.bytes_read += l.stored_bytes;
    lock.unlock();
    auto r = s.LoadLayer(layer);
    lock.lock();
    s.Finish(layer, std::move(r));
  }
  s.cv.wait(lock, [&] { return l.state != Impl::State::kLoading; });
  s.stats.wait_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (l.state == Impl::State::kFailed) {
    l.state = Impl::State::kEmpty;
    Status error = std::move(l.error);
    l.error = Status();
    return error;
  }
  if (!l.resident) l.state = Impl::State::kInUse;
  std::shared_ptr<const LoadedCheckpoint> out = l.loaded;
  s.Prefetch(layer);
  return out;
}

void LayerStreamer::Release(size_t layer) {
  Impl& s = *impl_;
  if (layer >= s.layers.size()) return;
  std::lock_guard<std::mutex> lock(s.mu);
  Impl::Layer& l = s.layers[layer];
  if (l.resident || l.state != Impl::State::kInUse) return;
  l.loaded.reset();
  l.state = Impl::State::kEmpty;
  // A prefetch held back for want of a slot can start now.
  s.Prefetch(layer);
}

size_t LayerStreamer::num_layers() const { return impl_->layers.size(); }
bool LayerStreamer::resident(size_t layer) const { return impl_->layers.at(layer).resident; }
uint64_t LayerStreamer::dense_bytes(size_t layer) const {
  return impl_->layers.at(layer).dense_bytes;
}
uint64_t LayerStreamer::stored_bytes(size_t layer) const {
  return impl_->layers.at(layer).stored_bytes;
}
uint64_t LayerStreamer::peak_bytes(size_t layer) const {
  return impl_->layers.at(layer).peak_bytes;
}

LayerStreamer::Stats LayerStreamer::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

}  // namespace tensorlift
