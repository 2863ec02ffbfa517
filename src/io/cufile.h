// GPUDirect Storage: reads from a file straight into GPU memory through
// NVIDIA's cuFile library, which is loaded at run time with
// dlopen("libcufile.so.0") (or the full path in $TENSORLIFT_CUFILE_LIB), so
// that tensorlift neither links nor needs it. No cuFile or CUDA header here.
//
// Built with the CUDA backend when cufile.h is found (cufile.cc); otherwise
// cufile_none.cc, whose Open() says why GDS was not built.
//
// The library, once loaded, stays loaded for the life of the process (cuFile
// keeps threads and exit handlers; unloading it is not safe).
//
// Thread safety: a CuFileDriver may be used from several threads at once
// (cuFile is thread-safe); a Handle from one thread at a time, or from
// several for Read() only.
#ifndef TENSORLIFT_IO_CUFILE_H_
#define TENSORLIFT_IO_CUFILE_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tensorlift/status.h"

namespace tensorlift {

struct CuFileApi;  // The library's function table (cufile.cc).

// True when GDS support was compiled in.
bool CuFileBuiltIn();

struct CuFileLibrary {
  std::string path;  // The file that was loaded, e.g. "/usr/lib/.../libcufile.so.0".
  int version = 0;   // cuFileGetVersion(), e.g. 1150 for 1.15.0.
};

// Loads the library and all the symbols tensorlift uses, without opening the
// driver; for diagnostics. Unavailable, naming the missing piece, when the
// library cannot be loaded (with dlerror's message) or lacks a symbol;
// Unimplemented when GDS support was not built. Thread-safe; a success is
// remembered, a failure is tried again next time.
Result<CuFileLibrary> LoadCuFileLibrary();

// An open cuFile driver (cuFileDriverOpen ... cuFileDriverClose).
class CuFileDriver {
 public:
  // A file registered with cuFile (cuFileHandleRegister); deregistered when
  // destroyed. It must be destroyed before its driver, and the fd must stay
  // open while it lives. Move-only.
  class Handle {
   public:
    Handle() = default;
    ~Handle();
    Handle(Handle&& other) noexcept;
    Handle& operator=(Handle&& other) noexcept;
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;
    bool valid() const { return handle_ != nullptr; }

   private:
    friend class CuFileDriver;
    Handle(const CuFileApi* api, void* handle) : api_(api), handle_(handle) {}
    void Reset();
    [[maybe_unused]] const CuFileApi* api_ = nullptr;  // Unused without cuFile.
    void* handle_ = nullptr;                           // CUfileHandle_t.
  };

  // Loads the library (LoadCuFileLibrary) and opens the driver. Unavailable
  // with the reason when either fails (for the driver, cuFile's error code
  // and message, e.g. "nvidia-fs driver is not loaded"); Unimplemented when
  // GDS support was not built. Without the nvidia-fs kernel module cuFile
  // may still open, in compatibility mode (POSIX reads through its own
  // bounce buffers, not GPUDirect). cuFile writes its log to cufile.log in
  // the working directory unless $CUFILE_LOGFILE_PATH or its cufile.json
  // ($CUFILE_ENV_PATH_JSON) say otherwise.
  static Result<std::unique_ptr<CuFileDriver>> Open();

  // Deregisters the buffers still registered, then closes the driver.
  ~CuFileDriver();
  CuFileDriver(const CuFileDriver&) = delete;
  CuFileDriver& operator=(const CuFileDriver&) = delete;

  // Registers an open file descriptor (O_DIRECT or not; cuFile >= 1.7 takes
  // both). Unavailable when cuFile refuses the file (e.g. its filesystem does
  // not support GDS): the caller falls back to plain reads.
  Result<Handle> Register(int fd);

  // Registers `bytes` of device memory at `dev_ptr` for GDS (optional; makes
  // reads into it faster), until the driver's end.
  Status RegisterBuffer(void* dev_ptr, uint64_t bytes);

  // Reads `size` bytes at `file_offset` of the file into device memory
  // `dev_base` + `buf_offset` (for a registered buffer, `dev_base` is its
  // start). Loops over short reads; returns the bytes read, less than `size`
  // only at the end of the file. An error (negative return) becomes a Status
  // with errno's or cuFile's message.
  Result<uint64_t> Read(const Handle& handle, void* dev_base, uint64_t size, uint64_t file_offset,
                        uint64_t buf_offset);

 private:
  explicit CuFileDriver(const CuFileApi* api) : api_(api) {}
  [[maybe_unused]] const CuFileApi* api_;  // Unused without cuFile (cufile_none.cc).
  std::mutex mu_;
  std::vector<void*> registered_;  // Buffers registered and not yet deregistered.
};

}  // namespace tensorlift

#endif  // TENSORLIFT_IO_CUFILE_H_
