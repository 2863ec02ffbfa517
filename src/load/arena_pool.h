// The loader's side of ArenaPool (include/tensorlift/loader.h).
#ifndef TENSORLIFT_LOAD_ARENA_POOL_H_
#define TENSORLIFT_LOAD_ARENA_POOL_H_

#include <cstdint>
#include <memory>

#include "device/host_buffer.h"
#include "tensorlift/loader.h"

namespace tensorlift {

// A buffer of `bytes` from `pool` (a fresh one without a pool). Its
// touched() bytes are already faulted in. When its last owner drops it, it
// goes back to the pool if the pool still exists and has room.
Result<std::shared_ptr<HostBuffer>> TakeArena(const std::shared_ptr<ArenaPool>& pool,
                                              uint64_t bytes);

}  // namespace tensorlift

#endif  // TENSORLIFT_LOAD_ARENA_POOL_H_
