#pragma once
// NamespaceId: the daemon's dense number for a namespace (tenant). The name-to-id registry is
// persisted, so an id names the same namespace across restarts; ids partition the key space in
// the index, the host arena and RocksDB. NamespacedKey: a block key within its namespace, for
// hash maps keyed by both.

#include <cstdint>
#include <utility>

#include <kvpool/block_key.h>

namespace kvpool {

using NamespaceId = uint32_t;
inline constexpr NamespaceId kNoNamespace = UINT32_MAX;

// A block key within its namespace, hashable (absl::Hash).
struct NamespacedKey {
  NamespaceId ns;
  BlockKey key;
  bool operator==(const NamespacedKey& o) const { return ns == o.ns && key == o.key; }
  // Every byte of the key (BlockKey's own AbslHashValue): keys come from clients, who may choose
  // them (BlockKeyHash, the key's first 8 bytes, trusts them not to).
  template <typename H>
  friend H AbslHashValue(H h, const NamespacedKey& k) {
    return H::combine(std::move(h), k.ns, k.key);
  }
};

}  // namespace kvpool
