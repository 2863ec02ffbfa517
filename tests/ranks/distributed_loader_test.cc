// LoadDistributed tests. Without arguments: the single-process communicator.
// With --mpi (under mpiexec -n N): the MPI communicator over N ranks.
//
// Rank 0 writes a checkpoint of 3 shards into a fresh directory (a
// ScratchDir, so concurrent runs never share one) and broadcasts
// its path; every rank then opens it. Every rank runs every test and checks
// its own results against a plain Load of the whole checkpoint, sliced
// locally. Tests use EXPECT (not ASSERT) around collectives so that all ranks
// make the same calls, and each ends with an Agree on its result.
#include <dlpack/dlpack.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../common/assert_ok.h"
#include "../common/scratch_dir.h"
#include "device/device.h"
#include "in_process_communicator.h"
#include "rank_failure_printer.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/distributed.h"
#include "tensorlift/loader.h"
#include "tensorlift/safetensors.h"

namespace tensorlift {
namespace {

bool g_mpi = false;
Communicator* g_comm = nullptr;
std::string g_dir;  // The shared checkpoint directory (same on every rank).
std::unique_ptr<test::ScratchDir> g_scratch;  // Rank 0's, which holds g_dir.

struct Spec {
  std::string file;
  std::string name;
  Dtype dtype;
  std::vector<uint64_t> shape;
};
// Shapes not divisible by 4 (nor by 2, mostly), a zero-size tensor, a scalar.
const std::vector<Spec>& Specs() {
  static const std::vector<Spec> specs = {
      {"a", "a.bf16", Dtype::kBF16, {5, 7}},  {"a", "a.f32", Dtype::kF32, {6, 3, 5}},
      {"a", "a.u8", Dtype::kU8, {9}},         {"b", "b.i64", Dtype::kI64, {7, 3}},
      {"b", "b.empty", Dtype::kF32, {0, 4}},  {"b", "b.u8", Dtype::kU8, {3, 5, 2}},
      {"c", "c.f32", Dtype::kF32, {301, 67}}, {"c", "c.bf16", Dtype::kBF16, {3, 9, 2}},
      {"c", "c.scalar", Dtype::kF32, {}},     {"c", "c.i64", Dtype::kI64, {1, 5}},
  };
  return specs;
}

uint64_t ElementBytes(Dtype d) { return static_cast<uint64_t>(DtypeBits(d)) / 8; }

Status WriteCheckpoint(const std::string& dir) {
  for (const char* file : {"a", "b", "c"}) {
    std::vector<std::vector<std::byte>> data;
    std::vector<TensorView> views;
    for (const Spec& s : Specs()) {
      if (s.file != file) continue;
      uint64_t n = ElementBytes(s.dtype);
      for (uint64_t d : s.shape) n *= d;
      std::vector<std::byte> bytes(n);
      const uint64_t seed = std::hash<std::string>()(s.name);
      for (uint64_t i = 0; i < n; ++i)
        bytes[i] = static_cast<std::byte>((i * 131 + seed + (i >> 8)) & 0xff);
      data.push_back(std::move(bytes));
      views.push_back({s.name, s.dtype, s.shape, {}});
    }
    for (size_t i = 0; i < views.size(); ++i) views[i].data = data[i];
    TL_RETURN_IF_ERROR(WriteFile(dir + "/" + file + ".safetensors", views, std::nullopt));
  }
  return Status::Ok();
}

// Rank r's slice of `t` along dim (block = ceil(size / world)), computed
// element by element (independently of the loader's byte arithmetic).
std::vector<std::byte> ReferenceSlice(const LoadedTensor& t, int dim, int r, int world) {
  const auto* p = static_cast<const std::byte*>(t.data);
  if (dim < 0) return std::vector<std::byte>(p, p + t.nbytes);
  const uint64_t eb = ElementBytes(t.dtype);
  const uint64_t size = t.shape[dim];
  const uint64_t block = (size + world - 1) / world;
  const uint64_t lo = std::min<uint64_t>(r * block, size),
                 hi = std::min<uint64_t>((r + 1) * block, size);
  uint64_t inner = 1;
  for (size_t d = dim + 1; d < t.shape.size(); ++d) inner *= t.shape[d];
  std::vector<std::byte> out;
  for (uint64_t e = 0; e < t.nbytes / eb; ++e) {
    const uint64_t i = (e / inner) % size;
    if (i >= lo && i < hi) out.insert(out.end(), p + e * eb, p + (e + 1) * eb);
  }
  return out;
}

std::vector<uint64_t> ExpectedShape(const LoadedTensor& t, int dim, int r, int world) {
  std::vector<uint64_t> shape(t.shape.begin(), t.shape.end());
  if (dim >= 0) {
    const uint64_t size = shape[dim], block = (size + world - 1) / world;
    shape[dim] = std::min<uint64_t>((r + 1) * block, size) - std::min<uint64_t>(r * block, size);
  }
  return shape;
}

std::vector<std::byte> Bytes(const HostTensor& t) { return {t.bytes().begin(), t.bytes().end()}; }

// Every rank's value, in rank order.
std::vector<uint64_t> Gather(uint64_t v) {
  std::vector<uint64_t> all(g_comm->size());
  EXPECT_OK(g_comm->AllGather(&v, all.data(), sizeof(v)));
  return all;
}

class DistributedLoaderTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Rank 0 makes the directory and writes; the others learn its path.
    char path[256] = {};
    Status st = Status::Ok();
    if (g_comm->rank() == 0) {
      g_scratch = std::make_unique<test::ScratchDir>("tl_dist_loader");
      const std::string& dir = g_scratch->path();
      if (dir.size() < sizeof(path)) {
        std::memcpy(path, dir.c_str(), dir.size());
        st = WriteCheckpoint(dir);
      } else {
        st = InternalError("the scratch directory's path is too long: " + dir);
      }
    }
    st = g_comm->Agree(st);
    ASSERT_OK(st);
    ASSERT_OK(g_comm->Broadcast(path, sizeof(path), 0));
    g_dir = path;
  }
  static void TearDownTestSuite() {
    EXPECT_OK(g_comm->Barrier());
    g_scratch.reset();
  }
  void SetUp() override {
    auto c = Checkpoint::Open(g_dir);
    ASSERT_OK(c);  // The same on every rank.
    ckpt_ = std::make_unique<Checkpoint>(std::move(c).value());
    auto full = Load(*ckpt_);
    ASSERT_OK(full);
    full_ = std::move(full).value();
  }
  void TearDown() override {
    // A failure on any rank fails the test on every rank.
    const Status agreed =
        g_comm->Agree(HasFailure() ? InternalError("a check failed on this rank") : Status::Ok());
    EXPECT_OK(agreed);
  }

