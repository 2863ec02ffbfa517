// The staged pipeline to a device, on the emulated device (separate memory,
// asynchronous copies): every mode gives the file's bytes (odd header sizes,
// misaligned and zero-size tensors, filters, shards, tiny and large staging
// buffers); conversions give convert.h's bits; reads overlap copies and stay
// in flight when they complete out of order; pinned slots are kept for the
// next load; the device-memory plan is computed first and respected; errors
// free everything.
#include "load/device_pipeline.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "../common/assert_ok.h"
#include "../load/test_files.h"
#include "device/device.h"
#include "device/emulated_device.h"
#include "io/direct_reader.h"
#include "io/page_cache.h"
#include "load/device_plan.h"
#include "load/planner.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/convert.h"
#include "tensorlift/loader.h"

namespace tensorlift {
namespace {

using test::ScratchDir;
using ::testing::HasSubstr;
using testing::Random;
using testing::RawTensor;
using testing::WriteRaw;

// The loader tests' mix, plus what conversions need: fp8 and a larger f32.
std::vector<RawTensor> MixedTensors(uint32_t seed) {
  std::vector<RawTensor> out = testing::MixedTensors(seed);
  out.push_back(Random("k.fp8", Dtype::kF8_E4M3, {77}, seed + 11));
  out.push_back(Random("l.f32", Dtype::kF32, {40000}, seed + 12));
  return out;
}

// Copies a device tensor's bytes back to the host.
std::vector<uint8_t> ToHost(Device& device, const LoadedTensor& t) {
  std::vector<uint8_t> out(t.nbytes);
  if (t.nbytes == 0) return out;
  auto stream = device.CreateStream();
  EXPECT_OK(stream);
  EXPECT_OK((*stream)->CopyToHost(reinterpret_cast<std::byte*>(out.data()),
                                  static_cast<std::byte*>(t.data), t.nbytes));
  EXPECT_OK((*stream)->Synchronize());
  return out;
}

std::vector<uint8_t> Converted(const RawTensor& t, Dtype to) {
  const uint64_t n = t.bytes.size() / (DtypeBits(t.dtype) / 8);
  std::vector<uint8_t> out(n * DtypeBits(to) / 8);
  // An aligned copy of the source (ConvertOnHost reads whole elements).
  std::vector<uint64_t> src((t.bytes.size() + 7) / 8);
  std::memcpy(src.data(), t.bytes.data(), t.bytes.size());
  EXPECT_TRUE(ConvertOnHost(reinterpret_cast<std::byte*>(out.data()), to,
                            reinterpret_cast<const std::byte*>(src.data()), t.dtype, n)
                  .ok());
  return out;
}

void ExpectLoaded(Device& device, const std::map<std::string, RawTensor>& want,
                  const LoadedCheckpoint& got, std::optional<Dtype> dtype, const std::string& ctx) {
  ASSERT_EQ(got.tensors().size(), want.size()) << ctx;
  for (const LoadedTensor& t : got.tensors()) {
    auto it = want.find(t.name);
    ASSERT_NE(it, want.end()) << ctx << " " << t.name;
    const RawTensor& w = it->second;
    const Dtype target = TargetDtype(w.dtype, dtype);
    EXPECT_EQ(t.dtype, target) << ctx << " " << t.name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % ElementAlignment(t.dtype), 0u)
        << ctx << " " << t.name;
    const std::vector<uint8_t> expect = target == w.dtype ? w.bytes : Converted(w, target);
    ASSERT_EQ(t.nbytes, expect.size()) << ctx << " " << t.name;
    if (device.kind() == DeviceType::kCpu) {
      EXPECT_EQ(t.device, DeviceType::kCpu);
      if (t.nbytes) {
        EXPECT_EQ(std::memcmp(t.data, expect.data(), t.nbytes), 0) << ctx << " " << t.name;
      }
    } else {
      EXPECT_EQ(t.device, DeviceType::kEmulated);
      EXPECT_EQ(ToHost(device, t), expect) << ctx << " " << t.name;
    }
  }
}

std::shared_ptr<Device> Emulated(uint64_t memory = 1ull << 30, double rate = 0) {
  EmulatedDeviceOptions o;
  o.memory_bytes = memory;
  o.copy_bytes_per_second = rate;
  return MakeEmulatedDevice(o);
}

TEST(DevicePlanTest, CoversEveryByteOnceAndKeepsAlignment) {
  for (size_t lead = 0; lead < 8; ++lead) {
    ScratchDir dir;
    const std::string path = dir.File("m.safetensors");
    WriteRaw(path, MixedTensors(1), lead);
    auto ckpt = Checkpoint::Open(path);
    ASSERT_OK(ckpt);
    const Header& h = ckpt->shards()[0].header;
    std::vector<uint32_t> all(h.tensors().size());
    for (uint32_t i = 0; i < all.size(); ++i) all[i] = i;
    for (bool direct : {false, true}) {
      for (std::optional<Dtype> dt : {std::optional<Dtype>(), std::optional<Dtype>(Dtype::kF32)}) {
        const uint64_t slot = 64 << 10;
        DeviceFilePlan p = PlanDeviceFile(h, all, dt, direct, slot);
        std::vector<int> covered(h.data_size(), 0);
        for (const DeviceBlock& b : p.blocks) {
          EXPECT_LE(b.read_length, StagingSlotBytes(slot));
          EXPECT_LE(b.min_read, b.read_length);
          if (direct) {
            EXPECT_EQ(b.read_offset % 4096, 0u);
            EXPECT_EQ(b.read_length % 4096, 0u);
          }
          for (const BlockCopy& c : b.copies) {
            EXPECT_LE(c.slot_offset + c.bytes, b.min_read);
            const uint64_t file_pos = b.read_offset + c.slot_offset - h.data_offset();
            for (uint64_t i = 0; i < c.bytes; ++i) ++covered[file_pos + i];
            if (c.convert) {
              EXPECT_EQ(c.bytes % (DtypeBits(c.from) / 8), 0u) << "a block cuts an element";
              EXPECT_EQ(c.scratch_offset % 8, 0u);
              EXPECT_LE(c.scratch_offset + c.bytes, p.scratch_bytes);
            }
          }
        }
        for (uint32_t i : all) {
          const TensorInfo& t = h.tensors()[i];
          for (uint64_t b = t.begin; b < t.end; ++b)
            ASSERT_EQ(covered[b], 1) << t.name << " byte " << b;
        }
        for (const DeviceTensorPlan& t : p.tensors) {
          EXPECT_EQ(t.offset % ElementAlignment(t.dtype), 0u);
          EXPECT_LE(t.offset + t.bytes, p.device_bytes);
        }
        // Realigned: the tensors misaligned in the data section (not
        // converted), whatever the header size.
        uint32_t misaligned = 0, converted = 0;
        for (uint32_t i : all) {
          const TensorInfo& t = h.tensors()[i];
          if (t.nbytes() == 0) continue;
          if (TargetDtype(t.dtype, dt) != t.dtype) {
            ++converted;
          } else if (t.begin % ElementAlignment(t.dtype) != 0) {
            ++misaligned;
          }
        }
        EXPECT_GT(misaligned, 0u);
        EXPECT_EQ(p.realigned, misaligned) << "lead " << lead;
        EXPECT_EQ(p.converted, converted) << "lead " << lead;
      }
    }
  }
}

// Direct blocks end on a page of the file: a block's read starts where the
// one before it ended (no page read twice), and a full block reads exactly
// the slot's bytes (16 MiB + 4 KiB was five requests of a disk that takes
// 4 MiB at most). Converted tensors' blocks end on whole elements too, which
// a page of the file is when the data starts on 8 bytes.
TEST(DevicePlanTest, DirectBlocksEndOnAPageOfTheFile) {
  int converted_cases = 0;
  for (size_t lead = 0; lead < 8; ++lead) {
    ScratchDir dir;
    const std::string path = dir.File("m.safetensors");
    WriteRaw(path,
             {Random("a", Dtype::kBF16, {3, 100000}, 1), Random("b", Dtype::kF32, {7, 50001}, 2)},
             lead);
    auto ckpt = Checkpoint::Open(path);
    ASSERT_OK(ckpt);
    const Header& h = ckpt->shards()[0].header;
    ASSERT_NE(h.data_offset() % 4096, 0u) << "the data would start on a page: nothing to check";
    const std::vector<uint32_t> all = {0, 1};
    for (std::optional<Dtype> dt : {std::optional<Dtype>(), std::optional<Dtype>(Dtype::kF16)}) {
      if (dt && h.data_offset() % 8 != 0) continue;
      converted_cases += dt.has_value();
      const uint64_t slot = 64 << 10;
      DeviceFilePlan p = PlanDeviceFile(h, all, dt, true, slot);
      ASSERT_GT(p.blocks.size(), 10u);
      for (size_t k = 0; k + 1 < p.blocks.size(); ++k) {
        const DeviceBlock& b = p.blocks[k];
        EXPECT_EQ(p.blocks[k + 1].read_offset, b.read_offset + b.read_length)
            << "lead " << lead << " block " << k << ": the next read starts where this one ended";
        EXPECT_LE(b.read_length, slot) << "lead " << lead << " block " << k;
        if (k > 0) {
          EXPECT_EQ(b.read_length, slot) << "lead " << lead << " block " << k << " is full";
        }
      }
    }
  }
  EXPECT_GT(converted_cases, 0) << "no header size kept the data on 8 bytes";
}

struct PipelineCase {
  IoMode mode;
  uint64_t staging;
  int slots;
};

class DevicePipelineTest : public ::testing::TestWithParam<size_t> {};

TEST_P(DevicePipelineTest, EveryModeGivesTheFileBytesOnTheDevice) {
  ScratchDir dir;
  const std::string path = dir.File("m.safetensors");
  auto tensors = MixedTensors(static_cast<uint32_t>(GetParam()));
  WriteRaw(path, tensors, GetParam());
  std::map<std::string, RawTensor> want;
  for (auto& t : tensors) want[t.name] = t;
  auto ckpt = Checkpoint::Open(path);
  ASSERT_OK(ckpt);
  auto device = Emulated();
  for (IoMode m : {IoMode::kAuto, IoMode::kBuffered, IoMode::kDirect, IoMode::kMmap}) {
    for (PipelineCase c : {PipelineCase{m, 64 << 10, 1}, PipelineCase{m, 64 << 10, 3},
                           PipelineCase{m, 16 << 20, 4}}) {
      for (std::optional<Dtype> dt : {std::optional<Dtype>(), std::optional<Dtype>(Dtype::kF32),
                                      std::optional<Dtype>(Dtype::kBF16)}) {
        LoadOptions opts;
        opts.mode = c.mode;
        opts.staging_bytes = c.staging;
        opts.staging_buffers = c.slots;
        opts.dtype = dt;
        const std::string ctx =
            std::string(IoModeName(m)) + " staging=" + std::to_string(c.staging) + "x" +
            std::to_string(c.slots) + " dtype=" + (dt ? std::string(DtypeName(*dt)) : "-") +
            " lead=" + std::to_string(GetParam());
        auto got = LoadThroughDevice(*ckpt, opts, device, nullptr);
        ASSERT_OK(got) << ctx;
        ExpectLoaded(*device, want, *got, dt, ctx);
        ASSERT_EQ(got->files().size(), 1u);
        EXPECT_NE(got->files()[0].mode, IoMode::kAuto);
        EXPECT_NE(got->files()[0].mode, IoMode::kMmap);
      }
    }
  }
  auto free_now = device->FreeMemory();
  ASSERT_OK(free_now);
  EXPECT_EQ(*free_now, 1ull << 30) << "every load's device memory was freed";
}

INSTANTIATE_TEST_SUITE_P(HeaderShift, DevicePipelineTest, ::testing::Values(0, 1, 2, 3, 5, 7));

TEST(DevicePipelineTest, ShardsAndFilters) {
  ScratchDir dir;
  std::map<std::string, RawTensor> want;
  std::string index = "{\"weight_map\":{";
  for (int s = 0; s < 3; ++s) {
    std::vector<RawTensor> ts = {
        Random("s" + std::to_string(s) + ".x", Dtype::kBF16, {64, 65}, 10 + s),
        Random("s" + std::to_string(s) + ".y", Dtype::kF32, {7}, 20 + s)};
    const std::string name = "s-" + std::to_string(s) + ".safetensors";
    WriteRaw(dir.File(name), ts, s);
    for (auto& t : ts) {
      if (t.name.ends_with(".x")) want[t.name] = t;
      index += std::string(index.back() == '{' ? "" : ",") + "\"" + t.name + "\":\"" + name + "\"";
    }
  }
  index += "}}";
  FILE* f = std::fopen(dir.File("model.safetensors.index.json").c_str(), "w");
  std::fwrite(index.data(), 1, index.size(), f);
  std::fclose(f);
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_OK(ckpt);
  auto device = Emulated();
  LoadOptions opts;
  auto re = TensorFilter::Regex("\\.x$");
  ASSERT_OK(re);
  opts.filter = *re;
  opts.staging_bytes = 64 << 10;
  opts.staging_buffers = 2;
  auto got = LoadThroughDevice(*ckpt, opts, device, nullptr);
  ASSERT_OK(got);
  ExpectLoaded(*device, want, *got, std::nullopt, "shards");
  EXPECT_EQ(got->files().size(), 3u);
}

// The trace's promises, whatever the timing: every block copied after it was
// read, the copies of each stream completing in the order they were enqueued
// on it (two streams from three slots up, slot s on stream s % 2), and a slot
// never read into again before the copies out of it completed.
void ExpectTraceConsistent(const PipelineTrace& trace, int slots) {
  std::vector<const PipelineTrace::Block*> by_enqueue(trace.blocks.size());
  std::map<int, std::vector<const PipelineTrace::Block*>> by_slot;
  for (size_t k = 0; k < trace.blocks.size(); ++k) {
    const auto& b = trace.blocks[k];
    EXPECT_GT(b.copied_us, 0) << k;
    EXPECT_LE(b.read_end_us, b.copied_us) << "copied before it was read: " << k;
    ASSERT_GE(b.slot, 0) << k;
    ASSERT_LT(b.slot, slots) << k;
    ASSERT_GE(b.enqueued, 0) << k;
    ASSERT_LT(b.enqueued, static_cast<int64_t>(trace.blocks.size())) << k;
    EXPECT_EQ(by_enqueue[b.enqueued], nullptr) << "enqueued twice: " << b.enqueued;
    by_enqueue[b.enqueued] = &b;
    by_slot[b.slot].push_back(&b);
  }
  const int streams = slots >= 3 ? 2 : 1;
  std::map<int, const PipelineTrace::Block*> last_on;  // By stream.
  for (size_t i = 0; i < by_enqueue.size(); ++i) {
    const auto* b = by_enqueue[i];
    ASSERT_NE(b, nullptr) << i;
    EXPECT_EQ(b->stream, b->slot % streams) << i;
    if (const auto* prev = last_on[b->stream]) {
      EXPECT_LE(prev->copied_us, b->copied_us) << "stream " << b->stream << " order " << i;
    }
    last_on[b->stream] = b;
  }
  for (auto& [slot, uses] : by_slot) {
    std::sort(uses.begin(), uses.end(),
              [](auto* a, auto* b) { return a->read_start_us < b->read_start_us; });
    for (size_t i = 0; i + 1 < uses.size(); ++i) {
      EXPECT_GE(uses[i + 1]->read_start_us, uses[i]->copied_us) << "slot " << slot << " refilled";
    }
  }
}

// A blocking fake for the pipeline's reads and copies, so that a test decides
// the order in which things happen instead of measuring when they did: the
// pipeline's reads (PipelineTrace::before_read) wait until the test releases
// them, and while copies are held the slots' events (Done, Synchronize) say
// that the copies before them are still running, so that no slot is given
// back to the readers. The test then counts what the pipeline has *issued* at
// each step (reads started, blocks whose copies were enqueued), which does not
// depend on how busy the machine is.
class PipelineGate {
 public:
  PipelineGate() = default;
  // Lets everything go and waits for the load, on every path out of the test.
  ~PipelineGate() {
    HoldReads(false);
    HoldCopies(false);
    if (load_.joinable()) load_.join();
  }
  PipelineGate(const PipelineGate&) = delete;
  PipelineGate& operator=(const PipelineGate&) = delete;

