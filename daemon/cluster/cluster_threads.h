#pragma once
// The role under which the cluster layer starts its threads (one watch thread per EtcdWatch,
// one keepalive thread per Membership). common/threads.h has no cluster role yet: until the
// daemon's thread list gains ThreadRole::kCluster ("kvp-cluster-N"), they run under kControlIo
// with indices from 100 up, so `top -H` shows them as kvp-io-1NN. Only this line changes then.
//
// Thread safety: NextClusterThreadIndex may be called from any thread.

#include <atomic>

#include "common/threads.h"

namespace kvpool::daemon::cluster {

inline constexpr ThreadRole kClusterThreadRole = ThreadRole::kControlIo;

inline int NextClusterThreadIndex() {
  static std::atomic<int> next{100};  // relaxed: only uniqueness matters
  return next.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace kvpool::daemon::cluster
