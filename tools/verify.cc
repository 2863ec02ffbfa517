#include <sys/stat.h>

#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "commands.h"
#include "sha256.h"
#include "tensorlift/bitmask.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/loader.h"
#include "tensorlift/objstore.h"
#include "tensorlift/sparse.h"

namespace tensorlift::cli {
namespace {

// The sparse-bitmask groups of `ckpt`: their parts fit together (FindSparse)
// and each group's bitmask and row offsets agree (Validate, which reads them:
// about 1/16 of a bf16 group's dense bytes). Returns how many were checked.
Result<size_t> CheckSparseGroups(const Checkpoint& ckpt, const std::string& path,
                                 const StoreArgs& store) {
  TL_ASSIGN_OR_RETURN(const sparse::SparseCatalog catalog, sparse::FindSparse(ckpt));
  if (catalog.empty()) return size_t{0};
  std::vector<std::string> names;
  for (const auto& g : catalog.sparse) {
    names.push_back(ckpt.info(g.bitmask).name);
    names.push_back(ckpt.info(g.row_offsets).name);
  }
  LoadOptions options;
  options.decode_sparse = false;  // The stored parts, as they are.
  options.filter = TensorFilter::Names(std::move(names));
  TL_ASSIGN_OR_RETURN(const LoadedCheckpoint parts, IsObjectStoreUrl(path)
                                                        ? LoadPath(path, options, store)
                                                        : Load(ckpt, options));
  for (const auto& g : catalog.sparse) {
    const LoadedTensor* mask = parts.Find(ckpt.info(g.bitmask).name);
    const LoadedTensor* offsets = parts.Find(ckpt.info(g.row_offsets).name);
    Status st = sparse::Validate(static_cast<const uint8_t*>(mask->data),
                                 static_cast<const int64_t*>(offsets->data), g.shape, g.nnz);
    if (!st.ok())
      return st.WithContext("sparse tensor '" + g.name + "' (group '" + g.prefix + "')");
  }
  return catalog.sparse.size();
}

}  // namespace

int RunVerify(const std::vector<std::string>& paths, bool quiet, const StoreArgs& store,
              const std::string& sha256_source) {
  // --sha256: the expected digests, read once for every PATH.
  const bool hub = sha256_source == "hub";
  Sha256List list;
  if (!sha256_source.empty() && !hub) {
    auto read = ReadSha256List(sha256_source);
    if (!read.ok()) {
      std::printf("%s\n", read.status().ToString().c_str());
      return kExitInvalid;
    }
    list = std::move(*read);
  }

  // First the headers and sparse groups of each PATH, then (--sha256) every
  // shard of the valid ones hashed at once, a file per core, then the report.
  struct Checked {
    std::string path;
    std::string failed;                 // Printed as it is: the PATH could not be checked.
    std::vector<std::string> problems;  // Each printed as "PATH: problem".
    std::string summary;                // The OK line's parenthesis, less the SHA-256 part.
    std::vector<std::pair<std::string, std::string>> expected;  // Shard path, digest.
  };
  std::vector<Checked> checked;
  int rc = kExitOk;
  for (const auto& path : paths) {
    auto ckpt = OpenCheckpoint(path, store);
    if (!ckpt.ok()) {
      // The library's message starts with the file concerned.
      checked.push_back({path, ckpt.status().ToString(), {}, {}, {}});
      continue;
    }
    for (const auto& w : ckpt->warnings())
      std::fprintf(stderr, "%s: warning: %s\n", path.c_str(), w.c_str());
    auto groups = CheckSparseGroups(*ckpt, path, store);
    if (!groups.ok()) {
      checked.push_back({path, path + ": " + groups.status().ToString(), {}, {}, {}});
      continue;
    }
    Checked c{path, {}, {}, {}, {}};
    const std::string sparse =
        *groups > 0 ? "; " + std::to_string(*groups) + " sparse-bitmask groups checked" : "";
    c.summary = std::to_string(ckpt->tensors().size()) + " tensors in " +
                std::to_string(ckpt->shards().size()) + " file" +
                (ckpt->shards().size() == 1 ? "" : "s") + ", " +
                std::to_string(ckpt->total_bytes()) + " bytes of data" + sparse;
    if (!sha256_source.empty()) {
      if (IsObjectStoreUrl(path)) {
        c.problems.push_back("--sha256 checks local files only");
      } else {
        for (const auto& shard : ckpt->shards()) {
          auto digest = hub ? HubSha256(shard.path) : ExpectedSha256(list, shard.path);
          if (digest.ok()) {
            c.expected.emplace_back(shard.path, std::move(*digest));
          } else {
            c.problems.push_back(digest.status().ToString());
          }
        }
      }
    }
    checked.push_back(std::move(c));
  }

  // Every file once, however many PATHs name it.
  std::vector<std::string> files;
  std::map<std::string, size_t> file_index;
  for (const auto& c : checked) {
    // A file without a digest: nothing to compare.
    if (!c.failed.empty() || !c.problems.empty()) continue;
    for (const auto& [file, digest] : c.expected) {
      if (file_index.emplace(file, files.size()).second) files.push_back(file);
    }
  }
  const std::vector<Result<FileDigest>> actual = Sha256Files(files);

  for (auto& c : checked) {
    if (!c.failed.empty()) {
      std::printf("%s\n", c.failed.c_str());
      rc = kExitInvalid;
      continue;
    }
    if (c.problems.empty()) {
      for (const auto& [file, expected] : c.expected) {
        const Result<FileDigest>& got = actual[file_index.at(file)];
        if (!got.ok()) {
          c.problems.push_back(got.status().ToString());
        } else if (got->digest != expected) {
          c.problems.push_back("SHA-256 of " + file + " does not match: expected " + expected +
                               ", actual " + got->digest);
        }
      }
    }
    for (const auto& p : c.problems) std::printf("%s: %s\n", c.path.c_str(), p.c_str());
    if (!c.problems.empty()) {
      rc = kExitInvalid;
      continue;
    }
    if (!quiet) {
      const std::string sha = sha256_source.empty()
                                  ? ""
                                  : "; SHA-256 of " + std::to_string(c.expected.size()) + " file" +
                                        (c.expected.size() == 1 ? "" : "s") + " checked";
      std::printf("%s: OK (%s%s)\n", c.path.c_str(), c.summary.c_str(), sha.c_str());
    }
  }
  return rc;
}

}  // namespace tensorlift::cli
