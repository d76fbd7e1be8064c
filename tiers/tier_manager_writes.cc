// TierManager, part of tiers/tier_manager.h: writes (reserve, commit, abort) and sessions'
// pins.

#include "tiers/tier_manager.h"

#include <glog/logging.h>

#include <algorithm>

#include "common/checksum.h"
#include "common/units.h"

namespace kvpool::tiers {

namespace {

// A reservation `owner` does not hold: never made, expired, committed, aborted or another's.
Status UnknownReservation(uint64_t reservation_id) {
  return Status::NotFound("reservation " + std::to_string(reservation_id) +
                          " is unknown or expired");
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Writes

std::vector<ReserveOutcome> TierManager::Reserve(NamespaceId ns, uint64_t owner,
                                                 std::span<const PutRequestItem> items,
                                                 ReserveAsk ask) {
  const int gpu = ask.gpu_device >= 0 ? GpuIndexOf(ask.gpu_device) : -1;
  if (ask.gpu_device >= 0 && gpu < 0) {
    std::vector<ReserveOutcome> out(items.size());
    for (ReserveOutcome& o : out) {
      o.status =
          Status::InvalidArgument("no gpu tier on CUDA device " + std::to_string(ask.gpu_device));
    }
    return out;
  }
  absl::MutexLock lock(&mu_);
  return ReserveLocked(ns, owner, items, ask, /*may_renew=*/true, gpu);
}

std::optional<std::vector<ReserveOutcome>> TierManager::TryReserve(
    NamespaceId ns, uint64_t owner, std::span<const PutRequestItem> items, bool durable) {
  absl::MutexLock lock(&mu_);
  std::vector<ReserveOutcome> out =
      ReserveLocked(ns, owner, items, {.may_wait = false, .durable = durable}, /*may_renew=*/false);
  for (const ReserveOutcome& o : out) {
    if (o.state == ReserveState::kRefused && o.status.code() == StatusCode::kUnavailable) {
      // Room for this one needs a disk write, a wait or a segment renewed: undo the call's
      // reservations. (What it did besides stands, as a worker's Reserve would do it again: the
      // blocks already cached were touched, and host copies were evicted for room.)
      for (const ReserveOutcome& r : out) {
        if (r.state == ReserveState::kReserved) FreeReservationLocked(r.reservation_id);
      }
      return std::nullopt;
    }
  }
  return out;
}

std::vector<ReserveOutcome> TierManager::ReserveLocked(NamespaceId ns, uint64_t owner,
                                                       std::span<const PutRequestItem> items,
                                                       ReserveAsk ask, bool may_renew, int gpu) {
  const bool may_wait = ask.may_wait;
  std::vector<ReserveOutcome> out(items.size());
  // A namespace that writes to disk on commit needs the bytes in host by then: no gpu slots.
  if (gpu >= 0 && PolicyLocked(ns).write->WriteOnCommit()) gpu = -1;
  const uint32_t now = NowSeconds();
  const uint64_t max_block = max_block_bytes();
  std::optional<Clock::TimePoint> wait_until;  // the first wait of the call sets it
  for (size_t i = 0; i < items.size(); ++i) {
    const PutRequestItem& item = items[i];
    ReserveOutcome& o = out[i];
    if (item.size == 0) {
      o.status = Status::InvalidArgument("block " + item.key.ShortHex() + " is empty");
      continue;
    }
    if (item.size > max_block) {
      o.status =
          Status::InvalidArgument("block " + item.key.ShortHex() + " of " + FormatBytes(item.size) +
                                  " exceeds the " + FormatBytes(max_block) + " block size limit");
      continue;
    }
    // Whether the block is settled without a slot (cached, being written by another writer, or
    // refused); false: it needs one. See Reserve in tier_manager.h for what waits.
    bool wrote = false;  // this call wrote the block down once
    auto wait = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      // One deadline for the whole call: once it has passed, later blocks do not wait at all.
      if (!wait_until) {
        wait_until = clock_.Now() + (ask.wait_limit.count() > 0
                                         ? std::min(ask.wait_limit, options_.in_flight_put_wait)
                                         : options_.in_flight_put_wait);
      }
      return !clock_.WaitUntil(changed_, mu_, *wait_until) && !stopping_;
    };
    auto classify = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (;;) {
        // Only a durable put is answered kPresent for a block on disk alone.
        const bool on_commit = ask.durable && PolicyLocked(ns).write->WriteOnCommit();
        const EntryId id = FindCachedLocked(ns, item.key);
        if (id != kNoEntry) {
          Entry& e = index_.at(id);
          if (ApproximateOnlyLocked(id) && e.In(Tier::kHost) && !e.In(Tier::kGpu) &&
              e.leases == 0 && e.busy == 0 && e.children[TierSlot(Tier::kHost)] == 0) {
            // Held only as the approximate bytes decoded from a lossy disk copy since dropped:
            // the writer's exact bytes replace them.
            ++host_counters_.evictions;
            DropHostCopyLocked(id);
            continue;
          }
          index_.Touch(id, now);  // at once: making room for the next blocks must not evict it
          if (!on_commit || e.In(Tier::kDisk)) {
            o.state = ReserveState::kPresent;
            return true;
          }
          o.state = ReserveState::kRefused;
          if (!may_wait) {
            o.status = Status::Unavailable("block " + item.key.ShortHex() + " is not on disk yet");
            return true;
          }
          if (e.busy == 0) {
            // Cached without its disk copy, and nothing is writing one: write it now (once: a
            // write that took nothing and said nothing is not tried again).
            if (wrote) {
              o.status = Status::Unavailable("block " + item.key.ShortHex() +
                                             " could not be written to disk");
              return true;
            }
            wrote = true;
            e.busy |= kBusyDemoting;
            if (Status st = WriteDownLocked({id}, /*drop_host=*/false, /*sync=*/false); !st.ok()) {
              o.status = st.WithContext("write-through of block " + item.key.ShortHex());
              return true;
            }
          } else if (!wait()) {
            o.status = Status::Unavailable("block " + item.key.ShortHex() +
                                           " is cached but its write to disk has not ended");
            return true;
          }
          continue;  // the lock was let go: look again
        }
        if (reservations_.Reserved(ns, item.key)) {
          // (OwnedBy walks every reservation: only on this rare path.)
          if (on_commit && reservations_.OwnedBy(owner).empty()) {
            if (!may_wait) {
              o.state = ReserveState::kRefused;
              o.status = Status::Unavailable("block " + item.key.ShortHex() +
                                             " is being put by another writer");
              return true;
            }
            if (wait()) continue;
          }
          o.state = ReserveState::kInProgress;
          return true;
        }
        return false;
      }
    };
    if (classify()) continue;
    // After making room, which may have let the lock go: whether the block was reserved or
    // stored meanwhile, or the daemon began to stop (the outcome then says so).
    auto overtaken = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (classify()) return true;
      if (!stopping_) return false;
      o.status = Status::Unavailable("the tier manager is stopping");
      return true;
    };
    // (Making room may push out the block this one extends; in a namespace whose disk takes
    // nothing the new block is then stored without its parent link, unreachable by lookups,
    // until it ages out. Holding the parent instead would leave a chain longer than the host
    // tier nothing to evict, tail first.)
    Result<HostSlot> slot = AllocateHostLocked(ns, item.size, may_wait, may_renew);
    if (!slot.ok()) {
      o.status = slot.status();
      continue;
    }
    if (overtaken()) {
      host_.Free(*slot);
      continue;
    }
    Reservation r;
    r.owner = owner;
    r.ns = ns;
    r.item = item;
    r.slot = *slot;
    if (gpu >= 0 && item.size <= gpus_[gpu]->max_block_bytes()) {
      // Room there is made by dropping cold gpu copies only (each has its host copy), or by a
      // segment renewed without the lock. None to be had, the block is put into host as any
      // other.
      Result<MemorySlot> gpu_slot = AllocateGpuLocked(*gpus_[gpu], ns, item.size, may_renew);
      // (Checked whether or not the renewal gave room.)
      if (overtaken()) {
        if (gpu_slot.ok()) gpus_[gpu]->Free(*gpu_slot);
        host_.Free(*slot);
        continue;
      }
      if (gpu_slot.ok()) {
        r.gpu = gpu;
        r.gpu_slot = *gpu_slot;
        o.gpu_device = gpus_[gpu]->device();
        o.gpu_offset = gpu_slot->offset;
      }
    }
    r.deadline = clock_.Now() + options_.reservation_timeout;
    const uint64_t rid = reservations_.Add(r);
    o.state = ReserveState::kReserved;
    o.reservation_id = rid;
    o.arena_offset = slot->offset;
  }
  return out;
}

