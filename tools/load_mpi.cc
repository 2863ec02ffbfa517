// tensorlift load --mpi: one rank of an MPI job. Every rank opens the
// checkpoint and reads only its balanced share (LoadDistributed,
// include/tensorlift/distributed.h); rank 0 gathers and prints what each rank
// read. With --checksum every tensor is broadcast from the rank that read it
// and rank 0 prints the same name<TAB>xxh3-64 lines as a single-process load,
// so the two can be compared. With --device cuda each rank loads its share
// into its own GPU and the tensors move over NCCL.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/checksum.h"
#include "tensorlift/communicator.h"
#include "tensorlift/distributed.h"

namespace tensorlift::cli {
namespace {

// What one rank did, gathered on rank 0.
struct RankReport {
  uint64_t bytes = 0;
  uint64_t pieces = 0;
  double seconds = 0;
};

// Prints `st` on rank 0 only (every rank has the same error: the loader and
// Agree make it so) and returns the exit code.
int Fail(const Communicator& comm, const Status& st) {
  if (comm.rank() == 0) std::fprintf(stderr, "%s\n", st.ToString().c_str());
  return kExitInvalid;
}

// Every rank's report, in rank order (a collective).
Result<std::vector<RankReport>> Gather(Communicator& comm, const RankReport& mine) {
  std::vector<RankReport> all(static_cast<size_t>(comm.size()));
  TL_RETURN_IF_ERROR(comm.AllGather(&mine, all.data(), sizeof(RankReport)));
  return all;
}

}  // namespace

// This rank's GPU for --device cuda: the launcher's local rank (Open MPI,
// MPICH, Slurm), else the MPI rank.
int LocalRank(const Communicator& comm) {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
    if (const char* v = std::getenv(var); v != nullptr && *v != '\0') return std::atoi(v);
  }
  return comm.rank();
}

// The ranks' NCCL communicator for a load onto GPUs (null for host loads),
// and the device each rank loads onto in opts->device (--device `name`). A
// collective.
Result<std::unique_ptr<Communicator>> DeviceComm(Communicator& c, const std::string& name,
                                                 LoadOptions* opts) {
  if (opts->device.on_host()) return std::unique_ptr<Communicator>();
  // "cuda" is each rank's own GPU; "cuda:N" is GPU N on every rank (one rank per machine).
  const int gpu = name == "cuda" ? LocalRank(c) : opts->device.index;
  opts->device = DeviceId::Cuda(gpu);
  return MakeNcclCommunicator(c, gpu);
}

int RunLoadMpi(const LoadArgs& args, const LoadOptions& options) {
  LoadOptions opts = options;
  if (opts.dtype) {
    std::fprintf(stderr, "--mpi does not convert dtypes: --dtype is not supported with it\n");
    return kExitUsage;
  }
  if (opts.device.type == DeviceType::kEmulated) {
    std::fprintf(stderr,
                 "--mpi: the emulated device lives inside one process and MPI ranks are "
                 "processes; use --device cpu or cuda\n");
    return kExitUsage;
  }
  auto comm = MakeMpiCommunicator();
  if (!comm.ok()) {
    std::fprintf(stderr, "--mpi: %s\n", comm.status().ToString().c_str());
    return kExitInvalid;
  }
  Communicator& c = **comm;
  // Each rank opens the checkpoint; the ranks agree before the collective load.
  auto ckpt = Checkpoint::Open(args.path);
  if (Status agreed = c.Agree(ckpt.status()); !agreed.ok()) return Fail(c, agreed);
  auto device_comm = DeviceComm(c, args.device, &opts);  // Agreed by MakeNcclCommunicator.
  if (!device_comm.ok())
    return Fail(c, device_comm.status().WithContext("--device " + args.device));
  DistributedOptions dopts;
  dopts.device_comm = device_comm->get();

  const auto start = std::chrono::steady_clock::now();
  auto dist = LoadDistributed(*ckpt, opts, c, dopts);
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  if (!dist.ok()) return Fail(c, dist.status());

  RankReport mine;
  mine.bytes = dist->load_bytes();
  mine.pieces = dist->assignment().ranks[c.rank()].pieces.size();
  mine.seconds = took.count();
  auto all = Gather(c, mine);
  if (!all.ok()) return Fail(c, all.status());
  const std::vector<std::string> names = dist->loaded_names();
  // With --checksum, stdout holds only the checksum lines.
  FILE* report = args.checksum ? stderr : stdout;
  if (c.rank() == 0) {
    uint64_t total = 0;
    double slowest = 0;
    for (int r = 0; r < c.size(); ++r) {
      const RankReport& rr = (*all)[r];
      std::fprintf(report, "rank %d of %d: read %llu bytes (%llu pieces) in %.3f s\n", r, c.size(),
                   static_cast<unsigned long long>(rr.bytes),
                   static_cast<unsigned long long>(rr.pieces), rr.seconds);
      total += rr.bytes;
      slowest = std::max(slowest, rr.seconds);
    }
    std::fprintf(report, "loaded %zu tensors, %llu bytes over %d ranks in %.3f s: %.2f GB/s\n",
                 names.size(), static_cast<unsigned long long>(total), c.size(), slowest,
                 slowest > 0 ? total / slowest / 1e9 : 0.0);
  }
  if (args.checksum) {
    for (const std::string& name : names) {  // Name order, the same on every rank.
      Result<HostTensor> t = InvalidArgumentError("");
      if (dopts.device_comm == nullptr) {
        t = dist->GetTensor(name);
      } else {
        auto d = dist->GetDeviceTensor(name);
        t = d.ok() ? d->ToHost() : Result<HostTensor>(d.status());
      }
      if (!t.ok()) return Fail(c, t.status());
      if (c.rank() == 0) {
        std::printf("%s\t%s\n", name.c_str(), HexU64(Xxh3_64(t->data.get(), t->nbytes)).c_str());
      }
    }
  }
  return kExitOk;
}

}  // namespace tensorlift::cli
