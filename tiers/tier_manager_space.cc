// TierManager, part of tiers/tier_manager.h: host and disk space (write-down, eviction, the
// flusher's rounds) and promotion, the work the mover (tiers/mover.h) runs in the background.

#include "tiers/tier_manager.h"

#include <glog/logging.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "common/checksum.h"
#include "common/units.h"

namespace kvpool::tiers {

// ---------------------------------------------------------------------------------------------
// Host and disk space

bool TierManager::HostAboveHighWatermarkLocked() const {
  return static_cast<double>(host_.allocated_bytes()) >
         options_.host_high_watermark * static_cast<double>(host_.capacity_bytes());
}

void TierManager::AddHostCopyLocked(EntryId id, uint64_t offset) {
  index_.EnsureMem(id).host_offset = offset;
  index_.AddCopy(id, Tier::kHost);
  host_segments_.Add(offset, id);
  ++host_blocks_;
}

void TierManager::DropHostCopyLocked(EntryId id) {
  const Entry& e = index_.at(id);
  if (e.In(Tier::kGpu)) DropGpuCopyLocked(id);
  // Read before the copy goes: with its last memory copy, its memory part goes too.
  const HostSlot slot{index_.Mem(id).host_offset, e.size};
  index_.RemoveCopy(id, Tier::kHost);
  host_segments_.Remove(slot.offset, id);
  host_.Free(slot);
  --host_blocks_;
  MaybeEraseLocked(id);
}

void TierManager::DropDiskCopiesLocked(const std::vector<EntryId>& ids) {
  if (ids.empty()) return;
  for (EntryId id : ids) {
    Entry& e = index_.at(id);
    // (A key is never queued twice: writing it again waits for its delete, and only a written
    // copy can be dropped.)
    delete_queue_.emplace_back(e.ns, e.key);
    deleting_.insert(NamespacedKey{e.ns, e.key});
    index_.RemoveCopy(id, Tier::kDisk);
    DCHECK_GE(disk_used_, e.disk_bytes()) << "disk bytes given back that were never charged";
    disk_used_ -= std::min(disk_used_, e.disk_bytes());
    if (auto it = disk_used_of_.find(e.ns); it != disk_used_of_.end()) {
      it->second -= std::min(it->second, e.disk_bytes());
      if (it->second == 0) disk_used_of_.erase(it);
    }
    e.disk_encoding = 0;
    e.disk_size = 0;
    --disk_blocks_;
    MaybeEraseLocked(id);
  }
}

void TierManager::DeleteDroppedLocked() {
  if (delete_queue_.empty()) return;
  std::vector<std::pair<NamespaceId, BlockKey>> batch;
  batch.swap(delete_queue_);
  mu_.Unlock();
  Status st = disk_.Delete(batch);
  mu_.Lock();
  if (!st.ok()) {
    // The index forgot them either way; a record left behind is valid data and is served
    // again (verified) after a restart.
    ++disk_delete_errors_;
    LOG(ERROR) << "deleting " << batch.size() << " blocks from disk: " << st.ToString();
  }
  for (const auto& [ns, key] : batch) deleting_.erase(NamespacedKey{ns, key});
  changed_.SignalAll();  // writers of these keys (WriteDownLocked) wait for this
}

uint64_t DiskDeviceRoom(std::optional<uint64_t> free) {
  if (!free.has_value()) return UINT64_MAX;
  return *free > kDiskDeviceReserveBytes ? *free - kDiskDeviceReserveBytes : 0;
}

void TierManager::RefreshDiskSpaceLocked() {
  mu_.Unlock();
  const std::optional<uint64_t> free = disk_.free_bytes();
  mu_.Lock();
  const uint64_t room = DiskDeviceRoom(free);
  if (room < (256ull << 20) && disk_device_room_ >= (256ull << 20)) {
    LOG(WARNING) << "the disk tier's device has " << FormatBytes(free.value_or(0))
                 << " free: new disk writes stop at " << FormatBytes(kDiskDeviceReserveBytes);
  }
  disk_device_room_ = room;
}

Status TierManager::ReserveDiskLocked(uint64_t bytes) {
  if (bytes > options_.disk_capacity_bytes) {
    return Status::ResourceExhausted(FormatBytes(bytes) + " exceeds the disk tier capacity of " +
                                     FormatBytes(options_.disk_capacity_bytes));
  }
  if (bytes > disk_device_room_) {
    return Status::ResourceExhausted("the disk tier's device is full: " + FormatBytes(bytes) +
                                     " to write, " + FormatBytes(disk_device_room_) +
                                     " left above the " + FormatBytes(kDiskDeviceReserveBytes) +
                                     " kvpool keeps free");
  }
  while (disk_used_ + bytes > options_.disk_capacity_bytes) {
    const uint64_t need = disk_used_ + bytes - options_.disk_capacity_bytes;
    std::vector<EntryId> victims;
    pools_.Victims(
        Tier::kDisk, need, [&](EntryId id) { return index_.at(id).busy == 0; }, &victims);
    if (victims.empty()) {
      return Status::ResourceExhausted(
          "disk tier full (" + FormatBytes(disk_used_) + " of " +
          FormatBytes(options_.disk_capacity_bytes) +
          "): the rest is pinned by sessions, has cached descendants or is in use");
    }
    disk_counters_.evictions += victims.size();
    DropDiskCopiesLocked(victims);
  }
  disk_used_ += bytes;
  disk_device_room_ -= bytes;
  return Status::OK();
}

Status TierManager::EnforceDiskQuotaLocked(NamespaceId ns, uint64_t extra) {
  const uint64_t quota = PolicyLocked(ns).disk_quota_bytes;
  if (quota == 0) return Status::OK();
  if (extra > quota) {
    return Status::ResourceExhausted(
        FormatBytes(extra) + " exceeds the namespace's disk quota of " + FormatBytes(quota));
  }
  for (;;) {
    auto it = disk_used_of_.find(ns);
    const uint64_t used = it == disk_used_of_.end() ? 0 : it->second;
    if (used + extra <= quota) return Status::OK();
    std::vector<EntryId> victims;
    pools_.VictimsOf(
        ns, Tier::kDisk, used + extra - quota, [&](EntryId id) { return index_.at(id).busy == 0; },
        &victims);
    if (victims.empty()) {
      return Status::ResourceExhausted("namespace over its disk quota (" + FormatBytes(used) +
                                       " of " + FormatBytes(quota) +
                                       "): the rest of its blocks are pinned by sessions, have "
                                       "cached descendants or are in use");
    }
    disk_counters_.evictions += victims.size();
    blocks_over_quota_ += victims.size();
    DropDiskCopiesLocked(victims);
  }
}

Status TierManager::WriteDownLocked(const std::vector<EntryId>& all_ids, bool drop_host,
                                    bool sync) {
  // A namespace over its disk quota first gives up its own coldest disk blocks; the blocks of
  // one that cannot are not written (and, when `drop_host`, leave the cache).
  std::vector<EntryId> ids;
  Status quota_status;
  {
    // Per namespace with a quota: what this batch adds, keeping the last blocks of the batch (the
    // hottest, victims come coldest first) when the batch alone exceeds the quota.
    absl::flat_hash_map<NamespaceId, uint64_t> adding;
    absl::flat_hash_set<EntryId> refused;
    for (size_t i = all_ids.size(); i-- > 0;) {
      const Entry& e = index_.at(all_ids[i]);
      const NamespacePolicy& policy = PolicyLocked(e.ns);
      if (policy.disk_quota_bytes == 0) continue;
      const uint64_t bytes = policy.encoding && policy.encoding->Applies(e.size)
                                 ? policy.encoding->encoded_bytes()
                                 : e.size;
      uint64_t& sum = adding[e.ns];
      if (sum + bytes > policy.disk_quota_bytes) {
        refused.insert(all_ids[i]);
        if (quota_status.ok()) {
          quota_status = Status::ResourceExhausted("block " + e.key.ShortHex() +
                                                   " does not fit the namespace's disk quota of " +
                                                   FormatBytes(policy.disk_quota_bytes));
        }
      } else {
        sum += bytes;
      }
    }
    absl::flat_hash_set<NamespaceId> full;
    for (const auto& [ns, bytes] : adding) {
      if (Status st = EnforceDiskQuotaLocked(ns, bytes); !st.ok()) {
        full.insert(ns);
        if (quota_status.ok()) quota_status = std::move(st);
      }
    }
    ids.reserve(all_ids.size());
    for (EntryId id : all_ids) {
      Entry& e = index_.at(id);
      // A host copy decoded from a lossy disk copy (since dropped) is not written down: written
      // as it is, its approximate bytes would come back as the block that was put.
      const bool lossy = ApproximateOnlyLocked(id);
      if (!lossy && !refused.contains(id) && !full.contains(e.ns)) {
        ids.push_back(id);
        continue;
      }
      e.busy &= static_cast<uint8_t>(~kBusyDemoting);
      if (drop_host && e.leases == 0 && e.In(Tier::kHost) && !e.In(Tier::kDisk) &&
          e.children[TierSlot(Tier::kHost)] == 0) {
        ++host_counters_.evictions;
        ++(lossy ? blocks_not_admitted_ : blocks_over_quota_);
        DropHostCopyLocked(id);
      }
      if (lossy && quota_status.ok()) {
        quota_status = Status::FailedPrecondition(
            "block " + e.key.ShortHex() +
            " is held only as the approximate copy decoded from its lossy disk copy");
      }
    }
    if (ids.empty()) {
      changed_.SignalAll();
      return quota_status;
    }
  }
  // What each block becomes on disk: its bytes as put, or encoded by its namespace's encoding.
  std::vector<std::shared_ptr<const DemotionEncoding>> encodings;  // kept alive while writing
  std::vector<const DemotionEncoding*> encoding_of;
  encodings.reserve(ids.size());
  encoding_of.reserve(ids.size());
  uint64_t total = 0;
  for (EntryId id : ids) {
    const Entry& e = index_.at(id);
    std::shared_ptr<const DemotionEncoding> enc = PolicyLocked(e.ns).encoding;
    if (enc && !enc->Applies(e.size)) enc = nullptr;
    total += enc ? enc->encoded_bytes() : e.size;
    encoding_of.push_back(enc.get());
    encodings.push_back(std::move(enc));
  }
  Status st = ReserveDiskLocked(total);
  // Each namespace is charged at once (as the tier is, above), so that concurrent write-downs of
  // one namespace see each other's bytes against its quota; a failed write gives them back.
  auto charge = [&](bool add) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (size_t i = 0; i < ids.size(); ++i) {
      const Entry& e = index_.at(ids[i]);
      const uint64_t bytes = encodings[i] ? encodings[i]->encoded_bytes() : e.size;
      uint64_t& used = disk_used_of_[e.ns];
      used = add ? used + bytes : used - std::min(used, bytes);
    }
  };
  if (st.ok()) charge(true);
  std::vector<DiskWrite> writes;
  if (st.ok()) {
    writes.reserve(ids.size());
    for (EntryId id : ids) {
      const Entry& e = index_.at(id);
      DiskWrite w;
      w.ns = e.ns;
      w.key = e.key;
      w.meta.size = e.size;
      w.meta.checksum = e.checksum;
      if (e.parent != kNoEntry) w.meta.parent = index_.at(e.parent).key;
      w.data = host_.Data(HostSlot{index_.Mem(id).host_offset, e.size});
      writes.push_back(w);
    }
    // Records dropped to make room (ReserveDiskLocked above) go first, off the lock; a block
    // whose older record is still being deleted (by another thread) is written after that.
    // The entries are kBusyDemoting: nobody frees their host copies meanwhile, and counted in
    // flight from here, so that a reservation needing their room waits for them.
    ++io_in_flight_;
    DeleteDroppedLocked();
    const auto deleting = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (deleting_.empty()) return false;
      for (const DiskWrite& w : writes) {
        if (deleting_.contains(NamespacedKey{w.ns, w.key})) return true;
      }
      return false;
    };
    while (deleting()) changed_.Wait(&mu_);
    mu_.Unlock();
    st = WriteDown(disk_, writes, encoding_of, sync);
    mu_.Lock();
    --io_in_flight_;
    if (!st.ok()) {
      disk_used_ -= total;
      // Nothing was written (saturating: a measure meanwhile may have found the room unknown).
      disk_device_room_ += std::min(total, UINT64_MAX - disk_device_room_);
      charge(false);
      ++disk_write_errors_;
      LOG(ERROR) << "writing " << ids.size() << " blocks (" << FormatBytes(total)
                 << ") to disk: " << st.ToString();
    }
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    const EntryId id = ids[i];
    Entry& e = index_.at(id);
    e.busy &= static_cast<uint8_t>(~kBusyDemoting);
    if (st.ok() && encoding_of[i] != nullptr && writes[i].meta.encoding == 0) {
      // Written raw after all (its bytes no longer match its checksum: WriteDown), so it takes
      // its raw size, and dropping it gives that back: the rest is charged now.
      const uint64_t rest = e.size - std::min<uint64_t>(e.size, encoding_of[i]->encoded_bytes());
      disk_used_ += rest;
      disk_device_room_ -= std::min(disk_device_room_, rest);
      disk_used_of_[e.ns] += rest;
    }
    if (st.ok()) {
      e.disk_encoding = writes[i].meta.encoding;
      e.disk_size = e.disk_encoding != 0 ? static_cast<uint32_t>(writes[i].meta.stored_size) : 0;
      if (e.disk_encoding != 0) ++encoded_writes_;
      index_.AddCopy(id, Tier::kDisk);
      ++disk_blocks_;
    }
    // Tail first: a block whose child kept its host copy (leased meanwhile) keeps its own.
    if (drop_host && e.leases == 0 && e.In(Tier::kHost) && e.children[TierSlot(Tier::kHost)] == 0) {
      if (st.ok()) {
        ++host_counters_.demotions;
      } else {
        ++host_counters_.evictions;
        ++blocks_lost_;
      }
      DropHostCopyLocked(id);
    }
  }
  changed_.SignalAll();
  return st.ok() ? quota_status : st;
}