Result<ReservationTarget> TierManager::TargetOf(uint64_t owner, uint64_t reservation_id) {
  absl::MutexLock lock(&mu_);
  Reservation* found = reservations_.FindOwned(reservation_id, owner);
  if (found == nullptr) return UnknownReservation(reservation_id);
  Reservation& r = *found;
  // The caller now writes through a raw pointer, maybe for a while (a slow client's payload):
  // expiry must not free the slot under it, where another block (of any namespace) could be
  // placed and then overwritten. From here only Commit, Abort or AbortOwner release it.
  r.deadline = Clock::TimePoint::max();
  return ReservationTarget{host_.Data(r.slot), r.item.size, r.slot.offset, r.item.key,
                           r.item.parent};
}

void TierManager::FreeReservationLocked(uint64_t rid) {
  if (std::optional<Reservation> r = reservations_.Remove(rid)) {
    host_.Free(r->slot);
    if (r->gpu >= 0) gpus_[r->gpu]->Free(r->gpu_slot);
    changed_.SignalAll();  // AwaitInFlightPut
  }
}

void TierManager::ExpireReservationsLocked() {
  for (uint64_t rid : reservations_.Expired(clock_.Now())) {
    LOG(WARNING) << "reservation " << rid << " expired uncommitted; reclaiming its slot";
    FreeReservationLocked(rid);
  }
}

