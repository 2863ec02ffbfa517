// Status and Result<T>: errors as values (the abseil shape, no dependencies).
//
// Every fallible function in tensorlift returns a Status or a Result<T>. Both
// are [[nodiscard]]. A Status is either OK or carries a code and a message that
// names the object and the numbers involved. No function in the library throws;
// the Python layer maps codes to exceptions.
//
// Thread safety: Status and Result are values; distinct objects may be used
// from different threads freely.
#ifndef TENSORLIFT_STATUS_H_
#define TENSORLIFT_STATUS_H_

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace tensorlift {

// The error codes. Each says when it is used; the Python exception follows.
enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,    // The caller passed bad options or data. ValueError.
  kNotFound = 2,           // No such file (ENOENT) or tensor. FileNotFoundError / KeyError.
  kCorruption = 3,         // The bytes of a file break the format. tensorlift.FormatError.
  kOutOfRange = 4,         // A slice or read past the end of an object. IndexError.
  kIOError = 5,            // Any other errno from the operating system. OSError.
  kUnimplemented = 6,      // Not built in, or not supported here. NotImplementedError.
  kResourceExhausted = 7,  // An allocation failed or a limit was hit. MemoryError.
  kUnavailable = 8,        // A transient remote failure. ConnectionError.
  kInternal = 9,           // A broken invariant: a bug in tensorlift. RuntimeError.
  kPermissionDenied = 10,  // EACCES / EPERM. PermissionError.
};

// Returns the code's name without the leading 'k', e.g. "Corruption".
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK.
  Status(StatusCode code, std::string message);

  static Status Ok() { return Status(); }

  bool ok() const { return rep_ == nullptr; }
  StatusCode code() const { return rep_ ? rep_->code : StatusCode::kOk; }
  // The message; empty for OK.
  const std::string& message() const;
  // "OK", or the message (the code is not repeated: messages are complete).
  std::string ToString() const;

  // Returns a copy whose message is prefixed with `context` and ": ".
  // Used once at a boundary, e.g. to add the file path.
  Status WithContext(std::string_view context) const;

  // Marks an intentionally ignored status (greppable).
  void IgnoreError() const {}

 private:
  struct Rep {
    StatusCode code;
    std::string message;
  };
  std::shared_ptr<const Rep> rep_;
};

// Constructors for each code.
Status InvalidArgumentError(std::string message);
Status NotFoundError(std::string message);
Status CorruptionError(std::string message);
Status OutOfRangeError(std::string message);
Status IOError(std::string message);
Status UnimplementedError(std::string message);
Status ResourceExhaustedError(std::string message);
Status InternalError(std::string message);
Status PermissionDeniedError(std::string message);
Status UnavailableError(std::string message);

// Holds either a T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT: implicit by design.
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    if (status_.ok()) status_ = InternalError("Result constructed from an OK status");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const& { return status_; }
  Status status() && { return std::move(status_); }

  // Accessors; calling them on an error is a bug and aborts.
  T& value() & {
    Check();
    return *value_;
  }
  const T& value() const& {
    Check();
    return *value_;
  }
  T&& value() && {
    Check();
    return std::move(*value_);
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  void Check() const {
    if (!value_) std::abort();
  }
  Status status_;
  std::optional<T> value_;
};

}  // namespace tensorlift

#define TL_STATUS_CONCAT_INNER_(a, b) a##b
#define TL_STATUS_CONCAT_(a, b) TL_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (a Status) is not OK.
#define TL_RETURN_IF_ERROR(expr)              \
  do {                                        \
    ::tensorlift::Status tl_status_ = (expr); \
    if (!tl_status_.ok()) return tl_status_;  \
  } while (0)

// Evaluates `expr` (a Result<T>); on error returns its status, otherwise
// assigns (moves) the value to `lhs`, which may be a declaration.
#define TL_ASSIGN_OR_RETURN(lhs, expr) \
  TL_ASSIGN_OR_RETURN_IMPL_(TL_STATUS_CONCAT_(tl_result_, __LINE__), lhs, expr)
#define TL_ASSIGN_OR_RETURN_IMPL_(result, lhs, expr)   \
  auto result = (expr);                                \
  if (!result.ok()) return std::move(result).status(); \
  lhs = std::move(result).value()

#endif  // TENSORLIFT_STATUS_H_
