// TierManager, part of tiers/tier_manager.h: the gpu tiers. A gpu copy is a second copy of a
// host block in one GPU's memory, made on a hint and dropped first when that GPU needs room or
// with its host copy.

#include <glog/logging.h>

#include <algorithm>
#include <utility>

#include "common/checksum.h"
#include "tiers/tier_manager.h"

namespace kvpool::tiers {

int TierManager::GpuIndexOf(int device) const {
  for (size_t i = 0; i < gpus_.size(); ++i) {
    if (gpus_[i]->device() == device) return static_cast<int>(i);
  }
  return -1;
}

GpuTier* TierManager::GpuOf(int device) const {
  const int i = GpuIndexOf(device);
  return i < 0 ? nullptr : gpus_[static_cast<size_t>(i)];
}

void TierManager::AddGpuCopyLocked(EntryId id, size_t gpu, const MemorySlot& slot) {
  MemCopies& mem = index_.EnsureMem(id);
  mem.gpu_page = static_cast<uint32_t>(slot.offset / MemoryTier::kPageBytes);
  mem.gpu_device = static_cast<uint8_t>(gpus_[gpu]->device());
  index_.AddCopy(id, Tier::kGpu);
  gpu_segments_[gpu].Add(slot.offset, id);
  ++gpu_blocks_[gpu];
}

void TierManager::DropGpuCopyLocked(EntryId id) {
  // Read before the copy goes: with its last memory copy, its memory part goes too.
  const int device = index_.Mem(id).gpu_device;
  const MemorySlot slot = GpuSlotLocked(id);
  for (size_t i = 0; i < gpus_.size(); ++i) {
    if (gpus_[i]->device() != device) continue;
    index_.RemoveCopy(id, Tier::kGpu);
    gpu_segments_[i].Remove(slot.offset, id);
    gpu_checksums_.erase(id);
    gpus_[i]->Free(slot);
    --gpu_blocks_[i];
    ++gpu_counters_.evictions;
    return;
  }
  LOG(DFATAL) << "block " << index_.at(id).key.ShortHex() << " has a copy on gpu " << device
              << ", which runs no gpu tier";
}

Result<MemorySlot> TierManager::AllocateGpuLocked(GpuTier& gpu, NamespaceId ns, uint64_t bytes,
                                                  bool may_renew) {
  const int device = gpu.device();
  const SegmentBlocks& in_segments = gpu_segments_[static_cast<size_t>(GpuIndexOf(device))];
  Status renewal_failed;  // this call's renewal that failed
  for (;;) {
    Result<MemorySlot> slot = gpu.TryAllocate(ns, bytes);
    if (slot.ok()) return slot;
    if (slot.status().code() == StatusCode::kUnavailable) {
      // Room needs another namespace's vacant segment given fresh memory (CUDA virtual memory
      // unmapped, released, created and mapped again): done without the lock, as for host.
      if (!may_renew) return slot;
      if (renewal_failed.ok()) {
        renewal_failed = RenewWithoutLockLocked(gpu);
        continue;
      }
      slot = Status::ResourceExhausted("no fresh memory for a gpu " + std::to_string(device) +
                                       " segment (" + renewal_failed.ToString() + ")");
    } else if (slot.status().code() != StatusCode::kResourceExhausted) {
      return slot;
    }
    // Other namespaces' free pages do not help this one: free at least a segment's worth. A
    // namespace at its quota frees its own; so does one after a segment could not get fresh
    // memory for it: emptying another would only have its renewal fail the same way (the GPU is
    // full), but its own copies can still make room in its own segments.
    const uint64_t budget = std::max(bytes, gpu.segment_bytes());
    auto evictable = [&](EntryId id) {
      const Entry& e = index_.at(id);  // a gpu candidate: it has a memory part
      return index_.Mem(id).gpu_device == device && e.leases == 0 && e.busy == 0;
    };
    std::vector<EntryId> victims;
    if (gpu.AtSegmentLimit(ns) || !renewal_failed.ok()) {
      pools_.VictimsOf(ns, Tier::kGpu, budget, evictable, &victims);
    } else {
      pools_.Victims(Tier::kGpu, budget, evictable, &victims);
      // One segment emptied for it (descendants first), not the coldest copies of every one,
      // unless its own coldest copies make its room.
      std::vector<EntryId> segment =
          SegmentToEmptyLocked(gpu, in_segments, Tier::kGpu, ns, bytes, victims, evictable);
      if (!segment.empty()) victims = std::move(segment);
    }
    if (victims.empty()) return slot;
    for (EntryId id : victims) DropGpuCopyLocked(id);
  }
}

Result<uint32_t> TierManager::PromoteToGpu(NamespaceId ns, std::span<const BlockKey> keys,
                                           int device) {
  GpuTier* gpu = GpuOf(device);
  if (gpu == nullptr) {
    return Status::InvalidArgument("no gpu tier on CUDA device " + std::to_string(device));
  }
  struct Copy {
    EntryId id;
    MemorySlot slot;
    const uint8_t* src;
    uint64_t checksum;
  };
  std::vector<Copy> copies;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return Status::Unavailable("the tier manager is stopping");
    for (const BlockKey& key : keys) {
      const auto placeable = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        const EntryId id = FindCachedLocked(ns, key);
        if (id == kNoEntry) return kNoEntry;
        const Entry& e = index_.at(id);
        const bool can = e.In(Tier::kHost) && !e.In(Tier::kGpu) && e.busy == 0 &&
                         e.size <= gpu->max_block_bytes();
        return can ? id : kNoEntry;
      };
      EntryId id = placeable();
      if (id == kNoEntry) continue;
      const uint64_t size = index_.at(id).size;
      Result<MemorySlot> slot = AllocateGpuLocked(*gpu, ns, size);
      if (!slot.ok()) break;  // no room left there
      // The lock may have been let go for a segment's renewal: the block may have changed, or
      // the daemon begun to stop.
      if (stopping_) {
        gpu->Free(*slot);
        break;
      }
      id = placeable();
      if (id == kNoEntry || index_.at(id).size != size) {
        gpu->Free(*slot);
        continue;
      }
      Entry& e = index_.at(id);
      // Busy: its host copy stays where it is (eviction and demotion skip busy entries).
      e.busy |= kBusyToGpu;
      copies.push_back({id, *slot, host_.Data({index_.Mem(id).host_offset, e.size}), e.checksum});
    }
  }
  // The copies run outside the mutex, on the device's copy engine.
  Status st = Status::OK();
  for (const Copy& c : copies) {
    st = gpu->copies().CopyAsync(gpu->Data(c.slot), c.src, c.slot.length,
                                 kernels::CopyDirection::kHostToDevice, nullptr);
    if (!st.ok()) break;
  }
  // Waited for even after a failed enqueue: no copy may still run into a slot undone below.
  if (!copies.empty()) {
    const Status done = gpu->copies().Wait(nullptr);
    if (st.ok()) st = done;
  }
  // Verified at both ends once copied: the host source against the block's checksum (it was
  // verified when put and does not change while busy, so a mismatch is memory gone bad under
  // the copy), and the gpu copy, by the device checksum the GPU computes over it, against the
  // same checksum of the source computed here. That value stays with the gpu copy for its
  // readers (BlockRead::device_checksum).
  std::vector<bool> good(copies.size(), false);
  std::vector<uint64_t> dsums(copies.size(), 0);
  if (st.ok() && !copies.empty()) {
    std::vector<kernels::ByteRange> ranges;
    for (const Copy& c : copies) ranges.push_back({gpu->Data(c.slot), c.slot.length});
    Result<std::vector<uint64_t>> on_gpu =
        gpu->copies().DeviceChecksums(ranges.data(), ranges.size(), nullptr);
    if (!on_gpu.ok()) st = on_gpu.status().WithContext("checksumming the gpu copies");
    for (size_t i = 0; st.ok() && i < copies.size(); ++i) {
      const Copy& c = copies[i];
      dsums[i] = kernels::DeviceChecksumCpu(c.src, c.slot.length);
      good[i] = BlockChecksum(c.src, c.slot.length) == c.checksum && dsums[i] == (*on_gpu)[i];
    }
  }
  absl::MutexLock lock(&mu_);
  uint32_t placed = 0;
  const auto gpu_index = static_cast<size_t>(GpuIndexOf(device));
  for (size_t i = 0; i < copies.size(); ++i) {
    const Copy& c = copies[i];
    Entry& e = index_.at(c.id);
    e.busy &= static_cast<uint8_t>(~kBusyToGpu);
    if (!good[i] || stopping_ || !e.In(Tier::kHost)) {
      if (st.ok() && !good[i]) {
        ++checksum_failures_;
        LOG(ERROR) << "block " << e.key.ShortHex() << " does not match its copy on gpu " << device
                   << " (host memory or the copy went bad)";
      }
      gpu->Free(c.slot);
      MaybeEraseLocked(c.id);
      continue;
    }
    AddGpuCopyLocked(c.id, gpu_index, c.slot);
    gpu_checksums_[c.id] = dsums[i];
    ++gpu_counters_.promotions;
    ++placed;
  }
  changed_.SignalAll();
  if (!st.ok()) return st.WithContext("copying blocks to gpu " + std::to_string(device));
  return placed;
}

