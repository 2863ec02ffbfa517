// The striped store's scheduling, proven by construction with fake sources
// that block until the test releases them (no timing): a source fetches one
// piece alone until it is measured, so a slow source cannot hold more of the
// load than its probe while the others deliver the rest.
#include "sources/striped_store.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../common/assert_ok.h"
#include "../common/scratch_dir.h"
#include "../load/test_files.h"
#include "common/posix_file.h"
#include "io/page_cache.h"
#include "remote/manifest.h"
#include "sources/striped_plan.h"
#include "sources/striped_sources.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/checksum.h"

namespace tensorlift::sources {
namespace {

using test::ScratchDir;

// Fills pieces from the shards' bytes held in memory; with `block`, its first
// fetch waits until Release().
class FakeSource final : public Source {
 public:
  FakeSource(std::string name, const std::vector<std::string>& files, int workers, bool block)
      : Source(std::move(name)), files_(files), block_(block) {
    this->workers = workers;
    take = 4;
  }
  Status Fetch(const std::vector<const Piece*>& pieces) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      ++fetches_;
      fetched_pieces_ += pieces.size();
      for (const Piece* p : pieces) fetched_.emplace_back(p->file_offset, p->bytes);
      cv_.notify_all();
      if (block_) cv_.wait(lock, [&] { return released_; });
    }
    for (const Piece* p : pieces)
      std::memcpy(p->dst, files_[p->shard].data() + p->file_offset, p->bytes);
    return Status::Ok();
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }
  // As a relay: it holds only the chunks named (of every tensor), until
  // HoldAll; the store is told when that changes.
  void HoldOnly(std::vector<int64_t> chunks) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      partial_ = true;
      held_ = std::move(chunks);
    }
    if (changed) changed();
  }
  bool Holds(const Piece& p) const override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!partial_) return true;
    for (const Unit& u : p.units) {
      if (std::find(held_.begin(), held_.end(), u.chunk) == held_.end()) return false;
    }
    return true;
  }
  // Waits until fetches of `n` pieces have begun (true), or gives up after a
  // minute (false: a safety net, not a timing).
  bool WaitForPieces(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::minutes(1), [&] { return fetched_pieces_ >= n; });
  }
  int fetches() {
    std::lock_guard<std::mutex> lock(mu_);
    return fetches_;
  }
  size_t fetched_pieces() {
    std::lock_guard<std::mutex> lock(mu_);
    return fetched_pieces_;
  }
  // How many of the pieces it fetched were file bytes [offset, +bytes).
  int FetchedTimes(uint64_t offset, uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(
        std::count(fetched_.begin(), fetched_.end(), std::make_pair(offset, bytes)));
  }

 private:
  const std::vector<std::string>& files_;
  const bool block_;
  mutable std::mutex mu_;
  bool partial_ = false;
  std::vector<int64_t> held_;
  std::condition_variable cv_;
  int fetches_ = 0;
  size_t fetched_pieces_ = 0;
  std::vector<std::pair<uint64_t, uint64_t>> fetched_;
  bool released_ = false;
};

// `bytes` (rounded up to whole 4 KiB blocks) at a 4 KiB-aligned address.
std::unique_ptr<std::byte, decltype(&std::free)> AlignedBlocks(uint64_t bytes) {
  return {static_cast<std::byte*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096)),
          &std::free};
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(StripedStoreTest, ASlowSourceHoldsOnlyItsProbeWhileTheOthersDeliverTheRest) {
  ScratchDir dir("tl_striped_store");
  const std::string path = dir.File("m.safetensors");
  std::vector<testing::RawTensor> tensors;
  for (int i = 0; i < 8; ++i)
    tensors.push_back(testing::Random("t" + std::to_string(i), Dtype::kU8, {256 << 10}, i + 1));
  testing::WriteRaw(path, tensors);
  auto ckpt = Checkpoint::Open(path);
  ASSERT_OK(ckpt);
  const std::vector<std::string> files = {ReadAll(path)};

  auto slow = std::make_unique<FakeSource>("slow", files, 4, /*block=*/true);
  auto fast = std::make_unique<FakeSource>("fast", files, 1, /*block=*/false);
  FakeSource* slow_p = slow.get();
  FakeSource* fast_p = fast.get();
  std::vector<std::unique_ptr<Source>> sources;
  sources.push_back(std::move(slow));  // First: its first worker is dealt a piece first.
  sources.push_back(std::move(fast));
  StripedStore::Options options;
  options.piece_bytes = 64 << 10;
  StripedStore store(LayOut(*ckpt), std::move(sources), options);

  const Checkpoint::Shard& shard = ckpt->shards()[0];
  const uint64_t begin = shard.header.data_offset();
  const uint64_t length = shard.identity.size - begin;
  std::vector<std::byte> into(length);
  const CheckpointStore::Range range{&shard.path, begin, length, into.data()};
  Status read;
  std::thread reader([&] { read = store.ReadRanges({&range, 1}, {}); });
  ASSERT_TRUE(slow_p->WaitForPieces(1));
  // The fast source delivers everything but the slow one's probe: its other
  // three workers wait for the probe to measure it, and take nothing.
  // Cut where the file's offset is a multiple of 64 KiB: 33 (the data's
  // first and last pieces are partial).
  const size_t pieces = store.pieces();
  ASSERT_EQ(pieces, length / options.piece_bytes + 1);
  ASSERT_TRUE(fast_p->WaitForPieces(pieces - 1));
  EXPECT_EQ(fast_p->fetched_pieces(), pieces - 1);
  EXPECT_EQ(slow_p->fetches(), 1);
  EXPECT_EQ(slow_p->fetched_pieces(), 1u);
  slow_p->Release();
  reader.join();
  ASSERT_OK(read);
  EXPECT_EQ(std::memcmp(into.data(), files[0].data() + begin, length), 0);
  EXPECT_EQ(slow_p->fetches(), 1);
}

