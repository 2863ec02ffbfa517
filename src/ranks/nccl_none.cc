// Built without NCCL (no CUDA, or no nccl.h): the NCCL communicator says why.
#include "tensorlift/communicator.h"

#ifndef TENSORLIFT_NO_NCCL_REASON
#define TENSORLIFT_NO_NCCL_REASON "unknown reason"
#endif

namespace tensorlift {

bool NcclBuiltIn() { return false; }

Result<std::string> NcclLibraryVersion() {
  return UnimplementedError("built without NCCL (" TENSORLIFT_NO_NCCL_REASON ")");
}

Result<std::unique_ptr<Communicator>> MakeNcclCommunicator(Communicator&, int) {
  return UnimplementedError("built without NCCL (" TENSORLIFT_NO_NCCL_REASON ")");
}

}  // namespace tensorlift
