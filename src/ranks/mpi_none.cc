// Built instead of mpi_communicator.cc when MPI is not found (or is off).
#include "tensorlift/communicator.h"

namespace tensorlift {

bool MpiBuiltIn() { return false; }

Result<std::string> MpiLibraryVersion() {
  return UnimplementedError("built without MPI (" TENSORLIFT_NO_MPI_REASON ")");
}

Result<std::unique_ptr<Communicator>> MakeMpiCommunicator(uint64_t) {
  return UnimplementedError("built without MPI (" TENSORLIFT_NO_MPI_REASON ")");
}

}  // namespace tensorlift
