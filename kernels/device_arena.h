#pragma once
// DeviceArena: the device memory of one GPU's gpu tier (tiers/gpu_tier.h). One range of device
// addresses, `segment_count` x `segment_bytes`, each segment backed by its own physical
// allocation, so that
//   - an emptied segment gets fresh, zeroed memory (Renew) before another namespace may have it:
//     a client still holding the old one keeps its own namespace's old bytes at most, never
//     another namespace's blocks, as with the host arena's memfds;
//   - a segment can be exported alone, as a file descriptor, to the one namespace that owns it
//     (passed over the control socket like a host segment's memfd); the descriptor reaches that
//     segment's memory and nothing else.
//
// CreateCudaDeviceArena uses CUDA's virtual memory management (cuMemAddressReserve, cuMemCreate
// with POSIX file-descriptor handles, cuMemMap, cuMemSetAccess), reached through
// cudaGetDriverEntryPointByVersion, so kvpoold links no libcuda and starts where there is none. A
// client imports a descriptor with cuMemImportFromShareableHandle and maps it into its own
// address range. Tests without a GPU use the double in tests/support/fake_device.h.
//
// Thread safety: Renew and ExportSegment of different segments may run on any threads; the
// gpu tier serializes calls for one segment.

#include <cstdint>
#include <memory>

#include "common/status.h"
#include "kernels/device_copy.h"

namespace kvpool::kernels {

class DeviceArena {
 public:
  virtual ~DeviceArena() = default;
  virtual int device() const = 0;
  // The device address of segment 0; segment i starts segment_bytes() * i further.
  virtual uint8_t* base() const = 0;
  virtual uint64_t segment_bytes() const = 0;
  virtual uint32_t segment_count() const = 0;
  // Backs segment `index` by a fresh, zeroed allocation; the old one is released first (its
  // memory lives on only while a client still maps it). On failure the segment is left with no
  // memory at all (nothing for ExportSegment to hand out), and Renew may be called again.
  virtual Status Renew(uint32_t index) = 0;
  // A new file descriptor of segment `index`'s current allocation; the caller closes it.
  virtual Result<int> ExportSegment(uint32_t index) = 0;
  // Copies between this arena and host memory.
  virtual DeviceCopyEngine& copies() = 0;
};

// Imports the segment behind `fd` (`bytes` long; the descriptor is not kept, the caller closes
// it) and maps it for device `device`: InvalidArgument for a descriptor that is not a CUDA
// allocation of that size; Unavailable / Unimplemented as CreateCudaDeviceArena.
Result<std::unique_ptr<ImportedSegment>> ImportCudaSegment(int fd, uint64_t bytes, int device);

// `segment_count` segments of `segment_bytes` on CUDA device `device`. InvalidArgument when the
// segment size is not a multiple of the device's allocation granularity (2 MiB on current
// GPUs); ResourceExhausted when the device has not that much free memory; Unavailable without a
// usable device or a driver without virtual memory management; Unimplemented in a build without
// CUDA.
Result<std::unique_ptr<DeviceArena>> CreateCudaDeviceArena(int device, uint64_t segment_bytes,
                                                           uint32_t segment_count);

}  // namespace kvpool::kernels
