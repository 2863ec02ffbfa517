// The data plane when tensorlift is built without UCX: every entry point says
// so at run time (see ucx_transport.h).
#include <string>

#include "remote/ucx_transport.h"

#ifndef TENSORLIFT_NO_UCX_REASON
#error "TENSORLIFT_NO_UCX_REASON must be defined by the build"
#endif

namespace tensorlift::remote {
namespace {

Status NotBuilt() {
  return UnimplementedError(std::string("built without UCX: ") + TENSORLIFT_NO_UCX_REASON);
}

}  // namespace

bool UcxBuilt() { return false; }

bool UcxMapsCudaMemory() { return false; }

std::string UcxVersion() { return TENSORLIFT_NO_UCX_REASON; }

std::string UcxTransports() { return {}; }

std::string UcxChoiceReason() { return {}; }

std::string UcxCudaModule() { return {}; }

Result<std::unique_ptr<UcxServer>> UcxServer::Create(const UcxOptions& /*options*/) {
  return NotBuilt();
}

Result<std::unique_ptr<UcxClient>> UcxClient::Connect(std::string_view /*worker_address*/,
                                                      const UcxOptions& /*options*/,
                                                      std::chrono::milliseconds /*timeout*/) {
  return NotBuilt();
}

}  // namespace tensorlift::remote
