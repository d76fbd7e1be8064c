#include "daemon/block_index.h"

#include <glog/logging.h>

#include <cstring>

namespace kvpool::daemon {

size_t BlockIndex::Hash::operator()(EntryId id) const {
  const Entry& e = index->at(id);
  return (*this)(Probe{e.ns, &e.key});
}

size_t BlockIndex::Hash::operator()(const Probe& p) const {
  // Keys are SHA-256 output, uniform already; mix in the namespace.
  uint64_t h;
  std::memcpy(&h, p.key->bytes.data(), sizeof(h));
  return static_cast<size_t>(h ^ (static_cast<uint64_t>(p.ns) * 0x9E3779B97F4A7C15ull));
}

bool BlockIndex::Eq::operator()(EntryId a, const Probe& p) const {
  const Entry& e = index->at(a);
  return e.ns == p.ns && e.key == *p.key;
}

BlockIndex::BlockIndex() : set_(0, Hash{this}, Eq{this}) {}

EntryId BlockIndex::Find(NamespaceId ns, const BlockKey& key) const {
  auto it = set_.find(Probe{ns, &key});
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
      chunks_.push_back(std::make_unique<Entry[]>(kChunkEntries));
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

bool BlockIndex::CanErase(EntryId id) const {
  const Entry& e = at(id);
  return e.live && e.tiers == 0 && e.leases == 0 && e.pins == 0 && e.cached_children() == 0 &&
         e.child_links == 0 && e.busy == 0;
}

void BlockIndex::Erase(EntryId id) {
  Entry& e = at(id);
  CHECK(CanErase(id)) << "erasing entry " << e.key.ShortHex() << " still in use";
  set_.erase(id);
  if (e.parent != kNoEntry) --at(e.parent).child_links;
  e.live = false;
  free_ids_.push_back(id);
}

size_t BlockIndex::MemoryBytes() const {
  return chunks_.size() * kChunkEntries * sizeof(Entry) + set_.capacity() * (sizeof(EntryId) + 1) +
         free_ids_.capacity() * sizeof(EntryId);
}

bool BlockIndex::IsCandidate(const Entry& e, TierId tier) const {
  if (!e.In(tier)) return false;
  if (tier == TierId::kHost) return e.children[static_cast<int>(TierId::kHost)] == 0;
  // Dropping the disk copy of a block that only disk holds removes it from the cache: allowed
  // only when no child is cached anywhere and no session pins it. A block also in host may lose
  // its disk copy whenever its children have none on disk.
  if (e.pins > 0) return false;
  if (e.In(TierId::kHost)) return e.children[static_cast<int>(TierId::kDisk)] == 0;
  return e.cached_children() == 0;
}

void BlockIndex::Refresh(EntryId id, TierId tier, bool cold) {
  Entry& e = at(id);
  const bool want = IsCandidate(e, tier);
  const bool have = e.in_lru & TierBit(tier);
  if (want == have) return;
  if (want) {
    cold ? ListPushCold(tier, id) : ListPushHot(tier, id);
  } else {
    ListRemove(tier, id);
  }
}

void BlockIndex::AddCopy(EntryId id, TierId tier) {
  Entry& e = at(id);
  CHECK(!e.In(tier));
  e.tiers |= TierBit(tier);
  for (int t = 0; t < kNumTiers; ++t) Refresh(id, static_cast<TierId>(t), /*cold=*/false);
  if (e.parent != kNoEntry) {
    Entry& p = at(e.parent);
    ++p.children[static_cast<int>(tier)];
    for (int t = 0; t < kNumTiers; ++t) Refresh(e.parent, static_cast<TierId>(t), false);
  }
}

void BlockIndex::RemoveCopy(EntryId id, TierId tier) {
  Entry& e = at(id);
  CHECK(e.In(tier));
  e.tiers &= static_cast<uint8_t>(~TierBit(tier));
  for (int t = 0; t < kNumTiers; ++t) Refresh(id, static_cast<TierId>(t), false);
  if (e.parent != kNoEntry) {
    Entry& p = at(e.parent);
    CHECK_GT(p.children[static_cast<int>(tier)], 0u);
    --p.children[static_cast<int>(tier)];
    // The parent was used with its child: it becomes the next candidate, at the cold end.
    for (int t = 0; t < kNumTiers; ++t) Refresh(e.parent, static_cast<TierId>(t), /*cold=*/true);
  }
}

void BlockIndex::SetParent(EntryId id, EntryId parent) {
  Entry& e = at(id);
  CHECK_EQ(e.tiers, 0) << "SetParent after a copy was added";
  CHECK_EQ(e.parent, kNoEntry) << "SetParent twice";
  e.parent = parent;
  ++at(parent).child_links;
}

void BlockIndex::Pin(EntryId id) {
  ++at(id).pins;
  Refresh(id, TierId::kDisk, false);
}

void BlockIndex::Unpin(EntryId id) {
  Entry& e = at(id);
  CHECK_GT(e.pins, 0u);
  --e.pins;
  Refresh(id, TierId::kDisk, false);
}

void BlockIndex::Touch(EntryId id, uint32_t now_s) {
  Entry& e = at(id);
  e.last_use_s = now_s;
  for (int t = 0; t < kNumTiers; ++t) {
    const auto tier = static_cast<TierId>(t);
    if (e.in_lru & TierBit(tier)) {
      ListRemove(tier, id);
      ListPushHot(tier, id);
    }
  }
}

void BlockIndex::ListPushHot(TierId tier, EntryId id) {
  const int t = static_cast<int>(tier);
  Entry& e = at(id);
  e.lru_prev[t] = kNoEntry;
  e.lru_next[t] = lru_head_[t];
  if (lru_head_[t] != kNoEntry) at(lru_head_[t]).lru_prev[t] = id;
  lru_head_[t] = id;
  if (lru_tail_[t] == kNoEntry) lru_tail_[t] = id;
  e.in_lru |= TierBit(tier);
  ++lru_size_[t];
}

void BlockIndex::ListPushCold(TierId tier, EntryId id) {
  const int t = static_cast<int>(tier);
  Entry& e = at(id);
  e.lru_next[t] = kNoEntry;
  e.lru_prev[t] = lru_tail_[t];
  if (lru_tail_[t] != kNoEntry) at(lru_tail_[t]).lru_next[t] = id;
  lru_tail_[t] = id;
  if (lru_head_[t] == kNoEntry) lru_head_[t] = id;
  e.in_lru |= TierBit(tier);
  ++lru_size_[t];
}

void BlockIndex::ListRemove(TierId tier, EntryId id) {
  const int t = static_cast<int>(tier);
  Entry& e = at(id);
  if (e.lru_prev[t] != kNoEntry) {
    at(e.lru_prev[t]).lru_next[t] = e.lru_next[t];
  } else {
    lru_head_[t] = e.lru_next[t];
  }
  if (e.lru_next[t] != kNoEntry) {
    at(e.lru_next[t]).lru_prev[t] = e.lru_prev[t];
  } else {
    lru_tail_[t] = e.lru_prev[t];
  }
  e.lru_prev[t] = e.lru_next[t] = kNoEntry;
  e.in_lru &= static_cast<uint8_t>(~TierBit(tier));
  --lru_size_[t];
}

}  // namespace kvpool::daemon
