// The device layer: the memory, streams, events and load kernels of one
// accelerator, as the loader's GPU pipeline uses them. No CUDA header here:
// callers see only this interface.
//
// Three implementations:
// - CUDA (src/device/cuda/, built when nvcc is found): cudaMalloc'd device
//   memory, cudaHostAlloc'd pinned memory, one cudaStream_t per stream, the
//   kernels over convert.h. Every CUDA error becomes a Status in one place.
// - The host-emulated device (emulated_device.cc), for tests on machines without
//   a GPU: "device" memory is a separate mapping that host code cannot touch
//   (its addresses are PROT_NONE to the host; a stray host access faults),
//   stream work runs asynchronously on a worker thread in stream order, and
//   freed device memory is poisoned.
// - The host device (host_device.cc): plain host memory, synchronous; what
//   host loads with a dtype conversion run through.
//
// Addresses. Device memory is handed out as a Buffer whose data() is a
// device address: host code must never dereference it. Pinned memory is
// ordinary host memory (data() may be used by host code and as the source of
// CopyToDevice).
//
// Errors. Enqueueing checks its arguments (null, zero-size, unknown
// conversion) and returns them at once; a failure of the work itself (a bad
// address, a lost device) is returned by the next Synchronize() of the stream
// or of an event recorded after it.
//
// Thread safety: a Device may be used from several threads; a stream or an
// event from one thread at a time.
#ifndef TENSORLIFT_DEVICE_DEVICE_H_
#define TENSORLIFT_DEVICE_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "device/host_buffer.h"
#include "tensorlift/dtype.h"
#include "tensorlift/loader.h"  // DeviceType
#include "tensorlift/status.h"

namespace tensorlift {

// A device allocation exported for another process on the same machine
// (docs/remote.md, "Same-host handover of GPU memory"), as Device::Export
// makes it and Device::Import takes it. Move-only: owns `fd`.
struct ExportedMemory {
  ExportedMemory() = default;
  ~ExportedMemory();
  ExportedMemory(ExportedMemory&& other) noexcept;
  ExportedMemory& operator=(ExportedMemory&& other) noexcept;
  ExportedMemory(const ExportedMemory&) = delete;
  ExportedMemory& operator=(const ExportedMemory&) = delete;

  // The physical device the memory is on (Device::identity()); Import
  // refuses memory of another.
  std::string device_id;
  // An opaque handle: a CUDA IPC handle (64 bytes); empty when `fd` carries
  // the memory (the emulated device: a memfd).
  std::string handle;
  int fd = -1;
  // Bytes of the allocation the handle opens (its start is the buffer's
  // data()).
  uint64_t bytes = 0;
  // The exporting process (CUDA IPC cannot open a handle in it).
  int64_t pid = 0;
};

// A point in a stream's work. Reusable: Record() moves it.
class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
  // Blocks until the work before the last Record() is done (at once if never
  // recorded); returns that work's first error.
  virtual Status Synchronize() = 0;
  // True when that work is done (its error, if any, on Synchronize()).
  virtual bool Done() = 0;
  // Microseconds, on the device's clock, at which the work before the last
  // Record() completed; for tests and traces. Valid after Synchronize().
  virtual double CompletedAtMicros() = 0;
};

