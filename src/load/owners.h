// LoadedCheckpoint's buffer owners (private to the loader and DLPack export).
#ifndef TENSORLIFT_LOAD_OWNERS_H_
#define TENSORLIFT_LOAD_OWNERS_H_

#include <memory>
#include <vector>

#include "device/host_buffer.h"
#include "tensorlift/loader.h"

namespace tensorlift {

class Device;

struct LoadedCheckpoint::Owners {
  // buffers[i] owns tensors()[i]'s bytes; tensors of one file share one.
  std::vector<std::shared_ptr<Buffer>> buffers;
  // The device the tensors are on; null for host loads.
  std::shared_ptr<Device> device;
};

}  // namespace tensorlift

#endif  // TENSORLIFT_LOAD_OWNERS_H_
