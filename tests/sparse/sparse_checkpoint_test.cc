// FindSparse: both naming generations, groups across shards, and one case
// per way an untrusted group can be wrong.
#include <cstdint>
#include <string>
#include <vector>

#include "../common/assert_ok.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sparse_files.h"
#include "tensorlift/sparse.h"

namespace tensorlift::sparse {
namespace {

using sparse_testing::Group;
using sparse_testing::Make;
using sparse_testing::RandomSparse;
using sparse_testing::ScratchDir;
using sparse_testing::Tensor;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::vector<std::string> DenseNames(const Checkpoint& c, const SparseCatalog& cat) {
  std::vector<std::string> out;
  for (auto loc : cat.dense) out.push_back(c.info(loc).name);
  return out;
}

std::vector<Tensor> Concat(std::vector<Tensor> a, const std::vector<Tensor>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Writes `tensors` as one file and runs FindSparse on it.
Result<SparseCatalog> FindIn(const ScratchDir& dir, const std::vector<Tensor>& tensors,
                             std::string* path = nullptr) {
  const std::string p = dir / "model.safetensors";
  if (path) *path = p;
  Status s = sparse_testing::Write(p, tensors);
  if (!s.ok()) return s;
  TL_ASSIGN_OR_RETURN(Checkpoint c, Checkpoint::Open(p));
  return FindSparse(c);
}

// The parts of a small BF16 group of prefix `prefix`, with one part replaced.
std::vector<Tensor> GroupWith(const std::string& prefix, const std::string& suffix, Tensor part) {
  auto parts = Group(prefix, RandomSparse("", Dtype::kBF16, 5, 11, 0.5, 3));
  for (auto& t : parts) {
    if (t.name == prefix + suffix) {
      part.name = t.name;
      t = part;
    }
  }
  return parts;
}

Status FindError(const std::vector<Tensor>& tensors) {
  ScratchDir dir;
  auto cat = FindIn(dir, tensors);
  EXPECT_FALSE(cat.ok());
  return cat.ok() ? Status::Ok() : cat.status();
}

TEST(SparseNamesTest, DenseNameOfBothGenerations) {
  EXPECT_EQ(DenseName("model.layers.0.mlp.down_proj"), "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(DenseName("model.layers.0.mlp.down_proj.weight"),
            "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(DenseName("model.layers.0.mlp.down_proj.bias"), "model.layers.0.mlp.down_proj.bias");
}

TEST(SparseNamesTest, PrefixForReadsBackAsTheName) {
  EXPECT_EQ(PrefixFor("a.b.weight"), "a.b");
  EXPECT_EQ(PrefixFor("a.bias"), "a.bias");
  EXPECT_EQ(PrefixFor("a.weight.weight"), "a.weight.weight");
  EXPECT_EQ(PrefixFor("a.bias.weight"), "a.bias.weight");
  EXPECT_EQ(PrefixFor(".weight"), ".weight");
  EXPECT_EQ(PrefixFor("embeddings"), std::nullopt);
  for (std::string name : {"a.b.weight", "a.bias", "a.weight.weight", "a.bias.weight", ".weight"}) {
    EXPECT_EQ(DenseName(*PrefixFor(name)), name);
  }
}

TEST(SparseNamesTest, EncodedBytesIsValuesMaskOffsetsAndShape) {
  const BitmaskShape s{4096, 4096, 2};
  const uint64_t nnz = 4096ull * 4096 / 2;
  EXPECT_EQ(EncodedBytes(s, nnz), 16 + nnz * 2 + 4096 * 512 + 4096 * 8);
  // compressed-tensors' 4096 x 4096 fp16 at 50%: 18.02 MiB against 32 MiB.
  EXPECT_NEAR(EncodedBytes(s, nnz) / double(1 << 20), 18.03, 0.01);
  EXPECT_EQ(EncodedBytes(BitmaskShape{3, 9, 4}, 5), 16 + 20 + 3 * 2 + 24);
  EXPECT_EQ(EncodedBytes(BitmaskShape{0, 9, 4}, 0), 16u);
}

TEST(FindSparseTest, CurrentGeneration) {
  ScratchDir dir;
  const Tensor w = RandomSparse("", Dtype::kBF16, 7, 13, 0.6, 1);
  auto tensors =
      Concat(Group("model.layers.0.mlp.down_proj", w),
             {RandomSparse("model.layers.0.mlp.down_proj.bias", Dtype::kBF16, 1, 7, 0, 2),
              RandomSparse("model.norm.weight", Dtype::kF32, 1, 13, 0, 3)});
  std::string path;
  auto cat = FindIn(dir, tensors, &path);
  ASSERT_OK(cat);
  ASSERT_EQ(cat->sparse.size(), 1u);
  const SparseTensor& st = cat->sparse[0];
  EXPECT_EQ(st.name, "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(st.prefix, "model.layers.0.mlp.down_proj");
  EXPECT_EQ(st.dtype, Dtype::kBF16);
  EXPECT_EQ(st.shape.rows, 7u);
  EXPECT_EQ(st.shape.cols, 13u);
  EXPECT_EQ(st.shape.elem_bytes, 2u);
  EXPECT_EQ(st.nnz, tensors[1].shape[0]);
  EXPECT_EQ(st.stored_bytes, EncodedBytes(st.shape, st.nnz));
  EXPECT_EQ(st.dense_bytes(), 7u * 13 * 2);
  EXPECT_DOUBLE_EQ(st.density(), st.nnz / 91.0);
  auto c = Checkpoint::Open(path);
  ASSERT_OK(c);
  EXPECT_EQ(c->info(st.values).name, "model.layers.0.mlp.down_proj.compressed");
  EXPECT_EQ(c->info(st.bitmask).name, "model.layers.0.mlp.down_proj.bitmask");
  EXPECT_EQ(c->info(st.row_offsets).name, "model.layers.0.mlp.down_proj.row_offsets");
  EXPECT_EQ(c->info(st.shape_tensor).name, "model.layers.0.mlp.down_proj.shape");
  EXPECT_THAT(DenseNames(*c, *cat),
              ElementsAre("model.layers.0.mlp.down_proj.bias", "model.norm.weight"));
  EXPECT_EQ(cat->Find("model.layers.0.mlp.down_proj.weight"), &cat->sparse[0]);
  EXPECT_EQ(cat->Find("model.norm.weight"), nullptr);
}

TEST(FindSparseTest, OldGenerationCompressedEveryTensor) {
  // <= 0.8.1: full parameter names, and 1-D biases and norms compressed too.
  ScratchDir dir;
  Tensor bias = RandomSparse("", Dtype::kF16, 1, 20, 0.5, 2);
  bias.shape = {20};
  auto tensors = Concat(Group("a.weight", RandomSparse("", Dtype::kF16, 4, 20, 0.5, 1)),
                        sparse_testing::Group1D("a.bias", bias));
  auto cat = FindIn(dir, tensors);
  ASSERT_OK(cat);
  ASSERT_EQ(cat->sparse.size(), 2u);
  const SparseTensor& b = cat->sparse[0];
  EXPECT_EQ(b.name, "a.bias");
  EXPECT_EQ(b.prefix, "a.bias");
  EXPECT_THAT(b.dense_shape, ElementsAre(20));
  EXPECT_EQ(b.shape.rows, 1u);
  EXPECT_EQ(b.shape.cols, 20u);
  EXPECT_EQ(b.stored_bytes, 8 + b.nnz * 2 + 3 + 8);
  EXPECT_EQ(cat->sparse[1].name, "a.weight");
  EXPECT_EQ(cat->sparse[1].prefix, "a.weight");
  EXPECT_THAT(cat->sparse[1].dense_shape, ElementsAre(4, 20));
  EXPECT_TRUE(cat->dense.empty());
}

TEST(FindSparseTest, EveryElementWidth) {
  ScratchDir dir;
  std::vector<Tensor> tensors;
  for (Dtype d : {Dtype::kF8_E4M3, Dtype::kF16, Dtype::kF32, Dtype::kF64, Dtype::kI64}) {
    const std::string prefix = "l" + std::string(DtypeName(d));
    tensors = Concat(tensors, Group(prefix, RandomSparse("", d, 3, 17, 0.5, 9)));
  }
  auto cat = FindIn(dir, tensors);
  ASSERT_OK(cat);
  ASSERT_EQ(cat->sparse.size(), 5u);
  for (const auto& st : cat->sparse)
    EXPECT_EQ(st.shape.elem_bytes * 8, uint32_t(DtypeBits(st.dtype)));
}

TEST(FindSparseTest, EmptyDenseTensor) {
  ScratchDir dir;
  auto cat = FindIn(dir, Group("e", Tensor{"", Dtype::kF32, {0, 9}, {}}));
  ASSERT_OK(cat);
  ASSERT_EQ(cat->sparse.size(), 1u);
  EXPECT_EQ(cat->sparse[0].nnz, 0u);
  EXPECT_EQ(cat->sparse[0].density(), 0.0);
}

TEST(FindSparseTest, ALoneSuffixIsAPlainTensor) {
  ScratchDir dir;
  auto cat = FindIn(dir, {Make("rope.shape", Dtype::kI64, {2}, std::vector<int64_t>{-5, 3}),
                          Make("x.compressed", Dtype::kF4, {4}, std::vector<uint8_t>{1, 2}),
                          Make(".bitmask", Dtype::kU8, {1}, std::vector<uint8_t>{1}),
                          Make(".shape", Dtype::kU8, {1}, std::vector<uint8_t>{1})});
  ASSERT_OK(cat);
  EXPECT_TRUE(cat->empty());
  EXPECT_EQ(cat->dense.size(), 4u);
}

TEST(FindSparseTest, GroupAcrossShards) {
  ScratchDir dir;
  auto parts = Group("m.q_proj", RandomSparse("", Dtype::kBF16, 6, 30, 0.5, 4));
  ASSERT_TRUE(
      sparse_testing::Write(dir / "model-00001-of-00002.safetensors", {parts[0], parts[1]}).ok());
  ASSERT_TRUE(sparse_testing::Write(
                  dir / "model-00002-of-00002.safetensors",
                  {parts[2], parts[3], RandomSparse("m.norm.weight", Dtype::kF32, 1, 6, 0, 1)})
                  .ok());
  sparse_testing::WriteText(
      dir / "model.safetensors.index.json",
      "{\"weight_map\":{\"m.q_proj.shape\":\"model-00001-of-00002.safetensors\","
      "\"m.q_proj.compressed\":\"model-00001-of-00002.safetensors\","
      "\"m.q_proj.bitmask\":\"model-00002-of-00002.safetensors\","
      "\"m.q_proj.row_offsets\":\"model-00002-of-00002.safetensors\","
      "\"m.norm.weight\":\"model-00002-of-00002.safetensors\"}}");
  auto c = Checkpoint::Open(dir.path());
  ASSERT_OK(c);
  auto cat = FindSparse(*c);
  ASSERT_OK(cat);
  ASSERT_EQ(cat->sparse.size(), 1u);
  EXPECT_EQ(cat->sparse[0].name, "m.q_proj.weight");
  EXPECT_NE(cat->sparse[0].shape_tensor.shard, cat->sparse[0].bitmask.shard);
  EXPECT_EQ(cat->sparse[0].shape.rows, 6u);
  EXPECT_THAT(DenseNames(*c, *cat), ElementsAre("m.norm.weight"));
}

// --- Broken groups ---------------------------------------------------------------------

TEST(FindSparseErrorTest, PartialGroupNamesTheMissingParts) {
  auto parts = Group("a", RandomSparse("", Dtype::kBF16, 2, 8, 0.5, 1));
  ScratchDir dir;
  std::string path;
  auto cat = FindIn(dir, {parts[1], parts[2]}, &path);
  ASSERT_FALSE(cat.ok());
  EXPECT_EQ(cat.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(cat.status().message(),
              AllOf(StartsWith(path + ": sparse group 'a' has 'a.compressed', 'a.bitmask'"),
                    HasSubstr("lacks 'a.shape', 'a.row_offsets'")));
}

TEST(FindSparseErrorTest, Sparse24IsRefusedClearly) {
  // sparse-24-bitmask: shape [2, 1], compressed 2-D, no row_offsets.
  auto parts = Group("a", RandomSparse("", Dtype::kBF16, 2, 8, 0.5, 1));
  parts[0].shape = {2, 1};
  Status s = FindError({parts[0], parts[1], parts[2]});
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("lacks 'a.row_offsets'"), HasSubstr("sparse-24-bitmask")));
  // With row_offsets but the [2, 1] shape.
  s = FindError(
      GroupWith("a", ".shape", Make("", Dtype::kI64, {2, 1}, std::vector<int64_t>{5, 11})));
  EXPECT_THAT(s.message(), AllOf(HasSubstr("'a.shape' is I64 [2, 1], expected I64 [2]"),
                                 HasSubstr("sparse-24-bitmask")));
}

TEST(FindSparseErrorTest, OneDimensionalGroupsFitTogether) {
  Tensor bias = RandomSparse("", Dtype::kF16, 1, 20, 0.5, 2);
  bias.shape = {20};
  auto parts = sparse_testing::Group1D("a.bias", bias);
  auto bad = parts;
  bad[3].shape = {1};
  EXPECT_THAT(
      FindError(bad).message(),
      HasSubstr("'a.bias.row_offsets' is I64 [1], expected I64 [] (a scalar for a 1-D tensor)"));
  bad = parts;
  bad[2].shape = {1, 3};
  EXPECT_THAT(FindError(bad).message(),
              HasSubstr("'a.bias.bitmask' is U8 [1, 3], expected U8 [3] for a dense [20]"));
}

TEST(FindSparseErrorTest, ThreeDimensionsAreNotRead) {
  Status s = FindError(
      GroupWith("a", ".shape", Make("", Dtype::kI64, {3}, std::vector<int64_t>{5, 11, 1})));
  EXPECT_THAT(s.message(),
              HasSubstr("'a.shape' is I64 [3], expected I64 [2] (or [1] for a 1-D tensor) "
                        "(only 1-D and 2-D tensors are read)"));
}

TEST(FindSparseErrorTest, ShapeTensorDtype) {
  Status s =
      FindError(GroupWith("a", ".shape", Make("", Dtype::kI32, {2}, std::vector<int32_t>{5, 11})));
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("model.safetensors: sparse group 'a' (dense 'a.weight')"),
                    HasSubstr("'a.shape' is I32 [2], expected I64 [2]")));
}

TEST(FindSparseErrorTest, NegativeDimension) {
  Status s =
      FindError(GroupWith("a", ".shape", Make("", Dtype::kI64, {2}, std::vector<int64_t>{-5, 11})));
  EXPECT_THAT(s.message(), HasSubstr("'a.shape' holds [-5, 11], a negative dimension"));
  s = FindError(GroupWith("a", ".shape", Make("", Dtype::kI64, {1}, std::vector<int64_t>{-5})));
  EXPECT_THAT(s.message(), HasSubstr("'a.shape' holds [-5], a negative dimension"));
}

TEST(FindSparseErrorTest, ShapeOverflows) {
  Status s = FindError(GroupWith(
      "a", ".shape", Make("", Dtype::kI64, {2}, std::vector<int64_t>{1ll << 40, 1ll << 40})));
  EXPECT_THAT(s.message(), HasSubstr("overflows 64 bits"));
}

TEST(FindSparseErrorTest, SubByteValues) {
  Status s = FindError(
      GroupWith("a", ".compressed", Make("", Dtype::kF4, {4}, std::vector<uint8_t>{1, 2})));
  EXPECT_THAT(s.message(),
              HasSubstr("'a.compressed' is F4, whose 4-bit elements the bitmask cannot address"));
  s = FindError(
      GroupWith("a", ".compressed", Make("", Dtype::kF6_E2M3, {4}, std::vector<uint8_t>{1, 2, 3})));
  EXPECT_THAT(s.message(), HasSubstr("6-bit elements"));
}

TEST(FindSparseErrorTest, ValuesNot1D) {
  Status s = FindError(GroupWith(
      "a", ".compressed", Make("", Dtype::kBF16, {2, 2}, std::vector<uint16_t>{1, 2, 3, 4})));
  EXPECT_THAT(s.message(), HasSubstr("'a.compressed' is BF16 [2, 2], expected a 1-D tensor"));
}

TEST(FindSparseErrorTest, MoreValuesThanElements) {
  Status s = FindError(
      GroupWith("a", ".compressed", Make("", Dtype::kBF16, {56}, std::vector<uint16_t>(56, 1))));
  EXPECT_THAT(s.message(), HasSubstr("holds 56 values, more than the 55 elements of [5, 11]"));
}

TEST(FindSparseErrorTest, BitmaskShapeAndDtype) {
  Status s =
      FindError(GroupWith("a", ".bitmask", Make("", Dtype::kU8, {5, 1}, std::vector<uint8_t>(5))));
  EXPECT_THAT(s.message(),
              HasSubstr("'a.bitmask' is U8 [5, 1], expected U8 [5, 2] for a dense [5, 11]"));
  s = FindError(GroupWith("a", ".bitmask", Make("", Dtype::kI8, {5, 2}, std::vector<uint8_t>(10))));
  EXPECT_THAT(s.message(), HasSubstr("'a.bitmask' is I8 [5, 2], expected U8 [5, 2]"));
}

TEST(FindSparseErrorTest, RowOffsetsCountLies) {
  Status s = FindError(
      GroupWith("a", ".row_offsets", Make("", Dtype::kI64, {6}, std::vector<int64_t>(6))));
  EXPECT_THAT(s.message(), HasSubstr("'a.row_offsets' is I64 [6], expected I64 [5] (one per row)"));
  s = FindError(
      GroupWith("a", ".row_offsets", Make("", Dtype::kI32, {5}, std::vector<int32_t>(5))));
  EXPECT_THAT(s.message(), HasSubstr("'a.row_offsets' is I32 [5], expected I64 [5]"));
}

TEST(FindSparseErrorTest, DenseTensorWithTheGroupsName) {
  auto tensors = Concat(Group("a", RandomSparse("", Dtype::kBF16, 2, 8, 0.5, 1)),
                        {RandomSparse("a.weight", Dtype::kBF16, 2, 8, 0, 2)});
  Status s = FindError(tensors);
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_THAT(s.message(),
              HasSubstr("tensor 'a.weight' is stored both dense and as the sparse group 'a'"));
}

TEST(FindSparseErrorTest, TwoGenerationsOfOneTensor) {
  auto tensors = Concat(Group("a", RandomSparse("", Dtype::kBF16, 2, 8, 0.5, 1)),
                        Group("a.weight", RandomSparse("", Dtype::kBF16, 2, 8, 0.5, 2)));
  Status s = FindError(tensors);
  EXPECT_THAT(s.message(), HasSubstr("sparse groups 'a' and 'a.weight' both stand for 'a.weight'"));
}

}  // namespace
}  // namespace tensorlift::sparse
