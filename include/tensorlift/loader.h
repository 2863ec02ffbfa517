// Loading tensors into memory: plan the byte ranges from the headers, read
// them in large parallel blocks straight into their final buffers, and hand
// out views (and DLPack tensors) over those buffers without copies.
//
//   auto ckpt = tensorlift::Checkpoint::Open("model_dir");
//   tensorlift::LoadOptions opts;                      // mode auto, defaults
//   auto loaded = tensorlift::Load(*ckpt, opts);       // Result<LoadedCheckpoint>
//   const tensorlift::LoadedTensor* w = loaded->Find("lm_head.weight");
//
// I/O modes (LoadOptions::mode), decided per file:
//   buffered  pread/io_uring through the page cache.
//   direct    O_DIRECT reads of 4 KiB-aligned blocks; the unaligned head and
//             tail of each range go through a small bounce buffer. Falls back
//             to buffered when the filesystem refuses O_DIRECT.
//   mmap      views over a private mapping of the file: zero copies, but the
//             bytes are read lazily, on first touch.
//   auto      (default) mincore() on the bytes to load, per file: views of the
//             page cache (as mmap, page tables filled in before Load returns)
//             when at least 90% are cached (buffered instead with `copy`),
//             buffered from 50%, direct below (docs/loading.md, "The auto rule").
// Engines (LoadOptions::engine) for buffered and direct: a pool of pread
// threads, or one io_uring with a queue depth; auto picks io_uring when the
// kernel allows it.
//
// Alignment: every tensor's data is aligned to its element size (up to 8
// bytes). Buffers mirror each file's data section modulo 4 KiB (buffered) or
// the file itself modulo 4 KiB (direct, as O_DIRECT needs), so tensors that the
// reference writer aligned stay aligned without copies whatever the header
// size. A tensor that would still be misaligned is read on its own with a
// buffered pread into its own aligned slot (no extra copy); in mmap mode it is
// copied out of the mapping (one memcpy of its bytes), unless
// LoadOptions::misaligned_views.
//
// Ownership: a LoadedCheckpoint owns its buffers through reference counts.
// Views are valid while the LoadedCheckpoint lives; DLPack tensors keep their
// buffer alive on their own until their deleter runs. A failed load frees
// everything it allocated and returns no tensors.
//
// Thread safety: Load may run concurrently on different checkpoints. A
// LoadedCheckpoint is immutable; its methods may be called from any thread.
#ifndef TENSORLIFT_LOADER_H_
#define TENSORLIFT_LOADER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tensorlift/checkpoint.h"
#include "tensorlift/content.h"
#include "tensorlift/dtype.h"
#include "tensorlift/status.h"

// DLPack's structures (dlpack/dlpack.h, version 1.x); declared here so the
// public API needs only standard headers.
struct DLManagedTensor;
struct DLManagedTensorVersioned;

namespace tensorlift {

enum class IoMode : uint8_t { kAuto, kBuffered, kDirect, kMmap };
// LoadOptions::content_hash.
enum class ContentHashMode : uint8_t { kAuto, kOn, kOff };
enum class IoEngine : uint8_t { kAuto, kThreads, kUring };

std::string_view IoModeName(IoMode mode);        // "auto", "buffered", ...
std::string_view IoEngineName(IoEngine engine);  // "auto", "threads", "uring"
Result<IoMode> ParseIoMode(std::string_view name);
Result<IoEngine> ParseIoEngine(std::string_view name);

// Which tensors to load. Default: all.
class TensorFilter {
 public:
  TensorFilter() = default;
  static TensorFilter Names(std::vector<std::string> names);
  // ECMAScript regex, matched anywhere in the name (std::regex_search).
  static Result<TensorFilter> Regex(const std::string& pattern);
  static TensorFilter Predicate(std::function<bool(std::string_view)> pred);

  bool Matches(std::string_view name) const { return !pred_ || pred_(name); }
  bool all() const { return !pred_; }

