// The staged pipeline onto a device (device_pipeline.cc): GPU loads, and
// loads that convert dtypes. Used by the loader, sparse loads through a
// device and the layer streamer's device loads.
#ifndef TENSORLIFT_LOAD_DEVICE_PIPELINE_H_
#define TENSORLIFT_LOAD_DEVICE_PIPELINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "io/direct_reader.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/loader.h"

namespace tensorlift {

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

#endif  // TENSORLIFT_LOAD_DEVICE_PIPELINE_H_