  // Reads wait for Release (else they go at once, counted).
  void HoldReads(bool hold) { Set(&hold_reads_, hold); }
  // Slots' events say "not done" until HoldCopies(false).
  void HoldCopies(bool hold) { Set(&hold_copies_, hold); }

  // `device`, with its streams and events seen through the gate.
  std::shared_ptr<Device> Wrap(std::shared_ptr<Device> device);

  // Starts LoadThroughDevice on a thread of its own, with the gate's trace.
  void Start(const Checkpoint& ckpt, const LoadOptions& opts, std::shared_ptr<Device> device) {
    trace_.before_read = [this](int64_t k) { return BeforeRead(k); };
    load_ = std::thread([this, &ckpt, opts, device] {
      result_.emplace(LoadThroughDevice(ckpt, opts, device, &trace_));
    });
  }

  // Waits until `done(issued, in_flight, enqueued)` holds: `issued` the
  // blocks whose reads started, in the order they did; `in_flight` those not
  // yet released; `enqueued` the blocks whose copies were enqueued. A stalled
  // pipeline never gets there: false after a minute (a watchdog, not a
  // measure: each step is microseconds of work).
  using Pred = std::function<bool(const std::vector<int64_t>& issued,
                                  const std::set<int64_t>& in_flight, int64_t enqueued)>;
  bool WaitUntil(const Pred& done) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(60),
                        [&] { return done(issued_, in_flight_, enqueued_); });
  }
  // Reads in flight (issued, not released) and blocks enqueued, now.
  std::set<int64_t> InFlight() {
    std::lock_guard<std::mutex> lock(mu_);
    return in_flight_;
  }
  std::string Describe() {
    std::lock_guard<std::mutex> lock(mu_);
    std::string s = std::to_string(issued_.size()) + " reads issued, in flight:";
    for (int64_t k : in_flight_) s += " " + std::to_string(k);
    return s + "; " + std::to_string(enqueued_) + " blocks' copies enqueued";
  }
  // The most reads in flight at once so far.
  size_t MostInFlight() {
    std::lock_guard<std::mutex> lock(mu_);
    return most_in_flight_;
  }

  // Lets read `k` go (it must be in flight).
  void Release(int64_t k) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ASSERT_EQ(in_flight_.erase(k), 1u) << "read " << k << " is not in flight";
      released_.insert(k);
    }
    cv_.notify_all();
  }

  // Lets everything go and returns the load's result.
  Result<LoadedCheckpoint> Finish() {
    HoldReads(false);
    HoldCopies(false);
    if (load_.joinable()) load_.join();
    if (!result_) return Status(StatusCode::kInternal, "not started");
    return std::move(*result_);
  }

  const PipelineTrace& trace() const { return trace_; }

 private:
  class Event;
  class Stream;
  class WrappedDevice;

  void Set(bool* flag, bool value) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      *flag = value;
    }
    cv_.notify_all();
  }

  Status BeforeRead(int64_t k) {
    std::unique_lock<std::mutex> lock(mu_);
    issued_.push_back(k);
    if (hold_reads_) {
      in_flight_.insert(k);
      most_in_flight_ = std::max(most_in_flight_, in_flight_.size());
      cv_.notify_all();
      cv_.wait(lock, [&] { return released_.count(k) || !hold_reads_; });
      in_flight_.erase(k);
    }
    cv_.notify_all();
    return Status::Ok();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool hold_reads_ = false;
  bool hold_copies_ = false;
  std::vector<int64_t> issued_;
  std::set<int64_t> in_flight_;
  std::set<int64_t> released_;
  size_t most_in_flight_ = 0;
  int64_t enqueued_ = 0;  // Records of a slot's event: one a block.
  PipelineTrace trace_;
  std::optional<Result<LoadedCheckpoint>> result_;
  std::thread load_;
};

