// tl_limits: the machine's limits for the load benchmark (bench/load/),
// measured without any tensorlift code in the timed path.
//
//   tl_limits read RANGES [--queue-depth 32] [--block-mib 8 | --block-kib N] [--pages thp|4k]
//                         [--prefault 0|1] [--populate-ahead N] [--buffered 0|1]
//       O_DIRECT reads, through one io_uring, of every file's span of tensor
//       bytes into one 4 KiB-aligned fresh buffer (its page faults timed), then
//       XXH3-64 over each tensor's bytes (the pass every contender makes).
//       --prefault 1 faults the buffer in before the clock starts (the device
//       alone); --populate-ahead N faults it in on N more threads, in 32 MiB
//       steps taken in turn (MADV_POPULATE_WRITE), while the reads run.
//       --buffered 1 reads through the page cache instead, on queue-depth
//       threads each taking the next block (pread; io_uring would copy cached
//       pages on one thread): the warm limit, page cache to memory. RANGES is a text file:
//         file PATH
//         range OFFSET LENGTH      (absolute file offsets; one per tensor)
//       Prints {"read_s", "hash_s", "total_s", "bytes_read", "tensor_bytes",
//       "tensors", "xor", "peak_rss_bytes", ...}.
//   tl_limits memcpy BYTES [--threads N] [--pages thp|4k] [--settle-ms MS]
//       memcpy bandwidth from a pre-faulted source into fresh memory (page
//       faults included; each fresh buffer is mapped after MS ms of rest, so
//       that a VM's free-page reporting can take back freed memory as it does
//       between real runs) and into pre-faulted memory, on 1 and on N threads
//       (default: all CPUs), best of 3; and the XXH3-64 rate over the same
//       buffer. Prints one JSON object.
//   tl_limits resident FILE...
//       The fraction of each file's pages in the page cache (mincore).
//
// --pages: fresh buffers use transparent huge pages (MADV_HUGEPAGE, as the
// loader's arenas do; the default) or base pages (MADV_NOHUGEPAGE).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#ifdef TL_LIMITS_HAVE_URING
#include <liburing.h>
#endif

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kAlign = 4096;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "tl_limits: %s\n", msg.c_str());
  std::exit(1);
}

uint64_t PeakRss() {
  struct rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;
}

bool g_thp = true;         // --pages
bool g_prefault = false;   // --prefault
int g_populate_ahead = 0;  // --populate-ahead: threads
bool g_buffered = false;   // --buffered

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14.
#endif
int g_settle_ms = 0;  // --settle-ms

std::byte* MapAnon(uint64_t bytes) {
  void* p = ::mmap(nullptr, std::max<uint64_t>(bytes, 1), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) Die("mmap of " + std::to_string(bytes) + " bytes: " + std::strerror(errno));
  ::madvise(p, bytes, g_thp ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);  // Advisory.
  return static_cast<std::byte*>(p);
}

struct FileRanges {
  std::string path;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // (offset, length)
  uint64_t span_begin = 0, span_end = 0;              // 4 KiB-aligned.
  uint64_t buffer_offset = 0;
  int fd = -1;
};

std::vector<FileRanges> ReadRangesFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) Die("cannot open " + path);
  std::vector<FileRanges> files;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("file ", 0) == 0) {
      files.push_back({});
      files.back().path = line.substr(5);
    } else if (line.rfind("range ", 0) == 0) {
      if (files.empty()) Die("range before file in " + path);
      std::istringstream ss(line.substr(6));
      uint64_t off = 0, len = 0;
      if (!(ss >> off >> len)) Die("bad line in " + path + ": " + line);
      files.back().ranges.emplace_back(off, len);
    } else if (!line.empty()) {
      Die("bad line in " + path + ": " + line);
    }
  }
  return files;
}

