// CUDA build of the device checksum (kernels/device_checksum.h).
//
// Budget: memory bound; one read of the bytes. Mapping: one thread per 4 KiB chunk (XXH64 over
// its chunk, 32 bytes a step: each step of a warp reads 32 whole sectors), then one thread per
// block combining its chunk values. A launch covers up to 64 blocks (their pointers, sizes and
// first chunks travel as kernel parameters); the chunk values live in a stream-ordered scratch
// allocation. Timed beside a device-to-device copy of the same bytes by kvpool-kernel-check.

#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda_check.h"
#include "kernels/device_checksum.h"
#include "kernels/xxh64_inline.h"

namespace kvpool {
namespace kernels {
namespace {

constexpr int kRangesPerLaunch = 64;
constexpr int kThreads = 256;

struct ChecksumArgs {
  const uint8_t* data[kRangesPerLaunch];
  uint64_t size[kRangesPerLaunch];
  uint32_t first_chunk[kRangesPerLaunch + 1];  // prefix sums of the chunk counts
  int n;
};

__global__ void ChunkHashes(ChecksumArgs args, uint64_t* chunk_hashes) {
  const uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= args.first_chunk[args.n]) return;
  // The range this chunk belongs to: the last whose first chunk is <= t.
  int lo = 0;
  int hi = args.n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (args.first_chunk[mid] <= t) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const uint64_t off = uint64_t{t - args.first_chunk[lo]} * kDeviceChecksumChunkBytes;
  const uint64_t left = args.size[lo] - off;
  const size_t len = left < kDeviceChecksumChunkBytes ? left : kDeviceChecksumChunkBytes;
  chunk_hashes[t] = xxh64::Hash(args.data[lo] + off, len, 0);
}

__global__ void CombineChunks(ChecksumArgs args, const uint64_t* chunk_hashes, uint64_t* out) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= args.n) return;
  const uint32_t first = args.first_chunk[b];
  const uint32_t count = args.first_chunk[b + 1] - first;
  out[b] = xxh64::Hash(reinterpret_cast<const uint8_t*>(chunk_hashes + first),
                       size_t{count} * sizeof(uint64_t), args.size[b]);
}

Status RunLaunch(const ChecksumArgs& args, cudaStream_t stream, uint64_t* host_out) {
  const uint32_t chunks = args.first_chunk[args.n];
  uint64_t* scratch = nullptr;  // chunk values, then the n results after them
  const size_t bytes = (size_t{chunks} + args.n) * sizeof(uint64_t);
  // Stream-ordered where the device has memory pools; a plain allocation where it has not.
  bool pooled = cudaMallocAsync(&scratch, bytes, stream) == cudaSuccess;
  if (!pooled) {
    cudaGetLastError();
    KVPOOL_CUDA_CHECK(cudaMalloc(&scratch, bytes));
  }
  uint64_t* results = scratch + chunks;
  KVPOOL_CUDA_CLEAR_STALE_ERROR();  // the launch check below must see only these launches' errors
  if (chunks > 0) {
    ChunkHashes<<<(chunks + kThreads - 1) / kThreads, kThreads, 0, stream>>>(args, scratch);
  }
  CombineChunks<<<1, kRangesPerLaunch, 0, stream>>>(args, scratch, results);
  cudaError_t launched = cudaGetLastError();
  cudaError_t copied = launched == cudaSuccess
                           ? cudaMemcpyAsync(host_out, results, args.n * sizeof(uint64_t),
                                             cudaMemcpyDeviceToHost, stream)
                           : launched;
  const cudaError_t freed = pooled ? cudaFreeAsync(scratch, stream) : cudaSuccess;
  const cudaError_t synced = cudaStreamSynchronize(stream);
  if (!pooled) cudaFree(scratch);  // after the kernels that use it
  KVPOOL_CUDA_CHECK(copied);
  KVPOOL_CUDA_CHECK(freed);
  KVPOOL_CUDA_CHECK(synced);
  return Status::OK();
}

}  // namespace

Result<std::vector<uint64_t>> DeviceChecksumsCuda(const ByteRange* ranges, size_t n, void* stream) {
  std::vector<uint64_t> out(n);
  if (n == 0) return out;
  // On the current device, the caller's: a range's own device may be a peer whose memory is
  // mapped for this one only (an imported gpu segment), where a kernel of that peer would fault.
  int device = -1;
  KVPOOL_CUDA_CHECK(cudaGetDevice(&device));
  for (size_t i = 0; i < n; ++i) {
    cudaPointerAttributes attrs{};
    if (cudaPointerGetAttributes(&attrs, ranges[i].data) != cudaSuccess ||
        attrs.type != cudaMemoryTypeDevice) {
      cudaGetLastError();
      return Status::InvalidArgument("device checksum of memory that is not device memory");
    }
    int reaches = 0;
    if (attrs.device != device &&
        (cudaDeviceCanAccessPeer(&reaches, device, attrs.device) != cudaSuccess || reaches == 0)) {
      cudaGetLastError();
      return Status::InvalidArgument("device checksum on CUDA device " + std::to_string(device) +
                                     " of memory on device " + std::to_string(attrs.device) +
                                     ", which it does not reach");
    }
  }
  const auto s = static_cast<cudaStream_t>(stream);
  for (size_t start = 0; start < n; start += kRangesPerLaunch) {
    ChecksumArgs args{};
    args.n = static_cast<int>(n - start < kRangesPerLaunch ? n - start : kRangesPerLaunch);
    uint64_t chunks = 0;
    for (int i = 0; i < args.n; ++i) {
      const ByteRange& r = ranges[start + i];
      args.data[i] = static_cast<const uint8_t*>(r.data);
      args.size[i] = r.size;
      args.first_chunk[i] = static_cast<uint32_t>(chunks);
      chunks += (r.size + kDeviceChecksumChunkBytes - 1) / kDeviceChecksumChunkBytes;
      if (chunks > UINT32_MAX / 2) {
        return Status::InvalidArgument("device checksum batch too large");
      }
    }
    args.first_chunk[args.n] = static_cast<uint32_t>(chunks);
    KVPOOL_RETURN_IF_ERROR(RunLaunch(args, s, out.data() + start));
  }
  return out;
}

}  // namespace kernels
}  // namespace kvpool
