#pragma once
// SegmentPages: the page bookkeeping of a memory tier cut into fixed-size segments, shared by the
// host tier (tiers/host_tier.h) and the gpu tier (tiers/gpu_tier.h); it knows nothing of the
// memory itself.
//
// A segment belongs to at most one namespace at a time, and a block lives entirely inside one
// segment of its own namespace. Inside a segment space is handed out in pages (4 KiB) from a
// bitmap: fixed metadata (one bit per page), no per-block allocation, every slot page aligned.
// A segment whose last page is freed stays *vacant*: still its namespace's, with the same memory
// and generation, counted free but not against the namespace's quota. The namespace takes its own
// vacant segments back first; that costs nothing, and its clients' mappings stay valid. Only when
// another namespace needs a segment and no clean one is left does the tier give the longest
// vacant one fresh memory (TakeLongestVacant, then Recycled), so a client that kept a mapping of it
// never sees another namespace's blocks. Renewing is what costs: a new memfd populated and locked
// takes ~40 ms per 64 MiB (docs/BENCHMARKS.md), and every client of the namespace maps it again.
//
// Thread safety: none; the owning tier serializes access under its mutex.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/namespace_id.h"
#include "common/status.h"
#include "tiers/tier.h"

namespace kvpool::tiers {

class SegmentPages {
 public:
  // `tier_name` ("host", "gpu 0") names the tier in error messages.
  SegmentPages(std::string tier_name, uint64_t segment_bytes, uint32_t segment_count);
  const std::string& tier_name() const { return tier_name_; }

  uint64_t segment_bytes() const { return segment_bytes_; }
  uint32_t segment_count() const { return segment_count_; }
  // Pages of segment `index` in use, in bytes.
  uint64_t used_bytes(uint32_t index) const {
    return uint64_t{segments_[index].used_pages} * MemoryTier::kPageBytes;
  }

  // As MemoryTier::Allocate: a slot in a segment `ns` owns, taking back one of its vacant
  // segments, else a clean one, when none has room. InvalidArgument for 0 or more than a
  // segment; ResourceExhausted when nothing fits or `ns` holds its limit of segments.
  Result<MemorySlot> Allocate(NamespaceId ns, uint64_t length);
  // As MemoryTier::SetDraining.
  void SetDraining(uint32_t index, bool draining) { segments_[index].draining = draining; }
  bool draining(uint32_t index) const { return segments_[index].draining; }
  // As MemoryTier::AllocateBeside: a slot in a segment `ns` holds blocks in already, other than
  // segment `avoid`; never another segment. ResourceExhausted when none has a run that fits.
  Result<MemorySlot> AllocateBeside(NamespaceId ns, uint64_t length, uint32_t avoid);
  // Returns a slot's pages (CHECK-fails on a slot outside the tier or freed twice). True when its
  // segment is now empty: vacant, no longer counted towards its owner.
  bool Free(const MemorySlot& slot);
  // The longest-vacant segment of any namespace, taken out of every pool and owned by nobody
  // (no export reaches it) until the tier renews it and calls Recycled; nullopt when none is
  // vacant. (After Allocate(ns, ...) failed for want of a segment, the one to renew for `ns`:
  // it has no vacant segment of its own left.)
  std::optional<uint32_t> TakeLongestVacant();
  uint32_t clean_segments() const { return static_cast<uint32_t>(free_segments_.size()); }
  uint32_t vacant_segments() const { return static_cast<uint32_t>(vacant_.size()); }
  // When the longest-vacant segment emptied; nullopt when none is vacant.
  std::optional<std::chrono::steady_clock::time_point> LongestVacantSince() const;
  // How renewing a segment from TakeLongestVacant ended.
  enum class Renewal {
    kRenewed,    // fresh memory: to the clean pool
    kUnchanged,  // failed before its memory or mapping changed: back to its owner, vacant
    kLost,       // failed part way (its mapping may be gone): out of use for good
    // Failed with no memory behind it (the old released first, no new one to be had, say a
    // full GPU): owned by nobody, vacant, and renewed again when next taken.
    kEmpty,
  };
  void Recycled(uint32_t index, Renewal how);

  NamespaceId OwnerOf(uint32_t index) const { return segments_[index].owner; }
  uint32_t SegmentOf(uint64_t offset) const {
    return static_cast<uint32_t>(offset / segment_bytes_);
  }
  void SetSegmentLimit(NamespaceId ns, uint32_t max_segments);
  // The limit of every namespace without one of its own (0: none).
  void SetDefaultSegmentLimit(uint32_t max_segments) { default_limit_ = max_segments; }
  uint32_t SegmentsOf(NamespaceId ns) const;
  bool AtSegmentLimit(NamespaceId ns) const;
  uint64_t allocated_bytes() const { return allocated_bytes_; }
  // Every figure of MemoryTierStats but `locked` and the standby ones; walks every bitmap.
  MemoryTierStats Stats() const;

 private:
  struct Segment {
    NamespaceId owner = kNoNamespace;
    uint32_t used_pages = 0;
    std::vector<uint64_t> bitmap;  // one bit per page, 1 = used
    bool vacant = false;           // empty, still `owner`'s memory (see above)
    std::chrono::steady_clock::time_point vacant_since;  // when it emptied, while vacant
    bool quarantined = false;  // could not be renewed: never allocated from again
    bool draining = false;     // being emptied: no allocation takes its pages (cleared once empty)
    NamespaceId taken_from = kNoNamespace;  // its owner, while TakeLongestVacant has it
  };

