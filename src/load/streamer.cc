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

#include "device/device.h"
#include "load/device_load.h"
#include "load/device_ring.h"
#include "tensorlift/sparse.h"

namespace tensorlift {
namespace {

// How many streamed layers may be live at once: the one in use and the one
// prefetching (the budget reserves room for exactly these; on a device, the
// ring has this many buffers).
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
    uint64_t device_bytes = 0;  // On a device: what its load allocates there.
    bool resident = false;
    State state = State::kEmpty;
    std::shared_ptr<const LoadedCheckpoint> loaded;
    Status error;
    int slot = -1;                     // On a device, a streamed layer's ring buffer.
    std::shared_ptr<SlotDevice> home;  // On a device, a resident layer's own buffer.
  };
  // A buffer of the ring (on a device).
  struct Slot {
    std::shared_ptr<SlotDevice> memory;
    int layer = -1;  // The layer loading into it, loaded or in use; -1: none.
    // Recorded on the caller's stream by Release: the next load into the
    // buffer waits for it (the caller's work that read the previous layer).
    std::unique_ptr<DeviceEvent> released;
  };

  Checkpoint checkpoint;
  LoadOptions options;
  std::vector<Layer> layers;
  std::shared_ptr<Device> device;  // Null: host memory.
  std::vector<Slot> ring;
  uint64_t device_memory = 0;

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
  // else touches it or its ring buffer).
  Result<std::shared_ptr<const LoadedCheckpoint>> LoadLayer(size_t i) {
    LoadOptions opts = options;
    opts.filter = TensorFilter::Names(layers[i].names);
    Result<LoadedCheckpoint> r = InternalError("not loaded");
    if (!device) {
      r = Load(checkpoint, opts);
    } else if (layers[i].resident) {
      r = LoadOntoDevice(checkpoint, opts, layers[i].home);
    } else {
      Slot& s = ring[layers[i].slot];
      // The caller's work on the buffer's previous layer is done first.
      Status waited = s.released->Synchronize();
      r = waited.ok() ? LoadOntoDevice(checkpoint, opts, s.memory)
                      : Result<LoadedCheckpoint>(waited.WithContext(
                            "waiting for the work on the previous layer in its buffer"));
    }
    if (!r.ok()) return r.status().WithContext("layer " + std::to_string(i));
    return std::make_shared<const LoadedCheckpoint>(std::move(r).value());
  }

