// The loader: the public types of include/tensorlift/loader.h, and Load,
// which sends each load down its path: the host path (host_load.h), a sparse
// load on the host, or a load onto a device (device_load.h, LoadOntoDevice).
// See include/tensorlift/loader.h for the contract.
#include "tensorlift/loader.h"

#include <algorithm>
#include <cstring>
#include <regex>
#include <unordered_set>

#include "device/device.h"
#include "format/tp_layout.h"
#include "load/checkpoint_builder.h"
#include "load/device_load.h"
#include "load/host_load.h"
#include "load/loader_internal.h"
#include "load/owners.h"
#include "load/shared_memory.h"
#include "load/sparse_load.h"
#include "tensorlift/sparse.h"
#include "tensorlift/text.h"

namespace tensorlift {

std::string_view IoModeName(IoMode mode) {
  switch (mode) {
    case IoMode::kAuto:
      return "auto";
    case IoMode::kBuffered:
      return "buffered";
    case IoMode::kDirect:
      return "direct";
    case IoMode::kMmap:
      return "mmap";
  }
  return "?";
}

std::string_view IoEngineName(IoEngine engine) {
  switch (engine) {
    case IoEngine::kAuto:
      return "auto";
    case IoEngine::kThreads:
      return "threads";
    case IoEngine::kUring:
      return "uring";
  }
  return "?";
}

Result<IoMode> ParseIoMode(std::string_view name) {
  for (IoMode m : {IoMode::kAuto, IoMode::kBuffered, IoMode::kDirect, IoMode::kMmap}) {
    if (IoModeName(m) == name) return m;
  }
  return InvalidArgumentError("unknown I/O mode " + QuoteName(name) +
                              " (expected auto, buffered, direct or mmap)");
}

Result<IoEngine> ParseIoEngine(std::string_view name) {
  for (IoEngine e : {IoEngine::kAuto, IoEngine::kThreads, IoEngine::kUring}) {
    if (IoEngineName(e) == name) return e;
  }
  return InvalidArgumentError("unknown I/O engine " + QuoteName(name) +
                              " (expected auto, threads or uring)");
}

TensorFilter TensorFilter::Names(std::vector<std::string> names) {
  auto set = std::make_shared<std::unordered_set<std::string>>(names.begin(), names.end());
  TensorFilter f;
  f.pred_ = [set](std::string_view n) { return set->count(std::string(n)) > 0; };
  return f;
}

Result<TensorFilter> TensorFilter::Regex(const std::string& pattern) {
  std::shared_ptr<std::regex> re;
  try {  // std::regex reports a bad pattern only by throwing.
    re = std::make_shared<std::regex>(pattern, std::regex::ECMAScript | std::regex::optimize);
  } catch (const std::regex_error& e) {
    return InvalidArgumentError("invalid regular expression " + QuoteName(pattern) + ": " +
                                e.what());
  }
  TensorFilter f;
  f.pred_ = [re](std::string_view n) { return std::regex_search(n.begin(), n.end(), *re); };
  return f;
}

TensorFilter TensorFilter::Predicate(std::function<bool(std::string_view)> pred) {
  TensorFilter f;
  f.pred_ = std::move(pred);
  return f;
}

LoadedCheckpoint::LoadedCheckpoint() : owners_(std::make_unique<Owners>()) {}
LoadedCheckpoint::~LoadedCheckpoint() = default;
LoadedCheckpoint::LoadedCheckpoint(LoadedCheckpoint&&) noexcept = default;
LoadedCheckpoint& LoadedCheckpoint::operator=(LoadedCheckpoint&&) noexcept = default;

const LoadedTensor* LoadedCheckpoint::Find(std::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const LoadedTensor& t, std::string_view n) { return t.name < n; });
  if (it == tensors_.end() || it->name != name) return nullptr;
  return &*it;
}