Result<uint32_t> TierManager::PlaceOnGpu(NamespaceId ns, std::span<const BlockKey> keys, int device,
                                         bool wait, absl::Duration wait_limit) {
  const int gpu = GpuIndexOf(device);
  if (gpu < 0)
    return Status::InvalidArgument("no gpu tier on CUDA device " + std::to_string(device));
  absl::MutexLock lock(&mu_);
  if (stopping_) return Status::Unavailable("the tier manager is stopping");
  // Hints (puts, session loads) beyond what the GPU's worker has queued are dropped, so a burst
  // of them cannot make a waiting prefetch queue behind without bound. Waiting prefetches have a
  // bound of their own: one that times out stays queued, so clients repeating them (each waits
  // at most wait_limit) would otherwise grow the queue for as long as they go on.
  constexpr size_t kMaxQueuedHints = 64;
  constexpr size_t kMaxQueued = 256;
  if (!wait && mover_.gpu_queued(gpu) >= kMaxQueuedHints) {
    ++gpu_hints_dropped_;
    return Status::ResourceExhausted("gpu " + std::to_string(device) + " has " +
                                     std::to_string(kMaxQueuedHints) +
                                     " placements queued: hint dropped");
  }
  if (wait && mover_.gpu_queued(gpu) >= kMaxQueued) {
    return Status::ResourceExhausted("gpu " + std::to_string(device) + " has " +
                                     std::to_string(kMaxQueued) +
                                     " placements queued: try again later");
  }
  const uint64_t ticket = wait ? next_gpu_ticket_++ : 0;
  mover_.EnqueueGpu(gpu, GpuPlacement{ns, {keys.begin(), keys.end()}, ticket});
  if (!wait) return 0u;
  // The job runs, or Stop abandons it: either way an outcome comes, unless the wait ends first.
  const absl::Time deadline = absl::Now() + wait_limit;
  while (!gpu_outcomes_.contains(ticket)) {
    if (changed_.WaitWithDeadline(&mu_, deadline) && !gpu_outcomes_.contains(ticket)) {
      gpu_tickets_abandoned_.insert(ticket);
      return Status::DeadlineExceeded("placement on gpu " + std::to_string(device) +
                                      " still queued after " + absl::FormatDuration(wait_limit) +
                                      "; it goes on in the background");
    }
  }
  auto outcome = gpu_outcomes_.extract(ticket);
  if (!outcome.mapped().first.ok()) return outcome.mapped().first;
  return outcome.mapped().second;
}

