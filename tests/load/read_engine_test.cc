// Read ops name a file by its index among the engine's files (io/read_op.h):
// every local engine reads ops of several files from one batch, an op naming
// a file the engine was not made with is refused, and errors name the file.
// A checkpoint opened through a store is read through the engine its store
// makes (CheckpointStore::MakeReadEngine): the default goes through
// ReadRanges, and a store's own engine is the one the load runs.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../common/assert_ok.h"
#include "../common/scratch_dir.h"
#include "io/read_op.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/loader.h"
#include "test_files.h"

namespace tensorlift {
namespace {

using test::ScratchDir;
using ::testing::HasSubstr;
using testing::MixedTensors;
using testing::WriteRaw;

std::string Pattern(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + seed * 7) & 0xff);
  return s;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
  std::fclose(f);
}

enum class Kind { kInline, kThreads, kUring };

Result<std::unique_ptr<ReadEngine>> Make(Kind kind, std::vector<EngineFile> files) {
  switch (kind) {
    case Kind::kInline:
      return MakeInlineEngine(std::move(files));
    case Kind::kThreads:
      return MakeThreadPoolEngine(3, std::move(files));
    case Kind::kUring:
      return MakeUringEngine(8, std::move(files));
  }
  return InternalError("no such engine");
}

class EngineFilesTest : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    for (int i = 0; i < 3; ++i) {
      paths_.push_back(dir_.File("f" + std::to_string(i)));
      contents_.push_back(Pattern(100000 + i * 777, i + 1));
      WriteFile(paths_[i], contents_[i]);
      fds_.push_back(::open(paths_[i].c_str(), O_RDONLY | O_CLOEXEC));
      ASSERT_GE(fds_.back(), 0);
    }
  }
  void TearDown() override {
    for (int fd : fds_) ::close(fd);
  }
  std::vector<EngineFile> Files() const {
    std::vector<EngineFile> files;
    for (size_t i = 0; i < fds_.size(); ++i) files.push_back({fds_[i], &paths_[i]});
    return files;
  }
  std::unique_ptr<ReadEngine> Engine() {
    auto engine = Make(GetParam(), Files());
    if (!engine.ok()) return nullptr;
    return std::move(engine).value();
  }

  ScratchDir dir_{"tl_read_engine"};
  std::vector<std::string> paths_, contents_;
  std::vector<int> fds_;
};

TEST_P(EngineFilesTest, OpsOfSeveralFilesInOneBatchReadEachOnesBytes) {
  auto engine = Engine();
  if (!engine) GTEST_SKIP() << "io_uring is not usable here";
  // Interleaved files, and ranges at the same offsets in different files.
  struct Want {
    uint32_t shard;
    uint64_t offset, length;
  };
  const std::vector<Want> wants = {{2, 0, 5000},     {0, 0, 5000},    {1, 4096, 30000},
                                   {0, 99000, 1000}, {2, 50001, 777}, {1, 0, 1}};
  std::vector<std::string> got(wants.size());
  std::vector<ReadOp> ops;
  for (size_t i = 0; i < wants.size(); ++i) {
    got[i].assign(wants[i].length, '\0');
    ReadOp op;
    op.shard = wants[i].shard;
    op.offset = wants[i].offset;
    op.length = wants[i].length;
    op.dest = reinterpret_cast<std::byte*>(got[i].data());
    op.id = static_cast<uint32_t>(i);
    ops.push_back(op);
  }
  ReadProgress progress;
  std::atomic<int> done{0};
  progress.op_done = [&](const ReadOp&) { done.fetch_add(1); };
  ASSERT_OK(engine->Run(ops, &progress));
  EXPECT_EQ(done.load(), static_cast<int>(ops.size()));
  for (size_t i = 0; i < wants.size(); ++i) {
    EXPECT_EQ(got[i], contents_[wants[i].shard].substr(wants[i].offset, wants[i].length))
        << "op " << i;
  }
}

TEST_P(EngineFilesTest, AnOpNamingAFileTheEngineWasNotMadeWithIsRefused) {
  auto engine = Engine();
  if (!engine) GTEST_SKIP() << "io_uring is not usable here";
  std::string buf(10, '\0');
  ReadOp op;
  op.shard = 3;  // The engine has files 0..2.
  op.length = buf.size();
  op.dest = reinterpret_cast<std::byte*>(buf.data());
  ReadProgress progress;
  Status st = engine->Run({&op, 1}, &progress);
  EXPECT_EQ(st.code(), StatusCode::kInternal) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("file 3 of an engine with 3"));
}

TEST_P(EngineFilesTest, AShortReadNamesTheFileOfTheOp) {
  auto engine = Engine();
  if (!engine) GTEST_SKIP() << "io_uring is not usable here";
  std::string a(1000, '\0'), b(1000, '\0');
  ReadOp ok_op, past_end;
  ok_op.shard = 0;
  ok_op.length = a.size();
  ok_op.dest = reinterpret_cast<std::byte*>(a.data());
  past_end.shard = 1;
  past_end.offset = contents_[1].size() - 10;  // 990 bytes past file 1's end.
  past_end.length = b.size();
  past_end.dest = reinterpret_cast<std::byte*>(b.data());
  const ReadOp ops[] = {ok_op, past_end};
  ReadProgress progress;
  Status st = engine->Run(ops, &progress);
  EXPECT_EQ(st.code(), StatusCode::kIOError) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr(paths_[1] + ": short read"));
}

