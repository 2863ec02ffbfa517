// tensorlift sparsify IN OUT: a sparse-bitmask copy of a dense checkpoint
// (sparse/sparsify.h), with a summary of what was encoded.
#include "tensorlift/sparsify.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

#include "commands.h"
#include "tensorlift/text.h"

namespace tensorlift::cli {
namespace {

// A number that is the whole of `s`.
std::optional<double> ParseNumber(const std::string& s) {
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || end != s.c_str() + s.size()) return std::nullopt;
  return v;
}

// "none" or "magnitude:FRACTION".
bool ParsePrune(const std::string& s, std::optional<double>* prune) {
  if (s == "none") {
    prune->reset();
    return true;
  }
  const std::string kMagnitude = "magnitude:";
  if (s.compare(0, kMagnitude.size(), kMagnitude) != 0) return false;
  *prune = ParseNumber(s.substr(kMagnitude.size()));
  return prune->has_value();
}

// BYTES, or a number with KB, MB, GB (powers of 1000, as transformers'
// max_shard_size) or KiB, MiB, GiB.
std::optional<uint64_t> ParseSize(const std::string& s) {
  static const std::pair<const char*, double> kUnits[] = {{"KiB", 1024.0},
                                                          {"MiB", 1024.0 * 1024},
                                                          {"GiB", 1024.0 * 1024 * 1024},
                                                          {"KB", 1e3},
                                                          {"MB", 1e6},
                                                          {"GB", 1e9},
                                                          {"B", 1.0},
                                                          {"", 1.0}};
  for (const auto& [unit, scale] : kUnits) {
    const std::string u = unit;
    if (s.size() < u.size() || s.compare(s.size() - u.size(), u.size(), u) != 0) continue;
    auto v = ParseNumber(s.substr(0, s.size() - u.size()));
    if (!v || !(*v >= 1) || *v * scale >= 1.8e19) return std::nullopt;
    return static_cast<uint64_t>(*v * scale);
  }
  return std::nullopt;
}

}  // namespace

int RunSparsify(const SparsifyArgs& args) {
  sparse::SparsifyOptions opts;
  if (!ParsePrune(args.prune, &opts.prune)) {
    std::fprintf(stderr,
                 "--prune: expected none or magnitude:FRACTION (e.g. magnitude:0.5), not %s\n",
                 QuoteName(args.prune).c_str());
    return kExitUsage;
  }
  opts.min_sparsity = args.min_sparsity;
  opts.targets = args.targets;
  opts.write_sparsity_config = !args.no_sparsity_config;
  const std::optional<uint64_t> shard_size = ParseSize(args.max_shard_size);
  if (!shard_size) {
    std::fprintf(stderr,
                 "--max-shard-size: expected a positive size such as 5GB or 1048576, not %s\n",
                 QuoteName(args.max_shard_size).c_str());
    return kExitUsage;
  }
  opts.max_shard_bytes = *shard_size;
  auto report = sparse::Sparsify(args.input, args.output, opts);
  if (!report.ok()) {
    std::fprintf(stderr, "%s\n", report.status().ToString().c_str());
    return kExitInvalid;
  }

  uint64_t targets = 0;
  for (const auto& t : report->tensors) targets += t.target;
  std::printf("encoded     %llu of %llu tensors (%llu targets), global sparsity %.4f\n",
              static_cast<unsigned long long>(report->encoded),
              static_cast<unsigned long long>(report->tensors.size()),
              static_cast<unsigned long long>(targets), report->global_sparsity);
  std::printf("kept dense  %llu\n", static_cast<unsigned long long>(report->kept_dense));
  for (const auto& t : report->tensors) {
    if (t.target && !t.encoded)
      std::printf("  %s: %s\n", QuoteName(t.name).c_str(), t.note.c_str());
  }
  const double ratio = report->bytes_in == 0 ? 1.0
                                             : static_cast<double>(report->bytes_out) /
                                                   static_cast<double>(report->bytes_in);
  std::printf("bytes       %llu -> %llu (%.2f%%; %s -> %s)\n",
              static_cast<unsigned long long>(report->bytes_in),
              static_cast<unsigned long long>(report->bytes_out), 100 * ratio,
              HumanBytes(report->bytes_in).c_str(), HumanBytes(report->bytes_out).c_str());
  std::printf("wrote       %s:", args.output.c_str());
  for (const auto& f : report->files) std::printf(" %s", QuoteName(f).c_str());
  std::printf("\n");
  for (const auto& [name, why] : report->skipped) {
    std::printf("not copied  %s: %s\n", QuoteName(name).c_str(), why.c_str());
  }
  return kExitOk;
}

}  // namespace tensorlift::cli
