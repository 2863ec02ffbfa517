// PeerKey: the compatibility key a source and a destination compare before
// any byte moves, its canonical text, and its registry digest.
#include <string>
#include <string_view>

#include "tensorlift/checksum.h"
#include "tensorlift/content.h"
#include "tensorlift/remote.h"
#include "tensorlift/text.h"

namespace tensorlift {
namespace {

// Bounds for each text field: enough for any model id, revision or layout.
constexpr size_t kMaxFieldBytes = 4096;

// The text fields in canonical order (protocol comes first, separately).
struct Field {
  const char* name;
  const std::string PeerKey::*member;
};
constexpr Field kFields[] = {
    {"model", &PeerKey::model},   {"revision", &PeerKey::revision},
    {"dtype", &PeerKey::dtype},   {"quantization", &PeerKey::quantization},
    {"layout", &PeerKey::layout},
};

}  // namespace

std::string PeerKey::Canonical() const {
  std::string out = "tensorlift-peer\nprotocol=" + std::to_string(protocol) + "\n";
  for (const Field& f : kFields) {
    out += f.name;
    out += '=';
    out += this->*f.member;
    out += '\n';
  }
  return out;
}

std::string PeerKey::Digest() const {
  const std::string canonical = Canonical();
  return HexU64(Xxh3_64(canonical.data(), canonical.size()));
}

std::string PeerKey::Mismatch(const PeerKey& peer) const {
  if (protocol != peer.protocol) {
    return "protocol: " + std::to_string(protocol) + " (ours) != " + std::to_string(peer.protocol) +
           " (peer's)";
  }
  for (const Field& f : kFields) {
    const std::string& ours = this->*f.member;
    const std::string& theirs = peer.*f.member;
    if (ours != theirs) {
      return std::string(f.name) + ": " + QuoteName(ours) + " (ours) != " + QuoteName(theirs) +
             " (peer's)";
    }
  }
  return "";
}

Status PeerKey::Validate() const {
  if (protocol < 1) {
    return InvalidArgumentError("peer key: protocol must be at least 1, found " +
                                std::to_string(protocol));
  }
  if (model.empty()) return InvalidArgumentError("peer key: model must not be empty");
  for (const Field& f : kFields) {
    const std::string& value = this->*f.member;
    if (value.size() > kMaxFieldBytes) {
      return InvalidArgumentError("peer key: " + std::string(f.name) + " has " +
                                  std::to_string(value.size()) + " bytes, more than the limit of " +
                                  std::to_string(kMaxFieldBytes));
    }
    for (size_t i = 0; i < value.size(); ++i) {
      const unsigned char c = static_cast<unsigned char>(value[i]);
      if (c < 0x20 || c == 0x7f) {
        return InvalidArgumentError("peer key: " + std::string(f.name) + " " + QuoteName(value) +
                                    " has a control character at byte " + std::to_string(i));
      }
    }
  }
  if (!content.empty() && !Hash128::IsCanonicalHex(content)) {
    return InvalidArgumentError("peer key: content " + QuoteName(content) +
                                " is not 32 lowercase hex digits (a content root)");
  }
  return Status::Ok();
}

}  // namespace tensorlift
