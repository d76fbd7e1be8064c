#pragma once
// Page-locking host memory for CUDA: registering the host arena (daemon) and a client's
// mappings of it (client) with the CUDA driver makes them pinned memory, so a copy between a
// block and GPU memory is one cudaMemcpyAsync at full PCIe/NVLink speed with no staging buffer.
//
// Without a usable GPU (no device, no driver, or a build without CUDA) registration returns
// Unavailable or Unimplemented once and callers go on unpinned: the data path works either way.
//
// Thread safety: safe from any thread (the CUDA runtime serializes registration).

#include <cstddef>

#include "common/status.h"

namespace kvpool::kernels {

// True when a CUDA device is usable in this process (cached after the first call).
bool CudaDeviceAvailable();
// cudaHostRegister(data, length, portable; read-only for a PROT_READ mapping), with CUDA device
// `device` current (>= 0; the thread's own current device otherwise, device 0 on a thread that
// chose none: registering creates that device's context). Unavailable without a device, or for
// read-only memory on a system that cannot pin it read-only; Unimplemented in a build without
// CUDA; Internal with CUDA's reason otherwise.
Status RegisterHostMemory(void* data, size_t length, bool read_only = false, int device = -1);
// True when the calling thread has a CUDA context current (it has used CUDA): registering memory
// from it then creates no context. False without CUDA.
bool CudaContextCurrent();
// Undoes RegisterHostMemory (before unmapping), with `device` current as there. No-op when it
// was not registered.
void UnregisterHostMemory(void* data, int device = -1);

}  // namespace kvpool::kernels
