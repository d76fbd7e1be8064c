#pragma once
// HostTier: the host-memory tier, one arena of `capacity` bytes allocated once.
//
// The arena is cut into fixed-size segments. Each segment is its own memfd (shared memory),
// mapped into one contiguous range of the daemon's address space, mlocked when the limit
// allows, and registered with CUDA as pinned memory when a GPU is usable. Segments and their
// pages are kept by tiers/segment_pages.h: a segment belongs to at most one namespace at a time,
// a block lives entirely inside one segment of its own namespace, in whole 4 KiB pages.
//
// Sharing with clients (the same-node data path): ExportSegment hands out a file descriptor of
// one segment, read-only or writable, only to the namespace that owns it. (A read-only
// descriptor limits a well-behaved client; a hostile one can reopen a memfd writable through
// /proc, so treat any client as able to write its own namespace's segments. Every memfd is
// sealed at its size, so no client can shrink it under the daemon.) Since a descriptor
// can map only its own memfd, a client can never reach another namespace's segment. A segment
// whose last page is freed stays its namespace's (vacant, tiers/segment_pages.h); before it is
// given to another namespace it gets a fresh memfd (its generation changes) and the old one's
// pages are released: a client that kept a mapping of the old one sees its own namespace's old
// bytes or zeros, never another namespace's blocks.
//
// The tier knows nothing of keys: the block index records each block's HostSlot.
//
// Thread safety: every method may be called from any thread (one internal mutex). Data()
// returns a stable pointer for the life of the tier; the caller's lease protocol (see
// tiers/tier_manager.h) decides who may touch a slot's bytes.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/huge_pages.h"
#include "common/namespace_id.h"
#include "common/status.h"
#include "tiers/segment_pages.h"
#include "tiers/tier.h"

namespace kvpool::tiers {

// The host tier's slots and statistics are the memory tiers' (tiers/tier.h).
using HostSlot = MemorySlot;
using HostTierStats = MemoryTierStats;

struct HostTierOptions {
  // Arena size; rounded down to whole segments (at least one). Default: 1 GiB.
  uint64_t capacity_bytes = 1ull << 30;
  // Segment size: the unit handed to one namespace, and the largest block. Default: 64 MiB.
  uint64_t segment_bytes = 64ull << 20;
  // Try to mlock the arena; on failure log one warning and run unlocked. Default: true.
  bool lock_memory = true;
  // Clean segments a background thread keeps ready by renewing the longest-vacant ones, so a
  // namespace that needs a segment another one emptied rarely waits for a renewal (~56 ms per
  // 64 MiB, docs/BENCHMARKS.md) on its request path. 0: no thread; renewal happens when a
  // namespace needs the segment. Default: 0.
  uint32_t spare_segments = 0;
  // The thread renews only segments vacant this long: a namespace evicting to make room takes its
  // emptied segment back at once, and renewing that one would only make its clients map it
  // again. Default: 1 s.
  std::chrono::milliseconds spare_after{1000};
  // Segments' worth of fresh memory a background thread keeps made ahead, outside the arena: a
  // sealed memfd mapped and faulted in (and locked, as the arena is). A renewal then moves that
  // mapping over the segment's range (mremap: its page tables move, nothing is faulted again),
  // a few milliseconds instead of ~45 for 64 MiB made on the spot (docs/BENCHMARKS.md, "Fresh
  // memory made ahead"): the wait of a namespace that needs a segment another one emptied just
  // now, which no spare segment can serve. Each costs a segment's memory beyond the arena's
  // capacity. 0: none. Default: 0.
  uint32_t standby_segments = 0;
  // Ask for transparent huge pages for the segments (madvise MADV_HUGEPAGE on each mapping, which
  // is then faulted in at once, so that no client's touch makes it 4 KiB pages; a client's mapping
  // of a segment maps the same huge pages): a copy into or out of the arena then crosses 512
  // times fewer pages (docs/BENCHMARKS.md, "The host arena on huge pages"). Needs
  // segment_bytes a multiple of 2 MiB, and takes effect only where the kernel allows huge pages for
  // shared memory
  // (/sys/kernel/mm/transparent_hugepage/shmem_enabled "advise", "within_size" or "always";
  // Debian's default is "never") and has free 2 MiB runs of memory. Default: false.
  bool huge_pages = false;
  // Registers each segment with CUDA (pinned memory) with this device current, for a daemon whose
  // gpu tiers copy between the arena and their GPUs; -1 (the default): not registered at all.
  // Registering takes a CUDA context on the device current, several hundred MiB of its memory,
  // so a daemon without gpu tiers leaves every GPU to the engines (clients pin their own
  // mappings of the arena).
  int cuda_device = -1;
};

class HostTier final : public SegmentedTier {
 public:
  // Creates and maps the arena. ResourceExhausted when the memory cannot be had.
  static Result<std::unique_ptr<HostTier>> Create(const HostTierOptions& options);
  ~HostTier();
  HostTier(const HostTier&) = delete;
  HostTier& operator=(const HostTier&) = delete;

