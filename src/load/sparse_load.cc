// Host loads of sparse-bitmask checkpoints (docs/sparse.md, "Loading"): the
// stored parts are what is read; each group is decoded into its dense tensor
// as soon as the files holding its parts are in, while the other files are
// still being read; then the memory of the parts is given back.
#include "load/sparse_load.h"

#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/work_queue.h"
#include "device/device.h"
#include "device/host_buffer.h"
#include "load/checkpoint_builder.h"
#include "load/device_pipeline.h"
#include "load/file_job.h"
#include "load/host_load.h"
#include "load/owners.h"
#include "tensorlift/bitmask.h"
#include "tensorlift/sparse.h"

namespace tensorlift {
namespace {

// Gives the whole pages inside [p, p + bytes) of an arena back to the system.
void Release(const std::byte* p, uint64_t bytes) {
  const auto begin = (reinterpret_cast<uintptr_t>(p) + kPageAlign - 1) / kPageAlign * kPageAlign;
  const auto end = (reinterpret_cast<uintptr_t>(p) + bytes) / kPageAlign * kPageAlign;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

// What a host load of a sparse checkpoint reads and where it decodes.
struct Selection {
  std::vector<const sparse::SparseTensor*> groups;  // Dense names passing the filter.
  std::vector<uint64_t> dense_offset;               // Of each group in the dense buffer.
  uint64_t dense_total = 0;
  std::vector<std::string> plain;  // Plain tensors passing the filter.
};

// Where a group was decoded.
struct DecodedTensor {
  std::byte* data;
  Dtype dtype;
  uint64_t nbytes;
  DeviceType device;
  int device_index;
};

// The groups and plain tensors the load's filter accepts; only those groups'
// shapes are read.
Result<sparse::SparseCatalog> CatalogFor(const Checkpoint& ckpt, const TensorFilter& filter) {
  return sparse::FindSparse(ckpt, [&](std::string_view name) { return filter.Matches(name); });
}

// The catalog holds only what the load's filter accepts (CatalogFor).
Selection Select(const Checkpoint& ckpt, const sparse::SparseCatalog& catalog) {
  Selection sel;
  for (const auto& g : catalog.sparse) {
    sel.groups.push_back(&g);
    sel.dense_offset.push_back(sel.dense_total);
    sel.dense_total += (g.dense_bytes() + kDenseAlign - 1) / kDenseAlign * kDenseAlign;
  }
  for (auto loc : catalog.dense) sel.plain.push_back(ckpt.info(loc).name);
  return sel;
}

// Validates and decodes one group whose three parts are at `values`,
// `bitmask` and `offsets_bytes` (host memory) into `dense`.
Status DecodeGroup(const Checkpoint& ckpt, const sparse::SparseTensor& g, const std::byte* values,
                   const std::byte* bitmask, const std::byte* offsets_bytes, std::byte* dense) {
  // row_offsets may sit at any offset of a file: copy them when unaligned.
  std::vector<int64_t> aligned;
  const int64_t* offsets = reinterpret_cast<const int64_t*>(offsets_bytes);
  if (reinterpret_cast<uintptr_t>(offsets_bytes) % alignof(int64_t) != 0) {
    aligned.resize(g.shape.rows);
    std::memcpy(aligned.data(), offsets_bytes, g.shape.rows * sizeof(int64_t));
    offsets = aligned.data();
  }
  Status st = sparse::Decode(values, g.nnz, reinterpret_cast<const uint8_t*>(bitmask), offsets,
                             g.shape, dense, /*threads=*/1);
  if (st.ok()) return st;
  return st.WithContext("sparse tensor '" + g.name + "' (group '" + g.prefix + "')")
      .WithContext(ckpt.shards()[g.values.shard].path);
}

// The host-decoded tensors of a selection, in `dense`.
std::vector<DecodedTensor> HostDecoded(const Selection& sel,
                                       const std::shared_ptr<HostBuffer>& dense) {
  std::vector<DecodedTensor> out;
  for (size_t i = 0; i < sel.groups.size(); ++i) {
    out.push_back({dense->data() + sel.dense_offset[i], sel.groups[i]->dtype,
                   sel.groups[i]->dense_bytes(), DeviceType::kCpu, 0});
  }
  return out;
}

// Two decoders: on the 2-CPU machines measured, more take the CPUs that the
// reads and the fault threads need (docs/sparse.md, "Loading").
int DecodeThreads() {
  return std::clamp<int>(static_cast<int>(std::thread::hardware_concurrency()), 1, 2);
}

Result<CheckpointBuilder> RunSparseMapped(const Checkpoint& ckpt, const LoadOptions& options,
                                          const EngineWrapper& wrap, const Selection& sel,
                                          const std::shared_ptr<HostBuffer>& dense);
Result<CheckpointBuilder> RunSparseStaged(const Checkpoint& ckpt, const LoadOptions& options,
                                          const EngineWrapper& wrap, const Selection& sel,
                                          const std::shared_ptr<HostBuffer>& dense);
// The loaded plain tensors of `in` with the decoded groups (owned by
// `owner`); the parts' host arenas are given back.
CheckpointBuilder Assemble(const Checkpoint& ckpt, CheckpointBuilder in,
                           const std::vector<const sparse::SparseTensor*>& groups,
                           const std::vector<DecodedTensor>& decoded,
                           const std::shared_ptr<Buffer>& owner);

}  // namespace

Result<LoadedCheckpoint> LoadSparseOnHost(const Checkpoint& ckpt, const LoadOptions& options,
                                          const EngineWrapper& wrap) {
  const auto t0 = std::chrono::steady_clock::now();
  TL_ASSIGN_OR_RETURN(const sparse::SparseCatalog catalog, CatalogFor(ckpt, options.filter));
  const Selection sel = Select(ckpt, catalog);
  if (sel.groups.empty()) {  // The plain tensors only (a filter may still match parts' names).
    LoadOptions plain = options;
    plain.filter = TensorFilter::Names(sel.plain);
    return LoadOnHost(ckpt, plain, wrap);
  }
  std::shared_ptr<HostBuffer> dense;
  if (sel.dense_total > 0) {
    TL_ASSIGN_OR_RETURN(dense, HostBuffer::Allocate(sel.dense_total));
  }
  TL_ASSIGN_OR_RETURN(CheckpointBuilder loaded,
                      options.mode == IoMode::kMmap
                          ? RunSparseMapped(ckpt, options, wrap, sel, dense)
                          : RunSparseStaged(ckpt, options, wrap, sel, dense));
  return std::move(loaded).Finish(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

namespace {

// mmap: the parts are read through the files' mappings (the page cache); each
// group is decoded from there once its files are mapped.
Result<CheckpointBuilder> RunSparseMapped(const Checkpoint& ckpt, const LoadOptions& options,
                                          const EngineWrapper& wrap, const Selection& sel,
                                          const std::shared_ptr<HostBuffer>& dense) {
  const auto& groups = sel.groups;
  std::vector<std::string> stored = sel.plain;
  // Per stored part (by shard and index): its group and which part it is.
  struct PartOf {
    size_t group;
    int part;  // 0 values, 1 bitmask, 2 row_offsets.
  };
  std::unordered_map<uint64_t, PartOf> part_of;
  auto key = [](Checkpoint::Location loc) { return (uint64_t{loc.shard} << 32) | loc.index; };
  std::vector<std::vector<size_t>> groups_of_shard(ckpt.shards().size());
  std::vector<std::atomic<int>> files_left(groups.size());
  for (size_t i = 0; i < groups.size(); ++i) {
    const auto& g = *groups[i];
    const Checkpoint::Location parts[3] = {g.values, g.bitmask, g.row_offsets};
    std::vector<uint32_t> shards;
    for (int p = 0; p < 3; ++p) {
      stored.push_back(ckpt.info(parts[p]).name);
      part_of[key(parts[p])] = {i, p};
      shards.push_back(parts[p].shard);
    }
    std::sort(shards.begin(), shards.end());
    shards.erase(std::unique(shards.begin(), shards.end()), shards.end());
    files_left[i] = static_cast<int>(shards.size());
    for (uint32_t s : shards) groups_of_shard[s].push_back(i);
  }
  // Where each group's parts are (set before any read, read by the decoders).
  std::vector<std::array<const std::byte*, 3>> where(groups.size());
  // Groups decoded on a few threads as their files complete; every group
  // pushed is decoded, even after an error (Finish drops the rest on failure).
  WorkQueue<size_t> queue(
      [&](size_t& i) {
        return DecodeGroup(ckpt, *groups[i], where[i][0], where[i][1], where[i][2],
                           dense->data() + sel.dense_offset[i]);
      },
      {.threads = DecodeThreads(), .drop_on_destroy = true});
  HostLoadHooks hooks;
  if (dense) hooks.populate.push_back(dense);
  hooks.placed = [&](Checkpoint::Location loc, const std::byte* data) {
    if (auto it = part_of.find(key(loc)); it != part_of.end())
      where[it->second.group][it->second.part] = data;
  };
  hooks.file_done = [&](uint32_t shard) {
    for (size_t i : groups_of_shard[shard]) {
      if (files_left[i].fetch_sub(1, std::memory_order_acq_rel) == 1) queue.Push(i);
    }
  };
  LoadOptions stored_options = options;
  stored_options.filter = TensorFilter::Names(std::move(stored));
  Result<LoadedCheckpoint> raw = LoadOnHost(ckpt, stored_options, wrap, &hooks);
  Status decoded = queue.Finish(/*drop=*/!raw.ok());
  if (!raw.ok()) return raw.status();
  TL_RETURN_IF_ERROR(decoded);
  return Assemble(ckpt, CheckpointBuilder(std::move(raw).value()), sel.groups,
                  HostDecoded(sel, dense), dense);
}

// A group's reads: its parts' byte ranges, merged where close, covering whole
// 4 KiB pages (O_DIRECT), laid out one after another in a slot.
struct GroupReads {
  struct Span {
    uint32_t shard;
    uint64_t begin, end;  // File offsets, page-aligned (end may be the file's end).
    uint64_t slot_offset;
  };
  std::vector<Span> spans;
  uint64_t bytes = 0;                   // Of the slot used.
  std::array<uint64_t, 3> part_offset;  // Of values, bitmask, row_offsets in the slot.
};

// Every group's reads; *slot_bytes: the largest slot one needs.
std::vector<GroupReads> PlanGroupReads(const Checkpoint& ckpt,
                                       const std::vector<const sparse::SparseTensor*>& groups,
                                       uint64_t* slot_bytes) {
  constexpr uint64_t kMergeGap = 64 << 10;
  std::vector<GroupReads> plans(groups.size());
  for (size_t i = 0; i < groups.size(); ++i) {
    const auto& g = *groups[i];
    struct Part {
      uint32_t shard;
      uint64_t begin, end;
      int index;
    };
    std::vector<Part> parts;
    const Checkpoint::Location locs[3] = {g.values, g.bitmask, g.row_offsets};
    for (int p = 0; p < 3; ++p) {
      const auto& shard = ckpt.shards()[locs[p].shard];
      const TensorInfo& info = ckpt.info(locs[p]);
      const uint64_t begin = shard.header.data_offset() + info.begin;
      parts.push_back({locs[p].shard, begin, begin + info.nbytes(), p});
    }
    std::sort(parts.begin(), parts.end(), [](const Part& a, const Part& b) {
      return a.shard != b.shard ? a.shard < b.shard : a.begin < b.begin;
    });
    GroupReads& plan = plans[i];
    for (const Part& p : parts) {
      const uint64_t file_size = ckpt.shards()[p.shard].identity.size;
      const uint64_t lo = p.begin / kPageAlign * kPageAlign;
      const uint64_t hi = std::min(file_size, (p.end + kPageAlign - 1) / kPageAlign * kPageAlign);
      if (!plan.spans.empty() && plan.spans.back().shard == p.shard &&
          lo <= plan.spans.back().end + kMergeGap) {
        GroupReads::Span& last = plan.spans.back();
        plan.bytes += std::max(hi, last.end) - last.end;
        last.end = std::max(hi, last.end);
      } else {
        plan.bytes = (plan.bytes + kPageAlign - 1) / kPageAlign * kPageAlign;
        plan.spans.push_back({p.shard, lo, hi, plan.bytes});
        plan.bytes += hi - lo;
      }
      const GroupReads::Span& span = plan.spans.back();
      plan.part_offset[p.index] = span.slot_offset + (p.begin - span.begin);
    }
    *slot_bytes = std::max(*slot_bytes, plan.bytes);
  }
  return plans;
}

// The parts' files join the plain load's reports.
void JoinPartReports(std::vector<OpenedFile>& files, const IoEngine engine_kind[2],
                     CheckpointBuilder& plain) {
  for (auto& f : files) {
    if (f.wanted.empty()) continue;
    uint64_t bytes = 0;
    for (uint32_t index : f.wanted) bytes += f.shard->header.tensors()[index].nbytes();
    FileReport* report = nullptr;
    for (auto& r : plain.files()) {
      if (r.path == f.report.path) report = &r;
    }
    if (report == nullptr) {
      f.report.engine = engine_kind[f.report.mode == IoMode::kDirect];
      plain.files().push_back(std::move(f.report));
      report = &plain.files().back();
    }
    report->bytes += bytes;
    report->tensors += static_cast<uint32_t>(f.wanted.size());
  }
}

// Buffered and direct: the parts of one group at a time are read into one of
// a few reused staging slots (so the only fresh memory is the dense tensors',
// as in a dense load), and decoded from there by other threads while the next
// group is read.
Result<CheckpointBuilder> RunSparseStaged(const Checkpoint& ckpt, const LoadOptions& options,
                                          const EngineWrapper& wrap, const Selection& sel,
                                          const std::shared_ptr<HostBuffer>& dense) {
  const auto& groups = sel.groups;
  // The plain tensors first, as a dense load of them (its progress counts
  // toward the whole).
  uint64_t sparse_total = 0;
  for (const auto* g : groups) {
    for (auto loc : {g->values, g->bitmask, g->row_offsets})
      sparse_total += ckpt.info(loc).nbytes();
  }
  LoadOptions plain_options = options;
  plain_options.filter = TensorFilter::Names(sel.plain);
  uint64_t plain_total = 0;
  if (options.progress) {
    plain_options.progress = [&](const Progress& p) {
      plain_total = p.bytes_total;
      Progress whole = p;
      whole.bytes_total += sparse_total;
      options.progress(whole);
    };
  }
  TL_ASSIGN_OR_RETURN(LoadedCheckpoint plain_loaded, LoadOnHost(ckpt, plain_options, wrap));
  CheckpointBuilder plain(std::move(plain_loaded));

  // The files holding parts, opened once (the mode per file, as for any load).
  std::vector<OpenedFile> files(ckpt.shards().size());
  for (const auto* g : groups) {
    for (auto loc : {g->values, g->bitmask, g->row_offsets})
      files[loc.shard].wanted.push_back(loc.index);
  }
  for (size_t s = 0; s < files.size(); ++s) {
    auto& f = files[s];
    if (f.wanted.empty()) continue;
    std::sort(f.wanted.begin(), f.wanted.end());
    f.shard = &ckpt.shards()[s];
    f.store = ckpt.store().get();
    f.report.path = f.shard->path;
    Status st = OpenForLoad(f, options.mode);
    if (!st.ok()) return st.WithContext(f.shard->path);
  }

  uint64_t slot_bytes = 0;
  const std::vector<GroupReads> plans = PlanGroupReads(ckpt, groups, &slot_bytes);
  // Groups in file order, so that the disk reads forward.
  std::vector<size_t> order(groups.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const auto& pa = plans[a].spans.front();
    const auto& pb = plans[b].spans.front();
    return pa.shard != pb.shard ? pa.shard < pb.shard : pa.begin < pb.begin;
  });

  // Workers, each with its own slot, take the groups in order: read one
  // (the engine's reads in parallel), decode it, take the next. While one
  // decodes, another reads, so the disk stays busy and the CPUs decode. One
  // more worker than decoding CPUs (measured: docs/sparse.md, "Loading").
  const int workers = DecodeThreads() + 1;
  std::vector<std::shared_ptr<HostBuffer>> slots;
  for (int k = 0; k < workers && slot_bytes > 0; ++k) {
    TL_ASSIGN_OR_RETURN(auto slot, HostBuffer::Allocate(slot_bytes));
    slots.push_back(std::move(slot));
  }
  std::mutex mu;  // Guards st, done, reporter and engine_kind.
  Status st = Status::Ok();
  ProgressReporter reporter(options.progress, plain_total + sparse_total);
  uint64_t done = plain_total;
  IoEngine engine_kind[2] = {IoEngine::kThreads, IoEngine::kThreads};
  const uint64_t op_bytes =
      std::max<uint64_t>(kPageAlign, options.block_size / 4 / kPageAlign * kPageAlign);
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  auto work = [&](std::byte* slot) {
    for (;;) {
      const size_t n = next.fetch_add(1, std::memory_order_relaxed);
      if (n >= order.size() || failed.load(std::memory_order_relaxed)) return;
      const size_t i = order[n];
      std::vector<ReadOp> ops[2];
      uint64_t bytes = 0;
      for (const GroupReads::Span& span : plans[i].spans) {
        const OpenedFile& f = files[span.shard];
        const bool direct = f.report.mode == IoMode::kDirect;
        for (uint64_t off = span.begin; off < span.end; off += op_bytes) {
          const uint64_t len = std::min(op_bytes, span.end - off);
          // Only a file's last page can be partial: that op bounces.
          const bool bounce = direct && len % kPageAlign != 0;
          ops[direct].push_back(
              {span.shard, off, len, slot + span.slot_offset + (off - span.begin), bounce});
          bytes += len;
        }
      }
      Status local = Status::Ok();
      ReadProgress progress;
      for (int direct : {1, 0}) {
        if (ops[direct].empty() || !local.ok()) continue;
        IoEngine kind;
        auto engine = MakeEngine(options, direct == 1, ops[direct], &kind, ckpt,
                                 EngineFiles(files, direct == 1));
        if (!engine.ok()) {
          local = engine.status();
          break;
        }
        std::unique_ptr<ReadEngine> e = std::move(engine).value();
        if (wrap) e = wrap(std::move(e));
        local = e->Run(ops[direct], &progress);
        std::lock_guard<std::mutex> lock(mu);
        engine_kind[direct] = kind;
      }
      if (local.ok()) {
        local = DecodeGroup(ckpt, *groups[i], slot + plans[i].part_offset[0],
                            slot + plans[i].part_offset[1], slot + plans[i].part_offset[2],
                            dense->data() + sel.dense_offset[i]);
      }
      std::lock_guard<std::mutex> lock(mu);
      if (!local.ok()) {
        if (st.ok()) st = local;
        failed = true;
        return;
      }
      done += bytes;
      reporter.Report(done, false);
    }
  };
  {
    // Nothing is faulted in ahead: the decoders fault the dense tensors in
    // as they write them. Fault threads beside them (on the dense tensors or
    // the slots), or MADV_POPULATE_WRITE of each group before its read, made
    // loads 1.5-4x slower on the 2-CPU machine measured (docs/sparse.md,
    // "Loading").
    std::vector<std::thread> threads;
    for (size_t k = 1; k < slots.size(); ++k) threads.emplace_back(work, slots[k]->data());
    if (!slots.empty()) work(slots[0]->data());
    for (auto& t : threads) t.join();
  }
  TL_RETURN_IF_ERROR(st);
  for (auto& f : files) {
    if (f.wanted.empty()) continue;
    Status unchanged = CheckUnchanged(f);
    if (!unchanged.ok()) return unchanged.WithContext(f.shard->path);
  }
  reporter.Report(done, true);

  JoinPartReports(files, engine_kind, plain);
  return Assemble(ckpt, std::move(plain), sel.groups, HostDecoded(sel, dense), dense);
}

// The loaded plain tensors with the decoded ones, in name order; the parts'
// memory, where it is a host arena of the load, goes back to the system.
CheckpointBuilder Assemble(const Checkpoint& ckpt, CheckpointBuilder in,
                           const std::vector<const sparse::SparseTensor*>& groups,
                           const std::vector<DecodedTensor>& decoded,
                           const std::shared_ptr<Buffer>& owner) {
  std::unordered_map<std::string_view, bool> part;
  for (const auto* g : groups) {
    for (auto loc : {g->values, g->bitmask, g->row_offsets, g->shape_tensor})
      part[ckpt.info(loc).name] = true;
  }
  in.RemoveIf([&](const LoadedTensor& lt, const std::shared_ptr<Buffer>& held) {
    if (!part.count(lt.name)) return false;
    if (dynamic_cast<HostBuffer*>(held.get()) != nullptr)
      Release(static_cast<const std::byte*>(lt.data), lt.nbytes);
    return true;
  });
  std::vector<uint32_t> decoded_in_file(ckpt.shards().size(), 0);
  for (size_t i = 0; i < groups.size(); ++i) {
    const auto& g = *groups[i];
    TensorInfo info;
    info.name = g.name;
    info.dtype = decoded[i].dtype;
    info.shape = g.dense_shape;
    info.num_elements = g.shape.rows * g.shape.cols;
    LoadedTensor lt = MakeTensor(info, decoded[i].dtype, decoded[i].data, decoded[i].nbytes);
    lt.device = decoded[i].device;
    lt.device_index = decoded[i].device_index;
    in.Add(std::move(lt), owner);
    ++decoded_in_file[g.values.shard];
  }
  for (auto& report : in.files()) {
    for (size_t s = 0; s < ckpt.shards().size(); ++s) {
      if (ckpt.shards()[s].path == report.path) report.decoded = decoded_in_file[s];
    }
  }
  return in;  // Finish puts the tensors in name order.
}

}  // namespace

bool MayBeSparse(const Checkpoint& ckpt) {
  for (auto loc : ckpt.tensors()) {
    if (ckpt.info(loc).name.ends_with(sparse::kBitmaskSuffix)) return true;
  }
  return false;
}

Result<LoadedCheckpoint> LoadSparseThroughDevice(const Checkpoint& ckpt, const LoadOptions& options,
                                                 const std::shared_ptr<Device>& device) {
  const auto t0 = std::chrono::steady_clock::now();
  TL_ASSIGN_OR_RETURN(const sparse::SparseCatalog catalog, CatalogFor(ckpt, options.filter));
  const Selection sel = Select(ckpt, catalog);
  if (sel.groups.empty()) {  // The plain tensors only (a filter may still match parts' names).
    LoadOptions plain = options;
    plain.filter = TensorFilter::Names(sel.plain);
    return LoadThroughDevice(ckpt, plain, device, nullptr);
  }
  const auto& groups = sel.groups;
  std::vector<std::string> stored = sel.plain;
  for (const auto* g : groups) {
    for (auto loc : {g->values, g->bitmask, g->row_offsets}) stored.push_back(ckpt.info(loc).name);
  }
  // The parts go through the pipeline like any tensor (the values converted
  // to options.dtype with the plain tensors: conversion is per element, so it
  // commutes with expanding them), then each group is decoded on the device.
  LoadOptions stored_options = options;
  stored_options.filter = TensorFilter::Names(std::move(stored));
  TL_ASSIGN_OR_RETURN(LoadedCheckpoint in,
                      LoadThroughDevice(ckpt, stored_options, device, nullptr));

  std::vector<uint64_t> offset(groups.size());
  std::vector<Dtype> dtype(groups.size());
  std::vector<sparse::BitmaskShape> shape(groups.size());
  uint64_t total = 0;
  for (size_t i = 0; i < groups.size(); ++i) {
    const LoadedTensor* values = in.Find(ckpt.info(groups[i]->values).name);
    if (values == nullptr)
      return InternalError("sparse: the values of '" + groups[i]->name + "' were not loaded");
    dtype[i] = values->dtype;
    shape[i] = groups[i]->shape;
    shape[i].elem_bytes = static_cast<uint32_t>(DtypeBits(values->dtype) / 8);
    offset[i] = total;
    total += (shape[i].dense_bytes() + kDenseAlign - 1) / kDenseAlign * kDenseAlign;
  }
  std::shared_ptr<Buffer> dense;
  if (total > 0) {
    TL_ASSIGN_OR_RETURN(dense, device->Allocate(total));
  }
  TL_ASSIGN_OR_RETURN(auto stream, device->CreateStream());
  Status st = Status::Ok();
  for (size_t i = 0; i < groups.size() && st.ok(); ++i) {
    const auto& g = *groups[i];
    const LoadedTensor* values = in.Find(ckpt.info(g.values).name);
    const LoadedTensor* bitmask = in.Find(ckpt.info(g.bitmask).name);
    const LoadedTensor* offsets = in.Find(ckpt.info(g.row_offsets).name);
    // The device trusts what it decodes: check the encoding on the host first.
    std::vector<uint8_t> mask(bitmask->nbytes);
    std::vector<int64_t> rows(g.shape.rows);
    st = in.CopyToHost(bitmask->name, mask.data());
    if (st.ok()) st = in.CopyToHost(offsets->name, rows.data());
    if (st.ok()) st = sparse::Validate(mask.data(), rows.data(), shape[i], g.nnz);
    if (st.ok() && shape[i].dense_bytes() > 0) {
      st = stream->DecodeBitmask(
          dense->data() + offset[i], static_cast<const std::byte*>(values->data), g.nnz,
          static_cast<const uint8_t*>(bitmask->data), static_cast<const int64_t*>(offsets->data),
          g.shape.rows, g.shape.cols, shape[i].elem_bytes);
    }
    if (!st.ok()) {
      st = st.WithContext("sparse tensor '" + g.name + "' (group '" + g.prefix + "')")
               .WithContext(ckpt.shards()[g.values.shard].path);
    }
  }
  const Status synced = stream->Synchronize();
  TL_RETURN_IF_ERROR(st);
  TL_RETURN_IF_ERROR(synced);

  std::vector<DecodedTensor> decoded;
  for (size_t i = 0; i < groups.size(); ++i) {
    const LoadedTensor* values = in.Find(ckpt.info(groups[i]->values).name);
    decoded.push_back({dense ? dense->data() + offset[i] : nullptr, dtype[i],
                       shape[i].dense_bytes(), values->device, values->device_index});
  }
  CheckpointBuilder out = Assemble(ckpt, CheckpointBuilder(std::move(in)), groups, decoded, dense);
  out.device_plan().device_bytes += total;
  return std::move(out).Finish(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

}  // namespace tensorlift