  int rank() const { return g_comm->rank(); }
  int world() const { return g_comm->size(); }

  std::unique_ptr<Checkpoint> ckpt_;
  LoadedCheckpoint full_;
};

TEST_F(DistributedLoaderTest, GetTensorEqualsPlainLoadAndBuffersAreReleased) {
  auto d = LoadDistributed(*ckpt_, {}, *g_comm);
  ASSERT_OK(d);  // Agreed: the same on every rank.
  EXPECT_EQ(d->loaded_names().size(), Specs().size());
  // Each rank read exactly its assigned bytes; together, the checkpoint once.
  EXPECT_EQ(d->bytes_read(), d->assignment().ranks[rank()].bytes);
  uint64_t sum = 0;
  for (uint64_t b : Gather(d->bytes_read())) sum += b;
  EXPECT_EQ(sum, ckpt_->total_bytes());
  EXPECT_EQ(d->buffer_bytes() > 0, d->bytes_read() > 0);

  for (const LoadedTensor& ref : full_.tensors()) {
    auto t = d->GetTensor(ref.name);
    EXPECT_OK(t);
    if (!t.ok()) continue;
    EXPECT_EQ(t->dtype, ref.dtype) << ref.name;
    EXPECT_EQ(t->shape, ExpectedShape(ref, -1, 0, 1)) << ref.name;
    EXPECT_EQ(Bytes(*t), ReferenceSlice(ref, -1, 0, 1)) << ref.name;
  }
  // Every tensor was handed out: every reader dropped its buffers.
  EXPECT_EQ(d->buffer_bytes(), 0u);
  auto again = d->GetTensor("a.f32");
  EXPECT_EQ(again.status().code(), StatusCode::kInvalidArgument) << again.status().ToString();
  EXPECT_NE(again.status().message().find("released"), std::string::npos);
  EXPECT_EQ(d->GetTensor("nope").status().code(), StatusCode::kNotFound);
}

