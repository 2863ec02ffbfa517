// MPI, opened at run time (dlopen) rather than linked: a wheel carries no MPI
// (Open MPI does not survive being grafted: its components are found by path),
// and `import tensorlift` or a disk load must not need one. mpi_communicator.cc
// is written against mpi.h as usual; this header, included after mpi.h, points
// each MPI call it makes, and Open MPI's predefined handles (MPI_COMM_WORLD,
// MPI_BYTE, ...: addresses of objects in libmpi), at the table LoadMpi fills.
//
// The library: $TENSORLIFT_MPI_LIB, else the soname of the implementation
// whose mpi.h this was built with (Open MPI's libmpi.so.40, MPICH's
// libmpi.so.12), opened RTLD_GLOBAL, as Open MPI's own components need.
#ifndef TENSORLIFT_RANKS_MPI_API_H_
#define TENSORLIFT_RANKS_MPI_API_H_

#include <mpi.h>

#include <string>

#include "tensorlift/status.h"

namespace tensorlift {

struct MpiApi {
  decltype(&::MPI_Error_string) error_string;
  decltype(&::MPI_Type_free) type_free;
  decltype(&::MPI_Type_contiguous) type_contiguous;
  decltype(&::MPI_Type_create_resized) type_create_resized;
  decltype(&::MPI_Type_commit) type_commit;
  decltype(&::MPI_Finalized) finalized;
  decltype(&::MPI_Finalize) finalize;
  decltype(&::MPI_Initialized) initialized;
  decltype(&::MPI_Init_thread) init_thread;
  decltype(&::MPI_Comm_free) comm_free;
  decltype(&::MPI_Comm_dup) comm_dup;
  decltype(&::MPI_Comm_set_errhandler) comm_set_errhandler;
  decltype(&::MPI_Comm_rank) comm_rank;
  decltype(&::MPI_Comm_size) comm_size;
  decltype(&::MPI_Bcast) bcast;
  decltype(&::MPI_Scatter) scatter;
  decltype(&::MPI_Allgather) allgather;
  decltype(&::MPI_Barrier) barrier;
  decltype(&::MPI_Get_library_version) get_library_version;
#ifdef OPEN_MPI
  // Open MPI's predefined handles are the addresses of these objects.
  void* comm_world;
  void* comm_null;
  void* datatype_null;
  void* byte;
  void* errors_return;
#endif
  std::string path;  // The library that was opened.
};

// Opens MPI once per process (later calls return the first result):
// Unavailable, saying what to install, when it is not found.
Result<const MpiApi*> LoadMpi();

// The table; only after LoadMpi succeeded.
const MpiApi& Mpi();

}  // namespace tensorlift

#define MPI_Error_string(...) ::tensorlift::Mpi().error_string(__VA_ARGS__)
#define MPI_Type_free(...) ::tensorlift::Mpi().type_free(__VA_ARGS__)
#define MPI_Type_contiguous(...) ::tensorlift::Mpi().type_contiguous(__VA_ARGS__)
#define MPI_Type_create_resized(...) ::tensorlift::Mpi().type_create_resized(__VA_ARGS__)
#define MPI_Type_commit(...) ::tensorlift::Mpi().type_commit(__VA_ARGS__)
#define MPI_Finalized(...) ::tensorlift::Mpi().finalized(__VA_ARGS__)
#define MPI_Finalize(...) ::tensorlift::Mpi().finalize(__VA_ARGS__)
#define MPI_Initialized(...) ::tensorlift::Mpi().initialized(__VA_ARGS__)
#define MPI_Init_thread(...) ::tensorlift::Mpi().init_thread(__VA_ARGS__)
#define MPI_Comm_free(...) ::tensorlift::Mpi().comm_free(__VA_ARGS__)
#define MPI_Comm_dup(...) ::tensorlift::Mpi().comm_dup(__VA_ARGS__)
#define MPI_Comm_set_errhandler(...) ::tensorlift::Mpi().comm_set_errhandler(__VA_ARGS__)
#define MPI_Comm_rank(...) ::tensorlift::Mpi().comm_rank(__VA_ARGS__)
#define MPI_Comm_size(...) ::tensorlift::Mpi().comm_size(__VA_ARGS__)
#define MPI_Bcast(...) ::tensorlift::Mpi().bcast(__VA_ARGS__)
#define MPI_Scatter(...) ::tensorlift::Mpi().scatter(__VA_ARGS__)
#define MPI_Allgather(...) ::tensorlift::Mpi().allgather(__VA_ARGS__)
#define MPI_Barrier(...) ::tensorlift::Mpi().barrier(__VA_ARGS__)
#define MPI_Get_library_version(...) ::tensorlift::Mpi().get_library_version(__VA_ARGS__)
#ifdef OPEN_MPI
#undef MPI_COMM_WORLD
#undef MPI_COMM_NULL
#undef MPI_DATATYPE_NULL
#undef MPI_BYTE
#undef MPI_ERRORS_RETURN
#define MPI_COMM_WORLD (static_cast<MPI_Comm>(::tensorlift::Mpi().comm_world))
#define MPI_COMM_NULL (static_cast<MPI_Comm>(::tensorlift::Mpi().comm_null))
#define MPI_DATATYPE_NULL (static_cast<MPI_Datatype>(::tensorlift::Mpi().datatype_null))
#define MPI_BYTE (static_cast<MPI_Datatype>(::tensorlift::Mpi().byte))
#define MPI_ERRORS_RETURN (static_cast<MPI_Errhandler>(::tensorlift::Mpi().errors_return))
#endif

#endif  // TENSORLIFT_RANKS_MPI_API_H_
