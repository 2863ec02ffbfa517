// The host path of the loader: per file, choose the mode, plan, allocate the
// arena, then run every read of every file on one engine, check that no file
// changed, and hand out views. Used by the loader (loader.cc) and by sparse
// loads (sparse_load.cc), which hook into it.
#ifndef TENSORLIFT_LOAD_HOST_LOAD_H_
#define TENSORLIFT_LOAD_HOST_LOAD_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "io/read_op.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/loader.h"

namespace tensorlift {

class Buffer;

// Wraps each engine the loader makes (fault injection in tests).
using EngineWrapper = std::function<std::unique_ptr<ReadEngine>(std::unique_ptr<ReadEngine>)>;

// The engine for a batch of reads of `ckpt`'s files (host_load.cc, "Engine
// choice"); *chosen says which kind it is. `files`: the opened files by shard
// (the fds the reads use, direct or buffered). A checkpoint opened through a
// store reads through the engine its store makes (CheckpointStore::MakeReadEngine).
Result<std::unique_ptr<ReadEngine>> MakeEngine(const LoadOptions& options, bool direct,
                                               std::span<const ReadOp> ops, IoEngine* chosen,
                                               const Checkpoint& ckpt,
                                               std::vector<EngineFile> files);

// The files of `opened` (indexed by shard) as an engine reads them: each one's
// direct fd or buffered fd, and its path.
template <typename Opened>
std::vector<EngineFile> EngineFiles(const std::vector<Opened>& opened, bool direct) {
  std::vector<EngineFile> files(opened.size());
  for (size_t s = 0; s < opened.size(); ++s) {
    if (opened[s].shard == nullptr) continue;
    files[s] = {direct ? opened[s].direct.fd() : opened[s].buffered.fd(), &opened[s].shard->path};
  }
  return files;
}

// LoadOptions::fault_threads resolved (device/populate.h, FaultThreadCount).
int FaultThreads(const LoadOptions& options);

// What a layer above the host loader (sparse decoding) hooks into a load.
struct HostLoadHooks {
  // Buffers to fault in after the files' arenas, while the reads run.
  std::vector<std::shared_ptr<Buffer>> populate;
  // Called for every selected tensor, once placed and before any read: where
  // its bytes will be.
  std::function<void(Checkpoint::Location, const std::byte* data)> placed;
  // Called once, after `placed` and before any read, with the files' host
  // buffers the tensors are in: what keeps them alive for whoever serves them
  // as they land (a relay, sources/relay.h).
  std::function<void(std::vector<std::shared_ptr<const Buffer>> arenas)> arenas;
  // Called once per shard with selected tensors when all its bytes are in
  // (from an engine thread; for mapped files, when the reads start).
  std::function<void(uint32_t shard)> file_done;
};

// A host load of the tensors options.filter selects (no device, no sparse
// decoding), each engine passed through `wrap` when set.
Result<LoadedCheckpoint> LoadOnHost(const Checkpoint& ckpt, const LoadOptions& options,
                                    const EngineWrapper& wrap,
                                    const HostLoadHooks* hooks = nullptr);

}  // namespace tensorlift

#endif  // TENSORLIFT_LOAD_HOST_LOAD_H_
