// Every mode and engine gives the bytes of a plain read, aligned, on odd
// header sizes, misaligned tensors, zero-size tensors, filters and shards;
// faults give clear errors and leak nothing (this suite also runs under ASan).
#include "tensorlift/loader.h"

#include <dlpack/dlpack.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>

#include "../common/assert_ok.h"
#include "device/populate.h"
#include "io/page_cache.h"
#include "load/arena_pool.h"
#include "load/checkpoint_builder.h"
#include "load/loader_internal.h"
#include "load/planner.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/streamer.h"
#include "test_files.h"

namespace tensorlift {
namespace {

using test::ScratchDir;
using ::testing::HasSubstr;
using testing::MixedTensors;
using ::testing::Not;
using testing::Random;
using testing::RawTensor;
using testing::WriteRaw;

struct Combo {
  IoMode mode;
  IoEngine engine;
  uint64_t block;
};

std::vector<Combo> AllCombos() {
  std::vector<Combo> out;
  for (IoMode m : {IoMode::kAuto, IoMode::kBuffered, IoMode::kDirect, IoMode::kMmap}) {
    for (IoEngine e : {IoEngine::kThreads, IoEngine::kUring}) {
      for (uint64_t b : {uint64_t{4096}, uint64_t{8} << 20}) out.push_back({m, e, b});
    }
  }
  return out;
}

std::string ComboName(const Combo& c) {
  return std::string(IoModeName(c.mode)) + "/" + std::string(IoEngineName(c.engine)) + "/" +
         std::to_string(c.block);
}

// Loads and compares each tensor with the file's bytes read plainly; each
// is aligned for its dtype unless `misaligned_views` were asked for.
void ExpectSameAsFile(const std::map<std::string, RawTensor>& want, const LoadedCheckpoint& got,
                      const std::string& ctx, bool misaligned_views = false) {
  ASSERT_EQ(got.tensors().size(), want.size()) << ctx;
  for (const LoadedTensor& t : got.tensors()) {
    auto it = want.find(t.name);
    ASSERT_NE(it, want.end()) << ctx << " " << t.name;
    const RawTensor& w = it->second;
    EXPECT_EQ(t.dtype, w.dtype) << ctx << " " << t.name;
    ASSERT_EQ(t.nbytes, w.bytes.size()) << ctx << " " << t.name;
    ASSERT_NE(t.data, nullptr);
    if (!misaligned_views) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % ElementAlignment(t.dtype), 0u)
          << ctx << " " << t.name;
    }
    if (!w.bytes.empty()) {
      EXPECT_EQ(std::memcmp(t.data, w.bytes.data(), w.bytes.size()), 0) << ctx << " " << t.name;
    }
    ASSERT_EQ(t.shape.size(), w.shape.size());
    int64_t stride = 1;
    for (size_t d = t.shape.size(); d-- > 0;) {
      EXPECT_EQ(t.shape[d], static_cast<int64_t>(w.shape[d]));
      EXPECT_EQ(t.strides[d], stride);
      stride *= t.shape[d];
    }
  }
}

class LoaderBytesTest : public ::testing::TestWithParam<size_t> {};

// Header sizes 0..7 mod 8 shift the data section to every alignment.
TEST_P(LoaderBytesTest, EveryModeEngineAndBlockSizeGivesThePlainBytes) {
  ScratchDir dir;
  const std::string path = dir.File("m.safetensors");
  auto tensors = MixedTensors(static_cast<uint32_t>(GetParam()));
  WriteRaw(path, tensors, GetParam());
  std::map<std::string, RawTensor> want;
  for (auto& t : tensors) want[t.name] = t;

  auto ckpt = Checkpoint::Open(path);
  ASSERT_OK(ckpt);
  for (const Combo& c : AllCombos()) {
    LoadOptions opts;
    opts.mode = c.mode;
    opts.engine = c.engine;
    opts.block_size = c.block;
    opts.threads = 3;
    auto got = Load(*ckpt, opts);
    ASSERT_OK(got) << ComboName(c);
    ExpectSameAsFile(want, *got, ComboName(c) + " lead=" + std::to_string(GetParam()));
    ASSERT_EQ(got->files().size(), 1u);
    EXPECT_NE(got->files()[0].mode, IoMode::kAuto);
  }
}

INSTANTIATE_TEST_SUITE_P(HeaderShift, LoaderBytesTest, ::testing::Range<size_t>(0, 8));

TEST(LoaderTest, FiltersLoadOnlyWhatMatches) {
  ScratchDir dir;
  const std::string path = dir.File("m.safetensors");
  auto tensors = MixedTensors(7);
  WriteRaw(path, tensors, 3);
  auto ckpt = Checkpoint::Open(path);
  ASSERT_OK(ckpt);

  auto re = TensorFilter::Regex("^(c|e|g)\\.");
  ASSERT_OK(re);
  auto names = TensorFilter::Names({"a.f32", "j.c64", "not.there"});
  auto pred = TensorFilter::Predicate([](std::string_view n) { return n.size() > 6; });
  for (const TensorFilter* f : {&*re, &names, &pred}) {
    std::map<std::string, RawTensor> want;
    for (auto& t : tensors) {
      if (f->Matches(t.name)) want[t.name] = t;
    }
    for (const Combo& c : AllCombos()) {
      LoadOptions opts;
      opts.mode = c.mode;
      opts.engine = c.engine;
      opts.block_size = c.block;
      opts.filter = *f;
      auto got = Load(*ckpt, opts);
      ASSERT_OK(got);
      ExpectSameAsFile(want, *got, "filtered " + ComboName(c));
      uint64_t bytes = 0;
      for (auto& [n, t] : want) bytes += t.bytes.size();
      EXPECT_EQ(got->total_bytes(), bytes);
    }
  }
  EXPECT_FALSE(TensorFilter::Regex("(unclosed").ok());
}

