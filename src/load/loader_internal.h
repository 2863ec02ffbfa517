// Internal entry points of the loader, for tests.
#ifndef TENSORLIFT_LOAD_LOADER_INTERNAL_H_
#define TENSORLIFT_LOAD_LOADER_INTERNAL_H_

#include <functional>
#include <memory>

#include <vector>

#include "io/read_op.h"
#include "tensorlift/loader.h"

namespace tensorlift {

// Wraps each engine the loader makes (fault injection in tests).
using EngineWrapper = std::function<std::unique_ptr<ReadEngine>(std::unique_ptr<ReadEngine>)>;

Result<LoadedCheckpoint> LoadWithEngineWrapper(const Checkpoint& checkpoint, const LoadOptions& options,
                                               const EngineWrapper& wrap);

class Device;

// Reads file bytes straight into device memory (GPUDirect Storage); the GPU
// pipeline's alternative to pinned staging. The cuFile implementation is in
// device_pipeline.cc; tests give their own.
class DirectReader {
 public:
  virtual ~DirectReader() = default;
  // Prepares file number `file` (open as `fd`) for Read(). A failure means:
  // not this way for this load (the pipeline falls back to staging).
  virtual Status AddFile(uint32_t file, int fd) = 0;
  // Registers a device buffer the reads will land in (optional; faster).
  virtual Status AddBuffer(std::byte* device_base, uint64_t bytes) = 0;
  // Reads `bytes` at `file_offset` of file `file` into device memory
  // `device_base` + `offset`; all of them or an error. Thread-safe.
  virtual Status Read(uint32_t file, std::byte* device_base, uint64_t offset, uint64_t bytes,
                      uint64_t file_offset) = 0;
};

// When each block of a staged load was read and copied: microseconds on the
// steady clock (the emulated device's events use the same clock).
struct PipelineTrace {
  struct Block {
    double read_start_us = 0;
    double read_end_us = 0;
    double copied_us = 0;  // Its copies (and conversions) completed.
  };
  std::vector<Block> blocks;  // In load order.
  // Called by a reader thread before it reads block k (fault injection).
  std::function<Status(int64_t k)> before_read;
  // Replaces cuFile as the direct-to-device reader (tests; with any device).
  std::function<Result<std::unique_ptr<DirectReader>>()> open_direct_reader;
};

// The staged pipeline (device_pipeline.cc) onto `device`, with a trace.
Result<LoadedCheckpoint> LoadThroughDevice(const Checkpoint& checkpoint, const LoadOptions& options,
                                           const std::shared_ptr<Device>& device, PipelineTrace* trace);

}  // namespace tensorlift

#endif  // TENSORLIFT_LOAD_LOADER_INTERNAL_H_
