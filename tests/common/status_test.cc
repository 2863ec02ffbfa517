// Status, Result<T> and the TL_RETURN_IF_ERROR / TL_ASSIGN_OR_RETURN macros.
#include "tensorlift/status.h"

#include <memory>
#include <string>
#include <vector>

#include "../common/assert_ok.h"
#include "common/checked_math.h"
#include "gmock/gmock.h"
#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"

namespace tensorlift {
namespace {

TEST(StatusTest, DefaultIsOk) {
  Status s;
  EXPECT_OK(s);
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.message(), "");
  EXPECT_EQ(s.ToString(), "OK");
  EXPECT_OK(Status::Ok());
  // An OK code with a message is still OK, without the message.
  Status ok_with_message(StatusCode::kOk, "ignored");
  EXPECT_OK(ok_with_message);
  EXPECT_EQ(ok_with_message.message(), "");
}

TEST(StatusTest, ConstructorsSetTheirCodes) {
  struct Row {
    Status status;
    StatusCode code;
    const char* name;
  };
  const std::vector<Row> rows = {
      {InvalidArgumentError("m"), StatusCode::kInvalidArgument, "InvalidArgument"},
      {NotFoundError("m"), StatusCode::kNotFound, "NotFound"},
      {CorruptionError("m"), StatusCode::kCorruption, "Corruption"},
      {OutOfRangeError("m"), StatusCode::kOutOfRange, "OutOfRange"},
      {IOError("m"), StatusCode::kIOError, "IOError"},
      {UnimplementedError("m"), StatusCode::kUnimplemented, "Unimplemented"},
      {ResourceExhaustedError("m"), StatusCode::kResourceExhausted, "ResourceExhausted"},
      {InternalError("m"), StatusCode::kInternal, "Internal"},
      {PermissionDeniedError("m"), StatusCode::kPermissionDenied, "PermissionDenied"},
  };
  for (const Row& r : rows) {
    EXPECT_FALSE(r.status.ok()) << r.name;
    EXPECT_EQ(r.status.code(), r.code) << r.name;
    EXPECT_EQ(r.status.message(), "m") << r.name;
    EXPECT_EQ(r.status.ToString(), "m") << r.name;
    EXPECT_EQ(StatusCodeName(r.code), r.name);
  }
  EXPECT_EQ(StatusCodeName(StatusCode::kOk), "OK");
  EXPECT_EQ(StatusCodeName(StatusCode::kUnavailable), "Unavailable");
  EXPECT_EQ(Status(StatusCode::kUnavailable, "peer gone").code(), StatusCode::kUnavailable);
}

TEST(StatusTest, WithContextPrefixesOnce) {
  Status s = CorruptionError("InvalidOffset: tensor 'a'");
  Status c = s.WithContext("/m/model.safetensors");
  EXPECT_EQ(c.code(), StatusCode::kCorruption);
  EXPECT_EQ(c.message(), "/m/model.safetensors: InvalidOffset: tensor 'a'");
  // The original is unchanged (statuses are values).
  EXPECT_EQ(s.message(), "InvalidOffset: tensor 'a'");
  // OK stays OK and gains no message.
  EXPECT_OK(Status::Ok().WithContext("path"));
  EXPECT_EQ(Status::Ok().WithContext("path").message(), "");
}

TEST(StatusTest, CopiesAndMovesAreValues) {
  Status a = NotFoundError("gone");
  Status b = a;
  EXPECT_EQ(b.code(), StatusCode::kNotFound);
  EXPECT_EQ(b.message(), "gone");
  Status c = std::move(a);
  EXPECT_EQ(c.message(), "gone");
  b = Status::Ok();
  EXPECT_OK(b);
  EXPECT_EQ(c.message(), "gone");
  c.IgnoreError();
}

TEST(ResultTest, HoldsAValueOrAnError) {
  Result<int> v = 42;
  ASSERT_OK(v);
  EXPECT_OK(v.status());
  EXPECT_EQ(*v, 42);
  EXPECT_EQ(v.value(), 42);
  *v = 7;
  EXPECT_EQ(v.value(), 7);

  Result<int> e = NotFoundError("no such tensor");
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(e.status().message(), "no such tensor");
}

TEST(ResultTest, OkStatusBecomesInternalError) {
  Result<int> r = Status::Ok();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

TEST(ResultTest, MoveOnlyValuesAndArrow) {
  Result<std::unique_ptr<std::string>> r = std::make_unique<std::string>("abc");
  ASSERT_OK(r);
  EXPECT_EQ((*r)->size(), 3u);
  std::unique_ptr<std::string> p = std::move(r).value();
  EXPECT_EQ(*p, "abc");

  Result<std::string> s = std::string("xyz");
  EXPECT_EQ(s->size(), 3u);
  const Result<std::string>& cs = s;
  EXPECT_EQ(cs->front(), 'x');
  EXPECT_EQ(*cs, "xyz");
  std::string moved = *std::move(s);
  EXPECT_EQ(moved, "xyz");
}

TEST(ResultDeathTest, ValueOfAnErrorAborts) {
  Result<int> e = CorruptionError("bad");
  EXPECT_DEATH({ (void)e.value(); }, "");
}

// --- Macros -------------------------------------------------------------------------

Status FailIf(bool fail, int* calls) {
  ++*calls;
  return fail ? OutOfRangeError("failed") : Status::Ok();
}

Status TwoSteps(bool fail_first, bool fail_second, int* calls) {
  TL_RETURN_IF_ERROR(FailIf(fail_first, calls));
  TL_RETURN_IF_ERROR(FailIf(fail_second, calls));
  return Status::Ok();
}

TEST(MacroTest, ReturnIfError) {
  int calls = 0;
  EXPECT_OK(TwoSteps(false, false, &calls));
  EXPECT_EQ(calls, 2);
  calls = 0;
  Status s = TwoSteps(true, false, &calls);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(calls, 1);
  calls = 0;
  EXPECT_FALSE(TwoSteps(false, true, &calls).ok());
  EXPECT_EQ(calls, 2);
}

Result<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgumentError(std::to_string(x) + " is odd");
  return x / 2;
}

// Declares with TL_ASSIGN_OR_RETURN, twice in one function.
Result<int> Quarter(int x) {
  TL_ASSIGN_OR_RETURN(int h, Half(x));
  TL_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

// Assigns to an existing variable.
Status QuarterInto(int x, int* out) {
  int h = 0;
  TL_ASSIGN_OR_RETURN(h, Half(x));
  TL_ASSIGN_OR_RETURN(*out, Half(h));
  return Status::Ok();
}

Result<std::unique_ptr<int>> MakeBox(int v) { return std::make_unique<int>(v); }

Result<int> Unbox(int v) {
  TL_ASSIGN_OR_RETURN(std::unique_ptr<int> box, MakeBox(v));
  return *box + 1;
}

TEST(MacroTest, AssignOrReturn) {
  EXPECT_EQ(*Quarter(12), 3);
  Result<int> odd = Quarter(6);
  ASSERT_FALSE(odd.ok());
  EXPECT_EQ(odd.status().message(), "3 is odd");
  int out = -1;
  EXPECT_OK(QuarterInto(8, &out));
  EXPECT_EQ(out, 2);
  out = -1;
  EXPECT_EQ(QuarterInto(7, &out).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(out, -1);
  EXPECT_EQ(*Unbox(41), 42);
}

TEST(CheckedMathTest, DetectsOverflow) {
  uint64_t out = 0;
  EXPECT_TRUE(CheckedAdd(UINT64_MAX - 1, 1, &out));
  EXPECT_EQ(out, UINT64_MAX);
  EXPECT_FALSE(CheckedAdd(UINT64_MAX, 1, &out));
  EXPECT_TRUE(CheckedMul(uint64_t{1} << 32, (uint64_t{1} << 32) - 1, &out));
  EXPECT_FALSE(CheckedMul(uint64_t{1} << 32, uint64_t{1} << 32, &out));
  EXPECT_TRUE(CheckedMul(0, UINT64_MAX, &out));
  EXPECT_EQ(out, 0u);
}

// The tests' ASSERT_OK / EXPECT_OK (tests/common/assert_ok.h) on Status and
// Result: silent when OK, else the expression, the code and the message.
TEST(AssertOkTest, PassesOnOkAndReportsErrors) {
  EXPECT_OK(Status::Ok());
  EXPECT_OK(Result<int>(3));
  EXPECT_NONFATAL_FAILURE(EXPECT_OK(IOError("disk on fire")),
                          "IOError(\"disk on fire\") is not OK: IOError: disk on fire");
  EXPECT_NONFATAL_FAILURE(EXPECT_OK(Result<int>(NotFoundError("no such tensor"))) << "ctx",
                          "no such tensor");
  EXPECT_FATAL_FAILURE(ASSERT_OK(Result<int>(InternalError("boom"))), "boom");
}

}  // namespace
}  // namespace tensorlift
