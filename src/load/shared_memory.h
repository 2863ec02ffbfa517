// LoadOptions::shared_memory: a load's tensors in sealed shared memory
// (HostBuffer::AllocateShared), which a seed hands to other processes on the
// same host (docs/remote.md, "Same-host handover").
#ifndef TENSORLIFT_LOAD_SHARED_MEMORY_H_
#define TENSORLIFT_LOAD_SHARED_MEMORY_H_

#include <string>

#include "tensorlift/loader.h"
#include "tensorlift/status.h"

namespace tensorlift {

// InvalidArgument, naming the option, for what shared memory cannot serve: a
// device load, mode mmap (views of the file), an arena pool.
Status CheckSharedMemoryOptions(const LoadOptions& options);

// Seals every shared-memory buffer of `loaded` (HostBuffer::Seal) and moves
// the tensors that lie in other host memory into one new sealed buffer
// (named after `name`), so that every tensor is in sealed shared memory.
// kInvalidArgument for device tensors.
Result<LoadedCheckpoint> IntoSharedMemory(LoadedCheckpoint loaded, const std::string& name);

}  // namespace tensorlift

#endif  // TENSORLIFT_LOAD_SHARED_MEMORY_H_
