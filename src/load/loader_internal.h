// Internal entry points of the loader, for tests.
#ifndef TENSORLIFT_LOAD_LOADER_INTERNAL_H_
#define TENSORLIFT_LOAD_LOADER_INTERNAL_H_

#include <functional>
#include <memory>

#include "io/read_op.h"
#include "tensorlift/loader.h"

namespace tensorlift {

// Wraps each engine the loader makes (fault injection in tests).
using EngineWrapper = std::function<std::unique_ptr<ReadEngine>(std::unique_ptr<ReadEngine>)>;

Result<LoadedCheckpoint> LoadWithEngineWrapper(const Checkpoint& checkpoint, const LoadOptions& options,
                                               const EngineWrapper& wrap);

}  // namespace tensorlift

#endif  // TENSORLIFT_LOAD_LOADER_INTERNAL_H_
