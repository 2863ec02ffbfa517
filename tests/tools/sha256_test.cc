// verify --sha256's helper (tools/sha256.h): file digests against OpenSSL's
// one-shot digest of the same bytes, around the 8 MiB buffer's edges and with
// O_DIRECT; the digest lists' forms; matching names; a hub cache's symlinks.
#include "sha256.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/assert_ok.h"
#include "common/scratch_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tensorlift::cli {
namespace {

using test::ScratchDir;
using ::testing::HasSubstr;

constexpr size_t kMiB = size_t{1} << 20;
const std::string kAbc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
const std::string kEmpty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

std::string Bytes(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  uint32_t x = seed * 2654435761u + 1;
  for (auto& c : s) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    c = static_cast<char>(x);
  }
  return s;
}

TEST(Sha256Test, KnownDigests) {
  EXPECT_EQ(Sha256Hex("abc"), kAbc);
  EXPECT_EQ(Sha256Hex(""), kEmpty);
}

TEST(Sha256Test, FilesOfEverySizeAroundTheBuffer) {
  ScratchDir dir("tl_sha256");
  for (size_t n : {size_t{0}, size_t{1}, size_t{4095}, 8 * kMiB - 1, 8 * kMiB, 8 * kMiB + 1,
                   16 * kMiB + 4097}) {
    const std::string bytes = Bytes(n, static_cast<uint32_t>(n));
    const std::string path = dir.Write("f" + std::to_string(n), bytes);
    auto got = Sha256File(path);
    ASSERT_OK(got) << n;
    EXPECT_EQ(got->digest, Sha256Hex(bytes)) << n;
    EXPECT_EQ(got->bytes, n);
  }
}

// A file out of the page cache is read with O_DIRECT where the filesystem
// has it (here: the test's temp dir, when it is not a tmpfs); the digest is the same.
TEST(Sha256Test, EvictedFileReadDirect) {
  ScratchDir dir("tl_sha256");
  const std::string bytes = Bytes(20 * kMiB + 123, 7);
  const std::string path = dir.Write("cold", bytes);
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  auto got = Sha256File(path);
  ASSERT_OK(got);
  EXPECT_EQ(got->digest, Sha256Hex(bytes));
}

TEST(Sha256Test, ManyFilesInOrderWithErrorsNamingTheFile) {
  ScratchDir dir("tl_sha256");
  std::vector<std::string> paths, digests;
  for (int i = 0; i < 9; ++i) {
    const std::string bytes = Bytes(kMiB + static_cast<size_t>(i) * 4099, static_cast<uint32_t>(i));
    paths.push_back(dir.Write("s" + std::to_string(i), bytes));
    digests.push_back(Sha256Hex(bytes));
  }
  paths.push_back(dir / "missing");
  for (int threads : {0, 1, 3}) {
    auto got = Sha256Files(paths, threads);
    ASSERT_EQ(got.size(), paths.size());
    for (size_t i = 0; i + 1 < paths.size(); ++i) {
      ASSERT_OK(got[i]);
      EXPECT_EQ(got[i]->digest, digests[i]) << i << " threads " << threads;
    }
    ASSERT_FALSE(got.back().ok());
    EXPECT_EQ(got.back().status().code(), StatusCode::kNotFound);
    EXPECT_THAT(got.back().status().ToString(), HasSubstr(dir / "missing"));
  }
}

TEST(Sha256ListTest, Sha256sumOutput) {
  const std::string a(64, 'a'), b(64, 'B'), c(64, 'c'), d(64, 'd');
  auto list =
      ParseSha256List(a + "  model-00001.safetensors\n" + b + " *sub/model.bin\r\n\n" + "\\" + c +
                          "  odd\\\\name\n" + "SHA256 (tagged.json) = " + d + "\n",
                      "SHA256SUMS");
  ASSERT_OK(list);
  ASSERT_EQ(list->entries.size(), 4u);
  EXPECT_EQ(list->entries[0].name, "model-00001.safetensors");
  EXPECT_EQ(list->entries[0].digest, a);
  EXPECT_EQ(list->entries[1].name, "sub/model.bin");
  EXPECT_EQ(list->entries[1].digest, std::string(64, 'b'));  // Lowercased.
  EXPECT_EQ(list->entries[2].name, "odd\\name");
  EXPECT_EQ(list->entries[3].name, "tagged.json");
  EXPECT_EQ(list->entries[3].digest, d);

  auto bad = ParseSha256List(a + "  x\n" + "1234  short\n", "SUMS");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().ToString(), HasSubstr("SUMS:2"));
}

