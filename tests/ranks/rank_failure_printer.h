// For tests run under mpiexec: on ranks other than 0, print only failures,
// prefixed by the rank (rank 0 keeps gtest's normal output).
#ifndef TENSORLIFT_TESTS_DIST_RANK_FAILURE_PRINTER_H_
#define TENSORLIFT_TESTS_DIST_RANK_FAILURE_PRINTER_H_

#include <gtest/gtest.h>

#include <cstdio>

namespace tensorlift::testing {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed()) {
      std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.summary());
    }
  }

 private:
  int rank_;
};

}  // namespace tensorlift::testing

#endif  // TENSORLIFT_TESTS_DIST_RANK_FAILURE_PRINTER_H_
