// tl_sparse_decode_bench [--reps N]: throughput of the sparse-bitmask
// decoders (kernels/bitmask.h) in GB/s of dense output, against a memcpy of
// the same dense bytes measured in the same run.
//
// Cases (bf16, uniformly random 50 % density): "dram", 4096 x 4096 (32 MiB
// of output, more than the caches), and "l2", 128 x 2048 (512 KiB of
// output, decoded over and over so that it stays in L2). Ops: memcpy of the
// dense bytes between two pre-faulted buffers and DecodeRows with each ISA
// this CPU runs, single-threaded; Validate alone; Decode (validation, then
// the best ISA) on 1 thread and on all cores. Each figure is the median of N
// samples (default 11), each long enough (>= 20 ms) to time well; the ops
// take turns. Prints one JSON object (and a table on stderr).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tensorlift/bitmask.h"

namespace {

using tensorlift::sparse::BitmaskShape;
using tensorlift::sparse::DecodeIsa;
namespace sparse = tensorlift::sparse;

using Clock = std::chrono::steady_clock;

// A timed operation: `inner` calls make one sample of at least 20 ms.
struct Op {
  std::string name;
  std::function<void()> run;
  int inner = 1;
  std::vector<double> gbps = {};
};

// Median GB/s of `bytes` per call of each op over `reps` samples. The ops
// take turns sample by sample, so that a change in the machine's load (it
// may be shared) affects them all alike.
void Measure(uint64_t bytes, int reps, std::vector<Op>& ops) {
  for (Op& op : ops) {
    op.run();  // Warm-up: caches, page tables, branch predictors.
    for (;;) {
      const auto t0 = Clock::now();
      for (int i = 0; i < op.inner; ++i) op.run();
      if (Clock::now() - t0 >= std::chrono::milliseconds(20)) break;
      op.inner *= 2;
    }
  }
  for (int r = 0; r < reps; ++r) {
    for (Op& op : ops) {
      const auto t0 = Clock::now();
      for (int i = 0; i < op.inner; ++i) op.run();
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      op.gbps.push_back(static_cast<double>(bytes) * op.inner / s / 1e9);
    }
  }
  for (Op& op : ops) std::sort(op.gbps.begin(), op.gbps.end());
}

struct Case {
  const char* name;
  uint64_t rows;
  uint64_t cols;
};

std::string RunCase(const Case& c, int reps) {
  const BitmaskShape s{.rows = c.rows, .cols = c.cols, .elem_bytes = 2};
  std::vector<std::byte> dense(s.dense_bytes());
  std::mt19937_64 rng(1);
  for (uint64_t i = 0; i < s.rows * s.cols; ++i) {
    const uint64_t x = rng();
    // Half the elements zero; the others any non-zero bf16.
    const uint16_t v = (x & 1) ? static_cast<uint16_t>((x >> 8) | 1) : 0;
    std::memcpy(dense.data() + 2 * i, &v, 2);
  }
  const uint64_t nnz = sparse::CountNonZero(dense.data(), s);
  std::vector<std::byte> values(nnz * 2);
  std::vector<uint8_t> bitmask(s.mask_bytes());
  std::vector<int64_t> offsets(s.rows);
  sparse::Encode(dense.data(), s, values.data(), bitmask.data(), offsets.data());
  // The output is 4 KiB-aligned, as the loader's buffers are, and faulted in
  // before it is timed (as are the vectors: value-initialised).
  std::unique_ptr<std::byte, decltype(&std::free)> out_memory(
      static_cast<std::byte*>(std::aligned_alloc(4096, (s.dense_bytes() + 4095) / 4096 * 4096)),
      &std::free);
  std::byte* out = out_memory.get();
  std::memset(out, 0, s.dense_bytes());

  std::string json =
      std::string("{\"case\": \"") + c.name + "\", \"rows\": " + std::to_string(s.rows) +
      ", \"cols\": " + std::to_string(s.cols) + ", \"dtype\": \"bf16\", \"density\": " +
      std::to_string(static_cast<double>(nnz) / (s.rows * s.cols)) +
      ", \"dense_bytes\": " + std::to_string(s.dense_bytes()) + ", \"gbps\": {";
  std::vector<Op> ops;
  ops.push_back({"memcpy_1t", [&] { std::memcpy(out, dense.data(), s.dense_bytes()); }});
  for (DecodeIsa isa : {DecodeIsa::kScalar, DecodeIsa::kAvx2, DecodeIsa::kAvx512}) {
    if (!sparse::Supported(isa)) continue;
    ops.push_back({std::string(sparse::IsaName(isa)) + "_1t", [&, isa] {
                     sparse::DecodeRows(isa, values.data(), bitmask.data(), offsets.data(), s, 0,
                                        s.rows, out);
                   }});
  }
  // Validate alone (what Decode adds to a decode), in dense bytes per second.
  ops.push_back({"validate_1t", [&] {
                   if (!sparse::Validate(bitmask.data(), offsets.data(), s, nnz).ok()) std::exit(1);
                 }});
  // Decode: validation, then the best decoder on 1 thread and on all cores.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<int> thread_counts = {1};
  if (cores > 1) thread_counts.push_back(cores);
  for (int threads : thread_counts) {
    ops.push_back(
        {"decode_" + std::to_string(threads) + "t", [&, threads] {
           if (!sparse::Decode(values.data(), nnz, bitmask.data(), offsets.data(), s, out, threads)
                    .ok()) {
             std::exit(1);
           }
         }});
  }
  for (size_t i = 1; i < ops.size(); ++i) {  // Every decoder gives the dense bytes.
    if (ops[i].name == "validate_1t") continue;
    std::memset(out, 0xCD, s.dense_bytes());
    ops[i].run();
    if (std::memcmp(out, dense.data(), dense.size()) != 0) {
      std::fprintf(stderr, "%s decoded wrong bytes\n", ops[i].name.c_str());
      std::exit(1);
    }
  }
  Measure(s.dense_bytes(), reps, ops);
  for (size_t i = 0; i < ops.size(); ++i) {
    const std::vector<double>& g = ops[i].gbps;
    char text[160];
    std::snprintf(text, sizeof(text), "%s\"%s\": {\"median\": %.2f, \"min\": %.2f, \"max\": %.2f}",
                  i ? ", " : "", ops[i].name.c_str(), g[g.size() / 2], g.front(), g.back());
    json += text;
    std::fprintf(stderr, "%-5s %-22s median %7.2f  min %7.2f  max %7.2f GB/s\n", c.name,
                 ops[i].name.c_str(), g[g.size() / 2], g.front(), g.back());
  }
  return json + "}}";
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 11;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--reps N]\n", argv[0]);
      return 2;
    }
  }
  std::string json = "{\"best_isa\": \"" + std::string(sparse::IsaName(sparse::BestDecodeIsa())) +
                     "\", \"reps\": " + std::to_string(reps) + ", \"cases\": [";
  const Case cases[] = {{"dram", 4096, 4096}, {"l2", 128, 2048}};
  for (size_t i = 0; i < std::size(cases); ++i) {
    json += (i ? ", " : "") + RunCase(cases[i], reps);
  }
  std::printf("%s]}\n", json.c_str());
  return 0;
}
