#include "tiers/eviction_pools.h"

#include <glog/logging.h>

#include <algorithm>

namespace kvpool::tiers {

EvictionPools::EvictionPools(BlockIndex& index) : index_(index) {
  Result<std::unique_ptr<Pool>> lru = MakePool("lru");
  CHECK(lru.ok()) << lru.status().ToString();
  default_ = std::move(*lru);
  index_.SetObserver(this);
}

Result<std::unique_ptr<EvictionPools::Pool>> EvictionPools::MakePool(std::string_view name) {
  auto pool = std::make_unique<Pool>();
  pool->name = std::string(name);
  for (Tier t : kStoredTierList) {
    KVPOOL_ASSIGN_OR_RETURN(pool->orders[TierSlot(t)],
                            EvictionOrderRegistry().Create(name, EvictionContext{&index_, t}));
  }
  return pool;
}

EvictionPools::Pool& EvictionPools::PoolOf(NamespaceId ns) const {
  auto it = own_.find(ns);
  return it == own_.end() ? *default_ : *it->second;
}

void EvictionPools::Move(Pool& from, Pool& to, const std::function<bool(NamespaceId)>& belongs) {
  for (Tier t : kStoredTierList) {
    const int s = TierSlot(t);
    std::vector<EntryId> ranked;
    from.orders[s]->Victims(
        UINT64_MAX, [&](EntryId id) { return belongs(index_.at(id).ns); }, &ranked);
    for (EntryId id : ranked) {
      const uint64_t size = index_.at(id).size;
      from.orders[s]->Remove(id);
      from.bytes[s] -= size;
      --from.count[s];
      to.orders[s]->Add(id, /*after_child=*/false);
      to.bytes[s] += size;
      ++to.count[s];
    }
  }
}

Status EvictionPools::SetDefaultOrder(std::string_view name) {
  if (default_->name == name) return Status::OK();
  KVPOOL_ASSIGN_OR_RETURN(std::unique_ptr<Pool> pool, MakePool(name));
  Move(*default_, *pool, [](NamespaceId) { return true; });
  default_ = std::move(pool);
  return Status::OK();
}

Status EvictionPools::SetOrder(NamespaceId ns, std::string_view name) {
  auto it = own_.find(ns);
  if (name.empty()) {
    if (it == own_.end()) return Status::OK();
    std::unique_ptr<Pool> old = std::move(it->second);
    own_.erase(it);
    Move(*old, *default_, [](NamespaceId) { return true; });
    return Status::OK();
  }
  if (it != own_.end() && it->second->name == name) return Status::OK();
  KVPOOL_ASSIGN_OR_RETURN(std::unique_ptr<Pool> pool, MakePool(name));
  Pool& from = PoolOf(ns);
  Move(from, *pool, [ns](NamespaceId n) { return n == ns; });
  own_[ns] = std::move(pool);
  return Status::OK();
}

std::string EvictionPools::OrderName(NamespaceId ns) const { return PoolOf(ns).name; }

void EvictionPools::Victims(Tier tier, uint64_t bytes, const VictimFilter& evictable,
                            std::vector<EntryId>* out) {
  const int s = TierSlot(tier);
  std::vector<Pool*> pools{default_.get()};
  for (auto& [ns, pool] : own_) pools.push_back(pool.get());
  std::stable_sort(pools.begin(), pools.end(), [s](const Pool* a, const Pool* b) {
    return a->bytes[s] != b->bytes[s] ? a->bytes[s] > b->bytes[s] : a->count[s] > b->count[s];
  });
  uint64_t gathered = 0;
  for (Pool* pool : pools) {
    if (gathered >= bytes || pool->count[s] == 0) break;
    const size_t before = out->size();
    pool->orders[s]->Victims(bytes - gathered, evictable, out);
    for (size_t i = before; i < out->size(); ++i) gathered += index_.at((*out)[i]).size;
  }
}

void EvictionPools::VictimsOf(NamespaceId ns, Tier tier, uint64_t bytes,
                              const VictimFilter& evictable, std::vector<EntryId>* out) {
  Pool& pool = PoolOf(ns);
  if (pool.count[TierSlot(tier)] == 0) return;
  pool.orders[TierSlot(tier)]->Victims(
      bytes, [&](EntryId id) { return index_.at(id).ns == ns && evictable(id); }, out);
}

void EvictionPools::OnCandidate(EntryId id, Tier tier, bool after_child) {
  Pool& pool = PoolOf(index_.at(id).ns);
  pool.orders[TierSlot(tier)]->Add(id, after_child);
  pool.bytes[TierSlot(tier)] += index_.at(id).size;
  ++pool.count[TierSlot(tier)];
}

void EvictionPools::OnNotCandidate(EntryId id, Tier tier) {
  Pool& pool = PoolOf(index_.at(id).ns);
  pool.orders[TierSlot(tier)]->Remove(id);
  pool.bytes[TierSlot(tier)] -= index_.at(id).size;
  --pool.count[TierSlot(tier)];
}

void EvictionPools::OnUse(EntryId id, Tier tier) {
  PoolOf(index_.at(id).ns).orders[TierSlot(tier)]->Use(id);
}

}  // namespace kvpool::tiers