// Unchecked pieces are cut on a grid of the file's offsets (multiples of
// piece_bytes), whatever the tensors' bounds: only the data's own ends are
// not aligned for O_DIRECT, and the pieces cover the read exactly.
TEST(StripedStoreTest, PiecesAreCutWhereTheFileOffsetIsAMultipleOfThePieceSize) {
  ScratchDir dir("tl_striped_cut");
  const std::string path = dir.File("m.safetensors");
  std::vector<testing::RawTensor> tensors;
  for (int i = 0; i < 5; ++i)  // Sizes that are no multiple of 4 KiB.
    tensors.push_back(testing::Random("t" + std::to_string(i), Dtype::kU8, {100000 + 777u * i}, i));
  testing::WriteRaw(path, tensors);
  auto ckpt = Checkpoint::Open(path);
  ASSERT_OK(ckpt);
  const Layout layout = LayOut(*ckpt);
  const Checkpoint::Shard& shard = ckpt->shards()[0];
  const uint64_t begin = shard.header.data_offset();
  const uint64_t length = shard.identity.size - begin;
  ASSERT_NE(begin % 4096, 0u);
  std::vector<std::byte> into(length);
  const CheckpointStore::Range range{&shard.path, begin, length, into.data()};
  constexpr uint64_t kPiece = 64 << 10;
  auto cut = CutPieces(layout, {&range, 1}, kPiece);
  ASSERT_OK(cut);
  ASSERT_EQ(cut->pieces.size(), (begin + length - 1) / kPiece - begin / kPiece + 1);
  uint64_t at = begin;
  for (const Piece& p : cut->pieces) {
    EXPECT_EQ(p.file_offset, at);
    EXPECT_EQ(p.dst, into.data() + (at - begin));
    EXPECT_LE(p.bytes, kPiece);
    at += p.bytes;
    if (at < begin + length) {
      EXPECT_EQ(at % kPiece, 0u) << "a piece ends at " << at;
    }
  }
  EXPECT_EQ(at, begin + length);
}

