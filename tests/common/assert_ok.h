// The tests' one way to require success: ASSERT_OK(expr) / EXPECT_OK(expr)
// for an expression that is a Status or a Result<T>. On failure the message
// names the expression and gives the status' code and message; like every
// gtest assertion, more context can be streamed in: ASSERT_OK(r) << path;
#ifndef TENSORLIFT_TESTS_COMMON_ASSERT_OK_H_
#define TENSORLIFT_TESTS_COMMON_ASSERT_OK_H_

#include "gtest/gtest.h"
#include "tensorlift/status.h"

namespace tensorlift::test {

inline const Status& StatusOf(const Status& s) { return s; }
template <typename T>
const Status& StatusOf(const Result<T>& r) {
  return r.status();  // OK when it holds a value.
}

template <typename T>
::testing::AssertionResult IsOk(const char* text, const T& value) {
  const Status& s = StatusOf(value);
  if (s.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << text << " is not OK: " << StatusCodeName(s.code()) << ": " << s.ToString();
}

}  // namespace tensorlift::test

#define ASSERT_OK(expr) ASSERT_PRED_FORMAT1(::tensorlift::test::IsOk, expr)
#define EXPECT_OK(expr) EXPECT_PRED_FORMAT1(::tensorlift::test::IsOk, expr)

#endif  // TENSORLIFT_TESTS_COMMON_ASSERT_OK_H_
