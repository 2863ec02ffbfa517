// LoadFromObjectStore against a real S3 server (rclone serve s3 on loopback,
// checking SigV4): byte-exact against local loads of the same files across
// dtypes, misaligned tensors, shards with an index and a prefix listing;
// filters; small requests; the clear errors; a server gone mid-way. Every
// load option (dtype, on_tensor, content hashing, sparse decoding, an arena
// pool, shared memory, progress, a device through the staged pipeline) gives
// the bytes the same options give on the local copy: a bucket is a source of
// the one loader, not a loader of its own.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>

#include "../common/assert_ok.h"
#include "../load/test_files.h"
#include "device/device.h"
#include "device/emulated_device.h"
#include "s3_server.h"
#include "scoped_env.h"
#include "tensorlift/objstore.h"
#include "tensorlift/remote.h"
#include "tensorlift/sparsify.h"

namespace tensorlift {
namespace {

using test::ScratchDir;
using ::testing::HasSubstr;
using testing::MixedTensors;
using testing::Random;
using testing::RawTensor;
using testing::RcloneS3Server;
using testing::ScopedEnv;
using testing::WriteRaw;

class S3LoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(root_.File("s3/models/mixed"));
    std::filesystem::create_directories(root_.File("s3/models/sharded"));
    std::filesystem::create_directories(root_.File("s3/models/plain"));
    std::filesystem::create_directories(root_.File("s3/models/tp"));
    std::filesystem::create_directories(root_.File("s3/models/many"));
    for (int i = 0; i < kManyShards; ++i) {
      WriteRaw(root_.File("s3/models/many/part-" + std::to_string(100 + i) + ".safetensors"),
               {Random("t" + std::to_string(i), Dtype::kF32, {300000}, 40 + i)});
    }
    std::filesystem::create_directories(root_.File("dense"));
    tp_ = {Random("a.w", Dtype::kF32, {64, 48}, 11),
           Random("b.proj", Dtype::kBF16, {40, 300}, 12),
           Random("c.big.w", Dtype::kF16, {2000, 1000}, 13),
           Random("d.bias", Dtype::kF32, {17}, 14),
           Random("e.odd.w", Dtype::kF32, {5, 3}, 15),
           Random("f.wide.proj", Dtype::kU8, {3, 3u << 20}, 16)};
    WriteRaw(root_.File("s3/models/tp/model.safetensors"), tp_);
    mixed_ = MixedTensors(7);
    WriteRaw(root_.File("s3/models/mixed/model.safetensors"), mixed_, 3);  // Odd header size.
    // Two shards with an index, and a third file the index does not name.
    std::vector<RawTensor> a = {Random("layer.0.w", Dtype::kBF16, {64, 33}, 1),
                                Random("layer.0.b", Dtype::kF32, {33}, 2)};
    std::vector<RawTensor> b = {Random("layer.1.w", Dtype::kF16, {1000, 700}, 3),
                                Random("layer.1.b", Dtype::kI64, {7}, 4)};
    WriteRaw(root_.File("s3/models/sharded/model-00001-of-00002.safetensors"), a);
    WriteRaw(root_.File("s3/models/sharded/model-00002-of-00002.safetensors"), b);
    std::ofstream(root_.File("s3/models/sharded/model.safetensors.index.json"))
        << R"({"metadata": {"total_size": 1}, "weight_map": {)"
        << R"("layer.0.w": "model-00001-of-00002.safetensors", )"
        << R"("layer.0.b": "model-00001-of-00002.safetensors", )"
        << R"("layer.1.w": "model-00002-of-00002.safetensors", )"
        << R"("layer.1.b": "model-00002-of-00002.safetensors"}})";
    WriteRaw(root_.File("s3/models/plain/a.safetensors"), a);
    WriteRaw(root_.File("s3/models/plain/b.safetensors"), b);
    // A truncated copy (rclone lists a folder once: every object is written
    // before it starts).
    const std::string whole = root_.File("s3/models/mixed/model.safetensors");
    std::filesystem::copy_file(whole, root_.File("s3/models/short.safetensors"));
    std::filesystem::resize_file(root_.File("s3/models/short.safetensors"),
                                 std::filesystem::file_size(whole) - 100);
    // A sparse-bitmask checkpoint (tensorlift sparsify of a pruned one).
    {
      std::vector<RawTensor> dense = {Random("l.0.weight", Dtype::kF32, {64, 96}, 21),
                                      Random("l.1.weight", Dtype::kBF16, {128, 64}, 22),
                                      Random("l.1.bias", Dtype::kF32, {128}, 23)};
      WriteRaw(root_.File("dense/model.safetensors"), dense);
      sparse::SparsifyOptions sparsify;
      sparsify.prune = 0.6;
      ASSERT_OK(sparse::Sparsify(root_.File("dense/model.safetensors"),
                                 root_.File("s3/models/sparse"), sparsify));
    }
    server_ = std::make_unique<RcloneS3Server>(root_.File("s3"));
    if (!server_->ok()) GTEST_SKIP() << server_->error();
    store_.endpoint = server_->endpoint();
    store_.region = "us-east-1";
  }

