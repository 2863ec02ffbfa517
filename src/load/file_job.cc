// One file of a load, opened and checked (file_job.h): shared by the host
// loader, the GPU pipeline and sparse loads.
#include "load/file_job.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <string>

#include "io/page_cache.h"
#include "load/checkpoint_builder.h"
#include "load/planner.h"

namespace tensorlift {

Status OpenForLoad(OpenedFile& job, IoMode mode, bool cached_views, bool misaligned_views) {
  const Header& h = job.shard->header;
  if (job.store) {
    if (mode != IoMode::kAuto && mode != IoMode::kBuffered) {
      return InvalidArgumentError("the I/O mode " + std::string(IoModeName(mode)) +
                                  " applies to local files; this file is read through its store");
    }
    job.identity = job.shard->identity;
    job.report.mode = IoMode::kBuffered;
    job.report.path = job.shard->path;
    job.report.reason = job.store->Describe(job.shard->path);
    return Status::Ok();
  }
  TL_ASSIGN_OR_RETURN(job.buffered, PosixFile::OpenForRead(job.shard->path));
  TL_ASSIGN_OR_RETURN(job.identity, job.buffered.Identity());
  if (job.identity.size != h.file_size()) {
    return CorruptionError("the file has " + std::to_string(job.identity.size) +
                           " bytes but its header says " + std::to_string(h.file_size()) +
                           ": it changed after its header was read");
  }
  if (job.identity != job.shard->identity) {
    return CorruptionError("the file was modified or replaced after its header was read");
  }
  uint64_t first = 0, last = 0;
  if (!job.wanted.empty()) {
    first = h.tensors()[job.wanted.front()].begin;
    last = h.tensors()[job.wanted.back()].end;
  }
  if (mode == IoMode::kAuto) {
    TL_ASSIGN_OR_RETURN(double resident,
                        ResidentFraction(job.buffered.fd(), h.data_offset() + first, last - first));
    char pct[32];
    job.resident = resident;
    std::snprintf(pct, sizeof pct, "%.0f%%", resident * 100);
    // Views only of (nearly) fully cached files: the rest of a view's bytes would
    // come in by page faults, a small read each.
    mode = resident < 0.5                    ? IoMode::kDirect
           : cached_views && resident >= 0.9 ? IoMode::kMmap
                                             : IoMode::kBuffered;
    job.report.reason =
        std::string(pct) + " in page cache" + (mode == IoMode::kMmap ? ": views of it" : "");
    // A tensor misaligned for its dtype in the file (a header length that is
    // not a multiple of 8 shifts them all) is never a view: it is copied to an
    // aligned place. When that is a tenth of the bytes or more, plain reads
    // into aligned memory do it in one pass; views would also keep the mapped
    // pages resident beside the copies (twice the file).
    if (mode == IoMode::kMmap && !misaligned_views) {
      uint64_t wanted = 0, misaligned = 0;
      uint32_t count = 0;
      for (uint32_t idx : job.wanted) {
        const TensorInfo& t = h.tensors()[idx];
        wanted += t.nbytes();
        if (t.nbytes() > 0 && (h.data_offset() + t.begin) % ElementAlignment(t.dtype) != 0) {
          misaligned += t.nbytes();
          ++count;
        }
      }
      if (misaligned > 0 && misaligned >= wanted / 10) {
        mode = IoMode::kBuffered;
        job.report.reason = std::string(pct) + " in page cache; " + std::to_string(count) +
                            " of its tensors are misaligned for their dtype (a header of " +
                            std::to_string(h.data_offset() - 8) +
                            " bytes): read into aligned memory, not views";
      }
    }
  }
  if (mode == IoMode::kDirect) {
    TL_ASSIGN_OR_RETURN(const bool opened, OpenDirect(job));
    if (!opened) {
      mode = IoMode::kBuffered;
      job.report.reason += (job.report.reason.empty() ? "" : "; ") +
                           std::string("the filesystem refuses O_DIRECT, buffered instead");
    }
  }
  job.report.mode = mode;
  job.report.path = job.shard->path;
  return Status::Ok();
}

Result<bool> OpenDirect(OpenedFile& job) {
  int fd;
  do {
    fd = ::open(job.shard->path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  } while (fd < 0 && errno == EINTR);
  if (fd >= 0) {
    job.direct = PosixFile::Adopt(fd);
    return true;
  }
  if (errno == EINVAL) return false;  // The filesystem has no O_DIRECT.
  return PosixError("cannot open with O_DIRECT", errno);
}

Status CheckUnchanged(const OpenedFile& job) {
  if (job.store) return Status::Ok();
  TL_ASSIGN_OR_RETURN(FileIdentity now, job.buffered.Identity());
  if (now.size != job.identity.size || now.mtime_ns != job.identity.mtime_ns) {
    return IOError("the file was modified during the load (size " +
                   std::to_string(job.identity.size) + " -> " + std::to_string(now.size) +
                   ", or its modification time changed)");
  }
  struct stat st;
  if (::stat(job.shard->path.c_str(), &st) != 0) {
    return PosixError("the file was removed during the load", errno);
  }
  if (static_cast<uint64_t>(st.st_dev) != job.identity.device ||
      static_cast<uint64_t>(st.st_ino) != job.identity.inode) {
    return IOError("the file was replaced during the load");
  }
  return Status::Ok();
}

std::string SliceNote(const OpenedFile& job, const LoadOptions& options) {
  size_t n = 0;
  for (size_t i = 0; i < job.slices.size(); ++i) n += SliceOf(job, i) != nullptr;
  if (n == 0) return "";
  return "; " + std::to_string(n) + " slice(s) for rank " + std::to_string(options.parallel.rank) +
         " of " + std::to_string(options.parallel.size);
}

LoadedTensor MakeTensor(const TensorInfo& info, Dtype dtype, void* data, uint64_t nbytes,
                        const TensorSlice* slice) {
  LoadedTensor t;
  t.name = info.name;
  t.dtype = dtype;
  const auto& shape = slice ? slice->shape : info.shape;
  t.shape.assign(shape.begin(), shape.end());
  SetRowMajorStrides(&t);
  t.data = data;
  t.nbytes = nbytes;
  return t;
}

void ProgressReporter::Report(uint64_t done, bool final_call) {
  if (!callback_) return;
  const auto now = std::chrono::steady_clock::now();
  if (!final_call && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  Progress p;
  p.bytes_done = done;
  p.bytes_total = total_;
  p.seconds = std::chrono::duration<double>(now - start_).count();
  callback_(p);
}

}  // namespace tensorlift