TEST_F(DistributedLoaderTest, GetShardedEqualsReferenceSlicing) {
  DistributedOptions dopts;
  dopts.keep_buffers = true;  // Each tensor is asked for several times.
  auto d = LoadDistributed(*ckpt_, {}, *g_comm, dopts);
  ASSERT_OK(d);
  for (int dim : {-1, 0, 1, 2}) {
    for (const LoadedTensor& ref : full_.tensors()) {
      if (dim >= static_cast<int>(ref.shape.size())) {
        EXPECT_EQ(d->GetSharded(ref.name, dim).status().code(), StatusCode::kInvalidArgument);
        continue;
      }
      auto t = d->GetSharded(ref.name, dim);
      EXPECT_OK(t) << ref.name << " dim " << dim;
      if (!t.ok()) continue;
      EXPECT_EQ(t->shape, ExpectedShape(ref, dim, rank(), world())) << ref.name << " dim " << dim;
      EXPECT_EQ(Bytes(*t), ReferenceSlice(ref, dim, rank(), world())) << ref.name << " dim " << dim;
      EXPECT_EQ(t->nbytes, ReferenceSlice(ref, dim, rank(), world()).size());
    }
  }
  EXPECT_EQ(d->GetSharded("a.f32", -2).status().code(), StatusCode::kInvalidArgument);
  if (d->bytes_read() > 0) {
    EXPECT_GT(d->buffer_bytes(), 0u);  // Kept.
  }
  d->Release();
  EXPECT_EQ(d->buffer_bytes(), 0u);
  EXPECT_EQ(d->GetTensor("c.f32").status().code(), StatusCode::kInvalidArgument);
}

TEST_F(DistributedLoaderTest, ShardedByReadEqualsScatter) {
  DistributedOptions dopts;
  dopts.keep_buffers = true;
  auto d = LoadDistributed(*ckpt_, {}, *g_comm, dopts);
  ASSERT_OK(d);
  EXPECT_TRUE(d->per_rank_read_names().empty());  // Nothing declared.
  const uint64_t loaded = d->bytes_read();
  uint64_t direct = 0;
  for (const LoadedTensor& ref : full_.tensors()) {
    if (ref.shape.empty()) {
      EXPECT_EQ(d->GetShardedByRead(ref.name).status().code(), StatusCode::kInvalidArgument);
      continue;
    }
    auto by_read = d->GetShardedByRead(ref.name);
    auto sharded = d->GetSharded(ref.name, 0);  // Scattered: the tensor was loaded.
    EXPECT_OK(by_read);
    EXPECT_OK(sharded);
    if (!by_read.ok() || !sharded.ok()) continue;
    direct += by_read->nbytes;
    EXPECT_EQ(by_read->shape, sharded->shape) << ref.name;
    EXPECT_EQ(Bytes(*by_read), Bytes(*sharded)) << ref.name;
    EXPECT_EQ(Bytes(*by_read), ReferenceSlice(ref, 0, rank(), world())) << ref.name;
  }
  EXPECT_EQ(d->bytes_read(), loaded + direct);
}

