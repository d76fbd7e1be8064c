#include "tiers/tier_manager.h"

#include <glog/logging.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>

#include "common/checksum.h"
#include "common/clock.h"
#include "common/units.h"
#include "tiers/demotion_encoding.h"
#include "tiers/meta_scan.h"

namespace kvpool::tiers {
namespace {

// A quota in whole segments of `segment_bytes` (0: no quota, no limit).
uint32_t SegmentsFor(uint64_t quota_bytes, uint64_t segment_bytes) {
  return static_cast<uint32_t>(
      std::min<uint64_t>((quota_bytes + segment_bytes - 1) / segment_bytes, UINT32_MAX));
}

}  // namespace

DiskCopy TierManager::DiskCopyOf(const Entry& e) {
  return DiskCopy{e.ns, e.key, e.size, e.checksum, e.disk_encoding};
}

TierManager::TierManager(const TierManagerOptions& options, TierStack stack)
    : options_(options),
      stack_(std::move(stack)),
      host_(stack_.host()),
      gpus_(stack_.gpus().begin(), stack_.gpus().end()),
      disk_(stack_.disk()),
      clock_(options.clock != nullptr ? *options.clock : RealClock()),
      start_(clock_.Now()),
      hasher_(index_.hasher()),
      default_policy_(DefaultNamespacePolicy()),
      host_segments_(host_.segment_count(), host_.segment_bytes()),
      mover_(mu_, clock_,
             MoverOptions{.promotion_threads = options.promotion_threads,
                          .gpu_workers = static_cast<int>(gpus_.size())},
             MoverWork{
                 [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { FlushRoundLocked(); },
                 [this](EntryId id) ABSL_NO_THREAD_SAFETY_ANALYSIS { PromoteOne(id); },
                 [this](EntryId id) ABSL_NO_THREAD_SAFETY_ANALYSIS { AbandonPromotionLocked(id); },
                 [this](int gpu, const GpuPlacement& job)
                     ABSL_NO_THREAD_SAFETY_ANALYSIS { RunGpuPlacementLocked(gpu, job); },
                 [this](int gpu, const GpuPlacement& job)
                     ABSL_NO_THREAD_SAFETY_ANALYSIS { AbandonGpuPlacementLocked(gpu, job); }}) {
  absl::MutexLock lock(&mu_);
  gpu_blocks_.assign(gpus_.size(), 0);
  gpu_hits_.assign(gpus_.size(), {0, 0});
  for (GpuTier* gpu : gpus_) gpu_segments_.emplace_back(gpu->segment_count(), gpu->segment_bytes());
  gpu_fills_.resize(gpus_.size());
}

TierManager::~TierManager() { Shutdown(); }

uint32_t TierManager::NowSeconds() const {
  return static_cast<uint32_t>(
      std::chrono::duration_cast<std::chrono::seconds>(clock_.Now() - start_).count());
}

Status TierManager::SetNamespacePolicy(NamespaceId ns, NamespacePolicy policy) {
  absl::MutexLock lock(&mu_);
  KVPOOL_RETURN_IF_ERROR(pools_.SetOrder(ns, policy.eviction));
  host_.SetSegmentLimit(ns, SegmentsFor(policy.host_quota_bytes, host_.segment_bytes()));
  for (GpuTier* gpu : gpus_) {
    gpu->SetSegmentLimit(ns, SegmentsFor(policy.gpu_quota_bytes, gpu->segment_bytes()));
  }
  policies_[ns] = std::move(policy);
  // A lowered disk quota applies at once; a lowered host quota as the namespace's segments
  // empty (its next allocations evict its own blocks).
  if (Status st = EnforceDiskQuotaLocked(ns, 0); !st.ok()) {
    LOG(WARNING) << "namespace " << ns << ": " << st.ToString();
  }
  return Status::OK();
}

void TierManager::ClearNamespacePolicy(NamespaceId ns) {
  absl::MutexLock lock(&mu_);
  pools_.SetOrder(ns, "").IgnoreError();  // back to the default pool: cannot fail
  host_.SetSegmentLimit(ns, 0);
  for (GpuTier* gpu : gpus_) gpu->SetSegmentLimit(ns, 0);
  policies_.erase(ns);
}

Status TierManager::SetDefaultPolicy(NamespacePolicy policy) {
  absl::MutexLock lock(&mu_);
  KVPOOL_RETURN_IF_ERROR(pools_.SetDefaultOrder(policy.eviction.empty() ? "lru" : policy.eviction));
  // Its quotas bound each namespace without a policy of its own, one by one (not all together).
  host_.SetDefaultSegmentLimit(SegmentsFor(policy.host_quota_bytes, host_.segment_bytes()));
  for (GpuTier* gpu : gpus_) {
    gpu->SetDefaultSegmentLimit(SegmentsFor(policy.gpu_quota_bytes, gpu->segment_bytes()));
  }
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

EntryId TierManager::FindCachedLocked(const HashedKey& k) const {
  EntryId id = index_.Find(k);
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
  const auto start = std::chrono::steady_clock::now();
  const int readers = std::clamp(UsableCpus(), 1, kMaxRecoverReaders);
  MetaScan scan(disk_, disk_.SplitMeta(readers));
  absl::MutexLock lock(&mu_);
  index_.Reserve(index_.size() + disk_.EstimateMetaRecords());
  // Pass 1, while the readers go on: an entry for every record, in the order they arrive. A
  // record is dropped once its entry is made; what pass 2 needs of it is kept in 40 bytes (10^7
  // blocks: 0.4 GB, where the records themselves would hold 1.3 GB). Nothing is counted before
  // pass 2, so a scan that fails leaves the disk accounting untouched.
  struct Link {
    EntryId id;
    NamespaceId ns;
    BlockKey parent;  // zero: the chain's first block
  };
  std::vector<Link> links;
  links.reserve(disk_.EstimateMetaRecords());
  std::vector<std::pair<NamespaceId, BlockKey>> invalid;
  uint64_t oversize = 0;
  // Cache misses bound both passes at 10^6 blocks and more: each asks for the hash slots of a
  // record ahead before it needs them.
  constexpr size_t kAhead = kIndexPrefetchAhead;
  while (std::optional<MetaBatch> batch = scan.Next()) {
    const MetaBatch& loaded = *batch;
    for (size_t i = 0; i < loaded.size(); ++i) {
      if (i + kAhead < loaded.size()) {
        index_.Prefetch(loaded[i + kAhead].ns, loaded[i + kAhead].key);
      }
      const LoadedMeta& l = loaded[i];
      // Sizes no daemon writes: corrupt records. (A block larger than a host segment is not: it
      // was put under a larger --host_segment_size, and stays, served by direct reads.)
      if (l.meta.size == 0 || l.meta.size > UINT32_MAX) {
        invalid.emplace_back(l.ns, l.key);
        continue;
      }
      if (l.meta.size > max_block_bytes()) ++oversize;
      const EntryId id = index_.Insert(l.ns, l.key);
      Entry& e = index_.at(id);
      e.size = static_cast<uint32_t>(l.meta.size);
      e.checksum = l.meta.checksum;
      e.disk_encoding = l.meta.encoding;
      e.disk_size = l.meta.encoding != 0 ? static_cast<uint32_t>(l.meta.stored_size) : 0;
      links.push_back({id, l.ns, l.meta.parent});
    }
  }
  const auto scanned = scan.finished_at();
  KVPOOL_RETURN_IF_ERROR(scan.status());
  for (const std::string& raw : scan.bad()) {
    LOG(ERROR) << "dropping an undecodable block record on disk (" << raw.size() << "-byte key)";
    disk_.DeleteRaw(raw).IgnoreError();
  }
  const auto inserted = std::chrono::steady_clock::now();
  // Pass 2, once every entry exists: link each to its parent and add its copy in one pass, so
  // the parent is read once for both (a child's copy may come before its parent's). Candidacy
  // is settled once at the end, in entry order (BlockIndex::AddCopyUnsettled).
  // In groups: first the parents of a group are found (their finds are independent, so their
  // misses overlap) while the next group's hash slots load, and their entries are asked for;
  // then the group is linked, its parents' entries in cache by then.
  constexpr size_t kGroup = 32;
  std::array<EntryId, kGroup> parents;
  NamespaceId last_ns = kNoNamespace;
  uint64_t* ns_used = nullptr;
  for (size_t g = 0; g < links.size(); g += kGroup) {
    const size_t end = std::min(g + kGroup, links.size());
    for (size_t i = end; i < std::min(end + kGroup, links.size()); ++i) {
      if (!links[i].parent.IsZero()) index_.Prefetch(links[i].ns, links[i].parent);
    }
    for (size_t i = g; i < end; ++i) {
      EntryId& parent = parents[i - g];
      parent = links[i].parent.IsZero() ? kNoEntry : index_.Find(links[i].ns, links[i].parent);
      if (parent != kNoEntry) index_.PrefetchEntry(parent);
    }
    for (size_t i = g; i < end; ++i) {
      const Link& l = links[i];
      const EntryId parent = parents[i - g];
      if (parent != kNoEntry && parent != l.id) index_.SetParent(l.id, parent);
      index_.AddCopyUnsettled(l.id, Tier::kDisk);
      const uint64_t bytes = index_.at(l.id).disk_bytes();
      disk_used_ += bytes;
      if (l.ns != last_ns) {  // a namespace's records come together
        last_ns = l.ns;
        ns_used = &disk_used_of_[l.ns];
      }
      *ns_used += bytes;
      ++disk_blocks_;
    }
  }
  std::vector<Link>().swap(links);
  index_.SettleCandidates();
  if (!invalid.empty()) {
    LOG(ERROR) << "dropping " << invalid.size() << " disk blocks with an impossible size";
    disk_.Delete(invalid).IgnoreError();
  }
  if (oversize > 0) {
    LOG(WARNING) << oversize << " disk blocks are larger than a host segment ("
                 << FormatBytes(max_block_bytes())
                 << ": --host_segment_size is smaller than when they were put); they stay on disk "
                    "and are served by direct reads, never promoted to host";
  }
  const auto done = std::chrono::steady_clock::now();
  rebuild_blocks_ = disk_blocks_;
  rebuild_seconds_ = std::chrono::duration<double>(done - start).count();
  auto seconds = [&](auto from, auto to) {
    return std::chrono::duration<double>(to - from).count();
  };
  char took[192];
  std::snprintf(took, sizeof(took),
                "%.3f s (%d readers, one per key range, done reading at %.3f s while indexing; "
                "entries made at %.3f s, linked in %.3f s)",
                rebuild_seconds_, scan.readers(), seconds(start, scanned), seconds(start, inserted),
                seconds(inserted, done));
  LOG(INFO) << "recovered " << disk_blocks_ << " disk blocks (" << FormatBytes(disk_used_)
            << ") from RocksDB meta records without reading their bodies, in " << took;
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
  mover_.Start();
}

void TierManager::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    changed_.SignalAll();
  }
  mover_.Stop();  // promotions still queued are abandoned: their waiters get an error
  absl::MutexLock lock(&mu_);
  for (uint64_t rid : reservations_.All()) FreeReservationLocked(rid);
  changed_.SignalAll();
  DeleteDroppedLocked();  // a restart must not find what was dropped
  if (!options_.flush_on_shutdown || !started_) return;
  // (Each write-down below deletes what it dropped for room before it writes, except one that
  // found no room at all: the last line deletes those.)
  // Write down every host-only block so a restart serves it again.
  std::vector<EntryId> batch;
  uint64_t batch_bytes = 0;
  uint64_t written = 0;
  std::vector<EntryId> host_only;
  index_.ForEach(kNoNamespace, [&](EntryId id) {
    const Entry& e = index_.at(id);
    // (Not a block held only as approximate bytes: it is never written down, see
    // WriteDownLocked.)
    if (e.In(Tier::kHost) && !e.In(Tier::kDisk) && e.busy == 0 && !ApproximateOnlyLocked(id) &&
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
      if (st.code() == StatusCode::kResourceExhausted) {
        // A namespace over its disk quota (or a full disk): the rest of the batch was written,
        // and other namespaces' blocks may still fit.
        LOG(WARNING) << "flush at shutdown: " << st.ToString();
      } else if (!st.ok()) {
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
  DeleteDroppedLocked();
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
    if (tier == Tier::kGpu && !e.In(Tier::kGpu)) continue;  // nothing of it there
    if (e.leases > 0 || e.busy != 0) {
      ++outcome.skipped;
      continue;
    }
    if (tier == Tier::kGpu) {  // only the gpu copy goes: host still holds the block
      if (e.children[TierSlot(Tier::kGpu)] == 0) {
        DropGpuCopyLocked(id);
        ++outcome.evicted;
      } else {
        ++outcome.skipped;
      }
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
        // Written down, or lost because the disk refused it: either way it left host, unless it
        // was leased meanwhile or gained a child there (tail first), as `done` finds.
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
  DeleteDroppedLocked();  // evicted is gone from disk once answered, also after a crash
  return outcome;
}

TierManagerStats TierManager::GetStats() const {
  TierManagerStats s;
  s.disk_bytes_on_device = disk_.bytes_on_device();
  s.disk_memory_bytes = disk_.memory_bytes();
  absl::MutexLock lock(&mu_);
  // Under the lock, so the arena's figures and the counters below describe the same moment (a
  // reservation freed in between would show as gone from one and still allocated in the other).
  s.host = host_.GetStats();
  s.host_blocks = host_blocks_;
  s.disk_capacity_bytes = options_.disk_capacity_bytes;
  s.disk_used_bytes = disk_used_;
  s.disk_device_room_bytes = disk_device_room_;
  s.disk_blocks = disk_blocks_;
  s.index_rebuild_blocks = rebuild_blocks_;
  s.index_rebuild_seconds = rebuild_seconds_;
  s.host_counters = host_counters_;
  s.disk_counters = disk_counters_;
  for (size_t i = 0; i < gpus_.size(); ++i) {
    s.gpus.push_back({gpus_[i]->device(), gpus_[i]->GetStats(), gpu_blocks_[i], gpu_hits_[i].first,
                      gpu_hits_[i].second});
  }
  s.gpu_counters = gpu_counters_;
  s.index_entries = index_.size();
  s.index_bytes = index_.MemoryBytes();
  s.leases_active = leases_.size();
  s.reservations_active = reservations_.size();
  s.prefetches_issued = prefetches_issued_;
  s.prefetches_useful = prefetches_useful_;
  s.checksum_failures = checksum_failures_;
  s.gpu_hints_dropped = gpu_hints_dropped_;
  s.gpu_puts = gpu_puts_;
  s.disk_write_errors = disk_write_errors_;
  s.disk_deletes_pending = deleting_.size();
  s.disk_delete_errors = disk_delete_errors_;
  s.blocks_lost = blocks_lost_;
  s.blocks_not_admitted = blocks_not_admitted_;
  s.host_blocks_moved = host_blocks_moved_;
  s.blocks_over_quota = blocks_over_quota_;
  s.read_aheads = read_aheads_;
  s.encoded_writes = encoded_writes_;
  return s;
}

TierManager::NamespaceUsage TierManager::UsageOf(NamespaceId ns) const {
  absl::MutexLock lock(&mu_);
  NamespaceUsage u;
  u.host_segment_bytes = static_cast<uint64_t>(host_.SegmentsOf(ns)) * host_.segment_bytes();
  auto it = disk_used_of_.find(ns);
  u.disk_bytes = it == disk_used_of_.end() ? 0 : it->second;
  return u;
}

void TierManager::WaitFlusherRoundForTest() { mover_.WaitFlusherRound(); }

std::string TierManager::HostSegmentsMismatchForTest() const {
  absl::ReaderMutexLock lock(&mu_);
  std::string out;
  uint64_t booked = 0;
  const std::vector<MemoryTier::SegmentUse> uses = host_.SegmentUses();
  for (uint32_t s = 0; s < uses.size(); ++s) {
    uint64_t pages = 0;
    for (EntryId id : host_segments_.Of(s)) {
      ++booked;
      const Entry& e = index_.at(id);
      if (!e.live || !e.In(Tier::kHost)) {
        out += "segment " + std::to_string(s) + " books a block without a host copy; ";
        continue;
      }
      if (host_segments_.SegmentOf(index_.Mem(id).host_offset) != s) {
        out += "segment " + std::to_string(s) + " books a block whose copy is in segment " +
               std::to_string(host_segments_.SegmentOf(index_.Mem(id).host_offset)) + "; ";
      }
      if (e.ns != uses[s].owner) out += "segment " + std::to_string(s) + " holds another's; ";
      pages += PagesBytes(e.size);
    }
    if (pages > uses[s].used_bytes) out += "segment " + std::to_string(s) + " overbooked; ";
  }
  if (booked != host_blocks_) {
    out += std::to_string(booked) + " blocks booked, " + std::to_string(host_blocks_) + " in host";
  }
  return out;
}

void TierManager::WaitIdleForTest() {
  absl::MutexLock lock(&mu_);
  while (mover_.queued() > 0 || mover_.gpu_pending() > 0 || !promotions_.empty() ||
         io_in_flight_ > 0 || !deleting_.empty()) {
    changed_.WaitWithTimeout(&mu_, absl::Milliseconds(10));
  }
}

}  // namespace kvpool::tiers
