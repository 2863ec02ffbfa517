#include "tensorlift/sparsify.h"

#include <fcntl.h>
#include <simdjson.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <regex>
#include <system_error>
#include <thread>
#include <utility>

#include "common/posix_file.h"
#include "io/faults.h"
#include "io/pread.h"
#include "kernels/convert.h"
#include "sparse/shard_files.h"
#include "tensorlift/bitmask.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/safetensors.h"
#include "tensorlift/sparse.h"
#include "tensorlift/text.h"

namespace tensorlift::sparse {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kCopyChunk = 16ull << 20;
constexpr std::string_view kIndexName = "model.safetensors.index.json";

bool FloatingDtype(Dtype d) {
  switch (d) {
    case Dtype::kF16:
    case Dtype::kBF16:
    case Dtype::kF32:
    case Dtype::kF64:
    case Dtype::kF8_E4M3:
    case Dtype::kF8_E5M2:
      return true;
    default:
      return false;
  }
}

// A key whose unsigned order is the order of |x|: the value's bits without
// the sign (IEEE magnitudes order as their bit patterns), widened to f32
// first for the narrow types. NaNs come out above infinity.
uint64_t MagnitudeKey(const std::byte* row, Dtype d, uint64_t i) {
  if (d == Dtype::kF64) {
    uint64_t u;
    std::memcpy(&u, row + 8 * i, 8);
    return u & 0x7FFF'FFFF'FFFF'FFFFull;
  }
  return convert::LoadAsF32Bits(row, d, i) & 0x7FFF'FFFFu;
}

Status PwriteFully(int fd, const void* data, size_t n, uint64_t offset) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = io::Pwrite(fd, p, std::min<size_t>(n, size_t{1} << 30), static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return PosixError("write", errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return Status::Ok();
}

// The files this run makes. Each is written as ".NAME.partial" and renamed to
// NAME by Commit(), once every file is whole, so that no checkpoint file is
// ever half-written, even if the process dies; without Commit() they are
// removed again.
class OutputDir {
 public:
  ~OutputDir() {
    if (committed_) return;
    for (auto it = created_.rbegin(); it != created_.rend(); ++it) {
      ::unlink(it->first.c_str());
      ::unlink(it->second.c_str());  // Renamed already, when a later rename failed.
    }
    if (made_dir_) ::rmdir(path_.c_str());
  }

  Status Prepare(const std::string& path) {
    path_ = path;
    struct stat st;
    if (::stat(path.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode))
        return InvalidArgumentError(path + ": exists and is not a directory");
      std::error_code ec;
      if (!fs::is_empty(path, ec) || ec) {
        return InvalidArgumentError(path + ": the output directory must be new or empty");
      }
      return Status::Ok();
    }
    if (::mkdir(path.c_str(), 0777) != 0) {
      return PosixError("cannot create the output directory", errno).WithContext(path);
    }
    made_dir_ = true;
    return Status::Ok();
  }

  std::string Path(std::string_view name) const { return path_ + "/" + std::string(name); }

  // Creates `name`'s partial file (neither may exist) and records it.
  Result<int> Create(std::string_view name) {
    const std::string path = Path(name);
    const std::string partial = Path("." + std::string(name) + ".partial");
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0)
      return PosixError("cannot create", EEXIST).WithContext(path);
    int fd = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) return PosixError("cannot create", errno).WithContext(partial);
    created_.emplace_back(partial, path);
    return fd;
  }

  Status WriteFile(std::string_view name, std::string_view content) {
    TL_ASSIGN_OR_RETURN(int fd, Create(name));
    Status st = PwriteFully(fd, content.data(), content.size(), 0);
    if (::close(fd) != 0 && st.ok()) st = PosixError("close", errno);
    return st.ok() ? st : st.WithContext(Path(name));
  }

  // Renames every partial file to its name (the index and configuration,
  // written last, last).
  Status Commit() {
    for (const auto& [partial, path] : created_) {
      if (::rename(partial.c_str(), path.c_str()) != 0) {
        return PosixError("cannot rename " + partial + " to", errno).WithContext(path);
      }
    }
    committed_ = true;
    return Status::Ok();
  }

 private:
  std::string path_;
  bool made_dir_ = false;
  bool committed_ = false;
  std::vector<std::pair<std::string, std::string>> created_;  // (partial, name).
};

