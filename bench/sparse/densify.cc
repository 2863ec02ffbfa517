// tl_sparse_densify IN OUT_DIR [--shard-mib N]: loads IN (decoding its sparse
// groups) and writes every tensor dense into OUT_DIR/dense-0000k.safetensors
// shards of about N MiB (default 1024), in name order. The sparse load
// benchmark (bench/sparse/load_bench.py) compares a pruned checkpoint stored
// sparse with the very same tensors stored dense.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "tensorlift/loader.h"
#include "tensorlift/safetensors.h"

int main(int argc, char** argv) {
  using namespace tensorlift;
  if (argc < 3) {
    std::fprintf(stderr, "usage: tl_sparse_densify IN OUT_DIR [--shard-mib N]\n");
    return 2;
  }
  uint64_t shard = uint64_t{1024} << 20;
  if (argc == 5 && std::strcmp(argv[3], "--shard-mib") == 0)
    shard = std::strtoull(argv[4], nullptr, 10) << 20;
  auto loaded = Load(argv[1]);
  if (!loaded.ok()) {
    std::fprintf(stderr, "tl_sparse_densify: %s\n", loaded.status().ToString().c_str());
    return 1;
  }
  std::filesystem::create_directories(argv[2]);
  std::vector<TensorView> views;
  uint64_t bytes = 0;
  int file = 0;
  auto flush = [&]() -> bool {
    if (views.empty()) return true;
    char name[64];
    std::snprintf(name, sizeof name, "/dense-%05d.safetensors", ++file);
    Status st = WriteFile(std::string(argv[2]) + name, views, Metadata{{"format", "pt"}});
    if (!st.ok()) std::fprintf(stderr, "tl_sparse_densify: %s\n", st.ToString().c_str());
    views.clear();
    bytes = 0;
    return st.ok();
  };
  for (const LoadedTensor& t : loaded->tensors()) {
    std::vector<uint64_t> shape(t.shape.begin(), t.shape.end());
    views.push_back({t.name, t.dtype, shape, {static_cast<const std::byte*>(t.data), t.nbytes}});
    bytes += t.nbytes;
    if (bytes >= shard && !flush()) return 1;
  }
  return flush() ? 0 : 1;
}