#ifdef TL_LIMITS_HAVE_URING
int CmdRead(const std::string& ranges_path, int depth, uint64_t block) {
  std::vector<FileRanges> files = ReadRangesFile(ranges_path);
  auto t0 = Clock::now();
  uint64_t total = 0;
  for (auto& f : files) {
    uint64_t lo = UINT64_MAX, hi = 0;
    for (auto [off, len] : f.ranges) {
      if (len == 0) continue;
      lo = std::min(lo, off);
      hi = std::max(hi, off + len);
    }
    if (hi == 0) lo = 0;
    f.span_begin = lo / kAlign * kAlign;
    f.span_end = (hi + kAlign - 1) / kAlign * kAlign;
    f.buffer_offset = total;
    total += f.span_end - f.span_begin;
    f.fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC | (g_buffered ? 0 : O_DIRECT));
    if (f.fd < 0) Die("open " + f.path + ": " + std::strerror(errno));
  }
  std::byte* buf = MapAnon(total);
  if (g_prefault) {
    std::memset(buf, 0, total);
    t0 = Clock::now();
  }
  std::vector<std::thread> populate;
  std::atomic<uint64_t> next_step{0};
  for (int t = 0; t < g_populate_ahead; ++t) {
    populate.emplace_back([buf, total, &next_step] {
      constexpr uint64_t kStep = 32ull << 20;
      for (uint64_t off; (off = next_step.fetch_add(1) * kStep) < total;) {
        if (::madvise(buf + off, std::min(kStep, total - off), MADV_POPULATE_WRITE) != 0) break;
      }
    });
  }

  struct Read {
    int fd;
    uint64_t offset, length, done;
    std::byte* dest;
  };
  std::vector<Read> reads;
  for (auto& f : files) {
    for (uint64_t off = f.span_begin; off < f.span_end; off += block) {
      reads.push_back({f.fd, off, std::min(block, f.span_end - off), 0,
                       buf + f.buffer_offset + (off - f.span_begin)});
    }
  }
  uint64_t bytes_read = 0;
  if (g_buffered) {
    std::atomic<size_t> next_read{0};
    std::atomic<uint64_t> read_total{0};
    std::vector<std::thread> readers;
    for (int t = 0; t < depth; ++t) {
      readers.emplace_back([&] {
        for (size_t i; (i = next_read.fetch_add(1)) < reads.size();) {
          Read& rd = reads[i];
          while (rd.done < rd.length) {
            const ssize_t n =
                ::pread(rd.fd, rd.dest + rd.done, rd.length - rd.done, rd.offset + rd.done);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) Die("pread at " + std::to_string(rd.offset) + ": " + std::strerror(errno));
            if (n == 0) break;  // End of file (the last block is rounded up).
            rd.done += static_cast<uint64_t>(n);
          }
          read_total += rd.done;
        }
      });
    }
    for (auto& t : readers) t.join();
    bytes_read = read_total;
  }
  io_uring ring;
  int r = io_uring_queue_init(static_cast<unsigned>(depth), &ring, 0);
  if (r < 0) Die(std::string("io_uring_queue_init: ") + std::strerror(-r));
  size_t next = g_buffered ? reads.size() : 0, in_flight = 0;
  auto submit = [&](size_t i) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    if (sqe == nullptr) Die("submission queue full");
    Read& rd = reads[i];
    io_uring_prep_read(sqe, rd.fd, rd.dest + rd.done, static_cast<unsigned>(rd.length - rd.done),
                       rd.offset + rd.done);
    io_uring_sqe_set_data64(sqe, i);
    ++in_flight;
  };
  while (next < reads.size() || in_flight > 0) {
    bool queued = false;
    while (next < reads.size() && in_flight < static_cast<size_t>(depth)) {
      submit(next++);
      queued = true;
    }
    if (queued) {
      r = io_uring_submit(&ring);
      if (r < 0) Die(std::string("io_uring_submit: ") + std::strerror(-r));
    }
    io_uring_cqe* cqe = nullptr;
    r = io_uring_wait_cqe(&ring, &cqe);
    if (r == -EINTR) continue;
    if (r < 0) Die(std::string("io_uring_wait_cqe: ") + std::strerror(-r));
    const size_t i = io_uring_cqe_get_data64(cqe);
    const int res = cqe->res;
    io_uring_cqe_seen(&ring, cqe);
    --in_flight;
    Read& rd = reads[i];
    if (res == -EAGAIN || res == -EINTR) {
      submit(i);
      io_uring_submit(&ring);
      continue;
    }
    if (res < 0)
      Die("read of " + std::to_string(rd.length) + " bytes at " + std::to_string(rd.offset) + ": " +
          std::strerror(-res));
    rd.done += static_cast<uint64_t>(res);
    bytes_read += static_cast<uint64_t>(res);
    // A short read ends the span at end of file (the last block is rounded
    // up to 4 KiB); otherwise read the rest.
    if (res > 0 && rd.done < rd.length && rd.done % kAlign == 0) {
      submit(i);
      io_uring_submit(&ring);
    }
  }
  io_uring_queue_exit(&ring);
  for (auto& t : populate) t.join();
  const double read_s = Since(t0);

  const auto t1 = Clock::now();
  uint64_t x = 0, tensor_bytes = 0, tensors = 0;
  for (auto& f : files) {
    for (auto [off, len] : f.ranges) {
      x ^= XXH3_64bits(buf + f.buffer_offset + (off - f.span_begin), len);
      tensor_bytes += len;
      ++tensors;
    }
  }
  const double hash_s = Since(t1);
  const double total_s = Since(t0);
  for (auto& f : files) ::close(f.fd);
  std::printf(
      "{\"read_s\":%.6f,\"hash_s\":%.6f,\"total_s\":%.6f,\"bytes_read\":%llu,\"tensor_bytes\":%llu,"
      "\"tensors\":%llu,\"xor\":\"%016llx\",\"peak_rss_bytes\":%llu,\"queue_depth\":%d,\"block_"
      "size\":%llu,"
      "\"pages\":\"%s\",\"prefault\":%s,\"populate_ahead\":%d,\"buffered\":%s}\n",
      read_s, hash_s, total_s, static_cast<unsigned long long>(bytes_read),
      static_cast<unsigned long long>(tensor_bytes), static_cast<unsigned long long>(tensors),
      static_cast<unsigned long long>(x), static_cast<unsigned long long>(PeakRss()), depth,
      static_cast<unsigned long long>(block), g_thp ? "thp" : "4k", g_prefault ? "true" : "false",
      g_populate_ahead, g_buffered ? "true" : "false");
  ::munmap(buf, total);
  return 0;
}
#else
int CmdRead(const std::string&, int, uint64_t) {
  std::fprintf(stderr, "tl_limits: built without liburing; no O_DIRECT io_uring limit\n");
  return 3;
}
#endif

