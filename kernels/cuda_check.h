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

// Also resets the thread's last runtime error (cudaGetLastError), so a failure handled here does
// not fail the next launch check or checksum of this thread.
inline Status CudaErrorToStatus(cudaError_t err, const char* expr, const char* file, int line) {
  cudaGetLastError();
  StatusCode code = StatusCode::kInternal;
  switch (err) {
    case cudaErrorMemoryAllocation:
      code = StatusCode::kResourceExhausted;
      break;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorNotSupported:
    case cudaErrorNotPermitted:
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

// The driver function `name` as of its CUDA `version` ABI (e.g. 10020 for 10.2), handed out by
// the runtime (no link against libcuda); nullptr when this driver lacks it (the error cleared).
void* DriverEntryPoint(const char* name, unsigned version);

// The CUDA device whose memory `ptr` points into (device or managed memory); -1 for anything
// else. Kernels run on the device of their data, whatever device the calling thread has current.
int DeviceOfPointer(const void* ptr);

// Makes `device` current for a scope (nothing, for a device < 0), then puts back the CUDA context
// the thread had before (none, on a thread that had not used CUDA). Restoring by device instead
// (cudaSetDevice of what cudaGetDevice said) would create device 0's primary context, several
// hundred MiB, on every thread that had never chosen a device (kernels/cuda_context.cc).
class ScopedDevice {
 public:
  explicit ScopedDevice(int device);
  ~ScopedDevice();
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  bool ok() const { return ok_; }

 private:
  void* previous_context_ = nullptr;  // CUcontext
  bool restore_context_ = false;      // previous_context_ was read
  int previous_device_ = -1;          // without the driver's context calls: the device before
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

// Before a <<<>>> launch: drops an error an earlier runtime call of this thread left behind (one
// handled without KVPOOL_CUDA_CHECK), so the check after the launch reports the launch's own.
#define KVPOOL_CUDA_CLEAR_STALE_ERROR() static_cast<void>(cudaGetLastError())
// After a <<<>>> launch: reports a bad configuration or a missing device.
#define KVPOOL_CUDA_CHECK_LAUNCH() KVPOOL_CUDA_CHECK(cudaGetLastError())
