// Multi-rank loading: each rank reads its balanced share of a
// checkpoint once, then tensors are shuffled to the ranks that ask for them
// with collectives (fastsafetensors' "shuffling", paper section III-B).
//
//   auto comm = tensorlift::MakeMpiCommunicator();
//   auto ckpt = tensorlift::Checkpoint::Open("model_dir");  // on every rank
//   auto dist = tensorlift::LoadDistributed(*ckpt, {}, **comm);
//   auto w = dist->GetSharded("layers.0.w", 0);  // this rank's rows
//
// SPMD contract: every rank of the communicator calls LoadDistributed and then
// GetTensor / GetSharded / Release in the same order with the same arguments
// (names, dims) and the same DistributedOptions except `needed`. Each of these
// calls runs collectives (GetTensor / GetSharded: an Agree on the local
// allocations, then one Broadcast or Scatter); ranks that call them
// differently are a caller bug and may block. GetShardedByRead has no
// collective but is still called in that order (it counts as a hand-out);
// Release(), bytes_read() and buffer_bytes() are local.
//
// Errors: LoadDistributed agrees on its result (Communicator::Agree), so a rank
// that cannot read its share (a missing or changed file) makes every rank fail
// with that rank's message, never a hang. After a successful load, Get* errors
// (unknown name, bad dim, a released buffer) depend only on state that every
// rank shares, so every rank returns the same error without communication.
//
// Memory: each rank holds the buffers of the pieces it read, one per file. A
// reader drops its buffer of a file once every needed tensor it read from that
// file has been handed out (GetTensor, GetSharded or GetShardedByRead, counted
// once per tensor), unless DistributedOptions::keep_buffers; Release() drops
// all. Asking again for a tensor whose buffer was dropped is an
// InvalidArgument error on every rank. Returned HostTensors own their bytes;
// returned DeviceTensors share theirs (DeviceTensor::owner).
//
// Devices: with LoadOptions::device "cuda:N" each rank loads its share into
// its GPU and DistributedOptions::device_comm (NCCL) moves the tensors; the
// GetDevice* forms return them in device memory. See DistributedOptions.
//
// Thread safety: a DistributedCheckpoint is used by one thread at a time (it
// drives its communicator).
#ifndef TENSORLIFT_DISTRIBUTED_H_
#define TENSORLIFT_DISTRIBUTED_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tensorlift/assign.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/communicator.h"
#include "tensorlift/dtype.h"
#include "tensorlift/loader.h"
#include "tensorlift/status.h"

namespace tensorlift {

// A tensor in host memory that owns its bytes (aligned to 16 bytes).
struct HostTensor {
  std::string name;
  Dtype dtype = Dtype::kU8;
  std::vector<uint64_t> shape;
  std::unique_ptr<std::byte[]> data;  // nbytes bytes; null when nbytes == 0.
  uint64_t nbytes = 0;

  std::span<const std::byte> bytes() const { return {data.get(), static_cast<size_t>(nbytes)}; }
};

class Device;

// A tensor in the memory of the device a distributed load went to
// (LoadOptions::device): a device address, never to be dereferenced by host
// code. `owner` keeps the bytes alive; copies of a DeviceTensor share them.
struct DeviceTensor {
  std::string name;
  Dtype dtype = Dtype::kU8;
  std::vector<uint64_t> shape;
  void* data = nullptr;  // nbytes bytes of device memory; null when nbytes == 0.
  uint64_t nbytes = 0;
  DeviceType device = DeviceType::kCuda;
  int device_index = 0;
  std::shared_ptr<Buffer> owner;
  std::shared_ptr<Device> on;  // The device that holds them (opaque here).

  // A copy of the bytes in host memory (waits for the copy).
  Result<HostTensor> ToHost() const;
  // A DLPack tensor over the bytes (no copy) that keeps them alive on its own
  // (the caller calls its deleter); raw_bytes: the 1-D uint8 array of them.
  Result<DLManagedTensorVersioned*> ToDLPackVersioned(bool raw_bytes = false) const;
};

// How GetSharded(name, 0) moves the rows of a tensor declared in
// DistributedOptions::dim0_sharded. Rows can be scattered by the rank that
// read the whole tensor during the load, or each rank can pread its own rows
// from the file when asked (the tensor is then not read during the load: the
// bytes read over all ranks stay the tensor's size, with no collective).
enum class Dim0Mode : uint8_t {
  kScatter,  // Always scatter from the reader.
  kRead,     // Every declared tensor is read per rank.
  kAuto,     // Declared tensors larger than dim0_read_threshold are read per rank.
};

// Declared tensors larger than this are read per rank under kAuto. 0 (all of
// them): bench/dist/sharded_bench.cc found per-rank reads 1.5-4x as fast as
// read-then-scatter at every size from 4 KiB to 64 MiB, cold and warm, with 2
// and 4 ranks on one machine (docs/performance-dist.md, "Scatter or read").
// Where reads are dear and the interconnect cheap (a slow shared filesystem,
// NCCL over NVLink), a larger threshold keeps tensors in the batched load.
inline constexpr uint64_t kDefaultDim0ReadThreshold = 0;

struct DistributedOptions {
  // The tensors THIS rank needs (default: all). A tensor is loaded when it
  // passes LoadOptions::filter and some rank needs it; tensors no rank needs
  // are read by nobody, and the read work is balanced over the needed ones.
  TensorFilter needed;
  // The tensors this rank will take with GetSharded(name, 0) (default:
  // none). Declaring them lets the load skip the ones read per rank (see
  // Dim0Mode); a tensor declared by any rank counts as declared on all.
  TensorFilter dim0_sharded = TensorFilter::Names({});
  Dim0Mode dim0 = Dim0Mode::kAuto;
  uint64_t dim0_read_threshold = kDefaultDim0ReadThreshold;
  // Keep every reader's buffers until Release() (tensors may be asked for
  // again). Default: drop a file's buffer once its tensors were handed out.
  bool keep_buffers = false;
  AssignOptions assign;
  // Loads onto a device (LoadOptions::device "cuda:N", or "emulated:0" in
  // tests): the communicator that moves tensors between the ranks' device
  // buffers (NCCL; an in-process one over the same device), with the ranks
  // of LoadDistributed's `comm` in the same order. `comm` still carries the
  // small host-memory exchanges (headers, needs, Agree). Not owned; must
  // outlive the result. Must be null for host loads.
  Communicator* device_comm = nullptr;
};

class DistributedCheckpoint {
 public:
  DistributedCheckpoint(DistributedCheckpoint&&) noexcept;
  DistributedCheckpoint& operator=(DistributedCheckpoint&&) noexcept;
  ~DistributedCheckpoint();

