// MPI by dlopen (mpi_api.h).
#include "ranks/mpi_api.h"

#include <mutex>
#include <string>
#include <utility>

#include "common/dynamic_library.h"

namespace tensorlift {
namespace {

constexpr const char* kMpiLibEnv = "TENSORLIFT_MPI_LIB";
#ifdef OPEN_MPI
constexpr const char* kDefaultLib = "libmpi.so.40";
constexpr const char* kHint =
    " (install Open MPI: Debian and Ubuntu `apt install openmpi-bin`, Fedora and RHEL `dnf "
    "install openmpi`; or set TENSORLIFT_MPI_LIB to its libmpi.so.40)";
#else
constexpr const char* kDefaultLib = "libmpi.so.12";
constexpr const char* kHint =
    " (install MPICH: Debian and Ubuntu `apt install mpich`; or set TENSORLIFT_MPI_LIB to its "
    "libmpi.so.12)";
#endif

Result<MpiApi> Load() {
  // RTLD_GLOBAL: Open MPI's components (opened by path at MPI_Init) resolve
  // their references to libmpi's symbols in the global scope.
  TL_ASSIGN_OR_RETURN(DynamicLibrary lib,
                      DynamicLibrary::Open(kMpiLibEnv, kDefaultLib, "MPI", kHint, /*global=*/true));
  MpiApi api{};
#define TL_MPI_SYMBOL(field, symbol) TL_RETURN_IF_ERROR(lib.Symbol(#symbol, &api.field))
  TL_MPI_SYMBOL(error_string, MPI_Error_string);
  TL_MPI_SYMBOL(type_free, MPI_Type_free);
  TL_MPI_SYMBOL(type_contiguous, MPI_Type_contiguous);
  TL_MPI_SYMBOL(type_create_resized, MPI_Type_create_resized);
  TL_MPI_SYMBOL(type_commit, MPI_Type_commit);
  TL_MPI_SYMBOL(finalized, MPI_Finalized);
  TL_MPI_SYMBOL(finalize, MPI_Finalize);
  TL_MPI_SYMBOL(initialized, MPI_Initialized);
  TL_MPI_SYMBOL(init_thread, MPI_Init_thread);
  TL_MPI_SYMBOL(comm_free, MPI_Comm_free);
  TL_MPI_SYMBOL(comm_dup, MPI_Comm_dup);
  TL_MPI_SYMBOL(comm_set_errhandler, MPI_Comm_set_errhandler);
  TL_MPI_SYMBOL(comm_rank, MPI_Comm_rank);
  TL_MPI_SYMBOL(comm_size, MPI_Comm_size);
  TL_MPI_SYMBOL(bcast, MPI_Bcast);
  TL_MPI_SYMBOL(scatter, MPI_Scatter);
  TL_MPI_SYMBOL(allgather, MPI_Allgather);
  TL_MPI_SYMBOL(barrier, MPI_Barrier);
  TL_MPI_SYMBOL(get_library_version, MPI_Get_library_version);
#ifdef OPEN_MPI
  TL_MPI_SYMBOL(comm_world, ompi_mpi_comm_world);
  TL_MPI_SYMBOL(comm_null, ompi_mpi_comm_null);
  TL_MPI_SYMBOL(datatype_null, ompi_mpi_datatype_null);
  TL_MPI_SYMBOL(byte, ompi_mpi_byte);
  TL_MPI_SYMBOL(errors_return, ompi_mpi_errors_return);
#endif
#undef TL_MPI_SYMBOL
  api.path = DynamicLibrary::Where(reinterpret_cast<const void*>(api.get_library_version));
  if (api.path.empty()) api.path = lib.name();
  lib.Keep();  // MPI stays in use until the process exits.
  return api;
}

MpiApi g_api{};

}  // namespace

Result<const MpiApi*> LoadMpi() {
  static std::once_flag once;
  static Status status;
  std::call_once(once, [] {
    Result<MpiApi> api = Load();
    if (api.ok()) {
      g_api = std::move(api).value();
    } else {
      status = api.status();
    }
  });
  if (!status.ok()) return status;
  return &g_api;
}

const MpiApi& Mpi() { return g_api; }

}  // namespace tensorlift
