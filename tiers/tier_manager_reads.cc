// TierManager, part of tiers/tier_manager.h: reads (lookup, prefetch, acquire and the leases
// they hand out).

#include "tiers/tier_manager.h"

#include <glog/logging.h>

#include <algorithm>

#include "common/checksum.h"
#include "common/units.h"

namespace kvpool::tiers {

// ---------------------------------------------------------------------------------------------
// Reads

LookupResult TierManager::Lookup(NamespaceId ns, std::span<const BlockKey> chain, bool prefetch) {
  // Keys are hashed before the lock and found under a shared hold of it, so lookups on other
  // threads find theirs alongside; only marking the hits used (and starting their promotions)
  // takes mu_ alone, and that touches entries the first pass left in the cache. (The whole
  // chain is hashed, ~4 ns a key outside the lock, even where it misses early.)
  const std::vector<HashedKey> keys = HashKeys(ns, chain);
  std::vector<EntryId> ids;
  LookupResult result;
  uint64_t erasures_seen = 0;
  {
    absl::ReaderMutexLock lock(&mu_);
    const BlockIndex& index = index_;  // only reads under a shared hold
    erasures_seen = index.erasures();
    ids = FindEachLocked(keys, /*prefix=*/true);
    result.tiers.reserve(ids.size());
    for (EntryId id : ids) result.tiers.push_back(FastestTier(index.at(id)));
  }
  result.hit_blocks = static_cast<uint32_t>(ids.size());
  if (ids.empty()) return result;
  absl::MutexLock lock(&mu_);
  const uint32_t now = NowSeconds();
  // Where no entry was erased between the two holds, each id still names its key.
  const bool ids_valid = index_.erasures() == erasures_seen;
  for (size_t i = 0; i < ids.size(); ++i) {
    Entry& e = index_.at(ids[i]);
    // A block that went between the two holds (its id perhaps reused) is answered as found,
    // but not marked: only what is still cached under its key is. (An erased entry has no
    // copies, so `tiers` covers it.)
    if (e.tiers == 0 || (!ids_valid && (e.ns != ns || e.key != chain[i]))) continue;
    index_.Touch(ids[i], now);
    if (prefetch && CanStartPromotionLocked(ids[i], e)) {
      StartPromotionLocked(ids[i], /*prefetch=*/true);
      ++result.promotions_started;
    }
  }
  return result;
}

std::vector<EntryId> TierManager::FindEachLocked(std::span<const HashedKey> keys,
                                                 bool prefix) const {
  std::vector<EntryId> ids;
  ids.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    // A large index lives in DRAM: ask for the hash slots of a key ahead (tier_manager.h).
    if (i + kIndexPrefetchAhead < keys.size()) index_.Prefetch(keys[i + kIndexPrefetchAhead]);
    const EntryId id = FindCachedLocked(keys[i]);
    if (id == kNoEntry && prefix) break;
    ids.push_back(id);
  }
  return ids;
}

std::vector<HashedKey> TierManager::HashKeys(NamespaceId ns, std::span<const BlockKey> keys) const {
  std::vector<HashedKey> out;
  out.reserve(keys.size());
  for (const BlockKey& key : keys) out.push_back(hasher_.Hashed(ns, key));
  return out;
}

uint32_t TierManager::Prefetch(NamespaceId ns, std::span<const BlockKey> keys) {
  absl::MutexLock lock(&mu_);
  uint32_t started = 0;
  for (const BlockKey& key : keys) {
    const EntryId id = FindCachedLocked(ns, key);
    if (id == kNoEntry) continue;
    Entry& e = index_.at(id);
    if (!CanStartPromotionLocked(id, e)) continue;
    StartPromotionLocked(id, /*prefetch=*/true);
    ++started;
  }
  return started;
}

std::vector<BlockRead> TierManager::Acquire(NamespaceId ns, std::span<const BlockKey> keys,
                                            uint64_t owner, std::chrono::milliseconds ttl,
                                            bool keep_encoding, GpuReach gpu) {
  const std::vector<HashedKey> hashed = HashKeys(ns, keys);  // before the lock
  absl::MutexLock lock(&mu_);
  return AcquireLocked(ns, keys, hashed, {}, owner, ttl, keep_encoding, gpu);
}

