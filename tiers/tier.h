#pragma once
// The tiers of the tier manager's stack (DESIGN.md section 3), one interface per kind:
//
//   StorageTier  what every tier is: its place in the stack (kvpool::Tier).
//   MemoryTier   byte-addressable memory cut into segments, a segment per namespace at a time
//                (the host arena, tiers/host_tier.h; GPU memory next): a block lives in a slot
//                the tier manager allocates, readers lease it in place, a transport reads or
//                writes it directly, and a same-node client maps a segment by file descriptor.
//   BlockStore   blocks kept by key (the disk tier over RocksDB, tiers/disk_tier.h; the remote
//                tier next), written in atomic batches and read into a memory slot. A read is
//                started and handed back as a PendingRead that may complete later, as RocksDB's
//                SecondaryCache hands back lookup handles; the tier manager waits for it on its
//                prefetcher threads or a reader's, never under its mutex.
//
// TierStack orders them, fastest first. The tier manager places blocks in, and serves them from,
// the stack's host memory tier, and writes them down to its block store. Above host there may be
// one gpu tier per GPU (tiers/gpu_tier.h), which holds copies of host blocks moved there on a
// hint (TierManager::PromoteToGpu).
//
// Thread safety: every implementation's methods may be called from any thread.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <kvpool/block_key.h>
#include <kvpool/tier.h>

#include "common/namespace_id.h"
#include "common/status.h"
#include "kernels/block_layout.h"

namespace kvpool::tiers {

class GpuTier;

class StorageTier {
 public:
  virtual ~StorageTier() = default;
  // Where it sits in the stack.
  virtual Tier id() const = 0;
};

// ---------------------------------------------------------------------------------------------
// Memory tiers

// Where a block's bytes sit in a memory tier.
struct MemorySlot {
  uint64_t offset = 0;  // from the start of the tier's memory, page aligned
  uint64_t length = 0;  // the block's bytes (the allocation is rounded up to pages)
  bool valid() const { return length > 0; }
};

// Where a slot sits, as a client maps it: segment, its current generation, and the offset inside
// the segment.
struct SegmentLocation {
  uint32_t segment = 0;
  uint32_t generation = 0;
  uint64_t offset = 0;
};

struct MemoryTierStats {
  uint64_t capacity_bytes = 0;
  uint64_t allocated_bytes = 0;  // pages handed out
  uint64_t payload_bytes = 0;    // bytes of the blocks in them
  uint64_t blocks = 0;
  uint64_t free_segments = 0;    // clean and vacant ones (tiers/segment_pages.h)
  uint64_t vacant_segments = 0;  // empty, still holding their last namespace's memory
  uint64_t segments = 0;
  uint64_t largest_free_run = 0;  // bytes, in any single segment (free segments included)
  // 1 - largest_free_run / min(free bytes, segment size): 0 when the largest possible block (or
  // everything free) fits in one run, near 1 when free space is scattered pages; 0 when full.
  double fragmentation = 0;
  bool locked = false;  // pinned (mlocked / registered) as configured
  // Segments given fresh memory to change namespace, and of those, how many took a standby
  // segment's memory made ahead (HostTierOptions::standby_segments; host only).
  uint64_t renewals = 0;
  uint64_t renewals_from_standby = 0;
  uint64_t standby_ready = 0;  // standby segments made and waiting to be taken (host only)
};

class MemoryTier : public StorageTier {
 public:
  // The allocation unit: every slot is whole pages, page aligned.
  static constexpr uint64_t kPageBytes = 4096;

