#pragma once
// The client's side of device buffers (MutableBuffer / PutBlock with Memory::kCuda).
//
// On the same-node shared-memory path a block moves between the caller's device memory and its
// slot of the host arena by one copy on the caller's stream (client/client.cc does that). Every
// other way a block travels (socket frames, UCX, a block decoded here) lands in host memory
// first: GetStaging holds those bounce buffers (from a StagingPool, pinned) and queues their copies
// to the device at the end of a get; StageToHost does the same for a put, and waits.
//
// Thread safety: none (one per call, like the Client).

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include <kvpool/client.h>
#include <kvpool/kvpool.h>

#include "common/status.h"
#include "kernels/device_copy.h"

namespace kvpool::client {

// The device of [data, data + bytes): InvalidArgument naming `what` unless all of it is device
// memory of one device. -1 for an empty range (the empty/too-small checks say why).
Result<int> CheckDeviceRange(const kernels::DeviceCopyEngine& engine, const void* data,
                             size_t bytes, const std::string& what);

// Host buffers that blocks bound for device memory are staged in (blocks that arrive as bytes:
// socket frames, UCX, a block decoded here), kept for reuse. Each is page-locked with CUDA where
// a device is usable, so its copy to the device is a true cudaMemcpyAsync: from pageable memory
// the runtime would first wait for all the work already on the caller's stream. A buffer goes
// back to the pool when the last handle to it goes (a PendingGet holds them until Wait), even
// after the Client that took it is gone.
//
// Thread safety: Take may be called from any thread (one mutex).
class StagingPool : public std::enable_shared_from_this<StagingPool> {
 public:
  // How long a buffer given back stays kept unused before it is freed (unpinned).
  static constexpr std::chrono::milliseconds kIdle{60000};
  explicit StagingPool(std::chrono::milliseconds idle = kIdle) : idle_(idle) {}

  struct Buffer {
    uint8_t* data = nullptr;
    size_t capacity = 0;  // bytes (a power of two, at least 64 KiB, aligned to 64 KiB)
    bool pinned = false;
    int pinned_on = -1;  // the device current when it was pinned (and so when it is unpinned)
    std::chrono::steady_clock::time_point given_at;  // when last given back
  };
  // A buffer of at least `bytes`, pinned when CUDA allows it, with CUDA device `device` current
  // (pinned memory serves every device; the registration needs a context, and this one is the
  // caller's already).
  std::shared_ptr<Buffer> Take(size_t bytes, int device);
  ~StagingPool();

  // What the pool keeps for reuse, at most: buffers beyond it are freed when given back, and
  // buffers kept unused for `idle` are freed at the next Take or give-back.
  static constexpr size_t kKeepBytes = 256ull << 20;
  // Bytes of the buffers kept for reuse now.
  size_t kept_bytes();

 private:
  void Give(Buffer* b);
  static void Free(Buffer* b);
  // Moves the buffers kept unused for longer than idle_ into `stale` (freed by the caller, after
  // the lock).
  void TakeStaleLocked(std::chrono::steady_clock::time_point now, std::vector<Buffer*>& stale);

  const std::chrono::milliseconds idle_;
  std::mutex mu_;
  std::map<size_t, std::vector<Buffer*>> free_;  // by capacity
  size_t kept_bytes_ = 0;
};

// Bounce buffers of one get, for device targets a path cannot fill directly.
class GetStaging {
 public:
  // `pool` (null: plain unpinned buffers) gives the bounce buffers, pinned with CUDA device
  // `device` (the call's buffers') current.
  GetStaging(kernels::DeviceCopyEngine* engine, void* stream, int device = -1,
             std::shared_ptr<StagingPool> pool = nullptr)
      : engine_(engine), stream_(stream), device_(device), pool_(std::move(pool)) {}

  // Where block `index` (`size` bytes) lands in host memory: `caller` itself when it is host
  // memory, else a bounce buffer of the block's size, or of the caller's capacity when that is
  // less (the too-small check then fails as it would on the caller's buffer). Never more: an
  // engine that passes one large device buffer per block does not get bounce buffers as large.
  MutableBuffer HostTarget(size_t index, const MutableBuffer& caller, uint64_t size);
  // The engine and stream of the call's device copies (nullptr engine: no device buffers).
  kernels::DeviceCopyEngine* engine() const { return engine_; }
  void* stream() const { return stream_; }
  // The bounce buffer of block `index`, or nullptr when it has none.
  uint8_t* Staged(size_t index);
  // Forgets every bounce buffer (a new try of the call: only what it stages is copied).
  void Reset() { staged_.clear(); }
  // The copies Finish queued: the blocks', and the bounce buffers they read, which must live
  // until the copies are done.
  struct Queued {
    std::vector<size_t> indices;
    std::vector<std::shared_ptr<StagingPool::Buffer>> buffers;
  };
  // Queues the copy of each staged block whose result is OK into its device buffer on the
  // call's stream, without waiting; a copy that cannot be queued turns its result into an error.
  Queued Finish(std::span<const MutableBuffer> buffers, std::span<GetResult> results);

 private:
  kernels::DeviceCopyEngine* const engine_;
  void* const stream_;
  const int device_;
  const std::shared_ptr<StagingPool> pool_;
  std::map<size_t, std::shared_ptr<StagingPool::Buffer>> staged_;  // by block index
};

// Test hook (no GPU): `client`'s device buffers are copied by `engine` (e.g. the double in
// tests/support/fake_device.h) instead of the CUDA runtime's. Not owned; must outlive `client`.
void UseCopyEngineForTest(Client& client, kernels::DeviceCopyEngine* engine);
// Test hook: bytes of bounce buffers `client` keeps for reuse (StagingPool::kept_bytes).
size_t StagingKeptBytesForTest(Client& client);
// The same for a C API client (include/kvpool/kvpool.h).
void UseCopyEngineForTest(kvpool_client* client, kernels::DeviceCopyEngine* engine);

// Host copies of the device blocks among `blocks` (copied and waited for), and `blocks` with
// those pointing at them; the copies live as long as `storage`.
Result<std::vector<PutBlock>> StageToHost(kernels::DeviceCopyEngine& engine, void* stream,
                                          std::span<const PutBlock> blocks,
                                          std::vector<std::vector<uint8_t>>& storage);

}  // namespace kvpool::client