TEST(LoaderTest, ShardsThroughAnIndex) {
  ScratchDir dir;
  auto s1 = std::vector<RawTensor>{Random("x.a", Dtype::kF32, {100}, 1),
                                   Random("x.b", Dtype::kU8, {5}, 2)};
  auto s2 = std::vector<RawTensor>{Random("y.a", Dtype::kBF16, {64, 3}, 3),
                                   Random("y.z", Dtype::kI64, {2}, 4)};
  WriteRaw(dir.File("s-1.safetensors"), s1, 1);
  WriteRaw(dir.File("s-2.safetensors"), s2, 6);
  std::ofstream(dir.File("model.safetensors.index.json"))
      << R"({"metadata":{"total_size":1},"weight_map":{"x.a":"s-1.safetensors","x.b":"s-1.safetensors",)"
      << R"("y.a":"s-2.safetensors","y.z":"s-2.safetensors"}})";
  std::map<std::string, RawTensor> want;
  for (auto& t : s1) want[t.name] = t;
  for (auto& t : s2) want[t.name] = t;
  for (const Combo& c : AllCombos()) {
    LoadOptions opts;
    opts.mode = c.mode;
    opts.engine = c.engine;
    opts.block_size = c.block;
    auto got = Load(dir.path(), opts);
    ASSERT_OK(got);
    ExpectSameAsFile(want, *got, "shards " + ComboName(c));
    EXPECT_EQ(got->files().size(), 2u);
  }
  LoadOptions only_y;
  only_y.filter = TensorFilter::Regex("^y").value();
  auto got = Load(dir.path(), only_y);
  ASSERT_OK(got);
  ASSERT_EQ(got->files().size(), 1u) << "a file none of whose tensors is wanted is not read";
  EXPECT_THAT(got->files()[0].path, HasSubstr("s-2"));
}

TEST(LoaderTest, MemoryIsTheLoadedBytesPlusSmallPadding) {
  ScratchDir dir;
  const std::string path = dir.File("m.safetensors");
  auto tensors = MixedTensors(3);
  WriteRaw(path, tensors, 5);
  uint64_t bytes = 0;
  for (auto& t : tensors) bytes += t.bytes.size();
  for (IoMode m : {IoMode::kBuffered, IoMode::kDirect}) {
    LoadOptions opts;
    opts.mode = m;
    auto got = Load(path, opts);
    ASSERT_OK(got);
    // At most 4 KiB per run and 64 bytes per realigned tensor of padding.
    EXPECT_LE(got->buffer_bytes(), bytes + 4096 * tensors.size());
    EXPECT_GE(got->buffer_bytes(), bytes);
  }
}

TEST(LoaderTest, ProgressReachesTheTotal) {
  ScratchDir dir;
  const std::string path = dir.File("m.safetensors");
  WriteRaw(path, MixedTensors(4));
  LoadOptions opts;
  std::vector<Progress> seen;
  opts.progress = [&](const Progress& p) { seen.push_back(p); };
  auto got = Load(path, opts);
  ASSERT_OK(got);
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back().bytes_done, seen.back().bytes_total);
  EXPECT_GT(seen.back().bytes_total, 0u);
}

TEST(LoaderTest, DLPackExportsOutliveTheCheckpoint) {
  ScratchDir dir;
  const std::string path = dir.File("m.safetensors");
  auto tensors = MixedTensors(5);
  WriteRaw(path, tensors);
  DLManagedTensorVersioned* v = nullptr;
  DLManagedTensor* legacy = nullptr;
  {
    auto got = Load(path);
    ASSERT_OK(got);
    auto r1 = got->ToDLPackVersioned("g.big");
    auto r2 = got->ToDLPack("c.bf16");
    ASSERT_OK(r1);
    ASSERT_OK(r2);
    v = *r1;
    legacy = *r2;
    EXPECT_EQ(got->ToDLPack("nope").status().code(), StatusCode::kNotFound);
  }  // The LoadedCheckpoint is gone; the exports keep their buffer.
  EXPECT_EQ(v->version.major, DLPACK_MAJOR_VERSION);
  EXPECT_EQ(v->flags, 0u);
  EXPECT_EQ(v->dl_tensor.device.device_type, kDLCPU);
  EXPECT_EQ(v->dl_tensor.dtype.code, kDLFloat);
  EXPECT_EQ(v->dl_tensor.dtype.bits, 16);
  ASSERT_EQ(v->dl_tensor.ndim, 2);
  EXPECT_EQ(v->dl_tensor.shape[0], 300);
  EXPECT_EQ(v->dl_tensor.shape[1], 1024);
  EXPECT_EQ(v->dl_tensor.strides[0], 1024);
  EXPECT_EQ(std::memcmp(v->dl_tensor.data, tensors[6].bytes.data(), tensors[6].bytes.size()), 0);
  EXPECT_EQ(legacy->dl_tensor.dtype.code, kDLBfloat);
  EXPECT_EQ(std::memcmp(legacy->dl_tensor.data, tensors[2].bytes.data(), tensors[2].bytes.size()),
            0);
  v->deleter(v);
  legacy->deleter(legacy);
}

// The auto rule (docs/loading.md): a file in the page cache comes back as views of it (no
// copy), or read into owned memory with copy; a file out of the page cache is read direct.
std::map<std::string, RawTensor> ByName(const std::vector<RawTensor>& tensors) {
  std::map<std::string, RawTensor> want;
  for (auto& t : tensors) want[t.name] = t;
  return want;
}