struct OutTensor {
  OutTensor(std::string n, Dtype d, std::vector<uint64_t> s, uint64_t b)
      : name(std::move(n)), dtype(d), shape(std::move(s)), bytes(b) {}
  std::string name;
  Dtype dtype;
  std::vector<uint64_t> shape;
  uint64_t bytes;
  uint64_t offset = 0;  // In the shard's data section, set by ShardHeader.
};

// One input tensor and what it becomes: one output tensor (dense) or four
// (shape, compressed, bitmask, row_offsets), consecutive in its shard.
struct Unit {
  Checkpoint::Location loc{};
  bool encode = false;
  BitmaskShape shape;
  uint64_t nnz = 0;
  size_t first_out = 0;  // Index of its first tensor in Shard::tensors.
};

struct Shard {
  std::vector<OutTensor> tensors;
  std::vector<size_t> units;
  uint64_t bytes = 0;
  std::string file;
};

// The library writer's header for these tensors (SerializeHeader from their
// sizes); sets each tensor's offset in the data section, where the data is
// written later, one tensor at a time. The sparsify test checks the files
// byte for byte against Serialize.
Result<std::string> ShardHeader(std::vector<OutTensor>* tensors,
                                const std::optional<Metadata>& metadata) {
  std::vector<TensorSpec> specs;
  specs.reserve(tensors->size());
  for (const OutTensor& t : *tensors) specs.push_back({t.name, t.dtype, t.shape, t.bytes});
  std::vector<size_t> order;
  TL_ASSIGN_OR_RETURN(std::string header,
                      SerializeHeader(std::span<const TensorSpec>(specs), metadata, &order));
  uint64_t offset = 0;
  for (size_t i : order) {
    (*tensors)[i].offset = offset;
    offset += (*tensors)[i].bytes;
  }
  return header;
}

// Reads target `u` whole into `dense` and prunes it if asked.
Status ReadTarget(const Checkpoint& ckpt, const Unit& u, const SparsifyOptions& opts,
                  ShardFiles* in, std::vector<std::byte>* dense) {
  const TensorInfo& info = ckpt.info(u.loc);
  dense->resize(info.nbytes());
  TL_RETURN_IF_ERROR(in->Read(u.loc, 0, dense->data(), dense->size()));
  if (opts.prune) {
    TL_RETURN_IF_ERROR(
        PruneByMagnitude(dense->data(), info.dtype, u.shape.rows, u.shape.cols, *opts.prune));
  }
  return Status::Ok();
}