 private:
  std::function<bool(std::string_view)> pred_;
};

struct Progress {
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;
  double seconds = 0;
  double gbps() const { return seconds > 0 ? bytes_done / seconds / 1e9 : 0; }
};
// Called from the loading thread, at most every 100 ms and once at the end.
using ProgressCallback = std::function<void(const Progress&)>;

// Host memory kept between loads, for loads that follow one another (the
// pieces of tensorlift.stream, a layer streamer): a load with
// LoadOptions::arena_pool takes each file's buffer from the pool's free
// buffers (the smallest that is large enough, else the largest, grown in
// place), and a buffer goes back to the pool, not to the system, once its last
// tensor is dropped. Memory already written needs no page faults the second
// time: first touch of fresh memory costs as much as the reads on some
// machines (docs/loading.md, "Memory"). The pool keeps at most `max_free`
// buffers; any more, and all of them when the pool is destroyed, go back to
// the system. Buffers still held by tensors outlive the pool. Used by host
// loads' file buffers (mode buffered or direct, no dtype conversion); other
// loads allocate as without it. Thread-safe.
class ArenaPool {
 public:
  struct Stats {
    uint64_t fresh = 0;       // Buffers allocated from the system.
    uint64_t reused = 0;      // Buffers taken from the free ones.
    uint64_t free = 0;        // Free buffers held now,
    uint64_t free_bytes = 0;  // and their bytes.
  };
  explicit ArenaPool(int max_free = 2);
  ~ArenaPool();
  ArenaPool(const ArenaPool&) = delete;
  ArenaPool& operator=(const ArenaPool&) = delete;
  Stats stats() const;
  // Frees the free buffers now.
  void Trim();

  struct State;  // (src/load/arena_pool.cc)
  const std::shared_ptr<State>& state() const { return state_; }

 private:
  std::shared_ptr<State> state_;
};

struct LoadedTensor;
class Buffer;

// A tensor handed to LoadOptions::on_tensor while the rest of its load is
// still being read.
class StreamedTensor {
 public:
  StreamedTensor(const LoadedTensor& tensor, std::shared_ptr<Buffer> owner)
      : tensor_(&tensor), owner_(std::move(owner)) {}
  // Valid during the call; its bytes stay valid while the LoadedCheckpoint
  // that Load returns lives, or through ToDLPackVersioned.
  const LoadedTensor& tensor() const { return *tensor_; }
  // A DLPack tensor over the bytes (no copy) that keeps them alive on its own,
  // also after the load and its LoadedCheckpoint are gone; the caller calls
  // its deleter. raw_bytes: the 1-D uint8 array of its bytes.
  Result<DLManagedTensorVersioned*> ToDLPackVersioned(bool raw_bytes = false) const;

 private:
  const LoadedTensor* tensor_;
  std::shared_ptr<Buffer> owner_;
};

// Streaming (LoadOptions::on_tensor): called once per loaded tensor as soon as
// its bytes are in place, while later bytes are still being read, so that a
// consumer's work (copying into parameters, hashing) overlaps the reads.
// - Host loads (buffered, direct) hand out each tensor when the reads that
//   cover it complete; views of the page cache (mmap, auto's cached files) at
//   once. GPU, dtype-converting and sparse-decoding loads hand out every tensor
//   at the end of the load, before Load returns.
// - Called from one thread of the load's own, never two calls at once, in the
//   order the bytes land (about file order); it may take its time (the reads
//   go on meanwhile).
// - An error returned stops the hand-outs; Load returns it once the reads in
//   flight are done. If the load fails after some tensors were handed out (a
//   read error, the file changed), Load returns the error and the consumer
//   must discard what it got.
// Load and the loaders built on it take it; LoadDistributed, LayerStreamer,
// peer loading and serving refuse it (InvalidArgument).
using TensorCallback = std::function<Status(const StreamedTensor&)>;

// A tensor-parallel rank: rank `rank` of `size` (0 <= rank < size).
struct TensorParallel {
  int size = 1;
  int rank = 0;
};

enum class DeviceType : uint8_t { kCpu, kCuda, kEmulated };

// Where tensors go: the host (the default), CUDA GPU `index`, or emulated
// device `index` (the tests' stand-in for a GPU). ParseDevice reads the
// names users give ("cuda:1"); Name() writes them.
struct DeviceId {
  DeviceType type = DeviceType::kCpu;
  int index = 0;