void TierManager::RunGpuPlacementLocked(int gpu, const GpuPlacement& job) {
  if (job.fill_host) return FillHostCopiesLocked(gpu);
  // A placement copies from host: blocks only on disk are read up first, and the worker waits
  // for them (this GPU's later placements wait behind it; other GPUs' do not).
  std::vector<std::shared_ptr<Promotion>> reads;
  for (const BlockKey& key : job.keys) {
    const EntryId id = FindCachedLocked(job.ns, key);
    if (id == kNoEntry) continue;
    const Entry& e = index_.at(id);
    // Put straight into a gpu tier: nothing to place, and its host copy is made by a job that may
    // be queued behind this one (on this GPU's worker or another's): never waited for here.
    if (e.busy & kBusyFromGpu) continue;
    if (auto in_flight = promotions_.find(id); in_flight != promotions_.end()) {
      reads.push_back(in_flight->second);
    } else if (CanStartPromotionLocked(id, e)) {
      reads.push_back(StartPromotionLocked(id, /*prefetch=*/true));
    }
  }
  const auto pending = [&] {
    return std::any_of(reads.begin(), reads.end(),
                       [](const std::shared_ptr<Promotion>& p) { return !p->done; });
  };
  while (!stopping_ && pending()) changed_.Wait(&mu_);
  mu_.Unlock();
  Result<uint32_t> placed = PromoteToGpu(job.ns, job.keys, gpus_[gpu]->device());
  mu_.Lock();
  if (!placed.ok() && job.ticket == 0) {
    LOG(WARNING) << "placing " << job.keys.size() << " blocks on gpu " << gpus_[gpu]->device()
                 << ": " << placed.status().ToString();
  }
  if (job.ticket != 0 && !gpu_tickets_abandoned_.erase(job.ticket)) {
    gpu_outcomes_[job.ticket] = {placed.status(), placed.ok() ? *placed : 0};
    changed_.SignalAll();
  }
}