// Writes one shard: its header, then each unit's tensors at their offsets.
Status WriteShard(const Checkpoint& ckpt, const SparsifyOptions& opts, const Shard& shard,
                  const std::string& header, const std::vector<Unit>& units, ShardFiles* in,
                  OutputDir* out) {
  TL_ASSIGN_OR_RETURN(int fd, out->Create(shard.file));
  Status st = [&]() -> Status {
    if (::ftruncate(fd, static_cast<off_t>(header.size() + shard.bytes)) != 0) {
      return PosixError("ftruncate", errno);
    }
    TL_RETURN_IF_ERROR(PwriteFully(fd, header.data(), header.size(), 0));
    auto put = [&](const OutTensor& t, const void* data) {
      return PwriteFully(fd, data, t.bytes, header.size() + t.offset);
    };
    std::vector<std::byte> dense, values;
    std::vector<uint8_t> mask;
    std::vector<int64_t> row_offsets;
    for (size_t ui : shard.units) {
      const Unit& u = units[ui];
      const OutTensor* outs = &shard.tensors[u.first_out];
      if (!u.encode) {
        dense.resize(std::min(kCopyChunk, outs[0].bytes));
        for (uint64_t pos = 0; pos < outs[0].bytes; pos += dense.size()) {
          const size_t n = std::min<uint64_t>(dense.size(), outs[0].bytes - pos);
          TL_RETURN_IF_ERROR(in->Read(u.loc, pos, dense.data(), n));
          TL_RETURN_IF_ERROR(
              PwriteFully(fd, dense.data(), n, header.size() + outs[0].offset + pos));
        }
        continue;
      }
      TL_RETURN_IF_ERROR(ReadTarget(ckpt, u, opts, in, &dense));
      // Counted again: the buffers below are sized from the first count.
      if (CountNonZero(dense.data(), u.shape) != u.nnz) {
        return IOError(ckpt.shards()[u.loc.shard].path + ": tensor " +
                       QuoteName(ckpt.info(u.loc).name) + " changed while it was being read");
      }
      values.resize(u.nnz * u.shape.elem_bytes);
      mask.resize(u.shape.mask_bytes());
      row_offsets.resize(u.shape.rows);
      Encode(dense.data(), u.shape, values.data(), mask.data(), row_offsets.data());
      const int64_t dims[2] = {static_cast<int64_t>(u.shape.rows),
                               static_cast<int64_t>(u.shape.cols)};
      TL_RETURN_IF_ERROR(put(outs[0], dims));
      TL_RETURN_IF_ERROR(put(outs[1], values.data()));
      TL_RETURN_IF_ERROR(put(outs[2], mask.data()));
      TL_RETURN_IF_ERROR(put(outs[3], row_offsets.data()));
    }
    return Status::Ok();
  }();
  if (::close(fd) != 0 && st.ok()) st = PosixError("close", errno);
  return st.ok() ? st : st.WithContext(out->Path(shard.file));
}

// model.safetensors.index.json, laid out as transformers writes it.
std::string IndexJson(const std::vector<Shard>& shards, uint64_t total_size) {
  std::map<std::string_view, std::string_view> weight_map;
  for (const auto& s : shards) {
    for (const auto& t : s.tensors) weight_map.emplace(t.name, s.file);
  }
  std::string json = "{\n  \"metadata\": {\n    \"total_size\": " + std::to_string(total_size) +
                     "\n  },\n  \"weight_map\": {";
  bool first = true;
  for (const auto& [name, file] : weight_map) {
    json += first ? "\n    " : ",\n    ";
    first = false;
    AppendJsonString(name, &json);
    json += ": ";
    AppendJsonString(file, &json);
  }
  json += "\n  }\n}\n";
  return json;
}

// Pretty-prints a JSON value with two-space indents (as transformers'
// config.json); scalars as simdjson writes them, which for numbers is
// Python's repr (10000.0, 1e-05).
void AppendPretty(simdjson::dom::element e, int depth, std::string* out) {
  const std::string indent(2 * (depth + 1), ' ');
  if (e.type() == simdjson::dom::element_type::OBJECT) {
    simdjson::dom::object obj = e.get_object().value_unsafe();
    if (obj.size() == 0) {
      *out += "{}";
      return;
    }
    *out += "{";
    bool first = true;
    for (auto field : obj) {
      *out += first ? "\n" : ",\n";
      first = false;
      *out += indent;
      AppendJsonString(field.key, out);
      *out += ": ";
      AppendPretty(field.value, depth + 1, out);
    }
    *out += "\n" + std::string(2 * depth, ' ') + "}";
  } else if (e.type() == simdjson::dom::element_type::ARRAY) {
    simdjson::dom::array arr = e.get_array().value_unsafe();
    if (arr.size() == 0) {
      *out += "[]";
      return;
    }
    *out += "[";
    bool first = true;
    for (auto item : arr) {
      *out += first ? "\n" : ",\n";
      first = false;
      *out += indent;
      AppendPretty(item, depth + 1, out);
    }
    *out += "\n" + std::string(2 * depth, ' ') + "]";
  } else {
    *out += simdjson::minify(e);
  }
}