void ReadWholeFile(const std::string& path) {  // into the page cache
  std::ifstream f(path, std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(all.empty());
}

TEST(LoaderTest, AutoViewsACachedFileOrCopiesItWhenAsked) {
  ScratchDir dir;
  const std::string path = dir.File("m.safetensors");
  auto tensors = MixedTensors(6);
  WriteRaw(path, tensors, 0);
  ReadWholeFile(path);
  auto views = Load(path);
  ASSERT_OK(views);
  ASSERT_EQ(views->files().size(), 1u);
  EXPECT_EQ(views->files()[0].mode, IoMode::kMmap);
  EXPECT_THAT(views->files()[0].reason, HasSubstr("in page cache: views of it"));
  ExpectSameAsFile(ByName(tensors), *views, "views");
  // The mapping is private: a consumer writing to its tensor changes its own copy of the
  // page only, never the file (the copy below reads the file again).
  for (const LoadedTensor& t : views->tensors()) {
    if (t.nbytes > 0) static_cast<unsigned char*>(t.data)[0] ^= 0xff;
  }

  LoadOptions copy;
  copy.copy = true;
  auto owned = Load(path, copy);
  ASSERT_OK(owned);
  EXPECT_EQ(owned->files()[0].mode, IoMode::kBuffered);
  EXPECT_THAT(owned->files()[0].reason, Not(HasSubstr("views")));
  ExpectSameAsFile(ByName(tensors), *owned, "copy");
  // Views and copies are different memory.
  EXPECT_NE(views->tensors()[0].data, owned->tensors()[0].data);
}

// A header length that is not a multiple of 8 shifts every tensor off its
// alignment: auto reads such a cached file into aligned memory (no views,
// whose pages would stay resident beside the copies), and says why; an
// explicit mode=mmap still views what it can and counts the bytes it copied.
TEST(LoaderTest, AutoCopiesACachedFileWhoseTensorsAreMisaligned) {
  ScratchDir dir;
  const std::string path = dir.File("m.safetensors");
  auto tensors = MixedTensors(6);
  WriteRaw(path, tensors, 3);
  ReadWholeFile(path);
  auto got = Load(path);
  ASSERT_OK(got);
  ASSERT_EQ(got->files().size(), 1u);
  const FileReport& f = got->files()[0];
  EXPECT_EQ(f.mode, IoMode::kBuffered);
  EXPECT_THAT(f.reason, HasSubstr("of its tensors are misaligned for their dtype"));
  EXPECT_THAT(f.reason, HasSubstr("read into aligned memory, not views"));
  ExpectSameAsFile(ByName(tensors), *got, "auto");
  for (const LoadedTensor& t : got->tensors()) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % ElementAlignment(t.dtype), 0u) << t.name;
  }
  LoadOptions mmap;
  mmap.mode = IoMode::kMmap;
  auto mapped = Load(path, mmap);
  ASSERT_OK(mapped);
  const FileReport& m = mapped->files()[0];
  EXPECT_EQ(m.mode, IoMode::kMmap);
  uint64_t misaligned = 0;
  uint32_t count = 0;
  auto ckpt = Checkpoint::Open(path);
  ASSERT_OK(ckpt);
  const Header& header = ckpt->shards()[0].header;
  for (const RawTensor& t : tensors) {
    const TensorInfo* info = header.Find(t.name);
    ASSERT_NE(info, nullptr);
    if (!t.bytes.empty() && (header.data_offset() + info->begin) % ElementAlignment(t.dtype) != 0) {
      misaligned += t.bytes.size();
      ++count;
    }
  }
  EXPECT_GT(count, 0u);
  EXPECT_EQ(m.realigned, count);
  EXPECT_EQ(m.realigned_bytes, misaligned);
  ExpectSameAsFile(ByName(tensors), *mapped, "mmap");
}

// With misaligned_views (what Python's tensorlift.load asks), auto views a
// cached file whose tensors an odd header left misaligned, where they are, as
// the reference does: no copy, nothing realigned, the reason says so.
TEST(LoaderTest, MisalignedViewsViewACachedOddHeaderFile) {
  ScratchDir dir;
  const std::string path = dir.File("m.safetensors");
  auto tensors = MixedTensors(6);
  WriteRaw(path, tensors, 3);
  ReadWholeFile(path);
  LoadOptions opts;
  opts.misaligned_views = true;
  for (IoMode mode : {IoMode::kAuto, IoMode::kMmap}) {
    opts.mode = mode;
    auto got = Load(path, opts);
    ASSERT_OK(got);
    const FileReport& f = got->files()[0];
    EXPECT_EQ(f.mode, IoMode::kMmap) << f.reason;
    EXPECT_EQ(f.realigned, 0u);
    EXPECT_THAT(f.reason, HasSubstr("viewed where they are, as the reference does"));
    ExpectSameAsFile(ByName(tensors), *got, "misaligned views", true);
    auto ckpt = Checkpoint::Open(path);
    ASSERT_OK(ckpt);
    const Header& header = ckpt->shards()[0].header;
    uint32_t misaligned = 0;
    for (const LoadedTensor& t : got->tensors()) {
      const TensorInfo* info = header.Find(t.name);
      ASSERT_NE(info, nullptr);
      if (info->nbytes() == 0) continue;
      // Each tensor is the file's bytes where they lie in the mapping.
      const uint64_t at = header.data_offset() + info->begin;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 4096, at % 4096) << t.name;
      misaligned += reinterpret_cast<uintptr_t>(t.data) % ElementAlignment(t.dtype) != 0;
    }
    EXPECT_GT(misaligned, 0u) << "views, not aligned copies";
    EXPECT_THAT(f.reason, HasSubstr(std::to_string(misaligned) + " of its tensors are misaligned"));
  }
}

TEST(LoaderTest, AutoReadsAFileOutOfThePageCacheDirect) {
  ScratchDir dir;
  const std::string path = dir.File("m.safetensors");
  auto tensors = MixedTensors(6);
  WriteRaw(path, tensors, 0);
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::fsync(fd), 0);
  ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
  auto resident = ResidentFraction(fd, 0, 1 << 20);
  ::close(fd);
  ASSERT_OK(resident);
  if (*resident >= 0.5) GTEST_SKIP() << "this filesystem keeps the file in memory";
  auto got = Load(path);
  ASSERT_OK(got);
  const FileReport& f = got->files()[0];
  if (f.mode == IoMode::kBuffered) {
    EXPECT_THAT(f.reason, HasSubstr("refuses O_DIRECT"));
  } else {
    EXPECT_EQ(f.mode, IoMode::kDirect) << f.reason;
  }
  ExpectSameAsFile(ByName(tensors), *got, "evicted");
}

// The resident share of [offset, offset + length) of fd, page by page
// (mincore of a mapping): what ResidentFraction must give exactly.
double CountResident(int fd, uint64_t offset, uint64_t length) {
  void* p = ::mmap(nullptr, length, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(offset));
  if (p == MAP_FAILED) return -1;
  std::vector<unsigned char> vec((length + 4095) / 4096);
  const int rc = ::mincore(p, length, vec.data());
  ::munmap(p, length);
  if (rc != 0) return -1;
  size_t resident = 0;
  for (unsigned char v : vec) resident += v & 1;
  return static_cast<double>(resident) / static_cast<double>(vec.size());
}

