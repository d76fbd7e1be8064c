#pragma once
// NamespaceId: the daemon's dense number for a namespace (tenant). The name-to-id registry is
// persisted, so an id names the same namespace across restarts; ids partition the key space in
// the index, the host arena and RocksDB.

#include <cstdint>

namespace kvpool {

using NamespaceId = uint32_t;
inline constexpr NamespaceId kNoNamespace = UINT32_MAX;

}  // namespace kvpool
