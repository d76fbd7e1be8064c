// The CUDA entry points when kvpool is built without CUDA (KVPOOL_WITH_CUDA=OFF or no nvcc):
// each returns Unimplemented so callers link and fail cleanly at run time.

#include <string>

#include "kernels/compress.h"
#include "kernels/device_arena.h"
#include "kernels/device_checksum.h"
#include "kernels/device_copy.h"
#include "kernels/paged_copy.h"
#include "kernels/pinned_memory.h"
#include "kernels/quantize.h"

namespace kvpool {
namespace kernels {
namespace {
Status NoCuda(const char* what) {
  return Status::Unimplemented(std::string(what) + ": kvpool was built without CUDA");
}
}  // namespace

Result<std::vector<uint64_t>> DeviceChecksumsCuda(const ByteRange*, size_t, void*) {
  return NoCuda("DeviceChecksumsCuda");
}
Status GatherPagedCuda(const PagedKvCache&, const BlockLayout&, const PagedSpan&, void* const*,
                       void*) {
  return NoCuda("GatherPagedCuda");
}
Status ScatterPagedCuda(const PagedKvCache&, const BlockLayout&, const PagedSpan&,
                        const void* const*, void*) {
  return NoCuda("ScatterPagedCuda");
}
Status QuantizeBlocksCuda(const BlockLayout&, const void* const*, void* const*, int, void*) {
  return NoCuda("QuantizeBlocksCuda");
}
Status DequantizeBlocksCuda(const BlockLayout&, const void* const*, void* const*, int, void*) {
  return NoCuda("DequantizeBlocksCuda");
}

Status ComputeScoresCuda(const CompressParams&, const AttentionShape&, const void*, const void*,
                         float*, void*) {
  return NoCuda("ComputeScoresCuda");
}
Status SelectTokensCuda(const CompressParams&, const AttentionShape&, const float*, int32_t*,
                        void*) {
  return NoCuda("SelectTokensCuda");
}
Status CompactKvCuda(const AttentionShape&, const int*, const int32_t*, const void*, void*, void*) {
  return NoCuda("CompactKvCuda");
}

bool CudaDeviceAvailable() { return false; }
Status RegisterHostMemory(void*, size_t, bool, int) { return NoCuda("RegisterHostMemory"); }
bool CudaContextCurrent() { return false; }
void UnregisterHostMemory(void*, int) {}
Result<DeviceCopyEngine*> CudaCopyEngine() { return NoCuda("CudaCopyEngine"); }
Result<std::unique_ptr<DeviceArena>> CreateCudaDeviceArena(int, uint64_t, uint32_t) {
  return NoCuda("CreateCudaDeviceArena");
}
Result<std::unique_ptr<ImportedSegment>> ImportCudaSegment(int, uint64_t, int) {
  return NoCuda("ImportCudaSegment");
}

}  // namespace kernels
}  // namespace kvpool