TEST(PageCacheTest, ResidentFractionIsExactWhenSmallAndSampledWhenLarge) {
  ScratchDir dir;
  const std::string path = dir.File("holes.bin");
  constexpr uint64_t kMiB = 1 << 20, kSize = 96 * kMiB;
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, kSize), 0);
  ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
  auto none = ResidentFraction(fd, 0, kSize);
  ASSERT_OK(none);
  if (*none > 0.01) {
    ::close(fd);
    GTEST_SKIP() << "this filesystem keeps the file in memory";
  }
  ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM), 0);  // no readahead past what is read
  std::vector<char> buf(kMiB);
  for (uint64_t off = 0; off < kSize / 2; off += kMiB) {  // the first half into the page cache
    ASSERT_EQ(::pread(fd, buf.data(), kMiB, static_cast<off_t>(off)), static_cast<ssize_t>(kMiB));
  }
  auto all = ResidentFraction(fd, 0, kSize);  // 96 MiB: sampled
  // 48 MiB: exact. The kernel may reclaim a page of it meanwhile (make test
  // runs suites side by side): exact means equal to a count of the pages
  // taken just before or just after.
  const double before = CountResident(fd, 0, kSize / 2);
  auto first = ResidentFraction(fd, 0, kSize / 2);
  const double after = CountResident(fd, 0, kSize / 2);
  auto second = ResidentFraction(fd, kSize / 2, kSize / 2);
  auto edge = ResidentFraction(fd, kSize / 2 - 4096, 8192);  // one cached page, one not
  ::close(fd);
  ASSERT_OK(all);
  ASSERT_OK(first);
  ASSERT_OK(second);
  ASSERT_OK(edge);
  EXPECT_NEAR(*all, 0.5, 0.02);
  EXPECT_GT(before, 0.99);
  EXPECT_TRUE(*first == before || *first == after)
      << *first << " counted " << before << " before and " << after << " after";
  EXPECT_EQ(*second, 0.0);
  EXPECT_EQ(*edge, 0.5);
}

TEST(LoaderTest, ViewsOfThePageCacheOutliveTheLoadAndAReplacedFile) {
  ScratchDir dir;
  const std::string path = dir.File("m.safetensors");
  auto tensors = MixedTensors(4);
  WriteRaw(path, tensors);
  ReadWholeFile(path);
  DLManagedTensorVersioned* v = nullptr;
  {
    auto got = Load(path);
    ASSERT_OK(got);
    ASSERT_EQ(got->files()[0].mode, IoMode::kMmap);
    auto r = got->ToDLPackVersioned(tensors[2].name);
    ASSERT_OK(r);
    v = *r;
  }  // The LoadedCheckpoint is gone; the export keeps the mapping.
  // A new file is written and renamed over the old name (how checkpoints are updated):
  // the view keeps the old inode's bytes.
  auto other = MixedTensors(4);
  for (auto& t : other) {
    if (!t.bytes.empty()) std::memset(t.bytes.data(), 0x5a, t.bytes.size());
  }
  WriteRaw(dir.File("new.safetensors"), other);
  ASSERT_EQ(::rename(dir.File("new.safetensors").c_str(), path.c_str()), 0);
  EXPECT_EQ(std::memcmp(v->dl_tensor.data, tensors[2].bytes.data(), tensors[2].bytes.size()), 0);
  v->deleter(v);
  auto again = Load(path);
  ASSERT_OK(again);
  ExpectSameAsFile(ByName(other), *again, "the new file");
}

// Fault injection: wraps the real engine to fail or to change the file.
class FaultEngine : public ReadEngine {
 public:
  FaultEngine(std::unique_ptr<ReadEngine> inner, std::function<Status(size_t)> before_op)
      : ReadEngine(inner->files()), inner_(std::move(inner)), before_op_(std::move(before_op)) {}
  Status Run(std::span<const ReadOp> ops, ReadProgress* progress) override {
    // Run ops one at a time so the fault lands between reads.
    for (size_t i = 0; i < ops.size(); ++i) {
      Status st = before_op_(i);
      if (!st.ok()) return InFileOf(ops[i], st);
      TL_RETURN_IF_ERROR(inner_->Run(ops.subspan(i, 1), progress));
    }
    return Status::Ok();
  }

 private:
  std::unique_ptr<ReadEngine> inner_;
  std::function<Status(size_t)> before_op_;
};

class LoaderFaultTest : public ::testing::TestWithParam<IoMode> {
 protected:
  void SetUp() override {
    path_ = dir_.File("m.safetensors");
    WriteRaw(path_, MixedTensors(9), 2);
  }
  Result<LoadedCheckpoint> LoadWithFault(std::function<Status(size_t)> before_op) {
    auto ckpt = Checkpoint::Open(path_);
    if (!ckpt.ok()) return ckpt.status();
    LoadOptions opts;
    opts.mode = GetParam();
    opts.block_size = 4096;
    return LoadWithEngineWrapper(*ckpt, opts, [&](std::unique_ptr<ReadEngine> e) {
      return std::make_unique<FaultEngine>(std::move(e), before_op);
    });
  }
  ScratchDir dir_;
  std::string path_;
};

TEST_P(LoaderFaultTest, ReadErrorFailsTheLoad) {
  auto got = LoadWithFault(
      [](size_t i) { return i == 0 ? IOError("read: Input/output error") : Status::Ok(); });
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kIOError);
  EXPECT_THAT(got.status().message(), HasSubstr(path_));
  EXPECT_THAT(got.status().message(), HasSubstr("Input/output error"));
}

TEST_P(LoaderFaultTest, FileTruncatedDuringTheLoad) {
  auto got = LoadWithFault([&](size_t i) {
    if (i == 0) {
      EXPECT_EQ(::truncate(path_.c_str(), 100), 0);
    }
    return Status::Ok();
  });
  ASSERT_FALSE(got.ok());
  EXPECT_THAT(got.status().message(), HasSubstr(path_));
}

TEST_P(LoaderFaultTest, FileReplacedDuringTheLoad) {
  auto got = LoadWithFault([&](size_t i) {
    if (i == 0) {
      std::string other = dir_.File("other.safetensors");
      WriteRaw(other, MixedTensors(9), 2);
      EXPECT_EQ(::rename(other.c_str(), path_.c_str()), 0);
    }
    return Status::Ok();
  });
  ASSERT_FALSE(got.ok());
  EXPECT_THAT(got.status().message(), HasSubstr("replaced"));
}

TEST_P(LoaderFaultTest, FileModifiedAfterItsHeaderWasRead) {
  auto ckpt = Checkpoint::Open(path_);
  ASSERT_OK(ckpt);
  ASSERT_EQ(::truncate(path_.c_str(), 200), 0);
  LoadOptions opts;
  opts.mode = GetParam();
  auto got = Load(*ckpt, opts);
  ASSERT_FALSE(got.ok());
  EXPECT_THAT(got.status().message(), HasSubstr("changed after its header was read"));
}