Status LoadedCheckpoint::CopyToHost(std::string_view name, void* dst) const {
  const LoadedTensor* t = Find(name);
  if (t == nullptr) return NotFoundError("no tensor " + QuoteName(name) + " was loaded");
  if (t->nbytes == 0) return Status::Ok();
  if (!owners_->device || t->device == DeviceType::kCpu) {
    std::memcpy(dst, t->data, t->nbytes);
    return Status::Ok();
  }
  TL_ASSIGN_OR_RETURN(auto stream, owners_->device->CreateStream());
  TL_RETURN_IF_ERROR(stream->CopyToHost(static_cast<std::byte*>(dst),
                                        static_cast<const std::byte*>(t->data), t->nbytes));
  return stream->Synchronize();
}

uint64_t LoadedCheckpoint::buffer_bytes() const {
  std::unordered_set<const Buffer*> seen;
  uint64_t total = 0;
  for (const auto& b : owners_->buffers) {
    if (b && seen.insert(b.get()).second) total += b->size();
  }
  return total;
}

std::string DeviceId::Name() const {
  switch (type) {
    case DeviceType::kCpu:
      return "cpu";
    case DeviceType::kCuda:
      return "cuda:" + std::to_string(index);
    case DeviceType::kEmulated:
      return "emulated:" + std::to_string(index);
  }
  return "?";
}

Result<DeviceId> ParseDevice(std::string_view name) {
  auto bad = [&] {
    return InvalidArgumentError("unknown device " + QuoteName(name) +
                                " (expected cpu, cuda or cuda:N)");
  };
  std::string_view kind = name, index;
  if (auto colon = name.find(':'); colon != std::string_view::npos) {
    kind = name.substr(0, colon);
    index = name.substr(colon + 1);
    if (index.empty() || index.size() > 4 ||
        index.find_first_not_of("0123456789") != std::string_view::npos) {
      return bad();
    }
  }
  const int n = index.empty() ? 0 : std::stoi(std::string(index));
  if (kind == "cpu" && n == 0) return DeviceId::Cpu();
  if (kind == "cuda") return DeviceId::Cuda(n);
  if (kind == "emulated") return DeviceId::Emulated(n);
  return bad();
}

namespace {

// The device of options.device, or none for a plain host load.
Result<std::shared_ptr<Device>> DeviceFor(const LoadOptions& options) {
  switch (options.device.type) {
    case DeviceType::kCpu:
      if (!options.dtype) return std::shared_ptr<Device>();
      return MakeHostDevice();
    case DeviceType::kCuda:
    case DeviceType::kEmulated:
      return OpenDevice(options.device.type, options.device.index);
  }
  return std::shared_ptr<Device>();
}

}  // namespace

namespace {

// on_tensor for every tensor of a complete load, in name order.
Status HandOutAll(const LoadedCheckpoint& loaded, const TensorCallback& on_tensor) {
  const auto& owners = CheckpointBuilder::Owners(loaded);
  for (size_t i = 0; i < loaded.tensors().size(); ++i) {
    TL_RETURN_IF_ERROR(on_tensor(StreamedTensor(loaded.tensors()[i], owners[i])));
  }
  return Status::Ok();
}

// Load without LoadOptions::shared_memory's last step.
Result<LoadedCheckpoint> LoadAnyPath(const Checkpoint& checkpoint, const LoadOptions& options) {
  TL_ASSIGN_OR_RETURN(std::shared_ptr<Device> device, DeviceFor(options));
  const bool sparse = options.decode_sparse && MayBeSparse(checkpoint);
  if (!device && !sparse) return LoadOnHost(checkpoint, options, nullptr);
  if (options.content_hash == ContentHashMode::kOn) {
    return InvalidArgumentError(
        "content_hash: the content identity is computed by host loads of the stored bytes, not "
        "by device loads, dtype conversions or decoded sparse checkpoints (decode_sparse)");
  }
  // These loads hand their tensors to on_tensor once they are complete.
  LoadOptions inner = options;
  inner.on_tensor = nullptr;
  inner.content_hash = ContentHashMode::kOff;
  Result<LoadedCheckpoint> r = device ? LoadOntoDevice(checkpoint, inner, device)
                                      : LoadSparseOnHost(checkpoint, inner, nullptr);
  if (r.ok() && options.on_tensor) TL_RETURN_IF_ERROR(HandOutAll(*r, options.on_tensor));
  return r;
}

}  // namespace

