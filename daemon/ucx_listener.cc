#include "daemon/ucx_listener.h"

#include <glog/logging.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <deque>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "transport/ucx_bind.h"

namespace kvpool::daemon {

using Clock = std::chrono::steady_clock;

struct UcxListener::State {
  State(transport::UcxEngine& e, const UcxListenerOptions& o) : engine(e), options(o) {}

  // On the engine's progress thread, for each connection request: takes an offer for `ip` and
  // the client id the request carries (read only where an offer for `ip` waits).
  bool Admit(const std::string& ip, const transport::UcxEngine::ClientIdOf& client_id_of);
  // On the engine's progress thread, for each endpoint admitted.
  void Accept(transport::UcxEndpointId ep, const std::string& ip);
  // Drops expired offers, and takes the endpoints whose nonce expired out of `unclaimed`; the
  // caller closes them.
  std::vector<transport::UcxEndpointId> Expire(Clock::time_point now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  transport::UcxEngine& engine;
  const UcxListenerOptions options;

  struct Unclaimed {
    transport::UcxEndpointId ep = 0;
    std::string ip;  // where it came from
    Clock::time_point expires;
  };
  absl::Mutex mu;
  bool closed ABSL_GUARDED_BY(mu) = false;
  // Offers by address: for which client id, and when each expires, oldest first.
  struct Offered {
    Clock::time_point expires;
    uint64_t client_id = 0;
  };
  std::unordered_map<std::string, std::deque<Offered>> offers ABSL_GUARDED_BY(mu);
  // (address, expiry) of every offer, oldest first; a taken one is skipped when its turn comes.
  std::deque<std::pair<Clock::time_point, std::string>> offer_expiry ABSL_GUARDED_BY(mu);
  std::unordered_map<std::string, Unclaimed> unclaimed ABSL_GUARDED_BY(mu);  // by nonce
  std::unordered_map<std::string, size_t> unclaimed_per_address ABSL_GUARDED_BY(mu);
  // Takes the endpoint of `it` out of `unclaimed` (and its address's count).
  void Drop(std::unordered_map<std::string, Unclaimed>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto n = unclaimed_per_address.find(it->second.ip);
    if (n != unclaimed_per_address.end() && --n->second == 0) unclaimed_per_address.erase(n);
    unclaimed.erase(it);
  }
  // Nonces in the order they expire; a claimed one is skipped when its turn comes.
  std::deque<std::string> expiry ABSL_GUARDED_BY(mu);
};

std::vector<transport::UcxEndpointId> UcxListener::State::Expire(Clock::time_point now) {
  while (!offer_expiry.empty() && offer_expiry.front().first <= now) {
    auto it = offers.find(offer_expiry.front().second);
    if (it != offers.end()) {
      while (!it->second.empty() && it->second.front().expires <= now) it->second.pop_front();
      if (it->second.empty()) offers.erase(it);
    }
    offer_expiry.pop_front();
  }
  std::vector<transport::UcxEndpointId> gone;
  while (!expiry.empty()) {
    auto it = unclaimed.find(expiry.front());
    if (it != unclaimed.end()) {
      if (it->second.expires > now) break;
      gone.push_back(it->second.ep);
      Drop(it);
    }
    expiry.pop_front();
  }
  return gone;
}

bool UcxListener::State::Admit(const std::string& ip,
                               const transport::UcxEngine::ClientIdOf& client_id_of) {
  std::vector<transport::UcxEndpointId> close;
  bool admitted = false;
  // Whether an offer for `ip` waits and the bounds leave room for its endpoint.
  auto room = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (closed) return offers.end();
    auto it = offers.find(ip);
    auto waiting = unclaimed_per_address.find(ip);
    const size_t from_ip = waiting == unclaimed_per_address.end() ? 0 : waiting->second;
    return unclaimed.size() < options.max_unclaimed && from_ip < options.max_unclaimed_per_address
               ? it
               : offers.end();
  };
  bool expected = false;
  {
    absl::MutexLock lock(&mu);
    close = Expire(Clock::now());
    expected = room() != offers.end();
  }
  // Only a request from an address with an offer waiting has its client id read: UCX parses the
  // request's own data for it (UcxEngine::Listen), so a request from anywhere else is refused
  // unread. (Read without the lock: the offer may be taken meanwhile, checked below.)
  if (expected) {
    const uint64_t client_id = client_id_of();
    absl::MutexLock lock(&mu);
    auto it = room();
    if (it != offers.end()) {
      // The oldest offer made for this client id (at most max_offers_per_address to look at).
      std::deque<Offered>& at_ip = it->second;
      auto offer = std::find_if(at_ip.begin(), at_ip.end(),
                                [&](const Offered& o) { return o.client_id == client_id; });
      if (offer != at_ip.end()) {
        at_ip.erase(offer);
        if (at_ip.empty()) offers.erase(it);
        admitted = true;
      }
    }
  }
  for (transport::UcxEndpointId e : close) engine.Disconnect(e);
  if (!admitted) {
    LOG_EVERY_N(WARNING, 100) << "UCX connection request from " << ip
                              << " refused: no connection from there was offered UCX for its "
                              << "client id, or " << options.max_unclaimed << " endpoints (or "
                              << options.max_unclaimed_per_address
                              << " from there) wait for their UCX_BIND (seen " << google::COUNTER
                              << " times)";
  }
  return admitted;
}

void UcxListener::State::Accept(transport::UcxEndpointId ep, const std::string& ip) {
  auto nonce = std::make_shared<std::string>(transport::kUcxBindNonceBytes, '\0');
  bool keep = false;
  {
    absl::MutexLock lock(&mu);
    if (closed) {
      VLOG(1) << "UCX endpoint accepted after the listener closed: closing it";
    } else if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce->data()),
                          static_cast<int>(nonce->size())) != 1) {
      LOG(WARNING) << "no random bytes for a UCX bind nonce: closing the endpoint";
    } else {
      keep = true;
      unclaimed.emplace(*nonce, Unclaimed{ep, ip, Clock::now() + options.claim_within});
      ++unclaimed_per_address[ip];
      expiry.push_back(*nonce);
    }
  }
  if (!keep) {
    engine.Disconnect(ep);
    return;
  }
  // The client receives it from this endpoint (transport/ucx_bind.h); one that never does has
  // the endpoint closed at expiry, which ends this send too.
  engine.SendStream(ep, nonce->data(), nonce->size(), [nonce](Status st) {
    if (!st.ok()) VLOG(1) << "UCX bind nonce not delivered: " << st.ToString();
  });
}

