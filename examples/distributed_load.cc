// Multi-rank loading with the public API (include/tensorlift/distributed.h):
//
//   mpirun -n 2 tl_example_distributed_load CHECKPOINT
//
// Every rank opens the checkpoint, reads only its balanced share of the files
// once, then takes each 2-D or larger tensor's rows (GetSharded along dim 0,
// tensorlift's one shard-range rule) and every other tensor whole
// (GetTensor, broadcast from the rank that read it). Each rank prints what it
// holds; rank 0 first prints the bytes every rank read.
#include <cstdio>
#include <string>
#include <vector>

#include "tensorlift/checkpoint.h"
#include "tensorlift/communicator.h"
#include "tensorlift/distributed.h"

using namespace tensorlift;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: mpirun -n N %s CHECKPOINT\n", argv[0]);
    return 2;
  }
  auto comm = MakeMpiCommunicator();  // Unimplemented, with the reason, without MPI.
  if (!comm.ok()) {
    std::fprintf(stderr, "%s\n", comm.status().ToString().c_str());
    return 1;
  }
  Communicator& c = **comm;
  auto ckpt = Checkpoint::Open(argv[1]);
  // Agree before the collective load: one rank that cannot open the files
  // fails every rank with its message, instead of a hang.
  if (Status st = c.Agree(ckpt.status()); !st.ok()) {
    if (c.rank() == 0) std::fprintf(stderr, "%s\n", st.ToString().c_str());
    return 1;
  }
  auto dist = LoadDistributed(*ckpt, LoadOptions{}, c);
  if (!dist.ok()) {
    if (c.rank() == 0) std::fprintf(stderr, "%s\n", dist.status().ToString().c_str());
    return 1;
  }
  std::vector<uint64_t> read(c.size());
  const uint64_t mine = dist->load_bytes();
  if (Status st = c.AllGather(&mine, read.data(), sizeof(mine)); !st.ok()) return 1;
  if (c.rank() == 0) {
    for (int r = 0; r < c.size(); ++r) {
      std::printf("rank %d read %llu bytes\n", r, static_cast<unsigned long long>(read[r]));
    }
  }
  // Every rank asks for the same tensors in the same order (the SPMD contract).
  std::string lines;
  for (const std::string& name : dist->loaded_names()) {
    const TensorInfo& info = ckpt->info(*ckpt->Find(name));
    auto t = info.shape.size() >= 2 ? dist->GetSharded(name, 0) : dist->GetTensor(name);
    if (!t.ok()) {
      if (c.rank() == 0) std::fprintf(stderr, "%s\n", t.status().ToString().c_str());
      return 1;
    }
    std::string shape;
    for (uint64_t d : t->shape) shape += (shape.empty() ? "" : ",") + std::to_string(d);
    lines += "rank " + std::to_string(c.rank()) + ": " + name + " [" + shape + "] " +
             std::to_string(t->nbytes) + " bytes\n";
  }
  // One rank at a time, so the lines do not interleave.
  for (int r = 0; r < c.size(); ++r) {
    if (r == c.rank()) {
      std::fputs(lines.c_str(), stdout);
      std::fflush(stdout);
    }
    if (!c.Barrier().ok()) return 1;
  }
  return 0;
}