  // Gives a streamed layer's ring buffer back (lock held).
  void FreeSlot(Layer& l) {
    if (l.slot >= 0) ring[l.slot].layer = -1;
    l.slot = -1;
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
      FreeSlot(l);
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

  // A ring buffer no layer holds and no tensor uses; -1 if none (lock held).
  int FreeRingSlot() const {
    for (size_t s = 0; s < ring.size(); ++s) {
      if (ring[s].layer < 0 && !ring[s].memory->InUse()) return static_cast<int>(s);
    }
    return -1;
  }

  // Room for one more streamed layer (lock held): a stream slot on the host,
  // a free ring buffer on a device (taken for `layer`).
  bool TakeRoom(size_t layer) {
    if (!device) return LiveStreamed() < kStreamSlots;
    const int s = FreeRingSlot();
    if (s < 0) return false;
    ring[s].layer = static_cast<int>(layer);
    layers[layer].slot = s;
    return true;
  }

  // Starts loading the first layer after `after` (cyclically) that is neither
  // loaded nor loading, unless the worker is busy or that layer is streamed
  // and there is no room for it (Release and the worker call this again).
  // Lock held.
  void Prefetch(size_t after) {
    if (worker_busy || stop) return;
    const size_t n = layers.size();
    for (size_t step = 1; step < n; ++step) {
      const size_t k = (after + step) % n;
      Layer& l = layers[k];
      if (l.state != State::kEmpty) continue;
      if (!l.resident && !TakeRoom(k)) return;
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

  // Drops the streamed layers loaded or loading that nobody acquired, to make
  // room for a layer acquired out of order; on a device, waits for such a
  // load to finish first (lock held in `lock`).
  void DropUnacquired(std::unique_lock<std::mutex>& lock, size_t except) {
    if (device) {
      cv.wait(lock, [&] {
        for (size_t k = 0; k < layers.size(); ++k) {
          if (k != except && !layers[k].resident && layers[k].state == State::kLoading)
            return false;
        }
        return true;
      });
    }
    for (Layer& other : layers) {
      if (!other.resident && other.state == State::kReady) {
        other.loaded.reset();
        other.state = State::kEmpty;
        FreeSlot(other);
      }
    }
  }

  // Sizes and the resident/streamed split (Open).
  Status Plan(std::vector<std::vector<std::string>> names, uint64_t budget_bytes);
  // On a device: the resident layers' buffers and the ring (Open).
  Status AllocateDeviceMemory(uint64_t budget_bytes);
};

Status LayerStreamer::Impl::Plan(std::vector<std::vector<std::string>> names,
                                 uint64_t budget_bytes) {
  // Sizes from the headers: a sparse group's dense bytes and its four parts'
  // (which are also held while it decodes); a plain tensor's bytes, read in
  // place. With decode_sparse off, every tensor is plain (the groups' parts
  // are loaded as stored).
  struct Size {
    uint64_t dense, stored, transient;
    const sparse::SparseTensor* group;
  };
  std::unordered_map<std::string, Size> sizes;
  sparse::SparseCatalog catalog;
  if (options.decode_sparse) {
    TL_ASSIGN_OR_RETURN(catalog, sparse::FindSparse(checkpoint));
    for (const auto& g : catalog.sparse)
      sizes[g.name] = {g.dense_bytes(), g.stored_bytes, g.stored_bytes, &g};
    for (auto loc : catalog.dense) {
      const TensorInfo& t = checkpoint.info(loc);
      sizes[t.name] = {t.nbytes(), t.nbytes(), 0, nullptr};
    }
  } else {
    for (auto loc : checkpoint.tensors()) {
      const TensorInfo& t = checkpoint.info(loc);
      sizes[t.name] = {t.nbytes(), t.nbytes(), 0, nullptr};
    }
  }
  std::unordered_set<std::string> seen;
  for (size_t i = 0; i < names.size(); ++i) {
    Layer l;
    std::vector<std::string> plain;
    std::vector<const sparse::SparseTensor*> groups;
    for (const std::string& name : names[i]) {
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
      if (it->second.group) {
        groups.push_back(it->second.group);
      } else {
        plain.push_back(name);
      }
    }
    if (device) {
      // What the load allocates on the device is what the layer costs there,
      // resident or streamed (its buffer holds the stored parts too).
      l.device_bytes = DeviceLoadBytes(checkpoint, plain, groups, options);
      l.peak_bytes = l.device_bytes;
    }
    l.names = std::move(names[i]);
    layers.push_back(std::move(l));
  }

  // Resident layers in order while they fit beside two of the largest
  // streamed layer's peak. Making a layer resident can only lower the largest
  // streamed cost, so the reserve is recomputed over the layers still
  // streamed after each choice.
  const size_t n = layers.size();
  auto resident_cost = [&](size_t i) {
    return device ? layers[i].device_bytes : layers[i].dense_bytes;
  };
  auto reserve_from = [&](size_t first) {
    uint64_t largest = 0;
    for (size_t i = first; i < n; ++i) largest = std::max(largest, layers[i].peak_bytes);
    return kStreamSlots * largest;
  };
  uint64_t resident_bytes = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t with = resident_bytes + resident_cost(i);
    if (with + reserve_from(i + 1) > budget_bytes) break;
    layers[i].resident = true;
    resident_bytes = with;
  }
  size_t first_streamed = 0;
  while (first_streamed < n && layers[first_streamed].resident) ++first_streamed;
  const uint64_t reserve = reserve_from(first_streamed);
  if (resident_bytes + reserve > budget_bytes) {
    if (device) {
      return InvalidArgumentError(
          "layer streamer: a budget of " + Bytes(budget_bytes) + " on " + device->name() +
          " is below its ring of two buffers for the largest streamed layer (" +
          std::to_string(kStreamSlots) + " x " + Bytes(reserve / kStreamSlots) +
          ": its tensors, and its sparse groups' stored parts, as loaded onto the device)");
    }
    return InvalidArgumentError(
        "layer streamer: a budget of " + Bytes(budget_bytes) +
        " is below two of the largest streamed layer (" + std::to_string(kStreamSlots) + " x " +
        Bytes(reserve / kStreamSlots) +
        ": its dense bytes plus its sparse groups' stored parts, held while it "
        "loads)");
  }
  return Status::Ok();
}

Status LayerStreamer::Impl::AllocateDeviceMemory(uint64_t budget_bytes) {
  uint64_t resident = 0, slot = 0;
  for (const Layer& l : layers) {
    if (l.resident) {
      resident += l.device_bytes;
    } else {
      slot = std::max(slot, l.device_bytes);
    }
  }
  const uint64_t ring_bytes = slot == 0 ? 0 : kStreamSlots * slot;
  TL_ASSIGN_OR_RETURN(const uint64_t free_bytes, device->FreeMemory());
  if (resident + ring_bytes > free_bytes) {
    return ResourceExhaustedError(
        "layer streamer: " + device->name() + " has " + Bytes(free_bytes) +
        " free, less than the " + Bytes(resident + ring_bytes) + " the budget of " +
        Bytes(budget_bytes) + " plans there (resident layers " + Bytes(resident) + ", ring " +
        std::to_string(kStreamSlots) + " x " + Bytes(slot) + ")");
  }
  for (Layer& l : layers) {
    if (!l.resident) continue;
    TL_ASSIGN_OR_RETURN(auto buffer, device->Allocate(std::max<uint64_t>(l.device_bytes, 1)));
    l.home = std::make_shared<SlotDevice>(device, std::move(buffer));
    device_memory += l.device_bytes;
  }
  if (slot > 0) {
    for (int s = 0; s < kStreamSlots; ++s) {
      Slot r;
      TL_ASSIGN_OR_RETURN(auto buffer, device->Allocate(slot));
      r.memory = std::make_shared<SlotDevice>(device, std::move(buffer));
      TL_ASSIGN_OR_RETURN(r.released, device->CreateEvent());
      ring.push_back(std::move(r));
      device_memory += slot;
    }
  }
  return Status::Ok();
}

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
  if (options.shared_memory) {
    return InvalidArgumentError(
        "layer streamer: LoadOptions::shared_memory is not taken (streamed layers are not "
        "handed to other processes)");
  }
  auto impl = std::make_unique<Impl>();
  if (!options.device.on_host()) {
    TL_ASSIGN_OR_RETURN(impl->device, OpenDevice(options.device.type, options.device.index));
    if (options.arena_pool) {
      return InvalidArgumentError(
          "layer streamer: LoadOptions::arena_pool is for host memory; on " + impl->device->name() +
          " the streamer keeps its own ring of device buffers");
    }
  }
  impl->checkpoint = checkpoint;
  impl->options = std::move(options);
  TL_RETURN_IF_ERROR(impl->Plan(std::move(layers), budget_bytes));
  if (impl->device) TL_RETURN_IF_ERROR(impl->AllocateDeviceMemory(budget_bytes));
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
      s.DropUnacquired(lock, layer);
      if (s.device && !s.TakeRoom(layer)) {
        std::string holders;
        for (size_t k = 0; k < s.layers.size(); ++k) {
          if (s.layers[k].slot >= 0) holders += (holders.empty() ? "" : ", ") + std::to_string(k);
        }
        return ResourceExhaustedError(
            "layer streamer: no buffer of the ring on " + s.device->name() + " is free for layer " +
            std::to_string(layer) + " (" +
            (holders.empty() ? std::string("a tensor of a released layer is still referenced")
                             : "held by layer(s) " + holders + ", acquired and not released") +
            ")");
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

Status LayerStreamer::Release(size_t layer, uint64_t stream) {
  Impl& s = *impl_;
  if (layer >= s.layers.size()) return Status::Ok();
  std::shared_ptr<const LoadedCheckpoint> dropped;  // Freed after the lock.
  Status recorded = Status::Ok();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    Impl::Layer& l = s.layers[layer];
    if (l.resident || l.state != Impl::State::kInUse) return Status::Ok();
    if (l.slot >= 0) recorded = s.device->RecordExternal(*s.ring[l.slot].released, stream);
    if (!recorded.ok())
      return recorded.WithContext("layer streamer: release of layer " + std::to_string(layer));
    dropped = std::move(l.loaded);
    l.state = Impl::State::kEmpty;
    s.FreeSlot(l);
  }
  dropped.reset();
  // A prefetch held back for want of room can start now.
  std::lock_guard<std::mutex> lock(s.mu);
  s.Prefetch(layer);
  return Status::Ok();
}

size_t LayerStreamer::num_layers() const { return impl_->layers.size(); }
// Past the last layer: false and 0, never an exception (the library never
// throws; Acquire says OutOfRange).
bool LayerStreamer::resident(size_t layer) const {
  return layer < impl_->layers.size() && impl_->layers[layer].resident;
}
uint64_t LayerStreamer::dense_bytes(size_t layer) const {
  return layer < impl_->layers.size() ? impl_->layers[layer].dense_bytes : 0;
}
uint64_t LayerStreamer::stored_bytes(size_t layer) const {
  return layer < impl_->layers.size() ? impl_->layers[layer].stored_bytes : 0;
}
uint64_t LayerStreamer::peak_bytes(size_t layer) const {
  return layer < impl_->layers.size() ? impl_->layers[layer].peak_bytes : 0;
}
uint64_t LayerStreamer::device_bytes(size_t layer) const {
  return layer < impl_->layers.size() ? impl_->layers[layer].device_bytes : 0;
}
uint64_t LayerStreamer::device_memory() const { return impl_->device_memory; }
DeviceId LayerStreamer::device() const { return impl_->options.device; }

bool LayerStreamer::in_memory(size_t layer) const {
  if (layer >= impl_->layers.size()) return false;
  std::lock_guard<std::mutex> lock(impl_->mu);
  const Impl::State st = impl_->layers[layer].state;
  return st == Impl::State::kLoading || st == Impl::State::kReady || st == Impl::State::kInUse;
}

LayerStreamer::Stats LayerStreamer::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

}  // namespace tensorlift
