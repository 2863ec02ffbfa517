// The frame around UCX's wire blobs (see frame.h).
#include "remote/frame.h"

#include <cstring>

#include "tensorlift/checksum.h"

namespace tensorlift::remote {
namespace {

constexpr char kFrameMagic[4] = {'T', 'L', 'U', 'X'};

void PutU64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

}  // namespace

std::string Frame(char kind, const void* payload, size_t size) {
  std::string out(kFrameHeader + size, '\0');
  std::memcpy(out.data(), kFrameMagic, 4);
  out[4] = kind;
  PutU64(out.data() + 8, size);
  PutU64(out.data() + 16, Xxh3_64(payload, size));
  if (size > 0) std::memcpy(out.data() + kFrameHeader, payload, size);
  return out;
}

Result<std::string> Unframe(std::string_view blob, char kind, std::string_view what) {
  if (blob.size() < kFrameHeader) {
    return InvalidArgumentError(std::string(what) + ": " + std::to_string(blob.size()) +
                                " bytes is shorter than the " + std::to_string(kFrameHeader) +
                                "-byte frame header");
  }
  if (std::memcmp(blob.data(), kFrameMagic, 4) != 0 || blob[4] != kind || blob[5] != 0 ||
      blob[6] != 0 || blob[7] != 0) {
    return InvalidArgumentError(std::string(what) + ": not a tensorlift UCX " +
                                (kind == 'A' ? "worker address" : "remote key") +
                                " (bad magic or kind)");
  }
  const uint64_t size = GetU64(blob.data() + 8);
  if (size == 0 || size > kMaxFramePayload || size != blob.size() - kFrameHeader) {
    return InvalidArgumentError(
        std::string(what) + ": payload length " + std::to_string(size) + " does not match the " +
        std::to_string(blob.size() - kFrameHeader) + " bytes after the header");
  }
  std::string payload(blob.substr(kFrameHeader));
  const uint64_t want = GetU64(blob.data() + 16);
  const uint64_t got = Xxh3_64(payload.data(), payload.size());
  if (want != got) {
    return InvalidArgumentError(std::string(what) + ": checksum " + HexU64(got) +
                                " does not match the frame's " + HexU64(want));
  }
  return payload;
}

}  // namespace tensorlift::remote