  // Every tensor of `got` equals the local load of `local`.
  static void ExpectSameAsLocal(const LoadedCheckpoint& got, const std::string& local,
                                const LoadOptions& options = {}) {
    LoadOptions host = options;
    host.device = DeviceId::Cpu();
    auto want = Load(local, host);
    ASSERT_OK(want);
    ASSERT_EQ(got.tensors().size(), want->tensors().size());
    for (const LoadedTensor& w : want->tensors()) {
      SCOPED_TRACE(w.name);
      const LoadedTensor* g = got.Find(w.name);
      ASSERT_NE(g, nullptr);
      EXPECT_EQ(g->dtype, w.dtype);
      EXPECT_EQ(g->shape, w.shape);
      ASSERT_EQ(g->nbytes, w.nbytes);
      std::vector<std::byte> bytes(g->nbytes);
      ASSERT_OK(got.CopyToHost(w.name, bytes.data()));
      if (w.nbytes) {
        EXPECT_EQ(std::memcmp(bytes.data(), w.data, w.nbytes), 0);
      }
      if (g->device == DeviceType::kCpu && g->nbytes) {
        const uint64_t align = std::min<uint64_t>(8, std::max(1, DtypeBits(g->dtype) / 8));
        EXPECT_EQ(reinterpret_cast<uintptr_t>(g->data) % align, 0u);
      }
    }
  }

  static constexpr int kManyShards = 24;  // Of 1.2 MB each.
  ScratchDir root_{"tl_s3"};
  std::vector<RawTensor> mixed_, tp_;
  std::unique_ptr<RcloneS3Server> server_;
  ObjectStoreOptions store_;
  ScopedEnv key_{"AWS_ACCESS_KEY_ID", testing::kS3AccessKey};
  ScopedEnv secret_{"AWS_SECRET_ACCESS_KEY", testing::kS3SecretKey};
  ScopedEnv token_{"AWS_SESSION_TOKEN", nullptr};
  ScopedEnv profile_{"AWS_PROFILE", nullptr};
  ScopedEnv endpoint_{"AWS_ENDPOINT_URL", nullptr};
};

TEST_F(S3LoadTest, AFileEveryDtypeByteExact) {
  ObjectStoreReport report;
  auto got = LoadFromObjectStore("s3://models/mixed/model.safetensors", {}, store_, &report);
  ASSERT_OK(got);
  ExpectSameAsLocal(*got, root_.File("s3/models/mixed/model.safetensors"));
  EXPECT_EQ(report.endpoint, server_->endpoint());
  EXPECT_EQ(report.credential_source, "environment");
  EXPECT_GE(report.requests, 1u);
  ASSERT_EQ(got->files().size(), 1u);
  EXPECT_EQ(got->files()[0].path, "s3://models/mixed/model.safetensors");
}