// config.json with quantization_config.sparsity_config set to
// `sparsity_config` (compact JSON), everything else kept in its order.
Result<std::string> MergeConfig(const std::string& text, const std::string& sparsity_config) {
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (auto err = parser.parse(text).get(root)) {
    return CorruptionError(std::string("invalid JSON: ") + simdjson::error_message(err));
  }
  simdjson::dom::object obj;
  if (root.get_object().get(obj)) return CorruptionError("the root is not a JSON object");
  const std::string fresh =
      "{\"quant_method\":\"compressed-tensors\",\"sparsity_config\":" + sparsity_config + "}";
  std::string merged = "{";
  bool placed = false;
  for (auto field : obj) {
    if (merged.size() > 1) merged += ',';
    AppendJsonString(field.key, &merged);
    merged += ':';
    if (field.key != "quantization_config") {
      merged += simdjson::minify(field.value);
      continue;
    }
    if (placed) return CorruptionError("\"quantization_config\" is given more than once");
    placed = true;
    if (field.value.is_null()) {
      merged += fresh;
      continue;
    }
    simdjson::dom::object q;
    if (field.value.get_object().get(q)) {
      return CorruptionError("\"quantization_config\" is not an object");
    }
    merged += '{';
    for (auto qf : q) {
      if (qf.key == "sparsity_config") continue;
      AppendJsonString(qf.key, &merged);
      merged += ':' + simdjson::minify(qf.value) + ',';
    }
    merged += "\"sparsity_config\":" + sparsity_config + "}";
  }
  if (!placed)
    merged += std::string(merged.size() > 1 ? "," : "") + "\"quantization_config\":" + fresh;
  merged += '}';
  // Parsed again to print the whole document in one layout.
  if (auto err = parser.parse(merged).get(root)) {
    return InternalError(std::string("sparsify built invalid JSON: ") +
                         simdjson::error_message(err));
  }
  std::string out;
  AppendPretty(root, 0, &out);
  return out + "\n";
}

Result<std::string> ReadCompanion(const std::string& path, uint64_t size) {
  TL_ASSIGN_OR_RETURN(PosixFile f, PosixFile::OpenForRead(path));
  std::string data(size, '\0');
  TL_RETURN_IF_ERROR(ReadExactlyAt(f.fd(), 0, data.data(), size));
  return data;
}

// config.json and the other companion files of the input's directory.
Status CopyCompanions(const std::string& dir, const SparsifyOptions& opts,
                      const std::string& sparsity_config, OutputDir* out, SparsifyReport* report) {
  std::vector<std::pair<std::string, uint64_t>> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    std::error_code fec;
    if (name.empty() || name[0] == '.' || !entry.is_regular_file(fec)) continue;
    if (name.ends_with(".safetensors") || name.ends_with(".safetensors.index.json")) continue;
    const uint64_t size = entry.file_size(fec);
    if (fec) return PosixError("cannot stat", fec.value()).WithContext(entry.path().string());
    files.emplace_back(name, size);
  }
  if (ec) return PosixError("cannot list the directory", ec.value()).WithContext(dir);
  std::sort(files.begin(), files.end());
  for (const auto& [name, size] : files) {
    const std::string path = dir + "/" + name;
    if (size > opts.max_copy_bytes) {
      report->skipped.emplace_back(name, std::to_string(size) + " bytes, over the limit of " +
                                             std::to_string(opts.max_copy_bytes));
      continue;
    }
    auto read = ReadCompanion(path, size);
    if (!read.ok()) return read.status().WithContext(path);
    std::string data = std::move(read).value();
    if (name == "config.json" && !sparsity_config.empty() && opts.write_sparsity_config) {
      auto merged = MergeConfig(data, sparsity_config);
      if (!merged.ok()) return merged.status().WithContext(path);
      data = std::move(merged).value();
    }
    TL_RETURN_IF_ERROR(out->WriteFile(name, data));
    report->copied.push_back(name);
    report->files.push_back(name);
  }
  return Status::Ok();
}

