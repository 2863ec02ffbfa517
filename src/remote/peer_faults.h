// Peer faults for tests (docs/security.md, "Peer faults"): a served tensor
// whose bytes no longer match the manifest a seed published, to prove that
// every client catches it. Armed by CorruptServedForTesting (C++ tests) or by
// TENSORLIFT_PEER_FAULTS in the environment of the serving process, applied
// by every peer server once its manifest is made:
//
//   RULE[,RULE...]   RULE = corrupt:TENSOR@OFFSET | lie:TENSOR@OFFSET
//
// corrupt flips one bit of the served copy of TENSOR at byte OFFSET (the
// manifest keeps the true checksum; for memory handed over sealed, the
// manifest's checksum of that chunk changes instead, which clients see as the
// same mismatch); lie also recomputes the chunk's checksum over the flipped
// bytes (a seed that lies: chunk checks pass, content hashes do not; host
// memory outside handover only). A rule naming a tensor a server does not
// serve leaves that server alone; a malformed rule fails the serve
// (InvalidArgument). Not part of the public API: nothing else uses them.
#ifndef TENSORLIFT_REMOTE_PEER_FAULTS_H_
#define TENSORLIFT_REMOTE_PEER_FAULTS_H_

#include <cstdint>
#include <functional>
#include <string>

#include "tensorlift/remote.h"
#include "tensorlift/status.h"

namespace tensorlift::remote {

// NotFound when `server` does not serve `tensor`; OutOfRange past its bytes.
Status CorruptServedForTesting(PeerServer& server, const std::string& tensor, uint64_t offset,
                               bool lie = false);

// While `window` is not 0, peer pulls onto a device land in the GPU
// pipeline's pinned staging slots and are copied up, as onto a GPU whose
// memory the loaded UCX cannot write (the emulated device's memory otherwise
// takes UCX's writes through its host mapping). The value is not used.
void BounceDevicePullsForTesting(uint64_t window);
uint64_t BounceDevicePulls();

// While `bytes` is not 0, a pull straight into a device's memory reads
// blocks of `bytes` (DirectReader::BlockBytes; 1 GiB otherwise), so that
// tests see chunks shared between blocks.
void DirectPullBlocksForTesting(uint64_t bytes);

// While set, a read straight into a device's memory calls `hook` after its
// gets have landed, with the store's lock released, before its chunks'
// checks: tests hold one read there while another is planned and got.
void BeforeDeviceChecksForTesting(std::function<void()> hook);

}  // namespace tensorlift::remote

#endif  // TENSORLIFT_REMOTE_PEER_FAULTS_H_
