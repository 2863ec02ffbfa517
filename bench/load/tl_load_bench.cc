// tl_load_bench: one timed load for the load benchmark (bench/load/).
//
//   tl_load_bench PATH [--mode auto|buffered|direct|mmap] [--engine auto|threads|uring]
//                      [--threads N] [--queue-depth N] [--block-mib N]
//                      [--fault-threads N (negative: none)] [--stream]
//
// Opens PATH (a file, an index or a directory), loads every tensor with
// tensorlift::Load, then reads every tensor's bytes once (XXH3-64, the same
// pass every contender of the benchmark makes, which is also what makes an
// mmap load count as loaded) and prints one JSON object on stdout:
//   load_s   Checkpoint::Open + Load, in seconds;
//   total_s  load_s + the hash pass (the figure the benchmark compares);
//   bytes, tensors, peak_rss_bytes (getrusage), xor (of the per-tensor XXH3
//   values, 16 hex digits) and, per file, the mode and engine used and why.
// --stream: the hash pass is done in LoadOptions::on_tensor, tensor by tensor
// as their bytes land, overlapping the reads; total_s is then the load's end,
// and first_s the time to the first tensor handed out.
// Exits 1 with a message on stderr when the load fails, 2 on bad usage.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "tensorlift/checksum.h"
#include "tensorlift/loader.h"

namespace {

std::string JsonString(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

int Usage() {
  std::fprintf(stderr,
               "usage: tl_load_bench PATH [--mode auto|buffered|direct|mmap] "
               "[--engine auto|threads|uring] [--threads N] [--queue-depth N] [--block-mib N] "
               "[--fault-threads N] [--stream]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using tensorlift::IoEngine;
  using tensorlift::IoMode;
  if (argc < 2) return Usage();
  std::string path;
  bool stream = false;
  tensorlift::LoadOptions opts;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (arg == "--mode" || arg == "--engine") {
      const char* v = value();
      if (v == nullptr) return Usage();
      if (arg == "--mode") {
        auto m = tensorlift::ParseIoMode(v);
        if (!m.ok()) return Usage();
        opts.mode = *m;
      } else {
        auto e = tensorlift::ParseIoEngine(v);
        if (!e.ok()) return Usage();
        opts.engine = *e;
      }
    } else if (arg == "--stream") {
      stream = true;
    } else if (arg == "--fault-threads") {
      const char* v = value();
      if (v == nullptr) return Usage();
      opts.fault_threads = static_cast<int>(std::strtol(v, nullptr, 10));
    } else if (arg == "--threads" || arg == "--queue-depth" || arg == "--block-mib") {
      const char* v = value();
      if (v == nullptr) return Usage();
      const long n = std::strtol(v, nullptr, 10);
      if (n <= 0) return Usage();
      if (arg == "--threads") opts.threads = static_cast<int>(n);
      if (arg == "--queue-depth") opts.queue_depth = static_cast<int>(n);
      if (arg == "--block-mib") opts.block_size = static_cast<uint64_t>(n) << 20;
    } else if (!arg.empty() && arg[0] != '-' && path.empty()) {
      path = arg;
    } else {
      return Usage();
    }
  }
  if (path.empty()) return Usage();

  using Clock = std::chrono::steady_clock;
  uint64_t x = 0, bytes = 0;
  double first_s = -1;
  const auto t0 = Clock::now();
  if (stream) {
    opts.on_tensor = [&](const tensorlift::StreamedTensor& st) {
      if (first_s < 0) first_s = std::chrono::duration<double>(Clock::now() - t0).count();
      x ^= tensorlift::Xxh3_64(st.tensor().data, st.tensor().nbytes);
      bytes += st.tensor().nbytes;
      return tensorlift::Status::Ok();
    };
  }
  auto loaded = tensorlift::Load(path, opts);
  const auto t1 = Clock::now();
  if (!loaded.ok()) {
    std::fprintf(stderr, "tl_load_bench: %s\n", loaded.status().ToString().c_str());
    return 1;
  }
  if (!stream) {
    for (const tensorlift::LoadedTensor& t : loaded->tensors()) {
      x ^= tensorlift::Xxh3_64(t.data, t.nbytes);
      bytes += t.nbytes;
    }
  }
  const auto t2 = Clock::now();

  struct rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
  const double load_s = std::chrono::duration<double>(t1 - t0).count();
  const double total_s = std::chrono::duration<double>(t2 - t0).count();
  std::string files = "[";
  for (const tensorlift::FileReport& f : loaded->files()) {
    if (files.size() > 1) files += ",";
    files += "{\"path\":" + JsonString(f.path) +
             ",\"mode\":" + JsonString(tensorlift::IoModeName(f.mode)) +
             ",\"engine\":" + JsonString(tensorlift::IoEngineName(f.engine)) +
             ",\"reason\":" + JsonString(f.reason) + ",\"bytes\":" + std::to_string(f.bytes) +
             ",\"realigned\":" + std::to_string(f.realigned) + "}";
  }
  files += "]";
  std::printf(
      "{\"first_s\":%s,\"load_s\":%.6f,\"total_s\":%.6f,\"loader_s\":%.6f,\"bytes\":%llu,"
      "\"tensors\":%zu,"
      "\"peak_rss_bytes\":%llu,\"xor\":\"%s\",\"options\":{\"mode\":%s,\"engine\":%s,\"threads\":%"
      "d,"
      "\"queue_depth\":%d,\"block_size\":%llu,\"fault_threads\":%d},\"files\":%s}\n",
      first_s < 0 ? "null" : std::to_string(first_s).c_str(), load_s, total_s, loaded->seconds(),
      static_cast<unsigned long long>(bytes), loaded->tensors().size(),
      static_cast<unsigned long long>(ru.ru_maxrss) * 1024ull, tensorlift::HexU64(x).c_str(),
      JsonString(tensorlift::IoModeName(opts.mode)).c_str(),
      JsonString(tensorlift::IoEngineName(opts.engine)).c_str(), opts.threads, opts.queue_depth,
      static_cast<unsigned long long>(opts.block_size), opts.fault_threads, files.c_str());
  return 0;
}