  static DeviceId Cpu() { return {}; }
  static DeviceId Cuda(int index = 0) { return {DeviceType::kCuda, index}; }
  static DeviceId Emulated(int index = 0) { return {DeviceType::kEmulated, index}; }
  bool on_host() const { return type == DeviceType::kCpu; }
  std::string Name() const;  // "cpu", "cuda:N", "emulated:N"
  bool operator==(const DeviceId& other) const = default;
};

// Parses "cpu", "cuda", "cuda:N" (and "emulated[:N]", the test device);
// InvalidArgument for anything else.
Result<DeviceId> ParseDevice(std::string_view name);

struct LoadOptions {
  // kAuto (docs/loading.md, "The auto rule"): per file, a file mostly in the
  // page cache is handed out as views of it (a private mapping, no copy; with
  // `copy`, read into owned memory instead), a file mostly not cached is read
  // with O_DIRECT.
  IoMode mode = IoMode::kAuto;
  // kAuto on the CPU: owned copies of page-cached files instead of views of
  // the page cache (a view sees the file: a later truncation of it faults).
  bool copy = false;
  // Host loads: the tensors' memory is sealed shared memory (a memfd) that a
  // seed hands to other processes on this host instead of copying it
  // (docs/remote.md, "Same-host handover"). Implies `copy`. The tensors are
  // read-only: a write to them faults. Device loads, mode mmap and an
  // arena_pool refuse it (InvalidArgument).
  bool shared_memory = false;
  // Tensors misaligned for their dtype in a file (a header length that is not
  // a multiple of 8 shifts them all): false reads them into aligned memory;
  // true lets mmap mode, and auto's views of cached files, view them where
  // they are, misaligned, as the reference safetensors does (no copy: their
  // data pointer is then not a multiple of the element size). Python's
  // tensorlift.load sets it: torch and numpy take such tensors.
  bool misaligned_views = false;
  IoEngine engine = IoEngine::kAuto;
  int threads = 0;                   // pread threads; 0: a default from the CPU count.
  int queue_depth = 32;              // io_uring reads in flight.
  uint64_t block_size = 8ull << 20;  // The largest single read (rounded to 4 KiB).
  // Threads that fault the destination memory in ahead of the reads
  // (MADV_POPULATE_WRITE); 0: the CPU count, 2 to 4; negative: none, the reads
  // fault it in themselves. See docs/loading.md, "Memory".
  int fault_threads = 0;
  TensorFilter filter;
  ProgressCallback progress;
  // Reuse host memory between loads (see ArenaPool); none: fresh memory.
  std::shared_ptr<ArenaPool> arena_pool;
  // Each tensor as soon as its bytes are in (see TensorCallback); none: only
  // the LoadedCheckpoint at the end.
  TensorCallback on_tensor;

