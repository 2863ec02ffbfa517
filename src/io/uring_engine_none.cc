// Built instead of uring_engine.cc when liburing is not found.
#include "io/read_op.h"

namespace tensorlift {

bool UringBuiltIn() { return false; }

Result<std::unique_ptr<ReadEngine>> MakeUringEngine(int, std::vector<EngineFile>) {
  return UnimplementedError("built without io_uring (liburing was not found at build time)");
}

}  // namespace tensorlift
