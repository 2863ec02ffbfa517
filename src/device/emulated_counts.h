// What the host-emulated device counts (GetEmulatedDeviceCounts,
// emulated_device.h) and the byte it fills freed memory with: below both the
// device and its memory (emulated_memory.h). Included by emulated_device.h.
#ifndef TENSORLIFT_DEVICE_EMULATED_COUNTS_H_
#define TENSORLIFT_DEVICE_EMULATED_COUNTS_H_

#include <cstddef>
#include <cstdint>

namespace tensorlift {

// The byte freed device memory is filled with.
inline constexpr std::byte kEmulatedPoison{0xDB};

struct EmulatedDeviceCounts {
  uint64_t live_allocations = 0;
  uint64_t live_bytes = 0;  // As counted against memory_bytes.
  uint64_t quarantined_allocations = 0;
  uint64_t quarantined_bytes = 0;
  uint64_t pinned_allocations = 0;
  uint64_t pinned_bytes = 0;
  // Memory another process (or device) exported, mapped by Import: not
  // counted against memory_bytes, never poisoned.
  uint64_t imported_allocations = 0;
  uint64_t imported_bytes = 0;
};

}  // namespace tensorlift

#endif  // TENSORLIFT_DEVICE_EMULATED_COUNTS_H_
