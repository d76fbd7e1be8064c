#pragma once
// SegmentPages: the page bookkeeping of a memory tier cut into fixed-size segments, shared by the
// host tier (tiers/host_tier.h) and the gpu tier (tiers/gpu_tier.h); it knows nothing of the
// memory itself.
//
// A segment belongs to at most one namespace at a time, and a block lives entirely inside one
// segment of its own namespace. Inside a segment space is handed out in pages (4 KiB) from a
// bitmap: fixed metadata (one bit per page), no per-block allocation, every slot page aligned.
// When a segment's last page is freed the tier gives it fresh memory before any namespace may
// have it again (Free says so; Recycled ends it), so a client that kept a mapping of it never
// sees another namespace's blocks.
//
// Thread safety: none; the owning tier serializes access under its mutex.

#include <cstdint>
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

  uint64_t segment_bytes() const { return segment_bytes_; }
  uint32_t segment_count() const { return segment_count_; }

  // As MemoryTier::Allocate: a slot in a segment `ns` owns, taking a free segment when none has
  // room. InvalidArgument for 0 or more than a segment; ResourceExhausted when nothing fits or
  // `ns` holds its limit of segments.
  Result<MemorySlot> Allocate(NamespaceId ns, uint64_t length);
  // Returns a slot's pages (CHECK-fails on a slot outside the tier or freed twice). True when its
  // segment is now empty: it no longer counts towards its owner and is given to nobody until the
  // tier has renewed its memory and calls Recycled.
  bool Free(const MemorySlot& slot);
  // The emptied segment `index` goes back to the free pool (`renewed`), or out of use for good.
  void Recycled(uint32_t index, bool renewed);

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
  // Every figure of MemoryTierStats but `locked`; walks every bitmap.
  MemoryTierStats Stats() const;

 private:
  struct Segment {
    NamespaceId owner = kNoNamespace;
    uint32_t used_pages = 0;
    std::vector<uint64_t> bitmap;  // one bit per page, 1 = used
    bool quarantined = false;      // could not be renewed: never allocated from again
  };

  // First run of `pages` free pages in `seg`, or -1.
  int64_t FindRun(const Segment& seg, uint32_t pages) const;
  void MarkRun(Segment& seg, uint32_t first, uint32_t pages, bool used);
  uint32_t LargestRun(const Segment& seg) const;

  const std::string tier_name_;
  const uint64_t segment_bytes_;
  const uint32_t segment_count_;
  const uint32_t pages_per_segment_;
  std::vector<Segment> segments_;
  std::vector<uint32_t> free_segments_;
  uint64_t allocated_bytes_ = 0;
  uint64_t payload_bytes_ = 0;
  uint64_t blocks_ = 0;
  absl::flat_hash_map<NamespaceId, uint32_t> segments_of_;  // held now
  absl::flat_hash_map<NamespaceId, uint32_t> segment_limit_;
  uint32_t default_limit_ = 0;

  // `ns`'s own limit, else the default; 0: none.
  uint32_t LimitOf(NamespaceId ns) const;
};

// SegmentedTier: a MemoryTier whose pages SegmentPages keeps under one mutex: the allocation,
// quota and accounting calls every segmented tier answers alike. A tier brings its memory and
// says what becomes of a segment that emptied (RenewSegmentLocked).
class SegmentedTier : public MemoryTier {
 public:
  Result<MemorySlot> Allocate(NamespaceId ns, uint64_t length) override;
  // Returns a slot's pages; an emptied segment is renewed before anyone may have it again.
  void Free(const MemorySlot& slot) override;
  uint64_t allocated_bytes() const override;
  void SetSegmentLimit(NamespaceId ns, uint32_t max_segments) override;
  void SetDefaultSegmentLimit(uint32_t max_segments) override;
  uint32_t SegmentsOf(NamespaceId ns) const override;
  bool AtSegmentLimit(NamespaceId ns) const override;

 protected:
  SegmentedTier(std::string tier_name, uint64_t segment_bytes, uint32_t segment_count)
      : pages_(std::move(tier_name), segment_bytes, segment_count) {}

  // Gives emptied segment `index` fresh memory; false (logged) when it could not: it then stays
  // out of use.
  virtual bool RenewSegmentLocked(uint32_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;

  mutable absl::Mutex mu_;
  SegmentPages pages_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvpool::tiers
