#include <algorithm>
#include <cstdio>
#include <map>
#include <string>

#include "commands.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/text.h"

namespace tensorlift::cli {
namespace {

std::string Human(uint64_t bytes) {
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
    case Checkpoint::Kind::kFile: return "file";
    case Checkpoint::Kind::kIndex: return "index";
    case Checkpoint::Kind::kDirectory: return "directory";
  }
  return "?";
}

void PrintJson(const Checkpoint& c, const std::map<Dtype, Totals>& totals) {
  std::string out = "{\"path\":" + JsonString(c.path()) + ",\"kind\":\"" + KindName(c.kind()) + "\"";
  out += ",\"total_bytes\":" + std::to_string(c.total_bytes());
  out += ",\"shards\":[";
  for (size_t s = 0; s < c.shards().size(); ++s) {
    const auto& sh = c.shards()[s];
    out += (s ? ",{" : "{");
    out += "\"path\":" + JsonString(sh.path) + ",\"header_size\":" + std::to_string(sh.header.header_size()) +
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
           ",\"offset\":" + std::to_string(t.begin) + ",\"shard\":" + std::to_string(loc.shard) + "}";
  }
  out += "],\"dtypes\":{";
  first = true;
  for (const auto& [d, tot] : totals) {
    out += (first ? "\"" : ",\"") + std::string(DtypeName(d)) + "\":{\"tensors\":" + std::to_string(tot.tensors) +
           ",\"bytes\":" + std::to_string(tot.bytes) + "}";
    first = false;
  }
  out += "},\"warnings\":[";
  for (size_t i = 0; i < c.warnings().size(); ++i) out += (i ? "," : "") + JsonString(c.warnings()[i]);
  out += "]}\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
}

void PrintTable(const Checkpoint& c, const std::map<Dtype, Totals>& totals) {
  const bool sharded = c.shards().size() > 1;
  size_t name_w = 4;
  for (auto loc : c.tensors()) name_w = std::max(name_w, QuoteName(c.info(loc).name).size() - 2);
  name_w = std::min<size_t>(name_w, 80);
  std::printf("%-*s  %-11s  %-22s  %14s  %14s%s\n", static_cast<int>(name_w), "NAME", "DTYPE", "SHAPE",
              "BYTES", "OFFSET", sharded ? "  FILE" : "");
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
                static_cast<unsigned long long>(t.nbytes()), static_cast<unsigned long long>(t.begin),
                file.c_str());
  }
  std::printf("\n%-11s  %8s  %16s\n", "DTYPE", "TENSORS", "BYTES");
  for (const auto& [d, tot] : totals) {
    std::printf("%-11s  %8llu  %16llu  (%s)\n", std::string(DtypeName(d)).c_str(),
                static_cast<unsigned long long>(tot.tensors), static_cast<unsigned long long>(tot.bytes),
                Human(tot.bytes).c_str());
  }
  std::printf("%-11s  %8zu  %16llu  (%s) in %zu file%s\n", "total", c.tensors().size(),
              static_cast<unsigned long long>(c.total_bytes()), Human(c.total_bytes()).c_str(),
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

int RunInspect(const std::string& path, bool json) {
  auto ckpt = Checkpoint::Open(path);
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
  if (json) PrintJson(*ckpt, totals);
  else PrintTable(*ckpt, totals);
  return kExitOk;
}

}  // namespace tensorlift::cli