// The disk source reads through the loader's engines: whole blocks with
// O_DIRECT, unaligned ends and destinations through bounce blocks, every
// byte exact; a file cut short under it is the loads' one verdict on a short
// read (IOError "short read", naming the file).
TEST(StripedStoreTest, TheDiskSourceReadsEveryPieceExactlyAndAShortFileIsTheOneVerdict) {
  ScratchDir dir("tl_striped_disk");
  const std::string path = dir.File("m.safetensors");
  std::vector<testing::RawTensor> tensors;
  for (int i = 0; i < 4; ++i)
    tensors.push_back(testing::Random("t" + std::to_string(i), Dtype::kU8, {90000 + 999u * i}, i));
  testing::WriteRaw(path, tensors);
  auto ckpt = Checkpoint::Open(path);
  ASSERT_OK(ckpt);
  const std::string file = ReadAll(path);
  const Layout layout = LayOut(*ckpt);
  const Checkpoint::Shard& shard = ckpt->shards()[0];
  const uint64_t begin = shard.header.data_offset();
  const uint64_t length = shard.identity.size - begin;
  ASSERT_NE(begin % 4096, 0u);
  auto disk = DiskSource::Open(*ckpt, /*workers=*/2, /*take=*/1);
  ASSERT_OK(disk);

  // Congruent with the file modulo 4 KiB (as the loader places a striped
  // store's tensors), and one byte off (every piece through a bounce block).
  for (uint64_t skew : {uint64_t{0}, uint64_t{1}}) {
    SCOPED_TRACE(skew);
    auto buf = AlignedBlocks(length + 8192);
    std::byte* into = buf.get() + begin % 4096 + skew;
    const CheckpointStore::Range range{&shard.path, begin, length, into};
    auto cut = CutPieces(layout, {&range, 1}, 16 << 10);
    ASSERT_OK(cut);
    std::vector<const Piece*> pieces;
    for (const Piece& p : cut->pieces) pieces.push_back(&p);
    // And a piece inside one block, unaligned at both ends.
    Piece inside = cut->pieces[1];
    inside.file_offset += 5;
    inside.bytes = 100;
    inside.dst += 5;
    pieces.push_back(&inside);
    // And one of whole blocks between two unaligned ends (as a chunk of a
    // checked load is cut): its ends through bounce blocks.
    Piece ends = cut->pieces[2];
    ends.file_offset += 100;
    ends.bytes -= 300;
    ends.dst += 100;
    pieces.push_back(&ends);
    ASSERT_OK((*disk)->Fetch(pieces));
    EXPECT_EQ(std::memcmp(into, file.data() + begin, length), 0);
  }

  // Cold bytes with O_DIRECT leave the page cache as it was; a chunk fetched
  // whole for parts of it is read through it (the reads of its other parts
  // may fetch it again: from the page cache then, not the disk). (Where the
  // filesystem has O_DIRECT: on tmpfs every read is of the page cache.)
  if (PosixFile::OpenForRead(path, O_DIRECT).ok()) {
    auto f = PosixFile::OpenForRead(path);
    ASSERT_OK(f);
    ASSERT_EQ(::fdatasync(f->fd()), 0);
    ASSERT_EQ(::posix_fadvise(f->fd(), 0, 0, POSIX_FADV_DONTNEED), 0);
    auto buf = AlignedBlocks(length + 8192);
    std::byte* into = buf.get() + begin % 4096;
    const CheckpointStore::Range range{&shard.path, begin, length, into};
    auto cut = CutPieces(layout, {&range, 1}, 16 << 10);
    ASSERT_OK(cut);
    const Piece& middle = cut->pieces[2];  // Whole blocks, none shared with another piece.
    ASSERT_OK((*disk)->Fetch({&middle}));
    auto resident = ResidentFraction(f->fd(), middle.file_offset, middle.bytes);
    ASSERT_OK(resident);
    EXPECT_EQ(*resident, 0.0);
    // The same blocks as a chunk fetched whole, into a buffer congruent too.
    Piece whole = middle;
    auto chunk = AlignedBlocks(middle.bytes + 4096);
    whole.whole = std::shared_ptr<std::byte[]>(new std::byte[1]);  // Marks it as such.
    whole.dst = chunk.get() + middle.file_offset % 4096;
    ASSERT_OK((*disk)->Fetch({&whole}));
    EXPECT_EQ(std::memcmp(whole.dst, file.data() + middle.file_offset, middle.bytes), 0);
    resident = ResidentFraction(f->fd(), middle.file_offset, middle.bytes);
    ASSERT_OK(resident);
    EXPECT_EQ(*resident, 1.0);
  }

  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(begin + 1000)), 0);
  std::vector<std::byte> into(length + 4096);
  const CheckpointStore::Range range{&shard.path, begin, length, into.data()};
  auto cut = CutPieces(layout, {&range, 1}, 16 << 10);
  ASSERT_OK(cut);
  const Status st = (*disk)->Fetch({&cut->pieces.back()});
  EXPECT_EQ(st.code(), StatusCode::kIOError) << st.ToString();
  EXPECT_THAT(st.message(), ::testing::HasSubstr("short read"));
  EXPECT_THAT(st.message(), ::testing::HasSubstr(path));
}

