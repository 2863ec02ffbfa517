// The nanobind extension's shared pieces (private to python/src/): the one
// mapping of Status codes to Python exceptions (Raise), conversions between
// the public C++ types and Python objects, the Python-side owners of
// checkpoints and loads, and the Bind* function of each file of the module
// (tensorlift_ext.cc calls them in order). Everything here runs with the GIL
// held unless it says otherwise.
#ifndef TENSORLIFT_PYTHON_EXT_COMMON_H_
#define TENSORLIFT_PYTHON_EXT_COMMON_H_

#include <Python.h>
#include <dlpack/dlpack.h>
#include <nanobind/nanobind.h>
// Every type caster the module's signatures use, in every file of it (a
// signature whose caster is missing compiles, and fails when called).
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "tensorlift/checkpoint.h"
#include "tensorlift/loader.h"
#include "tensorlift/objstore.h"
#include "tensorlift/safetensors.h"
#include "tensorlift/status.h"

namespace nb = nanobind;

namespace tensorlift::ext {

// Sets the Python exception of `st`'s code (FormatError for kCorruption,
// FileNotFoundError, PermissionError, OSError, ValueError, IndexError,
// MemoryError, NotImplementedError, ConnectionError; else RuntimeError) and
// throws nb::python_error.
[[noreturn]] void Raise(const Status& st);

template <typename T>
T Unwrap(Result<T> r) {
  if (!r.ok()) Raise(r.status());
  return std::move(r).value();
}

nb::object MetadataToPy(const std::optional<Metadata>& m);
inline nb::str Str(std::string_view s) { return nb::str(s.data(), s.size()); }
// (name, dtype, shape, begin, end).
nb::tuple TensorTuple(const TensorInfo& t);
// (name, dtype, shape, data_ptr, nbytes) tuples from Python -> TensorViews.
std::vector<TensorView> ToViews(
    const std::vector<
        std::tuple<std::string, std::string, std::vector<uint64_t>, uintptr_t, uint64_t>>& specs);
std::optional<Metadata> ToMetadata(const std::optional<nb::dict>& md);

// A DLPack capsule that runs the deleter unless a consumer took it (and
// renamed it "used_...", as the protocol says).
template <typename Managed>
nb::object MakeCapsule(Managed* m, const char* name) {
  PyCapsule_Destructor dtor = [](PyObject* cap) {
    const char* n =
        std::is_same_v<Managed, DLManagedTensorVersioned> ? "dltensor_versioned" : "dltensor";
    if (PyCapsule_IsValid(cap, n)) {
      auto* managed = static_cast<Managed*>(PyCapsule_GetPointer(cap, n));
      if (managed && managed->deleter) managed->deleter(managed);
    }
  };
  PyObject* cap = PyCapsule_New(m, name, dtor);
  if (cap == nullptr) {
    m->deleter(m);
    throw nb::python_error();
  }
  return nb::steal(cap);
}

struct PyCheckpoint {
  std::shared_ptr<const Checkpoint> ckpt;
  // Set for a checkpoint in object storage (s3://, gs://): how to reach it.
  std::optional<ObjectStoreOptions> store;
};

struct PyLoaded {
  std::shared_ptr<const LoadedCheckpoint> loaded;
  const LoadedCheckpoint& get() const {
    if (!loaded) Raise(InvalidArgumentError("the loaded checkpoint was released"));
    return *loaded;
  }
};

// The module's parts, each in its own file.
void BindErrors(nb::module_& m);       // ext_common.cc
void BindCheckpoint(nb::module_& m);   // ext_checkpoint.cc
void BindArenaPool(nb::module_& m);    // ext_checkpoint.cc
void BindLoaded(nb::module_& m);       // ext_checkpoint.cc
void BindStreamer(nb::module_& m);     // ext_stream.cc
void BindPeerServer(nb::module_& m);   // ext_remote.cc
void BindServing(nb::module_& m);      // ext_remote.cc
void BindPeerLoading(nb::module_& m);  // ext_remote.cc
void BindFormat(nb::module_& m);       // ext_format.cc
void BindMultiRank(nb::module_& m);    // ext_format.cc
void BindUtilities(nb::module_& m);    // ext_format.cc

}  // namespace tensorlift::ext

#endif  // TENSORLIFT_PYTHON_EXT_COMMON_H_
