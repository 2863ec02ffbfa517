// tl_dist_sharded_bench: scatter or per-rank reads for GetSharded(name, 0)?
// (issue #6; docs/performance-dist.md, "Scatter or read").
//
//   mpiexec -n W tl_dist_sharded_bench DIR [--total-mib 512] [--runs 5]
//                                          [--sizes-kib 256,1024,4096,16384,65536]
//
// For each tensor size, rank 0 writes DIR/s<KiB>/ (4 shards of tensors of that
// size, 4096-byte rows, --total-mib in all). Then for each state (cold: every
// rank evicts the files with posix_fadvise DONTNEED first; warm: the files
// stay cached) and each mode, alternating, it times LoadDistributed with every
// tensor declared dim-0-sharded followed by GetSharded(name, 0) of every
// tensor, from a barrier to a barrier:
//   scatter  the reader loads each tensor with its share of the files, then
//            scatters the rows (Dim0Mode::kScatter);
//   read     nobody loads them; each rank preads its own rows (kRead).
// Prints one JSON object per line on rank 0: world, size, state, mode, the
// runs' seconds and their median, and the bytes read per rank. The slices are
// kept until the end of each run, as a model keeps its weights.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "tensorlift/checkpoint.h"
#include "tensorlift/distributed.h"
#include "tensorlift/safetensors.h"

namespace tl = tensorlift;

namespace {

constexpr uint64_t kRowBytes = 4096;
constexpr int kShards = 4;

[[noreturn]] void Die(const std::string& what, const tl::Status& st) {
  std::fprintf(stderr, "tl_dist_sharded_bench: %s: %s\n", what.c_str(), st.ToString().c_str());
  std::exit(1);
}

// kShards files of U8 [size / 4096, 4096] tensors, total bytes in all.
tl::Status WriteCheckpoint(const std::string& dir, uint64_t size, uint64_t total) {
  std::filesystem::create_directories(dir);
  const uint64_t count = std::max<uint64_t>(1, total / size);
  std::vector<std::byte> data(size);
  for (uint64_t i = 0; i < size; ++i)
    data[i] = static_cast<std::byte>((i * 131 + (i >> 12)) & 0xff);
  for (int f = 0; f < kShards; ++f) {
    std::vector<tl::TensorView> views;
    std::vector<std::string> names;
    for (uint64_t t = f; t < count; t += kShards) names.push_back("t" + std::to_string(t));
    for (const auto& n : names)
      views.push_back({n, tl::Dtype::kU8, {size / kRowBytes, kRowBytes}, data});
    TL_RETURN_IF_ERROR(
        tl::WriteFile(dir + "/part" + std::to_string(f) + ".safetensors", views, std::nullopt));
  }
  return tl::Status::Ok();
}

void Evict(const tl::Checkpoint& ckpt) {
  for (const auto& shard : ckpt.shards()) {
    const int fd = ::open(shard.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

std::vector<uint64_t> ParseList(const char* s) {
  std::vector<uint64_t> out;
  for (const char* p = s; *p;) {
    out.push_back(std::strtoull(p, const_cast<char**>(&p), 10));
    if (*p == ',') ++p;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: mpiexec -n W %s DIR [--total-mib N] [--runs N] [--sizes-kib a,b]\n",
                 argv[0]);
    return 2;
  }
  const std::string root = argv[1];
  uint64_t total = uint64_t{512} << 20;
  int runs = 5;
  std::vector<uint64_t> sizes_kib = {256, 1024, 4096, 16384, 65536};
  for (int i = 2; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--total-mib") == 0)
      total = std::strtoull(argv[i + 1], nullptr, 10) << 20;
    else if (std::strcmp(argv[i], "--runs") == 0)
      runs = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--sizes-kib") == 0)
      sizes_kib = ParseList(argv[i + 1]);
  }
  auto made = tl::MakeMpiCommunicator();
  if (!made.ok()) Die("MakeMpiCommunicator", made.status());
  tl::Communicator& comm = **made;
  const int world = comm.size(), me = comm.rank();

  for (uint64_t kib : sizes_kib) {
    const uint64_t size = std::max<uint64_t>(kRowBytes, (kib << 10) / kRowBytes * kRowBytes);
    const std::string dir = root + "/s" + std::to_string(kib);
    tl::Status st = tl::Status::Ok();
    if (me == 0 && !std::filesystem::exists(dir + "/part0.safetensors")) {
      st = WriteCheckpoint(dir, size, total);
    }
    st = comm.Agree(st);
    if (!st.ok()) Die("writing " + dir, st);
    auto ckpt = tl::Checkpoint::Open(dir);
    if (!ckpt.ok()) Die("opening " + dir, ckpt.status());
    std::vector<std::string> names;
    for (auto loc : ckpt->tensors()) names.push_back(ckpt->info(loc).name);

    for (const char* state : {"cold", "warm"}) {
      const bool cold = std::strcmp(state, "cold") == 0;
      struct Mode {
        const char* name;
        tl::Dim0Mode mode;
        std::vector<double> secs;
        std::vector<uint64_t> read;
      } modes[2] = {{"scatter", tl::Dim0Mode::kScatter, {}, {}},
                    {"read", tl::Dim0Mode::kRead, {}, {}}};
      // Warm: one untimed pass so the files are cached.
      if (!cold) {
        auto l = tl::Load(*ckpt);
        if (!l.ok()) Die("warming", l.status());
      }
      for (int run = 0; run < runs; ++run) {
        for (Mode& m : modes) {
          if (cold) Evict(*ckpt);
          if (!comm.Barrier().ok()) return 1;
          const auto t0 = std::chrono::steady_clock::now();
          tl::DistributedOptions dopts;
          dopts.dim0 = m.mode;
          dopts.dim0_sharded = tl::TensorFilter();
          auto d = tl::LoadDistributed(*ckpt, {}, comm, dopts);
          if (!d.ok()) Die("LoadDistributed", d.status());
          // Kept until the end, as a model would keep its weights (so each
          // slice lands in fresh memory, not in the one freed before).
          std::vector<tl::HostTensor> kept;
          kept.reserve(names.size());
          for (const auto& n : names) {
            auto t = d->GetSharded(n, 0);
            if (!t.ok()) Die("GetSharded " + n, t.status());
            kept.push_back(std::move(t).value());
          }
          if (!comm.Barrier().ok()) return 1;
          m.secs.push_back(
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
          const uint64_t mine = d->bytes_read();
          std::vector<uint64_t> all(world);
          if (!comm.AllGather(&mine, all.data(), sizeof(mine)).ok()) return 1;
          m.read = all;
        }
      }
      if (me != 0) continue;
      for (Mode& m : modes) {
        std::vector<double> sorted = m.secs;
        std::sort(sorted.begin(), sorted.end());
        std::string secs, read;
        for (double s : m.secs) secs += (secs.empty() ? "" : ",") + std::to_string(s);
        for (uint64_t r : m.read) read += (read.empty() ? "" : ",") + std::to_string(r);
        std::printf(
            "{\"world\": %d, \"tensor_bytes\": %llu, \"tensors\": %zu, \"state\": \"%s\", "
            "\"mode\": \"%s\", \"median_s\": %.4f, \"runs_s\": [%s], \"bytes_read\": [%s]}\n",
            world, static_cast<unsigned long long>(size), names.size(), state, m.name,
            sorted[sorted.size() / 2], secs.c_str(), read.c_str());
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