Status TierManager::Commit(uint64_t owner, uint64_t reservation_id,
                           std::optional<uint64_t> checksum) {
  Reservation r;
  {
    absl::MutexLock lock(&mu_);
    Reservation* found = reservations_.FindOwned(reservation_id, owner);
    if (found == nullptr) return UnknownReservation(reservation_id);
    found->deadline = Clock::TimePoint::max();  // committing
    if (checksum.has_value()) found->item.checksum = *checksum;
    r = *found;
  }
  // A writer that copied the bytes into the slot itself (in place) hashed them as it copied and
  // gives that checksum here: it is stored as given. Hashing the slot again would read every put
  // byte a second time (a third of an in-place put's cost) and prove only that the writer hashed
  // what it wrote. A writer that lies damages its own namespace only, and no wrong byte is
  // served: every client read verifies, and so do demotion (tier_copy.h), replication and gpu
  // placement before they copy. Bytes that crossed a socket or UCX are hashed here, against the
  // checksum announced at reserve. Expiry skips a committing reservation, but Abort, AbortOwner
  // (the connection closed) and Shutdown may still free it while we hash: the result is then
  // discarded below.
  const uint64_t actual =
      checksum.has_value() ? *checksum : BlockChecksum(host_.Data(r.slot), r.item.size);

  absl::MutexLock lock(&mu_);
  return PublishLocked(reservation_id, r, actual);
}

std::optional<std::vector<Status>> TierManager::TryCommit(uint64_t owner,
                                                          std::span<const uint64_t> ids,
                                                          std::span<const uint64_t> sizes,
                                                          std::span<const uint64_t> checksums) {
  absl::MutexLock lock(&mu_);
  // As PutCommit's worker path answers: every reservation is checked first (and a namespace
  // that writes on commit leaves the whole batch to Commit), then each one that passed is
  // published and each one that did not is aborted, in order.
  std::vector<Status> out(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const Reservation* found = reservations_.FindOwned(ids[i], owner);
    if (found == nullptr) {
      out[i] = UnknownReservation(ids[i]);
    } else if (PolicyLocked(found->ns).write->WriteOnCommit()) {
      return std::nullopt;
    } else if (found->item.size != sizes[i]) {
      out[i] = Status::InvalidArgument("reservation size mismatch");
    }
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    Reservation* found = reservations_.FindOwned(ids[i], owner);
    if (!out[i].ok()) {
      if (found != nullptr) FreeReservationLocked(ids[i]);
      continue;
    }
    if (found == nullptr) {  // named twice: the first one committed it
      out[i] = UnknownReservation(ids[i]);
      continue;
    }
    // The writer's checksum is stored as given, as in Commit.
    found->item.checksum = checksums[i];
    const Reservation r = *found;
    out[i] = PublishLocked(ids[i], r, checksums[i]);
  }
  return out;
}