// Tensors declared dim-0-sharded and picked by the mode are not read during
// the load; each rank reads what it asks for, and every Get* still equals the
// reference slicing.
TEST_F(DistributedLoaderTest, DeclaredDim0TensorsAreReadPerRank) {
  for (Dim0Mode mode : {Dim0Mode::kScatter, Dim0Mode::kRead, Dim0Mode::kAuto}) {
    DistributedOptions dopts;
    dopts.keep_buffers = true;
    dopts.dim0 = mode;
    dopts.dim0_read_threshold = 100;      // kAuto: per-rank reads over 100 bytes.
    dopts.dim0_sharded = TensorFilter();  // All of them.
    auto d = LoadDistributed(*ckpt_, {}, *g_comm, dopts);
    ASSERT_OK(d);
    std::vector<std::string> expect_per_rank;
    uint64_t loaded_total = 0;
    for (const LoadedTensor& ref : full_.tensors()) {
      const bool per_rank =
          mode == Dim0Mode::kRead || (mode == Dim0Mode::kAuto && ref.nbytes > 100);
      if (per_rank) {
        expect_per_rank.push_back(ref.name);
      } else {
        loaded_total += ref.nbytes;
      }
    }
    EXPECT_EQ(d->per_rank_read_names(), expect_per_rank);
    EXPECT_EQ(d->loaded_names().size(), Specs().size());
    // The load read only the others, once over all ranks.
    uint64_t sum = 0;
    for (uint64_t b : Gather(d->load_bytes())) sum += b;
    EXPECT_EQ(sum, loaded_total);
    uint64_t direct = 0;
    for (int dim : {0, 1, -1}) {
      for (const LoadedTensor& ref : full_.tensors()) {
        if (dim >= static_cast<int>(ref.shape.size())) continue;
        auto t = d->GetSharded(ref.name, dim);
        EXPECT_OK(t) << ref.name << " dim " << dim;
        if (!t.ok()) continue;
        EXPECT_EQ(t->shape, ExpectedShape(ref, dim, rank(), world())) << ref.name << " dim " << dim;
        EXPECT_EQ(Bytes(*t), ReferenceSlice(ref, dim, rank(), world()))
            << ref.name << " dim " << dim;
        const bool per_rank = std::find(expect_per_rank.begin(), expect_per_rank.end(), ref.name) !=
                              expect_per_rank.end();
        // dim 0 reads this rank's rows; a (non-empty) strided slice reads the
        // whole tensor (a leading dim of 1 makes dim 1 contiguous).
        const bool strided = dim == 1 && ref.shape[0] > 1 && t->nbytes > 0;
        if (per_rank) direct += strided ? ref.nbytes : t->nbytes;
      }
    }
    EXPECT_EQ(d->bytes_read(), d->load_bytes() + direct) << static_cast<int>(mode);
  }
}

// The choice is the same on every rank although only rank 0 declares the
// tensors and the ranks pass different modes: rank 0's mode decides.
TEST_F(DistributedLoaderTest, PerRankReadChoiceIsAgreed) {
  DistributedOptions dopts;
  dopts.dim0 = rank() == 0 ? Dim0Mode::kRead : Dim0Mode::kScatter;
  if (rank() == 0) dopts.dim0_sharded = TensorFilter::Names({"c.f32", "a.bf16"});
  auto d = LoadDistributed(*ckpt_, {}, *g_comm, dopts);
  ASSERT_OK(d);
  EXPECT_EQ(d->per_rank_read_names(), (std::vector<std::string>{"a.bf16", "c.f32"}));
  for (const LoadedTensor& ref : full_.tensors()) {
    auto t = d->GetSharded(ref.name, ref.shape.empty() ? -1 : 0);
    EXPECT_OK(t) << ref.name;
    if (t.ok()) {
      EXPECT_EQ(Bytes(*t), ReferenceSlice(ref, ref.shape.empty() ? -1 : 0, rank(), world()))
          << ref.name;
    }
  }
  // Every loaded tensor was handed out: the buffers are gone.
  EXPECT_EQ(d->buffer_bytes(), 0u);
}

