#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "tensorlift/checksum.h"
#include "tensorlift/loader.h"

namespace tensorlift::cli {
namespace {

void DrawBar(const Progress& p) {
  const double frac = p.bytes_total ? static_cast<double>(p.bytes_done) / p.bytes_total : 1.0;
  const int width = 30;
  const int filled = static_cast<int>(frac * width);
  std::string bar(filled, '#');
  bar.append(width - filled, '.');
  std::fprintf(stderr, "\r[%s] %5.1f%%  %.2f GB/s  ", bar.c_str(), frac * 100, p.gbps());
  std::fflush(stderr);
}

}  // namespace

ObjectStoreOptions StoreArgs::ToOptions() const {
  ObjectStoreOptions o;
  o.endpoint = endpoint;
  o.region = region;
  o.profile = profile;
  o.anonymous = no_sign;
  o.cache_dir = cache_dir;
  o.parallel = {tp_size, tp_rank};
  o.layout = layout;
  return o;
}

Result<Checkpoint> OpenCheckpoint(const std::string& path, const StoreArgs& store) {
  if (IsObjectStoreUrl(path)) return OpenObjectStoreCheckpoint(path, store.ToOptions());
  return Checkpoint::Open(path);
}

Result<LoadedCheckpoint> LoadPath(const std::string& path, const LoadOptions& options,
                                  const StoreArgs& store) {
  if (IsObjectStoreUrl(path)) return LoadFromObjectStore(path, options, store.ToOptions());
  return Load(path, options);
}

int RunLoad(const LoadArgs& args) {
  LoadOptions opts;
  auto mode = ParseIoMode(args.mode);
  auto engine = ParseIoEngine(args.engine);
  if (!mode.ok() || !engine.ok()) {
    std::fprintf(stderr, "%s\n", (!mode.ok() ? mode.status() : engine.status()).ToString().c_str());
    return kExitUsage;
  }
  opts.mode = *mode;
  opts.engine = *engine;
  opts.threads = args.threads;
  opts.queue_depth = args.queue_depth;
  opts.block_size = args.block_mib << 20;
  opts.staging_buffers = args.staging_buffers;
  opts.staging_bytes = args.staging_mib << 20;
  opts.gds = args.gds;
  if (!args.content_hash) opts.content_hash = ContentHashMode::kOff;
  opts.copy = args.copy;
  if (auto dev = ParseDevice(args.device); !dev.ok()) {
    std::fprintf(stderr, "%s\n", dev.status().ToString().c_str());
    return kExitUsage;
  } else {
    opts.device = *dev;
  }
  if (!args.dtype.empty()) {
    auto dt = DtypeFromAnyName(args.dtype);
    if (!dt) {
      std::fprintf(stderr, "unknown dtype '%s' (expected F32, F16 or BF16)\n", args.dtype.c_str());
      return kExitUsage;
    }
    opts.dtype = *dt;
  }
  if (!args.filter.empty()) {
    auto f = TensorFilter::Regex(args.filter);
    if (!f.ok()) {
      std::fprintf(stderr, "%s\n", f.status().ToString().c_str());
      return kExitUsage;
    }
    opts.filter = std::move(f).value();
  }
  if (args.mpi) return RunLoadMpi(args, opts);
  const bool bar = args.progress && ::isatty(STDERR_FILENO);
  if (bar) opts.progress = DrawBar;

  if (args.mpi && args.store.tp_size != 1) {
    std::fprintf(stderr,
                 "--mpi shares the reads of whole tensors among the ranks; --tp-size loads one "
                 "rank's slices: not both\n");
    return kExitUsage;
  }
  opts.parallel = {args.store.tp_size, args.store.tp_rank};  // Local paths and buckets alike.
  opts.layout = args.store.layout;
  if (args.store.tp_rank >= args.store.tp_size) {
    std::fprintf(stderr, "--tp-rank %d is not below --tp-size %d\n", args.store.tp_rank,
                 args.store.tp_size);
    return kExitUsage;
  }
  if (args.mpi && IsObjectStoreUrl(args.path)) {
    std::fprintf(stderr, "--mpi loads local files; %s is in object storage\n", args.path.c_str());
    return kExitUsage;
  }
  auto loaded = LoadPath(args.path, opts, args.store);
  if (bar) std::fprintf(stderr, "\r%60s\r", "");
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s\n", loaded.status().ToString().c_str());
    return kExitInvalid;
  }
  // With --checksum, stdout holds only the checksum lines.
  FILE* report = args.checksum ? stderr : stdout;
  for (const FileReport& f : loaded->files()) {
    const std::string how =
        IsObjectStoreUrl(f.path) ? "fetched"
        : f.mode == IoMode::kMmap
            ? "mmap (mapped, read on first touch)"
            : std::string(IoModeName(f.mode)) + " (" + std::string(IoEngineName(f.engine)) + ")";
    const std::string decoded =
        f.decoded > 0 ? " (" + std::to_string(f.decoded) + " sparse tensors decoded)" : "";
    std::fprintf(report, "%s: %u tensors, %llu bytes%s, %s%s%s\n", f.path.c_str(), f.tensors,
                 static_cast<unsigned long long>(f.bytes), decoded.c_str(), how.c_str(),
                 f.reason.empty() ? "" : ": ", f.reason.c_str());
  }
  if (!opts.device.on_host() || opts.dtype) {
    const DeviceMemoryPlan& p = loaded->device_plan();
    std::fprintf(
        report,
        "memory plan on %s: %llu bytes for tensors, %llu for conversion slots, %llu pinned\n",
        args.device.c_str(), static_cast<unsigned long long>(p.device_bytes),
        static_cast<unsigned long long>(p.scratch_bytes),
        static_cast<unsigned long long>(p.pinned_bytes));
  }
  const double secs = loaded->seconds();
  uint64_t mapped = 0, realigned = 0;
  for (const FileReport& f : loaded->files()) {
    realigned += f.realigned_bytes;
    if (f.mode == IoMode::kMmap) mapped += f.bytes - f.realigned_bytes;
  }
  std::string views = mapped == 0 ? ""
                                  : " (" + std::to_string(mapped) +
                                        " of those bytes are views of the page cache: not copied, "
                                        "read on first touch)";
  if (realigned > 0) {
    views += " (" + std::to_string(realigned) +
             " bytes of tensors misaligned in their files copied to aligned memory)";
  }
  std::fprintf(report, "loaded %zu tensors, %llu bytes in %.3f s: %.2f GB/s%s\n",
               loaded->tensors().size(), static_cast<unsigned long long>(loaded->total_bytes()),
               secs, secs > 0 ? loaded->total_bytes() / secs / 1e9 : 0.0, views.c_str());
  if (loaded->content())
    std::fprintf(report, "content %s\n", loaded->content()->root.Hex().c_str());
  return args.checksum ? PrintChecksums(*loaded) : kExitOk;
}

int PrintChecksums(const LoadedCheckpoint& loaded) {
  std::vector<std::byte> host;
  for (const LoadedTensor& t : loaded.tensors()) {  // Name order.
    const void* bytes = t.data;
    if (t.device != DeviceType::kCpu) {
      host.resize(t.nbytes);
      Status st = loaded.CopyToHost(t.name, host.data());
      if (!st.ok()) {
        std::fprintf(stderr, "%s\n", st.ToString().c_str());
        return kExitInvalid;
      }
      bytes = host.data();
    }
    std::printf("%s\t%s\n", t.name.c_str(), HexU64(Xxh3_64(bytes, t.nbytes)).c_str());
  }
  return kExitOk;
}

}  // namespace tensorlift::cli
