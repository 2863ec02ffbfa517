#include <algorithm>
#include <cstdio>
#include <map>
#include <string>

#include "commands.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/sparse.h"
#include "tensorlift/text.h"

namespace tensorlift::cli {

std::string HumanBytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

namespace {

std::string ShapeJson(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

struct Totals {
  uint64_t tensors = 0;
  uint64_t bytes = 0;
};

const char* KindName(Checkpoint::Kind k) {
  switch (k) {
    case Checkpoint::Kind::kFile:
      return "file";
    case Checkpoint::Kind::kIndex:
      return "index";
    case Checkpoint::Kind::kDirectory:
      return "directory";
  }
  return "?";
}

// A double as JSON, exact on reading back.
std::string JsonDouble(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// The sparse groups: each one's dense tensor and the four parts' names.
std::string SparseJson(const Checkpoint& c, const sparse::SparseCatalog& catalog) {
  std::string out = "[";
  for (size_t i = 0; i < catalog.sparse.size(); ++i) {
    const sparse::SparseTensor& st = catalog.sparse[i];
    out += i ? ",{" : "{";
    out += "\"name\":" + JsonString(st.name) + ",\"prefix\":" + JsonString(st.prefix) +
           ",\"dtype\":\"" + std::string(DtypeName(st.dtype)) +
           "\",\"shape\":" + ShapeJson(st.dense_shape) + ",\"nnz\":" + std::to_string(st.nnz) +
           ",\"density\":" + JsonDouble(st.density()) +
           ",\"stored_bytes\":" + std::to_string(st.stored_bytes) +
           ",\"dense_bytes\":" + std::to_string(st.dense_bytes()) +
           ",\"parts\":{\"shape\":" + JsonString(c.info(st.shape_tensor).name) +
           ",\"compressed\":" + JsonString(c.info(st.values).name) +
           ",\"bitmask\":" + JsonString(c.info(st.bitmask).name) +
           ",\"row_offsets\":" + JsonString(c.info(st.row_offsets).name) + "}}";
  }
  return out + "]";
}

void PrintJson(const Checkpoint& c, const std::map<Dtype, Totals>& totals,
               const sparse::SparseCatalog& catalog) {
  std::string out =
      "{\"path\":" + JsonString(c.path()) + ",\"kind\":\"" + KindName(c.kind()) + "\"";
  out += ",\"total_bytes\":" + std::to_string(c.total_bytes());
  out += ",\"shards\":[";
  for (size_t s = 0; s < c.shards().size(); ++s) {
    const auto& sh = c.shards()[s];
    out += (s ? ",{" : "{");
    out += "\"path\":" + JsonString(sh.path) +
           ",\"header_size\":" + std::to_string(sh.header.header_size()) +
           ",\"data_offset\":" + std::to_string(sh.header.data_offset()) +
           ",\"file_size\":" + std::to_string(sh.header.file_size()) + ",\"metadata\":";
    if (sh.header.metadata()) {
      out += "{";
      bool first = true;
      for (const auto& [k, v] : *sh.header.metadata()) {
        out += (first ? "" : ",") + JsonString(k) + ":" + JsonString(v);
        first = false;
      }
      out += "}";
    } else {
      out += "null";
    }
    out += "}";
  }
  out += "],\"tensors\":[";
  bool first = true;
  for (auto loc : c.tensors()) {
    const TensorInfo& t = c.info(loc);
    out += first ? "{" : ",{";
    first = false;
    out += "\"name\":" + JsonString(t.name) + ",\"dtype\":\"" + std::string(DtypeName(t.dtype)) +
           "\",\"shape\":" + ShapeJson(t.shape) + ",\"bytes\":" + std::to_string(t.nbytes()) +
           ",\"offset\":" + std::to_string(t.begin) + ",\"shard\":" + std::to_string(loc.shard) +
           "}";
  }
  out += "],\"dtypes\":{";
  first = true;
  for (const auto& [d, tot] : totals) {
    out += (first ? "\"" : ",\"") + std::string(DtypeName(d)) +
           "\":{\"tensors\":" + std::to_string(tot.tensors) +
           ",\"bytes\":" + std::to_string(tot.bytes) + "}";
    first = false;
  }
  out += "},\"sparse\":" + SparseJson(c, catalog);
  out += ",\"warnings\":[";
  for (size_t i = 0; i < c.warnings().size(); ++i)
    out += (i ? "," : "") + JsonString(c.warnings()[i]);
  out += "]}\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
}

// The dense tensors that sparse groups stand for, after the stored tensors.
void PrintSparseTable(const sparse::SparseCatalog& catalog, size_t name_w) {
  if (catalog.empty()) return;
  std::printf("\nsparse tensors (sparse-bitmask groups, as they decode):\n%-*s  %-11s  %-22s  %s\n",
              static_cast<int>(name_w), "NAME", "DTYPE", "SHAPE", "STORAGE");
  uint64_t stored = 0, dense = 0;
  for (const auto& st : catalog.sparse) {
    std::string name = QuoteName(st.name);
    name = name.substr(1, name.size() - 2);
    std::printf("%-*s  %-11s  %-22s  sparse density=%.4f stored=%llu dense=%llu\n",
                static_cast<int>(name_w), name.c_str(), std::string(DtypeName(st.dtype)).c_str(),
                ShapeString(st.dense_shape).c_str(), st.density(),
                static_cast<unsigned long long>(st.stored_bytes),
                static_cast<unsigned long long>(st.dense_bytes()));
    stored += st.stored_bytes;
    dense += st.dense_bytes();
  }
  std::printf(
      "%zu sparse tensor%s: %llu bytes stored (%s) for %llu dense (%s), %.2f%%\n",
      catalog.sparse.size(), catalog.sparse.size() == 1 ? "" : "s",
      static_cast<unsigned long long>(stored), HumanBytes(stored).c_str(),
      static_cast<unsigned long long>(dense), HumanBytes(dense).c_str(),
      dense == 0 ? 100.0 : 100.0 * static_cast<double>(stored) / static_cast<double>(dense));
}

void PrintTable(const Checkpoint& c, const std::map<Dtype, Totals>& totals,
                const sparse::SparseCatalog& catalog) {
  const bool sharded = c.shards().size() > 1;
  size_t name_w = 4;
  for (auto loc : c.tensors()) name_w = std::max(name_w, QuoteName(c.info(loc).name).size() - 2);
  for (const auto& st : catalog.sparse) name_w = std::max(name_w, QuoteName(st.name).size() - 2);
  name_w = std::min<size_t>(name_w, 80);
  std::printf("%-*s  %-11s  %-22s  %14s  %14s%s\n", static_cast<int>(name_w), "NAME", "DTYPE",
              "SHAPE", "BYTES", "OFFSET", sharded ? "  FILE" : "");
  for (auto loc : c.tensors()) {
    const TensorInfo& t = c.info(loc);
    std::string name = QuoteName(t.name);
    name = name.substr(1, name.size() - 2);
    std::string file;
    if (sharded) {
      file = c.shards()[loc.shard].path;
      file = "  " + file.substr(file.rfind('/') + 1);
    }
    std::printf("%-*s  %-11s  %-22s  %14llu  %14llu%s\n", static_cast<int>(name_w), name.c_str(),
                std::string(DtypeName(t.dtype)).c_str(), ShapeString(t.shape).c_str(),
                static_cast<unsigned long long>(t.nbytes()),
                static_cast<unsigned long long>(t.begin), file.c_str());
  }
  PrintSparseTable(catalog, name_w);
  std::printf("\n%-11s  %8s  %16s\n", "DTYPE", "TENSORS", "BYTES");
  for (const auto& [d, tot] : totals) {
    std::printf("%-11s  %8llu  %16llu  (%s)\n", std::string(DtypeName(d)).c_str(),
                static_cast<unsigned long long>(tot.tensors),
                static_cast<unsigned long long>(tot.bytes), HumanBytes(tot.bytes).c_str());
  }
  std::printf("%-11s  %8zu  %16llu  (%s) in %zu file%s\n", "total", c.tensors().size(),
              static_cast<unsigned long long>(c.total_bytes()), HumanBytes(c.total_bytes()).c_str(),
              c.shards().size(), c.shards().size() == 1 ? "" : "s");
  for (const auto& sh : c.shards()) {
    if (!sh.header.metadata() || sh.header.metadata()->empty()) continue;
    std::printf("\nmetadata of %s:\n", sh.path.c_str());
    for (const auto& [k, v] : *sh.header.metadata()) {
      std::printf("  %s: %s\n", QuoteName(k).c_str(), QuoteName(v).c_str());
    }
  }
  for (const auto& w : c.warnings()) std::fprintf(stderr, "warning: %s\n", w.c_str());
}

}  // namespace

int RunInspect(const std::string& path, bool json, const StoreArgs& store) {
  auto ckpt = OpenCheckpoint(path, store);
  if (!ckpt.ok()) {
    std::fprintf(stderr, "%s\n", ckpt.status().ToString().c_str());
    return kExitInvalid;
  }
  std::map<Dtype, Totals> totals;
  for (auto loc : ckpt->tensors()) {
    auto& t = totals[ckpt->info(loc).dtype];
    ++t.tensors;
    t.bytes += ckpt->info(loc).nbytes();
  }
  auto catalog = sparse::FindSparse(*ckpt);
  if (!catalog.ok()) {
    std::fprintf(stderr, "%s\n", catalog.status().ToString().c_str());
    return kExitInvalid;
  }
  if (json)
    PrintJson(*ckpt, totals, *catalog);
  else
    PrintTable(*ckpt, totals, *catalog);
  return kExitOk;
}

}  // namespace tensorlift::cli