TEST_F(DistributedLoaderTest, PerRankNeededFilter) {
  // Rank r needs the tensors whose position is r mod world, plus "a.u8"
  // everywhere; "b.u8" passes `needed` nowhere and "c.i64" is filtered out by
  // LoadOptions::filter: nobody reads them.
  std::vector<std::string> names;
  for (const LoadedTensor& t : full_.tensors()) names.push_back(t.name);
  const int me = rank(), n = world();
  DistributedOptions dopts;
  dopts.needed = TensorFilter::Predicate([&](std::string_view name) {
    if (name == "b.u8") return false;
    if (name == "a.u8") return true;
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] == name) return static_cast<int>(i % n) == me;
    }
    return false;
  });
  LoadOptions options;
  options.filter = TensorFilter::Predicate([](std::string_view name) { return name != "c.i64"; });
  auto d = LoadDistributed(*ckpt_, options, *g_comm, dopts);
  ASSERT_OK(d);

  // The union over the ranks (with every rank, that is all of them) but
  // b.u8 and c.i64.
  std::vector<std::string> expected;
  uint64_t expected_bytes = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == "b.u8" || names[i] == "c.i64") continue;
    expected.push_back(names[i]);
    expected_bytes += full_.Find(names[i])->nbytes;
  }
  EXPECT_EQ(d->loaded_names(), expected);
  uint64_t sum = 0;
  for (uint64_t b : Gather(d->bytes_read())) sum += b;
  EXPECT_EQ(sum, expected_bytes);
  EXPECT_EQ(d->GetTensor("b.u8").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(d->GetSharded("c.i64", 0).status().code(), StatusCode::kNotFound);
  for (const std::string& name : expected) {
    auto t = d->GetTensor(name);
    EXPECT_OK(t);
    if (t.ok()) {
      EXPECT_EQ(Bytes(*t), ReferenceSlice(*full_.Find(name), -1, 0, 1)) << name;
    }
  }
  EXPECT_EQ(d->buffer_bytes(), 0u);
}

TEST_F(DistributedLoaderTest, NeededByOneRankOnlyIsReadOnce) {
  // Only the last rank needs anything: the work is still spread over all
  // ranks, and only the needed tensors are read.
  const int last = world() - 1;
  DistributedOptions dopts;
  dopts.needed = TensorFilter::Predicate(
      [&](std::string_view name) { return rank() == last && name.substr(0, 2) == "c."; });
  auto d = LoadDistributed(*ckpt_, {}, *g_comm, dopts);
  ASSERT_OK(d);
  uint64_t expected = 0;
  for (const LoadedTensor& t : full_.tensors()) {
    if (t.name.substr(0, 2) == "c.") expected += t.nbytes;
  }
  uint64_t sum = 0;
  for (uint64_t b : Gather(d->bytes_read())) sum += b;
  EXPECT_EQ(sum, expected);
  EXPECT_EQ(d->loaded_names().size(), 4u);
}

TEST_F(DistributedLoaderTest, MissingFileFailsEveryRank) {
  // A second copy of the checkpoint; its headers are read by every rank, then
  // rank 0 deletes b.safetensors: its reader fails, and so does every rank.
  const std::string dir = g_dir + "/missing";
  Status st = Status::Ok();
  if (rank() == 0) {
    std::error_code ec;
    std::filesystem::create_directory(dir, ec);
    st = ec ? InternalError(ec.message()) : WriteCheckpoint(dir);
  }
  st = g_comm->Agree(st);
  ASSERT_OK(st);
  auto c = Checkpoint::Open(dir);
  ASSERT_OK(c);
  EXPECT_OK(g_comm->Barrier());
  if (rank() == 0) std::filesystem::remove(dir + "/b.safetensors");
  EXPECT_OK(g_comm->Barrier());
  auto d = LoadDistributed(*c, {}, *g_comm);
  EXPECT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kNotFound) << d.status().ToString();
  EXPECT_NE(d.status().message().find("b.safetensors"), std::string::npos) << d.status().ToString();
  EXPECT_EQ(d.status().message().rfind("rank ", 0), 0u) << d.status().ToString();
}

TEST_F(DistributedLoaderTest, DifferentCheckpointsOnRanksFail) {
  if (world() == 1) GTEST_SKIP() << "needs two ranks";
  // The last rank opens one shard only: the headers differ.
  Result<Checkpoint> c = rank() == world() - 1 ? Checkpoint::OpenFile(g_dir + "/a.safetensors")
                                               : Checkpoint::Open(g_dir);
  ASSERT_OK(c);
  auto d = LoadDistributed(*c, {}, *g_comm);
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument) << d.status().ToString();
  EXPECT_NE(d.status().message().find("differ"), std::string::npos) << d.status().ToString();
}

