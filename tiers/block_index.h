#pragma once
// BlockIndex: the daemon's one source of truth about what is cached, owned by the tier manager.
//
// Maps (namespace, block key) to an Entry: size, checksum, which tiers hold a copy, leases,
// session pins, the parent in its chain, its children (links for read-ahead) and, per tier, the
// number of children that have a copy there. Entries live in fixed-size chunks addressed by a
// 32-bit EntryId; the hash set stores only ids (4 bytes a slot) and hashes through the entry, so
// a key is stored once. What only a block in memory needs (where its host and gpu copies are,
// and those tiers' eviction links) lives apart in MemCopies, one per entry with such a copy: most
// of a large cache is on disk, and its entries stay small. See docs/BENCHMARKS.md for the
// measured bytes per entry. Keys come from
// clients, so the set's hash is keyed by a random seed per index: nobody can aim keys at a bucket.
//
// Per tier it tracks which entries are *eviction candidates*: entries with a copy in the tier and
// no child with a copy in it (for disk: no child cached anywhere, and no session pin). Removing a
// candidate never strands a cached descendant, so any eviction order that picks only candidates
// evicts tail first by construction. The index reports every change of candidacy, and every use
// of a candidate, to its CandidateObserver (tiers/eviction_pools.h), which keeps the eviction
// orders; an entry's OrderLinks of a tier (BlockIndex::Order) belong to the order that holds it.
//
// Thread safety: none, except that const calls may run side by side with each other (never with
// a non-const one). The tier manager serializes all access under its mutex, which lookups, Where
// and CountCached hold shared; a KeyHasher needs no lock.

#include <glog/logging.h>

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include <kvpool/block_key.h>
#include <kvpool/tier.h>

#include "absl/container/flat_hash_set.h"
#include "common/namespace_id.h"
#include "tiers/index_memory.h"

namespace kvpool::tiers {

using EntryId = uint32_t;
inline constexpr EntryId kNoEntry = UINT32_MAX;

// The tiers an entry can have a copy in (remote copies are the cluster's business), each with a
// slot in the per-tier arrays of an Entry.
inline constexpr int kStoredTiers = 3;
inline constexpr std::array<Tier, kStoredTiers> kStoredTierList{Tier::kGpu, Tier::kHost,
                                                                Tier::kDisk};
inline constexpr bool IsStoredTier(Tier t) {
  return t == Tier::kGpu || t == Tier::kHost || t == Tier::kDisk;
}
inline constexpr int TierSlot(Tier t) { return static_cast<int>(t) - 1; }
inline constexpr uint8_t TierBit(Tier t) { return static_cast<uint8_t>(1u << TierSlot(t)); }

// Where the eviction order holding an entry as a candidate of one tier keeps it (its own to use:
// list links and a word).
struct OrderLinks {
  EntryId prev = kNoEntry;
  EntryId next = kNoEntry;
  uint32_t word = 0;
};

// The part of an entry that only a block with a copy in memory (host or gpu) needs: where those
// copies are and the eviction orders' links of those tiers. Kept apart from the Entry
// (BlockIndex::Mem), so the many blocks that only disk holds do not carry it.
struct MemCopies {
  uint64_t host_offset = 0;  // arena offset of the host copy, when kHost is in the entry's tiers
  uint32_t gpu_page = 0;     // with kGpu in its tiers: the gpu copy's offset / 4 KiB ...
  std::array<OrderLinks, 2> order{};  // gpu, host
  uint8_t gpu_device = 0;             // ... in the gpu tier of this CUDA device
  // Non-zero: the host copy was decoded from a disk copy in this encoding (approximate bytes).
  uint8_t lossy_encoding = 0;
};

using MemId = uint32_t;
inline constexpr MemId kNoMem = UINT32_MAX;

// One block in the index (112 bytes; docs/BENCHMARKS.md, "Block index: bytes per entry").
struct Entry {
  BlockKey key;
  uint64_t checksum = 0;  // xxh3-64 of the payload
  NamespaceId ns = 0;
  uint32_t size = 0;               // payload bytes (a block is at most 64 MiB)
  EntryId parent = kNoEntry;       // previous block of the chain, when it is cached
  uint32_t leases = 0;             // readers holding the host copy; never evicted while > 0
  uint32_t pins = 0;               // sessions that pin this block on disk
  uint32_t last_use_s = 0;         // coarse clock, seconds since the daemon started
  EntryId first_child = kNoEntry;  // the children: first_child, then each one's next_sibling
  EntryId next_sibling = kNoEntry;
  std::array<uint32_t, kStoredTiers> children{};  // children with a copy in each tier
  OrderLinks disk_order;  // owned by the eviction order holding it as a disk candidate
  // The disk copy's stored bytes, when encoded (tiers/demotion_encoding.h).
  uint32_t disk_size = 0;
  MemId mem = kNoMem;     // its MemCopies, while it has (or is getting) a host or gpu copy
  uint16_t hits = 0;      // gets served (saturating at 65,535)
  uint8_t tiers = 0;      // TierBit set
  uint8_t candidate = 0;  // TierBit set: the tiers this entry is an eviction candidate of
  uint8_t busy = 0;       // kBusy* flags: an I/O on this entry is in flight
  uint8_t flags = 0;      // kFlag* bits
  bool live = false;      // slot in use (false on the free list)
  // The disk copy's body: its kernels::Encoding (0: raw, the bytes as put).
  uint8_t disk_encoding = 0;