class PipelineGate::Event : public DeviceEvent {
 public:
  Event(PipelineGate* gate, std::unique_ptr<DeviceEvent> inner)
      : gate_(gate), inner_(std::move(inner)) {}
  Status Synchronize() override {
    {
      std::unique_lock<std::mutex> lock(gate_->mu_);
      gate_->cv_.wait(lock, [&] { return !gate_->hold_copies_; });
    }
    return inner_->Synchronize();
  }
  bool Done() override {
    {
      std::lock_guard<std::mutex> lock(gate_->mu_);
      if (gate_->hold_copies_) return false;
    }
    return inner_->Done();
  }
  double CompletedAtMicros() override { return inner_->CompletedAtMicros(); }
  DeviceEvent& inner() { return *inner_; }

 private:
  PipelineGate* gate_;
  std::unique_ptr<DeviceEvent> inner_;
};

class PipelineGate::Stream : public DeviceStream {
 public:
  Stream(PipelineGate* gate, std::unique_ptr<DeviceStream> inner)
      : gate_(gate), inner_(std::move(inner)) {}
  Status CopyToDevice(std::byte* dst, const std::byte* src, uint64_t bytes) override {
    return inner_->CopyToDevice(dst, src, bytes);
  }
  Status CopyOnDevice(std::byte* dst, const std::byte* src, uint64_t bytes) override {
    return inner_->CopyOnDevice(dst, src, bytes);
  }
  Status CopyToHost(std::byte* dst, const std::byte* src, uint64_t bytes) override {
    return inner_->CopyToHost(dst, src, bytes);
  }
  Status Convert(std::byte* dst, Dtype to, const std::byte* src, Dtype from,
                 uint64_t count) override {
    return inner_->Convert(dst, to, src, from, count);
  }
  Status DecodeBitmask(std::byte* dst, const std::byte* values, uint64_t nnz,
                       const uint8_t* bitmask, const int64_t* row_offsets, uint64_t rows,
                       uint64_t cols, uint32_t elem_bytes) override {
    return inner_->DecodeBitmask(dst, values, nnz, bitmask, row_offsets, rows, cols, elem_bytes);
  }
  // The pipeline records a slot's event once a block, after its copies.
  Status Record(DeviceEvent& event) override {
    Status st = inner_->Record(static_cast<Event&>(event).inner());
    {
      std::lock_guard<std::mutex> lock(gate_->mu_);
      ++gate_->enqueued_;
    }
    gate_->cv_.notify_all();
    return st;
  }
  Status Synchronize() override { return inner_->Synchronize(); }