EntryId TierManager::EntryToPublishLocked(const Reservation& r) {
  EntryId id = index_.Find(r.ns, r.item.key);
  if (id != kNoEntry && index_.at(id).tiers != 0) return kNoEntry;
  if (id == kNoEntry) id = index_.Insert(r.ns, r.item.key);
  // A new entry, or a copy-less one (a session's pin kept it) that has no parent link yet.
  if (index_.at(id).parent == kNoEntry && !r.item.parent.IsZero()) {
    const EntryId parent = index_.Find(r.ns, r.item.parent);
    if (parent != kNoEntry && !index_.WouldLoop(id, parent)) index_.SetParent(id, parent);
  }
  return id;
}

Status TierManager::PublishLocked(uint64_t reservation_id, const Reservation& r, uint64_t actual) {
  changed_.SignalAll();  // AwaitInFlightPut: whatever happens below, this reservation ends
  if (!reservations_.Remove(reservation_id).has_value()) {
    // Its slot was freed (and may be reused): publishing it would serve or free foreign bytes.
    return Status::Aborted("reservation " + std::to_string(reservation_id) +
                           " was aborted while committing");
  }
  // Committed as an ordinary put (its bytes in the host slot): the gpu slot is not used.
  if (r.gpu >= 0) gpus_[r.gpu]->Free(r.gpu_slot);
  if (actual != r.item.checksum) {
    host_.Free(r.slot);
    ++checksum_failures_;
    return Status::Corruption("block " + r.item.key.ShortHex() +
                              ": payload does not match its checksum (damaged in transfer)");
  }
  const EntryId id = EntryToPublishLocked(r);
  if (id == kNoEntry) {
    host_.Free(r.slot);  // cannot happen while reserved; harmless if it does
    return Status::OK();
  }
  Entry& e = index_.at(id);
  e.size = static_cast<uint32_t>(r.item.size);
  e.checksum = r.item.checksum;
  AddHostCopyLocked(id, r.slot.offset);
  index_.Touch(id, NowSeconds());
  if (PolicyLocked(r.ns).write->WriteOnCommit()) {
    e.busy |= kBusyDemoting;
    Status st = WriteDownLocked({id}, /*drop_host=*/false, /*sync=*/false);
    if (!st.ok()) {
      // The namespace asked for blocks on disk before the put returns: take it back out of host
      // so a failed put is not half stored (unless a reader got to it meanwhile).
      const EntryId again = FindCachedLocked(r.ns, r.item.key);
      if (again != kNoEntry && index_.at(again).In(Tier::kHost) &&
          !index_.at(again).In(Tier::kDisk) && index_.at(again).leases == 0 &&
          index_.at(again).busy == 0 && index_.at(again).children[TierSlot(Tier::kHost)] == 0) {
        ++host_counters_.evictions;
        DropHostCopyLocked(again);
      }
      return st.WithContext("write-through of block " + r.item.key.ShortHex());
    }
  }
  if (HostAboveHighWatermarkLocked()) mover_.WakeFlusher();
  return Status::OK();
}