std::optional<std::vector<BlockRead>> TierManager::TryAcquireInHost(NamespaceId ns,
                                                                    std::span<const BlockKey> keys,
                                                                    uint64_t owner,
                                                                    std::chrono::milliseconds ttl,
                                                                    GpuReach gpu) {
  const std::vector<HashedKey> hashed = HashKeys(ns, keys);  // before the lock
  absl::MutexLock lock(&mu_);
  const std::vector<EntryId> found = FindEachLocked(hashed, /*prefix=*/false);
  for (EntryId id : found) {
    // A miss answers at once.
    if (id != kNoEntry && !index_.at(id).LeasableInHost()) return std::nullopt;
  }
  // Under the same hold of mu_ (the entries found stay what they are): every cached block is
  // leased in host, none waited for.
  return AcquireLocked(ns, keys, hashed, found, owner, ttl, /*keep_encoding=*/false, gpu);
}

std::vector<BlockRead> TierManager::AcquireLocked(NamespaceId ns, std::span<const BlockKey> keys,
                                                  std::span<const HashedKey> hashed,
                                                  std::span<const EntryId> found, uint64_t owner,
                                                  std::chrono::milliseconds ttl, bool keep_encoding,
                                                  GpuReach gpu) {
  std::vector<BlockRead> out(keys.size());
  const uint32_t now = NowSeconds();
  const auto deadline =
      ttl.count() > 0 ? clock_.Now() + ttl : std::chrono::steady_clock::time_point::max();

  auto lease = [&](size_t i, EntryId id, Tier from) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Entry& e = index_.at(id);
    ++e.leases;
    const uint64_t lease_id = leases_.Add(id, owner, deadline);
    if (e.hits < kMaxHits) ++e.hits;
    index_.Touch(id, now);
    const MemCopies& mem = index_.Mem(id);  // leased in host
    BlockRead& r = out[i];
    r.from = from;
    r.lease_id = lease_id;
    r.arena_offset = mem.host_offset;
    r.data = host_.Data(HostSlot{mem.host_offset, e.size});
    r.size = e.size;
    r.checksum = e.checksum;
    r.lossy_encoding = mem.lossy_encoding;
    if (e.flags & kFlagPrefetched) {
      e.flags &= static_cast<uint8_t>(~kFlagPrefetched);
      ++prefetches_useful_;
    }
    if (from == Tier::kHost) {
      ++host_counters_.hits;
    } else {
      ++disk_counters_.hits;
    }
    const NamespacePolicy& policy = PolicyLocked(ns);
    if (!e.In(Tier::kDisk) && policy.write->WriteAfterHits(e.hits) &&
        policy.admission->Admit(e.hits)) {
      write_queue_.push_back(NamespacedKey{ns, e.key});
      mover_.WakeFlusher();
    }
    if (policy.read_ahead->depth() > 0) ReadAheadLocked(id);
  };

  // A reader on a GPU also leases the block's copy in a gpu tier it reaches, if it has one.
  auto lease_gpu_too = [&](size_t i, EntryId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const Entry& e = index_.at(id);
    if (!e.In(Tier::kGpu) || !gpu.Reaches(index_.Mem(id).gpu_device)) return;
    auto dsum = gpu_checksums_.find(id);
    if (dsum == gpu_checksums_.end()) return;
    BlockRead& r = out[i];
    r.from = Tier::kGpu;
    r.gpu_device = index_.Mem(id).gpu_device;
    if (const int g = GpuIndexOf(r.gpu_device); g >= 0) {
      ++gpu_hits_[g].first;
      if (r.gpu_device != gpu.device) ++gpu_hits_[g].second;
    }
    r.gpu_offset = GpuSlotLocked(id).offset;
    r.device_checksum = dsum->second;
    --host_counters_.hits;  // lease() counted a host hit
    ++gpu_counters_.hits;
  };

  // Blocks not in host wait for a promotion (theirs or another reader's), then are leased.
  // A block put straight into gpu waits the same way for its host copy (kBusyFromGpu), and is
  // then leased as found in host (and gpu).
  struct Wait {
    size_t i;
    std::shared_ptr<Promotion> promotion;  // null: another get reads it straight from disk
    int rounds;
    Tier from = Tier::kDisk;  // what the lease reports once it is in host
  };
  std::vector<Wait> waits;
  constexpr int kMaxPromotionRounds = 3;
  auto wait_for = [&](size_t i, EntryId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const Entry& e = index_.at(id);
    const Tier from = (e.busy & kBusyFromGpu) ? Tier::kHost : Tier::kDisk;
    if (!PromotableLocked(e)) {
      waits.push_back({i, nullptr, kMaxPromotionRounds});  // straight to a direct read
    } else if (e.busy & kBusyReading) {
      waits.push_back({i, nullptr, 0});
    } else if (auto it = promotions_.find(id); it != promotions_.end()) {
      waits.push_back({i, it->second, 1, from});
    } else {
      waits.push_back({i, StartPromotionLocked(id, /*prefetch=*/false), 1});
    }
  };
  // Disk-only blocks stored encoded, for a reader that keeps encodings: read as stored below.
  std::vector<size_t> as_stored;
  for (size_t i = 0; i < keys.size(); ++i) {
    EntryId id = kNoEntry;
    if (!found.empty()) {
      id = found[i];
    } else {
      if (i + kIndexPrefetchAhead < keys.size()) index_.Prefetch(hashed[i + kIndexPrefetchAhead]);
      id = FindCachedLocked(hashed[i]);
    }
    if (id == kNoEntry) {
      out[i].status = Status::NotFound("not cached");
      continue;
    }
    const Entry& e = index_.at(id);
    if (e.LeasableInHost()) {
      lease(i, id, Tier::kHost);
      lease_gpu_too(i, id);
    } else if (keep_encoding && !e.In(Tier::kHost) && e.disk_encoding != 0 && e.busy == 0) {
      as_stored.push_back(i);
    } else {
      wait_for(i, id);
    }
  }

  uint64_t direct_bytes = 0;  // read straight from disk by this call
  for (size_t i : as_stored) {
    const EntryId id = FindCachedLocked(hashed[i]);
    if (id == kNoEntry) {
      out[i].status = Status::NotFound("not cached");
      continue;
    }
    Entry& e = index_.at(id);
    if (e.LeasableInHost()) {  // promoted meanwhile
      lease(i, id, Tier::kHost);
      continue;
    }
    if (e.busy != 0 || e.disk_encoding == 0 || stopping_) {
      wait_for(i, id);
      continue;
    }
    const DiskCopy copy = DiskCopyOf(e);
    const uint64_t stored = e.disk_bytes();
    if (direct_bytes + stored > options_.direct_read_budget_bytes && direct_bytes > 0) {
      out[i].status = Status::ResourceExhausted("deferred: direct-read budget of this request");
      continue;
    }
    direct_bytes += stored;
    e.busy |= kBusyReading;
    ++io_in_flight_;
    mu_.Unlock();
    std::unique_ptr<uint8_t[]> body;
    Result<DiskBlockMeta> meta = ReadEncoded(disk_, copy, &body);
    mu_.Lock();
    --io_in_flight_;
    index_.at(id).busy &= static_cast<uint8_t>(~kBusyReading);
    changed_.SignalAll();
    if (!meta.ok()) {
      if (meta.status().code() == StatusCode::kCorruption || meta.status().IsNotFound()) {
        HandleCorruptLocked(id, meta.status());
        out[i].status = Status::NotFound("failed verification; dropped");
      } else {
        out[i].status = meta.status();
      }
      MaybeEraseLocked(id);
      continue;
    }
    ++disk_counters_.hits;
    Entry& after = index_.at(id);
    if (after.hits < kMaxHits) ++after.hits;
    index_.Touch(id, now);
    BlockRead& r = out[i];
    r.from = Tier::kDisk;
    r.size = meta->stored_size;
    r.checksum = meta->stored_checksum;
    r.lossy_encoding = copy.encoding;
    r.encoding = copy.encoding;
    r.layout = meta->layout;
    r.owned = std::move(body);
    r.data = r.owned.get();
  }

  auto pending = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const Wait& w : waits) {
      if (w.promotion && !w.promotion->done) return true;
      if (!w.promotion) {
        const EntryId id = FindCachedLocked(hashed[w.i]);
        if (id != kNoEntry && (index_.at(id).busy & kBusyReading)) return true;
      }
    }
    return false;
  };
  // A block demoted again before this get leased it is promoted again; one that cannot be
  // placed in host (every host block leased) is read straight from disk.
  while (!waits.empty()) {
    while (pending() && !stopping_) changed_.Wait(&mu_);
    std::vector<Wait> again;
    for (const Wait& w : waits) {
      const size_t i = w.i;
      const EntryId id = FindCachedLocked(hashed[i]);
      if (id == kNoEntry) {
        const Status& ps = w.promotion ? w.promotion->status : Status::OK();
        out[i].status = (!ps.ok() && !ps.IsNotFound() && ps.code() != StatusCode::kCorruption)
                            ? ps
                            : Status::NotFound("not cached");
        continue;
      }
      Entry& e = index_.at(id);
      if (e.LeasableInHost()) {
        lease(i, id, w.from);
        if (w.from == Tier::kHost) lease_gpu_too(i, id);
        continue;
      }
      if (stopping_) {
        out[i].status = Status::Unavailable("daemon shutting down");
        continue;
      }
      if (e.busy & kBusyPromoting) {  // another reader's promotion: wait for it
        auto it = promotions_.find(id);
        again.push_back({i, it != promotions_.end() ? it->second : nullptr, w.rounds, w.from});
        continue;
      }
      if (e.busy & kBusyReading) {
        again.push_back({i, nullptr, w.rounds});
        continue;
      }
      const bool promotion_failed = w.promotion && w.promotion->done && !w.promotion->status.ok();
      if (!promotion_failed && w.rounds < kMaxPromotionRounds) {
        again.push_back({i, StartPromotionLocked(id, /*prefetch=*/false), w.rounds + 1});
        continue;
      }
      // Read it directly into a buffer the reader owns, within a memory budget per call: the
      // rest are deferred (the client asks for them again) rather than buffered all at once.
      if (direct_bytes + e.size > options_.direct_read_budget_bytes && direct_bytes > 0) {
        out[i].status = Status::ResourceExhausted("deferred: direct-read budget of this request");
        continue;
      }
      direct_bytes += e.size;
      const DiskCopy copy = DiskCopyOf(e);
      e.busy |= kBusyReading;
      auto buf = std::unique_ptr<uint8_t[]>(new uint8_t[copy.size]);
      ++io_in_flight_;
      mu_.Unlock();
      uint64_t checksum = 0;
      Status st = ReadUp(disk_, copy, buf.get(), &checksum);
      mu_.Lock();
      --io_in_flight_;
      index_.at(id).busy &= static_cast<uint8_t>(~kBusyReading);
      changed_.SignalAll();
      if (!st.ok()) {
        if (st.code() == StatusCode::kCorruption || st.IsNotFound()) {
          HandleCorruptLocked(id, st);
          out[i].status = Status::NotFound("failed verification; dropped");
        } else {
          out[i].status = st;
        }
        MaybeEraseLocked(id);
        continue;
      }
      ++disk_counters_.hits;
      BlockRead& r = out[i];
      r.from = Tier::kDisk;
      r.size = copy.size;
      r.checksum = checksum;
      r.lossy_encoding = copy.encoding;
      r.owned = std::move(buf);
      r.data = r.owned.get();
    }
    waits = std::move(again);
  }
  return out;
}

