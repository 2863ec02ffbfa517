// Communicator tests. Without arguments: the single-process communicator.
// With --mpi (under mpiexec -n N): the MPI communicator over N ranks. Each
// test runs on two communicators: the default one and one whose messages are
// cut into small chunks (exercising the chunking path on small buffers).
//
// Every rank runs every test; tests use EXPECT (not ASSERT) around
// collectives so that all ranks call the same collectives, and each test ends
// with an Agree on its result so that a failure on one rank fails all.
#include "tensorlift/communicator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../common/assert_ok.h"
#include "rank_failure_printer.h"

namespace tensorlift {
namespace {

bool g_mpi = false;
Communicator* g_comms[2] = {nullptr, nullptr};
constexpr uint64_t kSmallChunk = 4093;  // Odd, so chunks end mid-pattern.

// The byte at offset i of block `block` of a buffer tagged `tag`.
uint8_t Pattern(uint64_t i, int block, int tag) {
  return static_cast<uint8_t>(i * 131 + (i >> 9) * 7 + block * 17 + tag * 29 + 1);
}
void Fill(uint8_t* p, uint64_t bytes, int block, int tag) {
  for (uint64_t i = 0; i < bytes; ++i) p[i] = Pattern(i, block, tag);
}
// Offset of the first byte that differs from the pattern, or bytes.
uint64_t FirstMismatch(const uint8_t* p, uint64_t bytes, int block, int tag) {
  for (uint64_t i = 0; i < bytes; ++i) {
    if (p[i] != Pattern(i, block, tag)) return i;
  }
  return bytes;
}

const uint64_t kSizes[] = {0, 1, 7, 4099, (uint64_t{3} << 20) + 5};

class CommunicatorTest : public ::testing::TestWithParam<int> {
 protected:
  Communicator& comm() { return *g_comms[GetParam()]; }
  void TearDown() override {
    // A failure on any rank fails the test on every rank.
    const Status agreed =
        comm().Agree(HasFailure() ? InternalError("a check failed on this rank") : Status::Ok());
    EXPECT_OK(agreed);
  }
};

TEST_P(CommunicatorTest, RankAndSize) {
  EXPECT_GE(comm().size(), 1);
  EXPECT_GE(comm().rank(), 0);
  EXPECT_LT(comm().rank(), comm().size());
  if (!g_mpi) {
    EXPECT_EQ(comm().size(), 1);
  }
  EXPECT_OK(comm().Barrier());
}

TEST_P(CommunicatorTest, BroadcastFromEachRoot) {
  Communicator& c = comm();
  for (uint64_t bytes : kSizes) {
    for (int root = 0; root < c.size(); ++root) {
      const int tag = static_cast<int>(bytes % 5) + root;
      std::vector<uint8_t> buf(bytes + 1, 0xEE);  // +1: a guard byte.
      if (c.rank() == root) Fill(buf.data(), bytes, root, tag);
      const Status s = c.Broadcast(buf.data(), bytes, root);
      EXPECT_OK(s);
      EXPECT_EQ(FirstMismatch(buf.data(), bytes, root, tag), bytes)
          << "bytes " << bytes << " root " << root;
      EXPECT_EQ(buf[bytes], 0xEE);
    }
  }
}

TEST_P(CommunicatorTest, ScatterFromEachRoot) {
  Communicator& c = comm();
  const int n = c.size();
  for (uint64_t bytes : kSizes) {
    for (int root = 0; root < n; ++root) {
      const int tag = static_cast<int>(bytes % 3) + 2 * root;
      std::vector<uint8_t> send;
      if (c.rank() == root) {
        send.resize(bytes * n);
        for (int r = 0; r < n; ++r) Fill(send.data() + r * bytes, bytes, r, tag);
      }
      std::vector<uint8_t> recv(bytes + 1, 0xEE);
      const Status s = c.Scatter(send.data(), recv.data(), bytes, root);
      EXPECT_OK(s);
      EXPECT_EQ(FirstMismatch(recv.data(), bytes, c.rank(), tag), bytes)
          << "bytes " << bytes << " root " << root;
      EXPECT_EQ(recv[bytes], 0xEE);
    }
  }
}

TEST_P(CommunicatorTest, AllGather) {
  Communicator& c = comm();
  const int n = c.size();
  for (uint64_t bytes : kSizes) {
    const int tag = static_cast<int>(bytes % 7);
    std::vector<uint8_t> send(bytes);
    Fill(send.data(), bytes, c.rank(), tag);
    std::vector<uint8_t> recv(bytes * n + 1, 0xEE);
    const Status s = c.AllGather(send.data(), recv.data(), bytes);
    EXPECT_OK(s);
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(FirstMismatch(recv.data() + r * bytes, bytes, r, tag), bytes)
          << "bytes " << bytes << " from rank " << r;
    }
    EXPECT_EQ(recv[bytes * n], 0xEE);
  }
}

TEST_P(CommunicatorTest, AgreeAllOk) { EXPECT_OK(comm().Agree(Status::Ok())); }

TEST_P(CommunicatorTest, AgreeOneRankFails) {
  Communicator& c = comm();
  // Rank 1 (rank 0 when alone) cannot open its file; every rank learns it.
  const int failing = c.size() > 1 ? 1 : 0;
  const Status local = c.rank() == failing
                           ? NotFoundError("/ckpt/model-00002.safetensors: no such file")
                           : Status::Ok();
  const Status agreed = c.Agree(local);
  EXPECT_EQ(agreed.code(), StatusCode::kNotFound);
  EXPECT_EQ(agreed.message(),
            "rank " + std::to_string(failing) + ": /ckpt/model-00002.safetensors: no such file");
  // The ranks go on working together afterwards.
  EXPECT_OK(c.Barrier());
}

TEST_P(CommunicatorTest, AgreeLowestFailingRankWins) {
  Communicator& c = comm();
  const int n = c.size();
  Status local;
  if (c.rank() == n - 1) local = CorruptionError("last rank: bad header");
  if (n > 2 && c.rank() == 1) local = IOError("rank one: EIO");
  const Status agreed = c.Agree(local);
  if (n > 2) {
    EXPECT_EQ(agreed.code(), StatusCode::kIOError);
    EXPECT_EQ(agreed.message(), "rank 1: rank one: EIO");
  } else {
    EXPECT_EQ(agreed.code(), StatusCode::kCorruption);
    EXPECT_EQ(agreed.message(), "rank " + std::to_string(n - 1) + ": last rank: bad header");
  }
}

TEST_P(CommunicatorTest, AgreeLongAndEmptyMessages) {
  Communicator& c = comm();
  const std::string long_message(100000, 'x');
  Status agreed = c.Agree(c.rank() == 0 ? InvalidArgumentError(long_message) : Status::Ok());
  EXPECT_EQ(agreed.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(agreed.message(), "rank 0: " + long_message.substr(0, 64 * 1024));
  agreed = c.Agree(c.rank() == 0 ? InternalError("") : Status::Ok());
  EXPECT_EQ(agreed.code(), StatusCode::kInternal);
  EXPECT_EQ(agreed.message(), "rank 0: ");
}

TEST_P(CommunicatorTest, BadArgumentsAreErrorsOnEveryRank) {
  Communicator& c = comm();
  uint8_t byte = 0;
  EXPECT_EQ(c.Broadcast(&byte, 1, c.size()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.Broadcast(&byte, 1, -1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.Broadcast(nullptr, 1, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.AllGather(&byte, nullptr, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.Scatter(&byte, &byte, 1, c.size()).code(), StatusCode::kInvalidArgument);
  // Zero bytes with null buffers is fine.
  EXPECT_OK(c.Broadcast(nullptr, 0, 0));
  EXPECT_OK(c.AllGather(nullptr, nullptr, 0));
  EXPECT_OK(c.Scatter(nullptr, nullptr, 0, 0));
}

INSTANTIATE_TEST_SUITE_P(Chunks, CommunicatorTest, ::testing::Values(0, 1),
                         [](const auto& info) { return info.param ? "SmallChunks" : "Default"; });

TEST(MpiTest, BuiltOrSaysWhy) {
  if (MpiBuiltIn()) GTEST_SKIP() << "built with MPI (the --mpi runs test it)";
  auto c = MakeMpiCommunicator();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(c.status().message().find("built without MPI"), std::string::npos);
}

TEST(MpiTest, ChunkSizeIsChecked) {
  EXPECT_EQ(MakeMpiCommunicator(0).status().code(),
            MpiBuiltIn() ? StatusCode::kInvalidArgument : StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace tensorlift

int main(int argc, char** argv) {
  using namespace tensorlift;  // NOLINT: test main.
  ::testing::InitGoogleTest(&argc, argv);
  // --exit-rank=N: rank N exits at once (a crashed rank); the others then
  // block in their first collective until mpiexec ends the job.
  int exit_rank = -1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--mpi") == 0) g_mpi = true;
    if (std::strncmp(argv[i], "--exit-rank=", 12) == 0) exit_rank = std::atoi(argv[i] + 12);
  }
  std::unique_ptr<Communicator> comms[2];
  if (g_mpi) {
    for (int i = 0; i < 2; ++i) {
      auto c = MakeMpiCommunicator(i == 0 ? kDefaultMpiChunkBytes : kSmallChunk);
      if (!c.ok()) {
        std::fprintf(stderr, "MakeMpiCommunicator: %s\n", c.status().ToString().c_str());
        return 1;
      }
      comms[i] = std::move(c).value();
    }
    const int rank = comms[0]->rank();
    if (rank == exit_rank) std::_Exit(3);
    if (rank != 0) {
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new tensorlift::testing::RankFailurePrinter(rank));
    }
  } else {
    comms[0] = MakeSingleProcessCommunicator();
    comms[1] = MakeSingleProcessCommunicator();
  }
  g_comms[0] = comms[0].get();
  g_comms[1] = comms[1].get();
  return RUN_ALL_TESTS();
}
