#pragma once
// KVPOOL_CUDA_CHECK: converts a cudaError_t into a kvpool::Status carrying the expression, file
// and line, at the CUDA boundary. Used only by kernels/*.cu and the GPU check tools.
//
// Thread safety: stateless.

#include <cuda_runtime.h>

#include <string>

#include "common/status.h"

namespace kvpool {
namespace kernels {

inline Status CudaErrorToStatus(cudaError_t err, const char* expr, const char* file, int line) {
  StatusCode code = StatusCode::kInternal;
  switch (err) {
    case cudaErrorMemoryAllocation:
      code = StatusCode::kResourceExhausted;
      break;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
      code = StatusCode::kUnavailable;
      break;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidConfiguration:
      code = StatusCode::kInvalidArgument;
      break;
    default:
      break;
  }
  return Status(code, SourceLocation(file, line) + expr + ": " + cudaGetErrorName(err) + " (" +
                          cudaGetErrorString(err) + ")");
}

// Makes `device` current for a scope and restores the one before.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    ok_ = cudaSetDevice(device) == cudaSuccess;
  }
  ~ScopedDevice() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  bool ok() const { return ok_; }

 private:
  int previous_ = -1;
  bool ok_ = false;
};

}  // namespace kernels
}  // namespace kvpool

// Returns the converted Status from the enclosing function when `expr` is not cudaSuccess.
#define KVPOOL_CUDA_CHECK(expr)                                                                 \
  do {                                                                                          \
    const cudaError_t _kvpool_cuda_err = (expr);                                                \
    if (_kvpool_cuda_err != cudaSuccess) {                                                      \
      return ::kvpool::kernels::CudaErrorToStatus(_kvpool_cuda_err, #expr, __FILE__, __LINE__); \
    }                                                                                           \
  } while (0)

// After a <<<>>> launch: reports a bad configuration or a missing device.
#define KVPOOL_CUDA_CHECK_LAUNCH() KVPOOL_CUDA_CHECK(cudaGetLastError())