uint64_t TierManager::EvictHostLocked(uint64_t budget, NamespaceId only, bool may_write) {
  uint64_t released = 0;
  uint64_t demote_bytes = 0;
  std::vector<EntryId> to_demote;
  std::vector<EntryId> victims;
  auto evictable = [&](EntryId id) {
    const Entry& e = index_.at(id);
    return e.leases == 0 && e.busy == 0;
  };
  if (only == kNoNamespace) {
    pools_.Victims(Tier::kHost, budget, evictable, &victims);
  } else {
    pools_.VictimsOf(only, Tier::kHost, budget, evictable, &victims);
  }
  for (EntryId id : victims) {
    if (released + demote_bytes >= budget || demote_bytes >= options_.demotion_batch_bytes) break;
    Entry& e = index_.at(id);
    const uint64_t pages = PagesBytes(e.size);
    if (DropHostIfUnwrittenLocked(id)) {
      released += pages;
    } else if (may_write) {
      e.busy |= kBusyDemoting;
      to_demote.push_back(id);
      demote_bytes += PagesBytes(e.size);
    }
  }
  if (!to_demote.empty()) {
    WriteDownLocked(to_demote, /*drop_host=*/true, /*sync=*/false).IgnoreError();
  }
  return released + demote_bytes;
}

