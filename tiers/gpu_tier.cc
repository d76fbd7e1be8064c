#include "tiers/gpu_tier.h"

#include <glog/logging.h>

#include <string>

namespace kvpool::tiers {

GpuTier::GpuTier(std::unique_ptr<kernels::DeviceArena> arena)
    : arena_(std::move(arena)),
      segment_bytes_(arena_->segment_bytes()),
      segment_count_(arena_->segment_count()),
      pages_("gpu " + std::to_string(arena_->device()), segment_bytes_, segment_count_) {
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

Result<MemorySlot> GpuTier::Allocate(NamespaceId ns, uint64_t length) {
  absl::MutexLock lock(&mu_);
  return pages_.Allocate(ns, length);
}

void GpuTier::Free(const MemorySlot& slot) {
  absl::MutexLock lock(&mu_);
  if (!pages_.Free(slot)) return;
  const uint32_t index = pages_.SegmentOf(slot.offset);
  const Status st = arena_->Renew(index);
  if (st.ok()) {
    ++generations_[index];
  } else {
    // Its old memory may still hold the last owner's blocks: it goes to nobody.
    LOG(ERROR) << "gpu " << arena_->device() << " segment " << index
               << " could not get fresh memory (" << st.ToString() << "); it stays out of use";
  }
  pages_.Recycled(index, st.ok());
}

uint64_t GpuTier::allocated_bytes() const {
  absl::MutexLock lock(&mu_);
  return pages_.allocated_bytes();
}

void GpuTier::SetSegmentLimit(NamespaceId ns, uint32_t max_segments) {
  absl::MutexLock lock(&mu_);
  pages_.SetSegmentLimit(ns, max_segments);
}

uint32_t GpuTier::SegmentsOf(NamespaceId ns) const {
  absl::MutexLock lock(&mu_);
  return pages_.SegmentsOf(ns);
}

bool GpuTier::AtSegmentLimit(NamespaceId ns) const {
  absl::MutexLock lock(&mu_);
  return pages_.AtSegmentLimit(ns);
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
  if (generations_[index] != generation) {
    return Status::NotFound("gpu segment " + std::to_string(index) + " was recycled");
  }
  if (pages_.OwnerOf(index) != ns || ns == kNoNamespace) {
    return Status::PermissionDenied("gpu segment " + std::to_string(index) +
                                    " does not belong to this namespace");
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
