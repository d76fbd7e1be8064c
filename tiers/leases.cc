#include "tiers/leases.h"

#include <glog/logging.h>

namespace kvpool::tiers {

uint64_t LeaseTable::Add(EntryId entry, uint64_t owner, Clock::TimePoint deadline) {
  const uint64_t id = next_id_++;
  leases_.emplace(id, Lease{entry, owner, deadline});
  return id;
}

std::optional<EntryId> LeaseTable::End(uint64_t id) {
  auto it = leases_.find(id);
  if (it == leases_.end()) return std::nullopt;
  const EntryId entry = it->second.entry;
  leases_.erase(it);
  return entry;
}

std::optional<EntryId> LeaseTable::EndIfOwned(uint64_t id, uint64_t owner) {
  auto it = leases_.find(id);
  if (it == leases_.end() || it->second.owner != owner) return std::nullopt;
  return End(id);
}

std::vector<EntryId> LeaseTable::EndOwner(uint64_t owner) {
  std::vector<EntryId> out;
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.owner == owner) {
      out.push_back(it->second.entry);
      leases_.erase(it++);
    } else {
      ++it;
    }
  }
  return out;
}

std::vector<EntryId> LeaseTable::EndExpired(Clock::TimePoint now) {
  std::vector<EntryId> out;
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.deadline < now) {
      out.push_back(it->second.entry);
      leases_.erase(it++);
    } else {
      ++it;
    }
  }
  return out;
}

uint64_t ReservationTable::Add(const Reservation& r) {
  const uint64_t id = next_id_++;
  reservations_.emplace(id, r);
  const bool fresh = by_key_.emplace(NamespacedKey{r.ns, r.item.key}, id).second;
  CHECK(fresh) << "block " << r.item.key.ShortHex() << " reserved twice";
  return id;
}

Reservation* ReservationTable::FindOwned(uint64_t id, uint64_t owner) {
  auto it = reservations_.find(id);
  if (it == reservations_.end() || it->second.owner != owner) return nullptr;
  return &it->second;
}

bool ReservationTable::Reserved(NamespaceId ns, const BlockKey& key) const {
  return by_key_.contains(NamespacedKey{ns, key});
}

std::optional<Reservation> ReservationTable::Remove(uint64_t id) {
  auto it = reservations_.find(id);
  if (it == reservations_.end()) return std::nullopt;
  Reservation r = std::move(it->second);
  reservations_.erase(it);
  by_key_.erase(NamespacedKey{r.ns, r.item.key});
  return r;
}

std::vector<uint64_t> ReservationTable::OwnedBy(uint64_t owner) const {
  std::vector<uint64_t> out;
  for (const auto& [id, r] : reservations_) {
    if (r.owner == owner) out.push_back(id);
  }
  return out;
}

std::vector<uint64_t> ReservationTable::Expired(Clock::TimePoint now) const {
  std::vector<uint64_t> out;
  for (const auto& [id, r] : reservations_) {
    if (r.deadline < now) out.push_back(id);
  }
  return out;
}

bool ReservationTable::OwnerHasSlotIn(uint64_t owner, uint32_t segment,
                                      uint64_t segment_bytes) const {
  for (const auto& [id, r] : reservations_) {
    if (r.owner == owner && r.slot.offset / segment_bytes == segment) return true;
  }
  return false;
}

std::vector<uint64_t> ReservationTable::All() const {
  std::vector<uint64_t> out;
  out.reserve(reservations_.size());
  for (const auto& [id, r] : reservations_) out.push_back(id);
  return out;
}

}  // namespace kvpool::tiers
