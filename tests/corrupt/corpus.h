// A corpus of hand-built safetensors files: one per failure class of the
// format's rules (design.md, "The safetensors rules"), plus valid edge cases.
//
// Each case records two verdicts: tensorlift's (the rule name, or "ok") and the
// reference reader's (safetensors 0.8, "ok" or "error"). They differ where
// tensorlift is deliberately stricter (duplicate tensor names, a tensor given
// as a JSON array). tests/python/test_reference.py checks the reference column
// against the real reference package; tests/format/header_parser_test.cc checks
// the expected column against Header::Parse and Header::ReadFile.
//
// Cases are independent of the code under test: the bytes are spelled out
// here, not produced by tensorlift's writer.
#ifndef TENSORLIFT_TESTS_CORRUPT_CORPUS_H_
#define TENSORLIFT_TESTS_CORRUPT_CORPUS_H_

#include <array>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tensorlift/status.h"

namespace tensorlift::testing {

// The rule names, in the order the reader applies them.
inline constexpr std::array<std::string_view, 11> kRuleNames = {
    "HeaderTooSmall",
    "HeaderTooLarge",
    "InvalidHeaderLength",
    "InvalidHeader",
    "InvalidHeaderDeserialization",
    "DuplicateTensor",
    "InvalidOffset",
    "ValidationOverflow",
    "MisalignedSlice",
    "TensorInvalidInfo",
    "MetadataIncompleteBuffer",
};

struct CorpusCase {
  // A filename-safe identifier ([a-z0-9_]+), unique in the corpus.
  std::string name;
  // The whole file.
  std::string bytes;
  // tensorlift's verdict: "ok" or one of kRuleNames.
  std::string expected;
  // The reference reader's verdict: "ok" or "error".
  std::string reference;
  // Empty, or why tensorlift's current verdict is known to differ from
  // `expected` (a bug in src/ not yet fixed). Tests skip such cases while the
  // verdict differs, and pass once it matches.
  std::string known_bug;

  std::span<const std::byte> span() const {
    return std::as_bytes(std::span<const char>(bytes.data(), bytes.size()));
  }
};

struct CorpusOptions {
  // Adds the cases of 100 MB (a header of exactly kMaxHeaderSize bytes).
  bool include_large = false;
};

// Builds every case, in the order of the rules, then the valid ones.
std::vector<CorpusCase> MakeCorpus(const CorpusOptions& options = {});

// Writes DIR/<name>.safetensors for each case, DIR/manifest.tsv with one line
// "name<TAB>expected<TAB>reference" per case, and DIR/known_bugs.tsv with one
// line "name<TAB>note" per case whose known_bug is set. Creates DIR if needed.
Status WriteCorpus(const std::string& dir, const std::vector<CorpusCase>& cases);

}  // namespace tensorlift::testing

#endif  // TENSORLIFT_TESTS_CORRUPT_CORPUS_H_
