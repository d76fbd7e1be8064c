// CUDA build of kernels/device_copy.h: cudaMemcpyAsync on the caller's stream, and an event
// per Wait.

#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda_check.h"
#include "kernels/device_arena.h"
#include "kernels/device_copy.h"
#include "kernels/pinned_memory.h"

namespace kvpool::kernels {
namespace {

class CudaEngine final : public DeviceCopyEngine {
 public:
  Result<int> StreamDevice(void* stream) const override {
    const auto s = static_cast<cudaStream_t>(stream);
    if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return -1;
    int device = -1;
    const cudaError_t err = cudaStreamGetDevice(s, &device);
    if (err == cudaErrorNotSupported || err == cudaErrorCallRequiresNewerDriver) {
      cudaGetLastError();
      return -1;  // a driver before CUDA 12.8 cannot say
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      return Status::InvalidArgument(std::string("not a CUDA stream: ") + cudaGetErrorString(err));
    }
    return device;
  }

  int DeviceCount() const override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return n;
  }

  bool CanAccessPeer(int device, int peer) const override {
    if (device == peer) return false;
    int can = 0;
    if (cudaDeviceCanAccessPeer(&can, device, peer) != cudaSuccess) {
      cudaGetLastError();  // an ordinal this process does not have
      return false;
    }
    return can != 0;
  }

  Result<int> DeviceOf(const void* ptr) const override {
    cudaPointerAttributes attrs{};
    const cudaError_t err = cudaPointerGetAttributes(&attrs, ptr);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return Status::InvalidArgument(std::string("not a CUDA pointer: ") + cudaGetErrorString(err));
    }
    if (attrs.type != cudaMemoryTypeDevice) {
      return Status::InvalidArgument(
          attrs.type == cudaMemoryTypeManaged
              ? "managed memory is not a device buffer (kvpool copies to device memory only)"
              : "host memory passed as a device buffer");
    }
    return attrs.device;
  }

  Status CopyAsync(void* dst, const void* src, size_t bytes, CopyDirection direction,
                   void* stream) override {
    const cudaMemcpyKind kind = direction == CopyDirection::kHostToDevice ? cudaMemcpyHostToDevice
                                : direction == CopyDirection::kDeviceToHost
                                    ? cudaMemcpyDeviceToHost
                                    : cudaMemcpyDeviceToDevice;
    KVPOOL_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, static_cast<cudaStream_t>(stream)));
    return Status::OK();
  }

  Result<std::unique_ptr<ImportedSegment>> ImportSegment(int fd, uint64_t bytes,
                                                         int device) override {
    return ImportCudaSegment(fd, bytes, device);
  }

  Status Wait(void* stream) override {
    // On the stream itself: an event would have to be made on the stream's device.
    KVPOOL_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
    return Status::OK();
  }

  Result<void*> Mark(void* stream) override {
    cudaEvent_t event = nullptr;
    KVPOOL_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    const cudaError_t err = cudaEventRecord(event, static_cast<cudaStream_t>(stream));
    if (err != cudaSuccess) {
      cudaEventDestroy(event);
      return CudaErrorToStatus(err, "cudaEventRecord", __FILE__, __LINE__);
    }
    return static_cast<void*>(event);
  }

  Status WaitMarked(void* mark) override {
    const auto event = static_cast<cudaEvent_t>(mark);
    const cudaError_t err = cudaEventSynchronize(event);
    cudaEventDestroy(event);
    KVPOOL_CUDA_CHECK(err);
    return Status::OK();
  }

  std::shared_ptr<void> UseDevice(int device) override {
    if (device < 0) return nullptr;
    return std::shared_ptr<void>(new ScopedDevice(device),
                                 [](void* p) { delete static_cast<ScopedDevice*>(p); });
  }

  Result<std::vector<uint64_t>> DeviceChecksums(const ByteRange* ranges, size_t n,
                                                void* stream) override {
    return DeviceChecksumsCuda(ranges, n, stream);
  }

  Result<std::string> DeviceUuid(int device) const override {
    cudaDeviceProp prop{};
    KVPOOL_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    return std::string(prop.uuid.bytes, sizeof(prop.uuid.bytes));
  }
};

}  // namespace

Result<DeviceCopyEngine*> CudaCopyEngine() {
  if (!CudaDeviceAvailable()) return Status::Unavailable("no usable CUDA device in this process");
  static CudaEngine* engine = new CudaEngine();  // never destroyed: used until exit
  return static_cast<DeviceCopyEngine*>(engine);
}

}  // namespace kvpool::kernels
