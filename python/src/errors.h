#pragma once
// kvpool::Status at the Python boundary: one exception class per StatusCode under kvpool.Error
// (as pyarrow's error.pxi does), each instance carrying `code` (StatusCodeName) and `message`.
//
// Thread safety: call with the GIL held.

#include <nanobind/nanobind.h>

#include <kvpool/status.h>

#include <string>
#include <string_view>

namespace kvpool::py {

namespace nb = nanobind;

// A Python str from bytes that should be UTF-8 (invalid sequences become U+FFFD).
inline nb::str Text(std::string_view s) {
  return nb::steal<nb::str>(
      PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace"));
}

// Creates kvpool.Error and its subclasses in `m`.
void RegisterErrors(nb::module_& m);

// An exception instance (not raised) for a non-OK status.
nb::object ErrorObject(const Status& status);

// Raises the status's exception class: sets the Python error and throws nb::python_error.
[[noreturn]] void Raise(const Status& status);
[[noreturn]] void RaiseInvalid(const std::string& message);

inline void Check(const Status& status) {
  if (!status.ok()) Raise(status);
}

template <typename T>
T Unwrap(Result<T>&& result) {
  if (!result.ok()) Raise(result.status());
  return std::move(result).value();
}

}  // namespace kvpool::py