// An ordered queue of device work.
class DeviceStream {
 public:
  virtual ~DeviceStream() = default;
  // Copies `bytes` from host memory `src` (pinned memory for an asynchronous
  // copy; the caller keeps it unchanged until the copy is done) to device
  // address `dst`.
  virtual Status CopyToDevice(std::byte* dst, const std::byte* src, uint64_t bytes) = 0;
  // Copies between device addresses; the ranges must not overlap.
  virtual Status CopyOnDevice(std::byte* dst, const std::byte* src, uint64_t bytes) = 0;
  // Copies `bytes` at device address `src` to host memory `dst`.
  virtual Status CopyToHost(std::byte* dst, const std::byte* src, uint64_t bytes) = 0;
  // Converts `count` elements at device address `src` (dtype `from`) into
  // `to` at `dst` (convert.h: ConversionSupported). No overlap.
  virtual Status Convert(std::byte* dst, Dtype to, const std::byte* src, Dtype from,
                         uint64_t count) = 0;
  // Decodes a sparse-bitmask tensor (layout: tensorlift/bitmask.h) of rows x
  // cols elements of elem_bytes (1, 2, 4 or 8) bytes into `dst`
  // (rows * cols * elem_bytes bytes): `values` holds its nnz non-zeros,
  // `bitmask` its rows * ceil(cols / 8) mask bytes and `row_offsets` (8-byte
  // aligned) its rows offsets. All four are device addresses; `dst` overlaps
  // none of the others. The caller has validated the encoding on the host
  // (sparse::Validate) before copying it: the CUDA kernel trusts it (a bad
  // one makes it read and write out of bounds); the emulated device checks it
  // again and fails the stream with a Corruption error.
  virtual Status DecodeBitmask(std::byte* dst, const std::byte* values, uint64_t nnz,
                               const uint8_t* bitmask, const int64_t* row_offsets, uint64_t rows,
                               uint64_t cols, uint32_t elem_bytes) = 0;
  // Marks the current end of the stream in `event`.
  virtual Status Record(DeviceEvent& event) = 0;
  // Blocks until everything enqueued so far is done; the first error.
  virtual Status Synchronize() = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceType kind() const = 0;
  virtual int ordinal() const = 0;
  // "cuda:0", "emulated:0".
  virtual std::string name() const = 0;
  // DLPack's device type for memory from Allocate() (kDLCUDA = 2; the
  // emulated device uses kDLExtDev = 12, which no framework will touch).
  virtual int dlpack_device_type() const = 0;
  // Device memory, 256-byte aligned; freed when the last owner drops it. The
  // caller makes sure no stream work still uses it by then.
  virtual Result<std::shared_ptr<Buffer>> Allocate(uint64_t bytes) = 0;
  // Page-locked host memory, 4 KiB aligned.
  virtual Result<std::shared_ptr<Buffer>> AllocatePinned(uint64_t bytes) = 0;
  virtual Result<std::unique_ptr<DeviceStream>> CreateStream() = 0;
  virtual Result<std::unique_ptr<DeviceEvent>> CreateEvent() = 0;
  // Device memory free now, in bytes.
  virtual Result<uint64_t> FreeMemory() = 0;
  // Records `event` (from CreateEvent() of this device) at the current end of
  // a stream this library does not own: a framework's (a cudaStream_t as an
  // integer, 0 the legacy default stream), so that work of ours can wait for
  // the framework's work on memory it reads (a layer streamer reusing a
  // block's buffer). Devices without such streams (the emulated and host
  // devices: their callers compute on the host, synchronously) take only 0,
  // which leaves nothing to wait for (`event` is then done); another value is
  // InvalidArgument.
  virtual Status RecordExternal(DeviceEvent& event, uint64_t stream);
  // The host's own mapping of device range [p, p + bytes), for memory that
  // host code can reach another way (the emulated device's worker mapping,
  // as Buffer::host_mapping gives for a whole buffer): valid while the
  // allocation lives. Unimplemented where there is none (a GPU's memory).
  virtual Result<std::byte*> HostMapping(const std::byte* p, uint64_t bytes);

  // The physical device, as another process on this machine names it:
  // "GPU-<uuid>" for a GPU, "emulated:0@<boot id>" (or
  // EmulatedDeviceOptions::id) for the emulated device; "" where memory
  // cannot be exported.
  virtual std::string identity() const { return ""; }
  // Exports the whole allocation `buffer` (from Allocate() of this device)
  // for Import in another process on this machine: a CUDA IPC handle
  // (cudaIpcGetMemHandle), or the emulated device's memfd. The allocation
  // stays shared while any importer maps it, whatever the exporter does (it
  // may free it or exit). No stream work may be writing the buffer during
  // the call (the emulated device moves its bytes into shared memory once).
  // Unimplemented by default (host memory has HostBuffer::Seal instead).
  virtual Result<ExportedMemory> Export(const Buffer& buffer);
  // Maps memory another process exported (zero copies): a Buffer of
  // `memory.bytes` at a device address of this device, which unmaps (CUDA:
  // cudaIpcCloseMemHandle) when the last owner drops it. The memory is the
  // exporter's: writes are seen by both. InvalidArgument when it is another
  // device's (identity differs), or (CUDA) when this process exported it;
  // Unimplemented by default.
  virtual Result<std::shared_ptr<Buffer>> Import(ExportedMemory memory);
};

