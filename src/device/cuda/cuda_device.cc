// The CUDA device (device.h) over the CUDA runtime (linked statically, so
// that a machine without a GPU or driver still loads the library and gets
// an Unavailable error from OpenCudaDevice).
//
// - Every CUDA call is checked; CudaStatus turns its error into a Status.
// - Every CUDA handle (memory, pinned memory, stream, event) is owned by one
//   move-only object whose destructor releases it and never fails.
// - Each call makes the device current on the calling thread first
//   (cudaSetDevice is cheap and thread-local), so a Device may be used from
//   any thread.
// - Event times are measured from a reference event recorded when the
//   device is opened, so the times of all streams of one device compare.
#include <cuda_runtime_api.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <utility>

#include "common/checked_math.h"
#include "device/cuda/cuda_status.h"
#include "device/cuda/kernels.h"
#include "device/cuda_info.h"
#include "device/device.h"
#include "device/host_buffer.h"
#include "device/stream_checks.h"
#include "kernels/convert.h"
#include "tensorlift/crash.h"

namespace tensorlift {

Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  std::string message =
      std::string(what) + ": " + cudaGetErrorString(err) + " (" + cudaGetErrorName(err) + ")";
  switch (err) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorCallRequiresNewerDriver:
    case cudaErrorStubLibrary:
    case cudaErrorInitializationError:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemNotReady:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
      return Status(StatusCode::kUnavailable, std::move(message));
    case cudaErrorMemoryAllocation:
      return ResourceExhaustedError(std::move(message));
    default:
      return InternalError(std::move(message));
  }
}

namespace {

Status SetDevice(int ordinal) { return CudaStatus(cudaSetDevice(ordinal), "cudaSetDevice"); }

// An owned cudaEvent_t.
class EventHandle {
 public:
  EventHandle() = default;
  ~EventHandle() { Reset(); }
  EventHandle(EventHandle&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
  EventHandle& operator=(EventHandle&& other) noexcept {
    if (this != &other) {
      Reset();
      event_ = std::exchange(other.event_, nullptr);
    }
    return *this;
  }
  EventHandle(const EventHandle&) = delete;
  EventHandle& operator=(const EventHandle&) = delete;

  // A timing event (cudaEventBlockingSync: waiting on it sleeps, leaving the
  // CPU to the reading threads).
  static Result<EventHandle> Create() {
    EventHandle handle;
    TL_RETURN_IF_ERROR(CudaStatus(cudaEventCreateWithFlags(&handle.event_, cudaEventBlockingSync),
                                  "cudaEventCreateWithFlags"));
    return handle;
  }
  cudaEvent_t get() const { return event_; }

 private:
  void Reset() {
    if (event_ != nullptr) cudaEventDestroy(event_);  // Cannot fail usefully here.
    event_ = nullptr;
  }
  cudaEvent_t event_ = nullptr;
};

// An owned cudaStream_t (non-blocking: no implicit ordering with the legacy
// default stream).
class StreamHandle {
 public:
  StreamHandle() = default;
  ~StreamHandle() { Reset(); }
  StreamHandle(StreamHandle&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}
  StreamHandle& operator=(StreamHandle&& other) noexcept {
    if (this != &other) {
      Reset();
      stream_ = std::exchange(other.stream_, nullptr);
    }
    return *this;
  }
  StreamHandle(const StreamHandle&) = delete;
  StreamHandle& operator=(const StreamHandle&) = delete;

  static Result<StreamHandle> Create() {
    StreamHandle handle;
    TL_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&handle.stream_, cudaStreamNonBlocking),
                                  "cudaStreamCreateWithFlags"));
    return handle;
  }
  cudaStream_t get() const { return stream_; }

 private:
  void Reset() {
    // cudaStreamDestroy returns at once; work still queued completes first.
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }
  cudaStream_t stream_ = nullptr;
};

// What every object of one opened device shares.
struct DeviceState {
  int ordinal = 0;
  EventHandle reference;  // Recorded and completed when the device was opened.
  std::string uuid;       // "GPU-<uuid>" (cudaDeviceProp::uuid), as nvidia-smi -L prints it.
};

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".
std::string UuidText(const cudaUUID_t& uuid) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    const auto b = static_cast<unsigned char>(uuid.bytes[i]);
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

