// The safetensors format (parse_header, serialize, serialize_file), dtype
// conversion, the multi-rank rules (include/tensorlift/assign.h) and small
// utilities (ucx_version, release_pinned_staging, dtype_bits).

#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "ext_common.h"
#include "tensorlift/assign.h"
#include "tensorlift/capabilities.h"
#include "tensorlift/convert.h"

namespace tensorlift::ext {

void BindFormat(nb::module_& m) {
  m.def(
      "parse_header",
      [](nb::bytes data) {
        auto span =
            std::span<const std::byte>(static_cast<const std::byte*>(data.data()), data.size());
        Header h = Unwrap(Header::Parse(span));
        nb::list tensors;
        for (const auto& t : h.tensors()) tensors.append(TensorTuple(t));
        return nb::make_tuple(tensors, MetadataToPy(h.metadata()), h.data_offset());
      },
      nb::arg("data"),
      "Validates a whole file held in bytes: (tensors in file order, metadata, data_offset).");

  using Spec = std::tuple<std::string, std::string, std::vector<uint64_t>, uintptr_t, uint64_t>;
  m.def(
      "serialize",
      [](const std::vector<Spec>& specs, std::optional<nb::dict> metadata) {
        auto views = ToViews(specs);
        auto md = ToMetadata(metadata);
        Result<std::vector<std::byte>> r = InternalError("not run");
        {
          nb::gil_scoped_release nogil;
          r = Serialize(views, md);
        }
        auto bytes = Unwrap(std::move(r));
        return nb::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
      },
      nb::arg("tensors"), nb::arg("metadata") = nb::none(),
      "tensors: (name, dtype, shape, data_ptr, nbytes); bytes identical to the reference "
      "writer's.");
  m.def(
      "serialize_file",
      [](const std::vector<Spec>& specs, const std::string& path,
         std::optional<nb::dict> metadata) {
        auto views = ToViews(specs);
        auto md = ToMetadata(metadata);
        Status st;
        {
          nb::gil_scoped_release nogil;
          st = WriteFile(path, views, md);
        }
        if (!st.ok()) Raise(st);
      },
      nb::arg("tensors"), nb::arg("path"), nb::arg("metadata") = nb::none(),
      "Writes through a temporary file renamed over `path`.");
}

namespace {

// convert: `data`'s elements converted from one dtype to another, as new bytes.
nb::bytes ConvertPy(nb::bytes data, const std::string& from_dtype, const std::string& to_dtype) {
  auto from = DtypeFromName(from_dtype);
  if (!from) Raise(InvalidArgumentError("unknown dtype '" + from_dtype + "'"));
  auto to = DtypeFromName(to_dtype);
  if (!to) Raise(InvalidArgumentError("unknown dtype '" + to_dtype + "'"));
  const uint64_t from_bits = DtypeBits(*from);
  const uint64_t to_bits = DtypeBits(*to);
  if (data.size() * 8 % from_bits != 0) {
    Raise(InvalidArgumentError(std::to_string(data.size()) + " bytes are not a whole number of " +
                               from_dtype + " elements"));
  }
  const uint64_t count = data.size() * 8 / from_bits;
  // Checks the pair (the C++ message) before anything is allocated.
  if (Status pair = ConvertOnHost(nullptr, *to, nullptr, *from, 0); !pair.ok()) Raise(pair);
  // A new bytes object nobody else sees yet: filled without the GIL.
  PyObject* out = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(count * to_bits / 8));
  if (out == nullptr) throw nb::python_error();
  nb::bytes result = nb::steal<nb::bytes>(out);
  auto* dst = reinterpret_cast<std::byte*>(PyBytes_AsString(out));
  const auto* src = static_cast<const std::byte*>(data.data());
  Status st;
  {
    nb::gil_scoped_release nogil;
    st = ConvertOnHost(dst, *to, src, *from, count);
  }
  if (!st.ok()) Raise(st);
  return result;
}

}  // namespace

// The multi-rank rules of include/tensorlift/assign.h, for the
// fastsafetensors API: which rank reads which file, and a rank's shard.
void BindMultiRank(nb::module_& m) {
  m.def(
      "assign_whole_files",
      [](const std::vector<uint64_t>& file_bytes, int world) {
        std::vector<std::vector<uint64_t>> tensor_bytes;
        tensor_bytes.reserve(file_bytes.size());
        for (uint64_t b : file_bytes) tensor_bytes.push_back({b});
        AssignOptions options;
        options.whole_files = true;
        Result<Assignment> a = AssignByBytes(tensor_bytes, world, options);
        if (!a.ok()) Raise(a.status());
        std::vector<std::vector<uint32_t>> files(a->ranks.size());
        for (size_t r = 0; r < a->ranks.size(); ++r) {
          for (const ReadPiece& p : a->ranks[r].pieces) files[r].push_back(p.file);
        }
        return files;
      },
      nb::arg("file_bytes"), nb::arg("world"),
      "Each rank's files (indices into file_bytes, ascending) under the multi-rank loader's "
      "whole-file rule (AssignByBytes with whole_files): largest first, each to the rank with the "
      "fewest bytes (ties: fewer files, then the lower rank).");
  m.def(
      "shard_range",
      [](int64_t extent, int rank, int world) {
        Result<IndexRange> r = ShardRange(extent, rank, world);
        if (!r.ok()) Raise(r.status());
        return std::make_pair(r->start, r->length);
      },
      nb::arg("extent"), nb::arg("rank"), nb::arg("world"),
      "(start, length) of rank's part of a dim of `extent`: tensorlift's one shard-range rule "
      "(blocks of ceil(extent / world), the last ones clipped; ValueError for bad arguments).");
}

// ucx_version, release_pinned_staging, dtype_bits and convert.
void BindUtilities(nb::module_& m) {
  m.def(
      "ucx_version",
      [] {
        RemoteCapabilities r = QueryRemoteCapabilities();
        return r.ucx_built ? std::optional<std::string>(r.ucx_version) : std::nullopt;
      },
      "The UCX peer loading uses, loaded at run time (Debian's libucp.so.0, or the build "
      "TENSORLIFT_UCX_LIB names): '1.13.1 (libucp.so.0)', or 'not loadable: <why>'; None when "
      "tensorlift was built without UCX (then serving and pulling raise).");
  m.def("release_pinned_staging", &ReleasePinnedStaging,
        "Frees the pinned staging memory GPU loads keep for the next load onto the same device; "
        "the bytes freed (a load running keeps its own until it ends).");
  m.def("dtype_bits", [](const std::string& d) {
    auto dt = DtypeFromName(d);
    if (!dt) Raise(InvalidArgumentError("unknown dtype '" + d + "'"));
    return DtypeBits(*dt);
  });
  m.def("convert", &ConvertPy, nb::arg("data"), nb::arg("from_dtype"), nb::arg("to_dtype"),
        "Converts the elements in `data` (safetensors dtype names) with the loader's conversions "
        "(bit-exact with torch's scalar CPU conversions); ValueError for an unknown name or pair.");
}

}  // namespace tensorlift::ext
