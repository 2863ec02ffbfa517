// Capabilities(): what was built and what works here (tensorlift/capabilities.h).
#include "tensorlift/capabilities.h"

#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "common/posix_file.h"
#include "device/cuda_info.h"
#include "io/cufile.h"
#include "io/read_op.h"
#include "objstore/s3_client.h"
#include "remote/ucx_transport.h"
#include "tensorlift/communicator.h"
#include "tensorlift/version.h"

namespace tensorlift {
namespace {

constexpr const char* kNvidiaFsProc = "/proc/driver/nvidia-fs";

enum class GdsSupport { kYes, kWithClient, kNo };

struct FilesystemKind {
  uint32_t magic;  // statfs f_type (linux/magic.h and the vendors' drivers).
  const char* name;
  GdsSupport support;
  const char* note;  // What it needs, or why not.
};

// The filesystems GPUDirect Storage reads from (NVIDIA's GDS documentation:
// local ext4 and XFS; distributed filesystems through their GDS-enabled
// clients), and the common ones it does not.
constexpr FilesystemKind kFilesystems[] = {
    {0xEF53, "ext4", GdsSupport::kYes, "supported (ext4 in data=ordered mode, on NVMe or NVMe-oF)"},
    {0x58465342, "xfs", GdsSupport::kYes, "supported (on NVMe or NVMe-oF)"},
    {0x6969, "nfs", GdsSupport::kWithClient,
     "supported only over RDMA with a GDS-enabled NFS client (e.g. MLNX_OFED, VAST)"},
    {0x0BD00BD0, "lustre", GdsSupport::kWithClient,
     "supported only with a GDS-enabled Lustre client (DDN EXAScaler)"},
    {0x18031977, "wekafs", GdsSupport::kWithClient,
     "supported with the WekaFS client (GDS-enabled)"},
    {0x47504653, "gpfs", GdsSupport::kWithClient,
     "supported with IBM Storage Scale (GPFS) and its GDS support enabled"},
    {0x19830326, "beegfs", GdsSupport::kWithClient,
     "supported only with a GDS-enabled BeeGFS client"},
    {0x01021994, "tmpfs", GdsSupport::kNo,
     "not supported: memory-backed (read it into host memory instead)"},
    {0x858458F6, "ramfs", GdsSupport::kNo, "not supported: memory-backed"},
    {0x794C7630, "overlay", GdsSupport::kNo,
     "not supported: overlayfs (container layers); mount the weights directly"},
    {0x9123683E, "btrfs", GdsSupport::kNo, "not supported by GDS"},
    {0x2FC12FC1, "zfs", GdsSupport::kNo, "not supported by GDS"},
    {0xF2F52010, "f2fs", GdsSupport::kNo, "not supported by GDS"},
    {0x65735546, "fuse", GdsSupport::kNo,
     "not supported (FUSE; virtiofs needs a GDS-enabled setup)"},
    {0xFF534D42, "cifs", GdsSupport::kNo, "not supported by GDS"},
    {0xFE534D42, "smb2", GdsSupport::kNo, "not supported by GDS"},
    {0x00C36400, "ceph", GdsSupport::kNo, "not supported by GDS"},
    {0x01021997, "9p", GdsSupport::kNo, "not supported by GDS"},
    {0x73717368, "squashfs", GdsSupport::kNo, "not supported by GDS"},
};

void CheckFilesystem(const std::string& path, GdsCapabilities* gds) {
  gds->path = path;
  struct statfs fs {};
  if (::statfs(path.c_str(), &fs) != 0) {
    gds->filesystem = "unknown";
    gds->filesystem_reason = PosixError("statfs(" + path + ")", errno).message();
    return;
  }
  const uint32_t magic = static_cast<uint32_t>(fs.f_type);
  for (const FilesystemKind& kind : kFilesystems) {
    if (kind.magic != magic) continue;
    gds->filesystem = kind.name;
    // Distributed filesystems pass: with their GDS client they work, and
    // cuFileHandleRegister says so at run time if they do not.
    gds->filesystem_supported = kind.support != GdsSupport::kNo;
    gds->filesystem_reason = kind.note;
    return;
  }
  char hex[32];
  std::snprintf(hex, sizeof hex, "0x%" PRIX32, magic);
  gds->filesystem = std::string("unknown (statfs f_type ") + hex + ")";
  gds->filesystem_reason =
      "not known to support GDS (cuFile would run it in compatibility mode at best)";
}

GdsCapabilities QueryGds(const std::string& path) {
  GdsCapabilities gds;
  gds.built = CuFileBuiltIn();
  if (!path.empty()) CheckFilesystem(path, &gds);

  struct stat st {};
  if (::stat(kNvidiaFsProc, &st) == 0) {
    gds.nvidia_fs = true;
    std::ifstream version(std::string(kNvidiaFsProc) + "/version");
    std::string line;
    if (version && std::getline(version, line)) gds.nvidia_fs_version = line;
  } else {
    gds.nvidia_fs_reason =
        std::string(kNvidiaFsProc) + " is missing: the nvidia-fs kernel module is not loaded";
  }

  auto library = LoadCuFileLibrary();
  if (!gds.built) {
    gds.not_built_reason = library.status().message();
    gds.library_reason = "built without GPUDirect Storage";
    gds.driver_reason = gds.library_reason;
  } else if (!library.ok()) {
    gds.library_reason = library.status().message();
    gds.driver_reason = "no cuFile library is loaded";
  } else {
    gds.library_loaded = true;
    gds.library = library->path + " (cuFile " + std::to_string(library->version / 1000) + "." +
                  std::to_string(library->version % 1000 / 10) + "." +
                  std::to_string(library->version % 10) + ")";
    auto driver = CuFileDriver::Open();
    if (driver.ok()) {
      gds.driver_open = true;
    } else {
      gds.driver_reason = driver.status().message();
    }
  }
  gds.ready = gds.library_loaded && gds.nvidia_fs && gds.driver_open &&
              (path.empty() || gds.filesystem_supported);
  return gds;
}

UringCapabilities QueryUring() {
  UringCapabilities uring;
  uring.built = UringBuiltIn();
  auto engine = MakeUringEngine(1, {});
  uring.usable = engine.ok();
  if (!engine.ok()) uring.reason = engine.status().message();
  return uring;
}

}  // namespace

CommCapabilities QueryComm() {
  CommCapabilities c;
  c.mpi_built = MpiBuiltIn();
  if (auto v = MpiLibraryVersion(); v.ok()) {
    c.mpi_library = *v;
  } else {
    c.mpi_reason = v.status().message();
  }
  c.nccl_built = NcclBuiltIn();
  if (auto v = NcclLibraryVersion(); v.ok()) {
    c.nccl_loaded = true;
    c.nccl_version = *v;
  } else {
    c.nccl_reason = v.status().message();
  }
  return c;
}

CapabilityReport Capabilities(const std::string& path_for_gds) {
  CapabilityReport report;
  report.version = kVersion;
  report.cuda = QueryCudaCapabilities();
  report.io_uring = QueryUring();
  report.gds = QueryGds(path_for_gds);
  report.comm = QueryComm();
  report.remote = QueryRemoteCapabilities();
  return report;
}

RemoteCapabilities QueryRemoteCapabilities() {
  RemoteCapabilities c;
  c.ucx_built = remote::UcxBuilt();
  (c.ucx_built ? c.ucx_version : c.ucx_reason) = remote::UcxVersion();
  if (c.ucx_built) {
    c.ucx_transports = remote::UcxTransports();
    c.ucx_choice = remote::UcxChoiceReason();
    c.ucx_cuda_memory = remote::UcxMapsCudaMemory();
    c.ucx_cuda_module = remote::UcxCudaModule();
  }
  if (Result<std::string> s3 = objstore::S3ClientVersion(); s3.ok()) {
    c.s3_built = true;
    c.s3_version = *s3;
  } else {
    // Unimplemented: compiled without curl.h; else built, libcurl not found at run time.
    c.s3_built = s3.status().code() != StatusCode::kUnimplemented;
    c.s3_reason = s3.status().message();
  }
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  for (size_t begin = 0; begin <= dirs.size();) {
    size_t end = dirs.find(':', begin);
    if (end == std::string::npos) end = dirs.size();
    const std::string candidate = dirs.substr(begin, end - begin) + "/etcd";
    if (end > begin && ::access(candidate.c_str(), X_OK) == 0) {
      c.etcd = candidate;
      break;
    }
    begin = end + 1;
  }
  return c;
}

}  // namespace tensorlift