TEST_F(S3LoadTest, AnIndexAPrefixAndAFilter) {
  for (const char* url : {"s3://models/sharded", "s3://models/sharded/",
                          "s3://models/sharded/model.safetensors.index.json"}) {
    SCOPED_TRACE(url);
    auto got = LoadFromObjectStore(url, {}, store_);
    ASSERT_OK(got);
    ExpectSameAsLocal(*got, root_.File("s3/models/sharded"));
  }
  auto plain = LoadFromObjectStore("s3://models/plain", {}, store_);
  ASSERT_OK(plain);
  ExpectSameAsLocal(*plain, root_.File("s3/models/plain"));

  LoadOptions only;
  auto regex = TensorFilter::Regex("\\.w$");
  ASSERT_OK(regex);
  only.filter = *regex;
  auto some = LoadFromObjectStore("s3://models/sharded", only, store_);
  ASSERT_OK(some);
  ExpectSameAsLocal(*some, root_.File("s3/models/sharded"), only);
  EXPECT_EQ(some->tensors().size(), 2u);
}

TEST_F(S3LoadTest, SmallRequestsOverFewConnections) {
  ObjectStoreOptions small = store_;
  small.request_bytes = 4096;
  small.max_in_flight_bytes = 3 * 4096;  // 3 connections.
  ObjectStoreReport report;
  uint64_t last = 0;
  LoadOptions options;
  options.progress = [&](const Progress& p) { last = p.bytes_done; };
  auto got = LoadFromObjectStore("s3://models/sharded", options, small, &report);
  ASSERT_OK(got);
  ExpectSameAsLocal(*got, root_.File("s3/models/sharded"));
  EXPECT_EQ(report.connections, 3);
  EXPECT_GT(report.requests, 1400000u / 4096);  // layer.1.w alone is 1.4 MB.
  EXPECT_EQ(last, got->total_bytes());
}

// Rank `rank` of `world`'s slice of `t` along `dim` (ShardRange's rule).
std::vector<uint8_t> SliceOf(const RawTensor& t, int dim, int rank, int world) {
  const uint64_t extent = t.shape[dim];
  const uint64_t block = (extent + world - 1) / world;
  const uint64_t lo = std::min<uint64_t>(extent, block * rank);
  const uint64_t hi = std::min<uint64_t>(extent, block * (rank + 1));
  uint64_t outer = 1, inner = DtypeBits(t.dtype) / 8;
  for (int d = 0; d < dim; ++d) outer *= t.shape[d];
  for (size_t d = dim + 1; d < t.shape.size(); ++d) inner *= t.shape[d];
  std::vector<uint8_t> out;
  for (uint64_t o = 0; o < outer; ++o) {
    const uint8_t* row = t.bytes.data() + (o * extent) * inner;
    out.insert(out.end(), row + lo * inner, row + hi * inner);
  }
  return out;
}

TEST_F(S3LoadTest, EachRankFetchesItsOwnSlices) {
  const uint64_t file_bytes =
      std::filesystem::file_size(root_.File("s3/models/tp/model.safetensors"));
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    ObjectStoreOptions mine = store_;
    mine.parallel = {2, rank};
    mine.layout = "\\.w$=0;proj$=1";
    ObjectStoreReport report;
    auto got = LoadFromObjectStore("s3://models/tp/model.safetensors", {}, mine, &report);
    ASSERT_OK(got);
    ASSERT_EQ(got->tensors().size(), tp_.size());
    for (const RawTensor& t : tp_) {
      SCOPED_TRACE(t.name);
      const int dim = t.name.ends_with(".w") ? 0 : t.name.ends_with("proj") ? 1 : -1;
      const std::vector<uint8_t> want = dim < 0 ? t.bytes : SliceOf(t, dim, rank, 2);
      const LoadedTensor* g = got->Find(t.name);
      ASSERT_NE(g, nullptr);
      ASSERT_EQ(g->nbytes, want.size());
      if (dim >= 0) {
        const uint64_t block = (t.shape[dim] + 1) / 2;
        EXPECT_EQ(static_cast<uint64_t>(g->shape[dim]),
                  std::min<uint64_t>(t.shape[dim], block * (rank + 1)) - block * rank);
      }
      EXPECT_EQ(std::memcmp(g->data, want.data(), want.size()), 0);
    }
    // Only this rank's bytes came over the wire (and the header): about half
    // of the dim-0 slices' and of the wide rows', the small dim-1 tensor's
    // span whole.
    EXPECT_LT(report.bytes, file_bytes * 6 / 10) << report.bytes << " of " << file_bytes;
    std::cout << "rank " << rank << " fetched " << report.bytes << " of " << file_bytes
              << " bytes in " << report.requests << " GETs\n";
    // b.proj's 40 rows of 300 bytes lie close together: one GET of their span.
    EXPECT_LT(report.requests, 20u);
    EXPECT_THAT(got->files()[0].reason, HasSubstr("for rank " + std::to_string(rank) + " of 2"));
  }
  ObjectStoreOptions bad = store_;
  bad.parallel = {2, 0};
  bad.layout = "(=0";
  EXPECT_FALSE(LoadFromObjectStore("s3://models/tp/model.safetensors", {}, bad).ok());
  bad.layout = "";
  bad.parallel = {2, 2};
  EXPECT_FALSE(LoadFromObjectStore("s3://models/tp/model.safetensors", {}, bad).ok());
}