// Device memory from cudaMalloc.
class CudaBuffer final : public Buffer {
 public:
  static Result<std::shared_ptr<Buffer>> Allocate(int ordinal, uint64_t bytes) {
    TL_RETURN_IF_ERROR(SetDevice(ordinal));
    void* p = nullptr;
    // cudaMalloc(0) gives no address; a one-byte allocation keeps data()
    // valid and distinct for an empty buffer.
    TL_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&p, bytes == 0 ? 1 : bytes),
                                  ("cudaMalloc of " + std::to_string(bytes) + " bytes").c_str()));
    std::shared_ptr<Buffer> buffer(new (std::nothrow)
                                       CudaBuffer(ordinal, static_cast<std::byte*>(p), bytes));
    if (!buffer) {
      cudaFree(p);
      return ResourceExhaustedError("out of host memory");
    }
    return buffer;
  }
  ~CudaBuffer() override {
    // Errors (e.g. the runtime unloading at exit) cannot be reported here.
    if (cudaSetDevice(ordinal_) == cudaSuccess) cudaFree(data_);
  }
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;

 private:
  CudaBuffer(int ordinal, std::byte* data, uint64_t bytes) : ordinal_(ordinal) {
    data_ = data;
    size_ = bytes;
  }
  int ordinal_;
};

// Device memory of another process, opened from its CUDA IPC handle
// (cudaIpcOpenMemHandle); closed (cudaIpcCloseMemHandle) with the last owner.
class CudaIpcBuffer final : public Buffer {
 public:
  static Result<std::shared_ptr<Buffer>> Open(int ordinal, const cudaIpcMemHandle_t& handle,
                                              uint64_t bytes) {
    TL_RETURN_IF_ERROR(SetDevice(ordinal));
    void* p = nullptr;
    TL_RETURN_IF_ERROR(
        CudaStatus(cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess),
                   ("cudaIpcOpenMemHandle of " + std::to_string(bytes) + " bytes").c_str()));
    std::shared_ptr<Buffer> buffer(new (std::nothrow)
                                       CudaIpcBuffer(ordinal, static_cast<std::byte*>(p), bytes));
    if (!buffer) {
      cudaIpcCloseMemHandle(p);
      return ResourceExhaustedError("out of host memory");
    }
    return buffer;
  }
  ~CudaIpcBuffer() override {
    if (cudaSetDevice(ordinal_) == cudaSuccess) cudaIpcCloseMemHandle(data_);
  }
  CudaIpcBuffer(const CudaIpcBuffer&) = delete;
  CudaIpcBuffer& operator=(const CudaIpcBuffer&) = delete;

 private:
  CudaIpcBuffer(int ordinal, std::byte* data, uint64_t bytes) : ordinal_(ordinal) {
    data_ = data;
    size_ = bytes;
  }
  int ordinal_;
};

