#pragma once
// SocketDelivery: block bodies inside the control frames, the path every connection has. A
// get's bytes follow its response, written straight from the leased slots (the handler releases
// the leases once they are on the wire); a put's bytes follow its PUT_COMMIT frame and are read
// straight into the reserved slots. Asking for a path this connection was not granted is
// FailedPrecondition here, at the bottom of the stack (daemon/delivery.h).
//
// Called by the block handlers (daemon/block_handlers.h) for one connection at a time.

#include <cstdint>

#include "daemon/delivery.h"
#include "tiers/tier_manager.h"

namespace kvpool::daemon {

class SocketDelivery final : public BlockDelivery {
 public:
  // `owner`: the connection's lease and reservation owner id. `tiers` outlives this.
  SocketDelivery(tiers::TierManager& tiers, uint64_t owner) : tiers_(tiers), owner_(owner) {}

  // BlockDelivery
  Status Check(const PathAsk& ask) const override;
  void BeginGet() override {}
  LeaseTerms TermsFor(const PathAsk& ask) const override;
  bool BoundedByFrame(const PathAsk& ask) const override { return true; }
  uint64_t Send(const PathAsk& ask, uint32_t position, tiers::BlockRead& read,
                wire::BlockInfo* info, transport::Response* response) override;
  void DescribeSlot(const PathAsk& ask, uint64_t arena_offset, wire::Reservation* out) override {}
  transport::PayloadSink InFrameSink(uint64_t id, uint64_t size, Status* why) override;
  Status CheckReceive(const PathAsk& ask, size_t blocks) const override { return Status::OK(); }
  void Receive(const PathAsk& ask, PendingCommit& commit,
               std::span<const uint64_t> sizes) override {}

 private:
  tiers::TierManager& tiers_;
  const uint64_t owner_;
};

}  // namespace kvpool::daemon
