// The driver's entry points and the thread's CUDA context: DriverEntryPoint, ScopedDevice and
// DeviceOfPointer (kernels/cuda_check.h), CudaContextCurrent (kernels/pinned_memory.h). The
// context is read and restored through the driver's cuCtxGetCurrent and cuCtxSetCurrent.

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "kernels/cuda_check.h"
#include "kernels/pinned_memory.h"

namespace kvpool::kernels {
namespace {

struct ContextCalls {
  PFN_cuCtxGetCurrent_v4000 get = nullptr;
  PFN_cuCtxSetCurrent_v4000 set = nullptr;
};

const ContextCalls& Calls() {
  static const ContextCalls calls = [] {
    ContextCalls c;
    c.get = reinterpret_cast<PFN_cuCtxGetCurrent_v4000>(DriverEntryPoint("cuCtxGetCurrent", 4000));
    c.set = reinterpret_cast<PFN_cuCtxSetCurrent_v4000>(DriverEntryPoint("cuCtxSetCurrent", 4000));
    if (c.get == nullptr || c.set == nullptr) c = ContextCalls{};
    return c;
  }();
  return calls;
}

}  // namespace

void* DriverEntryPoint(const char* name, unsigned version) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return fn;
}

bool CudaContextCurrent() {
  const ContextCalls& calls = Calls();
  CUcontext current = nullptr;
  return calls.get != nullptr && calls.get(&current) == CUDA_SUCCESS && current != nullptr;
}

int DeviceOfPointer(const void* ptr) {
  cudaPointerAttributes attrs{};
  if (cudaPointerGetAttributes(&attrs, ptr) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return attrs.type == cudaMemoryTypeDevice || attrs.type == cudaMemoryTypeManaged ? attrs.device
                                                                                   : -1;
}

ScopedDevice::ScopedDevice(int device) {
  if (device < 0) {
    ok_ = true;
    return;
  }
  const ContextCalls& calls = Calls();
  CUcontext current = nullptr;
  if (calls.get != nullptr && calls.get(&current) == CUDA_SUCCESS) {
    previous_context_ = current;
    restore_context_ = true;
  } else if (cudaGetDevice(&previous_device_) != cudaSuccess) {
    cudaGetLastError();
    previous_device_ = -1;
  }
  ok_ = cudaSetDevice(device) == cudaSuccess;
  if (!ok_) cudaGetLastError();
}

ScopedDevice::~ScopedDevice() {
  if (restore_context_) {
    Calls().set(static_cast<CUcontext>(previous_context_));
  } else if (previous_device_ >= 0 && cudaSetDevice(previous_device_) != cudaSuccess) {
    cudaGetLastError();
  }
}

}  // namespace kvpool::kernels
