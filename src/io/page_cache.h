// How much of a file range is in the page cache (mincore over a temporary
// mapping). Used by IoMode::kAuto.
#ifndef TENSORLIFT_IO_PAGE_CACHE_H_
#define TENSORLIFT_IO_PAGE_CACHE_H_

#include <cstdint>

#include "tensorlift/status.h"

namespace tensorlift {

// The fraction (0..1) of the pages of [offset, offset + length) of `fd` that
// are resident: exact up to 64 MiB, estimated from 16 pages in every 256 above
// (mincore costs about 20 ms per GB). An empty range counts as fully resident.
Result<double> ResidentFraction(int fd, uint64_t offset, uint64_t length);

}  // namespace tensorlift

#endif  // TENSORLIFT_IO_PAGE_CACHE_H_
