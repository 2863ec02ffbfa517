// tl_rewrite IN OUT: reads IN entirely, parses it with Header::Parse, and
// writes the same tensors and metadata to OUT with tensorlift's writer. Used
// by tests/python/test_reference.py to compare the writer with the reference.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tensorlift/safetensors.h"

int main(int argc, char** argv) {
  using namespace tensorlift;
  if (argc != 3) {
    std::fprintf(stderr, "usage: tl_rewrite IN OUT\n");
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "tl_rewrite: cannot open %s\n", argv[1]);
    return 1;
  }
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto file = std::as_bytes(std::span<const char>(bytes.data(), bytes.size()));
  auto header = Header::Parse(file);
  if (!header.ok()) {
    std::fprintf(stderr, "tl_rewrite: %s: %s\n", argv[1], header.status().ToString().c_str());
    return 1;
  }
  std::vector<TensorView> views;
  for (const TensorInfo& t : header->tensors()) {
    views.push_back(
        {t.name, t.dtype, t.shape, file.subspan(header->data_offset() + t.begin, t.nbytes())});
  }
  Status st = WriteFile(argv[2], views, header->metadata());
  if (!st.ok()) {
    std::fprintf(stderr, "tl_rewrite: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
