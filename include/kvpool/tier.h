#pragma once
// kvpool::Tier: the tiers a block can be cached in, fastest first.
//
// The one tier vocabulary of the code base: the client API, the daemon's tier manager and its
// block index all use it. Only the wire schema (transport/control.proto `Tier`) and the C API
// (`kvpool_tier`) have their own spellings, converted where a message or a C call is built.

#include <cstdint>

namespace kvpool {

enum class Tier : uint8_t { kNone = 0, kGpu = 1, kHost = 2, kDisk = 3, kRemote = 4 };

// "none", "gpu", "host", "disk", "remote".
const char* TierName(Tier tier);

}  // namespace kvpool
