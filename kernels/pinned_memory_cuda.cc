// CUDA build of kernels/pinned_memory.h.

#include <cuda_runtime.h>

#include <atomic>
#include <cstdio>
#include <string>

#include "kernels/cuda_check.h"
#include "kernels/pinned_memory.h"

namespace kvpool::kernels {

bool CudaDeviceAvailable() {
  // 0 unknown, 1 yes, 2 no. Relaxed: a cached, idempotent answer.
  static std::atomic<int> state{0};
  int s = state.load(std::memory_order_relaxed);
  if (s == 0) {
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    s = (err == cudaSuccess && n > 0) ? 1 : 2;
    if (err != cudaSuccess) cudaGetLastError();  // clear the sticky error
    state.store(s, std::memory_order_relaxed);
  }
  return s == 1;
}

Status RegisterHostMemory(void* data, size_t length, bool read_only, int device) {
  if (!CudaDeviceAvailable()) return Status::Unavailable("no usable CUDA device");
  const ScopedDevice on(device);
  if (!on.ok()) return Status::InvalidArgument("no CUDA device " + std::to_string(device));
  if (read_only) {
    int current = 0, supported = 0;
    if (cudaGetDevice(&current) != cudaSuccess ||
        cudaDeviceGetAttribute(&supported, cudaDevAttrHostRegisterReadOnlySupported, current) !=
            cudaSuccess) {
      cudaGetLastError();
    }
    if (supported == 0) {
      return Status::Unavailable(
          "this system cannot pin read-only host memory (cudaDevAttrHostRegisterReadOnlySupported "
          "is 0): copies from the mapping are staged by CUDA");
    }
  }
  const unsigned flags = cudaHostRegisterPortable | (read_only ? cudaHostRegisterReadOnly : 0u);
  const cudaError_t err = cudaHostRegister(data, length, flags);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return Status::Internal(std::string("cudaHostRegister: ") + cudaGetErrorString(err));
  }
  return Status::OK();
}

void UnregisterHostMemory(void* data, int device) {
  if (!CudaDeviceAvailable()) return;
  const ScopedDevice on(device);
  if (cudaHostUnregister(data) != cudaSuccess) cudaGetLastError();
}

}  // namespace kvpool::kernels
