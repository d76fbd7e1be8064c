// CUDA build of kernels/device_arena.h: CUDA virtual memory management through driver entry
// points the runtime hands out (no link against libcuda).

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "kernels/cuda_check.h"
#include "kernels/device_arena.h"
#include "kernels/pinned_memory.h"

namespace kvpool::kernels {
namespace {

// The arena's copies: on its device, and on its own copy stream when the caller names none.
class ArenaCopies final : public DeviceCopyEngine {
 public:
  ArenaCopies(DeviceCopyEngine& base, int device) : base_(base), device_(device) {}
  ~ArenaCopies() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  Status Init() {
    ScopedDevice on(device_);
    KVPOOL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    return Status::OK();
  }

  Result<int> DeviceOf(const void* ptr) const override { return base_.DeviceOf(ptr); }
  Result<std::string> DeviceUuid(int device) const override { return base_.DeviceUuid(device); }
  int DeviceCount() const override { return base_.DeviceCount(); }
  bool CanAccessPeer(int device, int peer) const override {
    return base_.CanAccessPeer(device, peer);
  }
  Status CopyAsync(void* dst, const void* src, size_t bytes, CopyDirection direction,
                   void* stream) override {
    ScopedDevice on(device_);
    return base_.CopyAsync(dst, src, bytes, direction, stream != nullptr ? stream : stream_);
  }
  Status Wait(void* stream) override {
    ScopedDevice on(device_);
    return base_.Wait(stream != nullptr ? stream : stream_);
  }
  Result<std::vector<uint64_t>> DeviceChecksums(const ByteRange* ranges, size_t n,
                                                void* stream) override {
    ScopedDevice on(device_);
    return base_.DeviceChecksums(ranges, n, stream != nullptr ? stream : stream_);
  }
  Result<void*> Mark(void* stream) override {
    ScopedDevice on(device_);
    return base_.Mark(stream != nullptr ? stream : stream_);
  }
  Status WaitMarked(void* mark) override { return base_.WaitMarked(mark); }
  std::shared_ptr<void> UseDevice(int device) override { return base_.UseDevice(device); }
  Result<std::unique_ptr<ImportedSegment>> ImportSegment(int fd, uint64_t bytes,
                                                         int device) override {
    return base_.ImportSegment(fd, bytes, device);
  }

 private:
  DeviceCopyEngine& base_;
  const int device_;
  cudaStream_t stream_ = nullptr;
};

// The driver's virtual memory management calls, as of their CUDA 10.2 ABI.
struct Vmm {
  PFN_cuMemGetAllocationGranularity_v10020 granularity = nullptr;
  PFN_cuMemAddressReserve_v10020 reserve = nullptr;
  PFN_cuMemAddressFree_v10020 address_free = nullptr;
  PFN_cuMemCreate_v10020 create = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  PFN_cuMemSetAccess_v10020 set_access = nullptr;
  PFN_cuMemExportToShareableHandle_v10020 export_handle = nullptr;
  PFN_cuMemImportFromShareableHandle_v10020 import_handle = nullptr;

  template <typename F>
  static Status Load(const char* name, F* out) {
    void* fn = DriverEntryPoint(name, 10020);
    if (fn == nullptr) return Status::Unavailable(std::string("the CUDA driver has no ") + name);
    *out = reinterpret_cast<F>(fn);
    return Status::OK();
  }

  Status LoadAll() {
    KVPOOL_RETURN_IF_ERROR(Load("cuMemGetAllocationGranularity", &granularity));
    KVPOOL_RETURN_IF_ERROR(Load("cuMemAddressReserve", &reserve));
    KVPOOL_RETURN_IF_ERROR(Load("cuMemAddressFree", &address_free));
    KVPOOL_RETURN_IF_ERROR(Load("cuMemCreate", &create));
    KVPOOL_RETURN_IF_ERROR(Load("cuMemRelease", &release));
    KVPOOL_RETURN_IF_ERROR(Load("cuMemMap", &map));
    KVPOOL_RETURN_IF_ERROR(Load("cuMemUnmap", &unmap));
    KVPOOL_RETURN_IF_ERROR(Load("cuMemSetAccess", &set_access));
    KVPOOL_RETURN_IF_ERROR(Load("cuMemImportFromShareableHandle", &import_handle));
    return Load("cuMemExportToShareableHandle", &export_handle);
  }
};

Status DriverStatus(CUresult r, const std::string& what) {
  if (r == CUDA_SUCCESS) return Status::OK();
  // Not supported or not permitted: a GPU or driver without virtual memory management or
  // shareable handles (some vGPU setups), which device_arena.h reports as Unavailable.
  const StatusCode code = r == CUDA_ERROR_OUT_OF_MEMORY ? StatusCode::kResourceExhausted
                          : r == CUDA_ERROR_NOT_SUPPORTED || r == CUDA_ERROR_NOT_PERMITTED
                              ? StatusCode::kUnavailable
                              : StatusCode::kInternal;
  return Status(code, what + ": CUDA driver error " + std::to_string(static_cast<int>(r)));
}

class CudaDeviceArena final : public DeviceArena {
 public:
  CudaDeviceArena(Vmm vmm, int device, uint64_t segment_bytes, uint32_t segment_count,
                  DeviceCopyEngine* copies)
      : vmm_(vmm),
        device_(device),
        segment_bytes_(segment_bytes),
        segment_count_(segment_count),
        copies_(*copies, device),
        handles_(segment_count, 0) {
    prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop_.location.id = device;
    prop_.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  }