  // A slot of `length` bytes (`pages` pages) in one of `ns`'s segments in use other than
  // `avoid` (UINT32_MAX: none avoided), or nullopt.
  std::optional<MemorySlot> AllocateInOwn(NamespaceId ns, uint64_t length, uint32_t pages,
                                          uint32_t avoid);
  // Marks `pages` pages from `first` of segment `index` used for a block of `length` bytes.
  MemorySlot Take(uint32_t index, uint32_t first, uint32_t pages, uint64_t length);
  // First run of `pages` free pages in `seg`, or -1.
  int64_t FindRun(const Segment& seg, uint32_t pages) const;
  void MarkRun(Segment& seg, uint32_t first, uint32_t pages, bool used);
  uint32_t LargestRun(const Segment& seg) const;

  const std::string tier_name_;
  const uint64_t segment_bytes_;
  const uint32_t segment_count_;
  const uint32_t pages_per_segment_;
  std::vector<Segment> segments_;
  std::vector<uint32_t> free_segments_;  // clean: nobody's memory
  std::vector<uint32_t> vacant_;         // vacant segments, longest vacant first
  uint64_t allocated_bytes_ = 0;
  uint64_t payload_bytes_ = 0;
  uint64_t renewals_ = 0;  // segments given fresh memory (Recycled kRenewed)
  uint64_t blocks_ = 0;
  absl::flat_hash_map<NamespaceId, uint32_t> segments_of_;  // held now
  absl::flat_hash_map<NamespaceId, uint32_t> segment_limit_;
  uint32_t default_limit_ = 0;

  // `ns`'s own limit, else the default; 0: none.
  uint32_t LimitOf(NamespaceId ns) const;
};

// SegmentedTier: a MemoryTier whose pages SegmentPages keeps under one mutex: the allocation,
// quota and accounting calls every segmented tier answers alike. A tier brings its memory and
// renews a vacant segment before another namespace gets it (RenewSegmentLocked).
class SegmentedTier : public MemoryTier {
 public:
  // As SegmentPages::Allocate, renewing another namespace's vacant segment when no clean one is
  // left.
  Result<MemorySlot> Allocate(NamespaceId ns, uint64_t length) override;
  Result<MemorySlot> TryAllocate(NamespaceId ns, uint64_t length) override;
  Result<MemorySlot> AllocateBeside(NamespaceId ns, uint64_t length, uint32_t avoid) override;
  void SetDraining(uint32_t segment, bool draining) override;
  std::optional<uint32_t> TakeVacant() override;
  // (RenewTaken is the tier's own: it renews without this tier's lock.)
  void WaitForRenewals() override;
  // Returns a slot's pages; an emptied segment stays its namespace's until another needs it.
  void Free(const MemorySlot& slot) override;
  uint64_t allocated_bytes() const override;
  uint32_t segment_count() const override;
  uint64_t SegmentUsedBytes(uint32_t segment) const override;
  NamespaceId SegmentOwner(uint32_t segment) const override;
  std::vector<SegmentUse> SegmentUses() const override;
  // Renewals (fresh memory for a segment moving to another namespace) that failed so far. A
  // caller that evicts for room stops at one: freeing more would only have it fail again.
  uint64_t failed_renewals() const;
  void SetSegmentLimit(NamespaceId ns, uint32_t max_segments) override;
  void SetDefaultSegmentLimit(uint32_t max_segments) override;
  uint32_t SegmentsOf(NamespaceId ns) const override;
  bool AtSegmentLimit(NamespaceId ns) const override;

 protected:
  SegmentedTier(std::string tier_name, uint64_t segment_bytes, uint32_t segment_count)
      : pages_(std::move(tier_name), segment_bytes, segment_count) {}

  // Gives vacant segment `index` fresh memory (a new generation); a failure is logged, and says
  // whether the segment is as it was (SegmentPages::Renewal).
  virtual SegmentPages::Renewal RenewSegmentLocked(uint32_t index)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;

  // The end of a RenewTaken: segment `index`, taken by TakeVacant, goes back by how its renewal
  // ended; a failure is counted.
  void RenewedLocked(uint32_t index, SegmentPages::Renewal how) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  SegmentPages pages_ ABSL_GUARDED_BY(mu_);

 private:
  // Allocate, and with `may_wait` false TryAllocate.
  Result<MemorySlot> AllocateLocked(NamespaceId ns, uint64_t length, bool may_wait)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Renews segment `index`, taken out of every pool, and hands it back by how that ended; a
  // failure is counted. Whether it got fresh memory.
  bool RenewTakenLocked(uint32_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands segment `index` back by how its renewal ended, counting a failure; whether it got fresh
  // memory.
  bool RecycledLocked(uint32_t index, SegmentPages::Renewal how) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until no renewal without mu_ is under way.
  void AwaitRenewalsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

 protected:
  // Segments taken out of every pool for a renewal that runs without mu_ (TakeVacant, the host
  // tier's spare thread); Allocate waits for them instead of reporting the tier full.
  uint32_t renewing_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failed_renewals_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvpool::tiers
