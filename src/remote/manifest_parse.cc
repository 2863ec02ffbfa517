// The per-rank manifest's validating parser, ParseManifest (the type and its
// serialization: manifest.cc).
//
// JSON shape (compact, one object; every field required but "handover", no
// others allowed; docs/remote.md, "Manifest", has an example):
//
//   {"protocol":1,
//    "key":{"model":S,"revision":S,"dtype":S,"quantization":S,"layout":S},
//    "parallel":{"size":N,"rank":N},
//    "chunk_bytes":N,            4096 .. 2^30
//    "worker_address":HEX,       UCX worker address, lowercase hex ("" allowed)
//    "rate_limit":N,             bytes/s for this client, 0 = unlimited
//    "regions":[{"address":N,"bytes":N,"rkey":HEX}, ...],
//    "total_bytes":N,            sum of the tensors' nbytes
//    "tensors":[{"name":S,"dtype":"BF16","shape":[N,...],"nbytes":N,
//                "region":N,"offset":N,"shard_dim":-1|D,"shard_start":N,
//                "full_shape":[N,...],"xxh3":["16 hex digits", ...]}, ...],
//    "handover":{"host":S,"socket":S[,"device":S]}}   optional: same-host handover
//                                offered; "device": the regions are that device's memory
//
// N is a JSON integer (u64 fields up to 2^64-1, shape entries up to 2^63-1);
// HEX is an even-length string of lowercase hex digits (binary bytes);
// checksums are exactly 16 lowercase hex digits, one per chunk_bytes piece of
// the tensor's bytes. The parser takes nothing on trust: every number is
// bounded (ManifestLimits) and all arithmetic on them is checked before use.
#include <simdjson.h>

#include <algorithm>
#include <array>
#include <string>
#include <utility>

#include "common/checked_math.h"
#include "format/json.h"
#include "remote/manifest.h"
#include "tensorlift/checksum.h"
#include "tensorlift/text.h"

namespace tensorlift::remote {
namespace {

using json::As;
using json::TypeName;

using simdjson::dom::element;
using simdjson::dom::element_type;

// The deepest a valid manifest nests is 4 (root, tensors, tensor, shape);
// simdjson counts a scalar in the deepest container as one more level.
constexpr size_t kMaxJsonDepth = 8;
constexpr uint64_t kMinChunkBytes = 4096;
constexpr uint64_t kMaxChunkBytes = 1ull << 30;

// Names the object a message is about; the text is built only on failure.
struct Where {
  std::string_view kind;       // "" (the root), "key", "parallel", "regions", "tensors".
  size_t index = 0;            // For "regions" and "tensors".
  std::string_view name = {};  // The tensor's name, once known.
  bool named = false;

