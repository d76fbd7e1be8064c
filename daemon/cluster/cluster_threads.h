#pragma once
// The role under which the cluster layer starts its threads (one watch thread per EtcdWatch,
// one keepalive thread per Membership): ThreadRole::kCluster, shown as kvp-cluster-N.
//
// Thread safety: NextClusterThreadIndex may be called from any thread.

#include <atomic>

#include "common/threads.h"

namespace kvpool::daemon::cluster {

inline constexpr ThreadRole kClusterThreadRole = ThreadRole::kCluster;

inline int NextClusterThreadIndex() {
  static std::atomic<int> next{0};  // relaxed: only uniqueness matters
  return next.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace kvpool::daemon::cluster