TEST(Sha256ListTest, JsonForms) {
  const std::string a(64, 'a'), b(64, 'b');
  auto map = ParseSha256List(
      R"({"model.safetensors": ")" + a + R"(", "x/y.safetensors": {"sha256": ")" + b + R"("}})",
      "m.json");
  ASSERT_OK(map);
  ASSERT_EQ(map->entries.size(), 2u);
  EXPECT_EQ(map->entries[0].name, "model.safetensors");
  EXPECT_EQ(map->entries[1].digest, b);

  auto siblings = ParseSha256List(R"({"id": "org/name", "siblings": [{"rfilename": "config.json"},
        {"rfilename": "model.safetensors", "lfs": {"sha256": ")" +
                                      a + R"(", "size": 10}}]})",
                                  "api.json");
  ASSERT_OK(siblings);
  ASSERT_EQ(siblings->entries.size(), 1u);  // config.json is in git: no SHA-256.
  EXPECT_EQ(siblings->entries[0].name, "model.safetensors");
  EXPECT_EQ(siblings->entries[0].digest, a);

  auto tree = ParseSha256List(
      R"([{"type": "file", "path": "m.safetensors", "lfs": {"oid": ")" + b + R"("}}])",
      "tree.json");
  ASSERT_OK(tree);
  ASSERT_EQ(tree->entries.size(), 1u);
  EXPECT_EQ(tree->entries[0].digest, b);

  auto bad = ParseSha256List(R"({"model.safetensors": "abc"})", "bad.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().ToString(), HasSubstr("model.safetensors"));
  EXPECT_FALSE(ParseSha256List("{", "broken.json").ok());
}

TEST(Sha256ListTest, MatchesByRelativePathThenBasename) {
  const std::string a(64, 'a'), b(64, 'b'), c(64, 'c');
  Sha256List list{"SUMS",
                  {{"model.safetensors", a}, {"v2/model.safetensors", b}, {"./only.bin", c}}};
  auto r = ExpectedSha256(list, "/data/repo/v2/model.safetensors");
  ASSERT_OK(r);
  EXPECT_EQ(*r, b);  // The longest matching relative path.
  r = ExpectedSha256(list, "/data/repo/model.safetensors");
  ASSERT_OK(r);
  EXPECT_EQ(*r, a);
  r = ExpectedSha256(list, "/elsewhere/only.bin");
  ASSERT_OK(r);
  EXPECT_EQ(*r, c);

  r = ExpectedSha256(list, "/data/missing.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(r.status().ToString(), HasSubstr("no SHA-256 known for /data/missing.safetensors"));
  EXPECT_THAT(r.status().ToString(), HasSubstr("SUMS"));

  // Only basenames match, with different digests: which one is meant is unknown.
  Sha256List two{"SUMS", {{"a/m.bin", a}, {"b/m.bin", b}}};
  r = ExpectedSha256(two, "/x/m.bin");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().ToString(), HasSubstr("two SHA-256"));
}

TEST(HubSha256Test, SnapshotSymlinksNameTheirBlob) {
  namespace fs = std::filesystem;
  ScratchDir dir("tl_hub");
  const std::string sha = Sha256Hex("weights");
  const fs::path repo = fs::path(dir.path()) / "models--org--name";
  fs::create_directories(repo / "blobs");
  fs::create_directories(repo / "snapshots" / "rev" / "sub");
  dir.Write("models--org--name/blobs/" + sha, "weights");
  fs::create_symlink("../../blobs/" + sha, repo / "snapshots/rev/model.safetensors");
  fs::create_symlink("../../../blobs/" + sha, repo / "snapshots/rev/sub/model.safetensors");
  dir.Write("models--org--name/snapshots/rev/config.json", "{}");
  fs::create_symlink("../../elsewhere/x", repo / "snapshots/rev/other.safetensors");

  auto r = HubSha256((repo / "snapshots/rev/model.safetensors").string());
  ASSERT_OK(r);
  EXPECT_EQ(*r, sha);
  r = HubSha256((repo / "snapshots/rev/sub/model.safetensors").string());
  ASSERT_OK(r);
  EXPECT_EQ(*r, sha);
  for (const char* name : {"config.json", "other.safetensors"}) {
    const std::string p = (repo / "snapshots/rev" / name).string();
    r = HubSha256(p);
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_THAT(r.status().ToString(), HasSubstr("no SHA-256 known for " + p));
  }
}

}  // namespace
}  // namespace tensorlift::cli
