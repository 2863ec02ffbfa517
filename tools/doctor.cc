// tensorlift doctor [PATH] [--json]: what was built and what works here.
#include <cstdio>
#include <string>

#include "commands.h"
#include "tensorlift/capabilities.h"
#include "tensorlift/crash.h"
#include "tensorlift/text.h"

namespace tensorlift::cli {
namespace {

std::string CudaVersion(int v) {
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

std::string Gib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(bytes) / (1ull << 30));
  return buf;
}

// `value`, or "<what> (<reason>)" when it is missing.
std::string Or(bool ok, const std::string& value, const char* what, const std::string& reason) {
  return ok ? value : std::string(what) + " (" + reason + ")";
}

void PrintText(const CapabilityReport& r) {
  const CudaCapabilities& c = r.cuda;
  std::printf("tensorlift %s\n", r.version.c_str());
  std::printf("CUDA: %s\n", c.built ? ("built, runtime " + Or(c.runtime_version != 0,
                                                              CudaVersion(c.runtime_version),
                                                              "unknown", c.runtime_reason))
                                          .c_str()
                                    : c.not_built_reason.c_str());
  if (c.built) {
    std::string driver =
        Or(c.driver_version != 0, CudaVersion(c.driver_version), "none", c.driver_reason);
    if (c.driver_version != 0 && !c.driver_reason.empty()) driver += " (" + c.driver_reason + ")";
    std::printf("CUDA driver: %s\n", driver.c_str());
  }
  if (c.gpus.empty()) {
    std::printf("GPUs: none (%s)\n", c.gpus_reason.c_str());
  } else {
    std::printf("GPUs: %zu\n", c.gpus.size());
    for (const GpuInfo& g : c.gpus) {
      std::printf("  GPU %d: %s, %s, compute capability %d.%d, PCI %s\n", g.index, g.name.c_str(),
                  Gib(g.memory_bytes).c_str(), g.compute_major, g.compute_minor,
                  g.pci_bus_id.empty() ? "unknown" : g.pci_bus_id.c_str());
    }
  }
  const UringCapabilities& u = r.io_uring;
  std::printf("io_uring: %s\n",
              !u.built ? ("not built (" + u.reason + ")").c_str()
                       : Or(u.usable, "built, usable", "built, not usable", u.reason).c_str());
  const GdsCapabilities& g = r.gds;
  if (!g.built) {
    std::printf("GPUDirect Storage: %s\n", g.not_built_reason.c_str());
  } else {
    std::printf("GPUDirect Storage: %s\n", g.ready ? "ready" : "not ready");
  }
  std::printf("  cuFile library: %s\n",
              Or(g.library_loaded, g.library, "not loaded", g.library_reason).c_str());
  std::printf("  nvidia-fs: %s\n",
              Or(g.nvidia_fs,
                 "loaded" + (g.nvidia_fs_version.empty() ? "" : " (" + g.nvidia_fs_version + ")"),
                 "missing", g.nvidia_fs_reason)
                  .c_str());
  std::printf(
      "  cuFileDriverOpen: %s\n",
      Or(g.driver_open,
         g.nvidia_fs
             ? "ok"
             : "ok, in compatibility mode only (POSIX reads through bounce buffers, not GPUDirect)",
         g.library_loaded ? "failed" : "not tried", g.driver_reason)
          .c_str());
  if (!g.path.empty()) {
    std::printf("  filesystem of %s: %s, %s\n", QuoteName(g.path).c_str(), g.filesystem.c_str(),
                g.filesystem_reason.c_str());
  }
  const CommCapabilities& m = r.comm;
  const std::string mpi =
      !m.mpi_built ? "not built (" + m.mpi_reason + ")"
                   : Or(!m.mpi_library.empty(), "built, " + m.mpi_library, "built", m.mpi_reason);
  std::printf("MPI: %s\n", mpi.c_str());
  std::printf(
      "NCCL: %s\n",
      !m.nccl_built
          ? ("not built (" + m.nccl_reason + ")").c_str()
          : Or(m.nccl_loaded, "built, library " + m.nccl_version, "built", m.nccl_reason).c_str());
  const RemoteCapabilities& rc = r.remote;
  std::printf("UCX (peer loading): %s\n", rc.ucx_built
                                              ? ("built, " + rc.ucx_version).c_str()
                                              : ("not built (" + rc.ucx_reason + ")").c_str());
  if (!rc.ucx_transports.empty()) {
    std::printf("  UCX chosen: %s\n", rc.ucx_choice.c_str());
    std::printf("  UCX transports: %s\n", rc.ucx_transports.c_str());
    std::printf("  UCX CUDA memory: %s\n",
                rc.ucx_cuda_memory ? "yes (GPU memory is pulled and served in place)"
                : !rc.ucx_cuda_module.empty()
                    ? ("no (this build's CUDA transport, " + rc.ucx_cuda_module +
                       ", did not load: no CUDA driver here, or another CUDA than the one it "
                       "was built for; a GPU destination is pulled through host memory)")
                          .c_str()
                    : "no (this UCX build has no CUDA transport: a GPU destination is pulled "
                      "through host memory; set TENSORLIFT_UCX_LIB to a CUDA build's "
                      "libucp.so.0, e.g. PyPI's libucx-cu12 or libucx-cu13 matching the "
                      "driver's CUDA)");
  }
  std::printf("S3 client (object storage): %s\n",
              !rc.s3_built            ? ("not built (" + rc.s3_reason + ")").c_str()
              : rc.s3_version.empty() ? ("built, not usable here: " + rc.s3_reason).c_str()
                                      : ("built, " + rc.s3_version).c_str());
  std::printf("etcd (registry tests): %s\n", rc.etcd.empty() ? "not on PATH" : rc.etcd.c_str());
  std::printf(
      "crash report: %s\n",
      CrashHandlerInstalled()
          ? "on (a fatal signal prints the native stack and what tensorlift loaded to stderr; "
            "TENSORLIFT_CRASH_HANDLER=0 turns it off)"
          : "off (TENSORLIFT_CRASH_HANDLER=0)");
}

// A JSON string, or null for an empty one.
std::string JsonOrNull(const std::string& s) { return s.empty() ? "null" : JsonString(s); }
const char* JsonBool(bool b) { return b ? "true" : "false"; }

void PrintJson(const CapabilityReport& r) {
  const CudaCapabilities& c = r.cuda;
  std::string out = "{\"version\":" + JsonString(r.version);
  out += ",\"cuda\":{\"built\":" + std::string(JsonBool(c.built)) +
         ",\"not_built_reason\":" + JsonOrNull(c.not_built_reason) + ",\"runtime_version\":" +
         (c.runtime_version ? JsonString(CudaVersion(c.runtime_version)) : "null") +
         ",\"runtime_reason\":" + JsonOrNull(c.runtime_reason) + ",\"driver_version\":" +
         (c.driver_version ? JsonString(CudaVersion(c.driver_version)) : "null") +
         ",\"driver_reason\":" + JsonOrNull(c.driver_reason) + ",\"gpus\":[";
  for (size_t i = 0; i < c.gpus.size(); ++i) {
    const GpuInfo& g = c.gpus[i];
    out += (i ? ",{" : "{");
    out += "\"index\":" + std::to_string(g.index) + ",\"name\":" + JsonString(g.name) +
           ",\"memory_bytes\":" + std::to_string(g.memory_bytes) + ",\"compute_capability\":\"" +
           std::to_string(g.compute_major) + "." + std::to_string(g.compute_minor) +
           "\",\"pci_bus_id\":" + JsonOrNull(g.pci_bus_id) + "}";
  }
  out += "],\"gpus_reason\":" + JsonOrNull(c.gpus_reason) + "}";
  const UringCapabilities& u = r.io_uring;
  out += ",\"io_uring\":{\"built\":" + std::string(JsonBool(u.built)) +
         ",\"usable\":" + JsonBool(u.usable) + ",\"reason\":" + JsonOrNull(u.reason) + "}";
  const GdsCapabilities& g = r.gds;
  out += ",\"gds\":{\"built\":" + std::string(JsonBool(g.built)) +
         ",\"not_built_reason\":" + JsonOrNull(g.not_built_reason) +
         ",\"ready\":" + JsonBool(g.ready) + ",\"library_loaded\":" + JsonBool(g.library_loaded) +
         ",\"library\":" + JsonOrNull(g.library) +
         ",\"library_reason\":" + JsonOrNull(g.library_reason) +
         ",\"nvidia_fs\":" + JsonBool(g.nvidia_fs) +
         ",\"nvidia_fs_version\":" + JsonOrNull(g.nvidia_fs_version) +
         ",\"nvidia_fs_reason\":" + JsonOrNull(g.nvidia_fs_reason) +
         ",\"driver_open\":" + JsonBool(g.driver_open) +
         ",\"driver_reason\":" + JsonOrNull(g.driver_reason) + ",\"path\":" + JsonOrNull(g.path);
  if (!g.path.empty()) {
    out += ",\"filesystem\":" + JsonString(g.filesystem) +
           ",\"filesystem_supported\":" + JsonBool(g.filesystem_supported) +
           ",\"filesystem_reason\":" + JsonOrNull(g.filesystem_reason);
  }
  out += "}";
  const CommCapabilities& m = r.comm;
  out += ",\"comm\":{\"mpi_built\":" + std::string(JsonBool(m.mpi_built)) +
         ",\"mpi_library\":" + JsonOrNull(m.mpi_library) +
         ",\"mpi_reason\":" + JsonOrNull(m.mpi_reason) +
         ",\"nccl_built\":" + JsonBool(m.nccl_built) +
         ",\"nccl_loaded\":" + JsonBool(m.nccl_loaded) +
         ",\"nccl_version\":" + JsonOrNull(m.nccl_version) +
         ",\"nccl_reason\":" + JsonOrNull(m.nccl_reason) + "}";
  const RemoteCapabilities& rc = r.remote;
  out += ",\"remote\":{\"ucx_built\":" + std::string(JsonBool(rc.ucx_built)) +
         ",\"ucx_version\":" + JsonOrNull(rc.ucx_version) +
         ",\"ucx_reason\":" + JsonOrNull(rc.ucx_reason) +
         ",\"ucx_transports\":" + JsonOrNull(rc.ucx_transports) +
         ",\"ucx_choice\":" + JsonOrNull(rc.ucx_choice) +
         ",\"ucx_cuda_memory\":" + JsonBool(rc.ucx_cuda_memory) +
         ",\"ucx_cuda_module\":" + JsonOrNull(rc.ucx_cuda_module) +
         ",\"s3_built\":" + JsonBool(rc.s3_built) + ",\"s3_version\":" + JsonOrNull(rc.s3_version) +
         ",\"s3_reason\":" + JsonOrNull(rc.s3_reason) + ",\"etcd\":" + JsonOrNull(rc.etcd) + "}}";
  std::printf("%s\n", out.c_str());
}

}  // namespace

int RunDoctor(const std::string& path, bool json) {
  const CapabilityReport report = Capabilities(path);
  if (json) {
    PrintJson(report);
  } else {
    PrintText(report);
  }
  return kExitOk;
}

}  // namespace tensorlift::cli
