#pragma once
// SharedMemoryDelivery: the same-node path, granted at hello to a local (Unix socket) client
// that asks. A GET that asks in place answers each leased block's (segment, generation, offset)
// and hands its lease to the client, which copies from its read-only mapping and sends RELEASE
// (or the lease expires after `lease_timeout`, or the connection closes); a block read straight
// from disk has no slot and still travels in the frame. A PUT_RESERVE in place answers where each
// reserved slot is; the client writes it through a writable mapping (MAP_SEGMENTS, handled in
// daemon/block_handlers.cc) and PUT_COMMIT in place verifies each checksum before publishing.
//
// Ownership protocol: a reserved slot belongs to its writer until commit, abort, expiry or
// disconnect; after that the writer must not touch it. A writer that breaks this can only reach
// its own namespace's segments (descriptors are per segment and per namespace, and an emptied
// segment gets a fresh memfd before another namespace may have it), and readers verify
// checksums, so the worst it causes is a miss in its own namespace.
//
// Requests that do not ask in place go to the delivery below (daemon/delivery.h). Called by the
// block handlers for one connection at a time.

#include <chrono>
#include <cstdint>
#include <memory>

#include "daemon/delivery.h"
#include "tiers/tier_manager.h"

namespace kvpool::daemon {

class SharedMemoryDelivery final : public LayeredDelivery {
 public:
  // `owner`: the connection's lease owner id. `tiers` outlives this.
  SharedMemoryDelivery(tiers::TierManager& tiers, uint64_t owner,
                       std::chrono::milliseconds lease_timeout,
                       std::unique_ptr<BlockDelivery> below)
      : LayeredDelivery(std::move(below)),
        tiers_(tiers),
        owner_(owner),
        lease_timeout_(lease_timeout) {}

  // BlockDelivery
  Status Check(const PathAsk& ask) const override;
  LeaseTerms TermsFor(const PathAsk& ask) const override;
  uint64_t Send(const PathAsk& ask, uint32_t position, tiers::BlockRead& read,
                wire::BlockInfo* info, transport::Response* response) override;
  void DescribeSlot(const PathAsk& ask, uint64_t arena_offset, wire::Reservation* out) override;
  // In place, the client wrote the bytes itself: nothing to receive.
  void Receive(const PathAsk& ask, PendingCommit& commit, std::span<const uint64_t> sizes) override;

 private:
  void SetSlot(uint64_t arena_offset, wire::SegmentSlot* slot) const;

  tiers::TierManager& tiers_;
  const uint64_t owner_;
  const std::chrono::milliseconds lease_timeout_;
};

// Names, in `slot`, the place `gpu_offset` of the gpu tier on CUDA device `device`, for a client
// that maps that segment (MAP_SEGMENTS gpu): a leased gpu copy, or a gpu slot to write. Fails as
// TierManager::LocateGpu, leaving `slot` as it was.
Status SetGpuSlot(const tiers::TierManager& tiers, int device, uint64_t gpu_offset,
                  wire::SegmentSlot* slot);

}  // namespace kvpool::daemon
