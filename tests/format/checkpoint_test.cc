// Checkpoint::Open: a single file, a directory of shards, and sharded models
// described by model.safetensors.index.json.
#include "tensorlift/checkpoint.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../common/assert_ok.h"
#include "../common/scratch_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensorlift/safetensors.h"

namespace tensorlift {
namespace {

using ::tensorlift::test::ScratchDir;

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  ASSERT_TRUE(out) << path;
}

// Writes a shard holding one U8 tensor of `bytes` bytes per name.
void WriteShard(const std::string& path, const std::vector<std::pair<std::string, int>>& tensors) {
  std::vector<std::string> data;
  data.reserve(tensors.size());
  std::vector<TensorView> views;
  for (const auto& [name, bytes] : tensors) {
    data.push_back(std::string(bytes, 'x'));
    views.push_back({name,
                     Dtype::kU8,
                     {static_cast<uint64_t>(bytes)},
                     std::as_bytes(std::span<const char>(data.back().data(), data.back().size()))});
  }
  Status s = WriteFile(path, views, std::nullopt);
  ASSERT_OK(s);
}

std::vector<std::string> Names(const Checkpoint& c) {
  std::vector<std::string> out;
  for (auto loc : c.tensors()) out.push_back(c.info(loc).name);
  return out;
}

// A two-shard model: a, b in the first shard, c in the second.
struct ShardedModel {
  ScratchDir dir;
  std::string index;
  std::string shard1 = "model-00001-of-00002.safetensors";
  std::string shard2 = "model-00002-of-00002.safetensors";

  ShardedModel() {
    WriteShard(dir / shard1, {{"a", 4}, {"b", 8}});
    WriteShard(dir / shard2, {{"c", 16}});
    index = dir / "model.safetensors.index.json";
    WriteIndex(
        "{\"metadata\":{\"total_size\":28,\"format\":\"pt\",\"nested\":{\"k\":[1,2]}},"
        "\"weight_map\":{\"c\":\"" +
        shard2 + "\",\"a\":\"" + shard1 + "\",\"b\":\"" + shard1 + "\"}}");
  }
  void WriteIndex(const std::string& json) { WriteText(index, json); }
  // An index whose weight_map is `map` (a JSON object body).
  void WriteWeightMap(const std::string& map) { WriteIndex("{\"weight_map\":{" + map + "}}"); }
};

// --- A single file ---------------------------------------------------------------

TEST(CheckpointFileTest, OpensOneFile) {
  ScratchDir dir;
  const std::string path = dir / "model.safetensors";
  WriteShard(path, {{"z", 3}, {"a", 5}});
  auto c = Checkpoint::Open(path);
  ASSERT_OK(c);
  EXPECT_EQ(c->kind(), Checkpoint::Kind::kFile);
  EXPECT_EQ(c->path(), path);
  ASSERT_EQ(c->shards().size(), 1u);
  EXPECT_EQ(c->shards()[0].path, path);
  EXPECT_THAT(Names(*c), ElementsAre("a", "z"));
  auto z = c->Find("z");
  ASSERT_TRUE(z.has_value());
  EXPECT_EQ(c->info(*z).nbytes(), 3u);
  EXPECT_FALSE(c->Find("y").has_value());
  EXPECT_EQ(c->total_bytes(), 8u);
  EXPECT_THAT(c->warnings(), IsEmpty());
  EXPECT_THAT(c->index_metadata(), IsEmpty());
}

TEST(CheckpointFileTest, MissingPathIsNotFound) {
  ScratchDir dir;
  auto c = Checkpoint::Open(dir / "nope.safetensors");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(), StartsWith(dir / "nope.safetensors: "));
}

TEST(CheckpointFileTest, CorruptFileNamesThePathAndTheRule) {
  ScratchDir dir;
  const std::string path = dir / "bad.safetensors";
  WriteText(path, std::string("\x02\0\0\0\0\0\0\0{}x", 11));
  auto c = Checkpoint::Open(path);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(c.status().message(), StartsWith(path + ": MetadataIncompleteBuffer: "));
}

// --- A directory of shards without an index ---------------------------------------

