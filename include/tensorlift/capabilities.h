// What this build of tensorlift has, and what works on this machine: CUDA
// and its GPUs, io_uring, GPUDirect Storage (cuFile), MPI and NCCL. The answers of
// `tensorlift doctor`.
//
// Every part that is missing or not working comes with a reason that names
// the missing piece and, where there is one, the system's own message, e.g.
// "cudaGetDeviceCount: no CUDA-capable device is detected".
//
// Thread safety: Capabilities() may be called from any thread; it opens and
// closes what it probes (the CUDA runtime stays initialised).
#ifndef TENSORLIFT_CAPABILITIES_H_
#define TENSORLIFT_CAPABILITIES_H_

#include <cstdint>
#include <string>
#include <vector>

namespace tensorlift {

// One GPU as the CUDA runtime sees it.
struct GpuInfo {
  int index = 0;              // The CUDA ordinal (OpenCudaDevice's argument).
  std::string name;           // "NVIDIA H100 80GB HBM3".
  uint64_t memory_bytes = 0;  // Total device memory.
  int compute_major = 0;      // Compute capability, e.g. 9.0.
  int compute_minor = 0;
  std::string pci_bus_id;  // "0000:3b:00.0".
};

struct CudaCapabilities {
  // The CUDA backend was compiled in (nvcc was found at build time).
  bool built = false;
  std::string not_built_reason;  // Why not, when !built.
  // Versions as CUDA encodes them: 1000 * major + 10 * minor (13000 = 13.0);
  // 0 when unknown, with the reason.
  int runtime_version = 0;
  std::string runtime_reason;
  int driver_version = 0;
  std::string driver_reason;
  // The GPUs; when empty, why.
  std::vector<GpuInfo> gpus;
  std::string gpus_reason;
};

struct UringCapabilities {
  bool built = false;   // liburing was found at build time.
  bool usable = false;  // The kernel accepted an io_uring here.
  std::string reason;   // Why not, when !usable.
};

// GPUDirect Storage readiness, part by part; each `false` has its reason.
struct GdsCapabilities {
  bool built = false;  // The cuFile loader was compiled in (CUDA + cufile.h).
  std::string not_built_reason;
  // libcufile.so.0 (or $TENSORLIFT_CUFILE_LIB) loads and has every symbol.
  bool library_loaded = false;
  std::string library;  // What was loaded, with cuFile's version, when loaded.
  std::string library_reason;
  // /proc/driver/nvidia-fs exists: the nvidia-fs kernel module is loaded.
  // Without it cuFile can only run in compatibility mode (POSIX reads
  // through its own bounce buffers), which is not GPUDirect.
  bool nvidia_fs = false;
  std::string nvidia_fs_version;  // From /proc/driver/nvidia-fs/version.
  std::string nvidia_fs_reason;
  // cuFileDriverOpen succeeded.
  bool driver_open = false;
  std::string driver_reason;
  // The filesystem of the path passed to Capabilities(), if one was.
  std::string path;
  std::string filesystem;  // "ext4", "xfs", "nfs", "tmpfs", ...
  bool filesystem_supported = false;
  std::string filesystem_reason;  // Why not supported, or what it needs.
  // Everything above holds: reads can go straight from storage to the GPU.
  bool ready = false;
};

// The communicators of multi-rank loading (LoadDistributed).
struct CommCapabilities {
  bool mpi_built = false;    // The MPI communicator was compiled in.
  std::string mpi_library;   // "Open MPI v4.1.4", when built.
  std::string mpi_reason;    // Why not built, or why the version is unknown.
  bool nccl_built = false;   // The NCCL communicator was compiled in (CUDA + nccl.h).
  bool nccl_loaded = false;  // libnccl.so.2 loads and has every symbol.
  std::string nccl_version;  // "2.27.3 (/path/to/libnccl.so.2)", when loaded.
  std::string nccl_reason;   // Why not built or not loaded.
};

struct RemoteCapabilities {
  bool ucx_built = false;   // The UCX data plane was compiled in (peer loading).
  std::string ucx_version;  // "1.13.1", when built.
  std::string ucx_reason;   // Why not built.
  // The loaded UCX's transports (its context's resources, "tcp, sysv, posix, self,
  // cma", or with cuda_copy, cuda_ipc, gdr_copy in a CUDA build), empty when it
  // does not load; and whether it maps CUDA memory (a GPU destination or source
  // is then pulled from or into device memory directly).
  std::string ucx_transports;
  // Why that build: "named by TENSORLIFT_UCX_LIB", "PyPI's libucx-cu13 beside
  // tensorlift (the driver supports CUDA 13)", or "the system's ..." and why.
  std::string ucx_choice;
  bool ucx_cuda_memory = false;
  // The build's CUDA transport module (<libucp's folder>/ucx/libuct_cuda.so.0),
  // when it ships one: it did not load if ucx_cuda_memory is false.
  std::string ucx_cuda_module;
  bool s3_built = false;   // The S3 client (object storage) was compiled in.
  std::string s3_version;  // "libcurl 7.88.1, OpenSSL/3.0.19 (libcurl.so.4)", when usable.
  std::string s3_reason;   // Why not built, or (built) why libcurl was not found at run time.
  std::string etcd;        // The etcd binary on PATH (for tests), or empty.
};

struct CapabilityReport {
  std::string version;  // tensorlift's version, "0.1.0".
  CudaCapabilities cuda;
  UringCapabilities io_uring;
  GdsCapabilities gds;
  CommCapabilities comm;
  RemoteCapabilities remote;
};

// Probes this machine. `path_for_gds`, when not empty, is a file or
// directory whose filesystem is checked for GPUDirect Storage support. Never
// fails: what cannot be probed is reported with its reason. Takes up to a
// second when cuFile is present (cuFileDriverOpen).
CapabilityReport Capabilities(const std::string& path_for_gds = "");
// Just the peer-loading part of Capabilities() (no GPU or file probe; cheap).
RemoteCapabilities QueryRemoteCapabilities();

}  // namespace tensorlift

#endif  // TENSORLIFT_CAPABILITIES_H_