// Page-locked host memory from cudaHostAlloc (portable: pinned for every
// device's streams).
// Page-locked host memory: huge pages registered with CUDA
// (cudaHostRegister) from 2 MiB up, so that O_DIRECT reads into staging move
// in large pieces (MapHugePageMemory); cudaHostAlloc's memory when smaller,
// or when registering fails.
class PinnedBuffer final : public Buffer {
 public:
  static Result<std::shared_ptr<Buffer>> Allocate(int ordinal, uint64_t bytes) {
    TL_RETURN_IF_ERROR(SetDevice(ordinal));
    if (bytes >= kHugePageAlign) {
      Result<std::shared_ptr<Buffer>> registered = AllocateRegistered(bytes);
      if (registered.ok()) return registered;
    }
    void* p = nullptr;
    TL_RETURN_IF_ERROR(
        CudaStatus(cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocPortable),
                   ("cudaHostAlloc of " + std::to_string(bytes) + " bytes").c_str()));
    if (reinterpret_cast<uintptr_t>(p) % kPageAlign != 0) {
      cudaFreeHost(p);
      return InternalError("cudaHostAlloc returned an address that is not 4 KiB aligned");
    }
    std::shared_ptr<Buffer> buffer(new (std::nothrow)
                                       PinnedBuffer(static_cast<std::byte*>(p), bytes, 0));
    if (!buffer) {
      cudaFreeHost(p);
      return ResourceExhaustedError("out of host memory");
    }
    return buffer;
  }
  ~PinnedBuffer() override {
    if (mapped_ == 0) {
      cudaFreeHost(data_);
      return;
    }
    cudaHostUnregister(data_);
    ::munmap(data_, mapped_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

 private:
  // Huge pages, faulted in, then registered (pinned) with CUDA.
  static Result<std::shared_ptr<Buffer>> AllocateRegistered(uint64_t bytes) {
    const uint64_t mapped = (bytes + kPageAlign - 1) / kPageAlign * kPageAlign;
    TL_ASSIGN_OR_RETURN(std::byte * p, MapHugePageMemory(mapped));
    std::memset(p, 0, mapped);  // Faulted in now, in huge pages where there are any.
    Status st = CudaStatus(cudaHostRegister(p, mapped, cudaHostRegisterPortable),
                           ("cudaHostRegister of " + std::to_string(mapped) + " bytes").c_str());
    if (!st.ok()) {
      ::munmap(p, mapped);
      return st;
    }
    std::shared_ptr<Buffer> buffer(new (std::nothrow) PinnedBuffer(p, bytes, mapped));
    if (!buffer) {
      cudaHostUnregister(p);
      ::munmap(p, mapped);
      return ResourceExhaustedError("out of host memory");
    }
    return buffer;
  }
  // mapped: the bytes of a registered mapping; 0 for cudaHostAlloc's memory.
  PinnedBuffer(std::byte* data, uint64_t bytes, uint64_t mapped) : mapped_(mapped) {
    data_ = data;
    size_ = bytes;
  }
  uint64_t mapped_;
};

class CudaEvent final : public DeviceEvent {
 public:
  CudaEvent(std::shared_ptr<const DeviceState> device, EventHandle event)
      : device_(std::move(device)), event_(std::move(event)) {}

  Status Synchronize() override {
    if (!recorded_) return Status::Ok();
    TL_RETURN_IF_ERROR(SetDevice(device_->ordinal));
    return CudaStatus(cudaEventSynchronize(event_.get()), "cudaEventSynchronize");
  }

  bool Done() override {
    if (!recorded_) return true;
    if (cudaSetDevice(device_->ordinal) != cudaSuccess) return true;  // Synchronize() reports it.
    // Not ready: false. Done, or failed (the error is Synchronize()'s): true.
    return cudaEventQuery(event_.get()) != cudaErrorNotReady;
  }

  double CompletedAtMicros() override {
    if (!recorded_) return 0;
    float ms = 0;
    if (cudaSetDevice(device_->ordinal) != cudaSuccess ||
        cudaEventElapsedTime(&ms, device_->reference.get(), event_.get()) != cudaSuccess) {
      return std::nan("");
    }
    return static_cast<double>(ms) * 1000.0;
  }

  const DeviceState* device() const { return device_.get(); }
  cudaEvent_t get() const { return event_.get(); }
  void MarkRecorded() { recorded_ = true; }

 private:
  std::shared_ptr<const DeviceState> device_;
  EventHandle event_;
  bool recorded_ = false;
};

// Bytes of `count` elements of `dtype`, sub-byte dtypes rounded up; false on
// overflow.
bool ElementBytes(Dtype dtype, uint64_t count, uint64_t* out) {
  uint64_t bits = 0;
  if (!CheckedMul(count, static_cast<uint64_t>(DtypeBits(dtype)), &bits)) return false;
  *out = bits / 8 + (bits % 8 != 0);
  return true;
}

class CudaStream final : public DeviceStream {
 public:
  CudaStream(std::shared_ptr<const DeviceState> device, StreamHandle stream)
      : device_(std::move(device)), stream_(std::move(stream)) {}

  Status CopyToDevice(std::byte* dst, const std::byte* src, uint64_t bytes) override {
    TL_RETURN_IF_ERROR(CheckCopyArgs("CopyToDevice", dst, src, bytes));
    return Copy(dst, src, bytes, cudaMemcpyHostToDevice, "CopyToDevice: cudaMemcpyAsync");
  }

  Status CopyOnDevice(std::byte* dst, const std::byte* src, uint64_t bytes) override {
    TL_RETURN_IF_ERROR(CheckCopyArgs("CopyOnDevice", dst, src, bytes));
    if (Overlap(dst, bytes, src, bytes)) {
      return InvalidArgumentError("CopyOnDevice: destination and source overlap (" +
                                  std::to_string(bytes) + " bytes)");
    }
    return Copy(dst, src, bytes, cudaMemcpyDeviceToDevice, "CopyOnDevice: cudaMemcpyAsync");
  }

  Status CopyToHost(std::byte* dst, const std::byte* src, uint64_t bytes) override {
    TL_RETURN_IF_ERROR(CheckCopyArgs("CopyToHost", dst, src, bytes));
    return Copy(dst, src, bytes, cudaMemcpyDeviceToHost, "CopyToHost: cudaMemcpyAsync");
  }

  Status Convert(std::byte* dst, Dtype to, const std::byte* src, Dtype from,
                 uint64_t count) override {
    if (dst == nullptr || src == nullptr) return InvalidArgumentError("Convert: null address");
    if (count == 0) return InvalidArgumentError("Convert: zero elements");
    uint64_t dst_bytes = 0;
    uint64_t src_bytes = 0;
    uint64_t end = 0;
    if (!ElementBytes(to, count, &dst_bytes) || !ElementBytes(from, count, &src_bytes) ||
        !CheckedAdd(reinterpret_cast<uintptr_t>(dst), dst_bytes, &end) ||
        !CheckedAdd(reinterpret_cast<uintptr_t>(src), src_bytes, &end)) {
      return InvalidArgumentError("Convert: " + std::to_string(count) +
                                  " elements wrap around the address space");
    }
    if (!convert::ConversionSupported(from, to)) {
      return InvalidArgumentError("Convert: no conversion from " + std::string(DtypeName(from)) +
                                  " to " + std::string(DtypeName(to)));
    }
    if (Overlap(dst, dst_bytes, src, src_bytes)) {
      return InvalidArgumentError("Convert: destination (" + std::to_string(dst_bytes) +
                                  " bytes) overlaps source (" + std::to_string(src_bytes) +
                                  " bytes)");
    }
    TL_RETURN_IF_ERROR(SetDevice(device_->ordinal));
    return CudaStatus(cuda::LaunchConvert(dst, to, src, from, count, stream_.get()),
                      "Convert: kernel launch");
  }

  Status DecodeBitmask(std::byte* dst, const std::byte* values, uint64_t nnz,
                       const uint8_t* bitmask, const int64_t* row_offsets, uint64_t rows,
                       uint64_t cols, uint32_t elem_bytes) override {
    TL_RETURN_IF_ERROR(
        CheckDecodeBitmaskArgs(dst, values, nnz, bitmask, row_offsets, rows, cols, elem_bytes)
            .status());
    TL_RETURN_IF_ERROR(SetDevice(device_->ordinal));
    return CudaStatus(cuda::LaunchDecodeBitmask(dst, values, bitmask, row_offsets, rows, cols,
                                                elem_bytes, stream_.get()),
                      "DecodeBitmask: kernel launch");
  }

  Status Record(DeviceEvent& event) override {
    auto* cuda_event = dynamic_cast<CudaEvent*>(&event);
    if (cuda_event == nullptr || cuda_event->device()->ordinal != device_->ordinal) {
      return InvalidArgumentError("Record: the event is not from " + Name());
    }
    TL_RETURN_IF_ERROR(SetDevice(device_->ordinal));
    TL_RETURN_IF_ERROR(
        CudaStatus(cudaEventRecord(cuda_event->get(), stream_.get()), "cudaEventRecord"));
    cuda_event->MarkRecorded();
    return Status::Ok();
  }

  Status Synchronize() override {
    TL_RETURN_IF_ERROR(SetDevice(device_->ordinal));
    return CudaStatus(cudaStreamSynchronize(stream_.get()), "cudaStreamSynchronize");
  }

 private:
  std::string Name() const { return "cuda:" + std::to_string(device_->ordinal); }

  Status Copy(std::byte* dst, const std::byte* src, uint64_t bytes, cudaMemcpyKind kind,
              const char* what) {
    TL_RETURN_IF_ERROR(SetDevice(device_->ordinal));
    return CudaStatus(cudaMemcpyAsync(dst, src, bytes, kind, stream_.get()), what);
  }

  std::shared_ptr<const DeviceState> device_;
  StreamHandle stream_;
};

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(std::shared_ptr<const DeviceState> state) : state_(std::move(state)) {}

  DeviceType kind() const override { return DeviceType::kCuda; }
  int ordinal() const override { return state_->ordinal; }
  std::string name() const override { return "cuda:" + std::to_string(state_->ordinal); }
  int dlpack_device_type() const override { return 2; }  // kDLCUDA.

  Result<std::shared_ptr<Buffer>> Allocate(uint64_t bytes) override {
    return CudaBuffer::Allocate(state_->ordinal, bytes);
  }

  Result<std::shared_ptr<Buffer>> AllocatePinned(uint64_t bytes) override {
    return PinnedBuffer::Allocate(state_->ordinal, bytes);
  }

  Result<std::unique_ptr<DeviceStream>> CreateStream() override {
    TL_RETURN_IF_ERROR(SetDevice(state_->ordinal));
    TL_ASSIGN_OR_RETURN(StreamHandle stream, StreamHandle::Create());
    return std::unique_ptr<DeviceStream>(std::make_unique<CudaStream>(state_, std::move(stream)));
  }

  Result<std::unique_ptr<DeviceEvent>> CreateEvent() override {
    TL_RETURN_IF_ERROR(SetDevice(state_->ordinal));
    TL_ASSIGN_OR_RETURN(EventHandle event, EventHandle::Create());
    return std::unique_ptr<DeviceEvent>(std::make_unique<CudaEvent>(state_, std::move(event)));
  }

  Result<uint64_t> FreeMemory() override {
    TL_RETURN_IF_ERROR(SetDevice(state_->ordinal));
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    TL_RETURN_IF_ERROR(CudaStatus(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"));
    return static_cast<uint64_t>(free_bytes);
  }

  Status RecordExternal(DeviceEvent& event, uint64_t stream) override {
    auto* cuda_event = dynamic_cast<CudaEvent*>(&event);
    if (cuda_event == nullptr || cuda_event->device()->ordinal != state_->ordinal) {
      return InvalidArgumentError("RecordExternal: the event is not from " + name());
    }
    TL_RETURN_IF_ERROR(SetDevice(state_->ordinal));
    TL_RETURN_IF_ERROR(
        CudaStatus(cudaEventRecord(cuda_event->get(),
                                   reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(stream))),
                   "cudaEventRecord (a caller's stream)"));
    cuda_event->MarkRecorded();
    return Status::Ok();
  }

  std::string identity() const override { return state_->uuid; }

  // Legacy CUDA IPC: the handle opens the whole cudaMalloc allocation.
  Result<ExportedMemory> Export(const Buffer& buffer) override {
    if (dynamic_cast<const CudaBuffer*>(&buffer) == nullptr) {
      return InvalidArgumentError(name() + ": Export takes a buffer from Allocate() of " + name());
    }
    if (state_->uuid.empty()) return UnavailableError(name() + ": the GPU's UUID is unknown");
    TL_RETURN_IF_ERROR(SetDevice(state_->ordinal));
    cudaIpcMemHandle_t handle{};
    TL_RETURN_IF_ERROR(CudaStatus(
        cudaIpcGetMemHandle(&handle, buffer.data()),
        ("cudaIpcGetMemHandle of " + std::to_string(buffer.size()) + " bytes on " + name())
            .c_str()));
    ExportedMemory out;
    out.device_id = state_->uuid;
    out.handle.assign(reinterpret_cast<const char*>(&handle), sizeof handle);
    out.bytes = buffer.size();
    out.pid = ::getpid();
    return out;
  }

  Result<std::shared_ptr<Buffer>> Import(ExportedMemory memory) override {
    if (state_->uuid.empty() || memory.device_id != state_->uuid) {
      return InvalidArgumentError(name() + ": memory of GPU '" + memory.device_id +
                                  "' cannot be mapped here: this GPU is '" + state_->uuid + "'");
    }
    if (memory.pid == ::getpid()) {
      return InvalidArgumentError(name() +
                                  ": CUDA IPC cannot open a handle in the process that "
                                  "exported it (pid " +
                                  std::to_string(memory.pid) + ")");
    }
    cudaIpcMemHandle_t handle{};
    if (memory.handle.size() != sizeof handle) {
      return InvalidArgumentError(name() + ": a CUDA IPC handle is " +
                                  std::to_string(sizeof handle) + " bytes, got " +
                                  std::to_string(memory.handle.size()));
    }
    std::memcpy(&handle, memory.handle.data(), sizeof handle);
    return CudaIpcBuffer::Open(state_->ordinal, handle, memory.bytes);
  }

 private:
  std::shared_ptr<const DeviceState> state_;
};

std::string VersionText(int v) {
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

// Why there is no device: `err` from cudaGetDeviceCount, prefixed with the
// missing driver when there is none at all (CUDA then speaks of an
// "insufficient" driver).
Status NoDeviceStatus(cudaError_t err) {
  Status s = CudaStatus(err, "cudaGetDeviceCount");
  int driver = 0;
  if (!s.ok() && cudaDriverGetVersion(&driver) == cudaSuccess && driver == 0) {
    return s.WithContext("no CUDA driver is installed (libcuda.so.1 is not loadable)");
  }
  return s;
}

}  // namespace

bool CudaBuiltIn() { return true; }

Result<std::shared_ptr<Device>> OpenCudaDevice(int ordinal) {
  int count = 0;
  TL_RETURN_IF_ERROR(NoDeviceStatus(cudaGetDeviceCount(&count)));
  if (count == 0) return Status(StatusCode::kUnavailable, "cudaGetDeviceCount: no CUDA device");
  if (ordinal < 0 || ordinal >= count) {
    return InvalidArgumentError("no CUDA device " + std::to_string(ordinal) +
                                ": this machine has " + std::to_string(count));
  }
  TL_RETURN_IF_ERROR(SetDevice(ordinal));
  // Creates the device's primary context now, so that its errors come here.
  TL_RETURN_IF_ERROR(CudaStatus(cudaFree(nullptr), "initialising the CUDA context"));
  auto state = std::make_shared<DeviceState>();
  state->ordinal = ordinal;
  TL_ASSIGN_OR_RETURN(state->reference, EventHandle::Create());
  TL_RETURN_IF_ERROR(
      CudaStatus(cudaEventRecord(state->reference.get(), nullptr), "cudaEventRecord"));
  TL_RETURN_IF_ERROR(
      CudaStatus(cudaEventSynchronize(state->reference.get()), "cudaEventSynchronize"));
  // A crash after this names the CUDA in use (include/tensorlift/crash.h).
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  cudaDeviceProp prop{};
  const bool named = cudaGetDeviceProperties(&prop, ordinal) == cudaSuccess;
  if (named) state->uuid = UuidText(prop.uuid);
  SetCrashContext("CUDA", "runtime " + VersionText(runtime) + ", driver " + VersionText(driver) +
                              ", device " + std::to_string(ordinal) +
                              (named ? std::string(" (") + prop.name + ")" : std::string()));
  return std::shared_ptr<Device>(std::make_shared<CudaDevice>(std::move(state)));
}

CudaCapabilities QueryCudaCapabilities() {
  CudaCapabilities cuda;
  cuda.built = true;
  if (Status s = CudaStatus(cudaRuntimeGetVersion(&cuda.runtime_version), "cudaRuntimeGetVersion");
      !s.ok()) {
    cuda.runtime_version = 0;
    cuda.runtime_reason = s.message();
  }
  if (Status s = CudaStatus(cudaDriverGetVersion(&cuda.driver_version), "cudaDriverGetVersion");
      !s.ok()) {
    cuda.driver_version = 0;
    cuda.driver_reason = s.message();
  } else if (cuda.driver_version == 0) {
    cuda.driver_reason = "cudaDriverGetVersion: 0, libcuda.so.1 is not installed or not loadable";
  } else if (cuda.runtime_version > cuda.driver_version) {
    cuda.driver_reason = "the driver supports CUDA " + VersionText(cuda.driver_version) +
                         ", older than the runtime's " + VersionText(cuda.runtime_version) +
                         " (minor-version compatibility may still run it)";
  }
  int count = 0;
  if (Status s = NoDeviceStatus(cudaGetDeviceCount(&count)); !s.ok()) {
    cuda.gpus_reason = s.message();
    return cuda;
  }
  if (count == 0) cuda.gpus_reason = "cudaGetDeviceCount: 0 devices";
  for (int i = 0; i < count; ++i) {
    GpuInfo gpu;
    gpu.index = i;
    cudaDeviceProp prop{};
    if (Status s = CudaStatus(cudaGetDeviceProperties(&prop, i), "cudaGetDeviceProperties");
        !s.ok()) {
      gpu.name = "(unknown: " + s.message() + ")";
    } else {
      gpu.name = prop.name;
      gpu.memory_bytes = prop.totalGlobalMem;
      gpu.compute_major = prop.major;
      gpu.compute_minor = prop.minor;
    }
    char bus_id[32] = {};
    if (cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, i) == cudaSuccess) gpu.pci_bus_id = bus_id;
    cuda.gpus.push_back(std::move(gpu));
  }
  return cuda;
}

}  // namespace tensorlift
