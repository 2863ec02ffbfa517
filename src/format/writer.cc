// The writer: byte-identical to the reference's serialize / serialize_to_file,
// except that metadata keys are sorted (the reference's order is random).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>

#include "common/checked_math.h"
#include "common/posix_file.h"
#include "io/faults.h"
#include "tensorlift/safetensors.h"
#include "tensorlift/text.h"

namespace tensorlift {
namespace {

Status CheckTensor(const TensorSpec& t) {
  const std::string who = "tensor " + QuoteName(t.name);
  if (t.name == "__metadata__") {
    return InvalidArgumentError(who + ": the name is reserved for metadata");
  }
  uint64_t nel = 1;
  for (uint64_t d : t.shape) {
    if (!CheckedMul(nel, d, &nel)) {
      return InvalidArgumentError(who + ": the element count of shape " + ShapeString(t.shape) +
                                  " overflows 64 bits");
    }
  }
  uint64_t nbits;
  if (!CheckedMul(nel, static_cast<uint64_t>(DtypeBits(t.dtype)), &nbits) || nbits % 8 != 0) {
    return InvalidArgumentError(who + ": " + std::to_string(nel) + " elements of " +
                                std::string(DtypeName(t.dtype)) +
                                " are not a whole number of bytes");
  }
  if (nbits / 8 != t.nbytes) {
    return InvalidArgumentError(who + ": " + std::string(DtypeName(t.dtype)) + " " +
                                ShapeString(t.shape) + " needs " + std::to_string(nbits / 8) +
                                " bytes but " + std::to_string(t.nbytes) + " were given");
  }
  return Status::Ok();
}

}  // namespace

Result<std::string> SerializeHeader(std::span<const TensorView> tensors,
                                    const std::optional<Metadata>& metadata,
                                    std::vector<size_t>* order) {
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const auto& t : tensors) specs.push_back({t.name, t.dtype, t.shape, t.data.size()});
  return SerializeHeader(std::span<const TensorSpec>(specs), metadata, order);
}

Result<std::string> SerializeHeader(std::span<const TensorSpec> tensors,
                                    const std::optional<Metadata>& metadata,
                                    std::vector<size_t>* order) {
  for (const auto& t : tensors) TL_RETURN_IF_ERROR(CheckTensor(t));
  order->resize(tensors.size());
  std::iota(order->begin(), order->end(), 0);
  std::sort(order->begin(), order->end(), [&](size_t a, size_t b) {
    if (tensors[a].dtype != tensors[b].dtype) return tensors[a].dtype > tensors[b].dtype;
    return tensors[a].name < tensors[b].name;
  });
  for (size_t i = 1; i < order->size(); ++i) {
    if (tensors[(*order)[i]].name == tensors[(*order)[i - 1]].name) {
      return InvalidArgumentError("tensor " + QuoteName(tensors[(*order)[i]].name) +
                                  " is given more than once");
    }
  }
  std::string json = "{";
  bool need_comma = false;
  if (metadata) {
    json += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : *metadata) {
      if (!first) json += ',';
      first = false;
      AppendJsonString(k, &json);
      json += ':';
      AppendJsonString(v, &json);
    }
    json += '}';
    need_comma = true;
  }
  uint64_t offset = 0;
  for (size_t i : *order) {
    const TensorSpec& t = tensors[i];
    if (need_comma) json += ',';
    need_comma = true;
    AppendJsonString(t.name, &json);
    json += ":{\"dtype\":\"";
    json += DtypeName(t.dtype);
    json += "\",\"shape\":[";
    for (size_t d = 0; d < t.shape.size(); ++d) {
      if (d) json += ',';
      json += std::to_string(t.shape[d]);
    }
    json += "],\"data_offsets\":[";
    json += std::to_string(offset);
    json += ',';
    offset += t.nbytes;
    json += std::to_string(offset);
    json += "]}";
    if (json.size() > kMaxHeaderSize) break;  // Reported below.
  }
  json += '}';
  json.append((8 - json.size() % 8) % 8, ' ');
  if (json.size() > kMaxHeaderSize) {
    return InvalidArgumentError("the header would be " + std::to_string(json.size()) +
                                " bytes or more, over the limit of " +
                                std::to_string(kMaxHeaderSize));
  }
  std::string out(8, '\0');
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += json;
  return out;
}

Result<std::vector<std::byte>> Serialize(std::span<const TensorView> tensors,
                                         const std::optional<Metadata>& metadata) {
  std::vector<size_t> order;
  TL_ASSIGN_OR_RETURN(std::string header, SerializeHeader(tensors, metadata, &order));
  size_t total = header.size();
  for (const auto& t : tensors) total += t.data.size();
  std::vector<std::byte> out(total);
  std::memcpy(out.data(), header.data(), header.size());
  size_t pos = header.size();
  for (size_t i : order) {
    if (!tensors[i].data.empty())
      std::memcpy(out.data() + pos, tensors[i].data.data(), tensors[i].data.size());
    pos += tensors[i].data.size();
  }
  return out;
}

namespace {

Status WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = io::Write(fd, p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return PosixError("write", errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

}  // namespace

Status WriteFile(const std::string& path, std::span<const TensorView> tensors,
                 const std::optional<Metadata>& metadata) {
  std::vector<size_t> order;
  auto header = SerializeHeader(tensors, metadata, &order);
  if (!header.ok()) return header.status().WithContext(path);

  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  std::string tmp = (slash == std::string::npos ? std::string() : dir) + "." + base + ".tmp.XXXXXX";
  int fd = ::mkostemp(tmp.data(), O_CLOEXEC);
  if (fd < 0)
    return PosixError("cannot create a temporary file in " + dir, errno).WithContext(path);

  Status st = [&]() -> Status {
    // Permissions as for an ordinary new file (mkstemp makes it 0600).
    mode_t mask = ::umask(0);
    ::umask(mask);
    if (::fchmod(fd, 0666 & ~mask) != 0) return PosixError("fchmod", errno);
    TL_RETURN_IF_ERROR(WriteAll(fd, header->data(), header->size()));
    for (size_t i : order) {
      TL_RETURN_IF_ERROR(WriteAll(fd, tensors[i].data.data(), tensors[i].data.size()));
    }
    if (::close(fd) != 0) {
      fd = -1;
      return PosixError("close", errno);
    }
    fd = -1;
    if (::rename(tmp.c_str(), path.c_str()) != 0) return PosixError("rename", errno);
    return Status::Ok();
  }();
  if (!st.ok()) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    return st.WithContext(path);
  }
  return Status::Ok();
}

}  // namespace tensorlift