 private:
  PipelineGate* gate_;
  std::unique_ptr<DeviceStream> inner_;
};

class PipelineGate::WrappedDevice : public Device {
 public:
  WrappedDevice(PipelineGate* gate, std::shared_ptr<Device> inner)
      : gate_(gate), inner_(std::move(inner)) {}
  DeviceType kind() const override { return inner_->kind(); }
  int ordinal() const override { return inner_->ordinal(); }
  std::string name() const override { return inner_->name(); }
  int dlpack_device_type() const override { return inner_->dlpack_device_type(); }
  Result<std::shared_ptr<Buffer>> Allocate(uint64_t bytes) override {
    return inner_->Allocate(bytes);
  }
  Result<std::shared_ptr<Buffer>> AllocatePinned(uint64_t bytes) override {
    return inner_->AllocatePinned(bytes);
  }
  Result<std::unique_ptr<DeviceStream>> CreateStream() override {
    TL_ASSIGN_OR_RETURN(auto s, inner_->CreateStream());
    return std::unique_ptr<DeviceStream>(new Stream(gate_, std::move(s)));
  }
  Result<std::unique_ptr<DeviceEvent>> CreateEvent() override {
    TL_ASSIGN_OR_RETURN(auto e, inner_->CreateEvent());
    return std::unique_ptr<DeviceEvent>(new Event(gate_, std::move(e)));
  }
  Result<uint64_t> FreeMemory() override { return inner_->FreeMemory(); }
  std::string identity() const override { return inner_->identity(); }

 private:
  PipelineGate* gate_;
  std::shared_ptr<Device> inner_;
};

std::shared_ptr<Device> PipelineGate::Wrap(std::shared_ptr<Device> device) {
  return std::make_shared<WrappedDevice>(this, std::move(device));
}

// While the copies out of the first slots are still running (held: none
// completes), the readers go on reading the next blocks into the other slots:
// with 4 slots, four blocks are read while the first block's copies run. (A
// pipeline that read a block only once the last one was copied would stop at
// one.) The loading thread, once every slot is taken, waits for the oldest
// copy and enqueues the blocks read meanwhile after it, so how many were
// enqueued by then depends on which thread ran first: at least one.
TEST(DevicePipelineTest, ReadsOverlapCopies) {
  ScratchDir dir;
  const std::string path = dir.File("m.safetensors");
  const RawTensor w = Random("w", Dtype::kBF16, {1024, 1024}, 3);  // 2 MiB.
  WriteRaw(path, {w}, 0);
  auto ckpt = Checkpoint::Open(path);
  ASSERT_OK(ckpt);
  auto device = Emulated(1ull << 30, 64e6);
  LoadOptions opts;
  opts.mode = IoMode::kBuffered;
  opts.staging_bytes = 64 << 10;
  opts.staging_buffers = 4;
  PipelineGate gate;
  gate.HoldCopies(true);
  gate.Start(*ckpt, opts, gate.Wrap(device));
  EXPECT_TRUE(gate.WaitUntil([](auto& issued, auto&, int64_t enqueued) {
    return issued.size() == 4 && enqueued >= 1;
  })) << "reads wait for copies: "
      << gate.Describe();
  auto got = gate.Finish();
  ASSERT_OK(got);
  ExpectLoaded(*device, {{"w", w}}, *got, std::nullopt, "overlap");
  ASSERT_EQ(gate.trace().blocks.size(), 32u);
  ExpectTraceConsistent(gate.trace(), 4);
}

// `w` written alone (after `lead` bytes of header padding) and opened.
Result<Checkpoint> OneTensorFile(const ScratchDir& dir, const RawTensor& w, size_t lead) {
  const std::string path = dir.File("m.safetensors");
  WriteRaw(path, {w}, lead);
  return Checkpoint::Open(path);
}

// The blocks a load of the one-shard checkpoint `ckpt` reads through the
// page cache (the pipeline's plan, PlanFiles).
int64_t BufferedBlocks(const Checkpoint& ckpt, const LoadOptions& opts) {
  const Header& h = ckpt.shards()[0].header;
  std::vector<uint32_t> all(h.tensors().size());
  for (uint32_t i = 0; i < all.size(); ++i) all[i] = i;
  return static_cast<int64_t>(
      PlanDeviceFile(h, all, std::nullopt, false, opts.staging_bytes).blocks.size());
}

// The pipeline's state once `released` of `nblocks` reads have completed and
// it has caught up: those blocks' copies enqueued, and a read in flight on
// every one of `readers` readers (or on every block left), none beyond.
PipelineGate::Pred Settled(int readers, int64_t nblocks, int64_t released) {
  const size_t want = std::min<int64_t>(readers, nblocks - released);
  return [=](const std::vector<int64_t>& issued, const std::set<int64_t>& in_flight,
             int64_t enqueued) {
    return in_flight.size() == want && enqueued == released &&
           issued.size() == static_cast<size_t>(released) + want;
  };
}

