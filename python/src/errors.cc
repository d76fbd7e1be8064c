#include "errors.h"

#include <array>

namespace kvpool::py {
namespace {

constexpr int kNumCodes = 14;  // kOk .. kFailedPrecondition

// Class per code; [0] (kOk) is the base kvpool.Error. Owned by the module (kept alive there).
std::array<PyObject*, kNumCodes> g_classes{};

const char* Doc(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "Base of every kvpool error. `code` is the status code's name, `message` the "
             "daemon's or the library's explanation.";
    case StatusCode::kNotFound:
      return "The key, session or thing asked for is absent (a miss).";
    case StatusCode::kInvalidArgument:
      return "The caller asked for something malformed (bad key, too small a buffer, a shape "
             "that does not match).";
    case StatusCode::kAlreadyExists:
      return "The thing already exists.";
    case StatusCode::kResourceExhausted:
      return "A capacity, quota or size limit was hit.";
    case StatusCode::kPermissionDenied:
      return "Wrong namespace or secret.";
    case StatusCode::kUnavailable:
      return "The daemon is down or the connection is gone; a later call reconnects.";
    case StatusCode::kDeadlineExceeded:
      return "The call's deadline (Client timeout) expired.";
    case StatusCode::kCorruption:
      return "A checksum or format check failed.";
    case StatusCode::kIoError:
      return "The disk or the OS failed.";
    case StatusCode::kAborted:
      return "The operation was cancelled (e.g. the daemon is shutting down).";
    case StatusCode::kInternal:
      return "A bug in kvpool: something that must never happen.";
    case StatusCode::kUnimplemented:
      return "Not built into this binary (e.g. CUDA kernels in a build without CUDA).";
    case StatusCode::kFailedPrecondition:
      return "The system is not in a state to do this (e.g. saving a session whose blocks are "
             "not cached).";
  }
  return "";
}

PyObject* ClassFor(StatusCode code) {
  const int i = static_cast<int>(code);
  if (i <= 0 || i >= kNumCodes) return g_classes[static_cast<int>(StatusCode::kInternal)];
  return g_classes[i];
}

}  // namespace

void RegisterErrors(nb::module_& m) {
  for (int i = 0; i < kNumCodes; ++i) {
    const auto code = static_cast<StatusCode>(i);
    const std::string name = i == 0 ? "Error" : StatusCodeName(code);
    const std::string qualified = "kvpool." + name;
    PyObject* base = i == 0 ? PyExc_Exception : g_classes[0];
    PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), Doc(code), base, nullptr);
    if (cls == nullptr) throw nb::python_error();
    // Defaults, so that an instance made from Python (`kvpool.NotFound("x")`) has both too.
    PyObject_SetAttrString(cls, "code", nb::str(i == 0 ? "Unknown" : name.c_str()).ptr());
    PyObject_SetAttrString(cls, "message", nb::str("").ptr());
    m.attr(name.c_str()) = nb::handle(cls);  // the module holds the reference from here
    g_classes[i] = cls;
    Py_DECREF(cls);
  }
}

nb::object ErrorObject(const Status& status) {
  PyObject* cls = ClassFor(status.code());
  nb::object exc = nb::borrow(cls)(Text(status.message()));
  exc.attr("code") = nb::str(StatusCodeName(status.code()));
  exc.attr("message") = Text(status.message());
  return exc;
}

void Raise(const Status& status) {
  nb::object exc = ErrorObject(status);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw nb::python_error();
}

void RaiseInvalid(const std::string& message) { Raise(Status::InvalidArgument(message)); }

}  // namespace kvpool::py
