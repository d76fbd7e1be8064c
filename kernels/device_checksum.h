#pragma once
// kvpool's device checksum: the check value of a block copy in GPU memory, which a GPU computes
// in parallel. A block's own checksum (xxh3-64 over all of its bytes, common/checksum.h) is one
// sequential pass, which a GPU cannot spread over its threads; this one splits the block into
// fixed chunks a thread each:
//
//   dsum(b) = XXH64(c_0 || c_1 || ... || c_{k-1}, seed = len(b)),
//   c_i     = XXH64(b[i*4096 : (i+1)*4096], seed = 0)   (the last chunk may be shorter),
//
// the c_i as 8 little-endian bytes each; a 0-byte block has k = 0. It does not replace the
// block's checksum (blocks on disk and in host keep xxh3-64, so every block ever stored stays
// readable as it was): the daemon computes it for a gpu copy when it makes one (on the GPU, and
// from the verified host source on the CPU, and the two must agree), and a reader that copies
// the gpu copy device to device checks its destination against it on its own GPU.
//
// The CPU twin here and the CUDA kernel (device_checksum.cu) share the XXH64 code
// (kernels/xxh64_inline.h). A DeviceCopyEngine computes it on device memory
// (DeviceCopyEngine::DeviceChecksums).
//
// Thread safety: pure functions; DeviceChecksumsCuda as the CUDA runtime.
//
// C++17-clean (included by device_checksum.cu).

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/status.h"

namespace kvpool::kernels {

constexpr size_t kDeviceChecksumChunkBytes = 4096;

// One buffer to checksum.
struct ByteRange {
  const void* data = nullptr;
  size_t size = 0;
};

// The CPU twin: dsum of `size` host bytes.
uint64_t DeviceChecksumCpu(const void* data, size_t size);

// dsum of each of the `n` ranges of device memory, computed by a kernel on the calling thread's
// current CUDA device after the work queued on `stream` (a cudaStream_t of that device; nullptr:
// its legacy default stream); returns once they are known. The current device must reach every
// range: its own memory, or a peer's mapped for it (a gpu segment imported for this device).
// InvalidArgument when a range is not device memory or lies on a device the current one cannot
// reach peer to peer; Internal with CUDA's reason when the kernel failed; Unimplemented in a
// build without CUDA.
Result<std::vector<uint64_t>> DeviceChecksumsCuda(const ByteRange* ranges, size_t n, void* stream);

}  // namespace kvpool::kernels
