// Content identity (tensorlift/content.h): the definition against an
// independent recomputation with XXH3_128bits over whole data, the same root
// whatever a load's read settings, and a changed byte changing only its
// tensor's hash and the root.
#include "tensorlift/content.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "../common/assert_ok.h"
#include "tensorlift/loader.h"
#include "test_files.h"

namespace tensorlift {
namespace {

using test::ScratchDir;
using ::testing::HasSubstr;
using testing::Random;
using testing::RawTensor;
using testing::WriteRaw;

// Canonical (big-endian) bytes of an XXH3-128 value, straight from libxxhash.
std::string Canonical(XXH128_hash_t h) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, h);
  return std::string(reinterpret_cast<const char*>(c.digest), 16);
}

std::string Hex(XXH128_hash_t h) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : Canonical(h)) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

std::string U64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

// The definition, written out once more: whole data in 4 MiB slices.
XXH128_hash_t RefTensorHash(const std::vector<uint8_t>& bytes) {
  std::string pieces;
  const size_t piece = 4u << 20;
  size_t at = 0;
  do {
    const size_t n = std::min(piece, bytes.size() - at);
    pieces += Canonical(XXH3_128bits(bytes.data() + at, n));
    at += n;
  } while (at < bytes.size());
  return XXH3_128bits(pieces.data(), pieces.size());
}

std::string RefRoot(std::vector<RawTensor> tensors) {
  std::sort(tensors.begin(), tensors.end(),
            [](const RawTensor& a, const RawTensor& b) { return a.name < b.name; });
  std::string in = "tensorlift-content-v1\n";
  for (const RawTensor& t : tensors) {
    const std::string dtype(DtypeName(t.dtype));
    in += U64(t.name.size()) + t.name + U64(dtype.size()) + dtype + U64(t.shape.size());
    for (uint64_t d : t.shape) in += U64(d);
    in += Canonical(RefTensorHash(t.bytes));
  }
  return Hex(XXH3_128bits(in.data(), in.size()));
}

// Tensors across piece boundaries: empty, tiny, exactly 4 MiB, 4 MiB + 1, ~9 MiB.
std::vector<RawTensor> Tensors() {
  return {
      Random("z.small", Dtype::kF32, {3, 5}, 1),
      Random("a.four_mib", Dtype::kU8, {4u << 20}, 2),
      Random("m.four_mib_and_one", Dtype::kU8, {(4u << 20) + 1}, 3),
      Random("b.empty", Dtype::kBF16, {0, 7}, 4),
      Random("c.nine", Dtype::kF16, {9 * 1024 * 1024 / 2 + 3}, 5),
      Random("d.odd", Dtype::kU8, {7}, 6),  // Leaves the next tensors misaligned.
      Random("e.f64", Dtype::kF64, {1000}, 7),
  };
}

TEST(ContentTest, DefinitionMatchesAnIndependentRecomputation) {
  for (const RawTensor& t : Tensors()) {
    EXPECT_EQ(TensorContentHash(t.bytes.data(), t.bytes.size()).Hex(), Hex(RefTensorHash(t.bytes)))
        << t.name;
  }
  std::vector<TensorContent> contents;
  for (const RawTensor& t : Tensors()) {
    contents.push_back({t.name, t.dtype, std::vector<int64_t>(t.shape.begin(), t.shape.end()),
                        t.bytes.size(), TensorContentHash(t.bytes.data(), t.bytes.size())});
  }
  const ContentIdentity id = MakeContentIdentity(contents);
  EXPECT_EQ(id.root.Hex(), RefRoot(Tensors()));
  EXPECT_TRUE(std::is_sorted(id.tensors.begin(), id.tensors.end(),
                             [](auto& a, auto& b) { return a.name < b.name; }));
  // Hex round trip, and refusals.
  auto back_r = Hash128::FromHex(id.root.Hex());
  ASSERT_OK(back_r.status());
  Hash128 back = std::move(back_r).value();
  EXPECT_EQ(back, id.root);
  EXPECT_THAT(Hash128::FromHex("abc").status().message(), HasSubstr("32 hex digits"));
  EXPECT_FALSE(Hash128::FromHex(std::string(31, '0') + "g").ok());
}

TEST(ContentTest, HasherGivesTheSameHashesWhateverTheSplitAndOrder) {
  const std::vector<RawTensor> raw = Tensors();
  std::vector<TensorContent> contents;
  std::vector<const std::byte*> data;
  for (const RawTensor& t : raw) {
    contents.push_back({t.name,
                        t.dtype,
                        std::vector<int64_t>(t.shape.begin(), t.shape.end()),
                        t.bytes.size(),
                        {}});
    data.push_back(reinterpret_cast<const std::byte*>(t.bytes.data()));
  }
  const std::string want = RefRoot(raw);
  std::mt19937 rng(7);
  for (int round = 0; round < 4; ++round) {
    ContentHasher hasher(contents, data);
    struct Range {
      size_t tensor;
      uint64_t off, len;
    };
    std::vector<Range> ranges;
    for (size_t i = 0; i < raw.size(); ++i) {
      for (uint64_t at = 0; at < raw[i].bytes.size();) {
        const uint64_t len = std::min<uint64_t>(raw[i].bytes.size() - at, 1 + rng() % (3u << 20));
        ranges.push_back({i, at, len});
        at += len;
      }
    }
    std::shuffle(ranges.begin(), ranges.end(), rng);
    // Round 3 leaves some ranges to Finish (as views are).
    const size_t landed = round == 3 ? ranges.size() / 2 : ranges.size();
    for (size_t k = 0; k < landed; ++k)
      hasher.Landed(ranges[k].tensor, ranges[k].off, ranges[k].len);
    EXPECT_EQ(std::move(hasher).Finish().root.Hex(), want) << "round " << round;
  }
}

