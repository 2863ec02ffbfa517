// The frame around UCX's wire blobs (worker addresses and packed remote
// keys) as peers exchange them: "TLUX", a kind byte ('A' address, 'K' remote
// key), three zero bytes, the payload length (u64 little endian), the
// payload's XXH3-64 and the payload. UCX parses addresses and keys without a
// length, so every blob from a peer is unframed (checked) before UCX sees a
// byte. Untrusted input: fuzzed by tests/fuzz/peer_wire_fuzz.cc.
#ifndef TENSORLIFT_REMOTE_FRAME_H_
#define TENSORLIFT_REMOTE_FRAME_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tensorlift/status.h"

namespace tensorlift::remote {

inline constexpr size_t kFrameHeader = 24;
inline constexpr uint64_t kMaxFramePayload = 1ull << 20;  // UCX's blobs are a few KiB.

// The framed blob of `size` payload bytes (size may be 0 only for tests:
// Unframe refuses an empty payload).
std::string Frame(char kind, const void* payload, size_t size);

// A copy of the payload (UCX may read it unaligned; the copy also outlives
// the caller's view while UCX parses it). InvalidArgument naming `what` for a
// blob shorter than the header, another magic or kind, nonzero padding, a
// length of 0, over kMaxFramePayload or other than the bytes after the
// header, or a checksum that does not match.
Result<std::string> Unframe(std::string_view blob, char kind, std::string_view what);

}  // namespace tensorlift::remote

#endif  // TENSORLIFT_REMOTE_FRAME_H_
