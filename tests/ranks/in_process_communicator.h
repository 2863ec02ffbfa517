// Communicators whose ranks are threads of one process (a test helper, not
// part of the library): the multi-rank loader's collectives without MPI or
// NCCL, for tests of several ranks in one test process.
//
// Each collective is a rendezvous: every rank posts its buffers and waits for
// the others; then each rank copies what it receives out of the posting ranks'
// buffers (they stay untouched until everyone is done), and all leave
// together. Arguments are checked on every rank and the outcome agreed, so a
// bad call fails on every rank instead of leaving the others waiting. Ranks
// must make the same calls in the same order (Communicator's contract); a rank
// that stops calling leaves the others blocked, as with MPI.
//
// Buffers are memory of `device`: host memory with MakeHostDevice() (the
// default), device addresses with the emulated device or a GPU, copied on the
// receiving rank's stream of that device (device to device, as NCCL moves
// GPU buffers). All ranks share the one device.
#ifndef TENSORLIFT_TESTS_RANKS_IN_PROCESS_COMMUNICATOR_H_
#define TENSORLIFT_TESTS_RANKS_IN_PROCESS_COMMUNICATOR_H_

#include <memory>
#include <vector>

#include "device/device.h"
#include "tensorlift/communicator.h"
#include "tensorlift/status.h"

namespace tensorlift {

// `world` (>= 1) communicators, rank i at index i; each is used by one thread.
// InvalidArgument for world < 1 or a null device.
Result<std::vector<std::unique_ptr<Communicator>>> MakeInProcessCommunicators(
    int world, std::shared_ptr<Device> device = MakeHostDevice());

}  // namespace tensorlift

#endif  // TENSORLIFT_TESTS_RANKS_IN_PROCESS_COMMUNICATOR_H_
