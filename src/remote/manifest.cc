// The per-rank manifest: the type, its compact JSON (the shape that
// ParseManifest, in manifest_parse.cc, takes, which says it field by field)
// and the chunk checksums a source publishes.
#include "remote/manifest.h"

#include <algorithm>
#include <string>

#include "tensorlift/checksum.h"
#include "tensorlift/text.h"

namespace tensorlift::remote {

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

namespace {

void AppendShape(const std::vector<int64_t>& shape, std::string* out) {
  *out += '[';
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) *out += ',';
    *out += std::to_string(shape[i]);
  }
  *out += ']';
}

void AppendHex(std::string_view bytes, std::string* out) {
  static constexpr char kDigits[] = "0123456789abcdef";
  out->push_back('"');
  for (char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    out->push_back(kDigits[b >> 4]);
    out->push_back(kDigits[b & 15]);
  }
  out->push_back('"');
}

}  // namespace

std::string Manifest::ToJson() const {
  std::string out;
  out.reserve(512 + tensors.size() * 160);
  out += "{\"protocol\":" + std::to_string(key.protocol);
  out += ",\"key\":{\"model\":";
  AppendJsonString(key.model, &out);
  out += ",\"revision\":";
  AppendJsonString(key.revision, &out);
  out += ",\"dtype\":";
  AppendJsonString(PeerKeyDtypeName(key.dtype), &out);
  out += ",\"quantization\":";
  AppendJsonString(key.quantization, &out);
  out += ",\"layout\":";
  AppendJsonString(key.layout, &out);
  out += "},\"parallel\":{\"size\":" + std::to_string(parallel.size) +
         ",\"rank\":" + std::to_string(parallel.rank) + "}";
  out += ",\"chunk_bytes\":" + std::to_string(chunk_bytes);
  out += ",\"worker_address\":";
  AppendHex(worker_address, &out);
  out += ",\"rate_limit\":" + std::to_string(rate_limit);
  out += ",\"regions\":[";
  for (size_t i = 0; i < regions.size(); ++i) {
    const Region& r = regions[i];
    if (i) out += ',';
    out += "{\"address\":" + std::to_string(r.address) + ",\"bytes\":" + std::to_string(r.bytes) +
           ",\"rkey\":";
    AppendHex(r.rkey, &out);
    out += '}';
  }
  out += "],\"total_bytes\":" + std::to_string(total_bytes);
  out += ",\"tensors\":[";
  for (size_t i = 0; i < tensors.size(); ++i) {
    const ManifestTensor& t = tensors[i];
    if (i) out += ',';
    out += "{\"name\":";
    AppendJsonString(t.name, &out);
    out += ",\"dtype\":\"";
    out += DtypeName(t.dtype);
    out += "\",\"shape\":";
    AppendShape(t.shape, &out);
    out += ",\"nbytes\":" + std::to_string(t.nbytes);
    out += ",\"region\":" + std::to_string(t.region);
    out += ",\"offset\":" + std::to_string(t.offset);
    out += ",\"shard_dim\":" + std::to_string(t.shard_dim);
    out += ",\"shard_start\":" + std::to_string(t.shard_start);
    out += ",\"full_shape\":";
    // A whole tensor built without full_shape: it is its shape.
    AppendShape(t.full_shape.empty() && t.shard_dim == -1 ? t.shape : t.full_shape, &out);
    out += ",\"xxh3\":[";
    for (size_t c = 0; c < t.chunk_xxh3.size(); ++c) {
      if (c) out += ',';
      out += '"';
      out += HexU64(t.chunk_xxh3[c]);
      out += '"';
    }
    out += ']';
    if (t.xxh128) out += ",\"xxh128\":\"" + t.xxh128->Hex() + '"';
    out += '}';
  }
  out += "]";
  if (content) out += ",\"content\":\"" + content->Hex() + '"';
  if (!handover_socket.empty()) {
    out += ",\"handover\":{\"host\":";
    AppendJsonString(handover_host, &out);
    out += ",\"socket\":";
    AppendJsonString(handover_socket, &out);
    if (!handover_device.empty()) {
      out += ",\"device\":";
      AppendJsonString(handover_device, &out);
    }
    out += '}';
  }
  out += '}';
  return out;
}

const ManifestTensor* Manifest::Find(std::string_view name) const {
  auto it =
      std::lower_bound(tensors.begin(), tensors.end(), name,
                       [](const ManifestTensor& t, std::string_view n) { return t.name < n; });
  if (it == tensors.end() || it->name != name) return nullptr;
  return &*it;
}

std::vector<uint64_t> ChunkChecksums(const void* data, uint64_t nbytes, uint64_t chunk_bytes) {
  std::vector<uint64_t> out;
  if (nbytes == 0) return out;
  if (chunk_bytes == 0) chunk_bytes = nbytes;  // One chunk.
  out.reserve(nbytes / chunk_bytes + 1);
  const auto* p = static_cast<const unsigned char*>(data);
  for (uint64_t off = 0; off < nbytes; off += chunk_bytes) {
    const uint64_t n = std::min(chunk_bytes, nbytes - off);
    out.push_back(Xxh3_64(p + off, n));
  }
  return out;
}

}  // namespace tensorlift::remote