  std::string Prefix() const {
    if (kind.empty()) return "";
    if (named) return "tensor " + QuoteName(name) + ": ";
    if (kind == "regions" || kind == "tensors") {
      return std::string(kind) + "[" + std::to_string(index) + "]: ";
    }
    return std::string(kind) + ": ";
  }
};

Status Bad(const Where& w, std::string what) {
  return CorruptionError("manifest: " + w.Prefix() + what);
}

Status WrongType(const Where& w, std::string_view field, std::string_view expected, element el) {
  return Bad(w, std::string(field) + " must be " + std::string(expected) + ", found " +
                    std::string(TypeName(el.type())));
}

// Collects the fields of object `el` named in `names` (each once, no others)
// into `out`, in `names` order. All are required, but those whose bit is set
// in `optional`; `present` (when given) says which were there.
template <size_t N>
Status GetFields(element el, const Where& w, std::string_view what,
                 const std::array<std::string_view, N>& names, std::array<element, N>* out,
                 uint64_t optional = 0, std::array<bool, N>* present = nullptr) {
  if (el.type() != element_type::OBJECT) return WrongType(w, what, "an object", el);
  std::array<bool, N> seen{};
  for (auto field : As<simdjson::dom::object>(el)) {
    size_t i = 0;
    while (i < N && names[i] != field.key) ++i;
    if (i == N) return Bad(w, "unknown field " + QuoteName(field.key));
    if (seen[i]) return Bad(w, "duplicate field `" + std::string(names[i]) + "`");
    seen[i] = true;
    (*out)[i] = field.value;
  }
  for (size_t i = 0; i < N; ++i) {
    if (!seen[i] && !(optional >> i & 1))
      return Bad(w, "missing field `" + std::string(names[i]) + "`");
  }
  if (present) *present = seen;
  return Status::Ok();
}

// A JSON integer in [0, 2^64).
Status GetU64(element el, const Where& w, std::string_view field, uint64_t* out) {
  switch (el.type()) {
    case element_type::UINT64:
      *out = As<uint64_t>(el);
      return Status::Ok();
    case element_type::INT64: {
      const int64_t v = As<int64_t>(el);
      if (v < 0) {
        return Bad(
            w, std::string(field) + " must be a non-negative integer, found " + std::to_string(v));
      }
      *out = static_cast<uint64_t>(v);
      return Status::Ok();
    }
    default:
      return WrongType(w, field, "a non-negative integer", el);
  }
}

// A JSON integer in [lo, hi].
Status GetInt(element el, const Where& w, std::string_view field, int64_t lo, int64_t hi,
              int64_t* out) {
  if (el.type() == element_type::UINT64) {
    return Bad(w, std::string(field) + " " + std::to_string(As<uint64_t>(el)) + " is not in [" +
                      std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  if (el.type() != element_type::INT64) return WrongType(w, field, "an integer", el);
  const int64_t v = As<int64_t>(el);
  if (v < lo || v > hi) {
    return Bad(w, std::string(field) + " " + std::to_string(v) + " is not in [" +
                      std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  *out = v;
  return Status::Ok();
}

Status GetString(element el, const Where& w, std::string_view field, std::string_view* out) {
  if (el.type() != element_type::STRING) return WrongType(w, field, "a string", el);
  *out = As<std::string_view>(el);
  return Status::Ok();
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// Binary bytes as an even-length lowercase hex string, at most `max_bytes`.
Status GetHex(element el, const Where& w, std::string_view field, uint64_t max_bytes,
              std::string* out) {
  std::string_view s;
  TL_RETURN_IF_ERROR(GetString(el, w, field, &s));
  if (s.size() % 2 != 0) {
    return Bad(w, std::string(field) + ": hex string of odd length " + std::to_string(s.size()));
  }
  if (s.size() / 2 > max_bytes) {
    return Bad(w, std::string(field) + ": " + std::to_string(s.size() / 2) +
                      " bytes, more than the limit of " + std::to_string(max_bytes));
  }
  out->resize(s.size() / 2);
  for (size_t i = 0; i < s.size(); i += 2) {
    const int hi = HexDigit(s[i]), lo = HexDigit(s[i + 1]);
    if (hi < 0 || lo < 0) {
      return Bad(w, std::string(field) + ": not lowercase hex at character " +
                        std::to_string(hi < 0 ? i : i + 1));
    }
    (*out)[i / 2] = static_cast<char>((hi << 4) | lo);
  }
  return Status::Ok();
}

// A checksum: exactly 16 lowercase hex digits.
// A content hash (tensorlift/content.h): 32 lowercase hex digits.
Status GetHash128(element el, const Where& w, std::string_view field, Hash128* out) {
  std::string_view hex;
  TL_RETURN_IF_ERROR(GetString(el, w, field, &hex));
  if (!Hash128::IsCanonicalHex(hex)) {
    return Bad(w, std::string(field) + " must be 32 lowercase hex digits, found " + QuoteName(hex));
  }
  *out = *Hash128::FromHex(hex);
  return Status::Ok();
}

Status GetChecksum(element el, const Where& w, size_t index, uint64_t* out) {
  std::string_view s;
  const std::string field = "xxh3[" + std::to_string(index) + "]";
  TL_RETURN_IF_ERROR(GetString(el, w, field, &s));
  if (s.size() != 16) {
    return Bad(w, field + " must be 16 lowercase hex digits, found " + std::to_string(s.size()) +
                      " characters");
  }
  uint64_t v = 0;
  for (char c : s) {
    const int d = HexDigit(c);
    if (d < 0) return Bad(w, field + " must be 16 lowercase hex digits, found " + QuoteName(s));
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  *out = v;
  return Status::Ok();
}

// A shape: at most max_dims entries, each in [0, 2^63).
Status GetShape(element el, const Where& w, std::string_view field, int max_dims,
                std::vector<int64_t>* out) {
  if (el.type() != element_type::ARRAY) return WrongType(w, field, "an array of integers", el);
  auto arr = As<simdjson::dom::array>(el);
  const size_t n = arr.size();
  if (n > static_cast<size_t>(std::max(max_dims, 0))) {
    return Bad(w, std::string(field) + " has " + std::to_string(n) +
                      " dims, more than the limit of " + std::to_string(max_dims));
  }
  out->clear();
  out->reserve(n);
  for (element dim : arr) {
    int64_t v;
    TL_RETURN_IF_ERROR(GetInt(dim, w, std::string(field) + " entry", 0, INT64_MAX, &v));
    out->push_back(v);
  }
  return Status::Ok();
}

// Bytes of `shape` in `dtype`: checked, whole bytes.
Status ShapeBytes(const Where& w, std::string_view field, const std::vector<int64_t>& shape,
                  Dtype dtype, uint64_t* bytes) {
  uint64_t elements = 1;
  for (int64_t d : shape) {
    if (!CheckedMul(elements, static_cast<uint64_t>(d), &elements)) {
      return Bad(w, "the element count of " + std::string(field) + " " + ShapeText(shape) +
                        " overflows 64 bits");
    }
  }
  uint64_t bits;
  if (!CheckedMul(elements, static_cast<uint64_t>(DtypeBits(dtype)), &bits)) {
    return Bad(w, std::to_string(elements) + " elements of " + std::string(DtypeName(dtype)) +
                      " overflow 64 bits");
  }
  if (bits % 8 != 0) {
    return Bad(w, std::string(field) + " " + ShapeText(shape) + " of " +
                      std::string(DtypeName(dtype)) + " is " + std::to_string(bits) +
                      " bits, not a whole number of bytes");
  }
  *bytes = bits / 8;
  return Status::Ok();
}

Status ParseKey(element el, PeerKey* key) {
  const Where w{"key"};
  static constexpr std::array<std::string_view, 5> kNames = {"model", "revision", "dtype",
                                                             "quantization", "layout"};
  std::array<element, 5> f;
  if (el.type() != element_type::OBJECT) return WrongType(Where{}, "key", "an object", el);
  TL_RETURN_IF_ERROR(GetFields(el, w, "key", kNames, &f));
  std::string dtype;
  std::string* members[] = {&key->model, &key->revision, &dtype, &key->quantization, &key->layout};
  for (size_t i = 0; i < kNames.size(); ++i) {
    std::string_view s;
    TL_RETURN_IF_ERROR(GetString(f[i], w, kNames[i], &s));
    members[i]->assign(s);
  }
  auto parsed = ParsePeerKeyDtype(dtype);
  if (!parsed.ok()) return Bad(w, "dtype " + QuoteName(dtype) + " is not a dtype");
  key->dtype = *parsed;
  return Status::Ok();
}

Status ParseParallel(element el, const ManifestLimits& limits, TensorParallel* parallel) {
  const Where w{"parallel"};
  static constexpr std::array<std::string_view, 2> kNames = {"size", "rank"};
  std::array<element, 2> f;
  if (el.type() != element_type::OBJECT) return WrongType(Where{}, "parallel", "an object", el);
  TL_RETURN_IF_ERROR(GetFields(el, w, "parallel", kNames, &f));
  int64_t size, rank;
  TL_RETURN_IF_ERROR(GetInt(f[0], w, "size", 1, std::max(limits.max_world, 1), &size));
  TL_RETURN_IF_ERROR(GetInt(f[1], w, "rank", 0, size - 1, &rank));
  parallel->size = static_cast<int>(size);
  parallel->rank = static_cast<int>(rank);
  return Status::Ok();
}

Status ParseRegion(element el, size_t index, const ManifestLimits& limits, Region* region) {
  const Where w{"regions", index};
  static constexpr std::array<std::string_view, 3> kNames = {"address", "bytes", "rkey"};
  std::array<element, 3> f;
  TL_RETURN_IF_ERROR(GetFields(el, w, "the region", kNames, &f));
  TL_RETURN_IF_ERROR(GetU64(f[0], w, "address", &region->address));
  TL_RETURN_IF_ERROR(GetU64(f[1], w, "bytes", &region->bytes));
  TL_RETURN_IF_ERROR(GetHex(f[2], w, "rkey", limits.max_binary_bytes, &region->rkey));
  uint64_t end;
  if (!CheckedAdd(region->address, region->bytes, &end)) {
    return Bad(w, "address " + std::to_string(region->address) + " + bytes " +
                      std::to_string(region->bytes) + " overflows 64 bits");
  }
  return Status::Ok();
}

Status ParseTensor(element el, size_t index, const Manifest& m, const ManifestLimits& limits,
                   ManifestTensor* t) {
  Where w{"tensors", index};
  static constexpr std::array<std::string_view, 11> kNames = {
      "name",      "dtype",       "shape",      "nbytes", "region", "offset",
      "shard_dim", "shard_start", "full_shape", "xxh3",   "xxh128"};
  enum {
    kName,
    kDtype,
    kShape,
    kNbytes,
    kRegion,
    kOffset,
    kShardDim,
    kShardStart,
    kFullShape,
    kXxh3,
    kXxh128
  };
  std::array<element, 11> f;
  std::array<bool, 11> present;
  TL_RETURN_IF_ERROR(GetFields(el, w, "the tensor", kNames, &f, uint64_t{1} << kXxh128, &present));

  // Name first, so that every later message names the tensor.
  std::string_view name;
  TL_RETURN_IF_ERROR(GetString(f[kName], w, "name", &name));
  if (name.empty()) return Bad(w, "name must not be empty");
  if (name.size() > limits.max_name_bytes) {
    return Bad(w, "name of " + std::to_string(name.size()) + " bytes is longer than the limit of " +
                      std::to_string(limits.max_name_bytes));
  }
  if (!simdjson::validate_utf8(name.data(), name.size())) return Bad(w, "name is not valid UTF-8");
  t->name.assign(name);
  w.name = t->name;
  w.named = true;

  std::string_view dtype;
  TL_RETURN_IF_ERROR(GetString(f[kDtype], w, "dtype", &dtype));
  auto d = DtypeFromName(dtype);
  if (!d) return Bad(w, "unknown dtype " + QuoteName(dtype));
  t->dtype = *d;

  TL_RETURN_IF_ERROR(GetShape(f[kShape], w, "shape", limits.max_dims, &t->shape));
  TL_RETURN_IF_ERROR(GetShape(f[kFullShape], w, "full_shape", limits.max_dims, &t->full_shape));
  if (t->full_shape.size() != t->shape.size()) {
    return Bad(w, "full_shape " + ShapeText(t->full_shape) + " has " +
                      std::to_string(t->full_shape.size()) + " dims but shape " +
                      ShapeText(t->shape) + " has " + std::to_string(t->shape.size()));
  }

  TL_RETURN_IF_ERROR(GetU64(f[kNbytes], w, "nbytes", &t->nbytes));
  uint64_t bytes;
  TL_RETURN_IF_ERROR(ShapeBytes(w, "shape", t->shape, t->dtype, &bytes));
  if (bytes != t->nbytes) {
    return Bad(w, std::string(DtypeName(t->dtype)) + " " + ShapeText(t->shape) + " needs " +
                      std::to_string(bytes) + " bytes but nbytes is " + std::to_string(t->nbytes));
  }
  uint64_t full_bytes;
  TL_RETURN_IF_ERROR(ShapeBytes(w, "full_shape", t->full_shape, t->dtype, &full_bytes));

  uint64_t region;
  TL_RETURN_IF_ERROR(GetU64(f[kRegion], w, "region", &region));
  if (region >= m.regions.size()) {
    return Bad(w, "region " + std::to_string(region) + " is out of range: the manifest has " +
                      std::to_string(m.regions.size()) + " regions");
  }
  t->region = static_cast<uint32_t>(region);
  TL_RETURN_IF_ERROR(GetU64(f[kOffset], w, "offset", &t->offset));
  const uint64_t region_bytes = m.regions[region].bytes;
  uint64_t end;
  if (!CheckedAdd(t->offset, t->nbytes, &end) || end > region_bytes) {
    return Bad(w, "offset " + std::to_string(t->offset) + " + nbytes " + std::to_string(t->nbytes) +
                      " past region " + std::to_string(region) + "'s " +
                      std::to_string(region_bytes) + " bytes");
  }

  const int64_t ndims = static_cast<int64_t>(t->shape.size());
  int64_t shard_dim;
  TL_RETURN_IF_ERROR(GetInt(f[kShardDim], w, "shard_dim", -1, ndims - 1, &shard_dim));
  t->shard_dim = static_cast<int>(shard_dim);
  TL_RETURN_IF_ERROR(GetInt(f[kShardStart], w, "shard_start", 0, INT64_MAX, &t->shard_start));
  if (t->shard_dim == -1) {
    if (t->shard_start != 0) {
      return Bad(w, "shard_start " + std::to_string(t->shard_start) +
                        " must be 0 for a whole tensor (shard_dim -1)");
    }
    if (t->full_shape != t->shape) {
      return Bad(w, "full_shape " + ShapeText(t->full_shape) + " must equal shape " +
                        ShapeText(t->shape) + " for a whole tensor (shard_dim -1)");
    }
  } else {
    for (int64_t i = 0; i < ndims; ++i) {
      if (i == t->shard_dim) continue;
      if (t->shape[i] != t->full_shape[i]) {
        return Bad(w, "shape " + ShapeText(t->shape) + " differs from full_shape " +
                          ShapeText(t->full_shape) + " in dim " + std::to_string(i) +
                          ", which is not the shard dim " + std::to_string(t->shard_dim));
      }
    }
    const int64_t dim = t->shard_dim;
    uint64_t shard_end;
    if (!CheckedAdd(static_cast<uint64_t>(t->shard_start), static_cast<uint64_t>(t->shape[dim]),
                    &shard_end) ||
        shard_end > static_cast<uint64_t>(t->full_shape[dim])) {
      return Bad(w, "shard_start " + std::to_string(t->shard_start) + " + shape[" +
                        std::to_string(dim) + "] " + std::to_string(t->shape[dim]) +
                        " is past full_shape[" + std::to_string(dim) + "] " +
                        std::to_string(t->full_shape[dim]));
    }
  }

  if (f[kXxh3].type() != element_type::ARRAY) {
    return WrongType(w, "xxh3", "an array of checksums", f[kXxh3]);
  }
  auto sums = As<simdjson::dom::array>(f[kXxh3]);
  const uint64_t chunks = t->nbytes / m.chunk_bytes + (t->nbytes % m.chunk_bytes != 0 ? 1 : 0);
  const size_t count = sums.size();
  if (count != chunks) {
    return Bad(w, "xxh3 has " + std::to_string(count) + " checksums but nbytes " +
                      std::to_string(t->nbytes) + " in chunks of " + std::to_string(m.chunk_bytes) +
                      " bytes needs " + std::to_string(chunks));
  }
  t->chunk_xxh3.clear();
  t->chunk_xxh3.reserve(count);
  size_t i = 0;
  for (element s : sums) {
    uint64_t v;
    TL_RETURN_IF_ERROR(GetChecksum(s, w, i++, &v));
    t->chunk_xxh3.push_back(v);
  }
  t->xxh128.reset();
  if (present[kXxh128]) {
    Hash128 h;
    TL_RETURN_IF_ERROR(GetHash128(f[kXxh128], w, "xxh128", &h));
    t->xxh128 = h;
  }
  return Status::Ok();
}

// The manifest's "handover": where same-host clients are handed the tensors.
Status ParseHandover(element handover, Manifest* m) {
  const Where w{"handover"};
  static constexpr std::array<std::string_view, 3> kHandoverNames = {"host", "socket", "device"};
  std::array<element, 3> h;
  std::array<bool, 3> given;
  TL_RETURN_IF_ERROR(
      GetFields(handover, w, "handover", kHandoverNames, &h, uint64_t{1} << 2, &given));
  std::string* const out[3] = {&m->handover_host, &m->handover_socket, &m->handover_device};
  for (int i = 0; i < 3; ++i) {
    if (!given[i]) continue;
    if (h[i].type() != element_type::STRING)
      return WrongType(w, kHandoverNames[i], "a string", h[i]);
    const std::string_view v = As<std::string_view>(h[i]);
    if (v.empty() || v.size() > 200 ||
        !std::all_of(v.begin(), v.end(), [](char c) { return c > ' ' && c < 127; })) {
      return Bad(w, std::string(kHandoverNames[i]) +
                        " must be 1 to 200 printable characters without spaces");
    }
    *out[i] = std::string(v);
  }
  return Status::Ok();
}

// The content identity: a root (`content`, null: none given), every tensor's
// hash, and the root theirs.
Status CheckContent(const element* content, Manifest* m) {
  const Where root{};
  size_t hashed = 0;
  for (const ManifestTensor& t : m->tensors) hashed += t.xxh128.has_value();
  if (content == nullptr) {
    if (hashed != 0) {
      return Bad(root, std::to_string(hashed) + " tensors have an xxh128 but there is no content");
    }
    return Status::Ok();
  }
  Hash128 h;
  TL_RETURN_IF_ERROR(GetHash128(*content, root, "content", &h));
  if (hashed != m->tensors.size()) {
    return Bad(root, "content is given but " + std::to_string(m->tensors.size() - hashed) +
                         " of the " + std::to_string(m->tensors.size()) +
                         " tensors have no xxh128");
  }
  std::vector<TensorContent> contents;
  contents.reserve(m->tensors.size());
  for (const ManifestTensor& t : m->tensors)
    contents.push_back({t.name, t.dtype, t.shape, t.nbytes, *t.xxh128});
  const Hash128 want = ContentRoot(contents);
  if (want != h) {
    return Bad(root, "content " + h.Hex() + " is not the root of its tensors' xxh128 (" +
                         want.Hex() + ")");
  }
  m->content = h;
  return Status::Ok();
}

}  // namespace

Result<Manifest> ParseManifest(std::string_view json, const ManifestLimits& limits) {
  const Where root{};
  if (json.size() > limits.max_json_bytes) {
    return Bad(root, "the manifest has " + std::to_string(json.size()) +
                         " bytes, more than the limit of " + std::to_string(limits.max_json_bytes));
  }
  simdjson::dom::parser parser;
  if (parser.allocate(std::max<size_t>(json.size(), 64), kMaxJsonDepth) != simdjson::SUCCESS) {
    return ResourceExhaustedError("manifest: cannot allocate a JSON parser for " +
                                  std::to_string(json.size()) + " bytes");
  }
  element doc;
  // realloc_if_needed: the input is copied into a padded buffer.
  if (auto err = parser.parse(json.data(), json.size(), /*realloc_if_needed=*/true).get(doc)) {
    return Bad(root, std::string("invalid JSON: ") + simdjson::error_message(err));
  }

  static constexpr std::array<std::string_view, 11> kNames = {
      "protocol", "key",         "parallel", "chunk_bytes", "worker_address", "rate_limit",
      "regions",  "total_bytes", "tensors",  "handover",    "content"};
  enum {
    kProtocol,
    kKey,
    kParallel,
    kChunkBytes,
    kWorker,
    kRateLimit,
    kRegions,
    kTotal,
    kTensors,
    kHandover,
    kContent
  };
  std::array<element, 11> f;
  std::array<bool, 11> present;
  TL_RETURN_IF_ERROR(GetFields(doc, root, "the manifest", kNames, &f,
                               (uint64_t{1} << kHandover) | (uint64_t{1} << kContent), &present));

  Manifest m;
  int64_t protocol;
  TL_RETURN_IF_ERROR(GetInt(f[kProtocol], root, "protocol", 1, INT32_MAX, &protocol));
  m.key.protocol = static_cast<int>(protocol);
  TL_RETURN_IF_ERROR(ParseKey(f[kKey], &m.key));
  if (Status s = m.key.Validate(); !s.ok()) return CorruptionError("manifest: " + s.message());
  TL_RETURN_IF_ERROR(ParseParallel(f[kParallel], limits, &m.parallel));

  TL_RETURN_IF_ERROR(GetU64(f[kChunkBytes], root, "chunk_bytes", &m.chunk_bytes));
  if (m.chunk_bytes < kMinChunkBytes || m.chunk_bytes > kMaxChunkBytes) {
    return Bad(root, "chunk_bytes " + std::to_string(m.chunk_bytes) + " is not in [" +
                         std::to_string(kMinChunkBytes) + ", " + std::to_string(kMaxChunkBytes) +
                         "]");
  }
  TL_RETURN_IF_ERROR(
      GetHex(f[kWorker], root, "worker_address", limits.max_binary_bytes, &m.worker_address));
  TL_RETURN_IF_ERROR(GetU64(f[kRateLimit], root, "rate_limit", &m.rate_limit));

  if (f[kRegions].type() != element_type::ARRAY) {
    return WrongType(root, "regions", "an array", f[kRegions]);
  }
  auto regions = As<simdjson::dom::array>(f[kRegions]);
  const size_t num_regions = regions.size();
  if (num_regions > limits.max_regions || num_regions > UINT32_MAX) {
    return Bad(root, std::to_string(num_regions) + " regions, more than the limit of " +
                         std::to_string(std::min<uint64_t>(limits.max_regions, UINT32_MAX)));
  }
  m.regions.resize(num_regions);
  size_t index = 0;
  for (element r : regions) {
    TL_RETURN_IF_ERROR(ParseRegion(r, index, limits, &m.regions[index]));
    ++index;
  }

  if (f[kTensors].type() != element_type::ARRAY) {
    return WrongType(root, "tensors", "an array", f[kTensors]);
  }
  auto tensors = As<simdjson::dom::array>(f[kTensors]);
  const size_t num_tensors = tensors.size();
  if (num_tensors > limits.max_tensors) {
    return Bad(root, std::to_string(num_tensors) + " tensors, more than the limit of " +
                         std::to_string(limits.max_tensors));
  }
  m.tensors.resize(num_tensors);
  uint64_t sum = 0;
  index = 0;
  for (element t : tensors) {
    ManifestTensor& mt = m.tensors[index];
    TL_RETURN_IF_ERROR(ParseTensor(t, index, m, limits, &mt));
    if (!CheckedAdd(sum, mt.nbytes, &sum) || sum > limits.max_total_bytes) {
      return Bad(root, "the tensors' bytes exceed the limit of " +
                           std::to_string(limits.max_total_bytes) + " at tensor " +
                           QuoteName(mt.name));
    }
    ++index;
  }
  TL_RETURN_IF_ERROR(GetU64(f[kTotal], root, "total_bytes", &m.total_bytes));
  if (m.total_bytes != sum) {
    return Bad(root, "total_bytes " + std::to_string(m.total_bytes) + " != " + std::to_string(sum) +
                         ", the sum of the tensors' nbytes");
  }

  if (present[kHandover]) TL_RETURN_IF_ERROR(ParseHandover(f[kHandover], &m));
  TL_RETURN_IF_ERROR(CheckContent(present[kContent] ? &f[kContent] : nullptr, &m));

  // Name order, names unique. stable_sort: std::sort degrades on some orders.
  std::stable_sort(
      m.tensors.begin(), m.tensors.end(),
      [](const ManifestTensor& a, const ManifestTensor& b) { return a.name < b.name; });
  for (size_t i = 1; i < m.tensors.size(); ++i) {
    if (m.tensors[i].name == m.tensors[i - 1].name) {
      return Bad(root, "tensor " + QuoteName(m.tensors[i].name) + " appears more than once");
    }
  }
  return m;
}

}  // namespace tensorlift::remote
