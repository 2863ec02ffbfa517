// Sparsify: bit-exact round trips, what stays dense, magnitude pruning,
// shards and the index, config.json and the companion files, the size
// arithmetic, and the errors.
#include "tensorlift/sparsify.h"

#include <simdjson.h>
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "../common/assert_ok.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sparse_files.h"
#include "tensorlift/bitmask.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/sparse.h"

namespace tensorlift::sparse {
namespace {

using sparse_testing::Make;
using sparse_testing::RandomSparse;
using sparse_testing::ScratchDir;
using sparse_testing::Tensor;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr uint16_t kBf16NegZero = 0x8000, kBf16Nan = 0x7FC1, kBf16Inf = 0x7F80, kBf16Sub = 0x0001;

// Every dense tensor of a sparsified checkpoint: groups decoded with the
// reference algorithm (after the codec's Validate), plain tensors as stored.
std::map<std::string, std::vector<std::byte>> DecodeAll(const std::string& path) {
  std::map<std::string, std::vector<std::byte>> out;
  auto ckpt = Checkpoint::Open(path);
  EXPECT_OK(ckpt);
  if (!ckpt.ok()) return out;
  auto cat = FindSparse(*ckpt);
  EXPECT_OK(cat);
  if (!cat.ok()) return out;
  auto raw = sparse_testing::LoadAll(path);
  auto part = [&](Checkpoint::Location loc) -> const std::vector<std::byte>& {
    auto it = raw.find(ckpt->info(loc).name);
    EXPECT_NE(it, raw.end()) << ckpt->info(loc).name << " was not loaded";
    static const std::vector<std::byte> kNone;
    return it == raw.end() ? kNone : it->second;
  };
  for (auto loc : cat->dense) out[ckpt->info(loc).name] = part(loc);
  for (const auto& st : cat->sparse) {
    const auto& values = part(st.values);
    const auto& mask = part(st.bitmask);
    const auto& offsets = part(st.row_offsets);
    if (values.size() != st.nnz * st.shape.elem_bytes || mask.size() != st.shape.mask_bytes() ||
        offsets.size() != st.shape.rows * sizeof(int64_t)) {
      ADD_FAILURE() << st.name << ": parts of the wrong size";
      continue;
    }
    Status v = Validate(reinterpret_cast<const uint8_t*>(mask.data()),
                        reinterpret_cast<const int64_t*>(offsets.data()), st.shape, st.nnz);
    EXPECT_OK(v) << st.name;
    out[st.name] = sparse_testing::ReferenceDecode(
        values.data(), reinterpret_cast<const uint8_t*>(mask.data()), st.shape.rows, st.shape.cols,
        st.shape.elem_bytes);
  }
  return out;
}

std::map<std::string, std::vector<std::byte>> AsMap(const std::vector<Tensor>& tensors) {
  std::map<std::string, std::vector<std::byte>> out;
  for (const auto& t : tensors) out[t.name] = t.bytes;
  return out;
}

const SparsifyReport::Tensor* Find(const SparsifyReport& r, const std::string& name) {
  for (const auto& t : r.tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

// A BF16 weight, about half zeros, with the values whose bits matter:
// -0.0 (kept: only all-zero bits count as zero), NaN, infinity, a subnormal.
Tensor SpecialBf16(const std::string& name) {
  Tensor t = RandomSparse(name, Dtype::kBF16, 9, 21, 0.5, 7);
  const uint16_t specials[] = {kBf16NegZero, kBf16Nan, kBf16Inf, kBf16Sub, 0xFFFF};
  for (size_t i = 0; i < std::size(specials); ++i)
    std::memcpy(t.bytes.data() + 2 * (3 + 20 * i), &specials[i], 2);
  return t;
}

TEST(SparsifyTest, RoundTripIsBitExact) {
  ScratchDir dir;
  const std::vector<Tensor> in = {
      SpecialBf16("m.layers.0.q_proj.weight"),
      RandomSparse("m.layers.0.k_proj.weight", Dtype::kF16, 16, 64, 0.7, 1),
      RandomSparse("m.layers.0.v_proj.weight", Dtype::kF32, 5, 30, 0.5, 2),
      RandomSparse("m.layers.0.o_proj.weight", Dtype::kF64, 4, 40, 0.5, 3),
      RandomSparse("m.layers.0.up_proj.weight", Dtype::kF8_E4M3, 8, 1000, 0.5, 4),
      RandomSparse("m.layers.0.q_proj.bias", Dtype::kBF16, 1, 9, 0.5, 5),  // 2-D, but not a target.
      RandomSparse("m.norm.weight", Dtype::kF32, 1, 33, 0, 6),
      Make("m.step", Dtype::kI64, {}, std::vector<int64_t>{42}),
  };
  ASSERT_OK(sparse_testing::Write(dir / "in.safetensors", in, Metadata{{"format", "pt"}}));
  auto report = Sparsify(dir / "in.safetensors", dir / "out");
  ASSERT_OK(report);
  EXPECT_EQ(DecodeAll(dir / "out"), AsMap(in));
  // The loader's own decoding (LoadOptions::decode_sparse) agrees.
  EXPECT_EQ(sparse_testing::LoadAll(dir / "out", /*decode_sparse=*/true), AsMap(in));
  EXPECT_THAT(report->files, ElementsAre("model.safetensors"));
  EXPECT_EQ(report->encoded, 5u);
  EXPECT_EQ(report->kept_dense, 3u);
  EXPECT_EQ(Find(*report, "m.layers.0.q_proj.bias")->note, "not a target");
  EXPECT_EQ(Find(*report, "m.norm.weight")->note, "sparsity 0.0000 is below 0.3000");
  EXPECT_EQ(Find(*report, "m.step")->note, "not a target");

  auto out = Checkpoint::Open(dir / "out");
  ASSERT_OK(out);
  EXPECT_EQ(out->shards()[0].header.metadata(), (Metadata{{"format", "pt"}}));
  auto cat = FindSparse(*out);
  ASSERT_OK(cat);
  const SparseTensor* q = cat->Find("m.layers.0.q_proj.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->prefix, "m.layers.0.q_proj");  // The current generation's naming.
  // Bytes: the report's, the checkpoint's and the formula's agree.
  uint64_t stored = 0;
  for (const auto& t : report->tensors) stored += t.stored_bytes;
  EXPECT_EQ(report->bytes_out, stored);
  EXPECT_EQ(out->total_bytes(), stored);
  EXPECT_EQ(report->bytes_in,
            9u * 21 * 2 + 16 * 64 * 2 + 5 * 30 * 4 + 4 * 40 * 8 + 8000 + 9 * 2 + 33 * 4 + 8);
  for (const auto& st : cat->sparse) {
    EXPECT_EQ(st.stored_bytes, EncodedBytes(st.shape, st.nnz)) << st.name;
    EXPECT_EQ(Find(*report, st.name)->stored_bytes, st.stored_bytes);
    EXPECT_EQ(Find(*report, st.name)->nnz, st.nnz);
  }
}

TEST(SparsifyTest, FilesAreTheLibraryWritersBytes) {
  ScratchDir dir;
  const std::vector<Tensor> in = {SpecialBf16("b.weight"),
                                  RandomSparse("a.weight", Dtype::kF32, 7, 9, 0.6, 1),
                                  RandomSparse("c.weight", Dtype::kF32, 3, 9, 0.0, 2)};
  ASSERT_TRUE(
      sparse_testing::Write(dir / "in.safetensors", in, Metadata{{"format", "pt"}, {"k\"ey", "v"}})
          .ok());
  SparsifyOptions opts;
  opts.max_shard_bytes = 1;  // A shard per tensor.
  auto report = Sparsify(dir / "in.safetensors", dir / "out", opts);
  ASSERT_OK(report);
  ASSERT_EQ(report->files.size(), 4u);
  for (size_t i = 0; i < 3; ++i) {
    const std::string bytes = sparse_testing::ReadText(dir / "out/" + report->files[i]);
    auto h = Header::Parse(std::as_bytes(std::span<const char>(bytes.data(), bytes.size())));
    ASSERT_OK(h);
    std::vector<TensorView> views;
    for (const auto& t : h->tensors()) {
      views.push_back({t.name, t.dtype, t.shape,
                       std::as_bytes(std::span<const char>(
                           bytes.data() + h->data_offset() + t.begin, t.nbytes()))});
    }
    auto again = Serialize(views, h->metadata());
    ASSERT_OK(again);
    EXPECT_TRUE(std::equal(again->begin(), again->end(),
                           reinterpret_cast<const std::byte*>(bytes.data()),
                           reinterpret_cast<const std::byte*>(bytes.data() + bytes.size())) &&
                again->size() == bytes.size())
        << report->files[i];
  }
}

TEST(SparsifyTest, DensityAndSizeOfAHalfPrunedBf16Checkpoint) {
  // The arithmetic: 50% of 16-bit values plus one bit per element is
  // (0.5 * 16 + 1) / 16 = 9/16 of dense; row_offsets add 8 bytes per row
  // (0.39% at 1024 columns) and the shape 16 bytes per tensor.
  ScratchDir dir;
  std::vector<Tensor> in;
  for (int l = 0; l < 3; ++l) {
    in.push_back(
        RandomSparse("layers." + std::to_string(l) + ".w.weight", Dtype::kBF16, 256, 1024, 0, l));
  }
  ASSERT_OK(sparse_testing::Write(dir / "in.safetensors", in));
  SparsifyOptions opts;
  opts.prune = 0.5;
  auto report = Sparsify(dir / "in.safetensors", dir / "out", opts);
  ASSERT_OK(report);
  EXPECT_EQ(report->encoded, 3u);
  EXPECT_DOUBLE_EQ(report->global_sparsity, 0.5);
  const uint64_t dense = 3ull * 256 * 1024 * 2;
  const uint64_t values = 3ull * 256 * 512 * 2, mask = 3ull * 256 * 128, offsets = 3ull * 256 * 8,
                 shapes = 3 * 16;
  EXPECT_EQ(report->bytes_in, dense);
  EXPECT_EQ(report->bytes_out, values + mask + offsets + shapes);
  const double ratio = static_cast<double>(report->bytes_out) / dense;
  EXPECT_NEAR(ratio, (0.5 * 16 + 1) / 16, 0.005);
  // The file adds only its header.
  auto out = Checkpoint::Open(dir / "out");
  ASSERT_OK(out);
  struct stat st;
  ASSERT_EQ(::stat((dir / "out/model.safetensors").c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size),
            report->bytes_out + out->shards()[0].header.data_offset());
}

TEST(SparsifyTest, BelowMinSparsityStaysDense) {
  ScratchDir dir;
  const std::vector<Tensor> in = {RandomSparse("a.weight", Dtype::kBF16, 10, 100, 0.2, 1),
                                  RandomSparse("b.weight", Dtype::kBF16, 10, 100, 0.45, 2)};
  ASSERT_OK(sparse_testing::Write(dir / "in.safetensors", in));
  SparsifyOptions opts;
  opts.min_sparsity = 0.4;
  auto report = Sparsify(dir / "in.safetensors", dir / "out", opts);
  ASSERT_OK(report);
  EXPECT_FALSE(Find(*report, "a.weight")->encoded);
  EXPECT_THAT(Find(*report, "a.weight")->note, HasSubstr("is below 0.4000"));
  EXPECT_TRUE(Find(*report, "b.weight")->encoded);
  auto raw = sparse_testing::LoadAll(dir / "out");
  EXPECT_EQ(raw["a.weight"], in[0].bytes);
  EXPECT_EQ(raw.count("b.weight"), 0u);
  EXPECT_EQ(raw.count("b.compressed"), 1u);
  EXPECT_EQ(DecodeAll(dir / "out"), AsMap(in));
}

TEST(SparsifyTest, EncodingThatIsNotSmallerStaysDense) {
  // F8 at 90% density: 0.9 + 1/8 of dense, plus the offsets, is more.
  ScratchDir dir;
  const std::vector<Tensor> in = {RandomSparse("a.weight", Dtype::kF8_E5M2, 4, 64, 0.1, 1)};
  ASSERT_OK(sparse_testing::Write(dir / "in.safetensors", in));
  SparsifyOptions opts;
  opts.min_sparsity = 0;
  auto report = Sparsify(dir / "in.safetensors", dir / "out", opts);
  ASSERT_OK(report);
  EXPECT_EQ(Find(*report, "a.weight")->note, "the encoding is not smaller");
  EXPECT_EQ(sparse_testing::LoadAll(dir / "out"), AsMap(in));
}

TEST(SparsifyTest, TargetsRegexAndWhatCanBeATarget) {
  ScratchDir dir;
  const std::vector<Tensor> in = {
      RandomSparse("a.mlp.weight", Dtype::kF32, 4, 16, 0.5, 1),
      RandomSparse("a.attn.weight", Dtype::kF32, 4, 16, 0.5, 2),
      RandomSparse("a.mlp.bias", Dtype::kF32, 4, 16, 0.5, 3),     // Old-generation name.
      RandomSparse("a.mlp.scales", Dtype::kF32, 4, 16, 0.5, 4),   // No group name stands for it.
      RandomSparse("a.mlp.qweight", Dtype::kI32, 4, 16, 0.5, 5),  // Not floating point.
      Tensor{"a.mlp.conv", Dtype::kF32, {2, 2, 4}, std::vector<std::byte>(64)},
  };
  ASSERT_OK(sparse_testing::Write(dir / "in.safetensors", in));
  SparsifyOptions opts;
  opts.targets = "mlp";
  auto report = Sparsify(dir / "in.safetensors", dir / "out", opts);
  ASSERT_OK(report);
  EXPECT_TRUE(Find(*report, "a.mlp.weight")->encoded);
  EXPECT_TRUE(Find(*report, "a.mlp.bias")->encoded);
  EXPECT_EQ(Find(*report, "a.attn.weight")->note, "not a target");
  EXPECT_EQ(Find(*report, "a.mlp.scales")->note, "the name ends in neither .weight nor .bias");
  EXPECT_EQ(Find(*report, "a.mlp.qweight")->note, "I32 is not a floating-point dtype");
  EXPECT_EQ(Find(*report, "a.mlp.conv")->note, "not 2-D");
  auto raw = sparse_testing::LoadAll(dir / "out");
  EXPECT_EQ(raw.count("a.mlp.compressed"), 1u);
  EXPECT_EQ(raw.count("a.mlp.bias.compressed"), 1u);
  EXPECT_EQ(DecodeAll(dir / "out"), AsMap(in));
}

// --- Pruning ---------------------------------------------------------------------------

std::vector<float> AsFloats(const std::vector<std::byte>& b) {
  std::vector<float> f(b.size() / 4);
  std::memcpy(f.data(), b.data(), b.size());
  return f;
}

TEST(PruneTest, EachRowLosesItsSmallestMagnitudes) {
  const uint64_t rows = 37, cols = 101;
  Tensor t = RandomSparse("w", Dtype::kF32, rows, cols, 0.05, 11);
  for (uint64_t i = 0; i < rows * cols; ++i) {  // Finite values of both signs.
    uint32_t u;
    std::memcpy(&u, t.bytes.data() + 4 * i, 4);
    u = (u & 0x803FFFFFu) | (static_cast<uint32_t>(100 + i % 50) << 23);
    if (i % 97 == 3) u = 0;
    std::memcpy(t.bytes.data() + 4 * i, &u, 4);
  }
  std::vector<std::byte> pruned = t.bytes;
  ASSERT_OK(PruneByMagnitude(pruned.data(), Dtype::kF32, rows, cols, 0.5));
  const auto before = AsFloats(t.bytes), after = AsFloats(pruned);
  const uint64_t k = static_cast<uint64_t>(std::floor(cols * 0.5));
  for (uint64_t r = 0; r < rows; ++r) {
    // The few zeros already there are among the k smallest: exactly k zeros.
    uint64_t zeros = 0;
    float max_pruned = 0, min_kept = std::numeric_limits<float>::infinity();
    for (uint64_t c = 0; c < cols; ++c) {
      const uint64_t i = r * cols + c;
      uint32_t bits;
      std::memcpy(&bits, &after[i], 4);
      if (bits == 0) {
        ++zeros;
        max_pruned = std::max(max_pruned, std::fabs(before[i]));
      } else {
        EXPECT_EQ(std::memcmp(&before[i], &after[i], 4), 0) << "row " << r << " col " << c;
        min_kept = std::min(min_kept, std::fabs(before[i]));
      }
    }
    EXPECT_EQ(zeros, k) << "row " << r;
    EXPECT_LE(max_pruned, min_kept) << "row " << r;
  }
}

TEST(PruneTest, TiesGoToTheLowerColumnAndNanRanksAboveInfinity) {
  // One BF16 row: 2.0 x 4, NaN, -inf, -0.0, 1.0.
  std::vector<uint16_t> row = {0x4000, 0x4000, 0x7FC1, 0x4000, 0xFF80, 0x8000, 0x3F80, 0x4000};
  auto bytes = Make("", Dtype::kBF16, {1, 8}, row).bytes;
  ASSERT_OK(PruneByMagnitude(bytes.data(), Dtype::kBF16, 1, 8, 0.5));
  std::memcpy(row.data(), bytes.data(), 16);
  // -0.0 and 1.0 first, then the two lowest columns holding 2.0.
  EXPECT_THAT(row, ElementsAre(0, 0, 0x7FC1, 0x4000, 0xFF80, 0, 0, 0x4000));
  ASSERT_OK(PruneByMagnitude(bytes.data(), Dtype::kBF16, 1, 8, 7.0 / 8));
  std::memcpy(row.data(), bytes.data(), 16);
  EXPECT_THAT(row, ElementsAre(0, 0, 0x7FC1, 0, 0, 0, 0, 0));
}

TEST(PruneTest, FractionsAtTheEnds) {
  Tensor t = RandomSparse("w", Dtype::kF16, 3, 10, 0, 1);
  auto bytes = t.bytes;
  ASSERT_OK(PruneByMagnitude(bytes.data(), Dtype::kF16, 3, 10, 0.0));
  EXPECT_EQ(bytes, t.bytes);
  ASSERT_OK(PruneByMagnitude(bytes.data(), Dtype::kF16, 3, 10, 0.09));  // floor(0.9) = 0.
  EXPECT_EQ(bytes, t.bytes);
  ASSERT_OK(PruneByMagnitude(bytes.data(), Dtype::kF16, 3, 10, 1.0));
  EXPECT_EQ(bytes, std::vector<std::byte>(60));
}

TEST(PruneTest, EveryFloatingDtypeAndNothingElse) {
  for (Dtype d :
       {Dtype::kF16, Dtype::kBF16, Dtype::kF32, Dtype::kF64, Dtype::kF8_E4M3, Dtype::kF8_E5M2}) {
    Tensor t = RandomSparse("w", d, 4, 30, 0, 2);
    ASSERT_OK(PruneByMagnitude(t.bytes.data(), d, 4, 30, 0.3)) << DtypeName(d);
    const uint32_t w = DtypeBits(d) / 8;
    for (uint64_t r = 0; r < 4; ++r) {
      int zeros = 0;
      for (uint64_t c = 0; c < 30; ++c) {
        bool zero = true;
        for (uint32_t b = 0; b < w; ++b)
          zero = zero && t.bytes[(r * 30 + c) * w + b] == std::byte{0};
        zeros += zero;
      }
      EXPECT_GE(zeros, 9) << DtypeName(d) << " row " << r;
    }
  }
  std::vector<std::byte> b(8);
  Status s = PruneByMagnitude(b.data(), Dtype::kI32, 1, 2, 0.5);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("not I32"));
  EXPECT_EQ(PruneByMagnitude(b.data(), Dtype::kF32, 1, 2, 1.5).code(),
            StatusCode::kInvalidArgument);
}

TEST(SparsifyTest, PruneThenEncode) {
  ScratchDir dir;
  const std::vector<Tensor> in = {SpecialBf16("a.weight"),
                                  RandomSparse("b.weight", Dtype::kF32, 6, 50, 0, 1),
                                  RandomSparse("c.bias", Dtype::kF32, 1, 50, 0, 2)};
  ASSERT_OK(sparse_testing::Write(dir / "in.safetensors", in));
  SparsifyOptions opts;
  opts.prune = 0.6;
  auto report = Sparsify(dir / "in.safetensors", dir / "out", opts);
  ASSERT_OK(report);
  // What comes back is exactly the input pruned by PruneByMagnitude.
  auto expected = AsMap(in);
  ASSERT_OK(PruneByMagnitude(expected["a.weight"].data(), Dtype::kBF16, 9, 21, 0.6));
  ASSERT_OK(PruneByMagnitude(expected["b.weight"].data(), Dtype::kF32, 6, 50, 0.6));
  EXPECT_EQ(DecodeAll(dir / "out"), expected);
  EXPECT_FALSE(Find(*report, "c.bias")->target);
  EXPECT_EQ(Find(*report, "b.weight")->nnz, 6u * 20);
}

// --- Shards, index, companions ---------------------------------------------------------------

TEST(SparsifyTest, ShardsAndIndex) {
  ScratchDir dir;
  std::vector<Tensor> in;
  for (int i = 0; i < 6; ++i) {
    in.push_back(
        RandomSparse("layers." + std::to_string(i) + ".weight", Dtype::kBF16, 16, 256, 0.5, i));
    in.push_back(
        RandomSparse("layers." + std::to_string(i) + ".bias", Dtype::kBF16, 1, 16, 0, 10 + i));
  }
  ASSERT_OK(sparse_testing::Write(dir / "a.safetensors", {in.begin(), in.begin() + 5}));
  ASSERT_OK(sparse_testing::Write(dir / "b.safetensors", {in.begin() + 5, in.end()}));
  SparsifyOptions opts;
  opts.max_shard_bytes = 10000;  // An encoded weight is ~5 KB.
  auto report = Sparsify(dir.path(), dir / "out", opts);
  ASSERT_OK(report);
  ASSERT_GT(report->files.size(), 2u);
  const size_t n = report->files.size() - 1;
  for (size_t i = 0; i < n; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, n);
    EXPECT_EQ(report->files[i], name);
  }
  EXPECT_EQ(report->files.back(), "model.safetensors.index.json");

  auto out = Checkpoint::Open(dir / "out");
  ASSERT_OK(out);
  EXPECT_EQ(out->kind(), Checkpoint::Kind::kIndex);
  EXPECT_THAT(out->warnings(), IsEmpty());
  EXPECT_EQ(out->index_metadata().at("total_size"), std::to_string(report->bytes_out));
  EXPECT_EQ(out->shards().size(), n);
  uint64_t names = 0;
  for (const auto& sh : out->shards()) {
    uint64_t bytes = 0;
    for (const auto& t : sh.header.tensors()) bytes += t.nbytes();
    EXPECT_LE(bytes, opts.max_shard_bytes) << sh.path;
    names += sh.header.tensors().size();
  }
  EXPECT_EQ(out->tensors().size(), names);  // The weight_map names every stored tensor.
  auto cat = FindSparse(*out);
  ASSERT_OK(cat);
  EXPECT_EQ(cat->sparse.size(), 6u);
  for (const auto& st : cat->sparse) {  // A group stays in one shard.
    EXPECT_EQ(st.values.shard, st.shape_tensor.shard);
    EXPECT_EQ(st.bitmask.shard, st.shape_tensor.shard);
    EXPECT_EQ(st.row_offsets.shard, st.shape_tensor.shard);
  }
  EXPECT_EQ(DecodeAll(dir / "out"), AsMap(in));
}

TEST(SparsifyTest, ATensorOverTheShardLimitGetsItsOwnShard) {
  ScratchDir dir;
  const std::vector<Tensor> in = {RandomSparse("a.weight", Dtype::kF32, 8, 8, 0, 1),
                                  RandomSparse("b.weight", Dtype::kF32, 64, 64, 0, 2),
                                  RandomSparse("c.weight", Dtype::kF32, 8, 8, 0, 3)};
  ASSERT_OK(sparse_testing::Write(dir / "in.safetensors", in));
  SparsifyOptions opts;
  opts.max_shard_bytes = 1000;
  auto report = Sparsify(dir / "in.safetensors", dir / "out", opts);
  ASSERT_OK(report);
  EXPECT_THAT(report->files,
              ElementsAre("model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                          "model-00003-of-00003.safetensors", "model.safetensors.index.json"));
  EXPECT_EQ(sparse_testing::LoadAll(dir / "out"), AsMap(in));
}

simdjson::dom::element ParseJson(simdjson::dom::parser& parser, const std::string& text) {
  simdjson::dom::element e;
  EXPECT_EQ(parser.parse(text).get(e), simdjson::SUCCESS) << text;
  return e;
}

TEST(SparsifyTest, ConfigGetsTheSparsityConfigAndCompanionsAreCopied) {
  ScratchDir dir;
  ASSERT_TRUE(sparse_testing::Write(dir / "model.safetensors",
                                    {RandomSparse("m.a.weight", Dtype::kBF16, 8, 64, 0.5, 1),
                                     RandomSparse("m.b.weight", Dtype::kBF16, 8, 64, 0.75, 2),
                                     RandomSparse("m.c.weight", Dtype::kBF16, 8, 64, 0.1, 3)})
                  .ok());
  sparse_testing::WriteText(
      dir / "config.json",
      "{\"architectures\": [\"LlamaForCausalLM\"], \"rope_theta\": 10000.0,"
      " \"rms_norm_eps\": 1e-05, \"name\": \"caf\\u00e9 \\\"x\\\"\\n\","
      " \"quantization_config\": {\"quant_method\": \"compressed-tensors\","
      " \"format\": \"dense\", \"sparsity_config\": {\"format\": \"dense\"}},"
      " \"n\": null, \"big\": 12345678901234567890, \"t\": true, \"e\": {}, \"l\": []}");
  sparse_testing::WriteText(dir / "tokenizer.json", "{\"t\": 1}");
  sparse_testing::WriteText(dir / "generation_config.json", "{}");
  sparse_testing::WriteText(dir / "huge.bin", std::string(2000, 'x'));
  sparse_testing::WriteText(dir / ".hidden", "x");
  std::filesystem::create_directory(dir / "sub");
  SparsifyOptions opts;
  opts.max_copy_bytes = 1000;
  auto report = Sparsify(dir.path(), dir / "out", opts);
  ASSERT_OK(report);
  EXPECT_THAT(report->copied,
              ElementsAre("config.json", "generation_config.json", "tokenizer.json"));
  ASSERT_EQ(report->skipped.size(), 1u);
  EXPECT_EQ(report->skipped[0].first, "huge.bin");
  EXPECT_EQ(report->skipped[0].second, "2000 bytes, over the limit of 1000");
  EXPECT_EQ(sparse_testing::ReadText(dir / "out/tokenizer.json"), "{\"t\": 1}");
  EXPECT_FALSE(std::filesystem::exists(dir / "out/.hidden"));
  EXPECT_FALSE(std::filesystem::exists(dir / "out/sub"));
  EXPECT_FALSE(std::filesystem::exists(dir / "out/huge.bin"));

  const std::string config = sparse_testing::ReadText(dir / "out/config.json");
  EXPECT_THAT(config, HasSubstr("\n  \"rope_theta\": 10000.0,\n  \"rms_norm_eps\": 1e-05,\n"));
  simdjson::dom::parser parser;
  simdjson::dom::element c = ParseJson(parser, config);
  EXPECT_EQ(std::string_view(c["name"].get_string().value()), "caf\u00e9 \"x\"\n");
  EXPECT_EQ(uint64_t(c["big"].get_uint64().value()), 12345678901234567890ull);
  EXPECT_TRUE(c["n"].is_null());
  auto q = c["quantization_config"];
  EXPECT_EQ(std::string_view(q["quant_method"].get_string().value()), "compressed-tensors");
  EXPECT_EQ(std::string_view(q["format"].get_string().value()), "dense");
  auto sc = q["sparsity_config"];
  EXPECT_EQ(std::string_view(sc["format"].get_string().value()), "sparse-bitmask");
  EXPECT_EQ(std::string_view(sc["sparsity_structure"].get_string().value()), "unstructured");
  EXPECT_DOUBLE_EQ(sc["global_sparsity"].get_double().value(), report->global_sparsity);
  std::vector<std::string> targets;
  simdjson::dom::array target_list = sc["targets"].get_array().value();
  for (auto t : target_list) targets.emplace_back(t.get_string().value());
  EXPECT_THAT(targets, ElementsAre("m.a", "m.b"));
  EXPECT_EQ(sc["ignore"].get_array().value().size(), 0u);
  // Zeros over the encoded tensors' elements.
  uint64_t zeros = 0;
  for (const auto& t : report->tensors) zeros += t.encoded ? 8 * 64 - t.nnz : 0;
  EXPECT_DOUBLE_EQ(report->global_sparsity, zeros / (2.0 * 8 * 64));
}

TEST(SparsifyTest, ANewQuantizationConfig) {
  ScratchDir dir;
  ASSERT_TRUE(sparse_testing::Write(dir / "model.safetensors",
                                    {RandomSparse("a.weight", Dtype::kF16, 4, 64, 1, 1)})
                  .ok());
  sparse_testing::WriteText(dir / "config.json", "{\"model_type\": \"llama\"}");
  auto report = Sparsify(dir.path(), dir / "out");
  ASSERT_OK(report);
  EXPECT_EQ(report->global_sparsity, 1.0);
  simdjson::dom::parser parser;
  const std::string text = sparse_testing::ReadText(dir / "out/config.json");
  simdjson::dom::element c = ParseJson(parser, text);
  EXPECT_EQ(std::string_view(c["model_type"].get_string().value()), "llama");
  EXPECT_EQ(std::string_view(c["quantization_config"]["quant_method"].get_string().value()),
            "compressed-tensors");
  // 1.0, a float as compressed-tensors writes it.
  EXPECT_THAT(text, HasSubstr("\"global_sparsity\": 1.0,"));
}

TEST(SparsifyTest, NothingEncodedLeavesConfigAlone) {
  ScratchDir dir;
  ASSERT_TRUE(sparse_testing::Write(dir / "model.safetensors",
                                    {RandomSparse("a.weight", Dtype::kF16, 4, 64, 0, 1)})
                  .ok());
  sparse_testing::WriteText(dir / "config.json", "{\"model_type\":  \"llama\"}");
  auto report = Sparsify(dir.path(), dir / "out");
  ASSERT_OK(report);
  EXPECT_EQ(report->encoded, 0u);
  EXPECT_EQ(sparse_testing::ReadText(dir / "out/config.json"), "{\"model_type\":  \"llama\"}");
}

TEST(SparsifyTest, AFileInputCopiesNoCompanions) {
  ScratchDir dir;
  ASSERT_TRUE(sparse_testing::Write(dir / "model.safetensors",
                                    {RandomSparse("a.weight", Dtype::kF16, 4, 64, 0.5, 1)})
                  .ok());
  sparse_testing::WriteText(dir / "config.json", "{}");
  auto report = Sparsify(dir / "model.safetensors", dir / "out");
  ASSERT_OK(report);
  EXPECT_THAT(report->files, ElementsAre("model.safetensors"));
}

// --- Errors ------------------------------------------------------------------------------------

TEST(SparsifyErrorTest, OutputMustBeNewOrEmpty) {
  ScratchDir dir;
  ASSERT_TRUE(sparse_testing::Write(dir / "in.safetensors",
                                    {RandomSparse("a.weight", Dtype::kF16, 4, 64, 0.5, 1)})
                  .ok());
  std::filesystem::create_directory(dir / "out");
  sparse_testing::WriteText(dir / "out/x", "x");
  auto report = Sparsify(dir / "in.safetensors", dir / "out");
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(report.status().message(),
              HasSubstr("out: the output directory must be new or empty"));
  report = Sparsify(dir / "in.safetensors", dir / "in.safetensors");
  EXPECT_THAT(report.status().message(), HasSubstr("exists and is not a directory"));
  report = Sparsify(dir / "in.safetensors", dir / "no/such/dir");
  EXPECT_EQ(report.status().code(), StatusCode::kNotFound);
  // An empty directory is fine.
  std::filesystem::create_directory(dir / "empty");
  EXPECT_OK(Sparsify(dir / "in.safetensors", dir / "empty"));
}

TEST(SparsifyErrorTest, BadOptions) {
  ScratchDir dir;
  ASSERT_TRUE(sparse_testing::Write(dir / "in.safetensors",
                                    {RandomSparse("a.weight", Dtype::kF16, 4, 64, 0.5, 1)})
                  .ok());
  SparsifyOptions o;
  o.targets = "(";
  EXPECT_THAT(Sparsify(dir / "in.safetensors", dir / "out", o).status().message(),
              HasSubstr("the targets regex '(' is invalid"));
  o = {};
  o.prune = -0.1;
  EXPECT_EQ(Sparsify(dir / "in.safetensors", dir / "out", o).status().code(),
            StatusCode::kInvalidArgument);
  o = {};
  o.min_sparsity = std::nan("");
  EXPECT_EQ(Sparsify(dir / "in.safetensors", dir / "out", o).status().code(),
            StatusCode::kInvalidArgument);
  o = {};
  o.max_shard_bytes = 0;
  EXPECT_EQ(Sparsify(dir / "in.safetensors", dir / "out", o).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(dir / "out"));
}

TEST(SparsifyErrorTest, AlreadySparse) {
  ScratchDir dir;
  ASSERT_TRUE(sparse_testing::Write(
                  dir / "in.safetensors",
                  sparse_testing::Group("a", RandomSparse("", Dtype::kF16, 4, 64, 0.5, 1)))
                  .ok());
  auto report = Sparsify(dir / "in.safetensors", dir / "out");
  ASSERT_FALSE(report.ok());
  EXPECT_THAT(
      report.status().message(),
      HasSubstr(
          "already holds 1 sparse-bitmask group(s), e.g. 'a'; sparsify reads dense checkpoints"));
}

TEST(SparsifyErrorTest, APartNameTakenByAnInputTensorRemovesTheOutput) {
  ScratchDir dir;
  ASSERT_TRUE(
      sparse_testing::Write(dir / "in.safetensors",
                            {RandomSparse("a.weight", Dtype::kF16, 4, 64, 0.5, 1),
                             Make("a.row_offsets", Dtype::kU8, {1}, std::vector<uint8_t>{1})})
          .ok());
  auto report = Sparsify(dir / "in.safetensors", dir / "out");
  ASSERT_FALSE(report.ok());
  EXPECT_THAT(
      report.status().message(),
      HasSubstr("cannot encode 'a.weight' as the group 'a': the name 'a.row_offsets' is taken"));
  EXPECT_FALSE(std::filesystem::exists(dir / "out"));
}

TEST(SparsifyErrorTest, AFailedWriteLeavesNothing) {
  ScratchDir dir;
  ASSERT_TRUE(sparse_testing::Write(dir / "model.safetensors",
                                    {RandomSparse("a.weight", Dtype::kF16, 4, 64, 0.5, 1)})
                  .ok());
  sparse_testing::WriteText(dir / "config.json", "{not json");
  auto report = Sparsify(dir.path(), dir / "out");
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(report.status().message(), HasSubstr("config.json: invalid JSON"));
  EXPECT_FALSE(std::filesystem::exists(dir / "out"));
  // In an existing empty directory, the directory stays, empty.
  std::filesystem::create_directory(dir / "out");
  EXPECT_FALSE(Sparsify(dir.path(), dir / "out").ok());
  EXPECT_TRUE(std::filesystem::is_empty(dir / "out"));
}

}  // namespace
}  // namespace tensorlift::sparse
