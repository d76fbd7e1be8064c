#pragma once
// The tiers' names, for messages: one body behind kvpool::TierName (the client library, which
// exports it) and the daemon's libraries (which do not link the client library).

#include <kvpool/tier.h>

namespace kvpool {

inline const char* TierNameOf(Tier tier) {
  switch (tier) {
    case Tier::kNone:
      return "none";
    case Tier::kGpu:
      return "gpu";
    case Tier::kHost:
      return "host";
    case Tier::kDisk:
      return "disk";
    case Tier::kRemote:
      return "remote";
  }
  return "unknown";
}

}  // namespace kvpool
