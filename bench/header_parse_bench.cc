// tl_header_bench FILE RUNS
//
// Times tensorlift::Header::ReadFile(FILE) (open, read the header, parse and
// validate it, then free the Header) RUNS times after one untimed warm-up
// run, and prints one JSON
// object on stdout:
//   {"median_s", "min_s", "runs", "tensors", "header_bytes", "baseline_rss_kb",
//    "max_rss_kb", "times_s": [each timed run, in order]}
// max_rss_kb is this process's peak resident set (VmHWM); baseline_rss_kb is
// the same figure before the first parse. bench/header_bench.py runs this
// and the reference package, each in its own process.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tensorlift/safetensors.h"

namespace {

// Peak resident set of this process's address space, in KiB: VmHWM from
// /proc/self/status. (getrusage's ru_maxrss would not do: Linux carries it
// over exec from the forked parent, so a child started from a large Python
// process would report at least the parent's size.)
long MaxRssKb() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  long kb = -1;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, "VmHWM: %ld kB", &kb) == 1) break;
  }
  std::fclose(f);
  return kb;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s FILE RUNS\n", argv[0]);
    return 2;
  }
  const std::string path = argv[1];
  const int runs = std::atoi(argv[2]);
  if (runs < 1) {
    std::fprintf(stderr, "RUNS must be a positive integer\n");
    return 2;
  }
  const long baseline_rss_kb = MaxRssKb();

  size_t tensors = 0;
  uint64_t header_bytes = 0;
  std::vector<double> times;
  times.reserve(runs);
  for (int i = -1; i < runs; ++i) {  // i == -1: warm-up.
    const auto t0 = std::chrono::steady_clock::now();
    {
      auto h = tensorlift::Header::ReadFile(path);
      if (!h.ok()) {
        std::fprintf(stderr, "%s\n", h.status().ToString().c_str());
        return 1;
      }
      tensors = h->tensors().size();
      header_bytes = h->header_size();
      // The Header is freed inside the timed scope, as the reference's object
      // is when its `with` block exits.
    }
    const auto t1 = std::chrono::steady_clock::now();
    if (i >= 0) times.push_back(std::chrono::duration<double>(t1 - t0).count());
  }
  std::string times_json;
  for (double t : times) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%s%.9f", times_json.empty() ? "" : ", ", t);
    times_json += buf;
  }
  std::sort(times.begin(), times.end());
  const size_t n = times.size();
  const double median = n % 2 ? times[n / 2] : (times[n / 2 - 1] + times[n / 2]) / 2;
  std::printf(
      "{\"median_s\": %.9f, \"min_s\": %.9f, \"runs\": %d, \"tensors\": %zu, "
      "\"header_bytes\": %llu, \"baseline_rss_kb\": %ld, \"max_rss_kb\": %ld, "
      "\"times_s\": [%s]}\n",
      median, times.front(), runs, tensors, static_cast<unsigned long long>(header_bytes),
      baseline_rss_kb, MaxRssKb(), times_json.c_str());
  return 0;
}
