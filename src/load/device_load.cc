// A load onto a device (device_load.h).
#include "load/device_load.h"

#include "load/device_pipeline.h"
#include "load/sparse_load.h"

namespace tensorlift {

Result<LoadedCheckpoint> LoadOntoDevice(const Checkpoint& ckpt, const LoadOptions& options,
                                        const std::shared_ptr<Device>& device) {
  if (options.decode_sparse && MayBeSparse(ckpt))
    return LoadSparseThroughDevice(ckpt, options, device);
  return LoadThroughDevice(ckpt, options, device, nullptr);
}

}  // namespace tensorlift