  ~CudaDeviceArena() override {
    // Nothing may still run on the segments when they go: the copies (the tier's workers have
    // waited for theirs) and the zeroing.
    if (zero_stream_ != nullptr) {
      ScopedDevice on(device_);
      if (cudaStreamSynchronize(zero_stream_) != cudaSuccess ||
          cudaStreamDestroy(zero_stream_) != cudaSuccess) {
        cudaGetLastError();
      }
    }
    static_cast<void>(copies_.Wait(nullptr));
    for (uint32_t i = 0; i < segment_count_; ++i) {
      if (handles_[i] == 0) continue;
      vmm_.unmap(Address(i), segment_bytes_);
      vmm_.release(handles_[i]);
    }
    if (base_ != 0) vmm_.address_free(base_, segment_bytes_ * segment_count_);
  }

  Status Init() {
    KVPOOL_CUDA_CHECK(cudaSetDevice(device_));
    KVPOOL_CUDA_CHECK(cudaFree(nullptr));  // the primary context
    KVPOOL_RETURN_IF_ERROR(copies_.Init());
    size_t granularity = 0;
    KVPOOL_RETURN_IF_ERROR(DriverStatus(
        vmm_.granularity(&granularity, &prop_, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "granularity"));
    if (granularity == 0 || segment_bytes_ % granularity != 0) {
      return Status::InvalidArgument("gpu segment size " + std::to_string(segment_bytes_) +
                                     " is not a multiple of device " + std::to_string(device_) +
                                     "'s allocation granularity (" + std::to_string(granularity) +
                                     " bytes)");
    }
    KVPOOL_RETURN_IF_ERROR(
        DriverStatus(vmm_.reserve(&base_, segment_bytes_ * segment_count_, granularity, 0, 0),
                     "reserving the gpu arena's addresses"));
    // Every device this one can reach peer to peer may read and write the arena (a client copies
    // to its own GPU); the arena's device always.
    int devices = 0;
    KVPOOL_CUDA_CHECK(cudaGetDeviceCount(&devices));
    for (int d = 0; d < devices; ++d) {
      int can = d == device_;
      if (d != device_ && cudaDeviceCanAccessPeer(&can, d, device_) != cudaSuccess) can = 0;
      if (!can) continue;
      CUmemAccessDesc a{};
      a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      a.location.id = d;
      a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      access_.push_back(a);
    }
    cudaGetLastError();
    KVPOOL_CUDA_CHECK(cudaStreamCreateWithFlags(&zero_stream_, cudaStreamNonBlocking));
    for (uint32_t i = 0; i < segment_count_; ++i) KVPOOL_RETURN_IF_ERROR(Renew(i));
    return Status::OK();
  }

  int device() const override { return device_; }
  uint8_t* base() const override { return reinterpret_cast<uint8_t*>(base_); }
  uint64_t segment_bytes() const override { return segment_bytes_; }
  uint32_t segment_count() const override { return segment_count_; }
  DeviceCopyEngine& copies() override { return copies_; }

  Status Renew(uint32_t index) override {
    const CUdeviceptr at = Address(index);
    // The old allocation goes first (it lives on while a client maps it), so a renewal never
    // needs a segment of free device memory beside the arena.
    if (handles_[index] != 0) {
      vmm_.unmap(at, segment_bytes_);
      vmm_.release(handles_[index]);
      handles_[index] = 0;
    }
    CUmemGenericAllocationHandle fresh = 0;
    KVPOOL_RETURN_IF_ERROR(DriverStatus(vmm_.create(&fresh, segment_bytes_, &prop_, 0),
                                        "allocating gpu segment " + std::to_string(index)));
    Status st = DriverStatus(vmm_.map(at, segment_bytes_, 0, fresh, 0), "mapping gpu segment");
    if (st.ok()) {
      st = DriverStatus(vmm_.set_access(at, segment_bytes_, access_.data(), access_.size()),
                        "granting access to gpu segment");
    }
    if (st.ok()) {
      // Fresh physical memory may hold what this process freed before: another namespace's
      // blocks. Not zeroed, it is not handed out (ExportSegment refuses a segment without one).
      ScopedDevice on(device_);
      cudaError_t err =
          cudaMemsetAsync(reinterpret_cast<void*>(at), 0, segment_bytes_, zero_stream_);
      if (err == cudaSuccess) err = cudaStreamSynchronize(zero_stream_);
      if (err != cudaSuccess) {
        cudaGetLastError();
        st = Status::Internal("zeroing gpu segment " + std::to_string(index) + ": " +
                              cudaGetErrorString(err));
      }
    }
    if (!st.ok()) {
      vmm_.unmap(at, segment_bytes_);
      vmm_.release(fresh);
      return st;
    }
    handles_[index] = fresh;
    return Status::OK();
  }

  Result<int> ExportSegment(uint32_t index) override {
    if (index >= segment_count_ || handles_[index] == 0) {
      return Status::InvalidArgument("no gpu segment " + std::to_string(index));
    }
    int fd = -1;
    KVPOOL_RETURN_IF_ERROR(DriverStatus(
        vmm_.export_handle(&fd, handles_[index], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
        "exporting gpu segment " + std::to_string(index)));
    return fd;
  }

 private:
  CUdeviceptr Address(uint32_t index) const {
    return base_ + static_cast<CUdeviceptr>(index) * segment_bytes_;
  }

  const Vmm vmm_;
  const int device_;
  const uint64_t segment_bytes_;
  const uint32_t segment_count_;
  ArenaCopies copies_;
  CUmemAllocationProp prop_{};
  std::vector<CUmemAccessDesc> access_;
  CUdeviceptr base_ = 0;
  std::vector<CUmemGenericAllocationHandle> handles_;
  cudaStream_t zero_stream_ = nullptr;
};

class CudaImportedSegment final : public ImportedSegment {
 public:
  CudaImportedSegment(const Vmm& vmm, uint64_t bytes) : vmm_(vmm), bytes_(bytes) {}
  ~CudaImportedSegment() override {
    if (mapped_) vmm_.unmap(address_, bytes_);
    if (handle_ != 0) vmm_.release(handle_);
    if (address_ != 0) vmm_.address_free(address_, bytes_);
  }

  Status Init(int fd, int device) {
    ScopedDevice on(device);
    if (!on.ok()) return Status::InvalidArgument("no CUDA device " + std::to_string(device));
    KVPOOL_CUDA_CHECK(cudaFree(nullptr));
    KVPOOL_RETURN_IF_ERROR(DriverStatus(
        vmm_.import_handle(&handle_, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
        "importing a gpu segment"));
    KVPOOL_RETURN_IF_ERROR(
        DriverStatus(vmm_.reserve(&address_, bytes_, 0, 0, 0), "reserving addresses"));
    KVPOOL_RETURN_IF_ERROR(DriverStatus(vmm_.map(address_, bytes_, 0, handle_, 0),
                                        "mapping an imported gpu segment (is its size right?)"));
    mapped_ = true;
    CUmemAccessDesc a{};
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = device;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return DriverStatus(vmm_.set_access(address_, bytes_, &a, 1), "granting access");
  }

  uint8_t* data() const override { return reinterpret_cast<uint8_t*>(address_); }
  uint64_t bytes() const override { return bytes_; }

 private:
  const Vmm vmm_;
  const uint64_t bytes_;
  CUmemGenericAllocationHandle handle_ = 0;
  CUdeviceptr address_ = 0;
  bool mapped_ = false;
};

}  // namespace

Result<std::unique_ptr<ImportedSegment>> ImportCudaSegment(int fd, uint64_t bytes, int device) {
  if (!CudaDeviceAvailable()) return Status::Unavailable("no usable CUDA device in this process");
  Vmm vmm;
  KVPOOL_RETURN_IF_ERROR(vmm.LoadAll());
  auto seg = std::make_unique<CudaImportedSegment>(vmm, bytes);
  Status st = seg->Init(fd, device);
  if (!st.ok()) {
    return st.code() == StatusCode::kInternal ? Status::InvalidArgument(st.message()) : st;
  }
  return std::unique_ptr<ImportedSegment>(std::move(seg));
}

Result<std::unique_ptr<DeviceArena>> CreateCudaDeviceArena(int device, uint64_t segment_bytes,
                                                           uint32_t segment_count) {
  KVPOOL_ASSIGN_OR_RETURN(DeviceCopyEngine * copies, CudaCopyEngine());
  if (segment_count == 0 || segment_bytes == 0) {
    return Status::InvalidArgument("a gpu arena needs at least one non-empty segment");
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || device < 0 || device >= devices) {
    cudaGetLastError();
    return Status::InvalidArgument("no CUDA device " + std::to_string(device) +
                                   " (this machine has " + std::to_string(devices) + ")");
  }
  Vmm vmm;
  KVPOOL_RETURN_IF_ERROR(vmm.LoadAll());
  auto arena = std::make_unique<CudaDeviceArena>(vmm, device, segment_bytes, segment_count, copies);
  KVPOOL_RETURN_IF_ERROR(arena->Init());
  return std::unique_ptr<DeviceArena>(std::move(arena));
}

}  // namespace kvpool::kernels
