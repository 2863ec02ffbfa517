// The MPI communicator (built when mpi.h is found; mpi_none.cc otherwise). MPI
// itself is opened at run time (ranks/mpi_api.h): every MPI call below goes
// through the table LoadMpi fills.
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>

#include "ranks/mpi_api.h"
#include "tensorlift/communicator.h"

namespace tensorlift {
namespace {

// "MPI_Bcast: <MPI's error string>".
Status MpiStatus(const char* what, int rc) {
  if (rc == MPI_SUCCESS) return Status::Ok();
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) {
    std::snprintf(text, sizeof(text), "MPI error %d", rc);
  }
  return Status(StatusCode::kUnavailable, std::string(what) + ": " + text);
}

#define TL_MPI_RETURN_IF_ERROR(call) TL_RETURN_IF_ERROR(MpiStatus(#call, (call)))

// A datatype of `count` bytes whose extent is `stride`: consecutive elements
// are `stride` bytes apart (rank i's block of a scatter / gather buffer).
class StridedBytes {
 public:
  StridedBytes() = default;
  ~StridedBytes() {
    if (type_ != MPI_DATATYPE_NULL) MPI_Type_free(&type_);
  }
  StridedBytes(const StridedBytes&) = delete;
  StridedBytes& operator=(const StridedBytes&) = delete;

  Status Init(int count, uint64_t stride) {
    MPI_Datatype block = MPI_DATATYPE_NULL;
    TL_MPI_RETURN_IF_ERROR(MPI_Type_contiguous(count, MPI_BYTE, &block));
    const int rc = MPI_Type_create_resized(block, 0, static_cast<MPI_Aint>(stride), &type_);
    MPI_Type_free(&block);
    TL_RETURN_IF_ERROR(MpiStatus("MPI_Type_create_resized", rc));
    return MpiStatus("MPI_Type_commit", MPI_Type_commit(&type_));
  }
  MPI_Datatype get() const { return type_; }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

// Set when tensorlift called MPI_Init_thread: it then finalizes at exit.
void FinalizeAtExit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

Status EnsureMpiInitialized() {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  int initialized = 0;
  TL_MPI_RETURN_IF_ERROR(MPI_Initialized(&initialized));
  if (initialized) {
    int finalized = 0;
    TL_MPI_RETURN_IF_ERROR(MPI_Finalized(&finalized));
    if (finalized) return Status(StatusCode::kUnavailable, "MPI was already finalized");
    return Status::Ok();
  }
  int provided = 0;
  TL_MPI_RETURN_IF_ERROR(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided));
  std::atexit(FinalizeAtExit);
  return Status::Ok();
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, int rank, int size, uint64_t chunk)
      : comm_(comm), rank_(rank), size_(size), chunk_(chunk) {}
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Status Broadcast(void* buf, uint64_t bytes, int root) override {
    TL_RETURN_IF_ERROR(CheckArgs("Broadcast", buf, buf, bytes, root));
    auto* p = static_cast<char*>(buf);
    for (uint64_t off = 0; off < bytes; off += chunk_) {
      const int n = static_cast<int>(std::min(chunk_, bytes - off));
      TL_MPI_RETURN_IF_ERROR(MPI_Bcast(p + off, n, MPI_BYTE, root, comm_));
    }
    return Status::Ok();
  }

  Status Scatter(const void* send, void* recv, uint64_t bytes, int root) override {
    TL_RETURN_IF_ERROR(CheckArgs("Scatter", rank_ == root ? send : recv, recv, bytes, root));
    TL_RETURN_IF_ERROR(CheckTotal("Scatter", bytes));
    const auto* s = static_cast<const char*>(send);
    auto* r = static_cast<char*>(recv);
    for (uint64_t off = 0; off < bytes; off += chunk_) {
      const int n = static_cast<int>(std::min(chunk_, bytes - off));
      StridedBytes block;
      TL_RETURN_IF_ERROR(block.Init(n, bytes));
      TL_MPI_RETURN_IF_ERROR(MPI_Scatter(rank_ == root ? s + off : nullptr, 1, block.get(), r + off,
                                         n, MPI_BYTE, root, comm_));
    }
    return Status::Ok();
  }

  Status AllGather(const void* send, void* recv, uint64_t bytes) override {
    TL_RETURN_IF_ERROR(CheckArgs("AllGather", send, recv, bytes, 0));
    TL_RETURN_IF_ERROR(CheckTotal("AllGather", bytes));
    const auto* s = static_cast<const char*>(send);
    auto* r = static_cast<char*>(recv);
    for (uint64_t off = 0; off < bytes; off += chunk_) {
      const int n = static_cast<int>(std::min(chunk_, bytes - off));
      StridedBytes block;
      TL_RETURN_IF_ERROR(block.Init(n, bytes));
      TL_MPI_RETURN_IF_ERROR(MPI_Allgather(s + off, n, MPI_BYTE, r + off, 1, block.get(), comm_));
    }
    return Status::Ok();
  }

  Status Barrier() override {
    TL_MPI_RETURN_IF_ERROR(MPI_Barrier(comm_));
    return Status::Ok();
  }

 private:
  // size() * bytes must fit in a pointer difference (MPI_Aint).
  Status CheckTotal(const char* what, uint64_t bytes) const {
    if (bytes > static_cast<uint64_t>(INT64_MAX) / static_cast<uint64_t>(size_)) {
      return InvalidArgumentError(std::string(what) + ": " + std::to_string(bytes) +
                                  " bytes per rank x " + std::to_string(size_) +
                                  " ranks overflows");
    }
    return Status::Ok();
  }

  MPI_Comm comm_;
  int rank_;
  int size_;
  uint64_t chunk_;
};

}  // namespace

bool MpiBuiltIn() { return true; }

Result<std::string> MpiLibraryVersion() {
  TL_ASSIGN_OR_RETURN(const MpiApi* api, LoadMpi());
  // One of the few MPI calls allowed before MPI_Init.
  char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  if (MPI_Get_library_version(version, &len) != MPI_SUCCESS) {
    return InternalError("MPI_Get_library_version failed");
  }
  std::string v(version, static_cast<size_t>(std::max(len, 0)));
  // Open MPI's is "Open MPI v4.1.4, package: ..., ident: ..., repo rev: ...".
  if (const size_t comma = v.find(','); comma != std::string::npos) v.resize(comma);
  while (!v.empty() && (v.back() == '\n' || v.back() == ' ')) v.pop_back();
  return v + " (" + api->path + ")";
}

Result<std::unique_ptr<Communicator>> MakeMpiCommunicator(uint64_t max_chunk_bytes) {
  if (max_chunk_bytes == 0 || max_chunk_bytes > static_cast<uint64_t>(INT_MAX)) {
    return InvalidArgumentError("MPI chunk size " + std::to_string(max_chunk_bytes) +
                                " is not in [1, INT_MAX]");
  }
  TL_RETURN_IF_ERROR(LoadMpi().status());
  TL_RETURN_IF_ERROR(EnsureMpiInitialized());
  MPI_Comm comm = MPI_COMM_NULL;
  TL_MPI_RETURN_IF_ERROR(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  // From here on errors on `comm` are returned, not fatal.
  int rc = MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  int rank = 0;
  int size = 0;
  if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(comm, &rank);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_size(comm, &size);
  if (rc != MPI_SUCCESS) {
    MPI_Comm_free(&comm);
    return MpiStatus("MPI communicator setup", rc);
  }
  return std::unique_ptr<Communicator>(
      std::make_unique<MpiCommunicator>(comm, rank, size, max_chunk_bytes));
}

}  // namespace tensorlift
