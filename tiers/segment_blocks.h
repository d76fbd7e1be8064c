#pragma once
// SegmentBlocks: which blocks have their copy in each segment of one memory tier (host, or one
// GPU's), so that the tier manager can empty one whole segment for a namespace that needs a
// segment of its own, rather than evict the tier's coldest blocks, scattered over every segment,
// until one happens to empty (tiers/tier_manager.h, AllocateHostLocked).
//
// A hash set per segment: about 8-10 bytes per block in memory, none for blocks on disk only.
//
// Thread safety: none; the tier manager keeps it under its mutex.

#include <glog/logging.h>

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "tiers/block_index.h"

namespace kvpool::tiers {

class SegmentBlocks {
 public:
  SegmentBlocks(uint32_t segments, uint64_t segment_bytes)
      : segment_bytes_(segment_bytes), of_(segments) {}

  // The segment holding tier offset `offset`.
  uint32_t SegmentOf(uint64_t offset) const {
    return static_cast<uint32_t>(offset / segment_bytes_);
  }
  // Block `id` got (lost) its copy at tier offset `offset`.
  void Add(uint64_t offset, EntryId id) { of_[SegmentOf(offset)].insert(id); }
  void Remove(uint64_t offset, EntryId id) {
    const size_t erased = of_[SegmentOf(offset)].erase(id);
    DCHECK_EQ(erased, 1u) << "block " << id << " was not in segment " << SegmentOf(offset);
  }
  // The blocks with a copy in segment `segment`.
  const absl::flat_hash_set<EntryId>& Of(uint32_t segment) const { return of_[segment]; }

 private:
  uint64_t segment_bytes_;
  std::vector<absl::flat_hash_set<EntryId>> of_;
};

}  // namespace kvpool::tiers
