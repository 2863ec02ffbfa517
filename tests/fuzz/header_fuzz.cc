// libFuzzer target for the safetensors header parser (tensorlift::Header).
//
// Each input is a whole file. The target:
//   1. parses it with Header::Parse, counting the allocations made meanwhile;
//   2. on error, checks the documented error contract: a Corruption status
//      whose message starts with one of the reference's rule names;
//   3. on success, checks the invariants a valid Header promises: tensors are
//      contiguous from data offset 0 in file order, each holds exactly the
//      bits/8 bytes of its dtype x shape, the data section ends at
//      the end of the input, by_name() is a sorted permutation, and Find()
//      returns every tensor (and nothing for an absent name);
//   4. re-parses the same bytes through ParsePrefix (the whole file as the
//      prefix, so it holds the data section too) and compares;
//   5. round-trips through the writer: Serialize(tensors, metadata) must
//      parse again to the same tensors, metadata and bytes, and serializing
//      that again must give identical bytes.
// Any broken invariant aborts with a message (a finding).
//
// Memory: no single allocation made while parsing may exceed
// kMaxAllocPerInputByte x input size + kAllocSlack, and the bytes live at once
// may not exceed kMaxLivePerInputByte x input size + kAllocSlack: the parser
// must allocate in proportion to the header it was given, never to a number
// read from it. (libFuzzer's -malloc_limit_mb bounds the same thing
// absolutely, against -max_len.)
#include <sanitizer/allocator_interface.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tensorlift/dtype.h"
#include "tensorlift/safetensors.h"
#include "tensorlift/status.h"

namespace tensorlift {
namespace {

// simdjson's DOM parser reserves a tape of 8 bytes per header byte, string
// space of 5/3 per byte and structural indexes of 4 per byte; the header is
// copied once; the parser reserves a TensorInfo (88 bytes) per top-level key,
// and a key can take as little as 5 bytes ("":0,). Measured on 1 MB inputs
// (TL_FUZZ_ALLOC_REPORT=1): largest allocation 8x for valid headers, 17.6x for
// {"":0,"":0,...}; peak live 18-23x valid, 32x worst seen.
constexpr uint64_t kMaxAllocPerInputByte = 24;
constexpr uint64_t kMaxLivePerInputByte = 64;
constexpr uint64_t kAllocSlack = 256 * 1024;

// Allocation accounting, armed only around the parse, on the fuzzing thread.
thread_local bool g_armed = false;
// TL_FUZZ_ALLOC_REPORT=1 prints each input's allocation figures (for choosing
// the bounds above: run the binary on a few large files).
bool g_report_allocs = false;
uint64_t g_max_alloc = 0;
int64_t g_live = 0;
int64_t g_peak_live = 0;

void MallocHook(const volatile void* /*ptr*/, size_t size) {
  if (!g_armed) return;
  if (size > g_max_alloc) g_max_alloc = size;
  g_live += static_cast<int64_t>(size);
  if (g_live > g_peak_live) g_peak_live = g_live;
}

void FreeHook(const volatile void* ptr) {
  if (!g_armed || ptr == nullptr) return;
  // Blocks allocated before arming are not counted in g_live either, so
  // their frees could make g_live negative; that only makes the check laxer.
  g_live -= static_cast<int64_t>(__sanitizer_get_allocated_size(const_cast<const void*>(ptr)));
}

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "header_fuzz: invariant broken: %s: %s\n", what, detail.c_str());
  std::abort();
}

