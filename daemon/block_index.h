#pragma once
// BlockIndex: the daemon's one source of truth about what is cached.
//
// Maps (namespace, block key) to an Entry: size, checksum, which tiers hold a copy, leases,
// session pins, the parent in its chain and, per tier, the number of children that have a copy
// there. Entries live in fixed-size chunks addressed by a 32-bit EntryId; the hash set stores only
// ids (4 bytes a slot) and hashes through the entry, so a key is stored once. See
// docs/BENCHMARKS.md for the measured bytes per entry.
//
// It also keeps, per tier, an intrusive LRU list of that tier's *eviction candidates*: entries
// with a copy in the tier and no child with a copy in it (for disk: no child cached anywhere, and
// no session pin). Removing a candidate never strands a cached descendant, so eviction walks the
// list from its cold end and is tail first by construction.
//
// Thread safety: none. The tier manager serializes all access under its mutex.

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include <kvpool/block_key.h>

#include "absl/container/flat_hash_set.h"
#include "common/namespace_id.h"

namespace kvpool::daemon {

using EntryId = uint32_t;
inline constexpr EntryId kNoEntry = UINT32_MAX;

// Tiers an index entry can have a copy in. The gpu tier joins in a later change.
enum class TierId : uint8_t { kHost = 0, kDisk = 1 };
inline constexpr int kNumTiers = 2;
inline constexpr uint8_t TierBit(TierId t) {
  return static_cast<uint8_t>(1u << static_cast<int>(t));
}

struct Entry {
  BlockKey key;
  NamespaceId ns = 0;
  uint32_t size = 0;          // payload bytes (a block is at most 64 MiB)
  uint64_t checksum = 0;      // xxh3-64 of the payload
  uint64_t host_offset = 0;   // arena offset of the host copy, when kHost is in `tiers`
  EntryId parent = kNoEntry;  // previous block of the chain, when it is cached
  uint32_t leases = 0;        // readers holding the host copy; never evicted while > 0
  uint32_t pins = 0;          // sessions that pin this block on disk
  uint32_t last_use_s = 0;    // coarse clock, seconds since the daemon started
  uint32_t hits = 0;          // gets served (saturating)
  uint32_t child_links = 0;   // live entries whose parent is this one (with copies or not)
  std::array<uint32_t, kNumTiers> children{};  // children with a copy in each tier
  std::array<EntryId, kNumTiers> lru_prev{kNoEntry, kNoEntry};
  std::array<EntryId, kNumTiers> lru_next{kNoEntry, kNoEntry};
  uint8_t tiers = 0;   // TierBit set
  uint8_t in_lru = 0;  // TierBit set: which LRU lists hold this entry
  uint8_t busy = 0;    // kBusy* flags: an I/O on this entry is in flight
  uint8_t flags = 0;   // kFlag* bits
  bool live = false;   // slot in use (false on the free list)

  bool In(TierId t) const { return tiers & TierBit(t); }
  uint32_t cached_children() const {
    uint32_t n = 0;
    for (uint32_t c : children) n += c;
    return n;
  }
};

inline constexpr uint8_t kBusyPromoting = 1;   // being read from disk into host
inline constexpr uint8_t kBusyDemoting = 2;    // being written from host to disk
inline constexpr uint8_t kBusyReading = 4;     // read straight from disk by a get
inline constexpr uint8_t kFlagPrefetched = 1;  // promoted ahead of a get that has not come yet

class BlockIndex {
 public:
  BlockIndex();

  // The entry for (ns, key), or kNoEntry.
  EntryId Find(NamespaceId ns, const BlockKey& key) const;
  // Inserts a new, copy-less entry; the key must be absent.
  EntryId Insert(NamespaceId ns, const BlockKey& key);
  // Removes an entry that has no copies, leases, pins, cached children or I/O in flight.
  // An entry that lost its last copy but still has cached children stays as a copy-less
  // "ghost" (a miss for lookups) until they go; see CanErase.
  void Erase(EntryId id);
  bool CanErase(EntryId id) const;

  Entry& at(EntryId id) { return Chunk(id)[id % kChunkEntries]; }
  const Entry& at(EntryId id) const { return Chunk(id)[id % kChunkEntries]; }
  size_t size() const { return set_.size(); }
  // Bytes held by the index: entry chunks plus the hash set's slots.
  size_t MemoryBytes() const;

  // Adds or removes a copy in `tier`, keeping the parent's child counts and every affected
  // LRU list right.
  void AddCopy(EntryId id, TierId tier);
  void RemoveCopy(EntryId id, TierId tier);
  // Links `id` under `parent` (same namespace). Must be called before the first AddCopy.
  void SetParent(EntryId id, EntryId parent);
  void Pin(EntryId id);
  void Unpin(EntryId id);
  // Marks use: moves the entry to the hot end of the lists it is in.
  void Touch(EntryId id, uint32_t now_s);

  // Eviction candidates of `tier`, coldest first: Coldest(), then Hotter(id) until kNoEntry.
  EntryId Coldest(TierId tier) const { return lru_tail_[static_cast<int>(tier)]; }
  EntryId Hotter(TierId tier, EntryId id) const { return at(id).lru_prev[static_cast<int>(tier)]; }
  size_t CandidateCount(TierId tier) const { return lru_size_[static_cast<int>(tier)]; }

  // Calls fn(id) for every live entry of namespace `ns` (kNoNamespace: every entry).
  template <typename Fn>
  void ForEach(NamespaceId ns, Fn fn) const {
    for (EntryId id : set_) {
      if (ns == kNoNamespace || at(id).ns == ns) fn(id);
    }
  }

 private:
  static constexpr uint32_t kChunkEntries = 1u << 16;

  struct Probe {
    NamespaceId ns;
    const BlockKey* key;
  };
  struct Hash {
    using is_transparent = void;
    const BlockIndex* index;
    size_t operator()(EntryId id) const;
    size_t operator()(const Probe& p) const;
  };
  struct Eq {
    using is_transparent = void;
    const BlockIndex* index;
    bool operator()(EntryId a, EntryId b) const { return a == b; }
    bool operator()(EntryId a, const Probe& p) const;
    bool operator()(const Probe& p, EntryId a) const { return (*this)(a, p); }
  };

  Entry* Chunk(EntryId id) const { return chunks_[id / kChunkEntries].get(); }
  // True when `id` belongs on the eviction-candidate list of `tier`.
  bool IsCandidate(const Entry& e, TierId tier) const;
  // Puts `id` on or off `tier`'s list as IsCandidate says; a newly listed entry goes to the
  // cold end when `cold`, else the hot end.
  void Refresh(EntryId id, TierId tier, bool cold);
  void ListPushHot(TierId tier, EntryId id);
  void ListPushCold(TierId tier, EntryId id);
  void ListRemove(TierId tier, EntryId id);

  std::vector<std::unique_ptr<Entry[]>> chunks_;
  std::vector<EntryId> free_ids_;
  EntryId next_id_ = 0;
  absl::flat_hash_set<EntryId, Hash, Eq> set_;
  std::array<EntryId, kNumTiers> lru_head_{kNoEntry, kNoEntry};  // hot end
  std::array<EntryId, kNumTiers> lru_tail_{kNoEntry, kNoEntry};  // cold end
  std::array<size_t, kNumTiers> lru_size_{};
};

}  // namespace kvpool::daemon