// Reads that complete out of order (every fourth block's read is slow: held
// until five later reads completed) while the test releases one read at a
// time: after every release the pipeline has a read in flight on every
// reader (readers = slots - 1) again, as long as blocks remain, so no reader
// waits for a slow read's neighbours; each block's copies are enqueued as soon
// as its read completes, in the order the reads complete; and the first read to
// complete while every copy is held still finds a slot (the spare one). The
// bytes are the file's. (Slots tied to blocks k mod slots, copied in load
// order, stalled here with fewer than half of the readers reading.)
TEST(DevicePipelineTest, ReadsStayInFlightWhenTheyCompleteOutOfOrder) {
  ScratchDir dir;
  const RawTensor w = Random("w", Dtype::kBF16, {2048, 1024}, 5);  // 4 MiB: 64 blocks.
  auto ckpt = OneTensorFile(dir, w, 3);
  ASSERT_OK(ckpt);
  constexpr int kSlots = 7, kReaders = kSlots - 1;
  auto device = Emulated(1ull << 30, 1e9);
  LoadOptions opts;
  opts.mode = IoMode::kBuffered;
  opts.staging_bytes = 64 << 10;
  opts.staging_buffers = kSlots;
  const int64_t nblocks = BufferedBlocks(*ckpt, opts);
  ASSERT_GE(nblocks, 64);
  PipelineGate gate;
  gate.HoldReads(true);
  gate.HoldCopies(true);
  gate.Start(*ckpt, opts, gate.Wrap(device));
  auto settled = [&](int64_t released) { return Settled(kReaders, nblocks, released); };
  ASSERT_TRUE(gate.WaitUntil(settled(0))) << gate.Describe();
  // Every copy held: the read that completes takes the spare slot.
  gate.Release(0);
  ASSERT_TRUE(gate.WaitUntil(settled(1))) << "no spare slot: " << gate.Describe();
  gate.HoldCopies(false);

  std::map<int64_t, int64_t> released_at;  // Block -> how many were released before it.
  std::map<int64_t, int64_t> held_since;   // Slow block -> releases when it was first seen.
  released_at[0] = 0;
  for (int64_t released = 1; released < nblocks; ++released) {
    const std::set<int64_t> in_flight = gate.InFlight();
    ASSERT_FALSE(in_flight.empty()) << gate.Describe();
    int64_t next = -1;
    for (int64_t k : in_flight) {
      held_since.emplace(k, released);
      const bool slow = k % 4 == 1 && released - held_since[k] < 5;
      if (!slow) {
        next = k;
        break;
      }
    }
    if (next < 0) next = *in_flight.begin();
    released_at[next] = released;
    gate.Release(next);
    ASSERT_TRUE(gate.WaitUntil(settled(released + 1)))
        << "after " << released + 1 << " reads completed: " << gate.Describe();
  }
  EXPECT_EQ(gate.MostInFlight(), static_cast<size_t>(kReaders)) << "one read a reader";
  auto got = gate.Finish();
  ASSERT_OK(got);
  ExpectLoaded(*device, {{"w", w}}, *got, std::nullopt, "uneven reads");
  const PipelineTrace& trace = gate.trace();
  ASSERT_EQ(trace.blocks.size(), static_cast<size_t>(nblocks));
  ExpectTraceConsistent(trace, kSlots);
  int out_of_order = 0;
  for (int64_t k = 0; k < nblocks; ++k) {
    EXPECT_EQ(trace.blocks[k].enqueued, released_at[k]) << "copies wait for earlier reads: " << k;
    if (released_at[k] != k) ++out_of_order;
  }
  EXPECT_GT(out_of_order, 16) << "the release order should differ from the load order";
}

// Reads that complete together (a virtual disk completes them in batches),
// with every copy held: with the default slots every reader finds a spare slot
// at once and reads its next block, so the disk never waits for the copies.
// (With a single spare slot, as before, all but one of a batch's readers
// waited for copies.) Then batch after batch with the copies running: every
// reader reads again after each batch, and the bytes are the file's.
TEST(DevicePipelineTest, ReadsThatCompleteTogetherNeverWaitForCopies) {
  ScratchDir dir;
  const RawTensor w = Random("w", Dtype::kBF16, {2048, 1024}, 6);  // 4 MiB: 64 blocks.
  auto ckpt = OneTensorFile(dir, w, 0);
  ASSERT_OK(ckpt);
  LoadOptions opts;
  opts.mode = IoMode::kBuffered;
  opts.staging_bytes = 64 << 10;
  const int slots = StagingSlots(opts), readers = StagingReaders(opts, slots);
  const int64_t nblocks = BufferedBlocks(*ckpt, opts);
  ASSERT_GE(nblocks, 64);
  auto device = Emulated(1ull << 30, 1e9);
  PipelineGate gate;
  gate.HoldReads(true);
  gate.HoldCopies(true);
  gate.Start(*ckpt, opts, gate.Wrap(device));
  auto settled = [&](int64_t released) { return Settled(readers, nblocks, released); };
  ASSERT_TRUE(gate.WaitUntil(settled(0))) << gate.Describe();
  int64_t released = 0;
  bool first = true;
  while (released < nblocks) {
    const std::set<int64_t> batch = gate.InFlight();
    ASSERT_FALSE(batch.empty()) << gate.Describe();
    for (int64_t k : batch) gate.Release(k);
    released += static_cast<int64_t>(batch.size());
    ASSERT_TRUE(gate.WaitUntil(settled(released)))
        << (first ? "readers waited for copies: " : "") << gate.Describe();
    if (first) gate.HoldCopies(false);
    first = false;
  }
  EXPECT_EQ(gate.MostInFlight(), static_cast<size_t>(readers));
  auto got = gate.Finish();
  ASSERT_OK(got);
  ExpectLoaded(*device, {{"w", w}}, *got, std::nullopt, "batched reads");
  ASSERT_EQ(gate.trace().blocks.size(), static_cast<size_t>(nblocks));
  ExpectTraceConsistent(gate.trace(), slots);
}

// Auto reads a partly cached file per block: the cached blocks through the
// page cache, the others with O_DIRECT; the bytes are the file's either way.
TEST(DevicePipelineTest, AutoReadsAPartlyCachedFilePerBlock) {
  ScratchDir dir;
  const std::string path = dir.File("m.safetensors");
  const std::vector<RawTensor> tensors = {Random("w", Dtype::kBF16, {1024, 1024}, 5)};  // 2 MiB.
  WriteRaw(path, tensors, 0);
  auto ckpt = Checkpoint::Open(path);  // Reads the header (and what readahead takes).
  ASSERT_OK(ckpt);
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::fsync(fd), 0);
  ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
  ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM), 0);  // No readahead past the half.
  const uint64_t data = ckpt->shards()[0].header.data_offset();
  const uint64_t half = 1 << 20;
  std::vector<char> buf(half);
  ASSERT_EQ(::pread(fd, buf.data(), half, 0), static_cast<ssize_t>(half));  // The first MiB cached.
  auto first = ResidentFraction(fd, data, half - data);
  auto second = ResidentFraction(fd, half + 4096, half - 4096);
  ::close(fd);
  ASSERT_OK(first);
  ASSERT_OK(second);
  if (*first < 1 || *second > 0) {
    GTEST_SKIP() << "this filesystem does not keep the page cache as asked (first half " << *first
                 << ", second " << *second << " resident)";
  }
  auto device = Emulated();
  LoadOptions opts;
  opts.staging_bytes = 64 << 10;
  opts.staging_buffers = 3;
  PipelineTrace trace;
  auto got = LoadThroughDevice(*ckpt, opts, device, &trace);
  ASSERT_OK(got);
  ExpectLoaded(*device, {{"w", tensors[0]}}, *got, std::nullopt, "partly cached");
  const FileReport& f = got->files()[0];
  if (f.mode == IoMode::kBuffered) {
    EXPECT_THAT(f.reason, HasSubstr("refuses O_DIRECT"));
    return;
  }
  EXPECT_EQ(f.mode, IoMode::kDirect) << f.reason;
  EXPECT_THAT(f.reason, HasSubstr("per block, the cached ones through the page cache"));
  ExpectTraceConsistent(trace, 3);
  // Blocks wholly in the first MiB came from the page cache, those past it not.
  const std::vector<uint32_t> wanted = {0};
  const DeviceFilePlan plan =
      PlanDeviceFile(ckpt->shards()[0].header, wanted, std::nullopt, true, opts.staging_bytes);
  ASSERT_EQ(plan.blocks.size(), trace.blocks.size());
  int cached = 0, direct = 0;
  for (size_t k = 0; k < plan.blocks.size(); ++k) {
    const DeviceBlock& b = plan.blocks[k];
    if (b.read_offset + b.min_read <= half) {
      EXPECT_TRUE(trace.blocks[k].cached) << "the block at " << b.read_offset;
      ++cached;
    } else if (b.read_offset >= half + 4096) {
      EXPECT_FALSE(trace.blocks[k].cached) << "the block at " << b.read_offset;
      ++direct;
    }
  }
  EXPECT_GT(cached, 8);
  EXPECT_GT(direct, 8);
}