bool TierManager::ApproximateOnlyLocked(EntryId id) const {
  const Entry& e = index_.at(id);
  return e.mem != kNoMem && index_.Mem(id).lossy_encoding != 0 && !e.In(Tier::kDisk);
}

bool TierManager::NeedsWriteLocked(const Entry& e) const {
  return !e.In(Tier::kDisk) && PolicyLocked(e.ns).admission->Admit(e.hits);
}

bool TierManager::DropHostIfUnwrittenLocked(EntryId id) {
  const Entry& e = index_.at(id);
  if (NeedsWriteLocked(e)) return false;
  // Not on disk: the namespace's disk does not take it, and it leaves the cache.
  if (!e.In(Tier::kDisk)) ++blocks_not_admitted_;
  ++host_counters_.evictions;
  DropHostCopyLocked(id);
  return true;
}

uint64_t TierManager::MoveHostSegmentLocked(NamespaceId ns) {
  // Each segment held by another namespace whose other segments have room for its blocks, the
  // fewest bytes first; a few of them are tried (each check walks a segment's blocks).
  constexpr size_t kSegmentsTried = 8;
  const uint64_t segment_bytes = host_.segment_bytes();
  const std::vector<MemoryTier::SegmentUse> uses = host_.SegmentUses();
  absl::flat_hash_map<NamespaceId, uint64_t> free_in;  // bytes free in the segments each holds
  for (const MemoryTier::SegmentUse& u : uses) {
    // (A segment draining, emptied for another namespace meanwhile, lends none of its pages.)
    if (u.owner != kNoNamespace && u.used_bytes > 0 && !u.draining) {
      free_in[u.owner] += segment_bytes - u.used_bytes;
    }
  }
  std::vector<std::pair<uint64_t, uint32_t>> candidates;  // (used bytes, segment)
  for (uint32_t s = 0; s < uses.size(); ++s) {
    const MemoryTier::SegmentUse& u = uses[s];
    if (u.owner == kNoNamespace || u.owner == ns || u.used_bytes == 0 || u.draining) continue;
    if (free_in[u.owner] - (segment_bytes - u.used_bytes) >= u.used_bytes) {
      candidates.emplace_back(u.used_bytes, s);
    }
  }
  std::sort(candidates.begin(), candidates.end());
  if (candidates.size() > kSegmentsTried) candidates.resize(kSegmentsTried);
  struct Move {
    EntryId id;
    MemorySlot from;
    MemorySlot to;
  };
  for (const auto& [used, segment] : candidates) {
    const NamespaceId owner = uses[segment].owner;
    // Every page of it a block's (none a reservation's), and no block leased or busy.
    std::vector<EntryId> ids;
    uint64_t block_bytes = 0;
    bool movable = true;
    for (EntryId id : host_segments_.Of(segment)) {
      const Entry& e = index_.at(id);
      if (e.leases != 0 || e.busy != 0) {
        movable = false;
        break;
      }
      block_bytes += PagesBytes(e.size);
      ids.push_back(id);
    }
    if (!movable || block_bytes != used) continue;
    // Room for all of them, the largest first, or for none.
    std::sort(ids.begin(), ids.end(), [&](EntryId a, EntryId b) {
      return index_.at(a).size != index_.at(b).size ? index_.at(a).size > index_.at(b).size : a < b;
    });
    std::vector<Move> moves;
    for (EntryId id : ids) {
      const MemorySlot from{index_.Mem(id).host_offset, index_.at(id).size};
      Result<MemorySlot> to = host_.AllocateBeside(owner, from.length, segment);
      if (!to.ok()) break;
      moves.push_back({id, from, *to});
    }
    if (moves.size() != ids.size()) {
      for (const Move& m : moves) host_.Free(m.to);
      continue;
    }
    for (const Move& m : moves) index_.at(m.id).busy |= kBusyMoving;
    host_.SetDraining(segment, true);  // no put takes its pages meanwhile, its owner's included
    ++io_in_flight_;  // a writer short of host room waits for this instead of failing
    mu_.Unlock();
    if (options_.during_host_move_for_test) options_.during_host_move_for_test();
    const auto start = std::chrono::steady_clock::now();
    for (const Move& m : moves) std::memcpy(host_.Data(m.to), host_.Data(m.from), m.from.length);
    const double copy_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    mu_.Lock();
    --io_in_flight_;
    uint64_t moved = 0;
    uint32_t kept = 0;
    for (const Move& m : moves) {
      Entry& e = index_.at(m.id);  // busy: never erased meanwhile
      e.busy &= static_cast<uint8_t>(~kBusyMoving);
      // A reader that leased the copy where it was, or an I/O started on it meanwhile, keeps it
      // there.
      if (e.leases != 0 || e.busy != 0 || !e.In(Tier::kHost) ||
          index_.Mem(m.id).host_offset != m.from.offset) {
        host_.Free(m.to);
        ++kept;
        continue;
      }
      host_segments_.Remove(m.from.offset, m.id);
      index_.Mem(m.id).host_offset = m.to.offset;
      host_segments_.Add(m.to.offset, m.id);
      host_.Free(m.from);
      moved += PagesBytes(m.from.length);
      ++host_blocks_moved_;
    }
    host_.SetDraining(segment, false);
    changed_.SignalAll();  // busy flags cleared
    VLOG(1) << "host segment " << segment << " of namespace " << owner << " emptied for namespace "
            << ns << ": " << moves.size() - kept << " blocks (" << FormatBytes(moved)
            << ") moved to its other segments in " << copy_ms << " ms"
            << (kept > 0
                    ? ", " + std::to_string(kept) + " kept where they were (read or busy meanwhile)"
                    : "");
    return moved;
  }
  return 0;
}