Status CheckOptions(const SparsifyOptions& o) {
  if (o.prune && !(*o.prune >= 0 && *o.prune <= 1)) {
    return InvalidArgumentError("the pruning fraction must be in [0, 1], not " +
                                std::to_string(*o.prune));
  }
  if (!(o.min_sparsity >= 0 && o.min_sparsity <= 1)) {
    return InvalidArgumentError("min_sparsity must be in [0, 1], not " +
                                std::to_string(o.min_sparsity));
  }
  if (o.max_shard_bytes == 0) return InvalidArgumentError("the shard size limit must be positive");
  return Status::Ok();
}

}  // namespace

Status PruneByMagnitude(std::byte* data, Dtype dtype, uint64_t rows, uint64_t cols,
                        double fraction) {
  if (!FloatingDtype(dtype)) {
    return InvalidArgumentError(
        "magnitude pruning needs F16, BF16, F32, F64, F8_E4M3 or F8_E5M2, not " +
        std::string(DtypeName(dtype)));
  }
  if (!(fraction >= 0 && fraction <= 1)) {
    return InvalidArgumentError("the pruning fraction must be in [0, 1], not " +
                                std::to_string(fraction));
  }
  const uint64_t k = std::min<uint64_t>(
      cols, static_cast<uint64_t>(std::floor(static_cast<double>(cols) * fraction)));
  if (k == 0) return Status::Ok();
  const uint32_t w = static_cast<uint32_t>(DtypeBits(dtype) / 8);
  auto prune_rows = [=](uint64_t r0, uint64_t r1) {
    // (magnitude, column) pairs are distinct, so the k smallest are one exact
    // set. Below F64, a magnitude has 31 bits and a column (almost always)
    // 32: one uint64 holds both and selects about twice as fast as a pair.
    if (dtype != Dtype::kF64 && cols <= (uint64_t{1} << 32)) {
      std::vector<uint64_t> keys(cols);
      for (uint64_t r = r0; r < r1; ++r) {
        std::byte* row = data + r * cols * w;
        for (uint64_t c = 0; c < cols; ++c) keys[c] = MagnitudeKey(row, dtype, c) << 32 | c;
        if (k < cols) std::nth_element(keys.begin(), keys.begin() + k, keys.end());
        for (uint64_t i = 0; i < k; ++i) std::memset(row + (keys[i] & 0xFFFF'FFFFu) * w, 0, w);
      }
      return;
    }
    std::vector<std::pair<uint64_t, uint64_t>> keys(cols);
    for (uint64_t r = r0; r < r1; ++r) {
      std::byte* row = data + r * cols * w;
      for (uint64_t c = 0; c < cols; ++c) keys[c] = {MagnitudeKey(row, dtype, c), c};
      if (k < cols) std::nth_element(keys.begin(), keys.begin() + k, keys.end());
      for (uint64_t i = 0; i < k; ++i) std::memset(row + keys[i].second * w, 0, w);
    }
  };
  // The selection costs tens of ns per element: rows are shared out to the
  // CPUs once a tensor has a few million elements.
  constexpr uint64_t kElementsPerThread = 1 << 22;
  const uint64_t threads = std::clamp<uint64_t>(rows * cols / kElementsPerThread, 1,
                                                std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (uint64_t t = 1; t < threads; ++t) {
    try {
      pool.emplace_back(prune_rows, rows * t / threads, rows * (t + 1) / threads);
    } catch (const std::system_error&) {  // No thread to be had: this one does the rest.
      prune_rows(rows * t / threads, rows);
      break;
    }
  }
  prune_rows(0, rows / threads);
  for (auto& th : pool) th.join();
  return Status::Ok();
}

Result<SparsifyReport> Sparsify(const std::string& input, const std::string& output_dir,
                                const SparsifyOptions& opts) {
  TL_RETURN_IF_ERROR(CheckOptions(opts));
  std::regex targets;
  try {
    targets = std::regex(opts.targets, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return InvalidArgumentError("the targets regex " + QuoteName(opts.targets) +
                                " is invalid: " + e.what());
  }
  TL_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::Open(input));
  TL_ASSIGN_OR_RETURN(SparseCatalog catalog, FindSparse(ckpt));
  if (!catalog.empty()) {
    return InvalidArgumentError(input + ": already holds " + std::to_string(catalog.sparse.size()) +
                                " sparse-bitmask group(s), e.g. " +
                                QuoteName(catalog.sparse[0].prefix) +
                                "; sparsify reads dense checkpoints");
  }

  SparsifyReport report;
  report.bytes_in = ckpt.total_bytes();
  ShardFiles in(ckpt);
  std::vector<Unit> units;
  std::vector<std::vector<OutTensor>> unit_outs;
  uint64_t zeros = 0, elements = 0;
  std::vector<std::byte> dense;

  // Pass 1: decide what each tensor becomes (targets are read and counted).
  for (auto loc : ckpt.tensors()) {
    const TensorInfo& info = ckpt.info(loc);
    SparsifyReport::Tensor rt;
    rt.name = info.name;
    rt.dtype = info.dtype;
    rt.shape = info.shape;
    rt.dense_bytes = info.nbytes();
    Unit u;
    u.loc = loc;
    const std::optional<std::string> prefix = PrefixFor(info.name);
    if (!std::regex_search(info.name, targets)) {
      rt.note = "not a target";
    } else if (info.shape.size() != 2) {
      rt.note = "not 2-D";
    } else if (!FloatingDtype(info.dtype)) {
      rt.note = std::string(DtypeName(info.dtype)) + " is not a floating-point dtype";
    } else if (!prefix) {
      rt.note = "the name ends in neither .weight nor .bias";
    } else {
      rt.target = true;
      u.shape = {info.shape[0], info.shape[1], static_cast<uint32_t>(DtypeBits(info.dtype) / 8)};
      TL_RETURN_IF_ERROR(ReadTarget(ckpt, u, opts, &in, &dense));
      u.nnz = rt.nnz = CountNonZero(dense.data(), u.shape);
      const uint64_t n = u.shape.rows * u.shape.cols;
      if (n == 0) {
        rt.note = "empty";
      } else if (static_cast<double>(n - u.nnz) < opts.min_sparsity * static_cast<double>(n)) {
        char buf[96];
        std::snprintf(buf, sizeof buf, "sparsity %.4f is below %.4f",
                      static_cast<double>(n - u.nnz) / static_cast<double>(n), opts.min_sparsity);
        rt.note = buf;
      } else if (EncodedBytes(u.shape, u.nnz) >= info.nbytes()) {
        rt.note = "the encoding is not smaller";
      } else {
        u.encode = rt.encoded = true;
        zeros += n - u.nnz;
        elements += n;
      }
    }
    std::vector<OutTensor> outs;
    if (u.encode) {
      const std::string& p = *prefix;
      outs.emplace_back(p + std::string(kShapeSuffix), Dtype::kI64, std::vector<uint64_t>{2}, 16);
      outs.emplace_back(p + std::string(kValuesSuffix), info.dtype, std::vector<uint64_t>{u.nnz},
                        u.nnz * u.shape.elem_bytes);
      outs.emplace_back(p + std::string(kBitmaskSuffix), Dtype::kU8,
                        std::vector<uint64_t>{u.shape.rows, u.shape.mask_row_bytes()},
                        u.shape.mask_bytes());
      outs.emplace_back(p + std::string(kRowOffsetsSuffix), Dtype::kI64,
                        std::vector<uint64_t>{u.shape.rows}, 8 * u.shape.rows);
      ++report.encoded;
    } else {
      outs.emplace_back(info.name, info.dtype, info.shape, info.nbytes());
      ++report.kept_dense;
    }
    for (const auto& o : outs) rt.stored_bytes += o.bytes;
    report.tensors.push_back(std::move(rt));
    units.push_back(u);
    unit_outs.push_back(std::move(outs));
  }
  std::vector<std::byte>().swap(dense);  // Pass 2 has buffers of its own.
  report.global_sparsity =
      elements == 0 ? 0.0 : static_cast<double>(zeros) / static_cast<double>(elements);

  // A group's part names must not meet another stored tensor's name.
  std::map<std::string_view, size_t> names;  // Stored name -> unit.
  for (size_t i = 0; i < units.size(); ++i) {
    for (const auto& o : unit_outs[i]) {
      auto [it, inserted] = names.emplace(o.name, i);
      if (inserted) continue;
      // Distinct dense names give distinct prefixes, so one of the two is dense.
      const size_t group = units[i].encode ? i : it->second;
      return InvalidArgumentError(
          input + ": cannot encode " + QuoteName(report.tensors[group].name) + " as the group " +
          QuoteName(*PrefixFor(report.tensors[group].name)) + ": the name " + QuoteName(o.name) +
          " is taken by a tensor of the input");
    }
  }

  // Shards as transformers cuts them: in name order, a new shard when the
  // next tensor (a group counts whole) would pass the limit.
  std::vector<Shard> shards(1);
  for (size_t i = 0; i < units.size(); ++i) {
    const uint64_t bytes = report.tensors[i].stored_bytes;
    if (!shards.back().units.empty() && shards.back().bytes + bytes > opts.max_shard_bytes) {
      shards.emplace_back();
    }
    Shard& s = shards.back();
    units[i].first_out = s.tensors.size();
    s.units.push_back(i);
    s.bytes += bytes;
    report.bytes_out += bytes;
    for (auto& o : unit_outs[i]) s.tensors.push_back(std::move(o));
  }
  for (size_t k = 0; k < shards.size(); ++k) {
    if (shards.size() == 1) {
      shards[k].file = "model.safetensors";
    } else {
      char buf[64];
      std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", k + 1, shards.size());
      shards[k].file = buf;
    }
  }

  OutputDir out;
  TL_RETURN_IF_ERROR(out.Prepare(output_dir));
  // Pass 2: write the shards.
  const std::optional<Metadata> metadata =
      ckpt.shards().empty() ? std::nullopt : ckpt.shards()[0].header.metadata();
  for (auto& s : shards) {
    auto header = ShardHeader(&s.tensors, metadata);
    if (!header.ok()) return header.status().WithContext(out.Path(s.file));
    TL_RETURN_IF_ERROR(WriteShard(ckpt, opts, s, *header, units, &in, &out));
    report.files.push_back(s.file);
  }
  if (shards.size() > 1) {
    TL_RETURN_IF_ERROR(out.WriteFile(kIndexName, IndexJson(shards, report.bytes_out)));
    report.files.emplace_back(kIndexName);
  }

  // Companions, from the directory the checkpoint was opened in.
  std::string dir;
  std::error_code ec;
  if (fs::is_directory(input, ec)) {
    dir = input;
  } else if (ckpt.kind() == Checkpoint::Kind::kIndex) {
    dir = fs::path(input).parent_path().string();
    if (dir.empty()) dir = ".";
  }
  if (!dir.empty()) {
    std::string sparsity_config;
    if (report.encoded > 0) {
      char sparsity[32];
      std::snprintf(sparsity, sizeof sparsity, "%.17g", report.global_sparsity);
      // A float in JSON, as compressed-tensors writes it (1 would read back as an int).
      if (std::strpbrk(sparsity, ".e") == nullptr) std::strcat(sparsity, ".0");
      sparsity_config =
          "{\"format\":\"sparse-bitmask\",\"global_sparsity\":" + std::string(sparsity) +
          ",\"sparsity_structure\":\"unstructured\",\"targets\":[";
      bool first = true;
      for (const auto& t : report.tensors) {
        if (!t.encoded) continue;
        if (!first) sparsity_config += ',';
        first = false;
        AppendJsonString(*PrefixFor(t.name), &sparsity_config);
      }
      sparsity_config += "],\"ignore\":[]}";
    }
    TL_RETURN_IF_ERROR(CopyCompanions(dir, opts, sparsity_config, &out, &report));
  }
  TL_RETURN_IF_ERROR(out.Commit());
  return report;
}

}  // namespace tensorlift::sparse
