// GPUDirect Storage through a dlopen'd libcufile.so.0, with the types of the
// real cufile.h (found at build time: cmake/TensorliftDeps.cmake).
#include "io/cufile.h"

#include <cufile.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string>
#include <utility>

#include "common/checked_math.h"
#include "common/dynamic_library.h"
#include "common/posix_file.h"

namespace tensorlift {

// The symbols tensorlift uses, with the header's own types.
struct CuFileApi {
  std::string path;
  int version = 0;
  decltype(&cuFileDriverOpen) driver_open = nullptr;
  decltype(&cuFileDriverClose) driver_close = nullptr;  // cuFileDriverClose_v2 when present.
  decltype(&cuFileHandleRegister) handle_register = nullptr;
  decltype(&cuFileHandleDeregister) handle_deregister = nullptr;
  decltype(&cuFileBufRegister) buf_register = nullptr;
  decltype(&cuFileBufDeregister) buf_deregister = nullptr;
  decltype(&cuFileRead) read = nullptr;
  decltype(&cuFileGetVersion) get_version = nullptr;
};

namespace {

constexpr const char* kDefaultLibrary = "libcufile.so.0";
constexpr const char* kProcModules = "/proc/modules";

// cuFile's error as a Status: "`what`: <cuFile's message> (cuFile error N)",
// plus the CUDA driver's error code when cuFile reports one. Argument and
// registration errors are InvalidArgument, memory errors ResourceExhausted,
// I/O errors IOError, and the rest (driver, platform, file type) Unavailable:
// GDS cannot be used here, the caller falls back.
Status CuFileStatus(CUfileError_t e, const char* what) {
  if (e.err == CU_FILE_SUCCESS) return Status::Ok();
  std::string message = std::string(what) + ": " + cufileop_status_error(e.err) +
                        " (cuFile error " + std::to_string(static_cast<int>(e.err)) + ")";
  if (IS_CUDA_ERR(e))
    message += " (CUDA driver error " + std::to_string(static_cast<int>(CU_FILE_CUDA_ERR(e))) + ")";
  switch (e.err) {
    case CU_FILE_INVALID_VALUE:
    case CU_FILE_CUDA_POINTER_INVALID:
    case CU_FILE_CUDA_MEMORY_TYPE_INVALID:
    case CU_FILE_CUDA_POINTER_RANGE_ERROR:
    case CU_FILE_MEMORY_ALREADY_REGISTERED:
    case CU_FILE_MEMORY_NOT_REGISTERED:
    case CU_FILE_HANDLE_NOT_REGISTERED:
    case CU_FILE_HANDLE_ALREADY_REGISTERED:
      return InvalidArgumentError(std::move(message));
    case CU_FILE_NOMEM_ERROR:
    case CU_FILE_GPU_MEMORY_PINNING_FAILED:
    case CU_FILE_INVALID_MAPPING_SIZE:
      return ResourceExhaustedError(std::move(message));
    case CU_FILE_PERMISSION_DENIED:
      return PermissionDeniedError(std::move(message));
    case CU_FILE_IO_ERROR:
      return IOError(std::move(message));
    default:
      return UnavailableError(std::move(message));
  }
}

// Loads the library named by $TENSORLIFT_CUFILE_LIB, else libcufile.so.0.
Result<const CuFileApi*> LoadApi() {
  static std::mutex mu;
  static const CuFileApi* loaded = nullptr;  // Never freed: the library stays loaded.
  std::lock_guard lock(mu);
  if (loaded != nullptr) return loaded;

  TL_ASSIGN_OR_RETURN(
      DynamicLibrary lib,
      DynamicLibrary::Open("TENSORLIFT_CUFILE_LIB", kDefaultLibrary, "cuFile library",
                           " (install GPUDirect Storage, or set TENSORLIFT_CUFILE_LIB to "
                           "libcufile.so.0's path)"));
  const std::string name = lib.name();
  auto api = std::unique_ptr<CuFileApi>(new (std::nothrow) CuFileApi);
  if (!api) return ResourceExhaustedError("out of memory");
  Status s = lib.Symbol("cuFileDriverOpen", &api->driver_open);
  if (s.ok() && !lib.Symbol("cuFileDriverClose_v2", &api->driver_close).ok()) {
    s = lib.Symbol("cuFileDriverClose", &api->driver_close);
  }
  if (s.ok()) s = lib.Symbol("cuFileHandleRegister", &api->handle_register);
  if (s.ok()) s = lib.Symbol("cuFileHandleDeregister", &api->handle_deregister);
  if (s.ok()) s = lib.Symbol("cuFileBufRegister", &api->buf_register);
  if (s.ok()) s = lib.Symbol("cuFileBufDeregister", &api->buf_deregister);
  if (s.ok()) s = lib.Symbol("cuFileRead", &api->read);
  if (s.ok()) s = lib.Symbol("cuFileGetVersion", &api->get_version);
  if (s.ok()) s = CuFileStatus(api->get_version(&api->version), "cuFileGetVersion");
  if (!s.ok())
    return s.WithContext(name);  // Closed as lib goes: nothing of it has run but cuFileGetVersion.
  lib.Keep();
  Dl_info info{};
  api->path =
      dladdr(reinterpret_cast<void*>(api->driver_open), &info) != 0 && info.dli_fname != nullptr
          ? info.dli_fname
          : name;
  loaded = api.release();
  return loaded;
}

}  // namespace

bool CuFileBuiltIn() { return true; }

Result<CuFileLibrary> LoadCuFileLibrary() {
  TL_ASSIGN_OR_RETURN(const CuFileApi* api, LoadApi());
  return CuFileLibrary{api->path, api->version};
}

CuFileDriver::Handle::~Handle() { Reset(); }

CuFileDriver::Handle::Handle(Handle&& other) noexcept
    : api_(other.api_), handle_(std::exchange(other.handle_, nullptr)) {}

CuFileDriver::Handle& CuFileDriver::Handle::operator=(Handle&& other) noexcept {
  if (this != &other) {
    Reset();
    api_ = other.api_;
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

void CuFileDriver::Handle::Reset() {
  if (handle_ != nullptr) api_->handle_deregister(handle_);
  handle_ = nullptr;
}

Result<std::unique_ptr<CuFileDriver>> CuFileDriver::Open() {
  TL_ASSIGN_OR_RETURN(const CuFileApi* api, LoadApi());
  // cuFileDriverOpen (1.17) reads /proc/modules and, when it cannot be
  // opened (containers such as gVisor hide it), loops forever on the failed
  // stream: do not call it there.
  if (const int fd = ::open(kProcModules, O_RDONLY | O_CLOEXEC); fd >= 0) {
    ::close(fd);
  } else {
    return UnavailableError("cuFileDriverOpen not called: " +
                            PosixError(std::string("open(") + kProcModules + ")", errno).message() +
                            ", and cuFile hangs without it");
  }
  TL_RETURN_IF_ERROR(CuFileStatus(api->driver_open(), "cuFileDriverOpen"));
  auto driver = std::unique_ptr<CuFileDriver>(new (std::nothrow) CuFileDriver(api));
  if (!driver) {
    api->driver_close();
    return ResourceExhaustedError("out of memory");
  }
  return driver;
}

CuFileDriver::~CuFileDriver() {
  for (void* p : registered_) api_->buf_deregister(p);  // Errors cannot be reported here.
  api_->driver_close();
}

Result<CuFileDriver::Handle> CuFileDriver::Register(int fd) {
  if (fd < 0)
    return InvalidArgumentError("cuFileHandleRegister: invalid file descriptor " +
                                std::to_string(fd));
  CUfileDescr_t descr{};
  descr.type = CU_FILE_HANDLE_TYPE_OPAQUE_FD;
  descr.handle.fd = fd;
  descr.fs_ops = nullptr;
  CUfileHandle_t handle = nullptr;
  TL_RETURN_IF_ERROR(CuFileStatus(api_->handle_register(&handle, &descr), "cuFileHandleRegister"));
  return Handle(api_, handle);
}

Status CuFileDriver::RegisterBuffer(void* dev_ptr, uint64_t bytes) {
  if (dev_ptr == nullptr || bytes == 0)
    return InvalidArgumentError("cuFileBufRegister: null address or zero bytes");
  std::lock_guard lock(mu_);
  registered_.reserve(registered_.size() + 1);  // So that push_back cannot fail after registering.
  TL_RETURN_IF_ERROR(CuFileStatus(api_->buf_register(dev_ptr, bytes, 0), "cuFileBufRegister"));
  registered_.push_back(dev_ptr);
  return Status::Ok();
}

Result<uint64_t> CuFileDriver::Read(const Handle& handle, void* dev_base, uint64_t size,
                                    uint64_t file_offset, uint64_t buf_offset) {
  if (!handle.valid()) return InvalidArgumentError("cuFileRead: the file is not registered");
  if (dev_base == nullptr) return InvalidArgumentError("cuFileRead: null device address");
  uint64_t end = 0;
  constexpr uint64_t kMaxOff = static_cast<uint64_t>(INT64_MAX);
  if (!CheckedAdd(file_offset, size, &end) || end > kMaxOff ||
      !CheckedAdd(buf_offset, size, &end) || end > kMaxOff) {
    return InvalidArgumentError("cuFileRead: " + std::to_string(size) + " bytes at file offset " +
                                std::to_string(file_offset) + " / buffer offset " +
                                std::to_string(buf_offset) + " overflow off_t");
  }
  uint64_t done = 0;
  while (done < size) {
    const ssize_t n =
        api_->read(handle.handle_, dev_base, size - done, static_cast<off_t>(file_offset + done),
                   static_cast<off_t>(buf_offset + done));
    if (n == -1) {
      const int err = errno;
      if (err == EINTR || err == EAGAIN) continue;
      return PosixError("cuFileRead of " + std::to_string(size - done) + " bytes at offset " +
                            std::to_string(file_offset + done),
                        err);
    }
    if (n < 0) {
      return IOError("cuFileRead of " + std::to_string(size - done) + " bytes at offset " +
                     std::to_string(file_offset + done) + ": " + CUFILE_ERRSTR(n) +
                     " (cuFile error " + std::to_string(-n) + ")");
    }
    if (n == 0) break;  // End of file.
    done += static_cast<uint64_t>(n);
  }
  return done;
}

}  // namespace tensorlift