uint64_t TierManager::EvictHostSegmentLocked(NamespaceId ns, uint64_t bytes, bool may_write) {
  // Without writing, only a segment whose every block may simply be dropped empties.
  auto evictable = [&](EntryId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const Entry& e = index_.at(id);
    return e.leases == 0 && e.busy == 0 && (may_write || !NeedsWriteLocked(e));
  };
  std::vector<EntryId> victims;
  pools_.Victims(Tier::kHost, host_.segment_bytes(), evictable, &victims);
  uint32_t chosen = 0;
  const std::vector<EntryId> segment = SegmentToEmptyLocked(host_, host_segments_, Tier::kHost, ns,
                                                            bytes, victims, evictable, &chosen);
  // The writes release the lock: meanwhile no put (its owner's included) takes its pages.
  if (!segment.empty()) host_.SetDraining(chosen, true);
  // Descendants first: a block that needs no write goes at once when no child of it is left in
  // host; one whose child is being written goes after that write (kept busy meanwhile, so it
  // stays as it is). The writes go in batches of at most demotion_batch_bytes.
  uint64_t released = 0;
  std::vector<std::vector<EntryId>> batches(1);
  uint64_t batch_bytes = 0;
  std::vector<EntryId> after_writes;
  for (EntryId id : segment) {
    Entry& e = index_.at(id);
    const uint64_t pages = PagesBytes(e.size);
    if (e.children[TierSlot(Tier::kHost)] == 0 && DropHostIfUnwrittenLocked(id)) {
      released += pages;
      continue;
    }
    e.busy |= kBusyDemoting;
    if (!NeedsWriteLocked(e)) {
      after_writes.push_back(id);
      continue;
    }
    batches.back().push_back(id);
    released += pages;
    batch_bytes += pages;
    if (batch_bytes >= options_.demotion_batch_bytes) {
      batches.emplace_back();
      batch_bytes = 0;
    }
  }
  for (const std::vector<EntryId>& batch : batches) {
    if (!batch.empty()) WriteDownLocked(batch, /*drop_host=*/true, /*sync=*/false).IgnoreError();
  }
  for (EntryId id : after_writes) {
    Entry& e = index_.at(id);
    e.busy &= static_cast<uint8_t>(~kBusyDemoting);
    if (e.leases != 0 || e.busy != 0 || e.children[TierSlot(Tier::kHost)] != 0) continue;
    const uint64_t pages = PagesBytes(e.size);
    if (DropHostIfUnwrittenLocked(id)) released += pages;
  }
  if (!after_writes.empty()) changed_.SignalAll();  // their busy flags cleared
  if (!segment.empty()) host_.SetDraining(chosen, false);
  return released;
}

