#pragma once
// FakeDevice: a test double of one CUDA device, for tests on machines without a GPU: memory the
// host cannot touch, and a kernels::DeviceCopyEngine that reaches it. Never a shipped path: the
// client and daemon use kernels::CudaCopyEngine().
//
// Alloc maps a memfd twice: the address handed out (the "device pointer") with no access, so
// host code that reads or writes it directly crashes as it would on a real device pointer, and a
// private read-write view only this class uses. Copies are queued per stream and run at Wait, in
// the order they were queued, so code that touches a copy's host side before waiting for it sees
// the old bytes, as it may on a GPU.
//
// CreateArena makes a kernels::DeviceArena of this device the same way: each segment its own
// memfd, mapped with no access at the arena's address and read-write in a private view; Renew
// maps a fresh memfd, ExportSegment hands out a descriptor of the current one, and ImportSegment
// maps such a descriptor (in this process: the tier and its client share one FakeDevice) as more
// device memory.
//
// One double may stand for several GPUs of a node (AddDevice): each allocation and arena is on
// one of them, an import remembers the GPU the segment is on, every pair reaches each other peer
// to peer unless SetPeerAccess says not (then an import for another GPU fails, as CUDA's access
// grant would), and a copy between two GPUs' memory counts as a peer copy. On a thread that made a
// device current (UseDevice), copies and device checksums refuse device memory that device
// cannot reach, as a kernel or copy of that device would fault: another GPU's own memory, or a
// segment imported for another GPU.
//
// Thread safety: every method may be called from any thread.

#include <sys/types.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "common/status.h"
#include "kernels/device_arena.h"
#include "kernels/device_copy.h"

namespace kvpool::testing {

class FakeDevice final : public kernels::DeviceCopyEngine {
 public:
  explicit FakeDevice(int device = 0) : device_(device) { devices_.push_back(device); }
  ~FakeDevice() override;
  FakeDevice(const FakeDevice&) = delete;
  FakeDevice& operator=(const FakeDevice&) = delete;

  // Another GPU of the same node, reached through this double too.
  void AddDevice(int device);
  // Whether the GPUs reach each other peer to peer (true until said otherwise).
  void SetPeerAccess(bool can);

  // `bytes` of device memory (whole pages, zeroed) on `device` (-1: the first). Aborts when the
  // host cannot map them.
  void* Alloc(size_t bytes, int device = -1);
  // An arena of `segment_count` segments on `device` (-1: the first; the double must outlive
  // the arena).
  std::unique_ptr<kernels::DeviceArena> CreateArena(uint64_t segment_bytes, uint32_t segment_count,
                                                    int device = -1);
  void Free(void* ptr);
  // The test's own access to device bytes (no copy counted).
  void Write(void* dst, const void* src, size_t bytes);
  std::vector<uint8_t> Read(const void* src, size_t bytes) const;

  // The next Wait fails with `why`, and the copies queued on its stream are dropped.
  void FailNextWait(Status why);
  // The next copy that runs lands with its first byte flipped (a copy gone bad on the way), and
  // its Wait still succeeds.
  void CorruptNextCopy();
  // The next Wait that has copies to run holds them (a copy still on its way) until
  // ReleaseHeldWait; WaitUntilHeld returns once a Wait holds.
  void HoldNextCopies();
  void WaitUntilHeld();
  void ReleaseHeldWait();
  // The next `n` renewals of this device's arenas' segments find no memory: the old memory goes,
  // none comes (DeviceArena::Renew's failure).
  void FailNextRenewals(int n);
  // The next renewal of a segment of this device's arenas holds (a renewal under way) until
  // ReleaseHeldRenewal; WaitUntilRenewalHeld returns once one holds.
  void HoldNextRenewal();
  void WaitUntilRenewalHeld();
  void ReleaseHeldRenewal();
  // Every ImportSegment from now on fails with `why` (a process that cannot reach the daemon's
  // gpu memory: no peer access, an old driver); OK ends that.
  void FailImports(Status why);
  // StreamDevice says `stream` belongs to CUDA device `device` (streams are unknown, -1, before).
  void SetStreamDevice(void* stream, int device);

  struct Counters {
    uint64_t to_device_copies = 0;
    uint64_t to_device_bytes = 0;
    uint64_t to_host_copies = 0;
    uint64_t to_host_bytes = 0;
    uint64_t device_copies = 0;  // device to device
    uint64_t device_bytes = 0;
    uint64_t peer_copies = 0;  // device to device between two GPUs (also in device_copies)
    uint64_t waits = 0;
    uint64_t marks = 0;
    uint64_t checksums = 0;  // device checksums computed (ranges)
  };
  Counters counters() const;
  // The host side of every copy queued so far (where the bytes came from or went).
  std::vector<const void*> host_sides() const;

