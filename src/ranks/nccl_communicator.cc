// The NCCL communicator: collectives between GPUs, through a dlopen'd
// libnccl.so.2 (nccl.h from the CUDA toolkit for the types only), so that
// tensorlift neither links nor needs NCCL. See communicator.h.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>

#include "common/dynamic_library.h"
#include "tensorlift/communicator.h"

namespace tensorlift {
namespace {

struct NcclApi {
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclCommAbort) comm_abort = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclGetVersion) get_version = nullptr;
  std::string path;  // Where the library was found.
};

// Loads the library once; a failure is tried again next time.
Result<const NcclApi*> LoadNccl() {
  static std::mutex mu;
  static NcclApi api;
  static bool loaded = false;
  std::lock_guard<std::mutex> lock(mu);
  if (loaded) return &api;
  TL_ASSIGN_OR_RETURN(
      DynamicLibrary lib,
      DynamicLibrary::Open("TENSORLIFT_NCCL_LIB", "libnccl.so.2", "NCCL library",
                           " (install NCCL, or set TENSORLIFT_NCCL_LIB to libnccl.so.2's path)"));
  NcclApi a;
  Status st;
  auto sym = [&](auto& fn, const char* symbol) {
    if (st.ok()) st = lib.Symbol(symbol, &fn);
  };
  sym(a.get_unique_id, "ncclGetUniqueId");
  sym(a.comm_init_rank, "ncclCommInitRank");
  sym(a.comm_destroy, "ncclCommDestroy");
  sym(a.comm_abort, "ncclCommAbort");
  sym(a.error_string, "ncclGetErrorString");
  sym(a.broadcast, "ncclBroadcast");
  sym(a.all_gather, "ncclAllGather");
  sym(a.send, "ncclSend");
  sym(a.recv, "ncclRecv");
  sym(a.group_start, "ncclGroupStart");
  sym(a.group_end, "ncclGroupEnd");
  sym(a.get_version, "ncclGetVersion");
  if (!st.ok()) return st.WithContext(lib.name());  // (dlclose'd as lib goes)
  lib.Keep();  // The library stays loaded for the life of the process.
  a.path = DynamicLibrary::Where(reinterpret_cast<const void*>(a.get_version));
  if (a.path.empty()) a.path = lib.name();
  api = a;
  loaded = true;  // The library stays loaded for the life of the process.
  return &api;
}