// The CUDA device `ordinal`. Unimplemented when built without CUDA;
// Unavailable (with the CUDA message) when there is no GPU or driver.
Result<std::shared_ptr<Device>> OpenCudaDevice(int ordinal);
bool CudaBuiltIn();

// Plain host memory as a device, everything synchronous on the calling
// thread: what a host load with a dtype conversion runs through (its
// "device" addresses are host addresses, dlpack_device_type() is kDLCPU).
std::shared_ptr<Device> MakeHostDevice();

struct EmulatedDeviceOptions {
  // Device memory the emulated device has; Allocate() beyond it fails with
  // ResourceExhausted, as a full GPU would.
  uint64_t memory_bytes = 1ull << 32;
  // Bandwidth of CopyToDevice in bytes/s, 0 for as fast as memcpy: lets
  // tests see reads and copies overlap, and models a GPU's host-to-device
  // bandwidth (a copy takes at least its bytes at this rate). The device's
  // copies share it, whichever stream they are on, as they share a GPU's bus.
  double copy_bytes_per_second = 0;
  // What each CopyToDevice costs besides its bytes, in seconds (a GPU's
  // per-copy latency).
  double copy_latency_seconds = 0;
  // Host memory faulted in when the device is made, that allocations are
  // carved from (as far as it goes): a GPU's memory costs no page faults, and
  // fresh host memory's faults and zeroing would dominate a load here.
  uint64_t prefault_bytes = 0;
  // A diagnostic for benchmarks, never for loads whose bytes matter:
  // host-to-device copies take the copy model's time (and check their
  // ranges) but move no bytes, so the device memory keeps what it had. Here
  // the CPUs that read also do the copies a GPU's DMA engines do; with this
  // the pipeline's scheduling is timed without that cost. Every tensor loaded
  // through such a device has the wrong bytes.
  bool discard_copies = false;
  // The device this emulates, as Device::identity() names it and Import
  // compares: "" for "emulated:0@<boot id>" (every emulated device of this
  // boot is the same "GPU"); tests name another to see memory refused.
  std::string id = "";
};
std::shared_ptr<Device> MakeEmulatedDevice(const EmulatedDeviceOptions& options = {});

// The options of the emulated device a load names ("emulated:0"): the
// defaults, with a GPU's host-to-device copy model (docs/loading.md, "The
// emulated device"): TENSORLIFT_EMULATED_H2D_GBPS (GB/s, default 54.8, the
// pinned H2D rate measured on an H200; 0: as fast as memcpy),
// TENSORLIFT_EMULATED_COPY_LATENCY_US (default 0),
// TENSORLIFT_EMULATED_PREFAULT_GB (default 0: device memory faulted in when
// the device is made; benchmarks set it) and
// TENSORLIFT_EMULATED_DISCARD_COPIES (0 or 1, default 0: discard_copies, a
// benchmark's diagnostic) and TENSORLIFT_EMULATED_DEVICE_ID (id). InvalidArgument for a value that
// is not a non-negative number (0 or 1 for the last).
Result<EmulatedDeviceOptions> EmulatedDeviceOptionsFromEnvironment();

// The device a load names (LoadOptions::device, parsed by ParseDevice):
// the host device for kCpu, the CUDA device `index`, or THE emulated device
// (one per process, created at the first call, with the options above), so
// that a load onto "emulated:0" and a communicator built for it share one
// device memory. NotFound for an emulated index other than 0.
Result<std::shared_ptr<Device>> OpenDevice(DeviceType type, int index);

}  // namespace tensorlift

#endif  // TENSORLIFT_DEVICE_DEVICE_H_
