// The thread's CUDA context: ScopedDevice and DeviceOfPointer (kernels/cuda_check.h),
// CudaContextCurrent (kernels/pinned_memory.h). The context is read and restored through the
// driver's cuCtxGetCurrent and cuCtxSetCurrent, which the runtime hands out as entry points (no
// link against libcuda).

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

template <typename F>
F Load(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &fn, 4000, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return reinterpret_cast<F>(fn);
}

const ContextCalls& Calls() {
  static const ContextCalls calls = [] {
    ContextCalls c;
    c.get = Load<PFN_cuCtxGetCurrent_v4000>("cuCtxGetCurrent");
    c.set = Load<PFN_cuCtxSetCurrent_v4000>("cuCtxSetCurrent");
    if (c.get == nullptr || c.set == nullptr) c = ContextCalls{};
    return c;
  }();
  return calls;
}

}  // namespace

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
