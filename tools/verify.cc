#include <sys/stat.h>

#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "tensorlift/bitmask.h"
#include "tensorlift/checkpoint.h"
#include "tensorlift/loader.h"
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

int RunVerify(const std::vector<std::string>& paths, bool quiet, const StoreArgs& store) {
  int rc = kExitOk;
  for (const auto& path : paths) {
    auto ckpt = OpenCheckpoint(path, store);
    if (!ckpt.ok()) {
      // The library's message starts with the file concerned.
      std::printf("%s\n", ckpt.status().ToString().c_str());
      rc = kExitInvalid;
      continue;
    }
    for (const auto& w : ckpt->warnings())
      std::fprintf(stderr, "%s: warning: %s\n", path.c_str(), w.c_str());
    auto groups = CheckSparseGroups(*ckpt, path, store);
    if (!groups.ok()) {
      std::printf("%s: %s\n", path.c_str(), groups.status().ToString().c_str());
      rc = kExitInvalid;
      continue;
    }
    if (!quiet) {
      const std::string sparse =
          *groups > 0 ? "; " + std::to_string(*groups) + " sparse-bitmask groups checked" : "";
      std::printf("%s: OK (%zu tensors in %zu file%s, %llu bytes of data%s)\n", path.c_str(),
                  ckpt->tensors().size(), ckpt->shards().size(),
                  ckpt->shards().size() == 1 ? "" : "s",
                  static_cast<unsigned long long>(ckpt->total_bytes()), sparse.c_str());
    }
  }
  return rc;
}

}  // namespace tensorlift::cli