  // Bytes of memory it holds blocks in.
  virtual uint64_t capacity_bytes() const = 0;
  // `length` bytes for a block of namespace `ns` in one of its segments. InvalidArgument for 0 or
  // more than a segment; ResourceExhausted when nothing fits (the caller evicts and retries).
  virtual Result<MemorySlot> Allocate(NamespaceId ns, uint64_t length) = 0;
  // Allocate, only when it would not wait: Unavailable where room needs a segment renewed
  // (another namespace's vacant segment given fresh memory: tens of milliseconds) or one being
  // renewed already. For a caller that must not block (an I/O thread).
  virtual Result<MemorySlot> TryAllocate(NamespaceId ns, uint64_t length) = 0;
  // A renewal (tens of milliseconds) for a caller that saw TryAllocate answer Unavailable and
  // would not hold its own locks through it, in two steps. TakeVacant, under the caller's lock,
  // takes the longest-vacant segment out of every pool: owned by nobody, so its old namespace
  // cannot take it back meanwhile; nullopt when none is vacant. RenewTaken, without the caller's
  // lock, gives it fresh memory, a clean segment for the next namespace that needs one: OK, or
  // the renewal's error (counted in failed_renewals).
  virtual std::optional<uint32_t> TakeVacant() = 0;
  virtual Status RenewTaken(uint32_t segment) = 0;
  // Waits until no renewal is under way (the host tier's spare thread's, or another caller's).
  virtual void WaitForRenewals() = 0;
  // `length` bytes for a block of `ns` in one of the segments it holds blocks in already, other
  // than segment `avoid`: never another segment, never a wait. ResourceExhausted when none has
  // room. (Moving a block out of segment `avoid`, so that it empties.)
  virtual Result<MemorySlot> AllocateBeside(NamespaceId ns, uint64_t length, uint32_t avoid) = 0;
  // While `draining`, no allocation takes pages of segment `segment` (its owner's puts included):
  // a caller emptying it without its own lock held keeps it from filling again meanwhile.
  virtual void SetDraining(uint32_t segment, bool draining) = 0;
  // Returns a slot's pages. The slot must come from Allocate and not be freed twice.
  virtual void Free(const MemorySlot& slot) = 0;
  // The slot's bytes, addressable by this process (device memory for a GPU tier).
  virtual uint8_t* Data(const MemorySlot& slot) const = 0;
  virtual uint64_t segment_bytes() const = 0;
  // The largest block it can hold.
  virtual uint64_t max_block_bytes() const = 0;
  // Pages handed out, in bytes; cheap.
  virtual uint64_t allocated_bytes() const = 0;
  virtual uint32_t segment_count() const = 0;
  // Pages of segment `segment` handed out (to blocks and reservations), in bytes.
  virtual uint64_t SegmentUsedBytes(uint32_t segment) const = 0;
  // The namespace segment `segment` belongs to (kNoNamespace: clean).
  virtual NamespaceId SegmentOwner(uint32_t segment) const = 0;
  // Each segment's owner and bytes handed out, in segment order, under one hold of the tier's
  // lock.
  struct SegmentUse {
    NamespaceId owner = kNoNamespace;
    uint64_t used_bytes = 0;
    bool draining = false;  // SetDraining: its free pages are not to be had
  };
  virtual std::vector<SegmentUse> SegmentUses() const = 0;
  // A namespace's quota (tiers/policy.h): at most `max_segments` segments of its own (0: no
  // limit); Allocate then refuses to take another one for it (ResourceExhausted; the caller
  // evicts that namespace's own blocks). Segments it holds beyond a lowered limit are kept until
  // they empty.
  virtual void SetSegmentLimit(NamespaceId ns, uint32_t max_segments) = 0;
  // The limit of every namespace that has none of its own (the default policy's quota; 0: none).
  virtual void SetDefaultSegmentLimit(uint32_t max_segments) = 0;
  // Segments `ns` holds now, and whether it may take no more.
  virtual uint32_t SegmentsOf(NamespaceId ns) const = 0;
  virtual bool AtSegmentLimit(NamespaceId ns) const = 0;
  virtual SegmentLocation Locate(uint64_t offset) const = 0;
  // A new file descriptor a same-node client maps segment `index` with (the caller closes it):
  // read-only unless `writable`. PermissionDenied unless `ns` owns the segment; NotFound when
  // its generation is no longer `generation`.
  virtual Result<int> ExportSegment(uint32_t index, uint32_t generation, NamespaceId ns,
                                    bool writable) = 0;
  // Walks the tier's bookkeeping: not for hot paths.
  virtual MemoryTierStats GetStats() const = 0;
};

// What a block of `size` bytes takes of a memory tier: whole pages.
inline uint64_t PagesBytes(uint64_t size) {
  return (size + MemoryTier::kPageBytes - 1) / MemoryTier::kPageBytes * MemoryTier::kPageBytes;
}

// ---------------------------------------------------------------------------------------------
// Block stores

struct DiskBlockMeta {
  uint64_t size = 0;      // the block's bytes as put
  uint64_t checksum = 0;  // xxh3-64 of those
  BlockKey parent;        // zero when the block starts a chain or its parent is unknown
  // How the stored body is encoded (kernels::Encoding; 0: raw, the bytes as put) and, when it is
  // encoded, its length and checksum. See tiers/demotion_encoding.h.
  uint8_t encoding = 0;
  uint64_t stored_size = 0;
  uint64_t stored_checksum = 0;
  kernels::BlockLayout layout;  // when encoded: what the body decodes with (its encoding too)