TEST_F(DistributedLoaderTest, DtypeIsRejectedOnEveryRank) {
  LoadOptions options;
  if (rank() == world() - 1) options.dtype = Dtype::kF16;  // One rank only.
  auto d = LoadDistributed(*ckpt_, options, *g_comm);
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument) << d.status().ToString();
}

// Ranks as threads of this process (in-process communicators): the whole
// multi-rank path at 2, 3 and 4 ranks in any build (the MPI runs above are not
// made under the sanitizers), against reference slicing. Runs in the
// single-process mode only (under mpiexec every rank would repeat it).
TEST_F(DistributedLoaderTest, RanksAsThreadsEqualReferenceSlicing) {
  if (world() > 1) GTEST_SKIP() << "runs in the single-process mode";
  for (int threads : {2, 3, 4}) {
    auto comms = MakeInProcessCommunicators(threads);
    ASSERT_OK(comms);
    std::vector<std::string> failures(threads);
    std::vector<uint64_t> read(threads);
    auto rank_body = [&](int r) {
      Communicator& c = *(*comms)[r];
      DistributedOptions dopts;
      dopts.keep_buffers = true;
      auto d = LoadDistributed(*ckpt_, {}, c, dopts);
      if (!d.ok()) {
        failures[r] = d.status().ToString();
        return;
      }
      read[r] = d->bytes_read();
      for (int dim : {-1, 0, 1}) {
        for (const LoadedTensor& ref : full_.tensors()) {
          if (dim >= static_cast<int>(ref.shape.size())) continue;
          auto t = d->GetSharded(ref.name, dim);
          const std::string what = ref.name + " dim " + std::to_string(dim);
          if (!t.ok()) {
            failures[r] += what + ": " + t.status().ToString() + "\n";
          } else if (t->shape != ExpectedShape(ref, dim, r, threads) ||
                     Bytes(*t) != ReferenceSlice(ref, dim, r, threads)) {
            failures[r] += what + ": wrong slice\n";
          }
        }
      }
    };
    std::vector<std::thread> ranks;
    for (int r = 0; r < threads; ++r) ranks.emplace_back(rank_body, r);
    for (auto& t : ranks) t.join();
    uint64_t sum = 0;
    for (int r = 0; r < threads; ++r) {
      EXPECT_EQ(failures[r], "") << threads << " ranks, rank " << r;
      sum += read[r];
    }
    EXPECT_EQ(sum, ckpt_->total_bytes()) << threads << " ranks read the checkpoint once";
  }
}

// A device tensor's bytes, copied down to the host.
std::vector<std::byte> ToHost(Device& dev, const DeviceTensor& t) {
  std::vector<std::byte> out(t.nbytes);
  if (t.nbytes == 0) return out;
  auto stream = dev.CreateStream();
  EXPECT_OK(stream);
  if (!stream.ok()) return {};
  EXPECT_OK((*stream)->CopyToHost(out.data(), static_cast<const std::byte*>(t.data), t.nbytes));
  EXPECT_OK((*stream)->Synchronize());
  return out;
}

