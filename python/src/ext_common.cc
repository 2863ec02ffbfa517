// The extension's shared pieces (see ext_common.h): Raise and the exception
// classes it uses, conversions between C++ and Python values.
#include "ext_common.h"

namespace tensorlift::ext {
namespace {

PyObject* g_format_error = nullptr;

}  // namespace

[[noreturn]] void Raise(const Status& st) {
  PyObject* type = PyExc_RuntimeError;
  switch (st.code()) {
    case StatusCode::kCorruption:
      type = g_format_error;
      break;
    case StatusCode::kNotFound:
      type = PyExc_FileNotFoundError;
      break;
    case StatusCode::kPermissionDenied:
      type = PyExc_PermissionError;
      break;
    case StatusCode::kIOError:
      type = PyExc_OSError;
      break;
    case StatusCode::kInvalidArgument:
      type = PyExc_ValueError;
      break;
    case StatusCode::kOutOfRange:
      type = PyExc_IndexError;
      break;
    case StatusCode::kResourceExhausted:
      type = PyExc_MemoryError;
      break;
    case StatusCode::kUnimplemented:
      type = PyExc_NotImplementedError;
      break;
    case StatusCode::kUnavailable:
      type = PyExc_ConnectionError;
      break;
    default:
      break;
  }
  PyErr_SetString(type, st.message().c_str());
  throw nb::python_error();
}

nb::object MetadataToPy(const std::optional<Metadata>& m) {
  if (!m) return nb::none();
  nb::dict d;
  for (const auto& [k, v] : *m) d[nb::str(k.data(), k.size())] = nb::str(v.data(), v.size());
  return d;
}

nb::tuple TensorTuple(const TensorInfo& t) {
  nb::list shape;
  for (uint64_t d : t.shape) shape.append(d);
  return nb::make_tuple(Str(t.name), Str(DtypeName(t.dtype)), nb::tuple(shape), t.begin, t.end);
}

// (name, dtype, shape, data_ptr, nbytes) tuples from Python -> TensorViews.
std::vector<TensorView> ToViews(
    const std::vector<
        std::tuple<std::string, std::string, std::vector<uint64_t>, uintptr_t, uint64_t>>& specs) {
  std::vector<TensorView> views;
  views.reserve(specs.size());
  for (const auto& [name, dtype, shape, ptr, len] : specs) {
    auto d = DtypeFromName(dtype);
    if (!d) Raise(InvalidArgumentError("unknown dtype '" + dtype + "' for tensor '" + name + "'"));
    if (len > 0 && ptr == 0)
      Raise(InvalidArgumentError("tensor '" + name + "' has no data pointer"));
    views.push_back({name, *d, shape,
                     std::span<const std::byte>(reinterpret_cast<const std::byte*>(ptr), len)});
  }
  return views;
}

std::optional<Metadata> ToMetadata(const std::optional<nb::dict>& md) {
  if (!md) return std::nullopt;
  Metadata m;
  for (auto [k, v] : *md) {
    if (!nb::isinstance<nb::str>(k) || !nb::isinstance<nb::str>(v)) {
      Raise(InvalidArgumentError("metadata keys and values must be strings"));
    }
    m[nb::cast<std::string>(k)] = nb::cast<std::string>(v);
  }
  return m;
}

// SafetensorError: the common base of the errors about safetensors files and
// their use (as safetensors.SafetensorError is), so that code written for the
// reference can catch it. FormatError is also a ValueError; Raise uses it.
void BindErrors(nb::module_& m) {
  static nb::object safetensor_error = nb::steal(PyErr_NewExceptionWithDoc(
      "tensorlift.SafetensorError",
      "Base of tensorlift's safetensors errors (FormatError, missing tensor, closed file).",
      PyExc_Exception, nullptr));
  if (!safetensor_error.is_valid()) throw nb::python_error();
  m.attr("SafetensorError") = safetensor_error;
  nb::object format_bases = nb::steal(PyTuple_Pack(2, PyExc_ValueError, safetensor_error.ptr()));
  if (!format_bases.is_valid()) throw nb::python_error();
  static nb::object format_error = nb::steal(PyErr_NewExceptionWithDoc(
      "tensorlift.FormatError",
      "A file breaks the safetensors format (the message names the rule).", format_bases.ptr(),
      nullptr));
  if (!format_error.is_valid()) throw nb::python_error();
  g_format_error = format_error.ptr();
  m.attr("FormatError") = format_error;
}

}  // namespace tensorlift::ext
