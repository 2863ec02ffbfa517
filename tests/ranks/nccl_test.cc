// The NCCL communicator: without a GPU (or without NCCL) it must say why, on
// every rank; with one, a communicator of one rank moves device bytes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "../common/assert_ok.h"
#include "device/device.h"
#include "tensorlift/communicator.h"

namespace tensorlift {
namespace {

TEST(NcclTest, OneRankOnAGpuOrAClearReason) {
  auto bootstrap = MakeSingleProcessCommunicator();
  auto device = OpenCudaDevice(0);
  auto comm = MakeNcclCommunicator(*bootstrap, 0);
  if (!comm.ok()) {
    EXPECT_TRUE(comm.status().code() == StatusCode::kUnavailable ||
                comm.status().code() == StatusCode::kUnimplemented)
        << comm.status().ToString();
    EXPECT_FALSE(comm.status().message().empty());
    if (!NcclBuiltIn()) {
      EXPECT_THAT(comm.status().message(), ::testing::HasSubstr("built without NCCL"));
    }
    if (device.ok()) {
      GTEST_SKIP() << "a GPU is here but NCCL is not usable: " << comm.status().ToString();
    }
    GTEST_SKIP() << "no GPU here (" << device.status().ToString()
                 << "); NCCL said: " << comm.status().ToString();
  }
  ASSERT_OK(device);
  EXPECT_EQ((*comm)->size(), 1);
  constexpr uint64_t kBytes = 1 << 20;
  std::vector<uint8_t> host(kBytes), back(kBytes);
  std::iota(host.begin(), host.end(), 0);
  auto a = (*device)->Allocate(kBytes);
  auto b = (*device)->Allocate(kBytes);
  ASSERT_OK(a);
  ASSERT_OK(b);
  auto stream = (*device)->CreateStream();
  ASSERT_OK(stream);
  ASSERT_OK(
      (*stream)->CopyToDevice((*a)->data(), reinterpret_cast<std::byte*>(host.data()), kBytes));
  ASSERT_OK((*stream)->Synchronize());
  ASSERT_OK((*comm)->Broadcast((*a)->data(), kBytes, 0));
  ASSERT_OK((*comm)->AllGather((*a)->data(), (*b)->data(), kBytes));
  ASSERT_OK((*comm)->Scatter((*b)->data(), (*a)->data(), kBytes, 0));
  ASSERT_OK((*comm)->Barrier());
  ASSERT_OK((*stream)->CopyToHost(reinterpret_cast<std::byte*>(back.data()), (*a)->data(), kBytes));
  ASSERT_OK((*stream)->Synchronize());
  EXPECT_EQ(back, host);
}

}  // namespace
}  // namespace tensorlift
