// Communicators: collectives over byte buffers between the ranks of a job,
// for shuffling tensors after each rank read its share (public API).
//
// Every method is a collective: every rank of the communicator calls it, in
// the same order, with the same `bytes` and `root` (these are checked only
// locally: ranks that disagree are a caller bug and may block). A rank that
// fails before a collective must still take part in the next Agree(), which
// is how an error on one rank (a missing file, a bad file) becomes the same
// error on every rank instead of a hang: call Agree(local_status) after each
// local step that can fail and before the next data collective.
//
// Buffers are borrowed for the duration of the call and must not overlap
// each other. `bytes` is per rank; sizes above INT_MAX are sent in chunks.
//
// Thread safety: a Communicator is used by one thread at a time. Distinct
// communicators may be used from different threads only if the
// implementation says so (the MPI one: no).
#ifndef TENSORLIFT_COMMUNICATOR_H_
#define TENSORLIFT_COMMUNICATOR_H_

#include <cstdint>
#include <memory>

#include "tensorlift/loader.h"  // DeviceType
#include "tensorlift/status.h"

namespace tensorlift {

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // This process's rank, in [0, size()).
  virtual int rank() const = 0;
  // The number of ranks, >= 1.
  virtual int size() const = 0;
  // Where the buffers of Broadcast, Scatter and AllGather live: host memory
  // (MPI, a single process), GPU memory (NCCL), or the emulated device's.
  virtual DeviceType memory() const { return DeviceType::kCpu; }

  // Copies `bytes` bytes of root's `buf` into every other rank's `buf`.
  virtual Status Broadcast(void* buf, uint64_t bytes, int root) = 0;
  // Root's `send` holds size() blocks of `bytes` bytes; rank i receives block
  // i into `recv` (root included). `send` is read only on root (may be null
  // elsewhere).
  virtual Status Scatter(const void* send, void* recv, uint64_t bytes, int root) = 0;
  // Every rank's `bytes` bytes of `send` land, in rank order, in every rank's
  // `recv` (size() * bytes bytes).
  virtual Status AllGather(const void* send, void* recv, uint64_t bytes) = 0;
  // Returns when every rank has entered it.
  virtual Status Barrier() = 0;

  // Every rank passes its local status; every rank returns OK if all were
  // OK, else the status of the lowest failing rank, with its code and its
  // message prefixed by "rank N: ". If the exchange itself fails, returns
  // that error (never OK). Built on AllGather and Broadcast.
  Status Agree(const Status& local);

 protected:
  Communicator() = default;
  // Checks rank/size-independent arguments: root in range, buffers non-null
  // when bytes > 0. `what` names the operation in the message.
  Status CheckArgs(const char* what, const void* a, const void* b, uint64_t bytes, int root) const;
};

// A communicator of one rank: collectives are copies (or nothing).
std::unique_ptr<Communicator> MakeSingleProcessCommunicator();

// True when tensorlift was built with MPI.
bool MpiBuiltIn();
// The MPI library's version ("Open MPI v4.1.4"), without initializing MPI;
// Unimplemented with the reason when built without MPI.
Result<std::string> MpiLibraryVersion();

// The ranks of MPI_COMM_WORLD, through a duplicate of it (tensorlift's
// messages never mix with the caller's) whose MPI errors are returned as
// Status (MPI_ERRORS_RETURN), not fatal. Initializes MPI (threads:
// MPI_THREAD_SERIALIZED) if nobody has, and then finalizes it at process
// exit; an MPI that the caller initialized is left to the caller.
// `max_chunk_bytes` (> 0, at most INT_MAX) bounds each MPI message; tests
// make it small to exercise chunking. Unimplemented when built without MPI.
inline constexpr uint64_t kDefaultMpiChunkBytes = uint64_t{1} << 30;
Result<std::unique_ptr<Communicator>> MakeMpiCommunicator(
    uint64_t max_chunk_bytes = kDefaultMpiChunkBytes);

// True when tensorlift was built with the NCCL communicator (with CUDA and
// nccl.h; the library itself is loaded at run time).
bool NcclBuiltIn();
// Loads libnccl.so.2 (as MakeNcclCommunicator does) and returns its version
// ("2.27.3"); Unavailable with the reason when it cannot be loaded,
// Unimplemented when built without NCCL.
Result<std::string> NcclLibraryVersion();

// Collectives between GPUs with NCCL: the ranks of `bootstrap` (MPI, or
// anything that can broadcast NCCL's 128-byte unique id), each on CUDA
// device `cuda_device`. Buffers are device memory; each call returns once
// the collective is complete on this rank's stream. libnccl.so.2 is loaded
// with dlopen (or $TENSORLIFT_NCCL_LIB). A collective itself on every rank
// of `bootstrap`: a failure on one rank (no GPU, no library) is returned on
// every rank (Agree). Unavailable with the reason when NCCL or the GPU
// cannot be used; Unimplemented when built without NCCL.
Result<std::unique_ptr<Communicator>> MakeNcclCommunicator(Communicator& bootstrap,
                                                           int cuda_device);

}  // namespace tensorlift

#endif  // TENSORLIFT_COMMUNICATOR_H_