  // The body's length and checksum, as stored.
  uint64_t body_size() const { return encoding != 0 ? stored_size : size; }
  uint64_t body_checksum() const { return encoding != 0 ? stored_checksum : checksum; }
};

struct DiskWrite {
  NamespaceId ns = 0;
  BlockKey key;
  DiskBlockMeta meta;
  const uint8_t* data = nullptr;  // meta.body_size() bytes
};

// A read a block store started: its bytes land in the caller's buffer once it is done.
class PendingRead {
 public:
  virtual ~PendingRead() = default;
  virtual bool IsReady() const = 0;
  // Waits until the read is done: OK, NotFound, Corruption (failed verification), IoError.
  virtual Status Wait() = 0;
};

// A read that was done when it was handed back.
class ReadyRead final : public PendingRead {
 public:
  explicit ReadyRead(Status status) : status_(std::move(status)) {}
  bool IsReady() const override { return true; }
  Status Wait() override { return status_; }

 private:
  Status status_;
};

// A part of a block store's meta records: the keys in [lower, upper) in the store's own key
// order; an empty bound is open (MetaRange{} is every record).
struct MetaRange {
  std::string lower;
  std::string upper;
};

// The tier manager keeps a block store's budget (TierManagerOptions::disk_capacity_bytes) and
// accounts its bytes from the block index; the store only keeps the blocks.
class BlockStore : public StorageTier {
 public:
  // Writes blocks atomically (all or none); `sync`: durable before returning. IoError or
  // ResourceExhausted (the device is full).
  virtual Status Write(std::span<const DiskWrite> blocks, bool sync) = 0;
  // Starts reading a block's stored body into `dst` (expected.body_size() bytes), verified
  // against `expected`.
  virtual std::unique_ptr<PendingRead> StartRead(NamespaceId ns, const BlockKey& key,
                                                 const DiskBlockMeta& expected,
                                                 uint8_t* dst) const = 0;
  // StartRead, then Wait.
  Status Read(NamespaceId ns, const BlockKey& key, const DiskBlockMeta& expected,
              uint8_t* dst) const {
    return StartRead(ns, key, expected, dst)->Wait();
  }
  // A block's meta record. NotFound, Corruption (undecodable), IoError.
  virtual Result<DiskBlockMeta> ReadMeta(NamespaceId ns, const BlockKey& key) const = 0;
  // Deletes blocks atomically.
  virtual Status Delete(std::span<const std::pair<NamespaceId, BlockKey>> blocks) = 0;
  // Visits the meta records of `range` without reading bodies, in the store's key order; an
  // undecodable record's raw key goes to `bad` (DeleteRaw removes it). Scans of different ranges
  // may run concurrently.
  virtual Status ForEachMeta(
      const MetaRange& range,
      const std::function<void(NamespaceId, const BlockKey&, const DiskBlockMeta&)>& visit,
      const std::function<void(std::string_view raw_key)>& bad) const = 0;
  // The same over every record.
  Status ForEachMeta(
      const std::function<void(NamespaceId, const BlockKey&, const DiskBlockMeta&)>& visit,
      const std::function<void(std::string_view raw_key)>& bad) const {
    return ForEachMeta(MetaRange{}, visit, bad);
  }
  // Cuts the meta records into at most `parts` ranges that together hold every record once,
  // of about equal size by the store's own estimate (so a start can scan them in parallel).
  // At least one range.
  virtual std::vector<MetaRange> SplitMeta(int parts) const = 0;
  // About how many meta records there are (to size the index before a rebuild).
  virtual uint64_t EstimateMetaRecords() const = 0;
  virtual Status DeleteRaw(std::string_view raw_key) = 0;
  // Bytes the store takes on its device (files, obsolete ones until deleted); approximate.
  virtual uint64_t bytes_on_device() const = 0;
  // Bytes its device has left; nullopt when it cannot tell.
  virtual std::optional<uint64_t> free_bytes() const = 0;
  // Memory the store holds for itself (caches, write buffers), in the process's resident memory.
  virtual uint64_t memory_bytes() const = 0;
};

// ---------------------------------------------------------------------------------------------
// The stack

class TierStack {
 public:
  // `tiers`, fastest first: memory tiers, then block stores, each kind once except gpu (one
  // GpuTier per device, each device once). The tier manager needs a host memory tier and a disk
  // block store; InvalidArgument for any other order, and Unimplemented for a remote tier (it
  // comes with its own change).
  static Result<TierStack> Create(std::vector<StorageTier*> tiers);

  // The memory tier blocks land in and are served from.
  MemoryTier& host() const { return *host_; }
  // The block store below it.
  BlockStore& disk() const { return *disk_; }
  // The gpu tiers, in the order given (none without GPUs).
  std::span<GpuTier* const> gpus() const { return gpus_; }
  // Every tier, fastest first.
  std::span<StorageTier* const> tiers() const { return tiers_; }

 private:
  std::vector<StorageTier*> tiers_;
  std::vector<GpuTier*> gpus_;
  MemoryTier* host_ = nullptr;
  BlockStore* disk_ = nullptr;
};

}  // namespace kvpool::tiers