  // StorageTier
  Tier id() const override { return Tier::kHost; }

  // MemoryTier
  uint64_t capacity_bytes() const override { return segment_bytes_ * segment_count_; }
  uint8_t* Data(const HostSlot& slot) const override { return base_ + slot.offset; }
  uint64_t segment_bytes() const override { return segment_bytes_; }
  uint64_t max_block_bytes() const override { return segment_bytes_; }
  // Namespace owning the segment that holds `offset`, kNoNamespace if free.
  NamespaceId OwnerOf(uint64_t offset) const;
  // The segment, generation and in-segment offset of an arena offset.
  SegmentLocation Locate(uint64_t offset) const override;
  // A new file descriptor for segment `index` (the caller closes it): read-only unless
  // `writable`. PermissionDenied unless `ns` owns the segment; NotFound when the segment's
  // generation is no longer `generation` (it was recycled: ask again).
  Result<int> ExportSegment(uint32_t index, uint32_t generation, NamespaceId ns,
                            bool writable) override;
  // Without this tier's lock held through the new memfd's mapping and locking, as the spare
  // thread renews.
  Status RenewTaken(uint32_t segment) override;

  // Standby segments made and ready now (HostTierOptions::standby_segments).
  uint32_t StandbyReady() const;

  // Walks every segment's bitmap for the fragmentation figures: not for hot paths.
  HostTierStats GetStats() const override;
  // Bytes of the arena on huge pages now (reads /proc/self/smaps: for the banner and tests).
  uint64_t HugePageBytes() const { return ShmemHugeBytesIn(base_, base_ + capacity_bytes()); }

 private:
  // The memory behind a segment (SegmentPages keeps its pages and owner).
  struct Segment {
    int fd = -1;  // this segment's memfd
  };

  // Fresh memory made ahead for a renewal (HostTierOptions::standby_segments): a sealed memfd
  // mapped, faulted in and locked as the arena is, at `at`, outside the arena.
  // How long after a standby was taken the next is made.
  static constexpr absl::Duration kStandbyAfterTaken = absl::Milliseconds(250);
  struct Standby {
    int fd = -1;
    uint8_t* at = nullptr;
    bool locked = false;  // mlocked (the arena is, and the limit allowed it)
  };

