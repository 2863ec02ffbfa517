#include "tensorlift/communicator.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace tensorlift {
namespace {

// The longest message Agree passes on (longer ones are cut).
constexpr uint64_t kMaxAgreeMessage = 64 * 1024;
constexpr int32_t kMaxStatusCode = static_cast<int32_t>(StatusCode::kPermissionDenied);

class SingleProcessCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }

  Status Broadcast(void* buf, uint64_t bytes, int root) override {
    return CheckArgs("Broadcast", buf, buf, bytes, root);
  }
  Status Scatter(const void* send, void* recv, uint64_t bytes, int root) override {
    TL_RETURN_IF_ERROR(CheckArgs("Scatter", send, recv, bytes, root));
    if (bytes > 0) std::memmove(recv, send, bytes);
    return Status::Ok();
  }
  Status AllGather(const void* send, void* recv, uint64_t bytes) override {
    TL_RETURN_IF_ERROR(CheckArgs("AllGather", send, recv, bytes, 0));
    if (bytes > 0) std::memmove(recv, send, bytes);
    return Status::Ok();
  }
  Status Barrier() override { return Status::Ok(); }
};

}  // namespace

Status Communicator::CheckArgs(const char* what, const void* a, const void* b, uint64_t bytes,
                               int root) const {
  if (root < 0 || root >= size()) {
    return InvalidArgumentError(std::string(what) + ": root " + std::to_string(root) +
                                " is not a rank of a communicator of size " +
                                std::to_string(size()));
  }
  if (bytes > 0 && (a == nullptr || b == nullptr)) {
    return InvalidArgumentError(std::string(what) + ": null buffer for " + std::to_string(bytes) +
                                " bytes");
  }
  return Status::Ok();
}

Status Communicator::Agree(const Status& local) {
  const int n = size();
  const int32_t mine = static_cast<int32_t>(local.code());
  std::vector<int32_t> codes(n);
  TL_RETURN_IF_ERROR(AllGather(&mine, codes.data(), sizeof(mine)));
  const auto it = std::find_if(codes.begin(), codes.end(), [](int32_t c) { return c != 0; });
  if (it == codes.end()) return Status::Ok();
  const int failed = static_cast<int>(it - codes.begin());
  const int32_t code = *it;

  // The failing rank sends its message: length, then bytes.
  std::string message;
  uint64_t length = 0;
  if (rank() == failed) {
    message = local.message().substr(0, kMaxAgreeMessage);
    length = message.size();
  }
  TL_RETURN_IF_ERROR(Broadcast(&length, sizeof(length), failed));
  if (length > kMaxAgreeMessage) {
    return InternalError("Agree: rank " + std::to_string(failed) + " sent a message of " +
                         std::to_string(length) + " bytes (limit " +
                         std::to_string(kMaxAgreeMessage) + ")");
  }
  message.resize(length);
  TL_RETURN_IF_ERROR(Broadcast(message.data(), length, failed));
  if (code < 0 || code > kMaxStatusCode) {
    return InternalError("Agree: rank " + std::to_string(failed) + " sent status code " +
                         std::to_string(code));
  }
  return Status(static_cast<StatusCode>(code), "rank " + std::to_string(failed) + ": " + message);
}

std::unique_ptr<Communicator> MakeSingleProcessCommunicator() {
  return std::make_unique<SingleProcessCommunicator>();
}

}  // namespace tensorlift
