#include "io/page_cache.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "common/posix_file.h"

namespace tensorlift {

Result<double> ResidentFraction(int fd, uint64_t offset, uint64_t length) {
  if (length == 0) return 1.0;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t start = offset / page * page;
  const uint64_t span = offset + length - start;
  void* p = ::mmap(nullptr, span, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(start));
  if (p == MAP_FAILED) return PosixError("mmap for mincore", errno);
  // One byte per page, in chunks to bound the vector (1 MiB covers 4 GiB).
  constexpr uint64_t kChunkPages = 1u << 20;
  std::vector<unsigned char> vec;
  uint64_t resident = 0, pages = (span + page - 1) / page;
  Status error;
  for (uint64_t first = 0; first < pages; first += kChunkPages) {
    const uint64_t n = std::min(kChunkPages, pages - first);
    vec.resize(n);
    const uint64_t bytes = std::min(n * page, span - first * page);
    if (::mincore(static_cast<char*>(p) + first * page, bytes, vec.data()) != 0) {
      error = PosixError("mincore", errno);
      break;
    }
    for (unsigned char v : vec) resident += v & 1;
  }
  ::munmap(p, span);
  if (!error.ok()) return error;
  return static_cast<double>(resident) / static_cast<double>(pages);
}

}  // namespace tensorlift
