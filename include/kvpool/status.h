#pragma once
// Status and Result<T>: kvpool's one error type.
//
// Every fallible function returns a Status (or a Result<T> carrying either a
// value or a non-OK Status). No exception escapes kvpool code; errors coming
// from third-party libraries are converted at the boundary with one macro per
// library (see the KVPOOL_RETURN_IF_ERRNO family below and the library
// specific ones beside each backend), which records file and line.
//
// Both types are [[nodiscard]]: ignoring an error must be written out as
// `status.IgnoreError()`.
//
// Thread safety: values, freely copied; no shared state.
// This header is public (installed) and C++17-clean so CUDA sources may include it.
// Inside the repository include it as "common/status.h" or <kvpool/status.h>.

#include <cerrno>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace kvpool {

// Stable numeric values: they travel on the wire and through the C API.
enum class StatusCode : int {
  kOk = 0,
  kNotFound = 1,             // the key, session or thing asked for is absent (a miss)
  kInvalidArgument = 2,      // the caller asked for something malformed
  kAlreadyExists = 3,        // e.g. a key already committed
  kResourceExhausted = 4,    // a capacity, quota or size limit was hit
  kPermissionDenied = 5,     // wrong namespace, wrong secret
  kUnavailable = 6,          // the peer is down or the connection is gone
  kDeadlineExceeded = 7,     // a timeout expired
  kCorruption = 8,           // a checksum or format check failed
  kIoError = 9,              // the disk or the OS failed
  kAborted = 10,             // the operation was cancelled (e.g. shutdown)
  kInternal = 11,            // a bug: something that must never happen
  kUnimplemented = 12,       // not built into this binary (e.g. no CUDA)
  kFailedPrecondition = 13,  // the system is not in a state to do this
};

// Human name of a code, e.g. "NotFound".
const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status OK() { return Status(); }
  static Status NotFound(std::string m) { return Status(StatusCode::kNotFound, std::move(m)); }
  static Status InvalidArgument(std::string m) {
    return Status(StatusCode::kInvalidArgument, std::move(m));
  }
  static Status AlreadyExists(std::string m) {
    return Status(StatusCode::kAlreadyExists, std::move(m));
  }
  static Status ResourceExhausted(std::string m) {
    return Status(StatusCode::kResourceExhausted, std::move(m));
  }
  static Status PermissionDenied(std::string m) {
    return Status(StatusCode::kPermissionDenied, std::move(m));
  }
  static Status Unavailable(std::string m) {
    return Status(StatusCode::kUnavailable, std::move(m));
  }
  static Status DeadlineExceeded(std::string m) {
    return Status(StatusCode::kDeadlineExceeded, std::move(m));
  }
  static Status Corruption(std::string m) { return Status(StatusCode::kCorruption, std::move(m)); }
  static Status IoError(std::string m) { return Status(StatusCode::kIoError, std::move(m)); }
  static Status Aborted(std::string m) { return Status(StatusCode::kAborted, std::move(m)); }
  static Status Internal(std::string m) { return Status(StatusCode::kInternal, std::move(m)); }
  static Status Unimplemented(std::string m) {
    return Status(StatusCode::kUnimplemented, std::move(m));
  }
  static Status FailedPrecondition(std::string m) {
    return Status(StatusCode::kFailedPrecondition, std::move(m));
  }
  // From an errno value, e.g. Status::FromErrno(errno, "open /x").
  static Status FromErrno(int err, std::string_view context);

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  bool IsNotFound() const { return code_ == StatusCode::kNotFound; }

  // "NotFound: key 3eb9... is not cached" or "OK".
  std::string ToString() const;

  // Returns a copy whose message is prefixed with `context: `.
  Status WithContext(std::string_view context) const;

  // Explicitly drops an error the caller has decided not to act on.
  void IgnoreError() const {}

  bool operator==(const Status& o) const { return code_ == o.code_ && message_ == o.message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// A value or an error. Access to value() on an error is a bug and aborts.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    if (status_.ok()) status_ = Status::Internal("Result constructed from an OK status");
  }

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & {
    CheckOk();
    return *value_;
  }
  const T& value() const& {
    CheckOk();
    return *value_;
  }
  T&& value() && {
    CheckOk();
    return std::move(*value_);
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  void CheckOk() const;
  Status status_;
  std::optional<T> value_;
};

[[noreturn]] void AbortWithStatus(const Status& status, const char* file, int line);

template <typename T>
void Result<T>::CheckOk() const {
  if (!status_.ok()) AbortWithStatus(status_, __FILE__, __LINE__);
}

// "file.cc:123: " prefix for boundary conversions.
std::string SourceLocation(const char* file, int line);

}  // namespace kvpool

#define KVPOOL_CONCAT_INNER(a, b) a##b
#define KVPOOL_CONCAT(a, b) KVPOOL_CONCAT_INNER(a, b)

// Returns from the enclosing function if `expr` is a non-OK Status.
#define KVPOOL_RETURN_IF_ERROR(expr)         \
  do {                                       \
    ::kvpool::Status _kvpool_st = (expr);    \
    if (!_kvpool_st.ok()) return _kvpool_st; \
  } while (0)

// `KVPOOL_ASSIGN_OR_RETURN(auto x, Foo());` declares x from a Result or returns its error.
#define KVPOOL_ASSIGN_OR_RETURN(lhs, expr) \
  KVPOOL_ASSIGN_OR_RETURN_IMPL(KVPOOL_CONCAT(_kvpool_res_, __LINE__), lhs, expr)
#define KVPOOL_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()

// A syscall-style boundary: `KVPOOL_RETURN_IF_ERRNO(fd = open(...) , fd < 0, "open x")`
// returns Status::FromErrno with file and line when `failed` holds after `call`.
#define KVPOOL_RETURN_IF_ERRNO(call, failed, context)                             \
  do {                                                                            \
    call;                                                                         \
    if (failed) {                                                                 \
      int _kvpool_err = errno;                                                    \
      return ::kvpool::Status::FromErrno(                                         \
          _kvpool_err, ::kvpool::SourceLocation(__FILE__, __LINE__) + (context)); \
    }                                                                             \
  } while (0)

// Aborts with a reason when an invariant that must never break does.
#define KVPOOL_CHECK_OK(expr)                                                        \
  do {                                                                               \
    ::kvpool::Status _kvpool_st = (expr);                                            \
    if (!_kvpool_st.ok()) ::kvpool::AbortWithStatus(_kvpool_st, __FILE__, __LINE__); \
  } while (0)