TEST(CheckpointDirectoryTest, AllShardsInNameOrder) {
  ScratchDir dir;
  WriteShard(dir / "b.safetensors", {{"y", 2}});
  WriteShard(dir / "a.safetensors", {{"z", 1}, {"x", 4}});
  WriteText(dir / "notes.txt", "not a shard");
  WriteText(dir / "config.json", "{}");
  std::filesystem::create_directory(dir / "sub.safetensors");
  auto c = Checkpoint::Open(dir.path());
  ASSERT_OK(c);
  EXPECT_EQ(c->kind(), Checkpoint::Kind::kDirectory);
  ASSERT_EQ(c->shards().size(), 2u);
  EXPECT_EQ(c->shards()[0].path, dir / "a.safetensors");
  EXPECT_EQ(c->shards()[1].path, dir / "b.safetensors");
  EXPECT_THAT(Names(*c), ElementsAre("x", "y", "z"));
  EXPECT_EQ(c->Find("y")->shard, 1u);
  EXPECT_EQ(c->Find("x")->shard, 0u);
  EXPECT_EQ(c->info(*c->Find("x")).nbytes(), 4u);
  EXPECT_EQ(c->total_bytes(), 7u);
  EXPECT_THAT(c->warnings(), IsEmpty());
}

TEST(CheckpointDirectoryTest, TrailingSlash) {
  ScratchDir dir;
  WriteShard(dir / "a.safetensors", {{"x", 1}});
  auto c = Checkpoint::Open(dir.path() + "/");
  ASSERT_OK(c);
  EXPECT_EQ(c->shards()[0].path, dir / "a.safetensors");
}

TEST(CheckpointDirectoryTest, TensorInTwoShardsIsAnError) {
  ScratchDir dir;
  WriteShard(dir / "a.safetensors", {{"w", 1}});
  WriteShard(dir / "b.safetensors", {{"w", 1}});
  auto c = Checkpoint::Open(dir.path());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(c.status().message(),
              AllOf(HasSubstr("'w'"), HasSubstr("a.safetensors"), HasSubstr("b.safetensors")));
}

TEST(CheckpointDirectoryTest, BadShardIsNamed) {
  ScratchDir dir;
  WriteShard(dir / "a.safetensors", {{"w", 1}});
  WriteText(dir / "b.safetensors", "short");
  auto c = Checkpoint::Open(dir.path());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(c.status().message(), StartsWith(dir / "b.safetensors: HeaderTooSmall: "));
}

TEST(CheckpointDirectoryTest, EmptyDirectoryIsNotFound) {
  ScratchDir dir;
  WriteText(dir / "README", "nothing here");
  auto c = Checkpoint::Open(dir.path());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(), StartsWith(dir.path()));
}

// --- A caller's list of files (OpenFiles) -------------------------------------------

TEST(CheckpointFilesTest, SeveralFilesAreTheShardsOfOne) {
  ScratchDir dir;
  WriteShard(dir / "b.safetensors", {{"y", 2}});
  WriteShard(dir / "a.safetensors", {{"z", 1}, {"x", 4}});
  auto c = Checkpoint::OpenFiles({dir / "b.safetensors", dir / "a.safetensors"});
  ASSERT_OK(c);
  EXPECT_EQ(c->kind(), Checkpoint::Kind::kDirectory);
  ASSERT_EQ(c->shards().size(), 2u);
  EXPECT_EQ(c->shards()[0].path, dir / "b.safetensors");  // The caller's order.
  EXPECT_EQ(c->shards()[1].path, dir / "a.safetensors");
  EXPECT_THAT(Names(*c), ElementsAre("x", "y", "z"));
  EXPECT_EQ(c->Find("x")->shard, 1u);
  EXPECT_EQ(c->total_bytes(), 7u);
}

TEST(CheckpointFilesTest, OneFileIsAFile) {
  ScratchDir dir;
  WriteShard(dir / "a.bin", {{"x", 1}});
  auto c = Checkpoint::OpenFiles({dir / "a.bin"});
  ASSERT_OK(c);
  EXPECT_EQ(c->kind(), Checkpoint::Kind::kFile);
}

TEST(CheckpointFilesTest, ErrorsNameTheFiles) {
  ScratchDir dir;
  WriteShard(dir / "a.safetensors", {{"w", 1}});
  WriteShard(dir / "b.safetensors", {{"w", 1}, {"v", 1}});
  WriteText(dir / "c.safetensors", "short");
  auto dup = Checkpoint::OpenFiles({dir / "a.safetensors", dir / "b.safetensors"});
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(dup.status().message(), AllOf(HasSubstr("'w'"), HasSubstr(dir / "a.safetensors"),
                                            HasSubstr(dir / "b.safetensors")));
  auto twice = Checkpoint::OpenFiles({dir / "a.safetensors", dir.path() + "/./a.safetensors"});
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(twice.status().message(), HasSubstr("named twice"));
  auto bad = Checkpoint::OpenFiles({dir / "a.safetensors", dir / "c.safetensors"});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(bad.status().message(), StartsWith(dir / "c.safetensors: HeaderTooSmall: "));
  auto missing = Checkpoint::OpenFiles({dir / "a.safetensors", dir / "none.safetensors"});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(Checkpoint::OpenFiles({}).status().code(), StatusCode::kInvalidArgument);
}

