#include "tiers/tier_manager.h"

#include <glog/logging.h>

#include <algorithm>

#include "common/checksum.h"
#include "common/clock.h"
#include "common/threads.h"
#include "common/units.h"
#include "tiers/demotion_encoding.h"

namespace kvpool::tiers {

namespace {

// Coarse allocation size of a block in the host arena (whole pages).
uint64_t PagesBytes(uint64_t size) {
  return (size + HostTier::kPageBytes - 1) / HostTier::kPageBytes * HostTier::kPageBytes;
}

}  // namespace

TierManager::DiskCopy TierManager::DiskCopyOf(const Entry& e) {
  return DiskCopy{e.ns, e.key, e.size, e.checksum, e.disk_encoding};
}

TierManager::TierManager(const TierManagerOptions& options, TierStack stack)
    : options_(options),
      stack_(std::move(stack)),
      host_(stack_.host()),
      disk_(stack_.disk()),
      clock_(options.clock != nullptr ? *options.clock : RealClock()),
      start_(clock_.Now()),
      default_policy_(DefaultNamespacePolicy()) {}

TierManager::~TierManager() { Shutdown(); }

uint32_t TierManager::NowSeconds() const {
  return static_cast<uint32_t>(
      std::chrono::duration_cast<std::chrono::seconds>(clock_.Now() - start_).count());
}

Status TierManager::SetNamespacePolicy(NamespaceId ns, NamespacePolicy policy) {
  absl::MutexLock lock(&mu_);
  KVPOOL_RETURN_IF_ERROR(pools_.SetOrder(ns, policy.eviction));
  policies_[ns] = std::move(policy);
  return Status::OK();
}

void TierManager::ClearNamespacePolicy(NamespaceId ns) {
  absl::MutexLock lock(&mu_);
  pools_.SetOrder(ns, "").IgnoreError();  // back to the default pool: cannot fail
  policies_.erase(ns);
}

Status TierManager::SetDefaultPolicy(NamespacePolicy policy) {
  absl::MutexLock lock(&mu_);
  KVPOOL_RETURN_IF_ERROR(pools_.SetDefaultOrder(policy.eviction.empty() ? "lru" : policy.eviction));
  default_policy_ = std::move(policy);
  return Status::OK();
}

NamespacePolicy TierManager::PolicyOf(NamespaceId ns) const {
  absl::MutexLock lock(&mu_);
  NamespacePolicy p = PolicyLocked(ns);
  p.eviction = pools_.OrderName(ns);
  return p;
}

const NamespacePolicy& TierManager::PolicyLocked(NamespaceId ns) const {
  auto it = policies_.find(ns);
  return it == policies_.end() ? default_policy_ : it->second;
}

EntryId TierManager::FindCachedLocked(NamespaceId ns, const BlockKey& key) const {
  EntryId id = index_.Find(ns, key);
  if (id == kNoEntry || index_.at(id).tiers == 0) return kNoEntry;
  return id;
}

void TierManager::MaybeEraseLocked(EntryId id) {
  while (id != kNoEntry && index_.CanErase(id)) {
    const EntryId parent = index_.at(id).parent;
    index_.Erase(id);
    id = parent;
  }
}

// ---------------------------------------------------------------------------------------------
// Recovery and lifecycle

Status TierManager::Recover() {
  struct Loaded {
    NamespaceId ns;
    BlockKey key;
    DiskBlockMeta meta;
  };
  std::vector<Loaded> loaded;
  std::vector<std::string> bad;
  KVPOOL_RETURN_IF_ERROR(disk_.ForEachMeta(
      [&](NamespaceId ns, const BlockKey& key, const DiskBlockMeta& meta) {
        loaded.push_back({ns, key, meta});
      },
      [&](std::string_view raw) { bad.emplace_back(raw); }));
  for (const std::string& raw : bad) {
    LOG(ERROR) << "dropping an undecodable block record on disk (" << raw.size() << "-byte key)";
    disk_.DeleteRaw(raw).IgnoreError();
  }
  absl::MutexLock lock(&mu_);
  std::vector<EntryId> ids;
  ids.reserve(loaded.size());
  std::vector<std::pair<NamespaceId, BlockKey>> invalid;
  for (const Loaded& l : loaded) {
    if (l.meta.size == 0 || l.meta.size > max_block_bytes()) {
      invalid.emplace_back(l.ns, l.key);
      ids.push_back(kNoEntry);
      continue;
    }
    const EntryId id = index_.Insert(l.ns, l.key);
    Entry& e = index_.at(id);
    e.size = static_cast<uint32_t>(l.meta.size);
    e.checksum = l.meta.checksum;
    e.disk_encoding = l.meta.encoding;
    e.disk_size = l.meta.encoding != 0 ? static_cast<uint32_t>(l.meta.stored_size) : 0;
    ids.push_back(id);
  }
  for (size_t i = 0; i < loaded.size(); ++i) {
    if (ids[i] == kNoEntry || loaded[i].meta.parent.IsZero()) continue;
    const EntryId parent = index_.Find(loaded[i].ns, loaded[i].meta.parent);
    if (parent != kNoEntry && parent != ids[i]) index_.SetParent(ids[i], parent);
  }
  for (EntryId id : ids) {
    if (id == kNoEntry) continue;
    index_.AddCopy(id, Tier::kDisk);
    disk_used_ += index_.at(id).disk_bytes();
    ++disk_blocks_;
  }
  if (!invalid.empty()) {
    LOG(ERROR) << "dropping " << invalid.size() << " disk blocks with an impossible size";
    disk_.Delete(invalid).IgnoreError();
  }
  LOG(INFO) << "recovered " << disk_blocks_ << " disk blocks (" << FormatBytes(disk_used_)
            << ") from RocksDB meta records without reading their bodies";
  return Status::OK();
}

void TierManager::Start() {
  {
    absl::MutexLock lock(&mu_);
    // Capacity may have shrunk since the last run; sessions are pinned by now.
    if (disk_used_ > options_.disk_capacity_bytes) {
      Status st = ReserveDiskLocked(0);
      if (!st.ok()) LOG(WARNING) << "disk tier over capacity after recovery: " << st.ToString();
    }
  }
  started_ = true;
  threads_.push_back(StartThread(ThreadRole::kTierFlusher, 0, [this] { FlusherLoop(); }));
  for (int i = 0; i < std::max(1, options_.promotion_threads); ++i) {
    threads_.push_back(StartThread(ThreadRole::kPrefetcher, i, [this] { PrefetcherLoop(); }));
  }
}

void TierManager::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    changed_.SignalAll();
    work_.SignalAll();
    flusher_.SignalAll();  // else the flusher notices only at the end of its 200 ms nap
  }
  for (auto& t : threads_) t.join();
  threads_.clear();
  absl::MutexLock lock(&mu_);
  // Promotions nobody will run: wake their waiters with an error.
  for (EntryId id : promotion_queue_) {
    index_.at(id).busy &= static_cast<uint8_t>(~kBusyPromoting);
    auto it = promotions_.find(id);
    if (it != promotions_.end()) {
      it->second->status = Status::Aborted("daemon shutting down");
      it->second->done = true;
      promotions_.erase(it);
    }
  }
  promotion_queue_.clear();
  for (uint64_t rid : reservations_.All()) FreeReservationLocked(rid);
  changed_.SignalAll();
  if (!options_.flush_on_shutdown || !started_) return;
  // Write down every host-only block so a restart serves it again.
  std::vector<EntryId> batch;
  uint64_t batch_bytes = 0;
  uint64_t written = 0;
  std::vector<EntryId> host_only;
  index_.ForEach(kNoNamespace, [&](EntryId id) {
    const Entry& e = index_.at(id);
    if (e.In(Tier::kHost) && !e.In(Tier::kDisk) && e.busy == 0 &&
        PolicyLocked(e.ns).admission->Admit(e.hits)) {
      host_only.push_back(id);
    }
  });
  for (size_t i = 0; i < host_only.size(); ++i) {
    Entry& e = index_.at(host_only[i]);
    e.busy |= kBusyDemoting;
    batch.push_back(host_only[i]);
    batch_bytes += e.size;
    if (batch_bytes >= options_.demotion_batch_bytes || i + 1 == host_only.size()) {
      Status st = WriteDownLocked(batch, /*drop_host=*/false, /*sync=*/false);
      if (!st.ok()) {
        LOG(ERROR) << "flush at shutdown: " << st.ToString();
        // Unmark what remains and stop: the disk refuses.
        for (size_t j = i + 1; j < host_only.size(); ++j) {
          index_.at(host_only[j]).busy &= static_cast<uint8_t>(~kBusyDemoting);
        }
        break;
      }
      written += batch.size();
      batch.clear();
      batch_bytes = 0;
    }
  }
  LOG(INFO) << "flushed " << written << " host-only blocks to disk at shutdown";
}

