#pragma once
// Leases and reservations: the tier manager's two tables of claims on host slots.
//
//   LeaseTable        a reader's claim on a block's host copy: while leased, the copy is neither
//                     freed nor moved. Each lease has an owner (a connection, which ends all of
//                     its leases when it closes) and a deadline (a same-node client that dies
//                     without releasing loses them by itself).
//   ReservationTable  a writer's claim on a host slot for a block not yet committed (put-if-absent
//                     phase one), findable by id and by (namespace, key), with an owner and a
//                     deadline after which an unfilled slot is reclaimed.
//
// The tables only keep the claims: what a claim means (an entry's lease count, a slot's pages)
// the tier manager applies with what the tables hand back.
//
// Thread safety: none; the tier manager calls them under its mutex.

#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

#include <kvpool/block_key.h>

#include "absl/container/flat_hash_map.h"
#include "common/clock.h"
#include "common/namespace_id.h"
#include "tiers/block_index.h"
#include "tiers/tier.h"

namespace kvpool::tiers {

class LeaseTable {
 public:
  // A new lease on `entry` for `owner`, ending by itself at `deadline` (TimePoint::max(): only
  // when ended). Ids start at 1 and are never reused.
  uint64_t Add(EntryId entry, uint64_t owner, Clock::TimePoint deadline);
  // Ends lease `id`; its entry, or nullopt when there is no such lease (ended, expired).
  std::optional<EntryId> End(uint64_t id);
  // The same, only when `owner` holds it (another owner's id is left alone).
  std::optional<EntryId> EndIfOwned(uint64_t id, uint64_t owner);
  // Ends every lease of `owner`; one entry per lease ended.
  std::vector<EntryId> EndOwner(uint64_t owner);
  // Ends every lease whose deadline is before `now`; one entry per lease ended.
  std::vector<EntryId> EndExpired(Clock::TimePoint now);
  size_t size() const { return leases_.size(); }

 private:
  struct Lease {
    EntryId entry = kNoEntry;
    uint64_t owner = 0;
    Clock::TimePoint deadline;
  };
  absl::flat_hash_map<uint64_t, Lease> leases_;
  uint64_t next_id_ = 1;
};

// One block a writer wants to put.
struct PutRequestItem {
  BlockKey key;
  uint64_t size = 0;
  uint64_t checksum = 0;
  BlockKey parent;  // zero: first block of a chain
};

// What a Reserve may wait for and what its kPresent means (TierManager::Reserve).
struct ReserveAsk {
  // False: a block that would need a wait (for room, or for its disk copy) is refused with
  // Unavailable instead.
  bool may_wait = true;
  // A put whose OK must mean durable (a client's): in a namespace that writes on commit,
  // kPresent then means on disk. False for a copy of a block that is durable elsewhere (one a
  // peer serves, or pushes as a replica), where kPresent means cached, as in any namespace.
  bool durable = true;
  // >= 0: the writer's bytes are in this CUDA device's memory (a slot in its gpu tier too).
  int gpu_device = -1;
  // The longest a durable put waits for other writers, in all (the writer's own deadline);
  // zero: TierManagerOptions::in_flight_put_wait, which also bounds it.
  std::chrono::milliseconds wait_limit{0};
};

struct Reservation {
  uint64_t owner = 0;
  NamespaceId ns = 0;
  PutRequestItem item;
  MemorySlot slot;  // in the host tier
  // A put straight into gpu tier `gpu` (the index in the tier stack; -1: none) writes
  // `gpu_slot` there; `slot` then receives the host copy the daemon makes from it.
  int gpu = -1;
  MemorySlot gpu_slot;
  Clock::TimePoint deadline;  // TimePoint::max(): being written or committed, never expires
};

class ReservationTable {
 public:
  // Files `r`; the key must not be reserved already. Ids start at 1 and are never reused.
  uint64_t Add(const Reservation& r);
  // The reservation, or null when unknown (committed, aborted, expired) or another owner's.
  Reservation* FindOwned(uint64_t id, uint64_t owner);
  bool Contains(uint64_t id) const { return reservations_.contains(id); }
  // Whether (ns, key) has an open reservation.
  bool Reserved(NamespaceId ns, const BlockKey& key) const;
  // Takes reservation `id` out of the table (the caller frees or publishes its slot).
  std::optional<Reservation> Remove(uint64_t id);
  // Ids of `owner`'s reservations.
  std::vector<uint64_t> OwnedBy(uint64_t owner) const;
  // Ids of reservations whose deadline is before `now`.
  std::vector<uint64_t> Expired(Clock::TimePoint now) const;
  // Whether `owner` has a reservation whose slot lies in `segment` (of `segment_bytes`).
  bool OwnerHasSlotIn(uint64_t owner, uint32_t segment, uint64_t segment_bytes) const;
  std::vector<uint64_t> All() const;
  size_t size() const { return reservations_.size(); }

 private:
  absl::flat_hash_map<uint64_t, Reservation> reservations_;
  absl::flat_hash_map<NamespacedKey, uint64_t> by_key_;
  uint64_t next_id_ = 1;
};

}  // namespace kvpool::tiers