Result<std::unique_ptr<UcxListener>> UcxListener::Start(transport::UcxEngine& engine,
                                                        std::string_view ip, uint16_t port,
                                                        const UcxListenerOptions& options) {
  auto state = std::make_shared<State>(engine, options);
  // The callbacks hold the state, so a request handled after ~UcxListener still finds it.
  KVPOOL_ASSIGN_OR_RETURN(
      uint16_t bound,
      engine.Listen(
          ip, port,
          [state](const std::string& peer, const transport::UcxEngine::ClientIdOf& client_id_of) {
            return state->Admit(peer, client_id_of);
          },
          [state](transport::UcxEndpointId ep, const std::string& peer) {
            state->Accept(ep, peer);
          }));
  return std::unique_ptr<UcxListener>(new UcxListener(engine, std::move(state), bound));
}

struct TagPrefix::Held {
  absl::Mutex mu;
  absl::flat_hash_set<uint64_t> prefixes ABSL_GUARDED_BY(mu);
};

UcxListener::UcxListener(transport::UcxEngine& engine, std::shared_ptr<State> state, uint16_t port)
    : engine_(engine),
      state_(std::move(state)),
      port_(port),
      prefix_key_(32, '\0'),
      held_prefixes_(std::make_shared<TagPrefix::Held>()) {
  if (RAND_bytes(reinterpret_cast<unsigned char*>(prefix_key_.data()),
                 static_cast<int>(prefix_key_.size())) != 1) {
    AbortWithStatus(Status::Internal("RAND_bytes failed"), __FILE__, __LINE__);
  }
}

TagPrefix::TagPrefix(TagPrefix&& other) noexcept
    : held_(std::move(other.held_)), value_(std::exchange(other.value_, 0)) {}

