#pragma once
// FetchMemory: what a cluster node remembers between fetches from its peers, so that neither a
// cold chain nor a dead peer costs every request again:
//   - a peer that failed (no connection, or a request that failed or timed out) is skipped for
//     `backoff`: an unreachable stale member costs its connect timeout once, not on every call;
//   - a key every member was asked for and none held is a miss for `absent_ttl`: a cold chain
//     looked up again and again is not fanned out to the cluster each time. (A put of it here is
//     a local hit at once; one elsewhere in the cluster is seen once the entry ends.)
// Both are bounded (the oldest half of the absent keys go when `max_absent` is reached).
//
// Thread safety: every method may be called from any thread.

#include <chrono>
#include <cstdint>
#include <string>

#include <kvpool/block_key.h>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/namespace_id.h"

namespace kvpool::daemon::cluster {

struct FetchMemoryOptions {
  Clock::Duration backoff = std::chrono::seconds(2);
  Clock::Duration absent_ttl = std::chrono::milliseconds(500);
  size_t max_absent = 1 << 16;
  Clock* clock = nullptr;  // null: RealClock()
};

class FetchMemory {
 public:
  explicit FetchMemory(FetchMemoryOptions options = {});

  // Whether `peer` (its control address) failed within the backoff; counts a skip when so.
  bool Skip(const std::string& peer);
  void Failed(const std::string& peer);
  void Answered(const std::string& peer);

  // Whether every member lacked the key within the TTL; counts a hit when so.
  bool KnownAbsent(NamespaceId ns, const BlockKey& key);
  void Absent(NamespaceId ns, const BlockKey& key);

  struct Stats {
    uint64_t peers_skipped = 0;  // requests not sent to a peer in backoff
    uint64_t absent_hits = 0;    // keys not asked for because no member had them just now
  };
  Stats GetStats() const;

 private:
  const FetchMemoryOptions options_;
  Clock& clock_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Clock::TimePoint> failed_until_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<NamespacedKey, Clock::TimePoint> absent_until_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvpool::daemon::cluster