// Copies src to dst on `threads` threads (contiguous slices); seconds.
double ParallelCopy(std::byte* dst, const std::byte* src, uint64_t bytes, int threads) {
  const auto t0 = Clock::now();
  if (threads <= 1) {
    std::memcpy(dst, src, bytes);
  } else {
    std::vector<std::thread> pool;
    const uint64_t slice = (bytes / threads + kAlign - 1) / kAlign * kAlign;
    for (int t = 0; t < threads; ++t) {
      const uint64_t b = std::min(bytes, slice * t), e = std::min(bytes, slice * (t + 1));
      pool.emplace_back([=] { std::memcpy(dst + b, src + b, e - b); });
    }
    for (auto& th : pool) th.join();
  }
  return Since(t0);
}

int CmdMemcpy(uint64_t bytes, int threads) {
  std::byte* src = MapAnon(bytes);
  for (uint64_t i = 0; i < bytes; i += 8) {  // Pre-fault, with non-zero bytes.
    const uint64_t v = i * 0x9E3779B97F4A7C15ull;
    std::memcpy(src + i, &v, std::min<uint64_t>(8, bytes - i));
  }
  const double gb = bytes / 1e9;
  auto measure = [&](int n, bool fresh) {
    double best = 1e30;
    std::byte* dst = fresh ? nullptr : MapAnon(bytes);
    if (!fresh) ParallelCopy(dst, src, bytes, n);  // Fault it in.
    for (int rep = 0; rep < 3; ++rep) {
      if (fresh && g_settle_ms > 0) ::usleep(static_cast<useconds_t>(g_settle_ms) * 1000);
      if (fresh) dst = MapAnon(bytes);
      best = std::min(best, ParallelCopy(dst, src, bytes, n));
      if (fresh) ::munmap(dst, bytes);
    }
    if (!fresh) ::munmap(dst, bytes);
    return gb / best;
  };
  const double fresh_1 = measure(1, true), prefaulted_1 = measure(1, false);
  const double fresh_n = measure(threads, true), prefaulted_n = measure(threads, false);
  double hash_best = 1e30;
  uint64_t x = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = Clock::now();
    x ^= XXH3_64bits(src, bytes);
    hash_best = std::min(hash_best, Since(t0));
  }
  std::printf(
      "{\"bytes\":%llu,\"threads\":%d,\"fresh_1t_gbps\":%.3f,\"prefaulted_1t_gbps\":%.3f,"
      "\"fresh_nt_gbps\":%.3f,\"prefaulted_nt_gbps\":%.3f,\"xxh3_1t_gbps\":%.3f,\"pages\":\"%s\","
      "\"settle_ms\":%d,\"ignore\":%llu}\n",
      static_cast<unsigned long long>(bytes), threads, fresh_1, prefaulted_1, fresh_n, prefaulted_n,
      gb / hash_best, g_thp ? "thp" : "4k", g_settle_ms, static_cast<unsigned long long>(x & 1));
  ::munmap(src, bytes);
  return 0;
}

