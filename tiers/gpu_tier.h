#pragma once
// GpuTier: one GPU's share of the gpu tier, above host in the tier stack (DESIGN.md section 9).
//
// Its memory is a kernels::DeviceArena allocated once at start (CUDA virtual memory management,
// never managed memory), cut into segments kept by tiers/segment_pages.h exactly like the host
// arena: a segment belongs to one namespace at a time, a block lives in whole pages of one
// segment of its namespace, quotas count segments. Data() is a device pointer: only copies on the
// device's copy engine (DeviceArena::copies) or kernels touch the bytes.
//
// Sharing with clients: ExportSegment hands out a file descriptor of one segment's physical
// allocation, only to the namespace that owns it (a client imports it with
// cuMemImportFromShareableHandle and maps it). The descriptor reaches that segment and nothing
// else; it cannot be made read-only, so treat a client as able to write its own namespace's
// segments, as with the host arena. A segment whose last page is freed stays its namespace's
// (vacant, tiers/segment_pages.h) and is renewed (fresh, zeroed memory; its generation changes)
// before another namespace may have it: a client that kept the old one sees its own namespace's
// old bytes, never another namespace's blocks.
//
// Thread safety: every method may be called from any thread (one internal mutex).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/namespace_id.h"
#include "common/status.h"
#include "kernels/device_arena.h"
#include "tiers/segment_pages.h"
#include "tiers/tier.h"

namespace kvpool::tiers {

class GpuTier final : public SegmentedTier {
 public:
  // Runs over `arena` (whole segments of it; the arena's segment size is the largest block).
  explicit GpuTier(std::unique_ptr<kernels::DeviceArena> arena);
  GpuTier(const GpuTier&) = delete;
  GpuTier& operator=(const GpuTier&) = delete;

  int device() const { return arena_->device(); }
  // The device's UUID (DeviceCopyEngine::DeviceUuid; empty when it could not be read): how a
  // client whose CUDA numbering differs finds this tier.
  const std::string& uuid() const { return uuid_; }
  // The copies between this tier's memory and host memory.
  kernels::DeviceCopyEngine& copies() { return arena_->copies(); }

  // StorageTier
  Tier id() const override { return Tier::kGpu; }

  // MemoryTier
  uint64_t capacity_bytes() const override { return segment_bytes_ * segment_count_; }
  uint8_t* Data(const MemorySlot& slot) const override { return arena_->base() + slot.offset; }
  uint64_t segment_bytes() const override { return segment_bytes_; }
  uint64_t max_block_bytes() const override { return segment_bytes_; }
  SegmentLocation Locate(uint64_t offset) const override;
  // `writable` is not enforceable for device memory (see above) and is ignored.
  Result<int> ExportSegment(uint32_t index, uint32_t generation, NamespaceId ns,
                            bool writable) override;
  MemoryTierStats GetStats() const override;
  // The arena's renewal without this tier's lock: no allocation, free or export of other segments
  // (nor the tier manager, which calls those under its own lock) waits for it.
  Status RenewTaken(uint32_t segment) override;

 private:
  SegmentPages::Renewal RenewSegmentLocked(uint32_t index) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // How renewing segment `index` ended, given the arena's answer: a new generation, or logged.
  SegmentPages::Renewal RenewalOutcomeLocked(uint32_t index, const Status& st)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<kernels::DeviceArena> arena_;
  const uint64_t segment_bytes_;
  const uint32_t segment_count_;
  std::string uuid_;

  std::vector<uint32_t> generations_ ABSL_GUARDED_BY(mu_);  // bumped at each renewal
};

}  // namespace kvpool::tiers