// Two reads that each need part of one checked chunk (two blocks of the GPU
// pipeline, read at once): the chunk is fetched whole once, for the first,
// and the second's part is copied out of it when it lands; not fetched again.
TEST(StripedStoreTest, AChunkTwoReadsShareIsFetchedOnce) {
  ScratchDir dir("tl_striped_share");
  const std::string path = dir.File("m.safetensors");
  testing::WriteRaw(path, {testing::Random("w", Dtype::kU8, {256 << 10}, 7)});
  auto ckpt = Checkpoint::Open(path);
  ASSERT_OK(ckpt);
  const std::vector<std::string> files = {ReadAll(path)};
  constexpr uint64_t kChunk = 64 << 10;
  Layout layout = LayOut(*ckpt);
  LaidOut& t = layout.shards[0][0];
  remote::ManifestTensor served;  // The reference's entry: each chunk's XXH3.
  served.name = "w";
  for (uint64_t at = 0; at < t.nbytes; at += kChunk)
    served.chunk_xxh3.push_back(Xxh3_64(files[0].data() + t.file_offset + at, kChunk));
  t.checked_by = &served;
  layout.chunk_bytes = kChunk;
  const uint64_t chunk1 = t.file_offset + kChunk;

  auto source = std::make_unique<FakeSource>("only", files, 2, /*block=*/true);
  FakeSource* src = source.get();
  std::vector<std::unique_ptr<Source>> sources;
  sources.push_back(std::move(source));
  StripedStore store(std::move(layout), std::move(sources), StripedStore::Options{});
  // Read A: chunk 0 and the first half of chunk 1; read B: the rest.
  const std::string& file = ckpt->shards()[0].path;
  std::vector<std::byte> into(t.nbytes);
  const uint64_t split = kChunk + kChunk / 2;
  const CheckpointStore::Range a{&file, t.file_offset, split, into.data()};
  const CheckpointStore::Range b{&file, t.file_offset + split, t.nbytes - split,
                                 into.data() + split};
  Status read_a, read_b;
  std::thread ta([&] { read_a = store.ReadRanges({&a, 1}, {}); });
  ASSERT_TRUE(src->WaitForPieces(1));  // A's pieces are cut and queued (its fetches wait).
  std::thread tb([&] { read_b = store.ReadRanges({&b, 1}, {}); });
  // B's pieces are cut too before anything lands (A: chunk 0, chunk 1 whole
  // for its part; B: its part of chunk 1, chunks 2 and 3 in one piece).
  for (int i = 0; i < 60000 && store.pieces() < 4; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(store.pieces(), 4u);
  src->Release();
  ta.join();
  tb.join();
  ASSERT_OK(read_a);
  ASSERT_OK(read_b);
  EXPECT_EQ(std::memcmp(into.data(), files[0].data() + t.file_offset, t.nbytes), 0);
  EXPECT_EQ(src->FetchedTimes(chunk1, kChunk), 1);
}

// A relay holds only what it has received: it takes the pieces it holds and
// leaves the others, takes more once it holds more, and may join while the
// read goes on (found after the load began). Here the root is busy with its
// probe (chunk 0, held until released) the whole time: a relay added
// holding chunk 2 fetches it, then chunks 1 and 3 once it holds them.
TEST(StripedStoreTest, ARelayTakesOnlyThePiecesItHoldsAndMayJoinDuringARead) {
  ScratchDir dir("tl_striped_relay");
  const std::string path = dir.File("m.safetensors");
  testing::WriteRaw(path, {testing::Random("w", Dtype::kU8, {256 << 10}, 9)});
  auto ckpt = Checkpoint::Open(path);
  ASSERT_OK(ckpt);
  const std::vector<std::string> files = {ReadAll(path)};
  constexpr uint64_t kChunk = 64 << 10;
  Layout layout = LayOut(*ckpt);
  LaidOut& t = layout.shards[0][0];
  remote::ManifestTensor served;
  served.name = "w";
  for (uint64_t at = 0; at < t.nbytes; at += kChunk)
    served.chunk_xxh3.push_back(Xxh3_64(files[0].data() + t.file_offset + at, kChunk));
  t.checked_by = &served;
  layout.chunk_bytes = kChunk;
  const uint64_t begin = t.file_offset;

  auto root_owned = std::make_unique<FakeSource>("root", files, 1, /*block=*/true);
  FakeSource* root = root_owned.get();
  std::vector<std::unique_ptr<Source>> sources;
  sources.push_back(std::move(root_owned));
  StripedStore::Options options;
  options.piece_bytes = kChunk;
  StripedStore store(std::move(layout), std::move(sources), options);
  const std::string& file = ckpt->shards()[0].path;
  std::vector<std::byte> into(t.nbytes);
  const CheckpointStore::Range range{&file, begin, t.nbytes, into.data()};
  Status read;
  std::thread reader([&] { read = store.ReadRanges({&range, 1}, {}); });
  ASSERT_TRUE(root->WaitForPieces(1));
  EXPECT_EQ(root->FetchedTimes(begin, kChunk), 1);  // Its probe: chunk 0.

  auto relay_owned = std::make_unique<FakeSource>("relay", files, 1, /*block=*/false);
  FakeSource* relay = relay_owned.get();
  relay->HoldOnly({2});
  store.AddSource(std::move(relay_owned));
  ASSERT_TRUE(relay->WaitForPieces(1));
  EXPECT_EQ(relay->FetchedTimes(begin + 2 * kChunk, kChunk), 1);
  relay->HoldOnly({1, 2, 3});
  ASSERT_TRUE(relay->WaitForPieces(3));
  EXPECT_EQ(relay->FetchedTimes(begin + kChunk, kChunk), 1);
  EXPECT_EQ(relay->FetchedTimes(begin + 3 * kChunk, kChunk), 1);
  root->Release();
  reader.join();
  ASSERT_OK(read);
  EXPECT_EQ(std::memcmp(into.data(), files[0].data() + begin, t.nbytes), 0);
  EXPECT_EQ(root->fetched_pieces(), 1u);
  EXPECT_EQ(relay->fetched_pieces(), 3u);
  std::vector<StripeSourceReport> reports = store.SourceReports();
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[0].bytes, kChunk);
  EXPECT_EQ(reports[1].bytes, 3 * kChunk);
}