TagPrefix& TagPrefix::operator=(TagPrefix&& other) noexcept {
  if (this != &other) {
    Release();
    held_ = std::move(other.held_);
    value_ = std::exchange(other.value_, 0);
  }
  return *this;
}

TagPrefix::~TagPrefix() { Release(); }

void TagPrefix::Release() {
  if (held_ == nullptr) return;
  absl::MutexLock lock(&held_->mu);
  held_->prefixes.erase(value_);
  held_.reset();
}

TagPrefix UcxListener::HoldTagPrefix(uint64_t connection_id) {
  absl::MutexLock lock(&held_prefixes_->mu);
  // Fewer connections live at once than 2^24 (kvpoold refuses a --max_connections that is not),
  // so one is free within as many tries as there are connections.
  for (uint64_t id = connection_id;; ++id) {
    const uint64_t prefix = TagPrefixFor(id);
    if (held_prefixes_->prefixes.insert(prefix).second) return TagPrefix(held_prefixes_, prefix);
  }
}

uint64_t UcxListener::TagPrefixFor(uint64_t connection_id) const {
  // Four Feistel rounds over two 12-bit halves, HMAC-SHA256 as the round function: a
  // permutation of 24-bit values that only the key's holder can compute.
  uint32_t left = (connection_id >> 12) & 0xFFF, right = connection_id & 0xFFF;
  for (uint8_t round = 0; round < 4; ++round) {
    const uint8_t in[3] = {round, static_cast<uint8_t>(right >> 8), static_cast<uint8_t>(right)};
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int mac_len = 0;
    if (HMAC(EVP_sha256(), prefix_key_.data(), static_cast<int>(prefix_key_.size()), in, sizeof(in),
             mac, &mac_len) == nullptr) {
      AbortWithStatus(Status::Internal("HMAC-SHA256 failed"), __FILE__, __LINE__);
    }
    const uint32_t f = ((uint32_t{mac[0]} << 8) | mac[1]) & 0xFFF;
    const uint32_t next = left ^ f;
    left = right;
    right = next;
  }
  return uint64_t{(left << 12) | right} << 40;
}

UcxListener::~UcxListener() {
  engine_.StopListening();
  std::vector<transport::UcxEndpointId> close;
  {
    absl::MutexLock lock(&state_->mu);
    state_->closed = true;
    for (const auto& [nonce, u] : state_->unclaimed) close.push_back(u.ep);
    state_->unclaimed.clear();
    state_->unclaimed_per_address.clear();
    state_->expiry.clear();
    state_->offers.clear();
    state_->offer_expiry.clear();
  }
  for (transport::UcxEndpointId ep : close) engine_.Disconnect(ep);
}

bool UcxListener::Offer(const std::string& peer_ip, uint64_t client_id) {
  std::vector<transport::UcxEndpointId> close;
  bool offered = false;
  {
    absl::MutexLock lock(&state_->mu);
    const auto now = Clock::now();
    close = state_->Expire(now);
    auto [it, added] = state_->offers.try_emplace(peer_ip);
    std::deque<State::Offered>& waiting = it->second;
    if (waiting.size() < state_->options.max_offers_per_address) {
      waiting.push_back({now + state_->options.claim_within, client_id});
      state_->offer_expiry.emplace_back(waiting.back().expires, peer_ip);
      offered = true;
    }
    if (waiting.empty()) state_->offers.erase(it);
  }
  for (transport::UcxEndpointId ep : close) engine_.Disconnect(ep);
  return offered;
}

Result<transport::UcxEndpointId> UcxListener::Claim(std::string_view nonce,
                                                    const std::string& peer_ip) {
  std::vector<transport::UcxEndpointId> close;
  Result<transport::UcxEndpointId> found = Status::NotFound(
      "no UCX endpoint from this address waits for this nonce (never sent, "
      "already claimed, or not claimed in time)");
  {
    absl::MutexLock lock(&state_->mu);
    close = state_->Expire(Clock::now());
    auto it = state_->unclaimed.find(std::string(nonce));
    if (it != state_->unclaimed.end() && it->second.ip == peer_ip) {
      found = it->second.ep;
      state_->Drop(it);
    }
  }
  for (transport::UcxEndpointId ep : close) engine_.Disconnect(ep);
  return found;
}

}  // namespace kvpool::daemon
