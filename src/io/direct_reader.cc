#include "io/direct_reader.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "io/cufile.h"

namespace tensorlift {
namespace {

// GPUDirect Storage through cuFile (io/cufile.h).
class CuFileReader final : public DirectReader {
 public:
  CuFileReader(std::unique_ptr<CuFileDriver> driver, size_t files)
      : driver_(std::move(driver)), handles_(files) {}
  Status AddFile(uint32_t file, int fd) override {
    TL_ASSIGN_OR_RETURN(handles_[file], driver_->Register(fd));
    return Status::Ok();
  }
  Status AddBuffer(std::byte* device_base, uint64_t bytes) override {
    return driver_->RegisterBuffer(device_base, bytes);
  }
  Status Read(uint32_t file, std::byte* device_base, uint64_t offset, uint64_t bytes,
              uint64_t file_offset) override {
    TL_ASSIGN_OR_RETURN(uint64_t n,
                        driver_->Read(handles_[file], device_base, bytes, file_offset, offset));
    if (n != bytes) {
      return IOError("short read: " + std::to_string(n) + " of " + std::to_string(bytes) +
                     " bytes at offset " + std::to_string(file_offset) +
                     " (the file was truncated during the load)");
    }
    return Status::Ok();
  }

 private:
  std::unique_ptr<CuFileDriver> driver_;       // Outlives the handles (declared first).
  std::vector<CuFileDriver::Handle> handles_;  // By file number.
};

}  // namespace

Result<std::unique_ptr<DirectReader>> OpenCuFileReader(size_t files) {
  TL_ASSIGN_OR_RETURN(auto driver, CuFileDriver::Open());
  return std::unique_ptr<DirectReader>(std::make_unique<CuFileReader>(std::move(driver), files));
}

}  // namespace tensorlift
