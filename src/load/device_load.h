// A load onto a device (device_load.cc): the loader's and the layer
// streamer's way onto a device, whatever the checkpoint holds.
#ifndef TENSORLIFT_LOAD_DEVICE_LOAD_H_
#define TENSORLIFT_LOAD_DEVICE_LOAD_H_

#include <memory>

#include "tensorlift/checkpoint.h"
#include "tensorlift/loader.h"

namespace tensorlift {

class Device;

// A load onto `device` (options.device is not looked at): sparse groups
// decoded there when options.decode_sparse and the checkpoint has any
// (sparse_load.h, LoadSparseThroughDevice), else the staged pipeline
// (device_pipeline.h, LoadThroughDevice).
Result<LoadedCheckpoint> LoadOntoDevice(const Checkpoint& ckpt, const LoadOptions& options,
                                        const std::shared_ptr<Device>& device);

}  // namespace tensorlift

#endif  // TENSORLIFT_LOAD_DEVICE_LOAD_H_