std::vector<Status> TierManager::CommitToGpu(uint64_t owner, std::span<const uint64_t> ids,
                                             std::span<const uint64_t> device_checksums) {
  std::vector<Status> out(ids.size());
  struct Checked {
    size_t i;
    Reservation r;
    uint64_t actual = 0;
    Status status;
  };
  std::vector<Checked> checked;
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < ids.size(); ++i) {
      Reservation* found = reservations_.FindOwned(ids[i], owner);
      if (found == nullptr) {
        out[i] = UnknownReservation(ids[i]);
      } else if (found->gpu < 0) {
        FreeReservationLocked(ids[i]);
        out[i] = Status::InvalidArgument("reservation " + std::to_string(ids[i]) +
                                         " has no gpu slot: commit it with its checksum");
      } else {
        found->deadline = Clock::TimePoint::max();  // committing
        found->item.checksum = device_checksums[i];
        checked.push_back({i, *found, 0, Status::OK()});
      }
    }
  }
  // Off the lock, one kernel launch per GPU over its slots. Abort, AbortOwner and Shutdown may
  // free a slot meanwhile: PublishGpuLocked then discards its result.
  for (size_t g = 0; g < gpus_.size(); ++g) {
    std::vector<kernels::ByteRange> ranges;
    std::vector<Checked*> of_g;
    for (Checked& c : checked) {
      if (c.r.gpu != static_cast<int>(g)) continue;
      ranges.push_back({gpus_[g]->Data(c.r.gpu_slot), c.r.item.size});
      of_g.push_back(&c);
    }
    if (ranges.empty()) continue;
    Result<std::vector<uint64_t>> sums =
        gpus_[g]->copies().DeviceChecksums(ranges.data(), ranges.size(), nullptr);
    for (size_t k = 0; k < of_g.size(); ++k) {
      if (sums.ok()) {
        of_g[k]->actual = (*sums)[k];
      } else {
        of_g[k]->status = sums.status().WithContext("checking the slots on gpu " +
                                                    std::to_string(gpus_[g]->device()));
      }
    }
  }
  absl::MutexLock lock(&mu_);
  for (const Checked& c : checked) {
    if (!c.status.ok()) {
      if (reservations_.Contains(ids[c.i])) FreeReservationLocked(ids[c.i]);
      out[c.i] = c.status;
      continue;
    }
    out[c.i] = PublishGpuLocked(ids[c.i], c.r, c.actual);
  }
  return out;
}

Status TierManager::PublishGpuLocked(uint64_t reservation_id, const Reservation& r,
                                     uint64_t actual) {
  changed_.SignalAll();  // AwaitInFlightPut
  if (!reservations_.Remove(reservation_id).has_value()) {
    return Status::Aborted("reservation " + std::to_string(reservation_id) +
                           " was aborted while committing");
  }
  GpuTier& gpu = *gpus_[r.gpu];
  const auto free_slots = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    host_.Free(r.slot);
    gpu.Free(r.gpu_slot);
  };
  if (actual != r.item.checksum) {
    free_slots();
    ++checksum_failures_;
    return Status::Corruption("block " + r.item.key.ShortHex() + " on gpu " +
                              std::to_string(gpu.device()) +
                              ": its slot does not match the device checksum it was committed "
                              "with (damaged in the copy)");
  }
  if (stopping_) {  // the copy worker is gone: nobody would make the host copy
    free_slots();
    return Status::Unavailable("daemon shutting down");
  }
  const EntryId id = EntryToPublishLocked(r);
  if (id == kNoEntry) {
    free_slots();  // cannot happen while reserved; harmless if it does
    return Status::OK();
  }
  Entry& e = index_.at(id);
  e.size = static_cast<uint32_t>(r.item.size);
  e.checksum = 0;  // its xxh3, once the copy worker has the bytes in host
  // Busy until its host copy is made: not evicted, demoted, written down or leased meanwhile;
  // readers wait for it as for a promotion (AcquireLocked).
  e.busy |= kBusyPromoting | kBusyFromGpu;
  AddHostCopyLocked(id, r.slot.offset);
  AddGpuCopyLocked(id, static_cast<size_t>(r.gpu), r.gpu_slot);
  index_.Touch(id, NowSeconds());
  gpu_checksums_[id] = actual;
  promotions_.emplace(id, std::make_shared<Promotion>());
  ++gpu_puts_;
  std::vector<EntryId>& fills = gpu_fills_[r.gpu];
  fills.push_back(id);
  if (fills.size() == 1) {
    GpuPlacement job;
    job.ns = r.ns;
    job.fill_host = true;
    mover_.EnqueueGpu(r.gpu, std::move(job));
  }
  if (HostAboveHighWatermarkLocked()) mover_.WakeFlusher();
  return Status::OK();
}

void TierManager::Abort(uint64_t owner, uint64_t reservation_id) {
  absl::MutexLock lock(&mu_);
  if (reservations_.FindOwned(reservation_id, owner) == nullptr) return;
  FreeReservationLocked(reservation_id);
}