  // kernels::DeviceCopyEngine. CopyAsync refuses (InvalidArgument) a device side that is not
  // inside one allocation and a host side that is inside one.
  Result<int> DeviceOf(const void* ptr) const override;
  Result<int> StreamDevice(void* stream) const override;
  Result<std::string> DeviceUuid(int device) const override;  // "fake-gpu-N", 16 bytes
  int DeviceCount() const override;                           // the highest device added, plus one
  bool CanAccessPeer(int device, int peer) const override;
  // Makes `device` the calling thread's current one until the guard goes.
  std::shared_ptr<void> UseDevice(int device) override;
  Status CopyAsync(void* dst, const void* src, size_t bytes, kernels::CopyDirection direction,
                   void* stream) override;
  Status Wait(void* stream) override;
  Result<void*> Mark(void* stream) override;
  Status WaitMarked(void* mark) override;
  // After the stream's queued copies (as Wait), the CPU twin over the device bytes.
  // InvalidArgument for a range outside one allocation.
  Result<std::vector<uint64_t>> DeviceChecksums(const kernels::ByteRange* ranges, size_t n,
                                                void* stream) override;
  Result<std::unique_ptr<kernels::ImportedSegment>> ImportSegment(int fd, uint64_t bytes,
                                                                  int device) override;

 private:
  class Arena;
  class Imported;
  struct Allocation {
    uint8_t* device = nullptr;  // PROT_NONE
    uint8_t* view = nullptr;    // read-write
    size_t bytes = 0;
    bool owned = true;    // Alloc's (unmapped here); an arena's segments are the arena's
    int gpu = 0;          // the GPU it is on
    int mapped_for = -1;  // an import: the GPU it was imported for (the only one reaching it)
  };
  // Maps a fresh memfd of `bytes` at `device` (MAP_FIXED, no access) and in a new view; returns
  // the memfd, registered as an allocation on GPU `gpu` (replacing the one at `device`).
  int MapFresh(uint8_t* device, size_t bytes, int gpu);
  bool KnownLocked(int device) const;
  // OK when the thread's current device (UseDevice; none: any) reaches [ptr, ptr + bytes).
  Status ReachableLocked(const void* ptr, size_t bytes) const;
  // The allocation holding [ptr, ptr + bytes), or nullptr.
  const Allocation* FindLocked(const void* ptr, size_t bytes) const;
  void Unregister(uint8_t* device);
  struct Copy {
    uint8_t* dst;
    const uint8_t* src;
    size_t bytes;
  };

  bool TakeRenewalFailure();  // for Arena: whether this renewal is to fail (counts it)
  void MaybeHoldRenewal();    // for Arena: holds a renewal where HoldNextRenewal asked
  // The view address of [ptr, ptr + bytes) when it lies in one allocation, else nullptr.
  uint8_t* ViewOfLocked(const void* ptr, size_t bytes) const;

  const int device_;  // the first GPU
  mutable std::mutex mu_;
  std::vector<int> devices_;
  bool peer_access_ = true;
  std::map<ino_t, int> segment_gpus_;            // an arena segment's memfd (by inode): its GPU
  std::map<uintptr_t, Allocation> allocations_;  // by device address
  std::map<void*, std::vector<Copy>> queued_;    // by stream
  std::optional<Status> fail_next_wait_;
  bool corrupt_next_copy_ = false;
  int failing_renewals_ = 0;
  std::optional<Status> fail_imports_;
  std::map<void*, int> stream_devices_;
  enum class Hold { kNone, kArmed, kHolding, kReleased };
  Hold hold_ = Hold::kNone;
  Hold renewal_hold_ = Hold::kNone;
  std::condition_variable hold_changed_;  // hold_ and renewal_hold_
  // A hold (HoldNextCopies, HoldNextRenewal): armed by the test, and held where the work it
  // names runs (HoldHere, mu_ held through `lock`) until the test releases it.
  void Arm(Hold& hold);
  void AwaitHolding(const Hold& hold);
  void Release(Hold& hold);
  void HoldHere(Hold& hold, std::unique_lock<std::mutex>& lock);
  std::vector<const void*> host_sides_;
  Counters counters_;
};

}  // namespace kvpool::testing