std::vector<EntryId> TierManager::SegmentToEmptyLocked(
    const MemoryTier& mem, const SegmentBlocks& blocks, Tier tier, NamespaceId ns, uint64_t bytes,
    std::span<const EntryId> victims, const VictimFilter& evictable, uint32_t* chosen) {
  // The segments of the victims, the most victim bytes first. When enough of the victims are in
  // `ns`'s own segments, evicting them makes its room, in the order its pool ranks them.
  const absl::flat_hash_set<EntryId> cold(victims.begin(), victims.end());
  absl::flat_hash_map<uint32_t, uint64_t> cold_bytes;
  for (EntryId id : victims) {
    cold_bytes[blocks.SegmentOf(MemOffsetLocked(id, tier))] += PagesBytes(index_.at(id).size);
  }
  std::vector<std::pair<uint64_t, uint32_t>> ranked;  // (victim bytes, segment)
  ranked.reserve(cold_bytes.size());
  uint64_t own = 0;
  for (const auto& [segment, cold_in] : cold_bytes) {
    ranked.emplace_back(cold_in, segment);
    if (mem.SegmentOwner(segment) == ns) own += cold_in;
  }
  if (own >= PagesBytes(bytes)) return {};
  std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  // Of the first few, the one that costs least to empty (below): its blocks and, tail first,
  // their descendants in `tier` wherever they are, at most kMostSegments segments' worth in all.
  // Each check walks a segment's blocks.
  constexpr size_t kSegmentsTried = 8;
  constexpr uint64_t kMostSegments = 4;
  const int slot = TierSlot(tier);
  std::vector<EntryId> best;
  uint64_t best_cost = UINT64_MAX;
  auto consider = [&](uint32_t segment) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::flat_hash_set<EntryId> set;
    std::vector<EntryId> todo;
    uint64_t in_segment = 0;
    bool empties = true;
    for (EntryId id : blocks.Of(segment)) {
      if (!evictable(id)) {
        empties = false;
        break;
      }
      in_segment += PagesBytes(index_.at(id).size);
      set.insert(id);
      todo.push_back(id);
    }
    // Pages its blocks do not account for belong to a reservation or a copy in flight.
    if (!empties || in_segment != mem.SegmentUsedBytes(segment)) return;
    uint64_t set_bytes = in_segment;
    while (!todo.empty() && empties) {
      const EntryId id = todo.back();
      todo.pop_back();
      if (index_.at(id).children[slot] == 0) continue;
      index_.ForEachChild(id, [&](EntryId child) {
        if (!empties || !index_.at(child).In(tier) || !set.insert(child).second) return;
        set_bytes += PagesBytes(index_.at(child).size);
        empties = evictable(child) && set_bytes <= kMostSegments * mem.segment_bytes();
        todo.push_back(child);
      });
    }
    if (!empties) return;
    // What emptying it costs: the bytes it evicts beyond the victims (reads that will miss this
    // tier), plus, for host, the bytes it must write to disk first (the newcomer waits for them).
    uint64_t cost = 0;
    for (EntryId id : set) {
      const Entry& e = index_.at(id);
      if (!cold.contains(id)) cost += PagesBytes(e.size);
      if (tier == Tier::kHost && !e.In(Tier::kDisk)) cost += PagesBytes(e.size);
    }
    if (cost >= best_cost) return;
    // Descendants first: a block goes once every child of it in the set has. Parent links that
    // loop (none are made now, but disk records written by an older version may hold them) leave
    // blocks that never can.
    absl::flat_hash_map<EntryId, uint32_t> waiting;  // children in the set not yet out
    for (EntryId id : set) {
      const EntryId parent = index_.at(id).parent;
      if (parent != kNoEntry && set.contains(parent)) ++waiting[parent];
    }
    std::vector<EntryId> order;
    order.reserve(set.size());
    for (EntryId id : set) {
      if (!waiting.contains(id)) order.push_back(id);
    }
    for (size_t k = 0; k < order.size(); ++k) {
      const EntryId parent = index_.at(order[k]).parent;
      if (parent == kNoEntry || !set.contains(parent)) continue;
      if (--waiting[parent] == 0) order.push_back(parent);
    }
    if (order.size() != set.size()) return;
    best_cost = cost;
    best = std::move(order);
    if (chosen != nullptr) *chosen = segment;
  };
  for (size_t r = 0; r < ranked.size() && r < kSegmentsTried; ++r) consider(ranked[r].second);
  if (!best.empty() || ranked.empty()) return best;
  // None of them qualifies (a leased block in each, say): as many more, the segments that hold
  // the next coldest blocks. One segment of warmer blocks costs far less than the caller's
  // fallback, which evicts the coldest blocks wherever they are until a segment happens to
  // empty.
  std::vector<EntryId> more;
  pools_.Victims(tier, (kSegmentsTried + 1) * mem.segment_bytes(), evictable, &more);
  absl::flat_hash_map<uint32_t, uint64_t> more_bytes;
  for (EntryId id : more) {
    const uint32_t segment = blocks.SegmentOf(MemOffsetLocked(id, tier));
    if (!cold_bytes.contains(segment)) more_bytes[segment] += PagesBytes(index_.at(id).size);
  }
  std::vector<std::pair<uint64_t, uint32_t>> next;  // (victim bytes, segment)
  for (size_t r = kSegmentsTried; r < ranked.size(); ++r) next.push_back(ranked[r]);
  std::vector<std::pair<uint64_t, uint32_t>> others;  // (victim bytes, segment)
  for (const auto& [segment, in] : more_bytes) others.emplace_back(in, segment);
  std::sort(others.begin(), others.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  next.insert(next.end(), others.begin(), others.end());
  for (size_t r = 0; r < next.size() && r < kSegmentsTried; ++r) consider(next[r].second);
  return best;
}

