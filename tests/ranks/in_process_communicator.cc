#include "in_process_communicator.h"

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>

namespace tensorlift {
namespace {

// What one rank posted for the current collective.
struct Post {
  const std::byte* send = nullptr;
  std::byte* recv = nullptr;
  uint64_t bytes = 0;
  int root = 0;
  Status args;  // The rank's own check of its arguments.
};

// The state the ranks of one group share.
class Rendezvous {
 public:
  explicit Rendezvous(int world) : world_(world), posts_(world) {}

  // Blocks until every rank has arrived at the same step; ranks leave in the
  // order they were released. Reusable (a generation counter).
  void Arrive() {
    std::unique_lock lock(mu_);
    const uint64_t generation = generation_;
    if (++arrived_ == world_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != generation; });
  }

  Post& post(int rank) { return posts_[rank]; }
  int world() const { return world_; }

 private:
  const int world_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::vector<Post> posts_;  // Written by their rank before the first Arrive.
};

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<Rendezvous> group, int rank, std::shared_ptr<Device> device)
      : group_(std::move(group)), rank_(rank), device_(std::move(device)) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->world(); }
  DeviceType memory() const override { return device_->kind(); }

  Status Broadcast(void* buf, uint64_t bytes, int root) override {
    return Collective("Broadcast", buf, buf, bytes, root, [&](Post& me) -> Status {
      if (rank_ == root) return Status::Ok();
      return Copy(me.recv, group_->post(root).send, bytes);
    });
  }

  Status Scatter(const void* send, void* recv, uint64_t bytes, int root) override {
    const void* checked = rank_ == root ? send : recv;
    return Collective("Scatter", checked, recv, bytes, root, [&](Post& me) -> Status {
      return Copy(me.recv, group_->post(root).send + static_cast<uint64_t>(rank_) * bytes, bytes);
    });
  }

  Status AllGather(const void* send, void* recv, uint64_t bytes) override {
    return Collective("AllGather", send, recv, bytes, 0, [&](Post& me) -> Status {
      for (int r = 0; r < size(); ++r) {
        TL_RETURN_IF_ERROR(
            Copy(me.recv + static_cast<uint64_t>(r) * bytes, group_->post(r).send, bytes));
      }
      return Status::Ok();
    });
  }

  Status Barrier() override {
    return Collective("Barrier", nullptr, nullptr, 0, 0, [](Post&) { return Status::Ok(); });
  }

 private:
  // Posts this rank's buffers, checks every rank's arguments (the same
  // verdict on all), runs `receive` (this rank's copies out of the posted
  // buffers) and leaves once every rank is done with every buffer.
  template <typename Receive>
  Status Collective(const char* what, const void* send, void* recv, uint64_t bytes, int root,
                    Receive receive) {
    Post& me = group_->post(rank_);
    me.send = static_cast<const std::byte*>(send);
    me.recv = static_cast<std::byte*>(recv);
    me.bytes = bytes;
    me.root = root;
    me.args = CheckArgs(what, send, recv, bytes, root);
    group_->Arrive();
    Status agreed = Status::Ok();
    // The lowest rank's bad arguments first, then the lowest rank whose call
    // differs from rank 0's: the same verdict on every rank.
    for (int r = 0; r < size() && agreed.ok(); ++r) {
      const Post& p = group_->post(r);
      if (!p.args.ok()) {
        agreed = Status(p.args.code(), "rank " + std::to_string(r) + ": " + p.args.message());
      }
    }
    const Post& first = group_->post(0);
    for (int r = 1; r < size() && agreed.ok(); ++r) {
      const Post& p = group_->post(r);
      if (p.bytes != first.bytes || p.root != first.root) {
        agreed = InvalidArgumentError(
            std::string(what) + ": rank " + std::to_string(r) + " passed " +
            std::to_string(p.bytes) + " bytes, root " + std::to_string(p.root) + "; rank 0 " +
            std::to_string(first.bytes) + ", root " + std::to_string(first.root));
      }
    }
    Status st = agreed.ok() && bytes > 0 ? receive(me) : Status::Ok();
    if (st.ok() && bytes > 0) st = Flush();
    group_->Arrive();  // Nobody reuses a posted buffer before every copy is done.
    return agreed.ok() ? st : agreed;
  }

  Status Copy(std::byte* dst, const std::byte* src, uint64_t bytes) {
    if (bytes == 0 || dst == src) return Status::Ok();
    if (!stream_) {
      TL_ASSIGN_OR_RETURN(stream_, device_->CreateStream());
    }
    return stream_->CopyOnDevice(dst, src, bytes);
  }

  Status Flush() { return stream_ ? stream_->Synchronize() : Status::Ok(); }

  std::shared_ptr<Rendezvous> group_;
  const int rank_;
  std::shared_ptr<Device> device_;
  std::unique_ptr<DeviceStream> stream_;  // Created at the first copy.
};

}  // namespace

Result<std::vector<std::unique_ptr<Communicator>>> MakeInProcessCommunicators(
    int world, std::shared_ptr<Device> device) {
  if (world < 1) {
    return InvalidArgumentError("in-process communicators: world size " + std::to_string(world) +
                                " < 1");
  }
  if (!device) return InvalidArgumentError("in-process communicators: no device");
  auto group = std::make_shared<Rendezvous>(world);
  std::vector<std::unique_ptr<Communicator>> out;
  out.reserve(world);
  for (int r = 0; r < world; ++r) {
    out.push_back(std::make_unique<InProcessCommunicator>(group, r, device));
  }
  return out;
}

}  // namespace tensorlift
