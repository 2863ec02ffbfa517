// PeerKey: the compatibility key a source and a destination compare before
// any byte moves, its canonical text, and its registry digest.
#include <array>
#include <optional>
#include <string>
#include <string_view>

#include "tensorlift/checksum.h"
#include "tensorlift/content.h"
#include "tensorlift/dtype.h"
#include "tensorlift/remote.h"
#include "tensorlift/text.h"

namespace tensorlift {
namespace {

// Bounds for each text field: enough for any model id, revision or layout.
constexpr size_t kMaxFieldBytes = 4096;

// The text fields in canonical order (protocol comes first, separately).
struct Field {
  const char* name;
  std::string_view value;
};
std::array<Field, 5> Fields(const PeerKey& key) {
  return {{{"model", key.model},
           {"revision", key.revision},
           {"dtype", PeerKeyDtypeName(key.dtype)},
           {"quantization", key.quantization},
           {"layout", key.layout}}};
}

}  // namespace

std::string PeerKey::Canonical() const {
  std::string out = "tensorlift-peer\nprotocol=" + std::to_string(protocol) + "\n";
  for (const Field& f : Fields(*this)) {
    out += f.name;
    out += '=';
    out += f.value;
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
  const std::array<Field, 5> ours_all = Fields(*this), theirs_all = Fields(peer);
  for (size_t i = 0; i < ours_all.size(); ++i) {
    const std::string_view ours = ours_all[i].value, theirs = theirs_all[i].value;
    if (ours != theirs) {
      return std::string(ours_all[i].name) + ": " + QuoteName(ours) +
             " (ours) != " + QuoteName(theirs) + " (peer's)";
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
  for (const Field& f : Fields(*this)) {
    const std::string_view value = f.value;
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

Result<std::optional<Dtype>> ParsePeerKeyDtype(std::string_view text) {
  if (text == "as-stored") return std::optional<Dtype>();
  if (auto d = DtypeFromAnyName(text)) return std::optional<Dtype>(*d);
  return InvalidArgumentError(
      "peer key: dtype " + QuoteName(text) +
      " is neither \"as-stored\" nor a dtype (\"BF16\", \"bfloat16\", ...)");
}

std::string_view PeerKeyDtypeName(const std::optional<Dtype>& dtype) {
  return dtype ? DtypeName(*dtype) : "as-stored";
}

}  // namespace tensorlift
