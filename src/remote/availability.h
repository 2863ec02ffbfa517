// Which checksum chunks a relay holds (docs/remote.md, "Relaying"): a puller
// that serves what it has received while it receives (a partial seed) marks
// each chunk once it is in place and checked; its control endpoint answers
// GET /v1/have with the map, and its children take only chunks it holds.
//
// The map covers a manifest's tensors in its order, each tensor's chunks in
// order (chunk c of a tensor of n bytes: bytes [c x chunk_bytes, +chunk_bytes)
// clipped to n). Its text (the answer's body) is
//   {"version":V,"complete":true|false,"have":"HEX"}
// HEX: the bits of every chunk in that order, 8 chunks a byte, least
// significant bit first, as lowercase hex digits; unused high bits are 0.
//
// Thread safety: every method may be called from any thread.
#ifndef TENSORLIFT_REMOTE_AVAILABILITY_H_
#define TENSORLIFT_REMOTE_AVAILABILITY_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "remote/manifest.h"
#include "tensorlift/status.h"

namespace tensorlift::remote {

// The chunks of each tensor of `m`: its first chunk's index in the map, in
// manifest order, and the total at the end (size: tensors + 1).
std::vector<uint64_t> ChunkStarts(const Manifest& m);

class Availability {
 public:
  // Nothing held yet.
  explicit Availability(const Manifest& manifest);

  // Chunk `chunk` of manifest tensor `tensor` is in place and checked.
  void Mark(size_t tensor, uint64_t chunk);
  // Every chunk is (the relay's load is done).
  void MarkAll();
  // The map's text once its version is past `after` or `wait` has passed.
  std::string Wait(uint64_t after, std::chrono::milliseconds wait) const;
  std::string Text() const;
  uint64_t held() const;  // Chunks held.
  uint64_t chunks() const { return starts_.back(); }
  // Bytes of tensors held, for the registry's progress.
  uint64_t held_bytes() const;

 private:
  std::string TextLocked() const;
  std::vector<uint64_t> starts_;
  std::vector<uint64_t> chunk_bytes_;  // Per map chunk.
  mutable std::mutex mu_;
  mutable std::condition_variable changed_;
  std::vector<uint8_t> bits_;
  uint64_t version_ = 0;
  uint64_t held_ = 0;
  uint64_t held_bytes_ = 0;
  bool complete_ = false;
};

// A relay's map as its child reads it (untrusted: checked against the
// manifest it opened the session with).
struct HeldChunks {
  uint64_t version = 0;
  bool complete = false;
  std::vector<uint8_t> bits;  // As Availability's; every chunk when complete.
  bool Has(uint64_t index) const {
    return complete || (index / 8 < bits.size() && (bits[index / 8] >> (index % 8)) & 1);
  }
};
// kCorruption for text that is not the map of `chunks` chunks.
Result<HeldChunks> ParseHeldChunks(std::string_view text, uint64_t chunks);

}  // namespace tensorlift::remote

#endif  // TENSORLIFT_REMOTE_AVAILABILITY_H_