  // Where the tensors go: the host (default) or a GPU (DeviceId::Cuda(N);
  // ParseDevice("cuda:N") from a name). GPU loads read into pinned staging
  // buffers and copy to the device while the next blocks are read
  // (docs/loading.md, "GPU").
  DeviceId device;
  // Convert floating-point tensors (F32, F16, BF16, F8_E4M3, F8_E5M2) to this
  // dtype while loading: on the GPU for GPU loads, on the host otherwise; the
  // others keep their dtype. Supported targets: F32, F16, BF16.
  std::optional<Dtype> dtype;
  // GPU loads (and conversions): pinned staging buffers, count and bytes each
  // (rounded up to 4 KiB): a read in flight per buffer but one, whatever order
  // the reads complete in. 0: a read in flight per CPU (at least 4, at most
  // 16), enough parallel reads to feed the copies from the page cache, with
  // two buffers each, so that reads that complete together never wait for
  // the copies out of their buffers (8 buffers, 128 MiB, on 2 to 4 CPUs; 32,
  // 512 MiB, on 16 or more).
  // The device needs the tensors' bytes plus, when converting, one device
  // slot of this size per staging buffer. Pinned memory is kept for the next
  // load (ReleasePinnedStaging).
  int staging_buffers = 0;
  uint64_t staging_bytes = 16ull << 20;
  // GPUDirect Storage for GPU loads: auto uses it when ready (cuFile, the
  // nvidia-fs driver, a supported filesystem) and falls back to the pinned
  // pipeline, saying why in FileReport::reason, when any piece is missing or
  // fails; off never tries it.
  bool gds = true;
  // Sparse-bitmask checkpoints (compressed-tensors' layout, docs/sparse.md):
  // return each group as its dense tensor, decoded while the other files are
  // read (the filter then applies to the dense names), or, when false, the
  // stored parts (P.compressed, P.bitmask, P.row_offsets, P.shape) as they are.
  bool decode_sparse = true;
  // The content identity (tensorlift/content.h, LoadedCheckpoint::content()).
  // kAuto: computed when the load reads every byte of its tensors into its own
  // memory (host loads, mode buffered or direct, or auto's reads): each 4 MiB
  // piece is hashed by the engine thread whose read completes it, while its
  // bytes are hot in cache (no second pass); not computed when any tensor is a
  // view of the page cache (mmap, auto's cached files), whose bytes the load
  // does not read. kOn: also then, hashing the views in a pass after the
  // reads (which reads them in). kOff: never. Device loads, dtype
  // conversions and decoded sparse checkpoints never compute it (content()
  // is null; kOn there is InvalidArgument).
  ContentHashMode content_hash = ContentHashMode::kAuto;
  // Tensor-parallel ranks (docs/loading.md, "Tensor-parallel slices"): with
  // parallel.size > 1, each tensor that `layout` splits ("REGEX=DIM;...", the
  // first rule whose regex matches in the name wins; docs/remote.md,
  // "Layouts") comes back as this rank's slice along that dim (ShardRange's
  // split, tensorlift/assign.h), packed and row-major; the other tensors come
  // back whole. Only the slices' bytes are read, on every source and device,
  // with every other option; content_hash kOn and sparse decoding of a sparse
  // checkpoint are refused (InvalidArgument), kAuto computes nothing.
  TensorParallel parallel;
  std::string layout;
};

// A loaded tensor: a view over a buffer owned by its LoadedCheckpoint.
struct LoadedTensor {
  std::string name;
  Dtype dtype = Dtype::kU8;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // In elements, row-major.
  void* data = nullptr;          // Aligned to the element size (up to 8); a
                                 // device address unless device is kCpu.
  uint64_t nbytes = 0;
  DeviceType device = DeviceType::kCpu;
  int device_index = 0;
};

// Memory a load needs, computed before anything is read; a load never
// allocates more. Zero for host loads without conversion.
struct DeviceMemoryPlan {
  uint64_t device_bytes = 0;   // Tensors' final buffers on the device.
  uint64_t scratch_bytes = 0;  // Device slots for conversions.
  uint64_t pinned_bytes = 0;   // Pinned staging buffers (host).
};

// What the loader did with one file.
struct FileReport {
  std::string path;
  IoMode mode = IoMode::kBuffered;  // The mode used (never kAuto).
  IoEngine engine = IoEngine::kThreads;
  std::string reason;  // Why this mode, e.g. "92% in page cache".
  uint64_t bytes = 0;  // Bytes of tensors loaded from it.
  uint32_t tensors = 0;
  uint32_t realigned = 0;        // Tensors read or copied on their own to align them,
  uint64_t realigned_bytes = 0;  // and their bytes (never views of the page cache).
  uint32_t converted = 0;        // Tensors converted to LoadOptions::dtype.
  uint32_t decoded = 0;          // Sparse tensors decoded whose values are in it.
  bool gds = false;              // Read straight to the GPU (GPUDirect Storage).
};

class Device;

class LoadedCheckpoint {
 public:
  LoadedCheckpoint();
  ~LoadedCheckpoint();
  LoadedCheckpoint(LoadedCheckpoint&&) noexcept;
  LoadedCheckpoint& operator=(LoadedCheckpoint&&) noexcept;

