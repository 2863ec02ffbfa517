// Puller's first steps (peer_pull.h): a session on each source rank, and
// what the sources serve checked against the key, each other and the
// fallback checkpoint, before any byte moves.
#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "format/tp_layout.h"
#include "remote/control.h"
#include "remote/handover.h"
#include "remote/manifest.h"
#include "remote/peer_pull.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/sparse.h"

namespace tensorlift::remote {
namespace {

// The fallback checkpoint's tensors in name order; nullopt when they cannot be
// read here (not a local checkpoint, or it does not open: its load reports that).
std::optional<std::vector<Expected>> FallbackTensors(const PeerLoadOptions& options) {
  if (options.fallback_path.empty() || options.fallback_loader || options.fallback_open) {
    return std::nullopt;
  }
  auto ckpt = Checkpoint::Open(options.fallback_path);
  if (!ckpt.ok()) return std::nullopt;
  std::vector<Expected> out;
  auto add = [&](const std::string& name, Dtype dtype, const std::vector<uint64_t>& shape) {
    out.push_back({name, dtype, std::vector<int64_t>(shape.begin(), shape.end())});
  };
  if (options.fallback_load.decode_sparse) {
    auto catalog = sparse::FindSparse(*ckpt);
    if (!catalog.ok()) return std::nullopt;
    for (const auto& t : catalog->sparse) add(t.name, t.dtype, t.dense_shape);
    for (const auto& loc : catalog->dense) {
      const TensorInfo& info = ckpt->info(loc);
      add(info.name, info.dtype, info.shape);
    }
  } else {
    for (const auto& loc : ckpt->tensors()) {
      const TensorInfo& info = ckpt->info(loc);
      add(info.name, info.dtype, info.shape);
    }
  }
  std::sort(out.begin(), out.end(),
            [](const Expected& a, const Expected& b) { return a.name < b.name; });
  return out;
}

}  // namespace

Puller::Puller(const PeerKey& key, const PeerLoadOptions& options, std::shared_ptr<Device> device)
    : key_(key),
      options_(options),
      device_(std::move(device)),
      expected_(FallbackTensors(options)) {}

Status Puller::OpenSessions(const std::vector<const Control*>& group,
                            const std::vector<const PeerInfo*>& infos,
                            std::vector<PeerSession>* sources, std::string* failed_url) const {
  const int n = static_cast<int>(group.size());
  for (int r = 0; r < n; ++r) {
    *failed_url = group[r]->url();
    PeerSession& src = (*sources)[r];
    TL_RETURN_IF_ERROR(src.Open(*group[r], *infos[r], key_, options_.min_rate));
    const Manifest& mf = src.manifest;
    if (mf.parallel.size != n || mf.parallel.rank != r) {
      return CorruptionError(group[r]->url() + ": manifest says rank " +
                             std::to_string(mf.parallel.rank) + " of " +
                             std::to_string(mf.parallel.size) + ", its key said rank " +
                             std::to_string(r) + " of " + std::to_string(n));
    }
    if (!key_.content.empty() && n == 1 && mf.content && mf.content->Hex() != key_.content) {
      return InvalidArgumentError(group[r]->url() + ": content differs: expected " + key_.content +
                                  ", the seed's manifest says " + mf.content->Hex());
    }
  }
  return Status::Ok();
}

bool Puller::HandsOverWhole(const std::vector<PeerSession>& sources,
                            const std::vector<Wanted>& wanted) const {
  if (options_.handover != HandoverMode::kAuto || sources.size() != 1) return false;
  const Manifest& m = sources[0].manifest;
  if (!HandoverOffered(m) || m.tensors.size() != wanted.size()) return false;
  for (size_t i = 0; i < wanted.size(); ++i) {
    const ManifestTensor& t = m.tensors[i];
    if (t.name != wanted[i].name || t.shape != wanted[i].shape || t.nbytes != wanted[i].nbytes)
      return false;
  }
  return true;
}

Result<std::vector<Wanted>> Puller::PlanWanted(const std::vector<const Control*>& group,
                                               const std::vector<PeerSession>& sources,
                                               const ParallelLayout& layout,
                                               std::string* failed_url) const {
  const int n = static_cast<int>(group.size());
  std::vector<Wanted> wanted;
  const Manifest& m0 = sources[0].manifest;
  for (const ManifestTensor& t : m0.tensors) {
    TL_ASSIGN_OR_RETURN(Wanted w, WantedFor(t, group, sources, layout, failed_url));
    wanted.push_back(std::move(w));
  }
  for (int r = 1; r < n; ++r) {
    if (sources[r].manifest.tensors.size() != m0.tensors.size()) {
      *failed_url = group[r]->url();
      return CorruptionError(group[r]->url() + ": serves " +
                             std::to_string(sources[r].manifest.tensors.size()) +
                             " tensors, rank 0 serves " + std::to_string(m0.tensors.size()));
    }
  }
  *failed_url = group[0]->url();
  TL_RETURN_IF_ERROR(MatchesFallback(group[0]->url(), wanted));
  return wanted;
}

Status Puller::MatchesFallback(const std::string& url, const std::vector<Wanted>& wanted) const {
  if (!expected_) return Status::Ok();
  const std::vector<Expected>& want = *expected_;
  const bool same_dtypes = !key_.dtype;
  const std::string there = "the fallback checkpoint " + options_.fallback_path;
  if (wanted.size() != want.size()) {
    return CorruptionError(url + ": serves " + std::to_string(wanted.size()) + " tensors, " +
                           std::to_string(want.size()) + " in " + there);
  }
  size_t i = 0;
  for (const Wanted& w : wanted) {  // Both in name order, and as many.
    if (w.name < want[i].name) {
      return CorruptionError(url + ": serves tensor '" + w.name + "', which " + there +
                             " does not have");
    }
    if (want[i].name < w.name) {
      return CorruptionError(url + ": does not serve tensor '" + want[i].name + "' of " + there);
    }
    if (w.full_shape != want[i].shape || (same_dtypes && w.dtype != want[i].dtype)) {
      return CorruptionError(url + ": tensor '" + w.name + "' is " +
                             std::string(DtypeName(w.dtype)) + " " + ShapeText(w.full_shape) +
                             " there, " + std::string(DtypeName(want[i].dtype)) + " " +
                             ShapeText(want[i].shape) + " in " + there);
    }
    ++i;
  }
  return Status::Ok();
}

Result<Wanted> Puller::WantedFor(const ManifestTensor& t, const std::vector<const Control*>& group,
                                 const std::vector<PeerSession>& sources,
                                 const ParallelLayout& layout, std::string* failed_url) const {
  Wanted w;
  w.name = t.name;
  w.dtype = t.dtype;
  w.full_shape = t.full_shape;
  w.dim = t.shard_dim;
  const int rule = layout.DimFor(t.name);
  if (w.dim != rule && !(rule >= static_cast<int>(t.full_shape.size()) && w.dim == -1)) {
    return CorruptionError(group[0]->url() + ": tensor '" + t.name + "' is split along dim " +
                           std::to_string(w.dim) + ", the layout says " + std::to_string(rule));
  }
  TL_RETURN_IF_ERROR(CheckRanksAgree(t, group, sources, failed_url));
  w.shape = w.full_shape;
  if (w.dim >= 0) {
    TL_ASSIGN_OR_RETURN(
        w.range, ShardRange(w.full_shape[w.dim], options_.parallel.rank, options_.parallel.size));
    w.shape[w.dim] = w.range.length;
  }
  // The full tensor's bytes were bounded by the manifest's checks on
  // each shard; the destination's part is no larger than the full tensor.
  w.nbytes = Elements(w.shape) * static_cast<uint64_t>(DtypeBits(w.dtype)) / 8;
  return w;
}

Status Puller::CheckRanksAgree(const ManifestTensor& t, const std::vector<const Control*>& group,
                               const std::vector<PeerSession>& sources, std::string* failed_url) {
  const int n = static_cast<int>(group.size());
  const int dim = t.shard_dim;
  for (int r = 0; r < n; ++r) {
    const ManifestTensor* o = sources[r].manifest.Find(t.name);
    if (!o || o->dtype != t.dtype || o->full_shape != t.full_shape || o->shard_dim != t.shard_dim) {
      *failed_url = group[r]->url();
      return CorruptionError(group[r]->url() + ": tensor '" + t.name +
                             "' differs from rank 0's or is missing");
    }
    if (dim >= 0) {
      TL_ASSIGN_OR_RETURN(IndexRange expect, ShardRange(t.full_shape[dim], r, n));
      if (o->shard_start != expect.start || o->shape[dim] != expect.length) {
        *failed_url = group[r]->url();
        return CorruptionError(group[r]->url() + ": tensor '" + t.name + "': rank " +
                               std::to_string(r) + " holds [" + std::to_string(o->shard_start) +
                               ", +" + std::to_string(o->shape[dim]) + ") of dim " +
                               std::to_string(dim) + ", expected [" + std::to_string(expect.start) +
                               ", +" + std::to_string(expect.length) + ")");
      }
    }
  }
  return Status::Ok();
}

}  // namespace tensorlift::remote