// By default (staging_buffers 0) a load has a reader per CPU (4 to 16) and two
// slots per reader: enough reads in flight to feed the copies from the page
// cache, and a spare slot for each. staging_buffers N: N - 1 readers.
TEST(DevicePipelineTest, DefaultStagingFollowsTheCpuCount) {
  LoadOptions opts;
  EXPECT_EQ(opts.staging_buffers, 0);
  const unsigned cpus = std::thread::hardware_concurrency();
  const int slots = StagingSlots(opts);
  const int readers = StagingReaders(opts, slots);
  EXPECT_EQ(readers, static_cast<int>(std::clamp<unsigned>(cpus == 0 ? 4 : cpus, 4, 16)));
  EXPECT_EQ(slots, 2 * readers);
  opts.staging_buffers = 5;
  EXPECT_EQ(StagingSlots(opts), 5);
  EXPECT_EQ(StagingReaders(opts, 5), 4);
  opts.staging_buffers = 1;
  EXPECT_EQ(StagingReaders(opts, 1), 1);

  ScratchDir dir;
  const std::string path = dir.File("m.safetensors");
  const RawTensor w = Random("w", Dtype::kBF16, {2048, 1024}, 9);  // 4 MiB: 64 blocks.
  WriteRaw(path, {w}, 0);
  auto ckpt = Checkpoint::Open(path);
  ASSERT_OK(ckpt);
  auto device = Emulated(1ull << 30, 1e9);
  LoadOptions dflt;
  dflt.mode = IoMode::kBuffered;
  dflt.staging_bytes = 64 << 10;
  // Every reader reading at once (the reads held), each into a slot of its own.
  PipelineGate gate;
  gate.HoldReads(true);
  gate.Start(*ckpt, dflt, gate.Wrap(device));
  EXPECT_TRUE(gate.WaitUntil([&](auto&, auto& in_flight, int64_t) {
    return in_flight.size() == static_cast<size_t>(readers);
  })) << gate.Describe();
  const std::set<int64_t> first = gate.InFlight();
  auto got = gate.Finish();
  ASSERT_OK(got);
  ExpectLoaded(*device, {{"w", w}}, *got, std::nullopt, "default staging");
  const PipelineTrace& trace = gate.trace();
  ExpectTraceConsistent(trace, slots);
  std::set<int> used;
  for (int64_t k : first) used.insert(trace.blocks[k].slot);
  EXPECT_EQ(static_cast<int>(used.size()), readers) << "a reader a slot";
  EXPECT_EQ(gate.MostInFlight(), static_cast<size_t>(readers));

  for (int refused : {-1, 65}) {
    dflt.staging_buffers = refused;
    auto bad = LoadThroughDevice(*ckpt, dflt, device, nullptr);
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << refused;
    EXPECT_THAT(bad.status().message(), HasSubstr("staging_buffers")) << refused;
  }
}

// Reads out of the page cache take blocks of at most 4 MiB (still in the CPU's
// cache when copied out of the slot); O_DIRECT reads take staging_bytes.
TEST(DevicePipelineTest, CachedReadsTakeSmallerBlocks) {
  ScratchDir dir;
  const std::string path = dir.File("m.safetensors");
  const RawTensor w = Random("w", Dtype::kBF16, {5, 1 << 20}, 4);  // 10 MiB.
  WriteRaw(path, {w}, 0);
  auto ckpt = Checkpoint::Open(path);
  ASSERT_OK(ckpt);
  auto device = Emulated();
  for (IoMode mode : {IoMode::kBuffered, IoMode::kDirect}) {
    LoadOptions opts;
    opts.mode = mode;
    opts.staging_bytes = 16 << 20;
    PipelineTrace trace;
    auto got = LoadThroughDevice(*ckpt, opts, device, &trace);
    ASSERT_OK(got);
    ExpectLoaded(*device, {{"w", w}}, *got, std::nullopt, std::string(IoModeName(mode)));
    if (got->files()[0].mode != mode) continue;  // No O_DIRECT on this filesystem.
    EXPECT_EQ(trace.blocks.size(), mode == IoMode::kBuffered ? 3u : 1u) << IoModeName(mode);
    // Slots as large as the largest read: 4 MiB from the page cache (a quarter
    // of the pinned memory), the whole 10 MiB with O_DIRECT.
    const uint64_t slot = got->device_plan().pinned_bytes / StagingSlots(opts);
    if (mode == IoMode::kBuffered) {
      EXPECT_EQ(slot, 4u << 20);
    } else {
      EXPECT_GE(slot, 10u << 20);
      EXPECT_LE(slot, (10u << 20) + 8192);
    }
  }
}

