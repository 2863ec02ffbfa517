// DLPack export of loaded tensors: the managed tensor's context holds a
// reference to the buffer, so the bytes outlive the LoadedCheckpoint until
// the consumer calls the deleter.
#include <dlpack/dlpack.h>

#include <new>

#include "load/owners.h"
#include "tensorlift/loader.h"
#include "tensorlift/text.h"

static_assert(DLPACK_MAJOR_VERSION >= 1, "tensorlift needs DLPack 1.x (DLManagedTensorVersioned)");

namespace tensorlift {
namespace {

DLDataType ToDLDataType(Dtype d) {
  const auto bits = static_cast<uint8_t>(DtypeBits(d));
  switch (d) {
    case Dtype::kBool:
      return {kDLBool, 8, 1};
    case Dtype::kF4:
      return {kDLFloat4_e2m1fn, 4, 1};
    case Dtype::kF6_E2M3:
      return {kDLFloat6_e2m3fn, 6, 1};
    case Dtype::kF6_E3M2:
      return {kDLFloat6_e3m2fn, 6, 1};
    case Dtype::kU8:
    case Dtype::kU16:
    case Dtype::kU32:
    case Dtype::kU64:
      return {kDLUInt, bits, 1};
    case Dtype::kI8:
    case Dtype::kI16:
    case Dtype::kI32:
    case Dtype::kI64:
      return {kDLInt, bits, 1};
    case Dtype::kF8_E5M2:
      return {kDLFloat8_e5m2, 8, 1};
    case Dtype::kF8_E4M3:
      return {kDLFloat8_e4m3fn, 8, 1};
    case Dtype::kF8_E8M0:
      return {kDLFloat8_e8m0fnu, 8, 1};
    case Dtype::kF8_E4M3FNUZ:
      return {kDLFloat8_e4m3fnuz, 8, 1};
    case Dtype::kF8_E5M2FNUZ:
      return {kDLFloat8_e5m2fnuz, 8, 1};
    case Dtype::kF16:
    case Dtype::kF32:
    case Dtype::kF64:
      return {kDLFloat, bits, 1};
    case Dtype::kBF16:
      return {kDLBfloat, 16, 1};
    case Dtype::kC64:
      return {kDLComplex, 64, 1};
  }
  return {kDLUInt, 8, 1};
}

// Owns what the DLTensor points at besides the data.
struct ExportContext {
  std::shared_ptr<Buffer> buffer;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
};

template <typename Managed>
void FillTensor(Managed* m, ExportContext* ctx, const LoadedTensor& t, bool raw_bytes) {
  DLTensor& dl = m->dl_tensor;
  dl.data = t.data;
  switch (t.device) {
    case DeviceType::kCpu:
      dl.device = {kDLCPU, 0};
      break;
    case DeviceType::kCuda:
      dl.device = {kDLCUDA, t.device_index};
      break;
    case DeviceType::kEmulated:
      dl.device = {kDLExtDev, t.device_index};
      break;
  }
  dl.ndim = static_cast<int32_t>(ctx->shape.size());
  dl.dtype = raw_bytes ? DLDataType{kDLUInt, 8, 1} : ToDLDataType(t.dtype);
  dl.shape = ctx->shape.data();
  dl.strides = ctx->strides.data();
  dl.byte_offset = 0;
  m->manager_ctx = ctx;
}

ExportContext* NewContext(const LoadedTensor& t, std::shared_ptr<Buffer> owner, bool raw_bytes) {
  return raw_bytes ? new (std::nothrow)
                         ExportContext{std::move(owner), {static_cast<int64_t>(t.nbytes)}, {1}}
                   : new (std::nothrow) ExportContext{std::move(owner), t.shape, t.strides};
}

Result<DLManagedTensorVersioned*> ExportVersioned(const LoadedTensor& t,
                                                  std::shared_ptr<Buffer> owner, bool raw_bytes) {
  ExportContext* ctx = NewContext(t, std::move(owner), raw_bytes);
  if (ctx == nullptr) return ResourceExhaustedError("out of memory");
  auto* m = new (std::nothrow) DLManagedTensorVersioned{};
  if (m == nullptr) {
    delete ctx;
    return ResourceExhaustedError("out of memory");
  }
  m->version = {DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
  m->flags = 0;  // Writable, not a copy.
  FillTensor(m, ctx, t, raw_bytes);
  m->deleter = [](DLManagedTensorVersioned* self) {
    delete static_cast<ExportContext*>(self->manager_ctx);
    delete self;
  };
  return m;
}

Result<const LoadedTensor*> FindForExport(const LoadedCheckpoint& ckpt, std::string_view name) {
  const LoadedTensor* t = ckpt.Find(name);
  if (t == nullptr) return NotFoundError("no loaded tensor named " + QuoteName(name));
  return t;
}

}  // namespace

Result<DLManagedTensorVersioned*> StreamedTensor::ToDLPackVersioned(bool raw_bytes) const {
  return ExportVersioned(*tensor_, owner_, raw_bytes);
}

Result<DLManagedTensorVersioned*> LoadedCheckpoint::ToDLPackVersioned(std::string_view name,
                                                                      bool raw_bytes) const {
  TL_ASSIGN_OR_RETURN(const LoadedTensor* t, FindForExport(*this, name));
  return ExportVersioned(*t, owners_->buffers[t - tensors_.data()], raw_bytes);
}

Result<DLManagedTensor*> LoadedCheckpoint::ToDLPack(std::string_view name, bool raw_bytes) const {
  TL_ASSIGN_OR_RETURN(const LoadedTensor* t, FindForExport(*this, name));
  ExportContext* ctx = NewContext(*t, owners_->buffers[t - tensors_.data()], raw_bytes);
  if (ctx == nullptr) return ResourceExhaustedError("out of memory");
  auto* m = new (std::nothrow) DLManagedTensor{};
  if (m == nullptr) {
    delete ctx;
    return ResourceExhaustedError("out of memory");
  }
  FillTensor(m, ctx, *t, raw_bytes);
  m->deleter = [](DLManagedTensor* self) {
    delete static_cast<ExportContext*>(self->manager_ctx);
    delete self;
  };
  return m;
}

}  // namespace tensorlift