// A read whose pieces no source holds, and that nothing fetches, fails once
// nothing has landed for idle_timeout (relays that stopped receiving), not
// never.
TEST(StripedStoreTest, ReadsThatNoSourceHoldsFailAfterTheIdleTimeout) {
  ScratchDir dir("tl_striped_idle");
  const std::string path = dir.File("m.safetensors");
  testing::WriteRaw(path, {testing::Random("w", Dtype::kU8, {64 << 10}, 3)});
  auto ckpt = Checkpoint::Open(path);
  ASSERT_OK(ckpt);
  const std::vector<std::string> files = {ReadAll(path)};
  auto relay_owned = std::make_unique<FakeSource>("relay", files, 1, /*block=*/false);
  relay_owned->HoldOnly({});
  std::vector<std::unique_ptr<Source>> sources;
  sources.push_back(std::move(relay_owned));
  StripedStore::Options options;
  options.idle_timeout = std::chrono::milliseconds(50);
  StripedStore store(LayOut(*ckpt), std::move(sources), options);
  const Checkpoint::Shard& shard = ckpt->shards()[0];
  const uint64_t begin = shard.header.data_offset();
  std::vector<std::byte> into(shard.identity.size - begin);
  const CheckpointStore::Range range{&shard.path, begin, into.size(), into.data()};
  Status read = store.ReadRanges({&range, 1}, {});
  EXPECT_EQ(read.code(), StatusCode::kUnavailable);
  EXPECT_THAT(read.message(), ::testing::HasSubstr("no source holds the pieces left"));
}

// A read whose source went quiet (a relay cut off, not yet found dead) while
// the source that holds everything is retired (the root, replaced by that
// relay): after idle_timeout the retired one takes the pieces again, and the
// read ends whole instead of failing.
TEST(StripedStoreTest, AnIdleReadTakesARetiredSourceBackBeforeItFails) {
  ScratchDir dir("tl_striped_revive");
  const std::string path = dir.File("m.safetensors");
  testing::WriteRaw(path, {testing::Random("w", Dtype::kU8, {64 << 10}, 4)});
  auto ckpt = Checkpoint::Open(path);
  ASSERT_OK(ckpt);
  const std::vector<std::string> files = {ReadAll(path)};
  auto root_owned = std::make_unique<FakeSource>("root", files, 1, /*block=*/false);
  FakeSource* root = root_owned.get();
  auto relay_owned = std::make_unique<FakeSource>("relay", files, 1, /*block=*/false);
  relay_owned->HoldOnly({});
  std::vector<std::unique_ptr<Source>> sources;
  sources.push_back(std::move(root_owned));
  sources.push_back(std::move(relay_owned));
  StripedStore::Options options;
  options.idle_timeout = std::chrono::milliseconds(50);
  StripedStore store(LayOut(*ckpt), std::move(sources), options);
  store.Retire(root);
  const Checkpoint::Shard& shard = ckpt->shards()[0];
  const uint64_t begin = shard.header.data_offset();
  std::vector<std::byte> into(shard.identity.size - begin);
  const CheckpointStore::Range range{&shard.path, begin, into.size(), into.data()};
  ASSERT_OK(store.ReadRanges({&range, 1}, {}));
  EXPECT_EQ(std::memcmp(into.data(), files[0].data() + begin, into.size()), 0);
  EXPECT_GE(root->fetched_pieces(), 1u);
}

}  // namespace
}  // namespace tensorlift::sources
