// Internal entry points of the loader, for tests.
#ifndef TENSORLIFT_LOAD_LOADER_INTERNAL_H_
#define TENSORLIFT_LOAD_LOADER_INTERNAL_H_

#include <functional>
#include <memory>
#include <vector>

#include "device/populate.h"
#include "io/direct_reader.h"
#include "io/read_op.h"
#include "load/checkpoint_builder.h"
#include "tensorlift/loader.h"

namespace tensorlift {

// Wraps each engine the loader makes (fault injection in tests).
using EngineWrapper = std::function<std::unique_ptr<ReadEngine>(std::unique_ptr<ReadEngine>)>;

class Buffer;
class HostBuffer;
namespace sparse {
struct SparseTensor;
}  // namespace sparse

// The engine for a batch of reads (loader.cc, "Engine choice"); *chosen says
// which kind it is.
Result<std::unique_ptr<ReadEngine>> MakeEngine(const LoadOptions& options, bool direct,
                                               std::span<const ReadOp> ops, IoEngine* chosen);

// LoadOptions::fault_threads resolved (device/populate.h, FaultThreadCount).
int FaultThreads(const LoadOptions& options);

// What a layer above the host loader (sparse decoding) hooks into a load.
struct HostLoadHooks {
  // Buffers to fault in after the files' arenas, while the reads run.
  std::vector<std::shared_ptr<Buffer>> populate;
  // Called for every selected tensor, once placed and before any read: where
  // its bytes will be.
  std::function<void(Checkpoint::Location, const std::byte* data)> placed;
  // Called once per shard with selected tensors when all its bytes are in
  // (from an engine thread; for mapped files, when the reads start).
  std::function<void(uint32_t shard)> file_done;
};

class LoaderImpl {
 public:
  static Result<LoadedCheckpoint> Run(const Checkpoint& ckpt, const LoadOptions& options,
                                      const EngineWrapper& wrap,
                                      const HostLoadHooks* hooks = nullptr);
  // on_tensor for every tensor of a complete load, in name order.
  static Status HandOutAll(const LoadedCheckpoint& loaded, const TensorCallback& on_tensor);
  // A host load of a checkpoint with sparse-bitmask groups: the stored parts
  // are read, each group is decoded into its dense tensor as soon as its files
  // are in, and the parts' memory is given back (sparse_load.cc).
  static Result<LoadedCheckpoint> RunSparse(const Checkpoint& ckpt, const LoadOptions& options,
                                            const EngineWrapper& wrap);
  // What a sparse load reads and where it decodes (sparse_load.cc).
  struct Selection;
  // Where a group was decoded.
  struct DecodedTensor {
    std::byte* data;
    Dtype dtype;
    uint64_t nbytes;
    DeviceType device;
    int device_index;
  };
  // The loaded plain tensors of `in` with the decoded groups (owned by
  // `owner`); the parts' host arenas are given back.
  static CheckpointBuilder Assemble(const Checkpoint& ckpt, CheckpointBuilder in,
                                    const std::vector<const sparse::SparseTensor*>& groups,
                                    const std::vector<DecodedTensor>& decoded,
                                    const std::shared_ptr<Buffer>& owner);

 private:
  static Result<CheckpointBuilder> RunSparseMapped(const Checkpoint& ckpt,
                                                   const LoadOptions& options,
                                                   const EngineWrapper& wrap, const Selection& sel,
                                                   const std::shared_ptr<HostBuffer>& dense);
  static Result<CheckpointBuilder> RunSparseStaged(const Checkpoint& ckpt,
                                                   const LoadOptions& options,
                                                   const EngineWrapper& wrap, const Selection& sel,
                                                   const std::shared_ptr<HostBuffer>& dense);
};

Result<LoadedCheckpoint> LoadWithEngineWrapper(const Checkpoint& checkpoint,
                                               const LoadOptions& options,
                                               const EngineWrapper& wrap);

class Device;

// When each block of a staged load was read and copied: microseconds on the
// steady clock (the emulated device's events use the same clock).
struct PipelineTrace {
  struct Block {
    double read_start_us = 0;
    double read_end_us = 0;
    double copied_us = 0;   // Its copies (and conversions) completed.
    int slot = -1;          // The staging (and conversion) slot it went through.
    int64_t enqueued = -1;  // Its copies were the enqueued-th block's enqueued.
    int stream = -1;        // The stream they were enqueued on.
    bool cached = false;    // Read through the page cache (not O_DIRECT, not GDS).
  };
  std::vector<Block> blocks;  // In load order.
  // Called by a reader thread before it reads block k (fault injection).
  std::function<Status(int64_t k)> before_read;
  // Replaces cuFile (OpenCuFileReader) as the direct-to-device reader (tests;
  // with any device).
  std::function<Result<std::unique_ptr<DirectReader>>()> open_direct_reader;
};

// Whether `ckpt` has tensors named like sparse-bitmask parts (cheap; the
// catalog itself is sparse::FindSparse).
bool MayBeSparse(const Checkpoint& ckpt);

// A sparse checkpoint onto `device`: the parts through the staged pipeline,
// validated on the host, decoded on the device (sparse_load.cc).
Result<LoadedCheckpoint> LoadSparseThroughDevice(const Checkpoint& checkpoint,
                                                 const LoadOptions& options,
                                                 const std::shared_ptr<Device>& device);

// The staging slots of a GPU load: LoadOptions::staging_buffers, or for 0
// two per reader (StagingReaders).
int StagingSlots(const LoadOptions& options);

// The reader threads (reads in flight) of a GPU load with `slots` staging
// slots: for staging_buffers N, N - 1 (a spare slot); for 0, one per CPU (4
// to 16) with a spare slot each: reads that complete together (a virtual
// disk completes them in batches) all find a slot free while theirs are copied
// from, so the disk never waits for the copies.
int StagingReaders(const LoadOptions& options, int slots);

// The staged pipeline (device_pipeline.cc) onto `device`, with a trace.
Result<LoadedCheckpoint> LoadThroughDevice(const Checkpoint& checkpoint, const LoadOptions& options,
                                           const std::shared_ptr<Device>& device,
                                           PipelineTrace* trace);

}  // namespace tensorlift

#endif  // TENSORLIFT_LOAD_LOADER_INTERNAL_H_