// Loads onto a device (issue 19): ranks as threads, each loading its share
// into the emulated device's memory, the tensors moved between device buffers
// by in-process communicators over that device, the small exchanges by host
// ones. Scattered and per-rank-read tensors, against reference slicing; every
// device buffer is freed once the results and the checkpoint are gone.
TEST_F(DistributedLoaderTest, DeviceLoadsEqualReferenceSlicingOnTheEmulatedDevice) {
  if (world() > 1) GTEST_SKIP() << "runs in the single-process mode";
  auto dev = OpenDevice(DeviceType::kEmulated, 0);
  ASSERT_OK(dev);
  auto free_before = (*dev)->FreeMemory();
  ASSERT_OK(free_before);
  for (int threads : {1, 2, 3}) {
    for (Dim0Mode mode : {Dim0Mode::kScatter, Dim0Mode::kRead}) {
      auto host = MakeInProcessCommunicators(threads);
      auto on_device = MakeInProcessCommunicators(threads, *dev);
      ASSERT_OK(host);
      ASSERT_OK(on_device);
      std::vector<std::string> failures(threads);
      auto rank_body = [&](int r) {
        LoadOptions options;
        options.device = DeviceId::Emulated();
        DistributedOptions dopts;
        dopts.keep_buffers = true;
        dopts.device_comm = (*on_device)[r].get();
        dopts.dim0_sharded = TensorFilter::Names({"a.bf16", "c.f32", "b.i64"});
        dopts.dim0 = mode;
        auto d = LoadDistributed(*ckpt_, options, *(*host)[r], dopts);
        if (!d.ok()) {
          failures[r] = d.status().ToString();
          return;
        }
        if (d->device() != DeviceType::kEmulated) failures[r] += "device() is not kEmulated\n";
        if (auto h = d->GetTensor("a.u8"); h.status().code() != StatusCode::kInvalidArgument) {
          failures[r] += "GetTensor on a device load: " + h.status().ToString() + "\n";
        }
        for (int dim : {-1, 0, 1}) {
          for (const LoadedTensor& ref : full_.tensors()) {
            if (dim >= static_cast<int>(ref.shape.size())) continue;
            auto t = d->GetDeviceSharded(ref.name, dim);
            const std::string what = ref.name + " dim " + std::to_string(dim);
            if (!t.ok()) {
              failures[r] += what + ": " + t.status().ToString() + "\n";
            } else if (t->device != DeviceType::kEmulated ||
                       t->shape != ExpectedShape(ref, dim, r, threads) ||
                       ToHost(**dev, *t) != ReferenceSlice(ref, dim, r, threads)) {
              failures[r] += what + ": wrong slice\n";
            }
          }
        }
        for (const std::string name : {"c.f32", "a.f32"}) {  // Own rows, read by this rank.
          const LoadedTensor* ref = full_.Find(name);
          auto t = d->GetDeviceShardedByRead(name);
          if (!t.ok() || ToHost(**dev, *t) != ReferenceSlice(*ref, 0, r, threads)) {
            failures[r] += name + " by read: " + t.status().ToString() + "\n";
          }
        }
        // A DLPack export keeps the device bytes alive on its own.
        auto t = d->GetDeviceSharded("c.f32", 1);
        if (!t.ok()) return;
        auto m = t->ToDLPackVersioned();
        if (!m.ok()) {
          failures[r] += "ToDLPackVersioned: " + m.status().ToString() + "\n";
          return;
        }
        const DLTensor& dl = (*m)->dl_tensor;
        if (dl.data != t->data || dl.ndim != 2 || dl.shape[0] != 301 ||
            static_cast<uint64_t>(dl.shape[1]) != t->shape[1] ||
            dl.device.device_type != (*dev)->dlpack_device_type()) {
          failures[r] += "ToDLPackVersioned: wrong DLTensor\n";
        }
        const std::vector<std::byte> want = ToHost(**dev, *t);
        auto host_copy = t->ToHost();  // The public way down.
        if (!host_copy.ok() || Bytes(*host_copy) != want || host_copy->shape != t->shape) {
          failures[r] += "DeviceTensor::ToHost: " + host_copy.status().ToString() + "\n";
        }
        *t = DeviceTensor();
        DeviceTensor view;  // The export's bytes, seen through a plain struct.
        view.data = dl.data;
        view.nbytes = want.size();
        if (ToHost(**dev, view) != want) failures[r] += "the export's bytes did not survive\n";
        (*m)->deleter(*m);
      };
      std::vector<std::thread> ranks;
      for (int r = 0; r < threads; ++r) ranks.emplace_back(rank_body, r);
      for (auto& t : ranks) t.join();
      for (int r = 0; r < threads; ++r) {
        EXPECT_EQ(failures[r], "")
            << threads << " ranks, rank " << r << ", mode " << static_cast<int>(mode);
      }
    }
  }
  auto free_after = (*dev)->FreeMemory();
  ASSERT_OK(free_after);
  EXPECT_EQ(*free_after, *free_before) << "device memory left allocated";
}