TEST_F(S3LoadTest, ARanksSlicesWithEveryOptionAreTheLocalCopys) {
  // The planner slices for every source: a rank's load from the bucket, onto
  // the emulated device, converted, handed to on_tensor, is the same rank's
  // load of the local copy.
  const std::string local = root_.File("s3/models/tp/model.safetensors");
  for (int variant = 0; variant < 4; ++variant) {
    LoadOptions o;
    o.parallel = {3, 1};
    o.layout = "\\.w$=0;proj$=1";
    if (variant & 1) o.device = DeviceId::Emulated();
    if (variant & 2) o.dtype = Dtype::kF16;
    SCOPED_TRACE("variant " + std::to_string(variant));
    std::atomic<int> handed{0};
    o.on_tensor = [&](const StreamedTensor&) {
      ++handed;
      return Status::Ok();
    };
    auto got = LoadFromObjectStore("s3://models/tp/model.safetensors", o, store_);
    ASSERT_OK(got);
    EXPECT_EQ(handed.load(), static_cast<int>(got->tensors().size()));
    o.on_tensor = nullptr;
    ExpectSameAsLocal(*got, local, o);
  }
  // Given in both places, differently: refused.
  LoadOptions o;
  o.parallel = {2, 0};
  ObjectStoreOptions other = store_;
  other.parallel = {2, 1};
  EXPECT_EQ(LoadFromObjectStore("s3://models/tp/model.safetensors", o, other).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(S3LoadTest, APeerLoadFallsBackToTheBucket) {
  // A copy in a bucket has the local checkpoint's key.
  auto ckpt = OpenObjectStoreCheckpoint("s3://models/tp/model.safetensors", store_);
  ASSERT_OK(ckpt);
  auto key = PeerKeyForCheckpoint(*ckpt);
  auto local_key = PeerKeyForCheckpoint(root_.File("s3/models/tp/model.safetensors"));
  ASSERT_OK(key);
  ASSERT_OK(local_key);
  EXPECT_EQ(key->model, "tp");
  EXPECT_EQ(key->model, local_key->model);
  EXPECT_EQ(key->revision, local_key->revision);

  PeerLoadOptions opts;
  opts.peers = {"http://127.0.0.1:1"};  // Nobody there.
  opts.request_timeout_ms = opts.connect_timeout_ms = 2000;
  opts.fallback_path = "s3://models/tp/model.safetensors";
  opts.fallback_loader = ObjectStoreFallback(store_);
  PeerLoadReport report;
  auto got = LoadFromPeer(*key, opts, &report);
  ASSERT_OK(got);
  EXPECT_EQ(report.source, "s3://models/tp/model.safetensors");
  ASSERT_FALSE(report.failures.empty());
  ExpectSameAsLocal(*got, root_.File("s3/models/tp/model.safetensors"));
}

TEST_F(S3LoadTest, APeerLoadsSlicedFallbackFromTheBucketReadsItsSlicesOntoTheDevice) {
  // Through ObjectStoreOpener the bucket is the one loader's source: a
  // rank's slices are planned as slices and read straight onto the device
  // (ObjectStoreFallback's load is whole tensors, cut on the host).
  auto ckpt = OpenObjectStoreCheckpoint("s3://models/tp/model.safetensors", store_);
  ASSERT_OK(ckpt);
  auto key = PeerKeyForCheckpoint(*ckpt);
  ASSERT_OK(key);
  key->layout = "\\.w$=0;proj$=1";
  key->content.clear();  // A rank's slices cannot check the whole checkpoint's root.
  PeerLoadOptions opts;
  opts.peers = {"http://127.0.0.1:1"};  // Nobody there.
  opts.request_timeout_ms = opts.connect_timeout_ms = 2000;
  opts.parallel = {2, 1};
  opts.device = DeviceId::Emulated();
  opts.fallback_path = "s3://models/tp/model.safetensors";
  opts.fallback_open = ObjectStoreOpener(store_);
  PeerLoadReport report;
  auto got = LoadFromPeer(*key, opts, &report);
  ASSERT_OK(got);
  EXPECT_EQ(report.source, opts.fallback_path);
  ASSERT_FALSE(got->files().empty());
  EXPECT_THAT(got->files()[0].reason, HasSubstr("for rank 1 of 2"));
  for (const LoadedTensor& t : got->tensors()) EXPECT_EQ(t.device, DeviceType::kEmulated);
  LoadOptions same;
  same.parallel = opts.parallel;
  same.layout = key->layout;
  ExpectSameAsLocal(*got, root_.File("s3/models/tp/model.safetensors"), same);

  // The store's settings that belong to LoadFromObjectStore are refused, not
  // ignored.
  ObjectStoreOptions cached = store_;
  cached.cache_dir = root_.File("opener-cache");
  opts.fallback_open = ObjectStoreOpener(cached);
  auto refused = LoadFromPeer(*key, opts);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("cache_dir"));
  EXPECT_FALSE(std::filesystem::exists(cached.cache_dir));
}

TEST_F(S3LoadTest, AWriteThroughCache) {
  ObjectStoreOptions cached = store_;
  cached.cache_dir = root_.File("cache");
  const std::string shard1 = cached.cache_dir + "/models/sharded/model-00001-of-00002.safetensors";
  const std::string shard2 = cached.cache_dir + "/models/sharded/model-00002-of-00002.safetensors";
  // A filtered load leaves the objects it did not fetch whole out of the cache.
  LoadOptions some;
  some.filter = TensorFilter::Names({"layer.1.w"});
  ASSERT_OK(LoadFromObjectStore("s3://models/sharded", some, cached));
  EXPECT_FALSE(std::filesystem::exists(shard1));
  EXPECT_FALSE(std::filesystem::exists(shard2));

  ObjectStoreReport first, second, third;
  auto a = LoadFromObjectStore("s3://models/sharded", {}, cached, &first);
  ASSERT_OK(a);
  ExpectSameAsLocal(*a, root_.File("s3/models/sharded"));
  for (const FileReport& f : a->files()) EXPECT_THAT(f.reason, HasSubstr("written to the cache"));
  EXPECT_EQ(
      std::filesystem::file_size(shard1),
      std::filesystem::file_size(root_.File("s3/models/sharded/model-00001-of-00002.safetensors")));

  // Read from the cache: only the listing and the headers come over the wire.
  auto b = LoadFromObjectStore("s3://models/sharded", {}, cached, &second);
  ASSERT_OK(b);
  ExpectSameAsLocal(*b, root_.File("s3/models/sharded"));
  EXPECT_EQ(second.requests, 0u);
  EXPECT_LT(second.bytes, first.bytes);
  ASSERT_EQ(b->files().size(), 2u);
  for (const FileReport& f : b->files())
    EXPECT_THAT(f.reason, HasSubstr("from the cache of s3://"));

  // A stamp that no longer matches the bucket: that object is fetched again.
  std::ofstream(shard1 + ".tl-etag") << "1 stale\n";
  auto c = LoadFromObjectStore("s3://models/sharded", {}, cached, &third);
  ASSERT_OK(c);
  ExpectSameAsLocal(*c, root_.File("s3/models/sharded"));
  EXPECT_GT(third.requests, 0u);
  int fetched = 0, hits = 0;
  for (const FileReport& f : c->files()) {
    fetched += f.reason.find("written to the cache") != std::string::npos;
    hits += f.reason.find("from the cache of") != std::string::npos;
  }
  EXPECT_EQ(fetched, 1);
  EXPECT_EQ(hits, 1);

  // Not with slices, nor with a checkpoint opened before.
  ObjectStoreOptions ranks = cached;
  ranks.parallel = {2, 0};
  EXPECT_FALSE(LoadFromObjectStore("s3://models/sharded", {}, ranks).ok());
  auto ckpt = OpenObjectStoreCheckpoint("s3://models/sharded", store_);
  ASSERT_OK(ckpt);
  EXPECT_FALSE(LoadFromObjectStore(*ckpt, {}, cached).ok());
}

TEST_F(S3LoadTest, OntoADevice) {
  LoadOptions options;
  options.device = DeviceId::Emulated();
  auto got = LoadFromObjectStore("s3://models/mixed/model.safetensors", options, store_);
  ASSERT_OK(got);
  for (const LoadedTensor& t : got->tensors()) EXPECT_EQ(t.device, DeviceType::kEmulated);
  ExpectSameAsLocal(*got, root_.File("s3/models/mixed/model.safetensors"));
}

// An open checkpoint keeps each file's header bytes, not the 1 MiB its first
// GET probes with (24 shards of 1.2 MB kept 24 MiB before).
TEST_F(S3LoadTest, AnOpenCheckpointKeepsItsHeadersNotTheirProbes) {
  auto allocated = [] {
    const struct mallinfo2 m = mallinfo2();
    return m.uordblks + m.hblkhd;
  };
  // Once first: what the first open sets up for the process (the client's
  // libraries) is not what this counts.
  ASSERT_OK(OpenObjectStoreCheckpoint("s3://models/plain", store_));
  const size_t before = allocated();
  auto ckpt = OpenObjectStoreCheckpoint("s3://models/many", store_);
  ASSERT_OK(ckpt);
  ASSERT_EQ(ckpt->shards().size(), static_cast<size_t>(kManyShards));
  const size_t kept = allocated() - std::min(allocated(), before);
  EXPECT_LT(kept, kManyShards * (256u << 10)) << kept << " bytes allocated by the open";
}

TEST_F(S3LoadTest, ClearErrors) {
  // A missing object names it.
  auto missing = LoadFromObjectStore("s3://models/nope.safetensors", {}, store_);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status().ToString();
  EXPECT_THAT(missing.status().message(), HasSubstr("s3://models/nope.safetensors"));

  // A truncated object (SetUp): its header promises more than it holds.
  auto truncated = LoadFromObjectStore("s3://models/short.safetensors", {}, store_);
  ASSERT_FALSE(truncated.ok());
  EXPECT_EQ(truncated.status().code(), StatusCode::kCorruption) << truncated.status().ToString();
  EXPECT_THAT(truncated.status().message(), HasSubstr("s3://models/short.safetensors"));

  // A wrong secret names where the credentials came from and the endpoint.
  {
    ScopedEnv bad("AWS_SECRET_ACCESS_KEY", "not-the-secret");
    auto denied = LoadFromObjectStore("s3://models/mixed/model.safetensors", {}, store_);
    ASSERT_FALSE(denied.ok());
    EXPECT_EQ(denied.status().code(), StatusCode::kPermissionDenied) << denied.status().ToString();
    EXPECT_THAT(denied.status().message(), HasSubstr("environment"));
    EXPECT_THAT(denied.status().message(), HasSubstr(server_->endpoint()));
  }

  // Options for local files are refused, not ignored.
  LoadOptions direct;
  direct.mode = IoMode::kDirect;
  auto refused = LoadFromObjectStore("s3://models/mixed/model.safetensors", direct, store_);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("applies to local files"));
  EXPECT_FALSE(LoadFromObjectStore("s3://Bad_Bucket!/x", {}, store_).ok());
}