int CmdResident(int argc, char** argv) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  std::printf("{");
  for (int i = 0; i < argc; ++i) {
    int fd = ::open(argv[i], O_RDONLY | O_CLOEXEC);
    if (fd < 0) Die(std::string("open ") + argv[i] + ": " + std::strerror(errno));
    struct stat st;
    if (::fstat(fd, &st) != 0) Die("fstat");
    double frac = 1.0;
    if (st.st_size > 0) {
      const uint64_t size = static_cast<uint64_t>(st.st_size);
      void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) Die("mmap");
      const uint64_t pages = (size + page - 1) / page;
      std::vector<unsigned char> vec(pages);
      if (::mincore(p, size, vec.data()) != 0) Die("mincore");
      uint64_t res = 0;
      for (unsigned char v : vec) res += v & 1;
      frac = static_cast<double>(res) / pages;
      ::munmap(p, size);
    }
    ::close(fd);
    std::printf("%s\"%s\":%.6f", i ? "," : "", argv[i], frac);
  }
  std::printf("}\n");
  return 0;
}

int Usage() {
  std::fprintf(stderr,
               "usage: tl_limits read RANGES [--queue-depth N] [--block-mib N | --block-kib N] "
               "[--pages thp|4k] [--prefault 0|1] [--populate-ahead N] [--buffered 0|1]\n"
               "       tl_limits memcpy BYTES [--threads N] [--pages thp|4k] [--settle-ms MS]\n"
               "       tl_limits resident FILE...\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return Usage();
  const std::string cmd = argv[1];
  if (cmd == "resident") return CmdResident(argc - 2, argv + 2);
  int depth = 32, threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  uint64_t block = 8ull << 20;
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string opt = argv[i];
    const std::string val = argv[i + 1];
    const long v = std::strtol(val.c_str(), nullptr, 10);
    if (opt == "--pages" && (val == "thp" || val == "4k"))
      g_thp = val == "thp";
    else if (opt == "--prefault" && (val == "0" || val == "1"))
      g_prefault = val == "1";
    else if (opt == "--buffered" && (val == "0" || val == "1"))
      g_buffered = val == "1";
    else if (opt == "--populate-ahead" && v >= 0 && v <= 64)
      g_populate_ahead = static_cast<int>(v);
    else if (opt == "--settle-ms" && v >= 0)
      g_settle_ms = static_cast<int>(v);
    else if (v <= 0)
      return Usage();
    else if (opt == "--queue-depth")
      depth = static_cast<int>(v);
    else if (opt == "--block-mib")
      block = static_cast<uint64_t>(v) << 20;
    else if (opt == "--block-kib" && v % 4 == 0)
      block = static_cast<uint64_t>(v) << 10;
    else if (opt == "--threads")
      threads = static_cast<int>(v);
    else
      return Usage();
  }
  if (cmd == "read") return CmdRead(argv[2], depth, block);
  if (cmd == "memcpy") {
    const unsigned long long bytes = std::strtoull(argv[2], nullptr, 10);
    if (bytes == 0) return Usage();
    return CmdMemcpy(bytes, threads);
  }
  return Usage();
}