// ---------------------------------------------------------------------------------------------
// Host and disk space

bool TierManager::HostAboveHighWatermarkLocked() const {
  return static_cast<double>(host_.allocated_bytes()) >
         options_.host_high_watermark * static_cast<double>(host_.capacity_bytes());
}

void TierManager::DropHostCopyLocked(EntryId id) {
  Entry& e = index_.at(id);
  const HostSlot slot{e.host_offset, e.size};
  index_.RemoveCopy(id, Tier::kHost);
  e.lossy_encoding = 0;
  host_.Free(slot);
  --host_blocks_;
  MaybeEraseLocked(id);
}

void TierManager::DropDiskCopiesLocked(const std::vector<EntryId>& ids) {
  if (ids.empty()) return;
  std::vector<std::pair<NamespaceId, BlockKey>> keys;
  keys.reserve(ids.size());
  for (EntryId id : ids) keys.emplace_back(index_.at(id).ns, index_.at(id).key);
  Status st = disk_.Delete(keys);
  if (!st.ok()) {
    // The index forgets them either way; a record left behind is valid data and is served
    // again (verified) after a restart.
    LOG(ERROR) << "deleting " << ids.size() << " blocks from disk: " << st.ToString();
  }
  for (EntryId id : ids) {
    Entry& e = index_.at(id);
    index_.RemoveCopy(id, Tier::kDisk);
    disk_used_ -= e.disk_bytes();
    e.disk_encoding = 0;
    e.disk_size = 0;
    --disk_blocks_;
    MaybeEraseLocked(id);
  }
}