void TierManager::EndLeaseLocked(EntryId entry) {
  Entry& e = index_.at(entry);
  CHECK_GT(e.leases, 0u);
  --e.leases;
}

void TierManager::Release(BlockRead& read) {
  if (read.lease_id == 0) return;
  absl::MutexLock lock(&mu_);
  if (std::optional<EntryId> e = leases_.End(read.lease_id)) EndLeaseLocked(*e);
  read.lease_id = 0;
  read.data = nullptr;
}

void TierManager::ReleaseLeases(uint64_t owner, std::span<const uint64_t> lease_ids) {
  absl::MutexLock lock(&mu_);
  for (uint64_t id : lease_ids) {
    if (std::optional<EntryId> e = leases_.EndIfOwned(id, owner)) EndLeaseLocked(*e);
  }
}

void TierManager::ReleaseOwner(uint64_t owner) {
  absl::MutexLock lock(&mu_);
  for (EntryId e : leases_.EndOwner(owner)) EndLeaseLocked(e);
}

void TierManager::ExpireLeasesLocked() {
  const std::vector<EntryId> expired = leases_.EndExpired(clock_.Now());
  if (!expired.empty()) {
    LOG(WARNING) << expired.size() << " leases expired unreleased (a client died or forgot them)";
  }
  for (EntryId e : expired) EndLeaseLocked(e);
}

}  // namespace kvpool::tiers