// One rank onto GPU 0 over a one-rank NCCL communicator: the device path with
// cudaMalloc'd buffers and NCCL's broadcast and scatter (make gpu-check runs
// it; without a GPU or NCCL it skips with the reason). Two GPUs run the
// CLI's --mpi --device cuda (tests/python/test_cli_mpi.py).
TEST_F(DistributedLoaderTest, OneRankOntoAGpuOverNcclOrAClearReason) {
  if (world() > 1) GTEST_SKIP() << "runs in the single-process mode";
  auto single = MakeSingleProcessCommunicator();
  auto nccl = MakeNcclCommunicator(*single, 0);
  if (!nccl.ok()) GTEST_SKIP() << nccl.status().ToString();
  LoadOptions options;
  options.device = DeviceId::Cuda(0);
  DistributedOptions dopts;
  dopts.device_comm = nccl->get();
  dopts.keep_buffers = true;
  dopts.dim0_sharded = TensorFilter::Names({"c.f32"});
  auto d = LoadDistributed(*ckpt_, options, *single, dopts);
  ASSERT_OK(d);
  EXPECT_EQ(d->device(), DeviceType::kCuda);
  for (int dim : {-1, 0, 1}) {
    for (const LoadedTensor& ref : full_.tensors()) {
      if (dim >= static_cast<int>(ref.shape.size())) continue;
      auto t = d->GetDeviceSharded(ref.name, dim);
      ASSERT_OK(t);
      EXPECT_EQ(t->device, DeviceType::kCuda);
      auto host = t->ToHost();
      ASSERT_OK(host);
      EXPECT_EQ(Bytes(*host), ReferenceSlice(ref, dim, 0, 1)) << ref.name << " dim " << dim;
    }
  }
}

TEST_F(DistributedLoaderTest, DeviceLoadsCheckTheirCommunicators) {
  if (world() > 1) GTEST_SKIP() << "runs in the single-process mode";
  auto dev = OpenDevice(DeviceType::kEmulated, 0);
  ASSERT_OK(dev);
  auto on_device = MakeInProcessCommunicators(1, *dev);
  ASSERT_OK(on_device);
  auto host = MakeSingleProcessCommunicator();
  auto other_host = MakeSingleProcessCommunicator();
  LoadOptions options;
  options.device = DeviceId::Emulated();
  auto expect_refused = [](const Result<DistributedCheckpoint>& d, const std::string& words) {
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument) << d.status().ToString();
    EXPECT_NE(d.status().message().find(words), std::string::npos) << d.status().ToString();
  };
  expect_refused(LoadDistributed(*ckpt_, options, *host), "needs DistributedOptions::device_comm");
  DistributedOptions dopts;
  dopts.device_comm = other_host.get();
  expect_refused(LoadDistributed(*ckpt_, options, *host, dopts), "moves host memory");
  dopts.device_comm = (*on_device)[0].get();
  expect_refused(LoadDistributed(*ckpt_, {}, *host, dopts), "for loads onto a device");
  auto d = LoadDistributed(*ckpt_, {}, *host);
  ASSERT_OK(d);
  EXPECT_EQ(d->device(), DeviceType::kCpu);
  EXPECT_EQ(d->GetDeviceTensor("a.u8").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tensorlift

int main(int argc, char** argv) {
  using namespace tensorlift;  // NOLINT: test main.
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--mpi") == 0) g_mpi = true;
  }
  std::unique_ptr<Communicator> comm;
  if (g_mpi) {
    auto c = MakeMpiCommunicator();
    if (!c.ok()) {
      std::fprintf(stderr, "MakeMpiCommunicator: %s\n", c.status().ToString().c_str());
      return 1;
    }
    comm = std::move(c).value();
    if (comm->rank() != 0) {
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new tensorlift::testing::RankFailurePrinter(comm->rank()));
    }
  } else {
    comm = MakeSingleProcessCommunicator();
  }
  g_comm = comm.get();
  return RUN_ALL_TESTS();
}