#define FUZZ_CHECK(cond, detail)                   \
  do {                                             \
    if (!(cond)) Fail(#cond, std::string(detail)); \
  } while (0)

constexpr std::string_view kRuleNames[] = {
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

void CheckError(const Status& s) {
  FUZZ_CHECK(!s.ok(), "");
  FUZZ_CHECK(s.code() == StatusCode::kCorruption, s.ToString());
  const std::string& m = s.message();
  const size_t colon = m.find(": ");
  FUZZ_CHECK(colon != std::string::npos, m);
  const std::string_view rule(m.data(), colon);
  FUZZ_CHECK(std::find(std::begin(kRuleNames), std::end(kRuleNames), rule) != std::end(kRuleNames),
             m);
}

uint64_t LoadLE64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void CheckHeader(const Header& h, std::span<const std::byte> file) {
  const uint64_t size = file.size();
  FUZZ_CHECK(size >= 8, "");
  FUZZ_CHECK(h.header_size() == LoadLE64(reinterpret_cast<const uint8_t*>(file.data())), "");
  FUZZ_CHECK(h.header_size() <= kMaxHeaderSize, "");
  FUZZ_CHECK(h.data_offset() == 8 + h.header_size(), "");
  FUZZ_CHECK(h.file_size() == size, std::to_string(h.file_size()) + " vs " + std::to_string(size));

  const auto& ts = h.tensors();
  uint64_t expect_begin = 0;
  for (const TensorInfo& t : ts) {
    FUZZ_CHECK(t.begin == expect_begin, t.name);
    FUZZ_CHECK(t.end >= t.begin, t.name);
    FUZZ_CHECK(t.name != "__metadata__", "");
    // Element count and size, recomputed with checked arithmetic.
    uint64_t nel = 1;
    for (uint64_t d : t.shape) FUZZ_CHECK(!__builtin_mul_overflow(nel, d, &nel), t.name);
    FUZZ_CHECK(t.num_elements == nel, t.name);
    uint64_t bits;
    FUZZ_CHECK(!__builtin_mul_overflow(nel, static_cast<uint64_t>(DtypeBits(t.dtype)), &bits),
               t.name);
    FUZZ_CHECK(bits % 8 == 0, t.name);
    FUZZ_CHECK(bits / 8 == t.nbytes(), t.name);
    FUZZ_CHECK(DtypeFromName(DtypeName(t.dtype)) == t.dtype, t.name);
    expect_begin = t.end;
  }
  FUZZ_CHECK(h.data_size() == expect_begin, "");

  // by_name(): a permutation of the tensors, sorted, without duplicates.
  const auto& by_name = h.by_name();
  FUZZ_CHECK(by_name.size() == ts.size(), "");
  std::vector<bool> seen(ts.size(), false);
  for (size_t i = 0; i < by_name.size(); ++i) {
    FUZZ_CHECK(by_name[i] < ts.size(), "");
    FUZZ_CHECK(!seen[by_name[i]], "");
    seen[by_name[i]] = true;
    if (i > 0) FUZZ_CHECK(ts[by_name[i - 1]].name < ts[by_name[i]].name, ts[by_name[i]].name);
  }
  for (const TensorInfo& t : ts) FUZZ_CHECK(h.Find(t.name) == &t, t.name);
  // Absent names: a name with a byte appended, and the empty name if unused.
  if (!ts.empty()) {
    std::string absent = ts[by_name.back()].name + '\x7f';
    FUZZ_CHECK(h.Find(absent) == nullptr, absent);
  }
  if (ts.empty() || !ts[by_name.front()].name.empty()) FUZZ_CHECK(h.Find("") == nullptr, "");
}

bool SameTensors(const Header& a, const Header& b, std::span<const std::byte> a_file,
                 std::span<const std::byte> b_file, std::string* why) {
  if (a.tensors().size() != b.tensors().size()) {
    *why = "tensor count";
    return false;
  }
  for (const TensorInfo& t : a.tensors()) {
    const TensorInfo* u = b.Find(t.name);
    if (u == nullptr) {
      *why = "missing " + t.name;
      return false;
    }
    if (u->dtype != t.dtype || u->shape != t.shape || u->nbytes() != t.nbytes()) {
      *why = "different info for " + t.name;
      return false;
    }
    if (t.nbytes() != 0 &&
        std::memcmp(a_file.data() + a.data_offset() + t.begin,
                    b_file.data() + b.data_offset() + u->begin, t.nbytes()) != 0) {
      *why = "different bytes for " + t.name;
      return false;
    }
  }
  if (a.metadata() != b.metadata()) {
    *why = "metadata";
    return false;
  }
  return true;
}

std::vector<TensorView> Views(const Header& h, std::span<const std::byte> file) {
  std::vector<TensorView> views;
  views.reserve(h.tensors().size());
  for (const TensorInfo& t : h.tensors()) {
    views.push_back(
        TensorView{t.name, t.dtype, t.shape, file.subspan(h.data_offset() + t.begin, t.nbytes())});
  }
  return views;
}

void RoundTrip(const Header& h, std::span<const std::byte> file) {
  std::vector<TensorView> views = Views(h, file);
  auto bytes = Serialize(views, h.metadata());
  // Our inputs are at most -max_len bytes, so the rewritten header (escapes
  // can at most grow each byte 6x) stays far below kMaxHeaderSize.
  FUZZ_CHECK(bytes.ok(), bytes.status().ToString());
  auto again = Header::Parse(*bytes);
  FUZZ_CHECK(again.ok(), again.status().ToString());
  std::string why;
  FUZZ_CHECK(SameTensors(h, *again, file, *bytes, &why), why);
  // The writer is deterministic: writing what it wrote gives the same bytes.
  std::vector<TensorView> views2 = Views(*again, *bytes);
  auto bytes2 = Serialize(views2, again->metadata());
  FUZZ_CHECK(bytes2.ok(), bytes2.status().ToString());
  FUZZ_CHECK(*bytes2 == *bytes, "second serialization differs");
}

}  // namespace
}  // namespace tensorlift

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  // Up to 5 hooks may be installed; libFuzzer uses one.
  __sanitizer_install_malloc_and_free_hooks(tensorlift::MallocHook, tensorlift::FreeHook);
  tensorlift::g_report_allocs = std::getenv("TL_FUZZ_ALLOC_REPORT") != nullptr;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tensorlift;
  const std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);

  g_max_alloc = 0;
  g_live = 0;
  g_peak_live = 0;
  g_armed = true;
  Result<Header> h = Header::Parse(file);
  g_armed = false;
  if (g_report_allocs) {
    std::fprintf(
        stderr,
        "header_fuzz: %zu bytes: %s; largest allocation %llu (%.2fx), peak live %lld (%.2fx)\n",
        size, h.ok() ? "valid" : "invalid", static_cast<unsigned long long>(g_max_alloc),
        size ? double(g_max_alloc) / double(size) : 0.0, static_cast<long long>(g_peak_live),
        size ? double(g_peak_live) / double(size) : 0.0);
  }
  const uint64_t bound_one = kMaxAllocPerInputByte * size + kAllocSlack;
  const uint64_t bound_live = kMaxLivePerInputByte * size + kAllocSlack;
  FUZZ_CHECK(g_max_alloc <= bound_one, "largest allocation " + std::to_string(g_max_alloc) +
                                           " bytes for an input of " + std::to_string(size));
  FUZZ_CHECK(static_cast<uint64_t>(std::max<int64_t>(g_peak_live, 0)) <= bound_live,
             "peak live " + std::to_string(g_peak_live) + " bytes for an input of " +
                 std::to_string(size));

  if (!h.ok()) {
    CheckError(h.status());
    return 0;
  }
  CheckHeader(*h, file);

  // ParsePrefix with the whole file as the prefix must agree with Parse.
  auto p = Header::ParsePrefix(file, size);
  FUZZ_CHECK(p.ok(), p.status().ToString());
  std::string why;
  FUZZ_CHECK(SameTensors(*h, *p, file, file, &why), why);

  RoundTrip(*h, file);
  return 0;
}
