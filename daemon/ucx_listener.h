#pragma once
// UcxListener: kvpoold's UCX listener for clients (and peers, which connect as clients). A TCP
// connection whose hello asks for UCX gets an offer (Offer, with the connection's address and the
// client id of the client's UCX engine, which its hello names); the listener accepts a
// connection request only from an address with an offer waiting for the client id the request
// carries, and takes that offer. Another process at the same address (a multi-user host, a NAT)
// does not know that id, so it cannot take the offer. It sends each accepted endpoint its bind
// nonce and hands the endpoint to the control connection, from the same address, that names the
// nonce (transport/ucx_bind.h has the protocol). Nobody without an admitted control connection gets
// an endpoint, and no endpoint goes to a connection from another address.
//
// Offers and endpoints not taken within `claim_within` are dropped (the endpoints closed) at the
// listener's next use; past `max_unclaimed` endpoints waiting, new ones are closed at once.
//
// Thread safety: Offer and Claim may be called from any thread; admission and acceptance run on
// the engine's progress thread. Ownership: the engine outlives the listener; the destructor stops
// the listener and closes the endpoints nobody claimed. Claimed endpoints belong to the claimant
// (UcxDelivery disconnects them).

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"
#include "transport/ucx_engine.h"

namespace kvpool::daemon {

// A tag prefix one live connection holds (UcxListener::HoldTagPrefix): no other connection of the
// listener holds the same one until this handle goes (it may outlive the listener).
class TagPrefix {
 public:
  TagPrefix() = default;
  TagPrefix(TagPrefix&& other) noexcept;
  TagPrefix& operator=(TagPrefix&& other) noexcept;
  ~TagPrefix();
  // The upper 24 bits of the tags the connection's client sends under (the rest are zero).
  uint64_t value() const { return value_; }

  struct Held;  // the prefixes held (shared by the listener and its handles)

 private:
  friend class UcxListener;
  TagPrefix(std::shared_ptr<Held> held, uint64_t value) : held_(std::move(held)), value_(value) {}
  void Release();
  std::shared_ptr<Held> held_;
  uint64_t value_ = 0;
};

struct UcxListenerOptions {
  // How long an offer, and an accepted endpoint, wait to be taken. Default: 10 s.
  std::chrono::milliseconds claim_within{10000};
  // Accepted endpoints waiting for their UCX_BIND, at most, and at most from one address (so
  // that clients at a few addresses cannot keep everyone else's out). Defaults: 1,024 and 64.
  size_t max_unclaimed = 1024;
  size_t max_unclaimed_per_address = 64;
  // Offers waiting for a connection request, at most per address (a host with many clients
  // connecting at once). Default: 256.
  size_t max_offers_per_address = 256;
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

  // Lets one connection request from `peer_ip` (transport::CanonicalIp form) that carries
  // `client_id` in (UcxEngine::client_id of the requester; 0 for a client that names none, as
  // clients before 2026-12-07: any request from that address without an id then takes it).
  // False when `peer_ip` has max_offers_per_address offers waiting already: UCX is then not
  // offered.
  bool Offer(const std::string& peer_ip, uint64_t client_id);

  // The endpoint whose nonce is `nonce`, taken out of the listener (a second claim of it is
  // NotFound), for a connection from `peer_ip`. NotFound for a nonce never sent, already claimed
  // or expired, or sent to an endpoint from another address.
  Result<transport::UcxEndpointId> Claim(std::string_view nonce, const std::string& peer_ip);

  // The upper 24 bits of the tags connection `connection_id`'s client sends to kvpoold under
  // (the rest are the client's): a keyed permutation of the id's low 24 bits, so no two of 2^24
  // consecutive connections share one, and no client can tell another's from its own (kvpoold's
  // worker takes a tagged message from any endpoint; a guessed prefix would let a client spoil
  // another's puts, never with wrong bytes: the commit verifies every checksum).
  uint64_t TagPrefixFor(uint64_t connection_id) const;
  // TagPrefixFor(connection_id), held for the connection; where a live connection holds that one
  // already (its id 2^24 below), that of the next id that none holds.
  TagPrefix HoldTagPrefix(uint64_t connection_id);

  struct State;  // shared with the engine's callbacks (ucx_listener.cc)

 private:
  UcxListener(transport::UcxEngine& engine, std::shared_ptr<State> state, uint16_t port);

  transport::UcxEngine& engine_;
  const std::shared_ptr<State> state_;
  const uint16_t port_;
  std::string prefix_key_;  // random, for TagPrefixFor
  const std::shared_ptr<TagPrefix::Held> held_prefixes_;
};

}  // namespace kvpool::daemon