  bool In(Tier t) const { return tiers & TierBit(t); }
  // A get can lease the host copy now, waiting for nothing (defined below the kBusy* flags).
  bool LeasableInHost() const;
  // Bytes the disk copy takes.
  uint64_t disk_bytes() const { return disk_encoding != 0 ? disk_size : size; }
  bool CandidateOf(Tier t) const { return candidate & TierBit(t); }
  bool has_children() const { return first_child != kNoEntry; }
  uint32_t cached_children() const {
    uint32_t n = 0;
    for (uint32_t c : children) n += c;
    return n;
  }
};
inline constexpr uint16_t kMaxHits = UINT16_MAX;

inline constexpr uint8_t kBusyPromoting = 1;  // being read from disk into host
inline constexpr uint8_t kBusyDemoting = 2;   // being written from host to disk
inline constexpr uint8_t kBusyReading = 4;    // read straight from disk by a get
inline constexpr uint8_t kBusyToGpu = 8;      // its host copy is being copied into a gpu tier
// Put straight into a gpu tier: its host copy is being made from its gpu copy (with
// kBusyPromoting, so readers of host wait for it as for a promotion).
inline constexpr uint8_t kBusyFromGpu = 16;
// Its host copy is being copied to another slot of its namespace (TierManager::
// MoveHostSegmentLocked); readers may still lease the copy where it is.
inline constexpr uint8_t kBusyMoving = 32;
inline constexpr uint8_t kFlagPrefetched = 1;  // promoted ahead of a get that has not come yet

inline bool Entry::LeasableInHost() const {
  return In(Tier::kHost) && (busy & kBusyPromoting) == 0;
}

// Told of every change of candidacy (see above) and of every use of a candidate.
class CandidateObserver {
 public:
  virtual ~CandidateObserver() = default;
  // `id` became a candidate of `tier`. `after_child`: because its last child with a copy there
  // left (it was used together with that child).
  virtual void OnCandidate(EntryId id, Tier tier, bool after_child) = 0;
  // `id` stopped being a candidate of `tier` (lost its copy, gained a child there, was pinned).
  virtual void OnNotCandidate(EntryId id, Tier tier) = 0;
  // A candidate of `tier` was used (looked up, read, put again).
  virtual void OnUse(EntryId id, Tier tier) = 0;
};

// A key with its bucket hash, for BlockIndex::Find and Prefetch. The hash must be this index's
// (BlockIndex::Hashed, or its hasher()): with another, the key is simply not found.
struct HashedKey {
  NamespaceId ns;
  const BlockKey* key;
  size_t hash;
};

// The index's bucket hash of (namespace, key): the whole key, the namespace and a random seed per
// index (clients choose keys, so nobody can aim many keys at one bucket). Immutable, so a caller
// hashes a batch of keys before it takes the lock that guards the index, and each key once.
class KeyHasher {
 public:
  explicit KeyHasher(uint64_t seed) : seed_(seed) {}
  size_t operator()(NamespaceId ns, const BlockKey& key) const;
  // `key` (which must outlive the result) with its hash.
  HashedKey Hashed(NamespaceId ns, const BlockKey& key) const {
    return HashedKey{ns, &key, (*this)(ns, key)};
  }

 private:
  uint64_t seed_;
};

class BlockIndex {
 public:
  BlockIndex();

