// ReadFile (include/tensorlift/read_file.h): a whole file front to back, a
// reader thread filling one of two buffers while the caller consumes the
// other, with the mode a load would choose.
#include "tensorlift/read_file.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>

#include "common/posix_file.h"
#include "io/page_cache.h"
#include "io/pread.h"

namespace tensorlift {
namespace {

constexpr uint64_t kMaxPiece = 1ull << 30;

struct FreeDeleter {
  void operator()(std::byte* p) const { std::free(p); }
};
using Aligned = std::unique_ptr<std::byte, FreeDeleter>;

// Two buffers passed between the reader thread and the consumer, in file
// order: the reader fills piece i into slots_[i % 2] once the consumer has
// given it back.
class TwoBuffers {
 public:
  TwoBuffers(int fd, uint64_t size, uint64_t piece, bool direct)
      : fd_(fd), size_(size), piece_(piece), direct_(direct) {}
  ~TwoBuffers() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  TwoBuffers(const TwoBuffers&) = delete;
  TwoBuffers& operator=(const TwoBuffers&) = delete;

  Status Start() {
    for (Slot& slot : slots_) {
      slot.data.reset(static_cast<std::byte*>(std::aligned_alloc(kDirectAlign, piece_)));
      if (!slot.data) {
        return ResourceExhaustedError("cannot allocate a " + std::to_string(piece_) +
                                      "-byte read buffer");
      }
    }
    thread_ = std::thread([this] { Read(); });
    return Status::Ok();
  }

  template <typename F>
  Status Consume(F&& consume) {
    for (uint64_t i = 0, at = 0; at < size_; ++i) {
      Slot& slot = slots_[i % 2];
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return slot.full; });
        if (!slot.status.ok()) return slot.status;
      }
      TL_RETURN_IF_ERROR(consume(slot.data.get(), static_cast<size_t>(slot.length)));
      at += slot.length;
      {
        std::lock_guard<std::mutex> lock(mu_);
        slot.full = false;
      }
      cv_.notify_all();
    }
    return Status::Ok();
  }

 private:
  struct Slot {
    Aligned data;
    uint64_t length = 0;
    bool full = false;
    Status status;
  };

  void Read() {
    for (uint64_t i = 0, at = 0; at < size_; ++i) {
      Slot& slot = slots_[i % 2];
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !slot.full || stop_; });
        if (stop_) return;
      }
      const uint64_t n = std::min(piece_, size_ - at);
      // O_DIRECT: whole 4 KiB blocks (pieces are multiples of them, so every
      // offset is aligned); the last one ends at the end of the file.
      const uint64_t ask = direct_ ? (n + kDirectAlign - 1) / kDirectAlign * kDirectAlign : n;
      Status st = ReadAtLeast(fd_, slot.data.get(), at, ask, n);
      const bool failed = !st.ok();
      {
        std::lock_guard<std::mutex> lock(mu_);
        slot.length = n;
        slot.status = std::move(st);
        slot.full = true;
      }
      cv_.notify_all();
      if (failed) return;  // The consumer stops at it.
      at += n;
    }
  }

  const int fd_;
  const uint64_t size_, piece_;
  const bool direct_;
  Slot slots_[2];
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;  // Last: starts once the rest is in place.
};

Result<ReadFileReport> ReadWhole(const std::string& path,
                                 const std::function<Status(const std::byte*, size_t)>& consume,
                                 const ReadFileOptions& options) {
  if (options.mode == IoMode::kMmap) {
    return InvalidArgumentError("ReadFile reads; mode mmap is for loads (views of the page cache)");
  }
  if (options.piece_bytes == 0 || options.piece_bytes > kMaxPiece) {
    return InvalidArgumentError("piece_bytes must be between 1 and " + std::to_string(kMaxPiece) +
                                ", not " + std::to_string(options.piece_bytes));
  }
  const uint64_t piece = (options.piece_bytes + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
  TL_ASSIGN_OR_RETURN(PosixFile file, PosixFile::OpenForRead(path));
  struct stat st;
  if (::fstat(file.fd(), &st) != 0) return PosixError("fstat", errno);
  if (!S_ISREG(st.st_mode)) return InvalidArgumentError("not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  ReadFileReport report;
  report.bytes = size;
  bool direct = options.mode == IoMode::kDirect;
  if (options.mode == IoMode::kAuto && size >= piece) {
    Result<double> cached = ResidentFraction(file.fd(), 0, size);
    direct = cached.ok() && *cached < 0.5;  // Not knowing costs only the page cache's help.
  }
  PosixFile direct_file;
  if (direct) {
    int fd;
    do {
      fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    } while (fd < 0 && errno == EINTR);
    if (fd >= 0) {
      direct_file = PosixFile::Adopt(fd);
    } else if (errno == EINVAL) {
      direct = false;  // The filesystem has no O_DIRECT (tmpfs, some FUSE).
    } else {
      return PosixError("cannot open with O_DIRECT", errno);
    }
  }
  if (!direct) (void)::posix_fadvise(file.fd(), 0, 0, POSIX_FADV_SEQUENTIAL);  // Advice only.
  report.mode = direct ? IoMode::kDirect : IoMode::kBuffered;
  if (size == 0) return report;
  TwoBuffers buffers(direct ? direct_file.fd() : file.fd(), size, piece, direct);
  TL_RETURN_IF_ERROR(buffers.Start());
  TL_RETURN_IF_ERROR(buffers.Consume(consume));
  return report;
}

}  // namespace

Result<ReadFileReport> ReadFile(const std::string& path,
                                const std::function<Status(const std::byte*, size_t)>& consume,
                                const ReadFileOptions& options) {
  Result<ReadFileReport> r = ReadWhole(path, consume, options);
  if (!r.ok() && r.status().message().rfind(path, 0) != 0) return r.status().WithContext(path);
  return r;
}

}  // namespace tensorlift