void TierManager::AbandonGpuPlacementLocked(int gpu, const GpuPlacement& job) {
  // Host copies of committed blocks are made even now: the flush at shutdown writes them down.
  if (job.fill_host) return FillHostCopiesLocked(gpu);
  if (job.ticket == 0 || gpu_tickets_abandoned_.erase(job.ticket)) return;
  gpu_outcomes_[job.ticket] = {Status::Aborted("daemon shutting down"), 0};
  changed_.SignalAll();
}

void TierManager::FillHostCopiesLocked(int g) {
  GpuTier& gpu = *gpus_[g];
  struct Fill {
    EntryId id;
    const uint8_t* src;  // the gpu copy
    uint8_t* dst;        // its host slot
    uint64_t size;
    uint64_t device_checksum;
  };
  std::vector<Fill> fills;
  for (EntryId id : std::exchange(gpu_fills_[g], {})) {
    const Entry& e = index_.at(id);  // busy (kBusyFromGpu): neither moved nor erased meanwhile
    fills.push_back({id, gpu.Data(GpuSlotLocked(id)),
                     host_.Data({index_.Mem(id).host_offset, e.size}), e.size,
                     gpu_checksums_.at(id)});
  }
  if (fills.empty()) return;
  ++io_in_flight_;  // a writer short of host room waits for this instead of failing
  mu_.Unlock();
  Status st = Status::OK();
  for (const Fill& f : fills) {
    st = gpu.copies().CopyAsync(f.dst, f.src, f.size, kernels::CopyDirection::kDeviceToHost,
                                nullptr);
    if (!st.ok()) break;
  }
  // Waited for even after a failed enqueue: no copy may still run into a slot freed below.
  const Status done = gpu.copies().Wait(nullptr);
  if (st.ok()) st = done;
  // Each host copy is checked against the device checksum the writer committed (and the GPU
  // confirmed over the gpu copy), and hashed for the readers of host, disk and the cluster.
  std::vector<bool> good(fills.size(), false);
  std::vector<uint64_t> sums(fills.size(), 0);
  for (size_t i = 0; st.ok() && i < fills.size(); ++i) {
    const Fill& f = fills[i];
    good[i] = kernels::DeviceChecksumCpu(f.dst, f.size) == f.device_checksum;
    if (good[i]) sums[i] = BlockChecksum(f.dst, f.size);
  }
  mu_.Lock();
  --io_in_flight_;
  for (size_t i = 0; i < fills.size(); ++i) {
    const EntryId id = fills[i].id;
    Entry& e = index_.at(id);
    e.busy &= static_cast<uint8_t>(~(kBusyPromoting | kBusyFromGpu));
    Status outcome = Status::OK();
    if (good[i]) {
      e.checksum = sums[i];
    } else {
      if (st.ok()) {
        ++checksum_failures_;
        outcome = Status::Corruption("its copy from gpu " + std::to_string(gpu.device()) +
                                     " does not match its device checksum");
      } else {
        outcome = st.WithContext("copying it down from gpu " + std::to_string(gpu.device()));
      }
      ++blocks_lost_;
      LOG(ERROR) << "dropping block " << e.key.ShortHex() << " of namespace " << e.ns
                 << ", put into gpu " << gpu.device() << ": " << outcome.ToString();
    }
    if (auto it = promotions_.find(id); it != promotions_.end()) {
      it->second->status = outcome;
      it->second->done = true;
      promotions_.erase(it);
    }
    if (!outcome.ok()) DropHostCopyLocked(id);  // its gpu copy with it
  }
  changed_.SignalAll();
  if (HostAboveHighWatermarkLocked()) mover_.WakeFlusher();
}