Status TierManager::RenewWithoutLockLocked(MemoryTier& tier) {
  // Taken out of the pools under the lock, so that its namespace cannot take it back meanwhile
  // (its puts held off while it was emptied would); none vacant: one is being renewed already,
  // to be waited for.
  const std::optional<uint32_t> taken = tier.TakeVacant();
  ++io_in_flight_;  // a writer short of room waits for this instead of failing
  mu_.Unlock();
  Status renewed = Status::OK();
  if (taken) {
    renewed = tier.RenewTaken(*taken);
  } else {
    tier.WaitForRenewals();
  }
  mu_.Lock();
  --io_in_flight_;
  changed_.SignalAll();
  return renewed;
}

Result<HostSlot> TierManager::AllocateHostLocked(NamespaceId ns, uint64_t bytes, bool may_wait,
                                                 bool may_renew) {
  Status renewal_failed;  // this call's renewal that failed
  for (;;) {
    Result<HostSlot> slot = host_.TryAllocate(ns, bytes);
    if (slot.ok()) return slot;
    if (slot.status().code() == StatusCode::kUnavailable) {
      // Room needs another namespace's vacant segment renewed (a fresh memfd, ~56 ms for 64 MiB):
      // done without the lock, so that no other request waits for it.
      if (!may_renew) return slot;
      if (renewal_failed.ok()) {
        renewal_failed = RenewWithoutLockLocked(host_);
        continue;
      }
      slot = Status::ResourceExhausted("no fresh memory for a host segment (" +
                                       renewal_failed.ToString() +
                                       "): the room it would have given is not to be had");
    } else if (slot.status().code() != StatusCode::kResourceExhausted) {
      return slot;
    }
    // Other namespaces' free pages do not help this one: free at least a segment's worth. A
    // namespace that holds its quota of segments frees its own. So does one after a segment
    // could not get fresh memory for it (out of descriptors or memory): emptying another would
    // only have its renewal fail the same way, one segment's blocks evicted for each, but its
    // own blocks can still make room in its own segments.
    const uint64_t budget = std::max(PagesBytes(bytes), host_.segment_bytes());
    const bool over_quota = host_.AtSegmentLimit(ns);
    const bool no_new_segment = !renewal_failed.ok();
    const bool own_only = over_quota || no_new_segment;
    // A namespace that may take another segment has one emptied for it, not the tier's coldest
    // blocks evicted, scattered over every segment, until one happens to empty: its blocks moved
    // where their namespace has room, else evicted. (Without a wait, no segment could be renewed
    // for it anyway.)
    uint64_t freed = own_only || !may_wait ? 0 : MoveHostSegmentLocked(ns);
    if (freed == 0 && !own_only) {
      freed = EvictHostSegmentLocked(ns, bytes, /*may_write=*/may_wait);
    }
    if (freed == 0) {
      freed = EvictHostLocked(budget, own_only ? ns : kNoNamespace, /*may_write=*/may_wait);
    }
    if (freed == 0) {
      if (!may_wait) {
        return Status::Unavailable("no host room without writing to disk or waiting for it");
      }
      // Its renewal failed and it holds no segment its own blocks could make room in: the
      // renewal's error (no I/O in flight can help it).
      if (no_new_segment && !over_quota && host_.SegmentsOf(ns) == 0) return slot;
      // Nothing to evict now; if a write-down or read is in flight, its end frees or unblocks
      // a block (e.g. the chain tail the flusher is demoting): wait for it and try again.
      if (io_in_flight_ > 0 && !stopping_) {
        changed_.Wait(&mu_);
        continue;
      }
      if (no_new_segment && !over_quota) return slot;
      if (over_quota) {
        return Status::ResourceExhausted(
            "namespace holds its host quota (" + FormatBytes(PolicyLocked(ns).host_quota_bytes) +
            ", " + std::to_string(host_.SegmentsOf(ns)) +
            " segments): every block of it is leased, being written, or has a leased descendant");
      }
      return Status::ResourceExhausted(
          "host tier full (" + FormatBytes(host_.capacity_bytes()) +
          "): every block is leased, being written, or has a leased descendant");
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Promotion

std::shared_ptr<TierManager::Promotion> TierManager::StartPromotionLocked(EntryId id,
                                                                          bool prefetch) {
  auto it = promotions_.find(id);
  if (it != promotions_.end()) return it->second;
  if (stopping_) {
    // The mover has stopped (or is stopping): nobody would run it, nor clear its busy flag.
    auto p = std::make_shared<Promotion>();
    p->done = true;
    p->status = Status::Aborted("daemon shutting down");
    return p;
  }
  Entry& e = index_.at(id);
  e.busy |= kBusyPromoting;
  if (prefetch) {
    e.flags |= kFlagPrefetched;
    ++prefetches_issued_;
  }
  auto p = std::make_shared<Promotion>();
  promotions_.emplace(id, p);
  mover_.Enqueue(id);
  return p;
}

void TierManager::AbandonPromotionLocked(EntryId id) {
  index_.at(id).busy &= static_cast<uint8_t>(~kBusyPromoting);
  auto it = promotions_.find(id);
  if (it != promotions_.end()) {
    it->second->status = Status::Aborted("daemon shutting down");
    it->second->done = true;
    promotions_.erase(it);
  }
  changed_.SignalAll();
}

void TierManager::ReadAheadLocked(EntryId id) {
  const uint32_t depth = PolicyLocked(index_.at(id).ns).read_ahead->depth();
  EntryId cur = id;
  for (uint32_t d = 0; d < depth; ++d) {
    // Follow the branch used last: the likeliest to be read next.
    EntryId next = kNoEntry;
    index_.ForEachChild(cur, [&](EntryId c) {
      const Entry& ce = index_.at(c);
      if (ce.tiers == 0) return;
      if (next == kNoEntry || ce.last_use_s > index_.at(next).last_use_s) next = c;
    });
    if (next == kNoEntry) return;
    const Entry& ne = index_.at(next);
    if (!ne.In(Tier::kHost) && ne.In(Tier::kDisk) && ne.busy == 0 && !promotions_.contains(next) &&
        PromotableLocked(ne)) {
      StartPromotionLocked(next, /*prefetch=*/true);
      ++read_aheads_;
    }
    cur = next;
  }
}

void TierManager::HandleCorruptLocked(EntryId id, const Status& why) {
  ++checksum_failures_;
  Entry& e = index_.at(id);
  LOG(ERROR) << "dropping block " << e.key.ShortHex() << " of namespace " << e.ns
             << " from disk: " << why.ToString();
  if (e.In(Tier::kDisk) && e.busy == 0) {
    ++disk_counters_.evictions;
    DropDiskCopiesLocked({id});
    mover_.WakeFlusher();  // its round deletes the record
  }
}

void TierManager::PromoteOne(EntryId id) {
  Status st;
  {
    Entry& e = index_.at(id);
    if (!e.In(Tier::kHost) && e.In(Tier::kDisk)) {
      const DiskCopy copy = DiskCopyOf(e);
      Result<HostSlot> slot = AllocateHostLocked(copy.ns, copy.size);
      if (!slot.ok()) {
        st = slot.status();
      } else {
        ++io_in_flight_;
        mu_.Unlock();
        uint64_t checksum = 0;
        st = ReadUp(disk_, copy, host_.Data(*slot), &checksum);
        mu_.Lock();
        --io_in_flight_;
        Entry& e2 = index_.at(id);
        if (st.ok()) {
          // Decoded from an encoded copy: approximate bytes, with their own checksum.
          e2.checksum = checksum;
          index_.EnsureMem(id).lossy_encoding = copy.encoding;
          AddHostCopyLocked(id, slot->offset);
          ++host_counters_.promotions;
        } else {
          host_.Free(*slot);
        }
      }
    }
  }
  index_.at(id).busy &= static_cast<uint8_t>(~kBusyPromoting);
  if (st.code() == StatusCode::kCorruption || st.code() == StatusCode::kNotFound) {
    HandleCorruptLocked(id, st);
  } else if (!st.ok()) {
    LOG(WARNING) << "promotion of " << index_.at(id).key.ShortHex() << ": " << st.ToString();
  }
  auto it = promotions_.find(id);
  if (it != promotions_.end()) {
    it->second->status = st;
    it->second->done = true;
    promotions_.erase(it);
  }
  MaybeEraseLocked(id);
  changed_.SignalAll();
}

void TierManager::FlushRoundLocked() {
  DeleteDroppedLocked();  // records an eviction or a failed check dropped since the last round
  RefreshDiskSpaceLocked();
  ExpireReservationsLocked();
  ExpireLeasesLocked();
  // Write-after-hits policy: copy hot host-only blocks down without dropping them.
  if (!write_queue_.empty()) {
    std::vector<EntryId> batch;
    for (const NamespacedKey& k : write_queue_) {
      const EntryId id = FindCachedLocked(k.ns, k.key);
      if (id == kNoEntry) continue;
      Entry& e = index_.at(id);
      if (e.In(Tier::kDisk) || !e.In(Tier::kHost) || e.busy != 0) continue;
      e.busy |= kBusyDemoting;
      batch.push_back(id);
    }
    write_queue_.clear();
    if (!batch.empty()) WriteDownLocked(batch, /*drop_host=*/false, false).IgnoreError();
  }
  while (!stopping_ && HostAboveHighWatermarkLocked()) {
    const double low = options_.host_low_watermark * static_cast<double>(host_.capacity_bytes());
    const double allocated = static_cast<double>(host_.allocated_bytes());
    if (allocated <= low) break;
    if (EvictHostLocked(static_cast<uint64_t>(allocated - low)) == 0) break;
  }
}

}  // namespace kvpool::tiers
