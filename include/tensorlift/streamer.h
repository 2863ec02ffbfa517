// Layer streaming for models larger than a memory budget (offload): given a
// checkpoint, the tensors of each layer in execution order and a budget in
// bytes, LayerStreamer keeps the layers that fit resident and streams the
// others, loading (reading and, for sparse-bitmask groups, decoding) the next
// layer on a background thread while the caller computes with the current one.
//
//   auto s = LayerStreamer::Open(ckpt, {{"l0.w"}, {"l1.w"}, ...}, 4ull << 30, opts);
//   for (size_t i = 0; i < s->num_layers(); ++i) {
//     auto layer = s->Acquire(i);   // Result<shared_ptr<const LoadedCheckpoint>>
//     ...compute with (*layer)->Find("l0.w")...
//     s->Release(i);
//   }
//
// Budget policy (decided once, in Open): a streamed layer costs its peak
// bytes while it loads: its dense bytes, plus the stored bytes of its sparse
// groups (their parts are read before they are decoded; plain tensors are read
// straight into their final buffers). Two streamed layers are live at a time
// (the one in use and the one prefetching), so room for two of the largest
// streamed layer's peak is reserved first. Layers are then made resident in order while their dense
// bytes fit what is left. A budget below two of the largest streamed layer is
// InvalidArgument.
//
// Prefetch: after each Acquire(i) (and each Release(i), and each background
// load of layer i), the first layer after i in cyclic order that is neither
// loaded nor loading is loaded in the background, one at a time: a resident layer not yet loaded,
// or a streamed layer while fewer than two streamed layers are live. So the last layer prefetches
// the first streamed layer for the next pass (wrap-around). Acquiring the layers in order, with
// each streamed layer released before the next one after it is acquired, keeps at most two streamed
// layers live. Out of order, an Acquire of a layer that is neither loaded nor loading loads it on
// the calling thread (a miss), and a prefetched layer nobody acquired is dropped to make room.
//
// Ownership: Acquire returns shared ownership. Release(i) drops the streamer's
// reference to a streamed layer; its memory is freed when the caller's last
// reference goes. Resident layers stay loaded until the streamer is destroyed.
//
// Errors: a failed load (a prefetch or a synchronous one) is returned by the
// Acquire of that layer; the next Acquire of it tries again.
//
// Thread safety: one consumer thread calls Acquire/Release; stats() may be
// called from any thread. The destructor waits for a load in flight and joins
// the background thread.
#ifndef TENSORLIFT_STREAMER_H_
#define TENSORLIFT_STREAMER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensorlift/checkpoint.h"
#include "tensorlift/loader.h"
#include "tensorlift/status.h"

namespace tensorlift {

class LayerStreamer {
 public:
  struct Stats {
    uint64_t bytes_read = 0;       // Stored bytes of every load (resident and streamed).
    uint64_t loads = 0;            // Loads started (background and synchronous).
    uint64_t prefetch_hits = 0;    // Streamed Acquires that found their layer loaded or loading.
    uint64_t prefetch_misses = 0;  // Streamed Acquires that had to start the load themselves.
    double wait_seconds = 0;       // Time Acquire spent waiting for loads.
  };

  // `layers`: the dense tensor names of each layer, in execution order (every
  // name must be in the checkpoint, once across all layers). `options` are
  // used for every load; their filter is replaced by each layer's names. The
  // checkpoint is copied (headers only).
  static Result<LayerStreamer> Open(const Checkpoint& checkpoint,
                                    std::vector<std::vector<std::string>> layers,
                                    uint64_t budget_bytes, LoadOptions options);

  LayerStreamer(LayerStreamer&&) noexcept;
  LayerStreamer& operator=(LayerStreamer&&) noexcept;
  ~LayerStreamer();

  // The tensors of `layer` (OutOfRange past the last layer), loading them now
  // if no prefetch did; then starts prefetching the next layer.
  Result<std::shared_ptr<const LoadedCheckpoint>> Acquire(size_t layer);
  // Drops the streamer's reference to a streamed layer (no-op for resident
  // layers and for layers not acquired).
  void Release(size_t layer);

  size_t num_layers() const;
  bool resident(size_t layer) const;
  uint64_t dense_bytes(size_t layer) const;   // Bytes of the layer's tensors once loaded.
  uint64_t stored_bytes(size_t layer) const;  // Bytes read from the files to load it.
  uint64_t peak_bytes(size_t layer) const;    // Memory it needs while it loads (see above).
  Stats stats() const;

 private:
  struct Impl;
  explicit LayerStreamer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tensorlift

#endif  // TENSORLIFT_STREAMER_H_
