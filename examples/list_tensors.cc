// Lists the tensors of a checkpoint (a file, an index, or a directory of
// shards) with the public API. Built with the project; shown in README.md.
#include <cstdio>

#include "tensorlift/checkpoint.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CHECKPOINT\n", argv[0]);
    return 2;
  }
  auto ckpt = tensorlift::Checkpoint::Open(argv[1]);
  if (!ckpt.ok()) {
    std::fprintf(stderr, "%s\n", ckpt.status().ToString().c_str());
    return 1;
  }
  for (auto loc : ckpt->tensors()) {
    const tensorlift::TensorInfo& t = ckpt->info(loc);
    std::printf("%s %s %llu bytes\n", t.name.c_str(),
                std::string(tensorlift::DtypeName(t.dtype)).c_str(),
                static_cast<unsigned long long>(t.nbytes()));
  }
  return 0;
}
