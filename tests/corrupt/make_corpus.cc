// tl_make_corpus DIR [--large]: writes the hand-built corpus (corpus.h) to DIR
// as DIR/<name>.safetensors, DIR/manifest.tsv and DIR/known_bugs.tsv.
// --large adds the 100 MB case (a header of exactly 100,000,000 bytes).
#include <cstdio>
#include <cstring>
#include <string>

#include "corrupt/corpus.h"

int main(int argc, char** argv) {
  std::string dir;
  tensorlift::testing::CorpusOptions options;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--large") == 0) {
      options.include_large = true;
    } else if (dir.empty() && argv[i][0] != '-') {
      dir = argv[i];
    } else {
      dir.clear();
      break;
    }
  }
  if (dir.empty()) {
    std::fprintf(stderr, "usage: tl_make_corpus DIR [--large]\n");
    return 2;
  }
  const auto cases = tensorlift::testing::MakeCorpus(options);
  tensorlift::Status st = tensorlift::testing::WriteCorpus(dir, cases);
  if (!st.ok()) {
    std::fprintf(stderr, "tl_make_corpus: %s\n", st.ToString().c_str());
    return 1;
  }
  std::printf("%zu cases written to %s\n", cases.size(), dir.c_str());
  return 0;
}
