#include "tiers/block_index.h"

#include <glog/logging.h>

#include <sys/random.h>

#include <type_traits>

#include "absl/hash/hash.h"

namespace kvpool::tiers {

size_t KeyHasher::operator()(NamespaceId ns, const BlockKey& key) const {
  // The whole key (BlockKey's AbslHashValue), the namespace and the seed.
  return absl::HashOf(seed_, ns, key);
}

size_t BlockIndex::Hash::operator()(const HashedKey& k) const {
  DCHECK_EQ(k.hash, index->hasher_(k.ns, *k.key)) << "a key hashed by another index's hasher";
  return k.hash;
}

size_t BlockIndex::Hash::operator()(EntryId id) const {
  const Entry& e = index->at(id);
  return index->hasher_(e.ns, e.key);
}

namespace {

uint64_t RandomSeed() {
  uint64_t seed = 0;
  if (getrandom(&seed, sizeof(seed), 0) != static_cast<ssize_t>(sizeof(seed))) {
    // Not expected (the kernel's pool is ready long before a daemon starts); absl's per-process
    // seed still varies the hash.
    LOG(WARNING) << "getrandom failed; the block index hash is seeded by the process alone";
  }
  return seed;
}

}  // namespace

uint64_t BlockIndex::HashForTest(NamespaceId ns, const BlockKey& key) const {
  return hasher_(ns, key);
}

bool BlockIndex::Eq::operator()(EntryId a, const HashedKey& k) const {
  const Entry& e = index->at(a);
  return e.ns == k.ns && e.key == *k.key;
}

BlockIndex::BlockIndex() : hasher_(RandomSeed()), set_(0, Hash{this}, Eq{this}) {}

EntryId BlockIndex::Find(const HashedKey& k) const {
  auto it = set_.find(k);
  return it == set_.end() ? kNoEntry : *it;
}

EntryId BlockIndex::Insert(NamespaceId ns, const BlockKey& key) {
  EntryId id;
  if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
  } else {
    CHECK_LT(next_id_, kNoEntry) << "block index full";
    id = next_id_++;
    if (id / kChunkEntries >= chunks_.size()) {
      chunks_.emplace_back(NewChunk());
    }
  }
  Entry& e = at(id);
  e = Entry();
  e.key = key;
  e.ns = ns;
  e.live = true;
  const bool inserted = set_.insert(id).second;
  CHECK(inserted) << "duplicate key " << key.ShortHex() << " inserted into the index";
  return id;
}

// Entries need no destructor, so a chunk is freed as plain memory.
static_assert(std::is_trivially_destructible_v<Entry>);
static_assert(sizeof(Entry) == 112, "an index entry changed size: update docs/BENCHMARKS.md");

Entry* BlockIndex::NewChunk() {
  static_assert(size_t{kChunkEntries} * sizeof(Entry) % kHugePageBytes == 0,
                "a chunk of entries should fill its huge pages");
  auto* chunk = static_cast<Entry*>(AllocateIndexMemory(kChunkEntries * sizeof(Entry)));
  for (uint32_t i = 0; i < kChunkEntries; ++i) new (&chunk[i]) Entry();
  return chunk;
}

void BlockIndex::Reserve(size_t entries) {
  set_.reserve(entries);
  chunks_.reserve((entries + kChunkEntries - 1) / kChunkEntries);
}

bool BlockIndex::CanErase(EntryId id) const {
  const Entry& e = at(id);
  return e.live && e.tiers == 0 && e.leases == 0 && e.pins == 0 && e.cached_children() == 0 &&
         !e.has_children() && e.busy == 0;
}

uint32_t BlockIndex::ChildCount(EntryId id) const {
  uint32_t n = 0;
  ForEachChild(id, [&](EntryId) { ++n; });
  return n;
}

MemCopies& BlockIndex::EnsureMem(EntryId id) {
  Entry& e = at(id);
  if (e.mem != kNoMem) return MemAt(e.mem);
  MemId m;
  if (!free_mem_.empty()) {
    m = free_mem_.back();
    free_mem_.pop_back();
  } else {
    CHECK_LT(next_mem_, kNoMem) << "block index: too many blocks in memory";
    m = next_mem_++;
    if (m / kMemChunkEntries >= mem_chunks_.size()) {
      mem_chunks_.emplace_back(new MemCopies[kMemChunkEntries]);
    }
  }
  e.mem = m;
  ++mem_live_;
  MemCopies& mem = MemAt(m);
  mem = MemCopies();
  return mem;
}

void BlockIndex::ReleaseMem(EntryId id) {
  Entry& e = at(id);
  if (e.mem == kNoMem) return;
  free_mem_.push_back(e.mem);
  e.mem = kNoMem;
  --mem_live_;
}

void BlockIndex::Erase(EntryId id) {
  Entry& e = at(id);
  CHECK(CanErase(id)) << "erasing entry " << e.key.ShortHex() << " still in use";
  set_.erase(id);
  ReleaseMem(id);
  if (e.parent != kNoEntry) {
    Entry& p = at(e.parent);
    // Unlink from the parent's children (siblings are few: the branches of one prefix).
    EntryId* link = &p.first_child;
    while (*link != id) {
      CHECK_NE(*link, kNoEntry) << "entry missing from its parent's children";
      link = &at(*link).next_sibling;
    }
    *link = e.next_sibling;
  }
  e.live = false;
  free_ids_.push_back(id);
  ++erasures_;
}

