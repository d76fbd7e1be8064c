#pragma once
// UcxListener: kvpoold's UCX listener for clients (and peers, which connect as clients). It
// accepts the endpoints clients create to it, sends each its bind nonce, and hands an endpoint
// to the control connection that names the nonce (transport/ucx_bind.h has the protocol).
// Endpoints nobody claims within `claim_within` are closed; past `max_unclaimed` of them, new
// ones are closed at once.
//
// Thread safety: Claim may be called from any thread; acceptance runs on the engine's progress
// thread. Ownership: the engine outlives the listener; an endpoint accepted after the listener is
// gone is closed. Claimed endpoints belong to the claimant (UcxDelivery disconnects them).

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"
#include "transport/ucx_engine.h"

namespace kvpool::daemon {

struct UcxListenerOptions {
  std::chrono::milliseconds claim_within{10000};
  size_t max_unclaimed = 1024;
};

class UcxListener {
 public:
  // Listens on `ip`:`port` (0: a free port) of `engine`.
  static Result<std::unique_ptr<UcxListener>> Start(transport::UcxEngine& engine,
                                                    std::string_view ip, uint16_t port,
                                                    const UcxListenerOptions& options = {});
  ~UcxListener();
  UcxListener(const UcxListener&) = delete;
  UcxListener& operator=(const UcxListener&) = delete;

  transport::UcxEngine& engine() const { return engine_; }
  uint16_t port() const { return port_; }

  // The endpoint whose nonce is `nonce`, taken out of the listener (a second claim of it is
  // NotFound). NotFound for a nonce never sent, already claimed, or expired.
  Result<transport::UcxEndpointId> Claim(std::string_view nonce);

  // The upper 24 bits of the tags connection `connection_id`'s client sends to kvpoold under
  // (the rest are the client's): a keyed permutation of the id's low 24 bits, so no two of 2^24
  // consecutive connections share one, and no client can tell another's from its own (kvpoold's
  // worker takes a tagged message from any endpoint; a guessed prefix would let a client spoil
  // another's puts, never with wrong bytes: the commit verifies every checksum).
  uint64_t TagPrefixFor(uint64_t connection_id) const;

  struct State;  // shared with the engine's acceptance callback (ucx_listener.cc)

 private:
  UcxListener(transport::UcxEngine& engine, std::shared_ptr<State> state, uint16_t port);

  transport::UcxEngine& engine_;
  const std::shared_ptr<State> state_;
  const uint16_t port_;
  std::string prefix_key_;  // random, for TagPrefixFor
};

}  // namespace kvpool::daemon
