#pragma once
// EvictionOrder: in which order one tier gives up its eviction candidates, a strategy chosen by
// name per namespace.
//
// The block index decides *which* entries may go (its candidates: a copy in the tier and no
// child with one there, no session pin for disk; see tiers/block_index.h), so every order evicts
// tail first and a prefix never loses its middle. An order only ranks the candidates it is given
// and never sees anything else; the tier manager skips leased and busy ones through the filter
// of Victims. Built in:
//   "lru"     least recently used first (the default). A block that becomes a candidate because
//             its last child left goes to the cold end: it was used together with that child.
//   "s3fifo"  S3-FIFO (Yang et al., SOSP '23): new candidates enter a small FIFO (10% of the
//             candidates); one not used again while there leaves first, one used moves to the
//             main FIFO, where a used block is reinserted once per use instead of evicted; a ghost
//             list of recently evicted keys sends a returning block straight to main.
//   "lfu"     least frequently used first, with aging: uses count per candidate (seeded from the
//             block's hits, at most the highest current count), halved for all once the uses
//             since the last halving exceed the candidate count, so yesterday's hot prefix does
//             not stay forever; LRU among equals.
// A new order is a class implementing this interface, registered with
// EvictionOrderRegistry().Register("name", factory) (examples/custom_eviction.cc).
//
// Storage: an order keeps its candidates in the entries themselves (an entry's OrderLinks of this
// order's tier, BlockIndex::Order: list links and a word), through CandidateList, so it allocates
// nothing per block.
//
// Thread safety: none; called under the tier manager's mutex.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <kvpool/tier.h>

#include "tiers/block_index.h"
#include "tiers/strategy_registry.h"

namespace kvpool::tiers {

// What an order is built for: the index whose entries it ranks and the tier.
struct EvictionContext {
  BlockIndex* index = nullptr;
  Tier tier = Tier::kHost;
};

// Whether the tier manager can evict `id` now (not leased, no I/O in flight).
using VictimFilter = std::function<bool(EntryId)>;

class EvictionOrder {
 public:
  virtual ~EvictionOrder() = default;
  virtual std::string name() const = 0;

  // `id` became a candidate; `after_child`: because its last child here left.
  virtual void Add(EntryId id, bool after_child) = 0;
  // `id` is no longer a candidate (evicted, or it gained a child here).
  virtual void Remove(EntryId id) = 0;
  // A candidate was used.
  virtual void Use(EntryId id) = 0;
  // Appends candidates that `evictable` accepts to `out`, first victim first, until their bytes
  // reach `bytes` or candidates run out. Leaves them in place (evicting them calls Remove); it
  // may reorganize itself on the way (S3-FIFO moves used entries to main).
  virtual void Victims(uint64_t bytes, const VictimFilter& evictable,
                       std::vector<EntryId>* out) = 0;
};

using EvictionOrderFactory = StrategyRegistry<EvictionOrder, EvictionContext>::Factory;
// The registry of eviction orders ("lru", "s3fifo", "lfu" built in).
StrategyRegistry<EvictionOrder, EvictionContext>& EvictionOrderRegistry();

// An intrusive doubly-linked list of candidates of one tier, through the entries' OrderLinks of
// that tier. "Front" is where eviction starts; an entry is on at most one list per tier. For
// building orders.
class CandidateList {
 public:
  CandidateList(BlockIndex& index, Tier tier) : index_(&index), tier_(tier) {}

  void PushFront(EntryId id);
  void PushBack(EntryId id);
  void Remove(EntryId id);
  EntryId front() const { return head_; }
  EntryId back() const { return tail_; }
  // The entry after `id` (toward the back), or kNoEntry.
  EntryId Next(EntryId id) const { return index_->Order(id, tier_).next; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // This tier's order word of `id`, for the order's own per-entry state.
  uint32_t& word(EntryId id) { return index_->Order(id, tier_).word; }
  BlockIndex& index() { return *index_; }

 private:
  BlockIndex* index_;
  Tier tier_;
  EntryId head_ = kNoEntry;
  EntryId tail_ = kNoEntry;
  size_t size_ = 0;
};

}  // namespace kvpool::tiers
