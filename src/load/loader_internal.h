// Internal entry points of the loader (loader.cc), for tests.
#ifndef TENSORLIFT_LOAD_LOADER_INTERNAL_H_
#define TENSORLIFT_LOAD_LOADER_INTERNAL_H_

#include "load/host_load.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/loader.h"

namespace tensorlift {

// Load (without LoadOptions::device or shared_memory) with each read engine
// passed through `wrap`: the host path, or a host load of a sparse checkpoint.
Result<LoadedCheckpoint> LoadWithEngineWrapper(const Checkpoint& checkpoint,
                                               const LoadOptions& options,
                                               const EngineWrapper& wrap);

}  // namespace tensorlift

#endif  // TENSORLIFT_LOAD_LOADER_INTERNAL_H_
