// Built instead of cufile.cc without CUDA or without cufile.h.
#include "io/cufile.h"

namespace tensorlift {

struct CuFileApi {};

bool CuFileBuiltIn() { return false; }

Result<CuFileLibrary> LoadCuFileLibrary() {
  return UnimplementedError("built without GPUDirect Storage (" TENSORLIFT_NO_CUFILE_REASON ")");
}

CuFileDriver::Handle::~Handle() = default;
CuFileDriver::Handle::Handle(Handle&&) noexcept {}
CuFileDriver::Handle& CuFileDriver::Handle::operator=(Handle&&) noexcept { return *this; }
void CuFileDriver::Handle::Reset() {}

Result<std::unique_ptr<CuFileDriver>> CuFileDriver::Open() {
  return UnimplementedError("built without GPUDirect Storage (" TENSORLIFT_NO_CUFILE_REASON ")");
}

// No CuFileDriver can exist: Open() never makes one.
CuFileDriver::~CuFileDriver() = default;
Result<CuFileDriver::Handle> CuFileDriver::Register(int) {
  return UnimplementedError("built without GPUDirect Storage");
}
Status CuFileDriver::RegisterBuffer(void*, uint64_t) {
  return UnimplementedError("built without GPUDirect Storage");
}
Result<uint64_t> CuFileDriver::Read(const Handle&, void*, uint64_t, uint64_t, uint64_t) {
  return UnimplementedError("built without GPUDirect Storage");
}

}  // namespace tensorlift
