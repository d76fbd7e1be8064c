#pragma once
// DeviceCopyEngine: how block bytes move between host memory and CUDA device memory, on a
// caller's stream. The client copies a block between its shared-memory mapping of the daemon's
// host arena (pinned: registered with CUDA, kernels/pinned_memory.h) and an engine's device
// buffer with one copy each way, never through a private host buffer.
//
// CudaCopyEngine() is the CUDA runtime's (cudaMemcpyAsync, events). Tests that have no GPU use a
// test double with the same contract (tests/support/fake_device.h); it is never a shipped path.
//
// Thread safety: an engine's methods may be called from any thread; copies on one stream run
// in the order they were enqueued.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/device_checksum.h"

namespace kvpool::kernels {

enum class CopyDirection : uint8_t {
  kHostToDevice = 1,
  kDeviceToHost = 2,
  kDeviceToDevice = 3,  // peer to peer when the devices differ
};

// A segment of another process's gpu tier (kernels/device_arena.h), mapped into this process's
// device address space; unmapped when destroyed.
class ImportedSegment {
 public:
  virtual ~ImportedSegment() = default;
  virtual uint8_t* data() const = 0;  // device memory
  virtual uint64_t bytes() const = 0;
};

class DeviceCopyEngine {
 public:
  virtual ~DeviceCopyEngine() = default;

  // The device `ptr` points into. InvalidArgument when it is not device memory (host memory,
  // managed memory, or no allocation at all), so a host pointer handed in as a device buffer
  // gets a clear error instead of a copy to the wrong place.
  virtual Result<int> DeviceOf(const void* ptr) const = 0;
  // The UUID of device `device` (16 bytes): the same GPU has the same UUID in every process,
  // whatever numbering CUDA_VISIBLE_DEVICES gives it there.
  virtual Result<std::string> DeviceUuid(int device) const = 0;
  // The number of CUDA devices this process sees (0 where it has none).
  virtual int DeviceCount() const { return 0; }
  // Whether device `device` reaches memory of device `peer` directly (peer to peer, over NVLink
  // or PCIe), as cudaDeviceCanAccessPeer says; false for the same device or an unknown one.
  virtual bool CanAccessPeer(int device, int peer) const {
    static_cast<void>(device);
    static_cast<void>(peer);
    return false;
  }
  // The device `stream` (a cudaStream_t) belongs to, or -1 when that cannot be known: the null,
  // legacy and per-thread handles (the current device's), or a driver too old to say. A caller's
  // stream on another device than its buffers would order nothing the caller expects.
  virtual Result<int> StreamDevice(void* stream) const {
    static_cast<void>(stream);
    return -1;
  }
  // Enqueues a copy of `bytes` on `stream` (a cudaStream_t; nullptr: the legacy default stream)
  // and returns at once. The host side should be pinned for the copy to run at full speed and
  // to overlap the caller's work; it must stay valid until Wait returns.
  virtual Status CopyAsync(void* dst, const void* src, size_t bytes, CopyDirection direction,
                           void* stream) = 0;
  // Waits until the work enqueued on `stream` so far is done, so only the calling thread
  // blocks; the device's other streams run on. Internal with CUDA's reason when a copy failed.
  virtual Status Wait(void* stream) = 0;
  // Marks the work enqueued on `stream` so far (a CUDA event, made on the calling thread's
  // current device, which must be the stream's); WaitMarked blocks until that work is done and
  // frees the mark. Unlike Wait, it may run on another thread: a stream handle such as the
  // per-thread default stream names another stream there.
  virtual Result<void*> Mark(void* stream) = 0;
  virtual Status WaitMarked(void* mark) = 0;
  // Makes CUDA device `device` current on the calling thread until the returned guard goes,
  // then puts back the thread's own context; destroy it on the same thread. Copies, waits and
  // marks on the null (legacy default) stream then run on that device, whichever one the thread
  // had current (the legacy stream is the current device's). Nothing for device < 0, and nothing
  // in test doubles.
  virtual std::shared_ptr<void> UseDevice(int device) {
    static_cast<void>(device);
    return nullptr;
  }
  // The device checksum (kernels/device_checksum.h) of each of `n` ranges of device memory,
  // computed on the calling thread's current device (UseDevice) after the work enqueued on
  // `stream` so far; returns once known. That device must reach every range: its own memory, or
  // a peer's imported for it (ImportSegment).
  virtual Result<std::vector<uint64_t>> DeviceChecksums(const ByteRange* ranges, size_t n,
                                                        void* stream) = 0;
  // Maps the gpu segment behind `fd` (`bytes` long; the caller keeps and closes the
  // descriptor) for device `device`, which may be another GPU than the segment's own when it
  // reaches that one peer to peer (CanAccessPeer). InvalidArgument for a descriptor that is not
  // one.
  virtual Result<std::unique_ptr<ImportedSegment>> ImportSegment(int fd, uint64_t bytes,
                                                                 int device) = 0;
};

// The CUDA runtime's engine, one per process. Unavailable without a usable device; Unimplemented
// in a build without CUDA.
Result<DeviceCopyEngine*> CudaCopyEngine();

}  // namespace kvpool::kernels
