// Content identity: a checkpoint known by its tensors' bytes, not by its file
// names or headers (docs/remote.md, "Content identity").
//
// Definition (version 1), every hash XXH3-128 with seed 0, a hash's bytes its
// canonical (big-endian) form, integers 8-byte little-endian:
//   piece hash   XXH3-128 of one piece of a tensor's bytes: the bytes cut into
//                4 MiB (kContentPieceBytes) pieces from the tensor's start, the
//                last one shorter; a tensor under 4 MiB, or with no bytes, is
//                one piece (of its bytes, possibly none).
//   tensor hash  XXH3-128 over the concatenated piece hashes (16 bytes each).
//   root         XXH3-128 over "tensorlift-content-v1\n" followed by, for each
//                tensor in name order (bytewise): u64 length and bytes of its
//                name, u64 length and bytes of its dtype name ("BF16", ...),
//                u64 rank and each dim as i64, then its tensor hash.
// A hash renders as 32 lowercase hex digits (the canonical bytes in order: what
// xxhsum -H2 and Python's xxhash.xxh3_128_hexdigest print).
// The pieces are fixed by the tensor's bytes alone, so the identity does not
// depend on how a load split its reads; pieces can be hashed as they land.
#ifndef TENSORLIFT_CONTENT_H_
#define TENSORLIFT_CONTENT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tensorlift/dtype.h"
#include "tensorlift/status.h"

namespace tensorlift {

inline constexpr uint64_t kContentPieceBytes = 4ull << 20;

// An XXH3-128 value.
struct Hash128 {
  uint64_t high = 0;
  uint64_t low = 0;
  // 32 lowercase hex digits, high half first.
  std::string Hex() const;
  // Exactly 32 hex digits (either case); InvalidArgument otherwise.
  static Result<Hash128> FromHex(std::string_view hex);
  // True for a hash as rendered (Hex()): exactly 32 lowercase hex digits, the
  // only form manifests, keys and registry entries carry.
  static bool IsCanonicalHex(std::string_view hex);
  bool operator==(const Hash128& o) const { return high == o.high && low == o.low; }
  bool operator!=(const Hash128& o) const { return !(*this == o); }
};

// XXH3-128 of `size` bytes.
Hash128 Xxh3_128(const void* data, size_t size);
// Pieces of a tensor of `nbytes` bytes (at least 1).
uint64_t ContentPieces(uint64_t nbytes);
// The tensor hash from its piece hashes, in order.
Hash128 TensorHashFromPieces(std::span<const Hash128> pieces);
// The tensor hash of `nbytes` bytes at `data` (hashes every piece).
Hash128 TensorContentHash(const void* data, uint64_t nbytes);

struct TensorContent {
  std::string name;
  Dtype dtype = Dtype::kU8;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
  Hash128 hash;  // The tensor hash.
};

// A checkpoint's content identity: every tensor's hash, in name order, and
// the root over them.
struct ContentIdentity {
  std::vector<TensorContent> tensors;
  Hash128 root;
  const TensorContent* Find(std::string_view name) const;
};

// The root over `tensors` (any order: they are sorted by name first).
Hash128 ContentRoot(std::span<const TensorContent> tensors);
// Sorts `tensors` by name and sets the root.
ContentIdentity MakeContentIdentity(std::vector<TensorContent> tensors);

// Per-piece hashing of many tensors whose bytes land in any order and in any
// split (a load's reads): Landed(i, offset, length) once the bytes
// [offset, offset + length) of tensor i are in place; a piece is hashed by the
// call that completes it (from the memory at `data`), so each piece is hashed
// once, while the bytes of its last read are hot. Thread-safe: Landed may be
// called from several threads at once (each range once, ranges not
// overlapping).
class ContentHasher {
 public:
  // tensors[i]: name, dtype, shape, nbytes; data[i]: where its bytes land.
  ContentHasher(std::vector<TensorContent> tensors, std::vector<const std::byte*> data);
  ~ContentHasher();
  ContentHasher(const ContentHasher&) = delete;
  ContentHasher& operator=(const ContentHasher&) = delete;

  void Landed(size_t tensor, uint64_t offset, uint64_t length);
  // Hashes what has not landed through Landed (e.g. views of mapped memory,
  // tensors with no bytes), then the identity. Call once, after every Landed.
  ContentIdentity Finish() &&;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace tensorlift

#endif  // TENSORLIFT_CONTENT_H_