Status CheckSourceOptions(const Checkpoint& checkpoint, const LoadOptions& options) {
  if (!checkpoint.store()) return Status::Ok();
  auto refuse = [&](const std::string& what) {
    return InvalidArgumentError(what + " (" + checkpoint.path() +
                                " is read through its store, not from local files)");
  };
  if (options.mode != IoMode::kAuto) {
    return refuse("the I/O mode " + std::string(IoModeName(options.mode)) +
                  " applies to local files; leave it auto");
  }
  if (options.engine != IoEngine::kAuto) {
    return refuse("the I/O engine " + std::string(IoEngineName(options.engine)) +
                  " applies to local files; leave it auto");
  }
  if (options.threads != 0) return refuse("threads (pread threads) apply to local files");
  return Status::Ok();
}

// LoadOptions::parallel's rule (loader.h): a rank in range, a layout that
// parses, no content identity, no sparse tensors to decode.
Status CheckParallelOptions(const Checkpoint& checkpoint, const LoadOptions& options) {
  const TensorParallel& p = options.parallel;
  TL_RETURN_IF_ERROR(CheckRank(p));
  if (p.size == 1) return Status::Ok();
  TL_RETURN_IF_ERROR(ParallelLayout::Parse(options.layout).status());
  if (options.content_hash == ContentHashMode::kOn) {
    return InvalidArgumentError(
        "content_hash: the content identity is the whole checkpoint's, not a tensor-parallel "
        "rank's slices");
  }
  if (options.decode_sparse && MayBeSparse(checkpoint)) {
    TL_ASSIGN_OR_RETURN(const sparse::SparseCatalog catalog, sparse::FindSparse(checkpoint));
    if (!catalog.empty()) {
      return InvalidArgumentError(
          checkpoint.path() +
          ": it has sparse-bitmask tensors, and slicing them for a tensor-parallel rank is not "
          "built; load with decode_sparse off to get the parts as stored");
    }
  }
  return Status::Ok();
}

Result<LoadedCheckpoint> Load(const Checkpoint& checkpoint, const LoadOptions& given) {
  TL_RETURN_IF_ERROR(CheckSourceOptions(checkpoint, given));
  TL_RETURN_IF_ERROR(CheckParallelOptions(checkpoint, given));
  LoadOptions sliced;
  if (given.parallel.size > 1) {  // The identity of a rank's slices is not computed.
    sliced = given;
    sliced.content_hash = ContentHashMode::kOff;
  }
  const LoadOptions& options = given.parallel.size > 1 ? sliced : given;
  if (!options.shared_memory) return LoadAnyPath(checkpoint, options);
  TL_RETURN_IF_ERROR(CheckSharedMemoryOptions(options));
  // The arenas are shared memory (PlanJob); what else the load makes
  // (conversions, decoded sparse tensors) is moved into it at the end, and
  // everything sealed before a tensor is handed out.
  LoadOptions inner = options;
  inner.on_tensor = nullptr;
  inner.copy = true;
  TL_ASSIGN_OR_RETURN(LoadedCheckpoint loaded, LoadAnyPath(checkpoint, inner));
  TL_ASSIGN_OR_RETURN(loaded, IntoSharedMemory(std::move(loaded), checkpoint.path()));
  if (options.on_tensor) TL_RETURN_IF_ERROR(HandOutAll(loaded, options.on_tensor));
  return loaded;
}

Result<LoadedCheckpoint> Load(const std::string& path, const LoadOptions& options) {
  TL_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::Open(path));
  return Load(ckpt, options);
}

Result<LoadedCheckpoint> LoadWithEngineWrapper(const Checkpoint& checkpoint,
                                               const LoadOptions& options,
                                               const EngineWrapper& wrap) {
  if (options.decode_sparse && MayBeSparse(checkpoint)) {
    LoadOptions inner = options;
    inner.on_tensor = nullptr;
    Result<LoadedCheckpoint> r = LoadSparseOnHost(checkpoint, inner, wrap);
    if (r.ok() && options.on_tensor) TL_RETURN_IF_ERROR(HandOutAll(*r, options.on_tensor));
    return r;
  }
  return LoadOnHost(checkpoint, options, wrap);
}

}  // namespace tensorlift
