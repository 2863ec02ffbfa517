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
//     s->Release(i);   // Status: on a device, Release(i, stream) (below)
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
// On a device (LoadOptions::device "cuda:N", or "emulated" in tests), the
// layers load into device memory that the streamer allocates once, in Open:
// a buffer per resident layer and a ring of two buffers, each as large as the
// largest streamed layer's load allocates (its tensors; for sparse-bitmask
// groups, their stored parts and the dense tensors decoded from them on the
// device; conversion slots with LoadOptions::dtype), reused by every streamed
// layer in turn: streaming allocates no device memory. Each load reads by the
// same rules as any load onto the device (LoadOptions::mode: auto reads a
// file the page cache holds through it and the others with O_DIRECT; pinned
// staging or GDS). The budget is then device memory: the resident layers'
// buffers plus the ring must fit it (InvalidArgument naming the numbers), and
// the device must have that much free (ResourceExhausted). A layer's buffer
// is reused only when no tensor of the layer it held is alive (a tensor kept
// past Release keeps its buffer: Acquire then fails with ResourceExhausted
// rather than wait) and, after Release(i, stream), when the caller's work
// queued on `stream` before the Release is done: the next load into the buffer
// waits for it on the streamer's thread, never on the caller's.
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
  // layers and for layers not acquired). On a device, `stream` is the
  // caller's stream (a cudaStream_t as an integer; 0 the legacy default
  // stream) whose work queued so far reads the layer: its buffer is reused only
  // once that work is done. The emulated device takes only 0 (its callers
  // compute on the host). Fails (InvalidArgument) only for a stream the
  // device refuses; the layer is then still in use.
  Status Release(size_t layer, uint64_t stream = 0);

  size_t num_layers() const;
  // Past the last layer, the per-layer queries below say false or 0.
  bool resident(size_t layer) const;
  uint64_t dense_bytes(size_t layer) const;   // Bytes of the layer's tensors once loaded.
  uint64_t stored_bytes(size_t layer) const;  // Bytes read from the files to load it.
  uint64_t peak_bytes(size_t layer) const;    // Memory it needs while it loads (see above).
  // On a device: what its load allocates there (its buffer's bytes); 0 on the host.
  uint64_t device_bytes(size_t layer) const;
  // On a device: the bytes of its resident layers' buffers and of the ring,
  // all the device memory the streamer holds; 0 on the host.
  uint64_t device_memory() const;
  // Where the layers load: LoadOptions::device as Open was given it.
  DeviceId device() const;
  // The layer's tensors are loaded or loading now (resident and loaded,
  // prefetched, or acquired and not released).
  bool in_memory(size_t layer) const;
  Stats stats() const;

 private:
  struct Impl;
  explicit LayerStreamer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tensorlift

#endif  // TENSORLIFT_STREAMER_H_
