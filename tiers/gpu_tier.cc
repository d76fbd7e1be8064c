#include "tiers/gpu_tier.h"

#include <glog/logging.h>

#include <string>

namespace kvpool::tiers {

GpuTier::GpuTier(std::unique_ptr<kernels::DeviceArena> arena)
    : SegmentedTier("gpu " + std::to_string(arena->device()), arena->segment_bytes(),
                    arena->segment_count()),
      arena_(std::move(arena)),
      segment_bytes_(arena_->segment_bytes()),
      segment_count_(arena_->segment_count()) {
  Result<std::string> uuid = arena_->copies().DeviceUuid(arena_->device());
  if (uuid.ok()) {
    uuid_ = *uuid;
  } else {
    LOG(WARNING) << "gpu " << arena_->device() << ": no device UUID (" << uuid.status().ToString()
                 << "); clients will not find this tier";
  }
  absl::MutexLock lock(&mu_);
  generations_.assign(segment_count_, 1);
}

SegmentPages::Renewal GpuTier::RenewSegmentLocked(uint32_t index) {
  return RenewalOutcomeLocked(index, arena_->Renew(index));
}

Status GpuTier::RenewTaken(uint32_t segment) {
  // Out of every pool and owned by nobody (TakeVacant): no slot, no allocation and no export
  // reaches the segment while the arena replaces its memory (DeviceArena::Renew of one segment
  // may run beside anything on others).
  const Status st = arena_->Renew(segment);
  absl::MutexLock lock(&mu_);
  RenewedLocked(segment, RenewalOutcomeLocked(segment, st));
  return st;
}

SegmentPages::Renewal GpuTier::RenewalOutcomeLocked(uint32_t index, const Status& st) {
  if (!st.ok()) {
    // The arena released the old memory first and holds none for it now (DeviceArena::Renew):
    // nobody's, and renewed again when next needed. A full GPU, typically: a client that still
    // imports a segment's old memory keeps it allocated (clients drop idle imports).
    LOG_EVERY_N(WARNING, 16) << "gpu " << arena_->device() << " segment " << index
                             << " could not get fresh memory (" << st.ToString()
                             << "); retried when next needed";
    return SegmentPages::Renewal::kEmpty;
  }
  ++generations_[index];
  return SegmentPages::Renewal::kRenewed;
}

SegmentLocation GpuTier::Locate(uint64_t offset) const {
  const uint32_t index = static_cast<uint32_t>(offset / segment_bytes_);
  absl::MutexLock lock(&mu_);
  return SegmentLocation{index, generations_[index], offset % segment_bytes_};
}

Result<int> GpuTier::ExportSegment(uint32_t index, uint32_t generation, NamespaceId ns,
                                   bool /*writable*/) {
  absl::MutexLock lock(&mu_);
  if (index >= segment_count_) {
    return Status::InvalidArgument("no gpu segment " + std::to_string(index));
  }
  // Another namespace's segment and a stale generation get one answer: a tenant learns nothing
  // of other tenants' segments (whose they are, whether and how often they were renewed).
  if (pages_.OwnerOf(index) != ns || ns == kNoNamespace || generations_[index] != generation) {
    return Status::NotFound("gpu segment " + std::to_string(index) + " generation " +
                            std::to_string(generation) +
                            " is not this namespace's (recycled, or never its own)");
  }
  return arena_->ExportSegment(index);
}

MemoryTierStats GpuTier::GetStats() const {
  absl::MutexLock lock(&mu_);
  MemoryTierStats s = pages_.Stats();
  s.locked = true;  // device memory is never paged out
  return s;
}

}  // namespace kvpool::tiers