size_t BlockIndex::MemoryBytes() const {
  return chunks_.size() * kChunkEntries * sizeof(Entry) +
         mem_chunks_.size() * kMemChunkEntries * sizeof(MemCopies) +
         set_.capacity() * (sizeof(EntryId) + 1) +
         (free_ids_.capacity() + free_mem_.capacity()) * sizeof(EntryId);
}

bool BlockIndex::ShouldBeCandidate(const Entry& e, Tier tier) const {
  if (!e.In(tier)) return false;
  if (tier != Tier::kDisk) return e.children[TierSlot(tier)] == 0;
  // Dropping the disk copy of a block that only disk holds removes it from the cache: allowed
  // only when no child is cached anywhere and no session pins it. A block also in a faster tier
  // may lose its disk copy whenever its children have none on disk.
  if (e.pins > 0) return false;
  if (e.tiers != TierBit(Tier::kDisk)) return e.children[TierSlot(Tier::kDisk)] == 0;
  return e.cached_children() == 0;
}

void BlockIndex::Refresh(EntryId id, Tier tier, bool after_child) {
  Entry& e = at(id);
  const bool want = ShouldBeCandidate(e, tier);
  if (want == e.CandidateOf(tier)) return;
  if (want) {
    e.candidate |= TierBit(tier);
    ++candidates_[TierSlot(tier)];
    if (observer_ != nullptr) observer_->OnCandidate(id, tier, after_child);
  } else {
    e.candidate &= static_cast<uint8_t>(~TierBit(tier));
    --candidates_[TierSlot(tier)];
    if (observer_ != nullptr) observer_->OnNotCandidate(id, tier);
  }
}

void BlockIndex::RefreshAll(EntryId id, bool after_child) {
  for (Tier t : kStoredTierList) Refresh(id, t, after_child);
}

void BlockIndex::AddCopy(EntryId id, Tier tier) {
  Entry& e = at(id);
  CHECK(IsStoredTier(tier));
  CHECK(!e.In(tier));
  if (tier != Tier::kDisk) EnsureMem(id);
  e.tiers |= TierBit(tier);
  RefreshAll(id, /*after_child=*/false);
  if (e.parent != kNoEntry) {
    Entry& p = at(e.parent);
    ++p.children[TierSlot(tier)];
    RefreshAll(e.parent, false);
  }
}

void BlockIndex::AddCopyUnsettled(EntryId id, Tier tier) {
  Entry& e = at(id);
  CHECK(IsStoredTier(tier));
  CHECK(!e.In(tier));
  if (tier != Tier::kDisk) EnsureMem(id);
  e.tiers |= TierBit(tier);
  if (e.parent != kNoEntry) ++at(e.parent).children[TierSlot(tier)];
}

void BlockIndex::SettleCandidates() {
  for (EntryId id = 0; id < next_id_; ++id) {
    if (at(id).live) RefreshAll(id, /*after_child=*/false);
  }
}

void BlockIndex::RemoveCopy(EntryId id, Tier tier) {
  Entry& e = at(id);
  CHECK(e.In(tier));
  e.tiers &= static_cast<uint8_t>(~TierBit(tier));
  RefreshAll(id, false);
  if (e.parent != kNoEntry) {
    Entry& p = at(e.parent);
    CHECK_GT(p.children[TierSlot(tier)], 0u);
    --p.children[TierSlot(tier)];
    RefreshAll(e.parent, /*after_child=*/true);
  }
  // Its last memory copy gone (and with it its candidacy there): the memory part goes too.
  if (!e.In(Tier::kHost) && !e.In(Tier::kGpu)) ReleaseMem(id);
}

void BlockIndex::SetParent(EntryId id, EntryId parent) {
  Entry& e = at(id);
  CHECK_EQ(e.tiers, 0) << "SetParent after a copy was added";
  CHECK_EQ(e.parent, kNoEntry) << "SetParent twice";
  e.parent = parent;
  Entry& p = at(parent);
  e.next_sibling = p.first_child;
  p.first_child = id;
}

void BlockIndex::Adopt(EntryId id, EntryId parent) {
  Entry& e = at(id);
  CHECK_EQ(e.parent, kNoEntry) << "Adopt of a linked entry";
  CHECK_NE(id, parent);
  e.parent = parent;
  Entry& p = at(parent);
  e.next_sibling = p.first_child;
  p.first_child = id;
  for (Tier t : kStoredTierList) {
    if (e.In(t)) ++p.children[TierSlot(t)];
  }
  RefreshAll(parent, /*after_child=*/false);
}

bool BlockIndex::WouldLoop(EntryId id, EntryId parent) const {
  if (id == parent) return true;
  if (!at(id).has_children()) return false;
  // Bounded: links persisted by a version that let loops form may hold one above `parent`.
  size_t steps = size();
  for (EntryId up = at(parent).parent; up != kNoEntry && steps > 0; up = at(up).parent, --steps) {
    if (up == id) return true;
  }
  return false;
}

void BlockIndex::Pin(EntryId id) {
  ++at(id).pins;
  Refresh(id, Tier::kDisk, false);
}

void BlockIndex::Unpin(EntryId id) {
  Entry& e = at(id);
  CHECK_GT(e.pins, 0u);
  --e.pins;
  Refresh(id, Tier::kDisk, false);
}

void BlockIndex::Touch(EntryId id, uint32_t now_s) {
  Entry& e = at(id);
  e.last_use_s = now_s;
  if (observer_ == nullptr) return;
  for (Tier t : kStoredTierList) {
    if (e.CandidateOf(t)) observer_->OnUse(id, t);
  }
}

}  // namespace kvpool::tiers
