// Copies a checkpoint held in host memory onto a device: what a peer load
// does with the tensors it pulled into host memory when its destination is a
// device (PeerLoadOptions::device), since pulls land in host memory where
// UCX has no transport for the device's memory (docs/remote.md).
#ifndef TENSORLIFT_LOAD_UPLOAD_H_
#define TENSORLIFT_LOAD_UPLOAD_H_

#include <memory>

#include "device/device.h"
#include "tensorlift/loader.h"
#include "tensorlift/status.h"

namespace tensorlift {

// The tensors of `host` (host memory) in one allocation on `device`, each
// aligned to 256 bytes, with the same names, dtypes, shapes and file reports;
// host's buffers are released when it returns. InvalidArgument when a tensor
// is not in host memory; ResourceExhausted when the device is full.
Result<LoadedCheckpoint> UploadToDevice(LoadedCheckpoint&& host, std::shared_ptr<Device> device);

}  // namespace tensorlift

#endif  // TENSORLIFT_LOAD_UPLOAD_H_
