#pragma once
// UcxDelivery: block bodies as tagged UCX messages between the client's buffers and the host
// tier's slots, granted by UCX_BIND on the endpoint the client made to kvpoold's UCX listener
// (transport/ucx_bind.h). A GET via
// UCX sends block i with tag ucx_tag_base + i to the client's worker and answers at once; each
// send holds its block's lease (owned by the send, not the connection) until it completes, and
// one still running after `timeout` (or at disconnect) is cancelled, which ends its lease. A
// PUT_COMMIT via UCX receives each body into its reservation on the daemon's worker, within this
// connection's tag space, and answers once every receive ended (or `timeout` passed). The
// receiver verifies each checksum: the client for gets, the commit for puts.
//
// This is the only code that calls UCX for a client connection's data. Requests that do not
// ask via UCX go to the delivery below (daemon/delivery.h).
//
// Thread safety: called for one connection at a time; send and receive completions run on the
// UCX progress thread and touch only their own state (the lease they hold, a shared tally).
// Destruction cancels the connection's outstanding sends and closes its endpoint.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "daemon/delivery.h"
#include "daemon/ucx_listener.h"
#include "tiers/tier_manager.h"
#include "transport/ucx_engine.h"

namespace kvpool::daemon {

class UcxDelivery final : public LayeredDelivery {
 public:
  // Carries the connection's blocks over `ep`, the endpoint its client made to kvpoold's UCX
  // listener (daemon/ucx_listener.h), which the delivery now owns; the client's sends come under
  // `tag_prefix` (upper 24 bits; UcxListener::HoldTagPrefix), held while the delivery lives.
  // `below` carries requests that do not ask via UCX. `engine` and `tiers` outlive the delivery.
  // Sends of GET answers are bounded in time (`timeout`: cancelled at their deadline, which
  // ends their leases) and in bytes: while more than `max_unreceived_bytes` of them wait for
  // the client to receive them, its UCX requests are refused (ResourceExhausted).
  static std::unique_ptr<UcxDelivery> Adopt(transport::UcxEngine& engine,
                                            transport::UcxEndpointId ep, TagPrefix tag_prefix,
                                            tiers::TierManager& tiers, uint64_t owner,
                                            std::chrono::milliseconds timeout,
                                            uint64_t max_unreceived_bytes,
                                            std::unique_ptr<BlockDelivery> below);
  ~UcxDelivery() override;

  // For the UCX_BIND answer: the prefix (upper 24 bits) of the tags this connection's client
  // sends to kvpoold.
  uint64_t tag_prefix() const { return tag_prefix_.value(); }

  // BlockDelivery
  Status Check(const PathAsk& ask) const override;
  void BeginGet() override;
  LeaseTerms TermsFor(const PathAsk& ask) const override;
  bool BoundedByFrame(const PathAsk& ask) const override;
  uint64_t Send(const PathAsk& ask, uint32_t position, tiers::BlockRead& read,
                wire::BlockInfo* info, transport::Response* response) override;
  Status CheckReceive(const PathAsk& ask, size_t blocks) const override;
  void Receive(const PathAsk& ask, PendingCommit& commit, std::span<const uint64_t> sizes) override;

 private:
  UcxDelivery(transport::UcxEngine& engine, transport::UcxEndpointId ep, TagPrefix tag_prefix,
              tiers::TierManager& tiers, uint64_t owner, std::chrono::milliseconds timeout,
              uint64_t max_unreceived_bytes, std::unique_ptr<BlockDelivery> below);

  transport::UcxEngine& engine_;
  const transport::UcxEndpointId ep_;  // the client's worker
  const TagPrefix tag_prefix_;
  tiers::TierManager& tiers_;
  const uint64_t owner_;
  const std::chrono::milliseconds timeout_;
  const uint64_t max_unreceived_bytes_;
  // Bytes of sends not yet completed; shared with their completion callbacks, which may run
  // after this delivery is gone.
  std::shared_ptr<std::atomic<uint64_t>> unreceived_ = std::make_shared<std::atomic<uint64_t>>(0);
  // Sends of GET answers and when they must have finished.
  std::deque<std::pair<transport::UcxOpId, std::chrono::steady_clock::time_point>> sends_;
};

}  // namespace kvpool::daemon
