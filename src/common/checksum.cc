#include "tensorlift/checksum.h"

#include <xxhash.h>

namespace tensorlift {

uint64_t Xxh3_64(const void* data, size_t size) { return XXH3_64bits(data, size); }

std::string HexU64(uint64_t value) {
  static const char kHex[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, value >>= 4) s[i] = kHex[value & 15];
  return s;
}

}  // namespace tensorlift