  int rank() const;
  int world() const;

  // The whole tensor on every rank, broadcast from the rank that read it (a
  // tensor left for per-rank reads is read whole by every rank).
  // NotFound when no rank loaded `name` (unknown, filtered out, or needed by
  // no rank); InvalidArgument when its buffer was already dropped.
  Result<HostTensor> GetTensor(std::string_view name);

  // This rank's slice of `name` along `dim`: with block = ceil(size / world)
  // (size = shape[dim]), rank r gets [r*block, min((r+1)*block, size)),
  // possibly empty; the returned shape has that extent at `dim`. The reader
  // scatters equal, padded blocks (for dim > 0 it packs each rank's strided
  // slice contiguously first). A tensor chosen for per-rank reads at load
  // time (DistributedOptions::dim0) is read by each rank instead: its rows
  // for dim 0, the whole tensor otherwise; the ranks then Agree on the
  // reads' result.
  // dim -1 is GetTensor. A dim outside [-1, ndim) is InvalidArgument, as is
  // slicing a sub-byte dtype where a slice would not start on a byte.
  Result<HostTensor> GetSharded(std::string_view name, int dim);

  // This rank's rows of `name` (dim 0, the rule of GetSharded), pread straight
  // from the tensor's file by this rank: no collective, so errors are local
  // (call Agree if every rank must see them). All ranks must see the same
  // files (e.g. a shared filesystem); a file changed since its header was read
  // is an error. Counts as handing the tensor out (see Memory above).
  Result<HostTensor> GetShardedByRead(std::string_view name);

  // Loads onto a device: GetTensor, GetSharded and GetShardedByRead with
  // the result in this rank's device memory (the reader's bytes are copied on
  // the device and moved with DistributedOptions::device_comm; per-rank reads
  // are read into host memory and copied up). The host forms above refuse a
  // device load and these a host load (InvalidArgument, on every rank).
  Result<DeviceTensor> GetDeviceTensor(std::string_view name);
  Result<DeviceTensor> GetDeviceSharded(std::string_view name, int dim);
  Result<DeviceTensor> GetDeviceShardedByRead(std::string_view name);
  // Where the tensors go: kCpu for a host load.
  DeviceType device() const;

  // Drops every buffer; later Get* calls of loaded tensors fail. Local.
  void Release();

  // Bytes this rank read from files: its share of the load plus what it
  // read itself afterwards (GetShardedByRead, tensors left for per-rank
  // reads).
  uint64_t bytes_read() const;
  // Bytes this rank's share of the load alone (fixed after the load).
  uint64_t load_bytes() const;
  // Bytes of the buffers this rank holds now.
  uint64_t buffer_bytes() const;
  // The assignment of the read work (the same on every rank).
  const Assignment& assignment() const;
  // Names of the loaded tensors (needed by some rank), in name order,
  // including those left for per-rank reads.
  std::vector<std::string> loaded_names() const;
  // Names of the tensors left for per-rank reads (Dim0Mode), in name order.
  std::vector<std::string> per_rank_read_names() const;

 private:
  friend Result<DistributedCheckpoint> LoadDistributed(const Checkpoint&, const LoadOptions&,
                                                       Communicator&, const DistributedOptions&);
  struct State;
  explicit DistributedCheckpoint(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// Loads `ckpt` across the ranks of `comm`, into host memory, or into each
// rank's device memory when options.device names one (then
// dopts.device_comm moves the tensors; see DistributedOptions).
// options.dtype must be unset. Every rank opens the same checkpoint
// (the ranks check that their headers agree), exchanges which tensors it
// needs, computes the same AssignByBytes over the needed ones, and loads only
// its pieces with `options`. The checkpoint must outlive the result.
Result<DistributedCheckpoint> LoadDistributed(const Checkpoint& ckpt, const LoadOptions& options,
                                              Communicator& comm,
                                              const DistributedOptions& dopts = {});

}  // namespace tensorlift

#endif  // TENSORLIFT_DISTRIBUTED_H_