  // Tensors in name order.
  const std::vector<LoadedTensor>& tensors() const { return tensors_; }
  const LoadedTensor* Find(std::string_view name) const;
  const std::vector<FileReport>& files() const { return files_; }
  uint64_t total_bytes() const { return total_bytes_; }
  double seconds() const { return seconds_; }

  // New DLPack tensors over `name`'s bytes (no copy). The caller owns the
  // result and must call its deleter; the buffer stays alive until then, even
  // after this LoadedCheckpoint is gone. With `raw_bytes` the tensor is the
  // 1-D uint8 array of its bytes (for consumers that lack its dtype, and for
  // bindings that apply their own dtype mapping).
  Result<DLManagedTensorVersioned*> ToDLPackVersioned(std::string_view name,
                                                      bool raw_bytes = false) const;
  Result<DLManagedTensor*> ToDLPack(std::string_view name, bool raw_bytes = false) const;

  // Copies `name`'s bytes (nbytes of them) to host memory at `dst`, from
  // whatever device they are on; NotFound for an unknown name.
  Status CopyToHost(std::string_view name, void* dst) const;

  // Bytes of memory this checkpoint's buffers hold now (on its device).
  uint64_t buffer_bytes() const;
  const DeviceMemoryPlan& device_plan() const { return device_plan_; }
  // The tensors' content identity when the load computed it
  // (LoadOptions::content_hash), else null. Valid while this lives.
  const ContentIdentity* content() const { return content_.get(); }

 private:
  friend class CheckpointBuilder;  // Every load path builds its result through it (src/load/).
  struct Owners;
  std::vector<LoadedTensor> tensors_;
  std::unique_ptr<Owners> owners_;  // One buffer owner per tensor, shared.
  std::vector<FileReport> files_;
  uint64_t total_bytes_ = 0;
  double seconds_ = 0;
  DeviceMemoryPlan device_plan_;
  std::shared_ptr<const ContentIdentity> content_;
};

// Loads the tensors of `checkpoint` that pass options.filter into host memory,
// or onto options.device.
//
// Sources (one rule for every one): a checkpoint opened through a store it
// keeps (Checkpoint::store(): a bucket, OpenObjectStoreCheckpoint) loads
// through this same path, its files planned as local files read buffered and
// their bytes read by the store: dtype, on_tensor, filters, progress, sparse
// decoding, content_hash, arena_pool, shared_memory, copy (always owned
// memory) and a device (the staged pipeline: host memory bounded by the
// staging slots, not by the checkpoint) all work. The options about local
// files' reads (mode other than auto, engine other than auto, threads) are
// refused (InvalidArgument, naming the option), never ignored; gds (on by
// default) lets a store that reads into device memory itself do so (a peer
// pull's, where UCX can write the device's memory;
// CheckpointStore::MakeDirectReader), and off sends its bytes through the
// staging slots; a store without such a reader always uses the slots.
Result<LoadedCheckpoint> Load(const Checkpoint& checkpoint, const LoadOptions& options = {});
// CheckSourceOptions's refusals (the rule above), for loaders built on Load.
Status CheckSourceOptions(const Checkpoint& checkpoint, const LoadOptions& options);
// Opens `path` (file, index or directory) and loads it.
Result<LoadedCheckpoint> Load(const std::string& path, const LoadOptions& options = {});

// GPU loads keep their pinned staging memory for the next load onto the same
// device (at most two buffers a device, the smallest large enough taken), so
// that a second load pays no pinned allocation. This frees what is kept now
// (a load running keeps its own until it ends); the bytes freed. The process's
// end frees the rest. Thread-safe.
uint64_t ReleasePinnedStaging();

}  // namespace tensorlift

#endif  // TENSORLIFT_LOADER_H_