void TierManager::SetReservedParent(uint64_t owner, uint64_t reservation_id,
                                    const BlockKey& parent) {
  absl::MutexLock lock(&mu_);
  Reservation* r = reservations_.FindOwned(reservation_id, owner);
  if (r != nullptr) r->item.parent = parent;
}

void TierManager::LinkUnderParents(NamespaceId ns,
                                   std::span<const std::pair<BlockKey, BlockKey>> blocks) {
  absl::MutexLock lock(&mu_);
  for (const auto& [key, parent_key] : blocks) {
    if (parent_key.IsZero()) continue;
    const EntryId id = index_.Find(ns, key);
    if (id == kNoEntry || index_.at(id).parent != kNoEntry) continue;
    const EntryId parent = index_.Find(ns, parent_key);
    if (parent != kNoEntry && !index_.WouldLoop(id, parent)) index_.Adopt(id, parent);
  }
}

bool TierManager::AwaitInFlightPut(NamespaceId ns, const BlockKey& key, Clock::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const Clock::TimePoint deadline = clock_.Now() + timeout;
  while (reservations_.Reserved(ns, key) && !clock_.WaitUntil(changed_, mu_, deadline)) {
  }
  return FindCachedLocked(ns, key) != kNoEntry;
}

bool TierManager::OwnerHasReservationIn(uint64_t owner, uint32_t segment) const {
  absl::MutexLock lock(&mu_);
  return reservations_.OwnerHasSlotIn(owner, segment, host_.segment_bytes());
}

void TierManager::AbortOwner(uint64_t owner) {
  absl::MutexLock lock(&mu_);
  for (uint64_t rid : reservations_.OwnedBy(owner)) FreeReservationLocked(rid);
}

// ---------------------------------------------------------------------------------------------
// Sessions

Result<uint64_t> TierManager::PinChain(NamespaceId ns, std::span<const BlockKey> chain) {
  absl::MutexLock lock(&mu_);
  // A session asks for its blocks on disk explicitly: only a namespace whose disk takes nothing
  // refuses it (after-N-hits admission is about demotion, not sessions).
  if (!PolicyLocked(ns).admission->AdmitsAny()) {
    return Status::FailedPrecondition(
        "this namespace's disk admission is 'none': its sessions cannot be persisted");
  }
  for (;;) {
    std::vector<EntryId> ids;
    std::vector<EntryId> to_write;
    bool busy = false;
    for (size_t i = 0; i < chain.size(); ++i) {
      const EntryId id = FindCachedLocked(ns, chain[i]);
      if (id == kNoEntry) {
        return Status::FailedPrecondition("block " + std::to_string(i) + " of the chain (" +
                                          chain[i].ShortHex() +
                                          ") is not cached; put it before saving the session");
      }
      const Entry& e = index_.at(id);
      if (e.busy != 0) busy = true;
      if (!e.In(Tier::kDisk)) to_write.push_back(id);
      ids.push_back(id);
    }
    if (busy) {
      changed_.Wait(&mu_);
      if (stopping_) return Status::Aborted("daemon shutting down");
      continue;
    }
    if (!to_write.empty()) {
      // Each block once, however often the chain names it (a second disk copy is a bug).
      std::sort(to_write.begin(), to_write.end());
      to_write.erase(std::unique(to_write.begin(), to_write.end()), to_write.end());
      // Hold the chain's blocks already on disk while making room for the rest: were they the
      // room, the next round would write them back and drop these, forever.
      std::vector<EntryId> held;
      for (EntryId id : ids) {
        if (index_.at(id).In(Tier::kDisk)) {
          index_.Pin(id);
          held.push_back(id);
        }
      }
      for (EntryId id : to_write) index_.at(id).busy |= kBusyDemoting;
      Status st = WriteDownLocked(to_write, /*drop_host=*/false, /*sync=*/true);
      for (EntryId id : held) index_.Unpin(id);
      if (!st.ok()) return st.WithContext("writing the session's blocks to disk");
      continue;  // re-check: the lock was released
    }
    uint64_t bytes = 0;
    for (EntryId id : ids) {
      index_.Pin(id);
      bytes += index_.at(id).size;
    }
    return bytes;
  }
}