  HostTier(uint8_t* base, const HostTierOptions& options, uint32_t segment_count);
  // Creates a memfd for segment `index` and maps it over its range. IoError/ResourceExhausted;
  // `*mapped_over` (when given) says whether the range was touched before a failure.
  Status MapSegmentLocked(uint32_t index, bool* mapped_over = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The part of giving segment `index` fresh memory that needs no lock, for a segment no slot
  // and no namespace holds: `*standby`'s memory moved over the segment's range where one is given
  // (fd >= 0; where the move fails, a fresh memfd instead, and *standby is cleared), else a new
  // sealed memfd mapped there (mlocked when `mlock_it`). Its descriptor, or the error.
  // `*mapped_over`: false when the failure came before the range was touched (the old memfd
  // still maps it), true when it came from the mapping itself (the range may then be unmapped).
  Result<int> MapFreshMemfd(uint32_t index, bool mlock_it, bool* mapped_over,
                            Standby* standby) const;
  // A new memfd of a segment's size, sealed at it: a client holding a descriptor (even reopened
  // writable through /proc/self/fd) cannot shrink it under the daemon's mapping, which would
  // SIGBUS the daemon.
  Result<int> NewSealedMemfd(const std::string& name) const;
  // Makes a Standby: needs no lock.
  Result<Standby> MakeStandby(bool mlock_it) const;
  // One made ahead, if any is ready (taken from standby_).
  Standby TakeStandbyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An old memfd of a renewed segment: handed to the background thread to release where there is
  // one (its pages' release takes ~8 ms per 64 MiB); else returned, for ReleaseMemfd.
  int RetireMemfdLocked(int fd) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // InstallMemfdLocked of a renewal's fresh memfd (counted when it came `from_standby`), then
  // RetireMemfdLocked of the old one: what it returns is for ReleaseMemfd.
  int InstallFreshLocked(uint32_t index, int fd, bool from_standby, bool pinned = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves `standby`'s mapping over the range at `at` (see MapFreshMemfd). False, the standby
  // undone, when the move failed (logged); `*touched` then says whether the range was unmapped.
  bool MoveStandbyOver(uint8_t* at, const Standby& standby, bool* touched) const;
  // Makes `fd` segment `index`'s memfd (a new generation; pinned for CUDA here unless
  // `pinned`: PinForCuda already ran). Returns the old descriptor (or -1) for ReleaseMemfd, which
  // needs no lock.
  int InstallMemfdLocked(uint32_t index, int fd, bool pinned = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pins segment `index`'s current mapping for CUDA where the daemon copies to a GPU (unpinning
  // what was pinned there before), so those copies need no staging. A renewal calls it without
  // mu_ (the segment is out of every pool: nothing else reaches it): registering a segment takes
  // milliseconds, which the tier's lock must not be held for.
  void PinForCuda(uint32_t index);
  void ReleaseMemfd(int fd) const;
  // A renewal of segment `index` that failed (`mapped_over`: see MapFreshMemfd): logged; the
  // segment stays its owner's (kUnchanged), or, its old memfd's pages released, out of use
  // (kLost).
  SegmentPages::Renewal FailedRenewalLocked(uint32_t index, const Status& why, bool mapped_over)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases the pages of memfd `fd` (its size stays).
  void PunchPages(int fd) const;
  // The background thread (HostTierOptions::spare_segments and standby_segments): releases old
  // memfds, keeps standby memory made, and renews spare segments, in that order.
  void KeepAhead();
  // RenewTaken, taking standby memory where `from_standby` and one is ready.
  Status Renew(uint32_t segment, bool from_standby);
  bool SpareWantedOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool StandbyWanted() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool StandbyOrReleaseWantedOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool WorkOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return StandbyOrReleaseWantedOrStopping() || SpareWantedOrStopping();
  }
  // Gives an emptied segment a fresh memfd and releases the old one's pages. A failure before the
  // old mapping was touched (out of descriptors) leaves the segment its owner's; one in the
  // mapping keeps it out of the pool (logged) rather than risk handing its old memfd on.
  SegmentPages::Renewal RenewSegmentLocked(uint32_t index) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  uint8_t* const base_;
  const uint64_t segment_bytes_;
  const uint32_t segment_count_;
  const bool lock_;
  const uint32_t spare_segments_;
  const std::chrono::milliseconds spare_after_;
  const uint32_t standby_segments_;
  const bool huge_pages_;
  const int cuda_device_;
  bool locked_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread keeper_;  // KeepAhead, where spare or standby segments are asked for

  std::vector<Standby> standby_ ABSL_GUARDED_BY(mu_);
  std::vector<int> retired_ ABSL_GUARDED_BY(mu_);  // old memfds the thread releases
  uint64_t renewals_from_standby_ ABSL_GUARDED_BY(mu_) = 0;
  // When the next standby may be made: a while after one was taken (making one takes a core for
  // tens of milliseconds, which the request that took it and those after it need more) or a
  // second after a failure.
  absl::Time standby_due_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();

  std::vector<Segment> segments_ ABSL_GUARDED_BY(mu_);
  // Pinned with CUDA, per segment: set and cleared by PinForCuda (see there for its lock).
  std::unique_ptr<std::atomic<bool>[]> seg_registered_;
  // Each segment's generation, bumped (under mu_) each time it gets a fresh memfd. Locate reads
  // it without mu_: every GET names each block's slot with it, and a block that is leased or
  // being written keeps its segment from renewal.
  std::unique_ptr<std::atomic<uint32_t>[]> generations_;
};

}  // namespace kvpool::tiers
