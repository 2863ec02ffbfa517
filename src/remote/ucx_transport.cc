// The UCX data plane (see ucx_transport.h). Built when UCX is found; its
// parts: ucx_core.{h,cc} (the context and worker, and what both sides share),
// ucx_server.cc (UcxServer), ucx_client.cc (UcxClient); here, what the loaded
// UCX is and can do, for reports.
//
// Wire blobs. WorkerAddress() and PackedRkey() return UCX's bytes inside a
// small frame (remote/frame.h). UCX parses addresses and keys without a
// length, so Connect and AddRegion check the frame before UCX sees a byte:
// garbage is an InvalidArgument error, never a read past the end.
#include "remote/ucx_transport.h"

#include <unistd.h>

#include <memory>
#include <string>

#include "remote/ucx_api.h"

namespace tensorlift::remote {

bool UcxBuilt() { return true; }

namespace {

// What a context with default options says of the loaded UCX, asked once per
// process (one context for both answers).
struct UcxProbe {
  bool maps_cuda = false;
  std::string transports;
};

const UcxProbe& Probe() {
  static const UcxProbe probe = [] {
    UcxProbe p;
    if (!LoadUcx().ok()) return p;
    Result<std::unique_ptr<UcxServer>> server = UcxServer::Create(UcxOptions{});
    if (server.ok()) {
      p.maps_cuda = (*server)->MapsCudaMemory();
      p.transports = (*server)->TransportsInUse();
    }
    return p;
  }();
  return probe;
}

}  // namespace

bool UcxMapsCudaMemory() { return Probe().maps_cuda; }

std::string UcxChoiceReason() {
  Result<const UcxApi*> api = LoadUcx();
  return api.ok() ? (*api)->choice : std::string();
}

std::string UcxTransports() { return Probe().transports; }

std::string UcxCudaModule() {
  Result<const UcxApi*> api = LoadUcx();
  if (!api.ok()) return {};
  const std::string& lib = (*api)->path;
  const size_t slash = lib.rfind('/');
  if (slash == std::string::npos) return {};
  const std::string module = lib.substr(0, slash) + "/ucx/libuct_cuda.so.0";
  return ::access(module.c_str(), F_OK) == 0 ? module : std::string();
}

std::string UcxVersion() {
  Result<const UcxApi*> api = LoadUcx();
  if (!api.ok()) return "not loadable: " + std::string(api.status().message());
  return (*api)->version + " (" + (*api)->path + ")";
}

}  // namespace tensorlift::remote
