// The verbs of the tensorlift CLI. Each returns the process exit code:
// 0 ok, 1 invalid input (a bad file, a missing path), 2 usage.
#ifndef TENSORLIFT_TOOLS_COMMANDS_H_
#define TENSORLIFT_TOOLS_COMMANDS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace tensorlift::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitInvalid = 1;
inline constexpr int kExitUsage = 2;

int RunInspect(const std::string& path, bool json);
int RunVerify(const std::vector<std::string>& paths, bool quiet);

struct LoadArgs {
  std::string path;
  std::string filter;  // Regex; empty: all.
  std::string mode = "auto";
  std::string engine = "auto";
  int threads = 0;
  int queue_depth = 32;
  uint64_t block_mib = 8;
  bool checksum = false;
  bool progress = true;  // Only drawn on a terminal.
  std::string device = "cpu";
  std::string dtype;     // Empty: keep each tensor's.
  int staging_buffers = 4;
  uint64_t staging_mib = 16;
  bool gds = true;
};
int RunLoad(const LoadArgs& args);

struct SparsifyArgs {
  std::string input;
  std::string output;
  std::string prune = "none";  // "none" or "magnitude:FRACTION".
  double min_sparsity = 0.3;
  std::string targets = R"(\.weight$)";
  std::string max_shard_size = "5GB";  // Bytes, or with KB/MB/GB/KiB/MiB/GiB.
};
// Writes a sparse-bitmask copy of a checkpoint and prints what it did.
int RunSparsify(const SparsifyArgs& args);

// "12.3 MiB": bytes for people.
std::string HumanBytes(uint64_t bytes);

// Prints what was built and what works here (Capabilities()); always 0.
int RunDoctor(const std::string& path, bool json);

}  // namespace tensorlift::cli

#endif  // TENSORLIFT_TOOLS_COMMANDS_H_