TEST_P(LoaderFaultTest, SameSizeFileSwappedInAfterTheHeaderWasRead) {
  auto ckpt = Checkpoint::Open(path_);
  ASSERT_OK(ckpt);
  // Same layout and size, other bytes: only the file's identity tells.
  const std::string other = dir_.File("other.safetensors");
  WriteRaw(other, MixedTensors(10), 2);
  ASSERT_EQ(::rename(other.c_str(), path_.c_str()), 0);
  LoadOptions opts;
  opts.mode = GetParam();
  auto got = Load(*ckpt, opts);
  ASSERT_FALSE(got.ok());
  EXPECT_THAT(got.status().message(), HasSubstr("modified or replaced after its header was read"));
}

// One verdict on a short read, whichever engine read it (buffered: the
// thread pool; direct: io_uring and its bounce reads): the file emptied
// before the first read, so that read itself comes back short.
TEST_P(LoaderFaultTest, AFileCutShortDuringTheLoadIsAShortReadOnEveryEngine) {
  if (GetParam() == IoMode::kMmap) GTEST_SKIP() << "views are not read (a cut file faults them)";
  auto got = LoadWithFault([&](size_t i) {
    if (i == 0) {
      EXPECT_EQ(::truncate(path_.c_str(), 0), 0);
    }
    return Status::Ok();
  });
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kIOError) << got.status().ToString();
  EXPECT_THAT(got.status().message(), HasSubstr(path_));
  EXPECT_THAT(got.status().message(), HasSubstr("short read"));
}

INSTANTIATE_TEST_SUITE_P(Modes, LoaderFaultTest,
                         ::testing::Values(IoMode::kBuffered, IoMode::kDirect, IoMode::kMmap));

// Above 64 MiB the arenas are faulted in by helper threads while the reads
// run; however many there are (or none), the bytes are the file's, and a read
// error stops them before the arenas go.
TEST(LoaderTest, FaultThreadsNeverChangeTheBytes) {
  ScratchDir dir;
  const std::string path = dir.File("big.safetensors");
  std::vector<RawTensor> tensors;
  for (uint32_t i = 0; i < 3; ++i) {
    tensors.push_back(
        Random("t" + std::to_string(i), Dtype::kBF16, {5, 1u << 22}, 40 + i));  // 40 MiB.
  }
  tensors.push_back(Random("odd", Dtype::kU8, {4097}, 7));
  WriteRaw(path, tensors, 3);
  std::map<std::string, RawTensor> want;
  for (auto& t : tensors) want[t.name] = t;
  auto ckpt = Checkpoint::Open(path);
  ASSERT_OK(ckpt);
  for (IoMode m : {IoMode::kBuffered, IoMode::kDirect}) {
    for (int ft : {-1, 1, 2, 5}) {
      LoadOptions opts;
      opts.mode = m;
      opts.fault_threads = ft;
      opts.block_size = 1 << 20;
      auto got = Load(*ckpt, opts);
      const std::string what = std::string(IoModeName(m)) + " fault_threads=" + std::to_string(ft);
      ASSERT_OK(got) << what;
      ExpectSameAsFile(want, *got, what);
    }
    LoadOptions opts;
    opts.mode = m;
    opts.fault_threads = 2;
    opts.block_size = 1 << 20;
    auto failed = LoadWithEngineWrapper(*ckpt, opts, [](std::unique_ptr<ReadEngine> e) {
      return std::make_unique<FaultEngine>(std::move(e), [](size_t i) {
        return i == 7 ? IOError("read: Input/output error") : Status::Ok();
      });
    });
    ASSERT_FALSE(failed.ok());
    EXPECT_THAT(failed.status().message(), HasSubstr("Input/output error"));
  }
}

// CheckpointBuilder, the one builder of results: tensors come out in name
// order with their owners, totals and reports; a result taken apart and
// rebuilt keeps what it had.
TEST(CheckpointBuilderTest, FinishSortsByNameAndKeepsOwnersReportsAndTotals) {
  auto buffer = HostBuffer::Allocate(64);
  ASSERT_OK(buffer);
  std::shared_ptr<Buffer> b = *buffer;
  auto tensor = [&](std::string name, uint64_t bytes, uint64_t offset) {
    LoadedTensor t;
    t.name = std::move(name);
    t.dtype = Dtype::kU8;
    t.shape = {static_cast<int64_t>(bytes)};
    SetRowMajorStrides(&t);
    t.data = b->data() + offset;
    t.nbytes = bytes;
    return t;
  };
  CheckpointBuilder builder;
  builder.Add(tensor("z", 8, 0), b);
  builder.Add(tensor("a", 16, 8), b);
  builder.Add(tensor("m", 4, 24), b);
  FileReport report;
  report.path = "f";
  builder.files().push_back(report);
  builder.device_plan().device_bytes = 7;
  builder.RemoveIf(
      [](const LoadedTensor& t, const std::shared_ptr<Buffer>&) { return t.name == "m"; });
  LoadedCheckpoint out = std::move(builder).Finish(1.5);
  ASSERT_EQ(out.tensors().size(), 2u);
  EXPECT_EQ(out.tensors()[0].name, "a");
  EXPECT_EQ(out.tensors()[1].name, "z");
  EXPECT_EQ(out.tensors()[0].strides, std::vector<int64_t>{1});
  EXPECT_EQ(out.total_bytes(), 24u);
  EXPECT_EQ(out.seconds(), 1.5);
  EXPECT_EQ(out.device_plan().device_bytes, 7u);
  ASSERT_EQ(out.files().size(), 1u);
  EXPECT_EQ(CheckpointBuilder::Owners(out).size(), 2u);
  EXPECT_EQ(CheckpointBuilder::Owners(out)[0], b);

  // Taken apart and rebuilt: the same tensors, at the same addresses (already in order).
  const LoadedTensor* first = &out.tensors()[0];
  const void* data = first->data;
  CheckpointBuilder again(std::move(out));
  EXPECT_EQ(again.tensors().size(), 2u);
  again.Add(tensor("b", 4, 40), b);
  LoadedCheckpoint rebuilt = std::move(again).Finish(2.0);
  ASSERT_EQ(rebuilt.tensors().size(), 3u);
  EXPECT_EQ(rebuilt.tensors()[1].name, "b");
  EXPECT_EQ(rebuilt.tensors()[0].data, data);
  EXPECT_EQ(rebuilt.total_bytes(), 28u);
  ASSERT_NE(rebuilt.Find("z"), nullptr);
}