Status CudaError(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return UnavailableError(std::string(what) + ": " + cudaGetErrorString(err) + " (" +
                          cudaGetErrorName(err) + ")");
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const NcclApi* api, ncclComm_t comm, cudaStream_t stream, int device, int rank,
                   int size)
      : api_(api), comm_(comm), stream_(stream), device_(device), rank_(rank), size_(size) {}
  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    api_->comm_destroy(comm_);
    cudaStreamDestroy(stream_);
    if (scratch_ != nullptr) cudaFree(scratch_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  DeviceType memory() const override { return DeviceType::kCuda; }

  Status Broadcast(void* buf, uint64_t bytes, int root) override {
    TL_RETURN_IF_ERROR(CheckArgs("Broadcast", buf, buf, bytes, root));
    if (bytes == 0) return Status::Ok();
    TL_RETURN_IF_ERROR(Begin());
    TL_RETURN_IF_ERROR(
        Nccl(api_->broadcast(buf, buf, bytes, ncclUint8, root, comm_, stream_), "ncclBroadcast"));
    return End("Broadcast");
  }

  // NCCL has no scatter: grouped point-to-point sends from the root.
  Status Scatter(const void* send, void* recv, uint64_t bytes, int root) override {
    TL_RETURN_IF_ERROR(CheckArgs("Scatter", rank_ == root ? send : recv, recv, bytes, root));
    if (bytes == 0) return Status::Ok();
    TL_RETURN_IF_ERROR(Begin());
    TL_RETURN_IF_ERROR(Nccl(api_->group_start(), "ncclGroupStart"));
    Status st;
    if (rank_ == root) {
      const auto* s = static_cast<const char*>(send);
      for (int r = 0; r < size_ && st.ok(); ++r) {
        if (r != root)
          st = Nccl(api_->send(s + r * bytes, bytes, ncclUint8, r, comm_, stream_), "ncclSend");
      }
    } else {
      st = Nccl(api_->recv(recv, bytes, ncclUint8, root, comm_, stream_), "ncclRecv");
    }
    Status ended = Nccl(api_->group_end(), "ncclGroupEnd");
    TL_RETURN_IF_ERROR(st);
    TL_RETURN_IF_ERROR(ended);
    if (rank_ == root) {
      TL_RETURN_IF_ERROR(
          CudaError(cudaMemcpyAsync(recv, static_cast<const char*>(send) + root * bytes, bytes,
                                    cudaMemcpyDeviceToDevice, stream_),
                    "cudaMemcpyAsync"));
    }
    return End("Scatter");
  }

  Status AllGather(const void* send, void* recv, uint64_t bytes) override {
    TL_RETURN_IF_ERROR(CheckArgs("AllGather", send, recv, bytes, 0));
    if (bytes == 0) return Status::Ok();
    TL_RETURN_IF_ERROR(Begin());
    TL_RETURN_IF_ERROR(
        Nccl(api_->all_gather(send, recv, bytes, ncclUint8, comm_, stream_), "ncclAllGather"));
    return End("AllGather");
  }

  // An all-gather of one byte per rank on a small device buffer.
  Status Barrier() override {
    TL_RETURN_IF_ERROR(Begin());
    if (scratch_ == nullptr) {
      TL_RETURN_IF_ERROR(CudaError(cudaMalloc(&scratch_, 1 + size_), "cudaMalloc"));
    }
    auto* s = static_cast<char*>(scratch_);
    TL_RETURN_IF_ERROR(
        Nccl(api_->all_gather(s, s + 1, 1, ncclUint8, comm_, stream_), "ncclAllGather"));
    return End("Barrier");
  }

 private:
  Status Begin() { return CudaError(cudaSetDevice(device_), "cudaSetDevice"); }
  // Waits for the collective: the buffers are the caller's again.
  Status End(const char* what) {
    return CudaError(cudaStreamSynchronize(stream_),
                     (std::string(what) + ": cudaStreamSynchronize").c_str());
  }
  Status Nccl(ncclResult_t r, const char* what) const {
    if (r == ncclSuccess) return Status::Ok();
    return UnavailableError(std::string(what) + ": " + api_->error_string(r));
  }

  const NcclApi* api_;
  ncclComm_t comm_;
  cudaStream_t stream_;
  int device_;
  int rank_;
  int size_;
  void* scratch_ = nullptr;
};

}  // namespace

bool NcclBuiltIn() { return true; }

Result<std::string> NcclLibraryVersion() {
  TL_ASSIGN_OR_RETURN(const NcclApi* api, LoadNccl());
  int v = 0;
  const ncclResult_t r = api->get_version(&v);
  if (r != ncclSuccess)
    return UnavailableError(std::string("ncclGetVersion: ") + api->error_string(r));
  // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100) + " (" + api->path + ")";
}

Result<std::unique_ptr<Communicator>> MakeNcclCommunicator(Communicator& bootstrap,
                                                           int cuda_device) {
  // Every rank takes part in the same bootstrap collectives whatever fails
  // locally, and calls ncclCommInitRank (itself a collective that waits for
  // every rank) only once all ranks are ready for it.
  Result<const NcclApi*> api = LoadNccl();
  Status st = api.ok() ? CudaError(cudaSetDevice(cuda_device), "cudaSetDevice") : api.status();
  cudaStream_t stream = nullptr;
  if (st.ok())
    st = CudaError(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (st.ok() && bootstrap.rank() == 0) {
    ncclResult_t r = (*api)->get_unique_id(&id);
    if (r != ncclSuccess)
      st = UnavailableError(std::string("ncclGetUniqueId: ") + (*api)->error_string(r));
  }
  Status ready = bootstrap.Agree(st);
  if (ready.ok()) ready = bootstrap.Broadcast(&id, sizeof id, 0);
  if (!ready.ok()) {
    if (stream != nullptr) cudaStreamDestroy(stream);
    return ready;
  }
  ncclComm_t comm = nullptr;
  ncclResult_t r = (*api)->comm_init_rank(&comm, bootstrap.size(), id, bootstrap.rank());
  st = r == ncclSuccess
           ? Status::Ok()
           : UnavailableError(std::string("ncclCommInitRank: ") + (*api)->error_string(r));
  Status agreed = bootstrap.Agree(st);
  if (!agreed.ok()) {
    if (comm != nullptr) (*api)->comm_abort(comm);
    cudaStreamDestroy(stream);
    return agreed;
  }
  return std::unique_ptr<Communicator>(
      new NcclCommunicator(*api, comm, stream, cuda_device, bootstrap.rank(), bootstrap.size()));
}

}  // namespace tensorlift
