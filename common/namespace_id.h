#pragma once
// NamespaceId: the daemon's dense number for a namespace (tenant). The name-to-id registry is
// persisted, so an id names the same namespace across restarts; ids partition the key space in
// the index, the host arena and RocksDB. NamespacedKey: a block key within its namespace, for
// hash maps keyed by both.

#include <cstdint>
#include <cstring>
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
  // Every byte of the key, as four integers mixed into abseil's seeded state: keys come from
  // clients, who may choose them (BlockKeyHash, the key's first 8 bytes, trusts them not to).
  template <typename H>
  friend H AbslHashValue(H h, const NamespacedKey& k) {
    uint64_t w[4];
    static_assert(sizeof(w) == BlockKey::kSize);
    std::memcpy(w, k.key.bytes.data(), sizeof(w));
    return H::combine(std::move(h), k.ns, w[0], w[1], w[2], w[3]);
  }
};

}  // namespace kvpool