  // Where candidacy changes go; set before the first AddCopy and kept for the index's life.
  void SetObserver(CandidateObserver* observer) { observer_ = observer; }

  const KeyHasher& hasher() const { return hasher_; }
  HashedKey Hashed(NamespaceId ns, const BlockKey& key) const { return hasher_.Hashed(ns, key); }
  // The entry for (ns, key), or kNoEntry.
  EntryId Find(NamespaceId ns, const BlockKey& key) const { return Find(Hashed(ns, key)); }
  EntryId Find(const HashedKey& k) const;
  // Starts loading the hash slots a Find or Insert of (ns, key) will read (not the entry a hit
  // then compares), so a loop over many keys can overlap those cache misses (lookups, bulk
  // loads).
  void Prefetch(NamespaceId ns, const BlockKey& key) const { Prefetch(Hashed(ns, key)); }
  void Prefetch(const HashedKey& k) const { set_.prefetch(k); }
  // Starts loading entry `id` (every cache line of it).
  void PrefetchEntry(EntryId id) const {
    const char* p = reinterpret_cast<const char*>(&at(id));
    for (size_t off = 0; off < sizeof(Entry); off += 64) __builtin_prefetch(p + off, 1);
  }
  // Inserts a new, copy-less entry; the key must be absent.
  EntryId Insert(NamespaceId ns, const BlockKey& key);
  // Makes room for `entries` in all, so inserting up to that many never rehashes (a rehash reads
  // every entry again: its hash goes through the entry).
  void Reserve(size_t entries);
  // Removes an entry that has no copies, leases, pins, cached children or I/O in flight.
  // An entry that lost its last copy but still has cached children stays as a copy-less
  // "ghost" (a miss for lookups) until they go; see CanErase.
  void Erase(EntryId id);
  bool CanErase(EntryId id) const;
  // Entries erased so far. While it stays the same, every id found still names its key (ids
  // are reused only after an erase), so a caller that found ids under one hold of the lock can
  // use them under the next without finding them again. The entry may have lost its copies in
  // between: check `tiers`.
  uint64_t erasures() const { return erasures_; }

  Entry& at(EntryId id) { return Chunk(id)[id % kChunkEntries]; }
  const Entry& at(EntryId id) const { return Chunk(id)[id % kChunkEntries]; }
  // The memory part of `id`, which must have one: a host or gpu copy, or one about to be added.
  MemCopies& Mem(EntryId id) { return MemAt(at(id).mem); }
  const MemCopies& Mem(EntryId id) const { return MemAt(at(id).mem); }
  // Gives `id` a memory part (fresh: zeroed) unless it has one, to say where a host or gpu copy
  // is before adding it (AddCopy of a memory tier makes one too). The part goes with the entry's
  // last memory copy (RemoveCopy) or the entry.
  MemCopies& EnsureMem(EntryId id);
  // The links of `id` in the eviction order of `tier`; for a memory tier `id` must have a copy
  // there (every candidate of it has).
  OrderLinks& Order(EntryId id, Tier tier) {
    return tier == Tier::kDisk ? at(id).disk_order : Mem(id).order[TierSlot(tier)];
  }
  // Live entries whose parent is `id`.
  uint32_t ChildCount(EntryId id) const;
  // Entries with a memory part now.
  size_t mem_size() const { return mem_live_; }
  size_t size() const { return set_.size(); }
  // The bucket hash of a key: keyed by a random seed per index (clients choose keys).
  uint64_t HashForTest(NamespaceId ns, const BlockKey& key) const;

  // Bytes held by the index: entry chunks, memory parts and the hash set's slots.
  size_t MemoryBytes() const;

