#pragma once
// EvictionPools: the eviction orders of every tier, one pool per namespace that chose its own
// order and one shared default pool for the rest.
//
// It is the block index's CandidateObserver: each candidate of a tier is ranked by the order of
// its namespace's pool for that tier. When a tier needs room, the pool holding the most candidate
// bytes in it gives up victims first, in its own order, then the next; namespaces sharing the
// default pool are ranked as one (so with one order configured, eviction is exactly that order
// across all namespaces). A namespace that changes its order keeps its blocks: its candidates
// move to the new order, coldest first as the old order ranked them.
//
// Thread safety: none; the tier manager calls it under its mutex.

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/status.h"
#include "tiers/block_index.h"
#include "tiers/eviction_order.h"

namespace kvpool::tiers {

class EvictionPools final : public CandidateObserver {
 public:
  // Registers itself as `index`'s observer; the default pool is "lru".
  explicit EvictionPools(BlockIndex& index);

  // The order of the default pool. InvalidArgument for an unknown name.
  Status SetDefaultOrder(std::string_view name);
  // `ns` gets a pool of its own with order `name` (an empty name: back to the default pool).
  Status SetOrder(NamespaceId ns, std::string_view name);
  // The order ranking `ns`'s candidates.
  std::string OrderName(NamespaceId ns) const;

  // Appends victims of `tier` that `evictable` accepts to `out`, until their bytes reach `bytes`:
  // from the pool with the most candidate bytes there first.
  void Victims(Tier tier, uint64_t bytes, const VictimFilter& evictable, std::vector<EntryId>* out);
  // The same, from namespace `ns`'s candidates only (a namespace over its quota gives up its
  // own blocks, never another's), in the order of its pool. In the shared default pool this walks
  // past the other namespaces' candidates.
  void VictimsOf(NamespaceId ns, Tier tier, uint64_t bytes, const VictimFilter& evictable,
                 std::vector<EntryId>* out);

  // CandidateObserver
  void OnCandidate(EntryId id, Tier tier, bool after_child) override;
  void OnNotCandidate(EntryId id, Tier tier) override;
  void OnUse(EntryId id, Tier tier) override;

 private:
  struct Pool {
    std::string name;
    std::array<std::unique_ptr<EvictionOrder>, kStoredTiers> orders;
    std::array<uint64_t, kStoredTiers> bytes{};  // candidate bytes per tier
    std::array<uint64_t, kStoredTiers> count{};  // candidates per tier
  };

  Result<std::unique_ptr<Pool>> MakePool(std::string_view name);
  Pool& PoolOf(NamespaceId ns) const;
  // Moves the candidates of `from` that `belongs` accepts into `to`, in `from`'s order.
  void Move(Pool& from, Pool& to, const std::function<bool(NamespaceId)>& belongs);

  BlockIndex& index_;
  std::unique_ptr<Pool> default_;
  absl::flat_hash_map<NamespaceId, std::unique_ptr<Pool>> own_;
};

}  // namespace kvpool::tiers