// The pinned slots of a load are kept for the next load onto the same device
// (no second allocation), also after a failed load, until released; a slot is
// allocated only when a reader first reads into it.
TEST(DevicePipelineTest, PinnedStagingIsKeptForTheNextLoad) {
  ReleasePinnedStaging();
  ScratchDir dir;
  const std::string path = dir.File("m.safetensors");
  const RawTensor w = Random("w", Dtype::kBF16, {512, 1024}, 9);  // 1 MiB: 16 blocks.
  WriteRaw(path, {w}, 0);
  auto ckpt = Checkpoint::Open(path);
  ASSERT_OK(ckpt);
  auto device = Emulated();
  LoadOptions opts;
  opts.mode = IoMode::kBuffered;
  opts.staging_bytes = 64 << 10;
  opts.staging_buffers = 3;
  auto pinned = [&] { return GetEmulatedDeviceCounts(*device)->pinned_allocations; };
  uint64_t first = 0;
  for (int round = 0; round < 3; ++round) {
    auto got = LoadThroughDevice(*ckpt, opts, device, nullptr);
    ASSERT_OK(got);
    ExpectLoaded(*device, {{"w", w}}, *got, std::nullopt, "round " + std::to_string(round));
    if (round == 0) first = pinned();
    EXPECT_GE(pinned(), 2u) << "round " << round << ": a slot for each of the two readers";
    EXPECT_LE(pinned(), 3u) << "round " << round << ": a slot at most a staging buffer";
    if (round > 0) {
      // A later load takes the kept slots: it allocates only a slot the
      // earlier ones never needed.
      EXPECT_LE(pinned(), 3u);
      EXPECT_GE(pinned(), first);
    }
  }
  const uint64_t kept = pinned();
  // A failed load gives its slots back too.
  PipelineTrace trace;
  trace.before_read = [](int64_t k) {
    return k == 3 ? IOError("read: Input/output error") : Status::Ok();
  };
  EXPECT_FALSE(LoadThroughDevice(*ckpt, opts, device, &trace).ok());
  EXPECT_EQ(pinned(), kept);
  // Fewer slots take kept ones; more slots add what they use beyond them.
  opts.staging_buffers = 2;
  ASSERT_OK(LoadThroughDevice(*ckpt, opts, device, nullptr));
  EXPECT_EQ(pinned(), kept);
  opts.staging_buffers = 9;
  ASSERT_OK(LoadThroughDevice(*ckpt, opts, device, nullptr));
  EXPECT_GE(pinned(), 8u) << "eight readers, a slot each";
  EXPECT_LE(pinned(), 9u);
  const uint64_t slots = pinned();
  // Reads through the page cache of exactly a block: slots of 64 KiB.
  EXPECT_EQ(ReleasePinnedStaging(), slots * (64 << 10));
  EXPECT_EQ(pinned(), 0u);
  // Another device's load never takes this device's slots.
  opts.staging_buffers = 3;
  ASSERT_OK(LoadThroughDevice(*ckpt, opts, device, nullptr));
  auto other = Emulated();
  ASSERT_OK(LoadThroughDevice(*ckpt, opts, other, nullptr));
  EXPECT_GE(pinned(), 2u);
  EXPECT_GE(GetEmulatedDeviceCounts(*other)->pinned_allocations, 2u);
  ReleasePinnedStaging();
  EXPECT_EQ(pinned(), 0u);
  EXPECT_EQ(GetEmulatedDeviceCounts(*other)->pinned_allocations, 0u);
  // A load of one block allocates one slot, whatever the slot count.
  const std::string small = dir.File("small.safetensors");
  const RawTensor v = Random("v", Dtype::kBF16, {16, 1024}, 3);  // 32 KiB: one block.
  WriteRaw(small, {v}, 0);
  auto one = Checkpoint::Open(small);
  ASSERT_OK(one);
  LoadOptions dflt;
  dflt.staging_bytes = 64 << 10;
  auto got = LoadThroughDevice(*one, dflt, device, nullptr);
  ASSERT_OK(got);
  ExpectLoaded(*device, {{"v", v}}, *got, std::nullopt, "one block");
  EXPECT_EQ(pinned(), 1u);
  // The plan is the most the load may take: every slot, each as large as the
  // one block's read (32 KiB and the pages around it), not staging_bytes.
  const uint64_t slot = got->device_plan().pinned_bytes / StagingSlots(dflt);
  EXPECT_EQ(got->device_plan().pinned_bytes, StagingSlots(dflt) * slot);
  EXPECT_GE(slot, 32u << 10);
  EXPECT_LE(slot, 40u << 10);
  ReleasePinnedStaging();
}

TEST(DevicePipelineTest, DeviceMemoryPlanIsComputedFirstAndRespected) {
  ScratchDir dir;
  const std::string path = dir.File("m.safetensors");
  auto tensors = MixedTensors(5);
  WriteRaw(path, tensors, 3);
  auto ckpt = Checkpoint::Open(path);
  ASSERT_OK(ckpt);
  LoadOptions opts;
  opts.dtype = Dtype::kF32;  // Conversions need device slots too.
  opts.staging_bytes = 64 << 10;
  opts.staging_buffers = 2;
  DeviceMemoryPlan plan;
  {
    auto got = LoadThroughDevice(*ckpt, opts, Emulated(), nullptr);
    ASSERT_OK(got);
    plan = got->device_plan();
  }
  EXPECT_GT(plan.device_bytes, 0u);
  EXPECT_GT(plan.scratch_bytes, 0u);
  // Two slots, each the largest read: a block, and the pages around it when
  // read with O_DIRECT.
  EXPECT_GE(plan.pinned_bytes, 2u * (64 << 10));
  EXPECT_LE(plan.pinned_bytes, 2 * StagingSlotBytes(64 << 10));
  const uint64_t need = plan.device_bytes + plan.scratch_bytes;
  {
    // Exactly the plan: fits.
    auto device = Emulated(need);
    auto got = LoadThroughDevice(*ckpt, opts, device, nullptr);
    ASSERT_OK(got);
  }
  // One byte less: refused before anything is read.
  auto device = Emulated(need - 1);
  PipelineTrace trace;
  std::atomic<int> reads{0};
  trace.before_read = [&](int64_t) {
    ++reads;
    return Status::Ok();
  };
  auto got = LoadThroughDevice(*ckpt, opts, device, &trace);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(got.status().message(), HasSubstr(std::to_string(need)));
  EXPECT_EQ(reads.load(), 0);
  EXPECT_EQ(*device->FreeMemory(), need - 1);
}

TEST(DevicePipelineTest, FaultsFreeEverything) {
  ScratchDir dir;
  const std::string path = dir.File("m.safetensors");
  WriteRaw(path, {Random("w", Dtype::kBF16, {512, 1024}, 3), Random("v", Dtype::kF32, {1000}, 4)},
           1);
  auto ckpt = Checkpoint::Open(path);
  ASSERT_OK(ckpt);
  for (IoMode mode : {IoMode::kBuffered, IoMode::kDirect}) {
    for (int fault = 0; fault < 2; ++fault) {
      auto device = Emulated(1ull << 30, 200e6);
      LoadOptions opts;
      opts.mode = mode;
      opts.staging_bytes = 64 << 10;
      opts.staging_buffers = 3;
      opts.dtype = Dtype::kF16;
      PipelineTrace trace;
      trace.before_read = [&](int64_t k) -> Status {
        if (k != 5) return Status::Ok();
        if (fault == 0) return IOError("read: Input/output error");
        // Truncate the file under the load.
        EXPECT_EQ(::truncate(path.c_str(), 100000), 0);
        return Status::Ok();
      };
      auto got = LoadThroughDevice(*ckpt, opts, device, &trace);
      ASSERT_FALSE(got.ok()) << IoModeName(mode) << " fault " << fault;
      EXPECT_THAT(got.status().message(), HasSubstr(path));
      if (fault == 0) {
        EXPECT_THAT(got.status().message(), HasSubstr("Input/output error"));
      } else {
        EXPECT_EQ(got.status().code(), StatusCode::kIOError) << got.status().ToString();
        WriteRaw(path,
                 {Random("w", Dtype::kBF16, {512, 1024}, 3), Random("v", Dtype::kF32, {1000}, 4)},
                 1);
        auto again = Checkpoint::Open(path);
        ASSERT_OK(again);
        ckpt = std::move(again);
      }
      EXPECT_EQ(*device->FreeMemory(), 1ull << 30) << "device memory of the failed load was freed";
    }
  }
}

