#include "daemon/shm_delivery.h"

#include <utility>

namespace kvpool::daemon {

Status SharedMemoryDelivery::Check(const PathAsk& ask) const {
  PathAsk rest = ask;
  rest.in_place = false;  // granted
  return below().Check(rest);
}

LeaseTerms SharedMemoryDelivery::TermsFor(const PathAsk& ask) const {
  // In-place leases are the client's: they end on RELEASE, disconnect or expiry.
  if (ask.in_place) return LeaseTerms{owner_, lease_timeout_};
  return below().TermsFor(ask);
}

uint64_t SharedMemoryDelivery::Send(const PathAsk& ask, uint32_t position, tiers::BlockRead& read,
                                    wire::BlockInfo* info, transport::Response* response) {
  if (!ask.in_place || read.lease_id == 0) {
    // Not asked in place, or read straight from disk (no slot to name): in the frame.
    return below().Send(ask, position, read, info, response);
  }
  // The client copies it from its mapping and releases the lease; nothing in the frame.
  if (read.gpu_device >= 0) {
    // From the gpu tier the client asked for: it maps that segment (MAP_SEGMENTS gpu).
    wire::SegmentSlot gpu_slot;
    if (SetGpuSlot(tiers_, read.gpu_device, read.gpu_offset, &gpu_slot).ok()) {
      *info->mutable_slot() = std::move(gpu_slot);
      info->set_device_checksum(read.device_checksum);
    } else {
      SetSlot(read.arena_offset, info->mutable_slot());  // its host copy, then
      info->set_tier(wire::TIER_HOST);
    }
  } else {
    SetSlot(read.arena_offset, info->mutable_slot());
  }
  info->set_lease_id(read.lease_id);
  read.lease_id = 0;  // the client's now: RELEASE, disconnect or expiry ends it
  return 0;
}

void SharedMemoryDelivery::DescribeSlot(const PathAsk& ask, uint64_t arena_offset,
                                        wire::Reservation* out) {
  if (!ask.in_place) return below().DescribeSlot(ask, arena_offset, out);
  // The client writes through its own mapping; the reservation still expires if it is never
  // committed (a late write can then only touch this namespace's own segment).
  SetSlot(arena_offset, out->mutable_slot());
}

void SharedMemoryDelivery::Receive(const PathAsk& ask, PendingCommit& commit,
                                   std::span<const uint64_t> sizes) {
  if (!ask.in_place) below().Receive(ask, commit, sizes);
}

Status SetGpuSlot(const tiers::TierManager& tiers, int device, uint64_t gpu_offset,
                  wire::SegmentSlot* slot) {
  KVPOOL_ASSIGN_OR_RETURN(tiers::SegmentLocation loc, tiers.LocateGpu(device, gpu_offset));
  slot->set_segment(loc.segment);
  slot->set_generation(loc.generation);
  slot->set_offset(loc.offset);
  slot->set_gpu(true);
  slot->set_gpu_device(device);
  return Status::OK();
}

void SharedMemoryDelivery::SetSlot(uint64_t arena_offset, wire::SegmentSlot* slot) const {
  const tiers::SegmentLocation loc = tiers_.Locate(arena_offset);
  slot->set_segment(loc.segment);
  slot->set_generation(loc.generation);
  slot->set_offset(loc.offset);
}

}  // namespace kvpool::daemon