// PopulateAhead: fresh memory and views of a file both have their pages
// present when Finish returns; StopFresh skips only the fresh steps not yet
// taken, never a view's; the destructor alone stops and joins.
namespace {

// Pages of [p, p + n) with a page table entry (/proc/self/pagemap, bit 63).
size_t PresentPages(const std::byte* p, size_t n) {
  const long page = ::sysconf(_SC_PAGESIZE);
  const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  std::vector<uint64_t> entries(n / page);
  const off_t at = static_cast<off_t>(reinterpret_cast<uintptr_t>(p) / page * sizeof(uint64_t));
  const ssize_t got = ::pread(fd, entries.data(), entries.size() * sizeof(uint64_t), at);
  ::close(fd);
  size_t present = 0;
  for (ssize_t i = 0; i < got / static_cast<ssize_t>(sizeof(uint64_t)); ++i)
    present += entries[i] >> 63;
  return present;
}

}  // namespace

TEST(PopulateAheadTest, FreshMemoryAndViewsArePresentAfterFinish) {
  const long page = ::sysconf(_SC_PAGESIZE);
  constexpr size_t kFresh = 48u << 20, kView = 40u << 20;
  ScratchDir dir;
  const std::string path = dir.File("view.bin");
  {
    std::ofstream f(path, std::ios::binary);
    std::vector<char> block(1 << 20, 'x');
    for (size_t i = 0; i < kView >> 20; ++i) f.write(block.data(), block.size());
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  void* view = ::mmap(nullptr, kView, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  ASSERT_NE(view, MAP_FAILED);
  void* fresh = ::mmap(nullptr, kFresh, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(fresh, MAP_FAILED);
  auto* f = static_cast<std::byte*>(fresh);
  auto* v = static_cast<std::byte*>(view);
  ASSERT_EQ(PresentPages(f, kFresh), 0u);
  ASSERT_EQ(PresentPages(v, kView), 0u);
  {
    PopulateAhead populate({{f, kFresh}, {v, kView, /*read=*/true}}, 3);
    populate.Finish();
  }
  EXPECT_EQ(PresentPages(f, kFresh), kFresh / page);
  EXPECT_EQ(PresentPages(v, kView), kView / page);
  ::munmap(fresh, kFresh);
  ::munmap(view, kView);

  // StopFresh before the threads get far: the views are still populated in full.
  const int fd2 = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd2, 0);
  view = ::mmap(nullptr, kView, PROT_READ, MAP_PRIVATE, fd2, 0);
  ::close(fd2);
  ASSERT_NE(view, MAP_FAILED);
  fresh = ::mmap(nullptr, kFresh, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(fresh, MAP_FAILED);
  f = static_cast<std::byte*>(fresh);
  v = static_cast<std::byte*>(view);
  {
    PopulateAhead populate({{f, kFresh}, {v, kView, /*read=*/true}}, 2);
    populate.StopFresh();
    populate.Finish();
  }
  EXPECT_EQ(PresentPages(v, kView), kView / page);
  EXPECT_LE(PresentPages(f, kFresh), kFresh / page);
  // Destroyed without Finish: stops and joins (no hang, no use after free).
  for (int i = 0; i < 20; ++i) {
    PopulateAhead populate({{f, kFresh}, {v, kView, /*read=*/true}}, 4);
  }
  ::munmap(fresh, kFresh);
  ::munmap(view, kView);
}

// ArenaPool: a buffer freed by one load's tensors is reused (grown in place
// when too small) by the next load, with the next file's bytes, never the old
// ones; held buffers are not reused; exports outlive the pool.
TEST(ArenaPoolTest, ReusesFreedBuffersForTheNextLoadWithTheNewBytes) {
  ScratchDir dir;
  const std::string a = dir.File("a.safetensors"), b = dir.File("b.safetensors"),
                    big = dir.File("big.safetensors");
  auto ta = MixedTensors(11), tb = MixedTensors(12);
  WriteRaw(a, ta);
  WriteRaw(b, tb, 3);
  std::vector<RawTensor> tbig = MixedTensors(13);
  tbig.push_back(Random("z.more", Dtype::kF32, {1u << 20}, 5));  // 4 MiB more than the others.
  WriteRaw(big, tbig);
  for (IoMode m : {IoMode::kBuffered, IoMode::kDirect}) {
    SCOPED_TRACE(std::string(IoModeName(m)));
    auto pool = std::make_shared<ArenaPool>();
    LoadOptions opts;
    opts.mode = m;
    opts.arena_pool = pool;
    {
      auto got = Load(a, opts);
      ASSERT_OK(got);
      ExpectSameAsFile(ByName(ta), *got, "a");
      EXPECT_EQ(pool->stats().fresh, 1u);
      EXPECT_EQ(pool->stats().free, 0u);  // Held by the tensors.
    }
    EXPECT_EQ(pool->stats().free, 1u);  // Back in the pool, not to the system.
    {
      auto got = Load(b, opts);  // About the same size: the same buffer.
      ASSERT_OK(got);
      ExpectSameAsFile(ByName(tb), *got, "b");
      EXPECT_EQ(pool->stats().reused, 1u);
      EXPECT_EQ(pool->stats().fresh, 1u);
      auto held = Load(a, opts);  // The other is held: a fresh one.
      ASSERT_OK(held);
      ExpectSameAsFile(ByName(ta), *held, "a again");
      EXPECT_EQ(pool->stats().fresh, 2u);
    }
    EXPECT_EQ(pool->stats().free, 2u);
    {
      auto got = Load(big, opts);  // Larger than either: the largest, grown.
      ASSERT_OK(got);
      ExpectSameAsFile(ByName(tbig), *got, "big");
      EXPECT_EQ(pool->stats().reused, 2u);
      EXPECT_EQ(pool->stats().fresh, 2u);
      EXPECT_EQ(pool->stats().free, 1u);
    }
    pool->Trim();
    EXPECT_EQ(pool->stats().free, 0u);
    EXPECT_EQ(pool->stats().free_bytes, 0u);
  }
}

TEST(ArenaPoolTest, ExportsOutliveThePoolAndAFullPoolFreesTheRest) {
  ScratchDir dir;
  const std::string a = dir.File("a.safetensors");
  auto ta = MixedTensors(21);
  WriteRaw(a, ta);
  DLManagedTensorVersioned* v = nullptr;
  {
    auto pool = std::make_shared<ArenaPool>(/*max_free=*/1);
    LoadOptions opts;
    opts.mode = IoMode::kDirect;
    opts.arena_pool = pool;
    auto one = Load(a, opts);
    auto two = Load(a, opts);
    ASSERT_OK(one);
    ASSERT_OK(two);
    auto r = one->ToDLPackVersioned("g.big");
    ASSERT_OK(r);
    v = *r;
    one = InternalError("dropped");
    two = InternalError("dropped");
    EXPECT_EQ(pool->stats().free, 1u);  // One kept (max_free), the other freed.
  }                                     // The pool is gone; the export still holds its buffer.
  EXPECT_EQ(std::memcmp(v->dl_tensor.data, ta[6].bytes.data(), ta[6].bytes.size()), 0);
  v->deleter(v);  // Freed to the system (ASan checks).
}

TEST(ArenaPoolTest, BuffersAreGrownAndShrunkKeepingTheirPages) {
  auto pool = std::make_shared<ArenaPool>();
  const std::byte* p = nullptr;
  {
    auto r = TakeArena(pool, 3u << 20);
    ASSERT_OK(r);
    std::memset((*r)->data(), 0x5a, (*r)->size());
    (*r)->set_touched((*r)->size());
    p = (*r)->data();
  }
  {
    auto r = TakeArena(pool, 1u << 20);  // Smaller: the same memory, still touched.
    ASSERT_OK(r);
    EXPECT_EQ((*r)->data(), p);
    EXPECT_EQ((*r)->size(), 1u << 20);
    EXPECT_EQ((*r)->touched(), 1u << 20);
    EXPECT_EQ(static_cast<unsigned char>((*r)->data()[12345]), 0x5au);
  }
  {
    auto r = TakeArena(pool, 9u << 20);  // Larger: grown, the old bytes kept.
    ASSERT_OK(r);
    EXPECT_EQ((*r)->size(), 9u << 20);
    EXPECT_EQ(static_cast<unsigned char>((*r)->data()[(1u << 20) - 1]), 0x5au);
    std::memset((*r)->data(), 1, (*r)->size());  // All of it is writable.
  }
  auto none = TakeArena(nullptr, 4096);  // No pool: a plain buffer.
  ASSERT_OK(none);
  EXPECT_EQ((*none)->touched(), 0u);
  EXPECT_EQ(pool->stats().fresh, 1u);
  EXPECT_EQ(pool->stats().reused, 2u);
}

// LoadOptions::on_tensor: every tensor exactly once, with the file's bytes at
// the time of the call, while later reads are still to come; its DLPack export
// outlives the load; an error from it, or from a read, fails the load.
struct Handed {
  std::mutex mu;
  std::map<std::string, std::string> bytes;  // name -> bytes seen in the call
  std::map<std::string, DLManagedTensorVersioned*> exports;
  std::atomic<int> calls{0};
  std::condition_variable called;  // Notified after each call.
  ~Handed() {
    for (auto& [name, e] : exports) e->deleter(e);
  }
  TensorCallback Callback(bool export_all = false) {
    return [this, export_all](const StreamedTensor& t) -> Status {
      std::lock_guard<std::mutex> lock(mu);
      const LoadedTensor& lt = t.tensor();
      EXPECT_EQ(bytes.count(lt.name), 0u) << lt.name << " handed out twice";
      bytes[lt.name].assign(static_cast<const char*>(lt.data), lt.nbytes);
      if (export_all) {
        auto e = t.ToDLPackVersioned();
        if (!e.ok()) return e.status();
        exports[lt.name] = *e;
      }
      ++calls;
      called.notify_all();
      return Status::Ok();
    };
  }
  // Waits until `n` calls were made, from another thread than the callback's;
  // false after `timeout`, a watchdog only.
  bool WaitForCalls(int n, std::chrono::seconds timeout) {
    std::unique_lock<std::mutex> lock(mu);
    return called.wait_for(lock, timeout, [&] { return calls.load() >= n; });
  }
};

TEST(OnTensorTest, EveryModeAndEngineHandsOutEveryTensorOnceWithItsBytes) {
  ScratchDir dir;
  const std::string path = dir.File("m.safetensors");
  auto tensors = MixedTensors(31);
  WriteRaw(path, tensors, 3);
  const auto want = ByName(tensors);
  for (const Combo& c : AllCombos()) {
    SCOPED_TRACE(ComboName(c));
    Handed h;
    LoadOptions opts;
    opts.mode = c.mode;
    opts.engine = c.engine;
    opts.block_size = c.block;
    opts.on_tensor = h.Callback(/*export_all=*/true);
    {
      auto got = Load(path, opts);
      ASSERT_OK(got);
      EXPECT_EQ(h.calls.load(), static_cast<int>(got->tensors().size()));
    }  // The exports outlive the LoadedCheckpoint.
    ASSERT_EQ(h.bytes.size(), want.size());
    for (const auto& [name, t] : want) {
      EXPECT_EQ(h.bytes[name],
                std::string(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size()))
          << name;
    }
    ASSERT_EQ(h.exports.size(), want.size());
    for (const auto& [name, e] : h.exports) {
      const auto& w = want.at(name).bytes;
      if (!w.empty()) {
        EXPECT_EQ(std::memcmp(e->dl_tensor.data, w.data(), w.size()), 0) << name;
      }
    }
  }
}

TEST(OnTensorTest, TensorsComeOutWhileLaterReadsAreStillToCome) {
  ScratchDir dir;
  const std::string path = dir.File("m.safetensors");
  std::vector<RawTensor> tensors;
  for (uint32_t i = 0; i < 6; ++i)
    tensors.push_back(Random("t" + std::to_string(i), Dtype::kF32, {1u << 18}, 50 + i));
  WriteRaw(path, tensors);
  auto ckpt = Checkpoint::Open(path);
  ASSERT_OK(ckpt);
  for (IoMode m : {IoMode::kBuffered, IoMode::kDirect}) {
    SCOPED_TRACE(std::string(IoModeName(m)));
    Handed h;
    LoadOptions opts;
    opts.mode = m;
    opts.block_size = 1 << 20;  // One tensor per read.
    opts.on_tensor = h.Callback();
    std::atomic<int> seen_before_last{-1};
    auto got = LoadWithEngineWrapper(*ckpt, opts, [&](std::unique_ptr<ReadEngine> e) {
      return std::make_unique<FaultEngine>(std::move(e), [&, n = 0](size_t i) mutable {
        ++n;
        if (i == 5) {  // The last tensor's read: the first ones were handed out already.
          // Their callbacks run on another thread: this read waits for them. A
          // loader that held them back until every read was done would never
          // make them; the 60 s are a watchdog, not a measure.
          h.WaitForCalls(5, std::chrono::seconds(60));
          seen_before_last = h.calls.load();
        }
        return Status::Ok();
      });
    });
    ASSERT_OK(got);
    EXPECT_GE(seen_before_last.load(), 5);
    EXPECT_EQ(h.calls.load(), 6);
  }
}

TEST(OnTensorTest, AnErrorFromTheCallbackOrAReadFailsTheLoad) {
  ScratchDir dir;
  const std::string path = dir.File("m.safetensors");
  WriteRaw(path, MixedTensors(32));
  auto ckpt = Checkpoint::Open(path);
  ASSERT_OK(ckpt);
  for (IoMode m : {IoMode::kBuffered, IoMode::kDirect, IoMode::kMmap}) {
    SCOPED_TRACE(std::string(IoModeName(m)));
    std::atomic<int> calls{0};
    LoadOptions opts;
    opts.mode = m;
    opts.on_tensor = [&](const StreamedTensor&) -> Status {
      return ++calls == 2 ? UnavailableError("the consumer stopped") : Status::Ok();
    };
    auto got = Load(*ckpt, opts);
    ASSERT_FALSE(got.ok());
    EXPECT_THAT(got.status().message(), HasSubstr("the consumer stopped"));
    EXPECT_EQ(calls.load(), 2);  // Nothing after the error.
  }
  LoadOptions opts;
  opts.mode = IoMode::kDirect;
  opts.block_size = 4096;
  Handed h;
  opts.on_tensor = h.Callback();
  auto got = LoadWithEngineWrapper(*ckpt, opts, [](std::unique_ptr<ReadEngine> e) {
    return std::make_unique<FaultEngine>(std::move(e), [](size_t i) {
      return i == 3 ? IOError("read: Input/output error") : Status::Ok();
    });
  });
  ASSERT_FALSE(got.ok());
  EXPECT_THAT(got.status().message(), HasSubstr("Input/output error"));
}

TEST(OnTensorTest, ConvertingLoadsHandOutEveryTensorAtTheEnd) {
  ScratchDir dir;
  const std::string path = dir.File("m.safetensors");
  WriteRaw(path, {Random("a", Dtype::kBF16, {64, 8}, 1), Random("b", Dtype::kF16, {100}, 2),
                  Random("c", Dtype::kI32, {7}, 3)});
  Handed h;
  LoadOptions opts;
  opts.dtype = Dtype::kF32;
  opts.on_tensor = h.Callback(/*export_all=*/true);
  auto got = Load(path, opts);
  ASSERT_OK(got);
  ASSERT_EQ(h.calls.load(), 3);
  for (const LoadedTensor& t : got->tensors()) {
    EXPECT_EQ(h.bytes[t.name], std::string(static_cast<const char*>(t.data), t.nbytes)) << t.name;
  }
}

TEST(OnTensorTest, LoadersThatHandOutNoTensorsWhileTheyLoadRefuseIt) {
  ScratchDir dir;
  const std::string path = dir.File("m.safetensors");
  WriteRaw(path, {Random("a", Dtype::kF32, {16}, 1), Random("b", Dtype::kF32, {16}, 2)});
  auto ckpt = Checkpoint::Open(path);
  ASSERT_OK(ckpt);
  LoadOptions opts;
  opts.on_tensor = [](const StreamedTensor&) { return Status::Ok(); };
  auto s = LayerStreamer::Open(*ckpt, {{"a"}, {"b"}}, 1 << 20, opts);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("on_tensor"));
}

TEST(LoaderTest, MissingFileAndNoPermission) {
  auto got = Load("/nonexistent/model.safetensors");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(got.status().message(), HasSubstr("/nonexistent/model.safetensors"));

  ScratchDir dir;
  const std::string path = dir.File("m.safetensors");
  WriteRaw(path, MixedTensors(1));
  auto ckpt = Checkpoint::Open(path);
  ASSERT_OK(ckpt);
  ASSERT_EQ(::chmod(path.c_str(), 0), 0);
  if (::geteuid() == 0) GTEST_SKIP() << "running as root: permission bits are not enforced";
  auto denied = Load(*ckpt);
  ASSERT_FALSE(denied.ok());
  EXPECT_EQ(denied.status().code(), StatusCode::kPermissionDenied);
  EXPECT_THAT(denied.status().message(), HasSubstr(path));
}

TEST(LoaderTest, DirectOnAFilesystemWithoutODirectFallsBack) {
  if (::access("/dev/shm", W_OK) != 0) GTEST_SKIP() << "no writable /dev/shm";
  ScratchDir shm("tl_test", "/dev/shm/");
  const std::string path = shm.File("m.safetensors");
  auto tensors = MixedTensors(2);
  WriteRaw(path, tensors, 1);
  LoadOptions opts;
  opts.mode = IoMode::kDirect;
  auto got = Load(path, opts);
  ASSERT_OK(got);
  std::map<std::string, RawTensor> want;
  for (auto& t : tensors) want[t.name] = t;
  ExpectSameAsFile(want, *got, "shm");
  if (got->files()[0].mode == IoMode::kBuffered) {
    EXPECT_THAT(got->files()[0].reason, HasSubstr("O_DIRECT"));
  }
}

TEST(LoaderTest, OpenFileTakesAnyNameAsOneFile) {
  ScratchDir dir;
  const std::string path = dir.File("weights.json");
  auto tensors = MixedTensors(11);
  WriteRaw(path, tensors);
  EXPECT_FALSE(Checkpoint::Open(path).ok()) << "a .json path is read as an index";
  auto ckpt = Checkpoint::OpenFile(path);
  ASSERT_OK(ckpt);
  auto got = Load(*ckpt);
  ASSERT_OK(got);
  std::map<std::string, RawTensor> want;
  for (auto& t : tensors) want[t.name] = t;
  ExpectSameAsFile(want, *got, "json-named");
}

TEST(LoaderTest, ParseModeAndEngineNames) {
  EXPECT_EQ(*ParseIoMode("direct"), IoMode::kDirect);
  EXPECT_EQ(*ParseIoEngine("uring"), IoEngine::kUring);
  EXPECT_FALSE(ParseIoMode("fast").ok());
  EXPECT_FALSE(ParseIoEngine("").ok());
}

}  // namespace
}  // namespace tensorlift
