// The in-process communicators (ranks are threads): every collective on host
// memory and on the emulated device's memory, against a pattern; errors and
// mismatched calls fail on every rank instead of hanging.
#include "in_process_communicator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../common/assert_ok.h"
#include "device/device.h"

namespace tensorlift {
namespace {

uint8_t Pattern(uint64_t i, int block) { return static_cast<uint8_t>(i * 131 + block * 17 + 1); }

// A buffer of `bytes` in the device's memory (host memory for the host
// device) with host-side Write/Read helpers.
class Buf {
 public:
  Buf(Device& device, uint64_t bytes) : bytes_(bytes) {
    auto b = device.Allocate(bytes == 0 ? 1 : bytes);
    EXPECT_OK(b);
    if (b.ok()) buffer_ = *b;
    auto s = device.CreateStream();
    EXPECT_OK(s);
    if (s.ok()) stream_ = std::move(*s);
  }
  std::byte* data() { return buffer_ ? buffer_->data() : nullptr; }
  void Write(const std::vector<uint8_t>& v, uint64_t at = 0) {
    if (v.empty()) return;
    EXPECT_OK(
        stream_->CopyToDevice(data() + at, reinterpret_cast<const std::byte*>(v.data()), v.size()));
    EXPECT_OK(stream_->Synchronize());
  }
  std::vector<uint8_t> Read() {
    std::vector<uint8_t> v(bytes_);
    if (v.empty()) return v;
    EXPECT_OK(stream_->CopyToHost(reinterpret_cast<std::byte*>(v.data()), data(), bytes_));
    EXPECT_OK(stream_->Synchronize());
    return v;
  }

