// Internals of the host-emulated device (device.h, MakeEmulatedDevice) that
// tests look at: how much memory is live, quarantined and pinned, and what the
// "device" holds at an address, poisoned freed memory included.
//
// How the emulated device works (emulated_device.cc, emulated_memory.cc,
// emulated_stream.cc):
// - Each Allocate() is mapped twice: PROT_NONE at the address handed out
//   (the "device address": a host access faults) and read/write for the
//   stream workers only (private memory; a memfd shared with other
//   processes once exported, Device::Export/Import). Stream ops translate device addresses through
//   a table of allocations; a range not inside one live allocation is an "illegal address" error,
//   one inside a freed allocation a "use after free" error, both returned by the stream's next
//   Synchronize() (and by events recorded after them).
// - Freed allocations are filled with kEmulatedPoison and stay mapped in a
//   bounded quarantine (oldest unmapped first), so their addresses are not
//   handed out again while quarantined; an allocation larger than the whole
//   quarantine is unmapped at once.
// - A stream's errors are sticky, as CUDA's asynchronous errors are: after
//   the first failed op the stream skips its remaining work and every later
//   Synchronize() and Record() reports that first error.
#ifndef TENSORLIFT_DEVICE_EMULATED_DEVICE_H_
#define TENSORLIFT_DEVICE_EMULATED_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "device/device.h"
#include "device/emulated_counts.h"
#include "tensorlift/status.h"

namespace tensorlift {

// The default bound on quarantined (freed, still mapped) device memory.
inline constexpr uint64_t kEmulatedQuarantineBytes = 256ull << 20;

// MakeEmulatedDevice with a given quarantine bound (0: unmap at once).
std::shared_ptr<Device> MakeEmulatedDeviceWithQuarantine(const EmulatedDeviceOptions& options,
                                                         uint64_t quarantine_bytes);

// The counts of an emulated device; InvalidArgument for any other device.
// Thread-safe.
Result<EmulatedDeviceCounts> GetEmulatedDeviceCounts(Device& device);

// Copies `bytes` at device address `src`, which must lie inside one live or
// quarantined allocation, to host memory `dst`, at once and on the calling
// thread (no stream order): a test's look at what the device holds, poison
// included. InvalidArgument for a range that is not inside one allocation or
// a device that is not emulated. Thread-safe.
Status PeekEmulatedDevice(Device& device, std::byte* dst, const std::byte* src, uint64_t bytes);

}  // namespace tensorlift

#endif  // TENSORLIFT_DEVICE_EMULATED_DEVICE_H_