// --- An index ---------------------------------------------------------------------

void ExpectShardedModel(const Checkpoint& c, const ShardedModel& m) {
  EXPECT_EQ(c.kind(), Checkpoint::Kind::kIndex);
  ASSERT_EQ(c.shards().size(), 2u);
  EXPECT_THAT(Names(c), ElementsAre("a", "b", "c"));
  const std::string shard2_path = c.shards()[c.Find("c")->shard].path;
  EXPECT_EQ(std::filesystem::path(shard2_path).filename(), m.shard2);
  EXPECT_TRUE(std::filesystem::equivalent(shard2_path, m.dir / m.shard2));
  EXPECT_EQ(c.Find("a")->shard, c.Find("b")->shard);
  EXPECT_NE(c.Find("a")->shard, c.Find("c")->shard);
  EXPECT_EQ(c.info(*c.Find("b")).nbytes(), 8u);
  EXPECT_EQ(c.total_bytes(), 28u);
  EXPECT_THAT(c.warnings(), IsEmpty());
  // Strings stay strings; other values keep their (minified) JSON text.
  EXPECT_EQ(c.index_metadata(),
            (Metadata{{"format", "pt"}, {"nested", "{\"k\":[1,2]}"}, {"total_size", "28"}}));
}

TEST(CheckpointIndexTest, DirectoryWithIndex) {
  ShardedModel m;
  // A stray shard that the index does not name is not opened.
  WriteText(m.dir / "stray.safetensors", "garbage");
  auto c = Checkpoint::Open(m.dir.path());
  ASSERT_OK(c);
  ExpectShardedModel(*c, m);
  EXPECT_EQ(c->path(), m.dir.path());
}

TEST(CheckpointIndexTest, IndexPathDirectly) {
  ShardedModel m;
  auto c = Checkpoint::Open(m.index);
  ASSERT_OK(c);
  ExpectShardedModel(*c, m);
  EXPECT_EQ(c->path(), m.index);
}

TEST(CheckpointIndexTest, TheOnlyOtherIndexInADirectory) {
  ShardedModel m;
  std::filesystem::rename(m.index, m.dir / "diffusion_pytorch_model.safetensors.index.json");
  auto c = Checkpoint::Open(m.dir.path());
  ASSERT_OK(c);
  ExpectShardedModel(*c, m);
}

TEST(CheckpointIndexTest, ModelIndexWinsOverOthers) {
  ShardedModel m;
  WriteText(m.dir / "other.safetensors.index.json", "{ not json");
  auto c = Checkpoint::Open(m.dir.path());
  ASSERT_OK(c);
  ExpectShardedModel(*c, m);
}

TEST(CheckpointIndexTest, SeveralOtherIndexesAreAmbiguous) {
  ShardedModel m;
  std::filesystem::rename(m.index, m.dir / "a.safetensors.index.json");
  std::filesystem::copy_file(m.dir / "a.safetensors.index.json",
                             m.dir / "b.safetensors.index.json");
  auto c = Checkpoint::Open(m.dir.path());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), StartsWith(m.dir.path()));
}

TEST(CheckpointIndexTest, MissingShardIsNotFound) {
  ShardedModel m;
  std::filesystem::remove(m.dir / m.shard2);
  auto c = Checkpoint::Open(m.index);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(), AllOf(StartsWith(m.index + ": "), HasSubstr(m.shard2)));
}

TEST(CheckpointIndexTest, TensorAbsentFromItsShard) {
  ShardedModel m;
  m.WriteWeightMap("\"a\":\"" + m.shard1 + "\",\"b\":\"" + m.shard1 + "\",\"c\":\"" + m.shard1 +
                   "\"");
  auto c = Checkpoint::Open(m.index);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(c.status().message(),
              AllOf(StartsWith(m.index + ": "), HasSubstr("'c'"), HasSubstr(m.shard1)));
}

