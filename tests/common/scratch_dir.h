// The tests' one temporary directory: a fresh directory under the test temp
// dir (gtest's TempDir), removed with its contents when it goes.
#ifndef TENSORLIFT_TESTS_COMMON_SCRATCH_DIR_H_
#define TENSORLIFT_TESTS_COMMON_SCRATCH_DIR_H_

#include <stdlib.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

#include "gtest/gtest.h"

namespace tensorlift::test {

class ScratchDir {
 public:
  // Under `parent` (ending in '/') when given, e.g. "/dev/shm/" for a tmpfs.
  explicit ScratchDir(const std::string& tag = "tl_test", const std::string& parent = "") {
    std::string tmpl = (parent.empty() ? ::testing::TempDir() : parent) + tag + "_XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }
  // The path of `name` in the directory.
  std::string File(const std::string& name) const { return path_ + "/" + name; }
  std::string operator/(const std::string& name) const { return File(name); }
  // Writes `bytes` to `name` (replacing it); its path.
  std::string Write(const std::string& name, const std::string& bytes) const {
    const std::string p = File(name);
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) std::abort();
    return p;
  }
  // The names in the directory, sorted.
  std::vector<std::string> List() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path_))
      out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  std::string path_;
};

}  // namespace tensorlift::test

#endif  // TENSORLIFT_TESTS_COMMON_SCRATCH_DIR_H_
