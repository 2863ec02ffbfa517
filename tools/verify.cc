#include <sys/stat.h>

#include <cstdio>

#include "commands.h"
#include "tensorlift/checkpoint.h"

namespace tensorlift::cli {

int RunVerify(const std::vector<std::string>& paths, bool quiet) {
  int rc = kExitOk;
  for (const auto& path : paths) {
    auto ckpt = Checkpoint::Open(path);
    if (!ckpt.ok()) {
      // The library's message starts with the file concerned.
      std::printf("%s\n", ckpt.status().ToString().c_str());
      rc = kExitInvalid;
      continue;
    }
    for (const auto& w : ckpt->warnings()) std::fprintf(stderr, "%s: warning: %s\n", path.c_str(), w.c_str());
    if (!quiet) {
      std::printf("%s: OK (%zu tensors in %zu file%s, %llu bytes of data)\n", path.c_str(),
                  ckpt->tensors().size(), ckpt->shards().size(), ckpt->shards().size() == 1 ? "" : "s",
                  static_cast<unsigned long long>(ckpt->total_bytes()));
    }
  }
  return rc;
}

}  // namespace tensorlift::cli