TEST_F(S3LoadTest, AServerThatIsGoneIsAnErrorNotAHang) {
  ObjectStoreOptions quick = store_;
  quick.retries = 1;
  auto ckpt = OpenObjectStoreCheckpoint("s3://models/sharded", quick);
  ASSERT_OK(ckpt);
  EXPECT_EQ(ckpt->tensors().size(), 4u);
  server_->Stop();
  auto got = LoadFromObjectStore("s3://models/sharded", {}, quick);
  ASSERT_FALSE(got.ok());
  EXPECT_THAT(got.status().message(), HasSubstr(store_.endpoint));
}

// The bytes of tensor `name` of `loaded`, wherever they are.
std::vector<std::byte> BytesOf(const LoadedCheckpoint& loaded, const std::string& name) {
  const LoadedTensor* t = loaded.Find(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return {};
  std::vector<std::byte> bytes(t->nbytes);
  EXPECT_OK(loaded.CopyToHost(name, bytes.data()));
  return bytes;
}

TEST_F(S3LoadTest, EveryLoadOptionGivesTheBytesOfTheLocalCopy) {
  const std::string url = "s3://models/sharded", local = root_.File("s3/models/sharded");
  {  // dtype conversion (on the host: the staged pipeline over the host device).
    LoadOptions f16;
    f16.dtype = Dtype::kF16;
    auto got = LoadFromObjectStore(url, f16, store_);
    ASSERT_OK(got);
    EXPECT_EQ(got->Find("layer.0.b")->dtype, Dtype::kF16);
    ExpectSameAsLocal(*got, local, f16);
    for (const FileReport& f : got->files()) EXPECT_THAT(f.reason, HasSubstr("object storage"));
  }
  {  // on_tensor: each tensor as it lands, its bytes then already right.
    std::map<std::string, std::vector<std::byte>> seen;
    LoadOptions streamed;
    streamed.on_tensor = [&](const StreamedTensor& t) {
      const auto* p = static_cast<const std::byte*>(t.tensor().data);
      seen[t.tensor().name].assign(p, p + t.tensor().nbytes);
      return Status::Ok();
    };
    auto got = LoadFromObjectStore(url, streamed, store_);
    ASSERT_OK(got);
    auto want = Load(local);
    ASSERT_OK(want);
    ASSERT_EQ(seen.size(), want->tensors().size());
    for (const LoadedTensor& w : want->tensors()) EXPECT_EQ(seen[w.name], BytesOf(*want, w.name));
  }
  {  // The content identity, an arena pool, shared memory, progress, a filter.
    LoadOptions options;
    options.content_hash = ContentHashMode::kOn;
    options.arena_pool = std::make_shared<ArenaPool>();
    options.filter = TensorFilter::Names({"layer.0.w", "layer.1.w", "layer.1.b"});
    Progress last;
    options.progress = [&](const Progress& p) { last = p; };
    auto got = LoadFromObjectStore(url, options, store_);
    ASSERT_OK(got);
    EXPECT_EQ(last.bytes_done, last.bytes_total);
    EXPECT_EQ(last.bytes_total, got->total_bytes());
    ExpectSameAsLocal(*got, local, options);
    LoadOptions local_options = options;
    local_options.mode = IoMode::kBuffered;
    local_options.progress = nullptr;
    auto want = Load(local, local_options);
    ASSERT_OK(want);
    ASSERT_NE(got->content(), nullptr);
    ASSERT_NE(want->content(), nullptr);
    EXPECT_EQ(got->content()->root, want->content()->root);
    LoadOptions shared;
    shared.shared_memory = true;
    auto sealed = LoadFromObjectStore(url, shared, store_);
    ASSERT_OK(sealed);
    ExpectSameAsLocal(*sealed, local);
  }
  {  // The options about local files' reads are refused, naming the option, never ignored.
    LoadOptions engine;
    engine.engine = IoEngine::kUring;
    LoadOptions threads;
    threads.threads = 4;
    for (const LoadOptions& o : {engine, threads}) {
      auto refused = LoadFromObjectStore(url, o, store_);
      ASSERT_FALSE(refused.ok());
      EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
      EXPECT_THAT(refused.status().message(), HasSubstr("local files"));
    }
  }
}

TEST_F(S3LoadTest, ACheckpointOpenedInTheBucketLoadsThroughTheOneLoader) {
  // OpenObjectStoreCheckpoint keeps its store: Load reads through it.
  auto ckpt = OpenObjectStoreCheckpoint("s3://models/mixed/model.safetensors", store_);
  ASSERT_OK(ckpt);
  ASSERT_NE(ckpt->store(), nullptr);
  auto got = Load(*ckpt);
  ASSERT_OK(got);
  ExpectSameAsLocal(*got, root_.File("s3/models/mixed/model.safetensors"));
}

TEST_F(S3LoadTest, SparseCheckpointsAreDecodedFromABucket) {
  const std::string url = "s3://models/sparse", local = root_.File("s3/models/sparse");
  for (const char* device : {"cpu", "emulated:0"}) {
    SCOPED_TRACE(device);
    LoadOptions options;
    options.device = *ParseDevice(device);
    auto got = LoadFromObjectStore(url, options, store_);
    ASSERT_OK(got);
    auto want = Load(local);  // Decoded on the host from the local copy.
    ASSERT_OK(want);
    ASSERT_EQ(got->tensors().size(), want->tensors().size());
    ASSERT_NE(got->Find("l.0.weight"), nullptr);  // Dense names: decoded.
    for (const LoadedTensor& w : want->tensors()) {
      SCOPED_TRACE(w.name);
      EXPECT_EQ(BytesOf(*got, w.name), BytesOf(*want, w.name));
    }
  }
  LoadOptions parts;
  parts.decode_sparse = false;
  auto stored = LoadFromObjectStore(url, parts, store_);
  ASSERT_OK(stored);
  ExpectSameAsLocal(*stored, local, parts);
}

TEST_F(S3LoadTest, OntoADeviceThroughTheStagedPipelineNotAHostCopy) {
  // Converted and on the device: the bytes come through the pinned staging
  // slots (host memory: the slots, never the checkpoint).
  LoadOptions options;
  options.device = DeviceId::Emulated();
  options.dtype = Dtype::kBF16;
  options.staging_buffers = 2;
  options.staging_bytes = 1 << 20;
  auto got = LoadFromObjectStore("s3://models/sharded", options, store_);
  ASSERT_OK(got);
  for (const LoadedTensor& t : got->tensors()) EXPECT_EQ(t.device, DeviceType::kEmulated);
  EXPECT_GT(got->device_plan().pinned_bytes, 0u);
  EXPECT_LE(got->device_plan().pinned_bytes, 2u << 20);
  ExpectSameAsLocal(*got, root_.File("s3/models/sharded"), options);
}

// A short read from a bucket is the same verdict as from a local file:
// IOError, "short read", naming the object (here: cut after its header was read).
TEST_F(S3LoadTest, AnObjectCutShortAfterItsHeaderIsAShortRead) {
  auto ckpt = OpenObjectStoreCheckpoint("s3://models/mixed/model.safetensors", store_);
  ASSERT_OK(ckpt);
  const std::string file = root_.File("s3/models/mixed/model.safetensors");
  std::filesystem::resize_file(file, ckpt->shards()[0].header.data_offset() + 8);
  for (const char* where : {"cpu", "emulated:0"}) {
    SCOPED_TRACE(where);
    LoadOptions options;
    options.device = *ParseDevice(where);
    auto got = Load(*ckpt, options);
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), StatusCode::kIOError) << got.status().ToString();
    EXPECT_THAT(got.status().message(), HasSubstr("short read"));
    EXPECT_THAT(got.status().message(), HasSubstr("models/mixed/model.safetensors"));
  }
}

TEST_F(S3LoadTest, ABucketThatFailsMidLoadFreesEverything) {
  auto device = OpenDevice(DeviceType::kEmulated, 0);
  ASSERT_OK(device);
  auto before = GetEmulatedDeviceCounts(**device);
  ASSERT_OK(before);
  ObjectStoreOptions quick = store_;
  quick.retries = 1;
  auto ckpt = OpenObjectStoreCheckpoint("s3://models/sharded", quick);  // Headers read.
  ASSERT_OK(ckpt);
  server_->Stop();  // Every read of the tensors' bytes fails.
  for (const char* where : {"cpu", "emulated:0"}) {
    SCOPED_TRACE(where);
    LoadOptions options;
    options.device = *ParseDevice(where);
    auto got = Load(*ckpt, options);
    ASSERT_FALSE(got.ok());
    EXPECT_THAT(got.status().message(), HasSubstr(store_.endpoint));
  }
  auto after = GetEmulatedDeviceCounts(**device);
  ASSERT_OK(after);
  EXPECT_EQ(after->live_bytes, before->live_bytes);
  EXPECT_EQ(after->live_allocations, before->live_allocations);
}

}  // namespace
}  // namespace tensorlift