TEST(CheckpointIndexTest, TensorNamedButInNoShard) {
  ShardedModel m;
  m.WriteWeightMap("\"a\":\"" + m.shard1 + "\",\"b\":\"" + m.shard1 + "\",\"c\":\"" + m.shard2 +
                   "\",\"ghost\":\"" + m.shard2 + "\"");
  auto c = Checkpoint::Open(m.index);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(c.status().message(), HasSubstr("'ghost'"));
}

TEST(CheckpointIndexTest, TensorInTwoShards) {
  ShardedModel m;
  WriteShard(m.dir / m.shard2, {{"c", 16}, {"a", 4}});
  auto c = Checkpoint::Open(m.index);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(c.status().message(),
              AllOf(HasSubstr("'a'"), HasSubstr(m.shard1), HasSubstr(m.shard2)));
}

TEST(CheckpointIndexTest, ShardTensorAbsentFromTheIndexIsAWarning) {
  ShardedModel m;
  WriteShard(m.dir / m.shard2, {{"c", 16}, {"extra", 5}});
  auto c = Checkpoint::Open(m.index);
  ASSERT_OK(c);
  EXPECT_THAT(Names(*c), ElementsAre("a", "b", "c"));
  EXPECT_FALSE(c->Find("extra").has_value());
  EXPECT_EQ(c->total_bytes(), 28u);
  ASSERT_EQ(c->warnings().size(), 1u);
  EXPECT_THAT(c->warnings()[0], AllOf(HasSubstr("'extra'"), HasSubstr(m.shard2)));
}

TEST(CheckpointIndexTest, ShardNamesMustStayInTheDirectory) {
  for (const std::string bad :
       {"../model.safetensors", "/etc/passwd", "sub/../../model.safetensors", "..", "a/..", ""}) {
    ShardedModel m;
    m.WriteWeightMap("\"a\":\"" + bad + "\"");
    auto c = Checkpoint::Open(m.index);
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.status().code(), StatusCode::kCorruption) << bad;
    EXPECT_THAT(c.status().message(), StartsWith(m.index + ": ")) << bad;
  }
}

TEST(CheckpointIndexTest, ShardInASubdirectory) {
  ShardedModel m;
  std::filesystem::create_directory(m.dir / "sub");
  WriteShard(m.dir / "sub/part.safetensors", {{"a", 2}});
  m.WriteWeightMap("\"a\":\"sub/part.safetensors\"");
  auto c = Checkpoint::Open(m.index);
  ASSERT_OK(c);
  EXPECT_THAT(Names(*c), ElementsAre("a"));
  EXPECT_EQ(c->total_bytes(), 2u);
}

TEST(CheckpointIndexTest, MalformedIndexes) {
  const std::vector<std::string> bad = {
      "",
      "{",
      "[]",
      "{\"weight_map\":{\"a\":\"x.safetensors\",}}",
      "{}",
      "{\"weight_map\":5}",
      "{\"weight_map\":[\"x.safetensors\"]}",
      "{\"weight_map\":{\"a\":5}}",
      "{\"weight_map\":{\"a\":null}}",
      "{\"metadata\":5,\"weight_map\":{}}",
      "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
      "\"a\":\"model-00001-of-00002.safetensors\"}}",
  };
  for (const std::string& json : bad) {
    ShardedModel m;
    m.WriteIndex(json);
    auto c = Checkpoint::Open(m.index);
    ASSERT_FALSE(c.ok()) << json;
    EXPECT_EQ(c.status().code(), StatusCode::kCorruption) << json;
    EXPECT_THAT(c.status().message(), StartsWith(m.index + ": ")) << json;
  }
}

TEST(CheckpointIndexTest, BadShardThroughTheIndexNamesTheShard) {
  ShardedModel m;
  WriteText(m.dir / m.shard2, std::string("\x01\0\0\0\0\0\0\0[", 9));
  auto c = Checkpoint::Open(m.index);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(c.status().message(), HasSubstr(m.shard2 + ": InvalidHeaderDeserialization: "));
}

TEST(CheckpointIndexTest, NullMetadataAndEmptyWeightMap) {
  ShardedModel m;
  m.WriteIndex("{\"metadata\":null,\"weight_map\":{}}");
  auto c = Checkpoint::Open(m.index);
  ASSERT_OK(c);
  EXPECT_THAT(c->tensors(), IsEmpty());
  EXPECT_THAT(c->index_metadata(), IsEmpty());
  EXPECT_EQ(c->total_bytes(), 0u);
}

}  // namespace
}  // namespace tensorlift