Status TierManager::ReserveDiskLocked(uint64_t bytes) {
  if (bytes > options_.disk_capacity_bytes) {
    return Status::ResourceExhausted(FormatBytes(bytes) + " exceeds the disk tier capacity of " +
                                     FormatBytes(options_.disk_capacity_bytes));
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
  return Status::OK();
}

Status TierManager::WriteDownLocked(const std::vector<EntryId>& ids, bool drop_host, bool sync) {
  // What each block becomes on disk: its bytes as put, or encoded by its namespace's encoding.
  std::vector<std::shared_ptr<const DemotionEncoding>> encodings;
  encodings.reserve(ids.size());
  uint64_t total = 0;
  for (EntryId id : ids) {
    const Entry& e = index_.at(id);
    std::shared_ptr<const DemotionEncoding> enc = PolicyLocked(e.ns).encoding;
    if (enc && !enc->Applies(e.size)) enc = nullptr;
    total += enc ? enc->encoded_bytes() : e.size;
    encodings.push_back(std::move(enc));
  }
  Status st = ReserveDiskLocked(total);
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
      w.data = host_.Data(HostSlot{e.host_offset, e.size});
      writes.push_back(w);
    }
    ++io_in_flight_;
    mu_.Unlock();
    // The entries are kBusyDemoting: nobody frees their host copies meanwhile.
    std::vector<std::unique_ptr<uint8_t[]>> encoded(ids.size());
    for (size_t i = 0; i < writes.size() && st.ok(); ++i) {
      const DemotionEncoding* enc = encodings[i].get();
      if (enc == nullptr) continue;
      encoded[i].reset(new uint8_t[enc->encoded_bytes()]);
      st = enc->Encode(writes[i].data, encoded[i].get());
      DiskBlockMeta& m = writes[i].meta;
      m.encoding = static_cast<uint8_t>(enc->encoding());
      m.stored_size = enc->encoded_bytes();
      m.stored_checksum = BlockChecksum(encoded[i].get(), m.stored_size);
      m.layout = enc->layout();
      writes[i].data = encoded[i].get();
    }
    if (st.ok()) st = disk_.Write(writes, sync);
    mu_.Lock();
    --io_in_flight_;
    if (!st.ok()) {
      disk_used_ -= total;
      ++disk_write_errors_;
      LOG(ERROR) << "writing " << ids.size() << " blocks (" << FormatBytes(total)
                 << ") to disk: " << st.ToString();
    }
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    const EntryId id = ids[i];
    Entry& e = index_.at(id);
    e.busy &= static_cast<uint8_t>(~kBusyDemoting);
    if (st.ok()) {
      e.disk_encoding = writes[i].meta.encoding;
      e.disk_size = e.disk_encoding != 0 ? static_cast<uint32_t>(writes[i].meta.stored_size) : 0;
      if (e.disk_encoding != 0) ++encoded_writes_;
      index_.AddCopy(id, Tier::kDisk);
      ++disk_blocks_;
    }
    if (drop_host && e.leases == 0 && e.In(Tier::kHost)) {
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
  return st;
}

Status TierManager::ReadDiskCopy(const DiskCopy& copy, uint8_t* dst, uint64_t* checksum) const {
  if (copy.encoding == 0) {
    KVPOOL_RETURN_IF_ERROR(
        disk_.Read(copy.ns, copy.key, DiskBlockMeta{copy.size, copy.checksum, {}}, dst));
    *checksum = copy.checksum;
    return Status::OK();
  }
  // Encoded: the meta record says how; the body is checked against it, then decoded.
  KVPOOL_ASSIGN_OR_RETURN(DiskBlockMeta meta, disk_.ReadMeta(copy.ns, copy.key));
  if (meta.encoding != copy.encoding || meta.size != copy.size) {
    return Status::Corruption("block " + copy.key.ShortHex() +
                              ": its meta record on disk differs from the index");
  }
  const DemotionEncoding enc(meta.layout);
  if (enc.encoded_bytes() != meta.stored_size || enc.raw_bytes() != meta.size) {
    return Status::Corruption("block " + copy.key.ShortHex() +
                              ": encoded sizes on disk do not match its layout");
  }
  std::unique_ptr<uint8_t[]> body(new uint8_t[meta.stored_size]);
  KVPOOL_RETURN_IF_ERROR(disk_.Read(copy.ns, copy.key, meta, body.get()));
  KVPOOL_RETURN_IF_ERROR(
      enc.Decode(body.get(), dst).WithContext("decoding " + copy.key.ShortHex()));
  *checksum = BlockChecksum(dst, meta.size);
  return Status::OK();
}

uint64_t TierManager::EvictHostLocked(uint64_t budget) {
  uint64_t released = 0;
  uint64_t demote_bytes = 0;
  std::vector<EntryId> to_demote;
  std::vector<EntryId> victims;
  pools_.Victims(
      Tier::kHost, budget,
      [&](EntryId id) {
        const Entry& e = index_.at(id);
        return e.leases == 0 && e.busy == 0;
      },
      &victims);
  for (EntryId id : victims) {
    if (released + demote_bytes >= budget || demote_bytes >= options_.demotion_batch_bytes) break;
    Entry& e = index_.at(id);
    if (e.In(Tier::kDisk)) {
      released += PagesBytes(e.size);
      ++host_counters_.evictions;
      DropHostCopyLocked(id);
    } else if (!PolicyLocked(e.ns).admission->Admit(e.hits)) {
      // The namespace's disk does not take it: it leaves the cache.
      released += PagesBytes(e.size);
      ++host_counters_.evictions;
      ++blocks_not_admitted_;
      DropHostCopyLocked(id);
    } else {
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

Result<HostSlot> TierManager::AllocateHostLocked(NamespaceId ns, uint64_t bytes) {
  for (;;) {
    Result<HostSlot> slot = host_.Allocate(ns, bytes);
    if (slot.ok() || slot.status().code() != StatusCode::kResourceExhausted) return slot;
    // Other namespaces' free pages do not help this one: free at least a segment's worth.
    const uint64_t budget = std::max(PagesBytes(bytes), host_.segment_bytes());
    if (EvictHostLocked(budget) == 0) {
      // Nothing to evict now; if a write-down or read is in flight, its end frees or unblocks
      // a block (e.g. the chain tail the flusher is demoting): wait for it and try again.
      if (io_in_flight_ > 0 && !stopping_) {
        changed_.Wait(&mu_);
        continue;
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
  Entry& e = index_.at(id);
  e.busy |= kBusyPromoting;
  if (prefetch) {
    e.flags |= kFlagPrefetched;
    ++prefetches_issued_;
  }
  auto p = std::make_shared<Promotion>();
  promotions_.emplace(id, p);
  promotion_queue_.push_back(id);
  work_.Signal();
  return p;
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
    if (!ne.In(Tier::kHost) && ne.In(Tier::kDisk) && ne.busy == 0 && !promotions_.contains(next)) {
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
        st = ReadDiskCopy(copy, host_.Data(*slot), &checksum);
        mu_.Lock();
        --io_in_flight_;
        Entry& e2 = index_.at(id);
        if (st.ok()) {
          // Decoded from an encoded copy: approximate bytes, with their own checksum.
          e2.checksum = checksum;
          e2.lossy_encoding = copy.encoding;
          e2.host_offset = slot->offset;
          index_.AddCopy(id, Tier::kHost);
          ++host_blocks_;
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

void TierManager::PrefetcherLoop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    if (promotion_queue_.empty()) {
      work_.Wait(&mu_);
      continue;
    }
    const EntryId id = promotion_queue_.front();
    promotion_queue_.pop_front();
    PromoteOne(id);
  }
}

void TierManager::FlusherLoop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    clock_.WaitFor(flusher_, mu_, std::chrono::milliseconds(200));
    if (stopping_) break;
    ++flusher_rounds_;
    changed_.SignalAll();  // WaitFlusherRoundForTest
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
}

// ---------------------------------------------------------------------------------------------
// Reads

LookupResult TierManager::Lookup(NamespaceId ns, std::span<const BlockKey> chain, bool prefetch) {
  LookupResult result;
  absl::MutexLock lock(&mu_);
  const uint32_t now = NowSeconds();
  for (const BlockKey& key : chain) {
    const EntryId id = FindCachedLocked(ns, key);
    if (id == kNoEntry) break;
    Entry& e = index_.at(id);
    const bool in_host = e.In(Tier::kHost) && (e.busy & kBusyPromoting) == 0;
    result.tiers.push_back(in_host ? Tier::kHost : Tier::kDisk);
    index_.Touch(id, now);
    if (prefetch && !e.In(Tier::kHost) && promotions_.find(id) == promotions_.end() &&
        (e.busy & kBusyReading) == 0) {
      StartPromotionLocked(id, /*prefetch=*/true);
      ++result.promotions_started;
    }
  }
  result.hit_blocks = static_cast<uint32_t>(result.tiers.size());
  return result;
}

uint32_t TierManager::Prefetch(NamespaceId ns, std::span<const BlockKey> keys) {
  absl::MutexLock lock(&mu_);
  uint32_t started = 0;
  for (const BlockKey& key : keys) {
    const EntryId id = FindCachedLocked(ns, key);
    if (id == kNoEntry) continue;
    Entry& e = index_.at(id);
    if (e.In(Tier::kHost) || promotions_.contains(id) || (e.busy & kBusyReading)) continue;
    StartPromotionLocked(id, /*prefetch=*/true);
    ++started;
  }
  return started;
}

std::vector<BlockRead> TierManager::Acquire(NamespaceId ns, std::span<const BlockKey> keys,
                                            uint64_t owner, std::chrono::milliseconds ttl) {
  std::vector<BlockRead> out(keys.size());
  absl::MutexLock lock(&mu_);
  const uint32_t now = NowSeconds();
  const auto deadline =
      ttl.count() > 0 ? clock_.Now() + ttl : std::chrono::steady_clock::time_point::max();

  auto lease = [&](size_t i, EntryId id, Tier from) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Entry& e = index_.at(id);
    ++e.leases;
    const uint64_t lease_id = leases_.Add(id, owner, deadline);
    if (e.hits < UINT32_MAX) ++e.hits;
    index_.Touch(id, now);
    BlockRead& r = out[i];
    r.from = from;
    r.lease_id = lease_id;
    r.arena_offset = e.host_offset;
    r.data = host_.Data(HostSlot{e.host_offset, e.size});
    r.size = e.size;
    r.checksum = e.checksum;
    r.lossy_encoding = e.lossy_encoding;
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
      flusher_.Signal();
    }
    if (policy.read_ahead->depth() > 0) ReadAheadLocked(id);
  };

  // Blocks not in host wait for a promotion (theirs or another reader's), then are leased.
  struct Wait {
    size_t i;
    std::shared_ptr<Promotion> promotion;  // null: another get reads it straight from disk
    int rounds;
  };
  std::vector<Wait> waits;
  for (size_t i = 0; i < keys.size(); ++i) {
    const EntryId id = FindCachedLocked(ns, keys[i]);
    if (id == kNoEntry) {
      out[i].status = Status::NotFound("not cached");
      continue;
    }
    const Entry& e = index_.at(id);
    if (e.In(Tier::kHost) && (e.busy & kBusyPromoting) == 0) {
      lease(i, id, Tier::kHost);
    } else if (e.busy & kBusyReading) {
      waits.push_back({i, nullptr, 0});
    } else {
      waits.push_back({i, StartPromotionLocked(id, /*prefetch=*/false), 1});
    }
  }

  auto pending = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const Wait& w : waits) {
      if (w.promotion && !w.promotion->done) return true;
      if (!w.promotion) {
        const EntryId id = FindCachedLocked(ns, keys[w.i]);
        if (id != kNoEntry && (index_.at(id).busy & kBusyReading)) return true;
      }
    }
    return false;
  };
  // A block demoted again before this get leased it is promoted again; one that cannot be
  // placed in host (every host block leased) is read straight from disk.
  constexpr int kMaxPromotionRounds = 3;
  uint64_t direct_bytes = 0;  // read straight from disk by this call
  while (!waits.empty()) {
    while (pending() && !stopping_) changed_.Wait(&mu_);
    std::vector<Wait> again;
    for (const Wait& w : waits) {
      const size_t i = w.i;
      const EntryId id = FindCachedLocked(ns, keys[i]);
      if (id == kNoEntry) {
        const Status& ps = w.promotion ? w.promotion->status : Status::OK();
        out[i].status = (!ps.ok() && !ps.IsNotFound() && ps.code() != StatusCode::kCorruption)
                            ? ps
                            : Status::NotFound("not cached");
        continue;
      }
      Entry& e = index_.at(id);
      if (e.In(Tier::kHost) && (e.busy & kBusyPromoting) == 0) {
        lease(i, id, Tier::kDisk);
        continue;
      }
      if (stopping_) {
        out[i].status = Status::Unavailable("daemon shutting down");
        continue;
      }
      if (e.busy & kBusyPromoting) {  // another reader's promotion: wait for it
        auto it = promotions_.find(id);
        again.push_back({i, it != promotions_.end() ? it->second : nullptr, w.rounds});
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
      Status st = ReadDiskCopy(copy, buf.get(), &checksum);
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

// ---------------------------------------------------------------------------------------------
// Writes

std::vector<ReserveOutcome> TierManager::Reserve(NamespaceId ns, uint64_t owner,
                                                 std::span<const PutRequestItem> items) {
  std::vector<ReserveOutcome> out(items.size());
  absl::MutexLock lock(&mu_);
  const uint32_t now = NowSeconds();
  const uint64_t max_block = max_block_bytes();
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
    auto classify = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      const EntryId id = FindCachedLocked(ns, item.key);
      if (id != kNoEntry) {
        index_.Touch(id, now);
        o.state = ReserveState::kPresent;
        return true;
      }
      if (reservations_.Reserved(ns, item.key)) {
        o.state = ReserveState::kInProgress;
        return true;
      }
      return false;
    };
    if (classify()) continue;
    // (Making room may push out the block this one extends; in a namespace whose disk takes
    // nothing the new block is then stored without its parent link, unreachable by lookups,
    // until it ages out. Holding the parent instead would leave a chain longer than the host
    // tier nothing to evict, tail first.)
    Result<HostSlot> slot = AllocateHostLocked(ns, item.size);
    if (!slot.ok()) {
      o.status = slot.status();
      continue;
    }
    if (classify()) {  // the lock was released while making room
      host_.Free(*slot);
      continue;
    }
    Reservation r;
    r.owner = owner;
    r.ns = ns;
    r.item = item;
    r.slot = *slot;
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
  if (found == nullptr) {
    return Status::NotFound("reservation " + std::to_string(reservation_id) +
                            " is unknown or expired");
  }
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
    if (found == nullptr) {
      return Status::NotFound("reservation " + std::to_string(reservation_id) +
                              " is unknown or expired");
    }
    found->deadline = Clock::TimePoint::max();  // committing
    if (checksum.has_value()) found->item.checksum = *checksum;
    r = *found;
  }
  // Expiry skips a committing reservation, but Abort, AbortOwner (the connection closed) and
  // Shutdown may still free it while we hash: the result is then discarded below.
  const uint64_t actual = BlockChecksum(host_.Data(r.slot), r.item.size);

  absl::MutexLock lock(&mu_);
  changed_.SignalAll();  // AwaitInFlightPut: whatever happens below, this reservation ends
  if (!reservations_.Remove(reservation_id).has_value()) {
    // Its slot was freed (and may be reused): publishing it would serve or free foreign bytes.
    return Status::Aborted("reservation " + std::to_string(reservation_id) +
                           " was aborted while committing");
  }
  if (actual != r.item.checksum) {
    host_.Free(r.slot);
    ++checksum_failures_;
    return Status::Corruption("block " + r.item.key.ShortHex() +
                              ": payload does not match its checksum (damaged in transfer)");
  }
  EntryId id = index_.Find(r.ns, r.item.key);
  if (id != kNoEntry && index_.at(id).tiers != 0) {
    host_.Free(r.slot);  // cannot happen while reserved; harmless if it does
    return Status::OK();
  }
  if (id == kNoEntry) id = index_.Insert(r.ns, r.item.key);
  // A new entry, or a copy-less one (a session's pin kept it) that has no parent link yet.
  if (index_.at(id).parent == kNoEntry && !r.item.parent.IsZero()) {
    const EntryId parent = index_.Find(r.ns, r.item.parent);
    if (parent != kNoEntry && parent != id) index_.SetParent(id, parent);
  }
  Entry& e = index_.at(id);
  e.size = static_cast<uint32_t>(r.item.size);
  e.checksum = r.item.checksum;
  e.host_offset = r.slot.offset;
  index_.AddCopy(id, Tier::kHost);
  index_.Touch(id, NowSeconds());
  ++host_blocks_;
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
  if (HostAboveHighWatermarkLocked()) flusher_.Signal();
  return Status::OK();
}

void TierManager::Abort(uint64_t owner, uint64_t reservation_id) {
  absl::MutexLock lock(&mu_);
  if (reservations_.FindOwned(reservation_id, owner) == nullptr) return;
  FreeReservationLocked(reservation_id);
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

std::vector<TierManager::CachedBlock> TierManager::SnapshotCached() const {
  absl::MutexLock lock(&mu_);
  std::vector<CachedBlock> out;
  out.reserve(index_.size());
  index_.ForEach(kNoNamespace, [&](EntryId id) {
    const Entry& e = index_.at(id);
    if (e.tiers == 0) return;
    out.push_back({e.ns, e.key, e.parent != kNoEntry ? index_.at(e.parent).key : BlockKey{}});
  });
  return out;
}

uint32_t TierManager::CountCached(NamespaceId ns, std::span<const BlockKey> chain) {
  absl::MutexLock lock(&mu_);
  uint32_t n = 0;
  for (const BlockKey& key : chain) {
    if (FindCachedLocked(ns, key) != kNoEntry) ++n;
  }
  return n;
}

// ---------------------------------------------------------------------------------------------
// Admin

EvictOutcome TierManager::Evict(NamespaceId ns, Tier tier, std::span<const BlockKey> keys) {
  absl::MutexLock lock(&mu_);
  std::vector<EntryId> targets;
  if (keys.empty()) {
    index_.ForEach(ns, [&](EntryId id) {
      if (index_.at(id).tiers != 0) targets.push_back(id);
    });
  } else {
    for (const BlockKey& key : keys) {
      const EntryId id = FindCachedLocked(ns, key);
      if (id != kNoEntry) targets.push_back(id);
    }
  }
  // Deepest first, so each block's cached descendants among the targets go before it.
  absl::flat_hash_map<EntryId, uint32_t> depth;
  auto depth_of = [&](EntryId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<EntryId> path;
    uint32_t d = 0;
    // Parent links come from clients (and from disk after a restart): bound the walk so a
    // cycle a lying client built cannot hang the daemon.
    for (EntryId cur = id; cur != kNoEntry && path.size() <= index_.size();
         cur = index_.at(cur).parent) {
      auto it = depth.find(cur);
      if (it != depth.end()) {
        d = it->second;
        break;
      }
      path.push_back(cur);
    }
    for (auto it = path.rbegin(); it != path.rend(); ++it) depth[*it] = ++d;
    return depth[id];
  };
  std::vector<std::pair<uint32_t, BlockKey>> order;
  for (EntryId id : targets) order.emplace_back(depth_of(id), index_.at(id).key);
  std::sort(order.begin(), order.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });

  EvictOutcome outcome;
  for (const auto& [d, key] : order) {
    const EntryId id = FindCachedLocked(ns, key);
    if (id == kNoEntry) continue;
    Entry& e = index_.at(id);
    if (e.leases > 0 || e.busy != 0) {
      ++outcome.skipped;
      continue;
    }
    bool done = false;
    if (e.In(Tier::kHost) && e.children[TierSlot(Tier::kHost)] == 0) {
      if (e.In(Tier::kDisk) || tier == Tier::kDisk || !PolicyLocked(ns).admission->Admit(e.hits)) {
        ++host_counters_.evictions;
        DropHostCopyLocked(id);
        done = true;
      } else {
        e.busy |= kBusyDemoting;
        WriteDownLocked({id}, /*drop_host=*/true, /*sync=*/false).IgnoreError();
        // Written down, or lost because the disk refused it: either way it left host.
        const EntryId after = FindCachedLocked(ns, key);
        done = after == kNoEntry || !index_.at(after).In(Tier::kHost);
      }
    }
    if (tier == Tier::kDisk) {
      const EntryId again = FindCachedLocked(ns, key);
      if (again != kNoEntry) {
        Entry& e2 = index_.at(again);
        done = false;
        if (!e2.In(Tier::kHost) && e2.In(Tier::kDisk) && e2.pins == 0 &&
            e2.cached_children() == 0 && e2.busy == 0) {
          ++disk_counters_.evictions;
          DropDiskCopiesLocked({again});
          done = true;
        }
      }
    }
    done ? ++outcome.evicted : ++outcome.skipped;
  }
  return outcome;
}

TierManagerStats TierManager::GetStats() const {
  TierManagerStats s;
  s.disk_bytes_on_device = disk_.bytes_on_device();
  absl::MutexLock lock(&mu_);
  // Under the lock, so the arena's figures and the counters below describe the same moment (a
  // reservation freed in between would show as gone from one and still allocated in the other).
  s.host = host_.GetStats();
  s.host_blocks = host_blocks_;
  s.disk_capacity_bytes = options_.disk_capacity_bytes;
  s.disk_used_bytes = disk_used_;
  s.disk_blocks = disk_blocks_;
  s.host_counters = host_counters_;
  s.disk_counters = disk_counters_;
  s.index_entries = index_.size();
  s.index_bytes = index_.MemoryBytes();
  s.leases_active = leases_.size();
  s.reservations_active = reservations_.size();
  s.prefetches_issued = prefetches_issued_;
  s.prefetches_useful = prefetches_useful_;
  s.checksum_failures = checksum_failures_;
  s.disk_write_errors = disk_write_errors_;
  s.blocks_lost = blocks_lost_;
  s.blocks_not_admitted = blocks_not_admitted_;
  s.read_aheads = read_aheads_;
  s.encoded_writes = encoded_writes_;
  return s;
}

void TierManager::WaitFlusherRoundForTest() {
  absl::MutexLock lock(&mu_);
  // A round that began after this call has ended once the counter moved twice.
  const uint64_t target = flusher_rounds_ + 2;
  while (flusher_rounds_ < target && !stopping_) changed_.Wait(&mu_);
}

void TierManager::WaitIdleForTest() {
  absl::MutexLock lock(&mu_);
  while (!promotion_queue_.empty() || !promotions_.empty() || io_in_flight_ > 0) {
    changed_.WaitWithTimeout(&mu_, absl::Milliseconds(10));
  }
}

}  // namespace kvpool::tiers