// A stand-in for cuFile over the emulated device: pread, then a synchronous
// copy to the device. Fails every read from the `fail_at`-th on (0: never).
class FakeDirectReader final : public DirectReader {
 public:
  FakeDirectReader(std::shared_ptr<Device> device, int fail_at, std::atomic<int>* reads,
                   int* stale_buffers)
      : device_(std::move(device)), fail_at_(fail_at), reads_(reads), stale_(stale_buffers) {}
  // cuFile's driver deregisters the buffers still registered when it closes:
  // each must still be device memory then (counted in *stale_ if not).
  ~FakeDirectReader() override {
    for (auto [base, bytes] : buffers_) {
      std::byte first{};
      auto stream = device_->CreateStream();
      if (!stream.ok() || !(*stream)->CopyToHost(&first, base, 1).ok() ||
          !(*stream)->Synchronize().ok()) {
        ++*stale_;
      }
    }
  }
  Status AddFile(uint32_t file, int fd) override {
    if (fds_.size() <= file) fds_.resize(file + 1, -1);
    fds_[file] = fd;
    return Status::Ok();
  }
  Status AddBuffer(std::byte* base, uint64_t bytes) override {
    buffers_.emplace_back(base, bytes);
    return Status::Ok();
  }
  Status Read(uint32_t file, std::byte* base, uint64_t offset, uint64_t bytes,
              uint64_t file_offset) override {
    const int n = ++*reads_;
    if (fail_at_ > 0 && n >= fail_at_) return IOError("cuFileRead: Input/output error (injected)");
    std::vector<std::byte> host(bytes);
    // Reads through a plain descriptor of the same file (the pipeline may
    // hand an O_DIRECT one).
    std::string path = "/proc/self/fd/" + std::to_string(fds_[file]);
    int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) return IOError("open " + path);
    const ssize_t got = ::pread(fd, host.data(), bytes, static_cast<off_t>(file_offset));
    ::close(fd);
    if (got != static_cast<ssize_t>(bytes)) return IOError("short read");
    TL_ASSIGN_OR_RETURN(auto stream, device_->CreateStream());
    TL_RETURN_IF_ERROR(stream->CopyToDevice(base + offset, host.data(), bytes));
    return stream->Synchronize();
  }

 private:
  std::shared_ptr<Device> device_;
  int fail_at_;
  std::atomic<int>* reads_;
  int* stale_;
  std::vector<int> fds_;
  std::vector<std::pair<std::byte*, uint64_t>> buffers_;
};

TEST(DevicePipelineTest, DirectToDeviceReadsAndFallsBackAtOnce) {
  ScratchDir dir;
  const std::string path = dir.File("m.safetensors");
  auto tensors = MixedTensors(21);
  WriteRaw(path, tensors, 3);
  std::map<std::string, RawTensor> want;
  for (auto& t : tensors) want[t.name] = t;
  auto ckpt = Checkpoint::Open(path);
  ASSERT_OK(ckpt);
  for (std::optional<Dtype> dt : {std::optional<Dtype>(), std::optional<Dtype>(Dtype::kF32)}) {
    for (int fail_at : {0, 4}) {
      auto device = Emulated();
      std::atomic<int> reads{0};
      int stale = 0;
      PipelineTrace trace;
      trace.open_direct_reader = [&]() -> Result<std::unique_ptr<DirectReader>> {
        return std::unique_ptr<DirectReader>(
            std::make_unique<FakeDirectReader>(device, fail_at, &reads, &stale));
      };
      LoadOptions opts;
      opts.dtype = dt;
      opts.staging_bytes = 64 << 10;
      opts.staging_buffers = 2;
      auto got = LoadThroughDevice(*ckpt, opts, device, &trace);
      const std::string ctx = "fail_at=" + std::to_string(fail_at) + (dt ? " F32" : "");
      ASSERT_OK(got) << ctx;
      ExpectLoaded(*device, want, *got, dt, ctx);
      EXPECT_EQ(stale, 0) << ctx << ": a registered buffer was freed before the reader closed";
      const FileReport& f = got->files()[0];
      if (fail_at == 0) {
        EXPECT_TRUE(f.gds) << ctx;
        EXPECT_THAT(f.reason, HasSubstr("GDS")) << ctx;
        EXPECT_EQ(got->device_plan().pinned_bytes, 0u) << "no staging with GDS";
        EXPECT_GT(reads.load(), 0);
      } else {
        EXPECT_FALSE(f.gds) << ctx;
        EXPECT_THAT(f.reason, HasSubstr("GDS failed during the load")) << ctx;
        EXPECT_THAT(f.reason, HasSubstr("injected")) << ctx;
        EXPECT_GT(got->device_plan().pinned_bytes, 0u);
      }
      got = Status(StatusCode::kInternal, "dropped");
      EXPECT_EQ(*device->FreeMemory(), 1ull << 30) << ctx;
    }
  }
  // Without a reader (no cuFile on this machine, or gds off): staging, and why.
  auto device = Emulated();
  PipelineTrace trace;
  trace.open_direct_reader = []() -> Result<std::unique_ptr<DirectReader>> {
    return UnimplementedError("built without GPUDirect Storage (test)");
  };
  auto got = LoadThroughDevice(*ckpt, LoadOptions{}, device, &trace);
  ASSERT_OK(got);
  EXPECT_FALSE(got->files()[0].gds);
  EXPECT_THAT(got->files()[0].reason,
              HasSubstr("GDS unavailable: built without GPUDirect Storage (test)"));
  LoadOptions off;
  off.gds = false;
  got = LoadThroughDevice(*ckpt, off, device, &trace);
  ASSERT_OK(got);
  EXPECT_THAT(got->files()[0].reason, ::testing::Not(HasSubstr("GDS")));
}

TEST(DevicePipelineTest, HostLoadsConvertThroughTheSamePipeline) {
  ScratchDir dir;
  const std::string path = dir.File("m.safetensors");
  auto tensors = MixedTensors(9);
  WriteRaw(path, tensors, 1);
  std::map<std::string, RawTensor> want;
  for (auto& t : tensors) want[t.name] = t;
  LoadOptions opts;
  opts.dtype = Dtype::kF16;
  auto got = Load(path, opts);
  ASSERT_OK(got);
  ExpectLoaded(*MakeHostDevice(), want, *got, Dtype::kF16, "host");
  EXPECT_GT(got->files()[0].converted, 0u);

  opts.dtype = Dtype::kF8_E4M3;
  auto bad = Load(path, opts);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

TEST(DevicePipelineTest, DeviceNames) {
  EXPECT_EQ(*ParseDevice("cpu"), DeviceId::Cpu());
  EXPECT_EQ(*ParseDevice("cuda"), DeviceId::Cuda(0));
  EXPECT_EQ(*ParseDevice("cuda:3"), DeviceId::Cuda(3));
  EXPECT_EQ(*ParseDevice("emulated"), DeviceId::Emulated(0));
  for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cuda:x", "cpu:1", "tpu:0", ""}) {
    EXPECT_EQ(ParseDevice(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  // Name() writes what ParseDevice reads, the index always given.
  for (const DeviceId d :
       {DeviceId::Cpu(), DeviceId::Cuda(0), DeviceId::Cuda(7), DeviceId::Emulated()}) {
    EXPECT_EQ(*ParseDevice(d.Name()), d) << d.Name();
  }
  EXPECT_EQ(DeviceId::Cuda(2).Name(), "cuda:2");
  EXPECT_EQ(LoadOptions().device, DeviceId::Cpu());  // Host memory by default.
}

TEST(DevicePipelineTest, CudaWithoutAGpuIsAClearError) {
  ScratchDir dir;
  const std::string path = dir.File("m.safetensors");
  WriteRaw(path, MixedTensors(1), 0);
  auto device = OpenCudaDevice(0);
  if (device.ok()) GTEST_SKIP() << "a GPU is present: " << (*device)->name();
  LoadOptions opts;
  opts.device = DeviceId::Cuda(0);
  auto got = Load(path, opts);
  ASSERT_FALSE(got.ok());
  EXPECT_TRUE(got.status().code() == StatusCode::kUnavailable ||
              got.status().code() == StatusCode::kUnimplemented)
      << got.status().ToString();
  EXPECT_FALSE(got.status().message().empty());
}

}  // namespace
}  // namespace tensorlift