  // Adds or removes a copy in `tier`, keeping the parent's child counts and every affected
  // eviction order right. A copy in a memory tier comes with the entry's memory part; removing
  // the last one frees it.
  void AddCopy(EntryId id, Tier tier);
  void RemoveCopy(EntryId id, Tier tier);
  // For bulk loads (Recover): AddCopy without settling candidacy. A load in key order visits
  // parents and children at random, so settling each copy as it comes would move entries in and
  // out of the eviction orders, each move a cache miss on a random neighbour. SettleCandidates
  // then settles every entry once, in entry order. Nothing may evict or look at candidacy in
  // between.
  void AddCopyUnsettled(EntryId id, Tier tier);
  void SettleCandidates();
  // Links `id` under `parent` (same namespace). Must be called before the first AddCopy.
  void SetParent(EntryId id, EntryId parent);
  // Links `id`, which has no parent link and may have copies already, under `parent` (same
  // namespace): the parent's child counts and candidacy follow. For a block stored before its
  // parent was (a fetch that received a chain's blocks out of order).
  void Adopt(EntryId id, EntryId parent);
  // Whether linking `id` under `parent` (SetParent, Adopt) would close a loop: `parent` is `id`
  // or one of its descendants. Blocks whose links loop are never evictable (each has a cached
  // child), and a client can name any parent it likes. A walk up from `parent` only when `id`
  // has children (no entry can descend from one without), bounded by the index's size.
  bool WouldLoop(EntryId id, EntryId parent) const;
  void Pin(EntryId id);
  void Unpin(EntryId id);
  // Marks use: stamps the entry and tells the observer for each tier it is a candidate of.
  void Touch(EntryId id, uint32_t now_s);

  size_t CandidateCount(Tier tier) const { return candidates_[TierSlot(tier)]; }
  // Calls fn(child) for each live entry whose parent is `id`.
  template <typename Fn>
  void ForEachChild(EntryId id, Fn fn) const {
    for (EntryId c = at(id).first_child; c != kNoEntry; c = at(c).next_sibling) fn(c);
  }

  // Calls fn(id) for every live entry of namespace `ns` (kNoNamespace: every entry).
  template <typename Fn>
  void ForEach(NamespaceId ns, Fn fn) const {
    for (EntryId id : set_) {
      if (ns == kNoNamespace || at(id).ns == ns) fn(id);
    }
  }

 private:
  // 2^17 entries of 112 bytes: 14 MiB, a whole number of 2 MiB huge pages (no page half used).
  static constexpr uint32_t kChunkEntries = 1u << 17;

  // The set hashes an id through its entry, a HashedKey by the hash it carries.
  struct Hash {
    using is_transparent = void;
    const BlockIndex* index;
    size_t operator()(EntryId id) const;
    size_t operator()(const HashedKey& k) const;
  };
  struct Eq {
    using is_transparent = void;
    const BlockIndex* index;
    bool operator()(EntryId a, EntryId b) const { return a == b; }
    bool operator()(EntryId a, const HashedKey& k) const;
    bool operator()(const HashedKey& k, EntryId a) const { return (*this)(a, k); }
  };

  Entry* Chunk(EntryId id) const { return chunks_[id / kChunkEntries].get(); }
  MemCopies& MemAt(MemId m) const {
    CHECK_NE(m, kNoMem) << "an entry without a memory part";
    return mem_chunks_[m / kMemChunkEntries][m % kMemChunkEntries];
  }
  // Frees `id`'s memory part, if it has one.
  void ReleaseMem(EntryId id);
  static Entry* NewChunk();
  // True when `e` should be a candidate of `tier`.
  bool ShouldBeCandidate(const Entry& e, Tier tier) const;
  // Makes `id`'s candidacy of `tier` what ShouldBeCandidate says, telling the observer.
  void Refresh(EntryId id, Tier tier, bool after_child);
  void RefreshAll(EntryId id, bool after_child);

  // Chunks of kChunkEntries entries, in memory from AllocateIndexMemory (huge pages).
  struct FreeChunk {
    void operator()(Entry* chunk) const { FreeIndexMemory(chunk, kChunkEntries * sizeof(Entry)); }
  };
  std::vector<std::unique_ptr<Entry, FreeChunk>> chunks_;
  std::vector<EntryId> free_ids_;
  // Memory parts, in chunks of kMemChunkEntries (a few thousand blocks fit in memory tiers, not
  // the millions the index can hold), reused through free_mem_.
  static constexpr uint32_t kMemChunkEntries = 1u << 12;
  std::vector<std::unique_ptr<MemCopies[]>> mem_chunks_;
  std::vector<MemId> free_mem_;
  MemId next_mem_ = 0;
  size_t mem_live_ = 0;
  EntryId next_id_ = 0;
  uint64_t erasures_ = 0;
  const KeyHasher hasher_;
  absl::flat_hash_set<EntryId, Hash, Eq, IndexAllocator<EntryId>> set_;
  std::array<size_t, kStoredTiers> candidates_{};
  CandidateObserver* observer_ = nullptr;
};

}  // namespace kvpool::tiers