 private:
  uint64_t bytes_;
  std::shared_ptr<Buffer> buffer_;
  std::unique_ptr<DeviceStream> stream_;
};

std::vector<uint8_t> Block(uint64_t bytes, int block) {
  std::vector<uint8_t> v(bytes);
  for (uint64_t i = 0; i < bytes; ++i) v[i] = Pattern(i, block);
  return v;
}

// Runs body(rank, comm) on one thread per rank.
void OnRanks(std::vector<std::unique_ptr<Communicator>>& comms,
             const std::function<void(int, Communicator&)>& body) {
  std::vector<std::thread> threads;
  for (size_t r = 0; r < comms.size(); ++r) {
    threads.emplace_back([&, r] { body(static_cast<int>(r), *comms[r]); });
  }
  for (auto& t : threads) t.join();
}

struct Case {
  std::string name;
  std::function<std::shared_ptr<Device>()> device;
};

class InProcessCommunicatorTest : public ::testing::TestWithParam<Case> {
 protected:
  std::shared_ptr<Device> device_ = GetParam().device();
};

TEST_P(InProcessCommunicatorTest, EveryCollectiveMovesTheBytes) {
  for (int world : {1, 2, 3, 5}) {
    for (uint64_t bytes : {uint64_t{0}, uint64_t{1}, uint64_t{4099}, uint64_t{1} << 20}) {
      auto comms = MakeInProcessCommunicators(world, device_);
      ASSERT_OK(comms);
      const std::string ctx = "world " + std::to_string(world) + ", " + std::to_string(bytes);
      OnRanks(*comms, [&](int rank, Communicator& c) {
        EXPECT_EQ(c.rank(), rank);
        EXPECT_EQ(c.size(), world);
        const int root = world - 1;
        // Broadcast from the last rank.
        Buf b(*device_, bytes);
        if (rank == root) b.Write(Block(bytes, 7));
        EXPECT_OK(c.Broadcast(b.data(), bytes, root)) << ctx;
        EXPECT_EQ(b.Read(), Block(bytes, 7)) << ctx << " rank " << rank;
        // Scatter: rank r gets block r of the root's buffer.
        Buf send(*device_, bytes * world), recv(*device_, bytes);
        if (rank == root) {
          for (int r = 0; r < world; ++r) send.Write(Block(bytes, r), bytes * r);
        }
        EXPECT_OK(c.Scatter(rank == root ? send.data() : nullptr, recv.data(), bytes, root));
        EXPECT_EQ(recv.Read(), Block(bytes, rank)) << ctx << " rank " << rank;
        // AllGather: every rank's block, in rank order.
        Buf mine(*device_, bytes), all(*device_, bytes * world);
        mine.Write(Block(bytes, 100 + rank));
        EXPECT_OK(c.AllGather(mine.data(), all.data(), bytes));
        std::vector<uint8_t> want;
        for (int r = 0; r < world; ++r) {
          auto blk = Block(bytes, 100 + r);
          want.insert(want.end(), blk.begin(), blk.end());
        }
        EXPECT_EQ(all.Read(), want) << ctx << " rank " << rank;
        EXPECT_OK(c.Barrier());
      });
    }
  }
}

// Agree runs on host memory whatever the device (its buffers are the
// caller's locals), so it is tested with host communicators only.
TEST(InProcessCommunicatorHostTest, AgreeGivesTheLowestFailingRanksErrorEverywhere) {
  auto comms = MakeInProcessCommunicators(4);
  ASSERT_OK(comms);
  std::vector<Status> got(4);
  OnRanks(*comms, [&](int rank, Communicator& c) {
    const Status local = rank == 2   ? NotFoundError("no such file")
                         : rank == 3 ? IOError("disk")
                                     : Status::Ok();
    got[rank] = c.Agree(local);
  });
  for (const Status& s : got) {
    EXPECT_EQ(s.code(), StatusCode::kNotFound);
    EXPECT_EQ(s.message(), "rank 2: no such file");
  }
  std::vector<Status> ok(4);
  OnRanks(*comms, [&](int rank, Communicator& c) { ok[rank] = c.Agree(Status::Ok()); });
  for (const Status& s : ok) EXPECT_OK(s);
}

TEST(InProcessCommunicatorHostTest, ABadOrMismatchedCallFailsOnEveryRank) {
  auto comms = MakeInProcessCommunicators(3);
  ASSERT_OK(comms);
  std::vector<Status> bad_root(3), null_buf(3), mismatch(3), after(3);
  OnRanks(*comms, [&](int rank, Communicator& c) {
    std::vector<uint8_t> buf(64);
    // Rank 1 names a root out of range; the others a good one.
    bad_root[rank] = c.Broadcast(buf.data(), buf.size(), rank == 1 ? 7 : 0);
    // Rank 2 passes no buffer.
    null_buf[rank] = c.Broadcast(rank == 2 ? nullptr : buf.data(), buf.size(), 0);
    // Rank 2 sends a different size.
    mismatch[rank] = c.Broadcast(buf.data(), rank == 2 ? 32 : 64, 0);
    // And the group still works afterwards.
    after[rank] = c.Barrier();
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(bad_root[r].code(), StatusCode::kInvalidArgument);
    EXPECT_NE(bad_root[r].message().find("rank 1: Broadcast: root 7"), std::string::npos)
        << bad_root[r].message();
    EXPECT_NE(null_buf[r].message().find("rank 2: Broadcast: null buffer"), std::string::npos)
        << null_buf[r].message();
    EXPECT_EQ(mismatch[r].message(),
              "Broadcast: rank 2 passed 32 bytes, root 0; rank 0 64, root 0");
    EXPECT_OK(after[r]);
  }
}

TEST(InProcessCommunicatorHostTest, RejectsBadArguments) {
  EXPECT_EQ(MakeInProcessCommunicators(0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeInProcessCommunicators(2, nullptr).status().code(), StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Devices, InProcessCommunicatorTest,
                         ::testing::Values(Case{"host", [] { return MakeHostDevice(); }},
                                           Case{"emulated", [] { return MakeEmulatedDevice(); }}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace tensorlift