INSTANTIATE_TEST_SUITE_P(Engines, EngineFilesTest,
                         ::testing::Values(Kind::kInline, Kind::kThreads, Kind::kUring),
                         [](const auto& info) {
                           switch (info.param) {
                             case Kind::kInline:
                               return std::string("Inline");
                             case Kind::kThreads:
                               return std::string("Threads");
                             case Kind::kUring:
                               return std::string("Uring");
                           }
                           return std::string("Unknown");
                         });

// A store over local files by another name ("mem://NAME" is file NAME of a
// directory), reading with pread: the loader knows it only as a store.
class RenamedStore : public CheckpointStore {
 public:
  explicit RenamedStore(std::string dir) : dir_(std::move(dir)) {}
  std::string Local(const std::string& path) const {
    return dir_ + "/" + path.substr(std::strlen("mem://"));
  }
  Result<bool> IsDirectory(const std::string& path) override { return path == "mem://"; }
  Result<std::vector<Entry>> List(const std::string&) override {
    return std::vector<Entry>{{"m.safetensors", false}};
  }
  Result<std::string> ReadSmall(const std::string& path, uint64_t) override {
    return NotFoundError(path);
  }
  Result<Header> ReadHeader(const std::string& path, FileIdentity* identity) override {
    return Header::ReadFile(Local(path), identity);
  }
  Status ReadRanges(std::span<const Range> ranges,
                    const std::function<void(size_t, uint64_t)>& landed) override {
    ranges_read_ += ranges.size();
    for (size_t i = 0; i < ranges.size(); ++i) {
      const int fd = ::open(Local(*ranges[i].path).c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) return IOError("open " + *ranges[i].path);
      Status st = ReadExactlyAt(fd, ranges[i].offset, ranges[i].dest, ranges[i].length);
      ::close(fd);
      TL_RETURN_IF_ERROR(st);
      if (landed) landed(i, ranges[i].length);
    }
    return Status::Ok();
  }
  std::atomic<uint64_t> ranges_read_{0};

 private:
  std::string dir_;
};

// The same store, with an engine of its own: the default one, counting the
// ops it runs and the files it was made with.
class EngineStore final : public RenamedStore {
 public:
  using RenamedStore::RenamedStore;
  std::unique_ptr<ReadEngine> MakeReadEngine(std::vector<std::string> paths) override {
    made_with_ = paths;
    class Counting final : public ReadEngine {
     public:
      Counting(std::unique_ptr<ReadEngine> inner, std::atomic<uint64_t>* ops)
          : ReadEngine(inner->files()), inner_(std::move(inner)), ops_(ops) {}
      Status Run(std::span<const ReadOp> ops, ReadProgress* progress) override {
        *ops_ += ops.size();
        return inner_->Run(ops, progress);
      }

     private:
      std::unique_ptr<ReadEngine> inner_;
      std::atomic<uint64_t>* ops_;
    };
    return std::make_unique<Counting>(CheckpointStore::MakeReadEngine(std::move(paths)), &ops_);
  }
  std::vector<std::string> made_with_;
  std::atomic<uint64_t> ops_{0};
};

void ExpectSameTensors(const LoadedCheckpoint& got, const LoadedCheckpoint& want) {
  ASSERT_EQ(got.tensors().size(), want.tensors().size());
  for (size_t i = 0; i < want.tensors().size(); ++i) {
    const LoadedTensor& a = got.tensors()[i];
    const LoadedTensor& b = want.tensors()[i];
    EXPECT_EQ(a.name, b.name);
    ASSERT_EQ(a.nbytes, b.nbytes) << a.name;
    EXPECT_EQ(std::memcmp(a.data, b.data, a.nbytes), 0) << a.name;
  }
}

TEST(StoreEngineTest, AStoresCheckpointIsReadThroughTheEngineItsStoreMakes) {
  ScratchDir dir("tl_store_engine");
  WriteRaw(dir.File("m.safetensors"), MixedTensors(5), 3);
  auto local = Load(dir.File("m.safetensors"));
  ASSERT_OK(local);

  auto load_through = [&](std::shared_ptr<RenamedStore> store) {
    auto ckpt = Checkpoint::Open("mem://m.safetensors", store);
    ASSERT_OK(ckpt);
    auto loaded = Load(*ckpt);
    ASSERT_OK(loaded);
    ExpectSameTensors(*loaded, *local);
    EXPECT_GT(store->ranges_read_.load(), 0u);
  };
  // The default engine: the store's ReadRanges.
  load_through(std::make_shared<RenamedStore>(dir.path()));
  // A store's own engine is the one the load runs, made with the shards' paths.
  auto own = std::make_shared<EngineStore>(dir.path());
  load_through(own);
  EXPECT_GT(own->ops_.load(), 0u);
  EXPECT_THAT(own->made_with_, ::testing::ElementsAre("mem://m.safetensors"));
}

}  // namespace
}  // namespace tensorlift