void TierManager::PinExisting(NamespaceId ns, std::span<const BlockKey> chain) {
  absl::MutexLock lock(&mu_);
  for (const BlockKey& key : chain) {
    // Every key of the session gets its one pin, also a key whose block is gone (a copy-less
    // entry holds the pin): a later UnpinChain then takes exactly this session's pins.
    EntryId id = index_.Find(ns, key);
    if (id == kNoEntry) id = index_.Insert(ns, key);
    index_.Pin(id);
  }
}

void TierManager::UnpinChain(NamespaceId ns, std::span<const BlockKey> chain) {
  absl::MutexLock lock(&mu_);
  for (const BlockKey& key : chain) {
    const EntryId id = index_.Find(ns, key);
    if (id == kNoEntry || index_.at(id).pins == 0) continue;
    index_.Unpin(id);
    MaybeEraseLocked(id);
  }
}

Status TierManager::ChargeDisk(NamespaceId ns, uint64_t bytes, bool force) {
  if (bytes == 0) return Status::OK();
  absl::MutexLock lock(&mu_);
  if (force) {
    disk_used_ += bytes;
    disk_device_room_ -= std::min(disk_device_room_, bytes);
  } else {
    KVPOOL_RETURN_IF_ERROR(EnforceDiskQuotaLocked(ns, bytes));
    KVPOOL_RETURN_IF_ERROR(ReserveDiskLocked(bytes));
  }
  disk_used_of_[ns] += bytes;
  DeleteDroppedLocked();  // the records of blocks dropped to make room
  return Status::OK();
}

void TierManager::UnchargeDisk(NamespaceId ns, uint64_t bytes) {
  if (bytes == 0) return;
  absl::MutexLock lock(&mu_);
  DCHECK_GE(disk_used_, bytes);
  disk_used_ -= std::min(disk_used_, bytes);  // (the device's room is measured again)
  if (auto it = disk_used_of_.find(ns); it != disk_used_of_.end()) {
    it->second -= std::min(it->second, bytes);
    if (it->second == 0) disk_used_of_.erase(it);
  }
  changed_.SignalAll();
}

std::vector<TierManager::CachedBlock> TierManager::SnapshotCached() const {
  absl::MutexLock lock(&mu_);
  std::vector<CachedBlock> out;
  out.reserve(index_.size());
  index_.ForEach(kNoNamespace, [&](EntryId id) {
    const Entry& e = index_.at(id);
    if (e.tiers == 0) return;
    out.push_back({e.ns, e.key, ParentKeyLocked(id)});
  });
  return out;
}

std::vector<Tier> TierManager::Where(NamespaceId ns, std::span<const BlockKey> keys) const {
  const std::vector<HashedKey> hashed = HashKeys(ns, keys);
  absl::ReaderMutexLock lock(&mu_);
  std::vector<Tier> out;
  out.reserve(keys.size());
  for (EntryId id : FindEachLocked(hashed, /*prefix=*/false)) {
    out.push_back(id == kNoEntry ? Tier::kNone : FastestTier(index_.at(id)));
  }
  return out;
}

std::vector<BlockKey> TierManager::Parents(NamespaceId ns, std::span<const BlockKey> keys) const {
  const std::vector<HashedKey> hashed = HashKeys(ns, keys);
  absl::ReaderMutexLock lock(&mu_);
  std::vector<BlockKey> out(keys.size());
  const std::vector<EntryId> found = FindEachLocked(hashed, /*prefix=*/false);
  for (size_t i = 0; i < found.size(); ++i) {
    if (found[i] != kNoEntry) out[i] = ParentKeyLocked(found[i]);
  }
  return out;
}

uint32_t TierManager::CountCached(NamespaceId ns, std::span<const BlockKey> chain) {
  const std::vector<HashedKey> hashed = HashKeys(ns, chain);
  absl::ReaderMutexLock lock(&mu_);
  const std::vector<EntryId> ids = FindEachLocked(hashed, /*prefix=*/false);
  return static_cast<uint32_t>(
      std::count_if(ids.begin(), ids.end(), [](EntryId id) { return id != kNoEntry; }));
}

}  // namespace kvpool::tiers
