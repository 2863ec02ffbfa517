// Content identity (include/tensorlift/content.h has the definition).
#include "tensorlift/content.h"

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstring>

namespace tensorlift {
namespace {

Hash128 FromXxh(XXH128_hash_t h) { return Hash128{h.high64, h.low64}; }

void PutCanonical(const Hash128& h, unsigned char* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(h.high >> (56 - 8 * i));
  for (int i = 0; i < 8; ++i) out[8 + i] = static_cast<unsigned char>(h.low >> (56 - 8 * i));
}

void PutU64(XXH3_state_t* st, uint64_t v) {
  unsigned char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
  XXH3_128bits_update(st, b, 8);
}

void PutBytes(XXH3_state_t* st, std::string_view s) {
  PutU64(st, s.size());
  XXH3_128bits_update(st, s.data(), s.size());
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string Hash128::Hex() const {
  static const char kHex[] = "0123456789abcdef";
  std::string s(32, '0');
  for (int i = 0; i < 16; ++i) {
    s[i] = kHex[(high >> (60 - 4 * i)) & 15];
    s[16 + i] = kHex[(low >> (60 - 4 * i)) & 15];
  }
  return s;
}

Result<Hash128> Hash128::FromHex(std::string_view hex) {
  if (hex.size() != 32) {
    return InvalidArgumentError("a content hash is 32 hex digits, not " +
                                std::to_string(hex.size()) + " characters");
  }
  Hash128 h;
  for (size_t i = 0; i < 32; ++i) {
    const int d = HexDigit(hex[i]);
    if (d < 0) {
      return InvalidArgumentError("a content hash is 32 hex digits; character " +
                                  std::to_string(i) + " is not one");
    }
    uint64_t& half = i < 16 ? h.high : h.low;
    half = (half << 4) | static_cast<uint64_t>(d);
  }
  return h;
}

bool Hash128::IsCanonicalHex(std::string_view hex) {
  return hex.size() == 32 && hex.find_first_not_of("0123456789abcdef") == std::string_view::npos;
}

Hash128 Xxh3_128(const void* data, size_t size) { return FromXxh(XXH3_128bits(data, size)); }

uint64_t ContentPieces(uint64_t nbytes) {
  return nbytes == 0 ? 1 : (nbytes - 1) / kContentPieceBytes + 1;
}

Hash128 TensorHashFromPieces(std::span<const Hash128> pieces) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_128bits_reset(st);
  for (const Hash128& p : pieces) {
    unsigned char b[16];
    PutCanonical(p, b);
    XXH3_128bits_update(st, b, 16);
  }
  const Hash128 out = FromXxh(XXH3_128bits_digest(st));
  XXH3_freeState(st);
  return out;
}

Hash128 TensorContentHash(const void* data, uint64_t nbytes) {
  const auto* p = static_cast<const std::byte*>(data);
  std::vector<Hash128> pieces(ContentPieces(nbytes));
  for (uint64_t k = 0; k < pieces.size(); ++k) {
    const uint64_t off = k * kContentPieceBytes;
    pieces[k] = Xxh3_128(p + off, std::min(kContentPieceBytes, nbytes - off));
  }
  return TensorHashFromPieces(pieces);
}

const TensorContent* ContentIdentity::Find(std::string_view name) const {
  auto it = std::lower_bound(tensors.begin(), tensors.end(), name,
                             [](const TensorContent& t, std::string_view n) { return t.name < n; });
  return it != tensors.end() && it->name == name ? &*it : nullptr;
}

Hash128 ContentRoot(std::span<const TensorContent> tensors) {
  std::vector<const TensorContent*> order;
  order.reserve(tensors.size());
  for (const TensorContent& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(),
            [](const TensorContent* a, const TensorContent* b) { return a->name < b->name; });
  XXH3_state_t* st = XXH3_createState();
  XXH3_128bits_reset(st);
  static constexpr std::string_view kDomain = "tensorlift-content-v1\n";
  XXH3_128bits_update(st, kDomain.data(), kDomain.size());
  for (const TensorContent* t : order) {
    PutBytes(st, t->name);
    PutBytes(st, DtypeName(t->dtype));
    PutU64(st, t->shape.size());
    for (int64_t d : t->shape) PutU64(st, static_cast<uint64_t>(d));
    unsigned char b[16];
    PutCanonical(t->hash, b);
    XXH3_128bits_update(st, b, 16);
  }
  const Hash128 out = FromXxh(XXH3_128bits_digest(st));
  XXH3_freeState(st);
  return out;
}

ContentIdentity MakeContentIdentity(std::vector<TensorContent> tensors) {
  std::sort(tensors.begin(), tensors.end(),
            [](const TensorContent& a, const TensorContent& b) { return a.name < b.name; });
  ContentIdentity id;
  id.root = ContentRoot(tensors);
  id.tensors = std::move(tensors);
  return id;
}

struct ContentHasher::State {
  std::vector<TensorContent> tensors;
  std::vector<const std::byte*> data;
  std::vector<size_t> first_piece;                   // Per tensor: its first piece's index below.
  std::vector<Hash128> hashes;                       // Per piece.
  std::unique_ptr<std::atomic<uint64_t>[]> missing;  // Per piece: bytes not landed yet.
  std::unique_ptr<std::atomic<bool>[]> done;         // Per piece: hashed.
};

ContentHasher::ContentHasher(std::vector<TensorContent> tensors, std::vector<const std::byte*> data)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.tensors = std::move(tensors);
  s.data = std::move(data);
  size_t pieces = 0;
  for (const TensorContent& t : s.tensors) {
    s.first_piece.push_back(pieces);
    pieces += ContentPieces(t.nbytes);
  }
  s.hashes.resize(pieces);
  s.missing.reset(new std::atomic<uint64_t>[pieces]);
  s.done.reset(new std::atomic<bool>[pieces]);
  for (size_t i = 0; i < s.tensors.size(); ++i) {
    const uint64_t n = s.tensors[i].nbytes;
    for (uint64_t k = 0; k < ContentPieces(n); ++k) {
      const uint64_t off = k * kContentPieceBytes;
      s.missing[s.first_piece[i] + k] = n == 0 ? 0 : std::min(kContentPieceBytes, n - off);
      s.done[s.first_piece[i] + k] = false;
    }
  }
}

ContentHasher::~ContentHasher() = default;

void ContentHasher::Landed(size_t tensor, uint64_t offset, uint64_t length) {
  State& s = *state_;
  const uint64_t n = s.tensors[tensor].nbytes;
  const uint64_t end = std::min(n, offset + length);
  for (uint64_t at = offset; at < end;) {
    const uint64_t k = at / kContentPieceBytes;
    const uint64_t piece_end = std::min(n, (k + 1) * kContentPieceBytes);
    const uint64_t take = std::min(end, piece_end) - at;
    const size_t p = s.first_piece[tensor] + k;
    if (s.missing[p].fetch_sub(take, std::memory_order_acq_rel) == take) {
      const uint64_t begin = k * kContentPieceBytes;
      s.hashes[p] = Xxh3_128(s.data[tensor] + begin, piece_end - begin);
      s.done[p].store(true, std::memory_order_release);
    }
    at += take;
  }
}

ContentIdentity ContentHasher::Finish() && {
  State& s = *state_;
  for (size_t i = 0; i < s.tensors.size(); ++i) {
    const uint64_t n = s.tensors[i].nbytes;
    const uint64_t pieces = ContentPieces(n);
    for (uint64_t k = 0; k < pieces; ++k) {
      const size_t p = s.first_piece[i] + k;
      if (s.done[p].load(std::memory_order_acquire)) continue;
      const uint64_t begin = k * kContentPieceBytes;
      s.hashes[p] = Xxh3_128(s.data[i] + begin, std::min(n, begin + kContentPieceBytes) - begin);
    }
    s.tensors[i].hash =
        TensorHashFromPieces(std::span<const Hash128>(s.hashes.data() + s.first_piece[i], pieces));
  }
  return MakeContentIdentity(std::move(s.tensors));
}

}  // namespace tensorlift
