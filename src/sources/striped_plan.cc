// A striped load's plan (see striped_plan.h).
#include "sources/striped_plan.h"

#include <algorithm>
#include <map>

#include "tensorlift/checksum.h"

namespace tensorlift::sources {
namespace {

std::string Basename(const std::string& p) {
  const size_t slash = p.find_last_of('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

}  // namespace

Result<std::vector<uint32_t>> MatchShards(const Checkpoint& ref, const Checkpoint& other) {
  std::map<std::string, uint32_t> by_name;
  for (uint32_t s = 0; s < other.shards().size(); ++s)
    by_name[Basename(other.shards()[s].path)] = s;
  std::vector<uint32_t> out;
  for (const Checkpoint::Shard& shard : ref.shards()) {
    const std::string name = Basename(shard.path);
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      return InvalidArgumentError(other.path() + ": has no " + name + " (" + ref.path() + " has)");
    }
    const Header& a = shard.header;
    const Header& b = other.shards()[it->second].header;
    bool same = a.data_offset() == b.data_offset() && a.tensors().size() == b.tensors().size();
    for (size_t i = 0; same && i < a.tensors().size(); ++i) {
      const TensorInfo &x = a.tensors()[i], &y = b.tensors()[i];
      same = x.name == y.name && x.dtype == y.dtype && x.shape == y.shape && x.begin == y.begin &&
             x.end == y.end;
    }
    if (!same) {
      return InvalidArgumentError(other.path() + ": the header of " + name + " differs from " +
                                  shard.path + "'s");
    }
    out.push_back(it->second);
  }
  return out;
}

Result<Plan> PlanTensors(const Checkpoint& ckpt, const TensorFilter& filter) {
  Plan plan;
  for (auto loc : ckpt.tensors()) {
    if (filter.Matches(ckpt.info(loc).name)) plan.tensors.push_back({loc});
  }
  std::sort(plan.tensors.begin(), plan.tensors.end(), [&](const Planned& a, const Planned& b) {
    if (a.loc.shard != b.loc.shard) return a.loc.shard < b.loc.shard;
    return ckpt.info(a.loc).begin < ckpt.info(b.loc).begin;
  });
  uint64_t total = 0;
  std::vector<uint64_t> at(plan.tensors.size());
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    Planned& t = plan.tensors[i];
    const TensorInfo& info = ckpt.info(t.loc);
    t.file_offset = ckpt.shards()[t.loc.shard].header.data_offset() + info.begin;
    t.nbytes = info.nbytes();
    const bool joins =
        i > 0 && plan.tensors[i - 1].loc.shard == t.loc.shard &&
        plan.tensors[i - 1].file_offset + plan.tensors[i - 1].nbytes == t.file_offset;
    // A run starts at the address congruent to its file offset modulo 4 KiB
    // (the buffer is page-aligned): the disk source reads its whole blocks
    // with O_DIRECT straight into place.
    if (!joins) total = RoundUp(total, 4096) + t.file_offset % 4096;
    at[i] = total;
    total += t.nbytes;
  }
  plan.bytes = 0;
  for (const Planned& t : plan.tensors) plan.bytes += t.nbytes;
  TL_ASSIGN_OR_RETURN(plan.buffer, HostBuffer::Allocate(total));
  for (size_t i = 0; i < plan.tensors.size(); ++i)
    plan.tensors[i].data = plan.buffer->data() + at[i];
  return plan;
}

void CutRanges(Plan& plan, uint64_t chunk_bytes, uint64_t range_bytes, bool checked) {
  for (uint32_t i = 0; i < plan.tensors.size(); ++i) {
    const Planned& t = plan.tensors[i];
    for (uint64_t off = 0, c = 0; off < t.nbytes; off += chunk_bytes, ++c) {
      plan.units.push_back(
          {i, off, std::min(chunk_bytes, t.nbytes - off), checked ? static_cast<int64_t>(c) : -1});
    }
  }
  for (size_t u = 0; u < plan.units.size(); ++u) {
    const Unit& unit = plan.units[u];
    const Planned& t = plan.tensors[unit.tensor];
    const uint64_t file = t.file_offset + unit.offset;
    std::byte* dst = t.data + unit.offset;
    Range* last = plan.ranges.empty() ? nullptr : &plan.ranges.back();
    if (last && last->shard == t.loc.shard && last->file_offset + last->bytes == file &&
        last->dst + last->bytes == dst && last->bytes + unit.bytes <= range_bytes) {
      last->bytes += unit.bytes;
      last->end_unit = u + 1;
    } else {
      plan.ranges.push_back({t.loc.shard, file, unit.bytes, dst, u, u + 1});
    }
  }
}

Status CheckRange(const Range& r, const Plan& plan, const std::string& source) {
  const std::byte* at = r.dst;
  for (size_t u = r.first_unit; u < r.end_unit; ++u) {
    const Unit& unit = plan.units[u];
    if (unit.chunk >= 0) {
      const remote::ManifestTensor& m = *plan.tensors[unit.tensor].checked_by;
      const uint64_t sum = Xxh3_64(at, unit.bytes);
      if (sum != m.chunk_xxh3[unit.chunk]) {
        return CorruptionError(source + ": tensor '" + m.name + "' bytes " +
                               std::to_string(unit.offset) + ".." +
                               std::to_string(unit.offset + unit.bytes) + ": XXH3 " + HexU64(sum) +
                               ", the peer manifest says " + HexU64(m.chunk_xxh3[unit.chunk]));
      }
    }
    at += unit.bytes;
  }
  return Status::Ok();
}

}  // namespace tensorlift::sources