std::vector<GpuCopyInfo> TierManager::GpuCopies(NamespaceId ns,
                                                std::span<const BlockKey> keys) const {
  std::vector<GpuCopyInfo> out(keys.size());
  absl::ReaderMutexLock lock(&mu_);
  for (size_t i = 0; i < keys.size(); ++i) {
    const EntryId id = index_.Find(ns, keys[i]);
    if (id == kNoEntry) continue;
    const Entry& e = index_.at(id);
    auto dsum = gpu_checksums_.find(id);
    if (!e.In(Tier::kGpu) || dsum == gpu_checksums_.end()) continue;
    if (index_.Mem(id).lossy_encoding != 0)
      continue;  // approximate bytes: not offered as the block
    out[i] = {index_.Mem(id).gpu_device, e.size, dsum->second, ParentKeyLocked(id)};
  }
  return out;
}

uint32_t TierManager::DropDamagedGpuCopies(NamespaceId ns, std::span<const BlockKey> keys) {
  struct Suspect {
    EntryId id;
    GpuTier* gpu;
    MemorySlot slot;
    uint64_t dsum;
  };
  std::vector<Suspect> suspects;
  {
    absl::MutexLock lock(&mu_);
    for (const BlockKey& key : keys) {
      const EntryId id = FindCachedLocked(ns, key);
      if (id == kNoEntry) continue;
      Entry& e = index_.at(id);
      auto dsum = gpu_checksums_.find(id);
      GpuTier* gpu = e.In(Tier::kGpu) ? GpuOf(index_.Mem(id).gpu_device) : nullptr;
      if (gpu == nullptr || dsum == gpu_checksums_.end() || e.leases > 0 || e.busy != 0) continue;
      // Busy while checked: it is neither moved nor dropped under the check.
      e.busy |= kBusyToGpu;
      suspects.push_back({id, gpu, GpuSlotLocked(id), dsum->second});
    }
  }
  // Checked outside the mutex, each on its own GPU's copy engine.
  std::vector<bool> bad(suspects.size(), false);
  for (size_t i = 0; i < suspects.size(); ++i) {
    const kernels::ByteRange range{suspects[i].gpu->Data(suspects[i].slot),
                                   suspects[i].slot.length};
    Result<std::vector<uint64_t>> now =
        suspects[i].gpu->copies().DeviceChecksums(&range, 1, nullptr);
    // A check that cannot run counts as a failed one: the copy cannot be vouched for.
    bad[i] = !now.ok() || (*now)[0] != suspects[i].dsum;
  }
  absl::MutexLock lock(&mu_);
  uint32_t dropped = 0;
  for (size_t i = 0; i < suspects.size(); ++i) {
    Entry& e = index_.at(suspects[i].id);
    e.busy &= static_cast<uint8_t>(~kBusyToGpu);
    // Leased meanwhile (a get may lease the gpu copy of a block being checked): a leased copy
    // is never dropped; its reader checks it by its device checksum and reports it again.
    if (!bad[i] || !e.In(Tier::kGpu) || e.leases > 0) continue;
    ++checksum_failures_;
    DropGpuCopyLocked(suspects[i].id);
    ++dropped;
  }
  changed_.SignalAll();
  return dropped;
}

Result<SegmentLocation> TierManager::LocateGpu(int device, uint64_t gpu_offset) const {
  const GpuTier* gpu = GpuOf(device);
  if (gpu == nullptr)
    return Status::NotFound("no gpu tier on CUDA device " + std::to_string(device));
  return gpu->Locate(gpu_offset);
}

Result<int> TierManager::ExportGpuSegment(NamespaceId ns, int device, uint32_t segment,
                                          uint32_t generation) {
  GpuTier* gpu = GpuOf(device);
  if (gpu == nullptr)
    return Status::NotFound("no gpu tier on CUDA device " + std::to_string(device));
  return gpu->ExportSegment(segment, generation, ns, /*writable=*/false);
}

std::optional<std::pair<int, MemorySlot>> TierManager::GpuCopyForTest(NamespaceId ns,
                                                                      const BlockKey& key) const {
  absl::MutexLock lock(&mu_);
  const EntryId id = FindCachedLocked(ns, key);
  if (id == kNoEntry || !index_.at(id).In(Tier::kGpu)) return std::nullopt;
  return std::make_pair(int{index_.Mem(id).gpu_device}, GpuSlotLocked(id));
}

}  // namespace kvpool::tiers
