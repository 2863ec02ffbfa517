// The streams and events of the host-emulated device (private to device/;
// how they work is in emulated_device.h): each stream runs its work on a
// worker thread, in order, on the memory of the DeviceState it shares
// (emulated_memory.h).
#ifndef TENSORLIFT_DEVICE_EMULATED_STREAM_H_
#define TENSORLIFT_DEVICE_EMULATED_STREAM_H_

#include <memory>

#include "device/device.h"
#include "device/emulated_memory.h"

namespace tensorlift::emulated {

// A new stream of the device whose state is `device`, or null when out of
// memory.
std::unique_ptr<DeviceStream> NewStream(std::shared_ptr<DeviceState> device);
// A new event (recorded on the device's streams), or null when out of memory.
std::unique_ptr<DeviceEvent> NewEvent();

}  // namespace tensorlift::emulated

#endif  // TENSORLIFT_DEVICE_EMULATED_STREAM_H_
