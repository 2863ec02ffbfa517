// Checksums of tensor bytes: XXH3-64 (seed 0), the hash tensorlift prints
// (`tensorlift load --checksum`) and puts in peer manifests.
#ifndef TENSORLIFT_CHECKSUM_H_
#define TENSORLIFT_CHECKSUM_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace tensorlift {

uint64_t Xxh3_64(const void* data, size_t size);
// 16 lowercase hex digits.
std::string HexU64(uint64_t value);

}  // namespace tensorlift

#endif  // TENSORLIFT_CHECKSUM_H_