// Loads with every read setting give the same identity, the reference's.
TEST(ContentTest, LoadsComputeTheSameRootWhateverTheReadSettings) {
  ScratchDir dir;
  const std::vector<RawTensor> raw = Tensors();
  const std::string path = dir / "m.safetensors";
  WriteRaw(path, raw, /*lead_spaces=*/3);
  const std::string want = RefRoot(raw);
  struct Setting {
    IoMode mode;
    IoEngine engine;
    uint64_t block;
    int threads;
  };
  for (const Setting& s : std::vector<Setting>{{IoMode::kBuffered, IoEngine::kThreads, 8u << 20, 4},
                                               {IoMode::kBuffered, IoEngine::kThreads, 4096, 2},
                                               {IoMode::kBuffered, IoEngine::kThreads, 3u << 20, 1},
                                               {IoMode::kDirect, IoEngine::kThreads, 1u << 20, 3},
                                               {IoMode::kDirect, IoEngine::kUring, 8u << 20, 0},
                                               {IoMode::kBuffered, IoEngine::kUring, 65536, 0},
                                               {IoMode::kDirect, IoEngine::kAuto, 5u << 20, 0}}) {
    LoadOptions opts;
    opts.mode = s.mode;
    opts.engine = s.engine;
    opts.block_size = s.block;
    opts.threads = s.threads;
    SCOPED_TRACE(std::string(IoModeName(s.mode)) + "/" + std::string(IoEngineName(s.engine)) +
                 " block " + std::to_string(s.block));
    auto loaded = Load(path, opts);
    if (!loaded.ok() && s.engine == IoEngine::kUring) continue;  // No io_uring here.
    ASSERT_OK(loaded.status());
    ASSERT_NE(loaded->content(), nullptr);
    EXPECT_EQ(loaded->content()->root.Hex(), want);
    ASSERT_EQ(loaded->content()->tensors.size(), raw.size());
  }
  // Views of a mapping: none by default, by a pass when asked; off: none.
  LoadOptions mm;
  mm.mode = IoMode::kMmap;
  auto viewed_r = Load(path, mm);
  ASSERT_OK(viewed_r.status());
  auto viewed = std::move(viewed_r).value();
  EXPECT_EQ(viewed.content(), nullptr);
  mm.content_hash = ContentHashMode::kOn;
  auto hashed_r = Load(path, mm);
  ASSERT_OK(hashed_r.status());
  auto hashed = std::move(hashed_r).value();
  ASSERT_NE(hashed.content(), nullptr);
  EXPECT_EQ(hashed.content()->root.Hex(), want);
  LoadOptions off;
  off.mode = IoMode::kBuffered;
  off.content_hash = ContentHashMode::kOff;
  auto none_r = Load(path, off);
  ASSERT_OK(none_r.status());
  auto none = std::move(none_r).value();
  EXPECT_EQ(none.content(), nullptr);
  // A streamed load (on_tensor) and a shared-memory load compute it too.
  LoadOptions streamed;
  streamed.mode = IoMode::kBuffered;
  int handed = 0;
  streamed.on_tensor = [&](const StreamedTensor&) {
    ++handed;
    return Status::Ok();
  };
  auto s_r = Load(path, streamed);
  ASSERT_OK(s_r.status());
  auto s = std::move(s_r).value();
  EXPECT_EQ(handed, static_cast<int>(raw.size()));
  ASSERT_NE(s.content(), nullptr);
  EXPECT_EQ(s.content()->root.Hex(), want);
  LoadOptions shm;
  shm.mode = IoMode::kBuffered;
  shm.shared_memory = true;
  auto shared = Load(path, shm);
  if (shared.ok()) {
    ASSERT_NE(shared->content(), nullptr);
    EXPECT_EQ(shared->content()->root.Hex(), want);
  }
  // A conversion is not the stored bytes: asking is an error.
  LoadOptions conv;
  conv.dtype = Dtype::kF32;
  conv.content_hash = ContentHashMode::kOn;
  EXPECT_THAT(Load(path, conv).status().message(), HasSubstr("content_hash"));
}

TEST(ContentTest, AChangedByteChangesItsTensorsHashAndTheRootOnly) {
  ScratchDir dir;
  std::vector<RawTensor> raw = Tensors();
  WriteRaw(dir / "a.safetensors", raw);
  raw[2].bytes[(4u << 20) + 0] ^= 0x40;  // m.four_mib_and_one: its last piece's one byte.
  WriteRaw(dir / "b.safetensors", raw);
  LoadOptions opts;
  opts.mode = IoMode::kBuffered;
  auto a_r = Load(dir / "a.safetensors", opts);
  ASSERT_OK(a_r.status());
  auto a = std::move(a_r).value();
  auto b_r = Load(dir / "b.safetensors", opts);
  ASSERT_OK(b_r.status());
  auto b = std::move(b_r).value();
  ASSERT_TRUE(a.content() && b.content());
  EXPECT_NE(a.content()->root, b.content()->root);
  EXPECT_EQ(b.content()->root.Hex(), RefRoot(raw));
  for (const TensorContent& t : a.content()->tensors) {
    const TensorContent* u = b.content()->Find(t.name);
    ASSERT_NE(u, nullptr);
    if (t.name == "m.four_mib_and_one") {
      EXPECT_NE(t.hash, u->hash);
    } else {
      EXPECT_EQ(t.hash, u->hash) << t.name;
    }
  }
}

}  // namespace
}  // namespace tensorlift
