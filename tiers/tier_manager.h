#pragma once
// TierManager: placement, promotion, demotion and eviction of blocks across the host and disk
// tiers, over the block index it owns.
//
// Life of a block: Reserve (a host slot, not yet visible) -> the transport fills the slot ->
// Commit (checksum verified, the block becomes visible in host) -> demoted to disk by the
// flusher when host runs past its high watermark (or at commit for write-through namespaces,
// or when a session pins it), if the namespace's disk admission takes it (else dropped) ->
// promoted back to host on a disk hit (and read ahead along its chain) -> dropped from disk,
// tail first, when disk is full, unless a session pins it. Which candidate goes first is the
// namespace's eviction order (tiers/eviction_pools.h); the rest of its composition is in
// tiers/policy.h.
//
// GPU tiers (one per device, above host) hold copies of host blocks, made on a hint
// (PromoteToGpu) or put there straight from a writer's device memory (Reserve with a gpu
// device): a gpu copy exists only while its host copy does, so dropping a host copy drops its
// gpu copy, and making room in a gpu tier drops gpu copies alone, tail first. A block put into a
// gpu tier is published at once with a host slot whose bytes that GPU's copy worker then copies
// down (D2H) and verifies; until they are there its readers wait, as for a promotion.
//
// Readers hold leases: a leased host copy is never freed or moved. A get that finds a block
// mid-promotion waits for that promotion; it never reads the block twice. Every read from disk
// is verified; a block that fails is dropped, logged and reported as a miss.
//
// Parts: the index (tiers/block_index.h) and eviction pools, leases and reservations
// (tiers/leases.h), the per-namespace policy (tiers/policy.h); the mover (tiers/mover.h), whose
// flusher and promoters run this class's rounds and promotions in the background; and the copy
// of bytes between tiers, encoded or not (tiers/tier_copy.h). This class decides what moves
// where and keeps the books.
//
// Threads: the mover's flusher (ThreadRole::kTierFlusher) and `promotion_threads` promoters
// (ThreadRole::kPrefetcher), started by Start() and joined by Shutdown().
// Thread safety: every public method may be called from any thread; one mutex guards the index
// and all bookkeeping (lookups, Where and CountCached find their keys under a shared hold), and no
// disk I/O or block copy runs under it (RocksDB deletes of dropped blocks included:
// DeleteDroppedLocked), except the index rebuild's at start.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <kvpool/block_key.h>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/gpu_reach.h"
#include "common/status.h"
#include "tiers/block_index.h"
#include "tiers/disk_tier.h"
#include "tiers/eviction_pools.h"
#include "tiers/gpu_tier.h"
#include "tiers/host_tier.h"
#include "tiers/leases.h"
#include "tiers/mover.h"
#include "tiers/policy.h"
#include "tiers/segment_blocks.h"
#include "tiers/tier.h"
#include "tiers/tier_copy.h"

namespace kvpool::tiers {

struct TierManagerOptions {
  // Disk tier budget for block payloads. Default: 64 GiB.
  uint64_t disk_capacity_bytes = 64ull << 30;
  // The flusher starts demoting when host allocation passes this share... Default: 0.90.
  double host_high_watermark = 0.90;
  // ...and stops when it is back under this share. Default: 0.80.
  double host_low_watermark = 0.80;
  // Threads reading disk blocks into host. Default: 2.
  int promotion_threads = 2;
  // A reservation not committed within this time is reclaimed. Default: 30 s.
  std::chrono::milliseconds reservation_timeout{30000};
  // In a namespace that writes to disk on commit, how long a Reserve that may wait waits for
  // another writer's put of the same block, or for its write to disk, before it answers
  // IN_PROGRESS or Unavailable (see Reserve). Default: 2 s.
  std::chrono::milliseconds in_flight_put_wait{2000};
  // Bytes the flusher writes in one RocksDB batch. Default: 64 MiB.
  uint64_t demotion_batch_bytes = 64ull << 20;
  // Time for leases, reservation expiry and the flusher's rounds; tests pass a ManualClock.
  // Not owned; must outlive the manager. Default: RealClock().
  Clock* clock = nullptr;
  // Write host-only blocks to disk at Shutdown (so a restart finds them). Default: true.
  bool flush_on_shutdown = true;
  // Bytes one Acquire may read straight from disk into memory when host cannot take the blocks;
  // past it blocks are deferred (ResourceExhausted). Default: 256 MiB.
  uint64_t direct_read_budget_bytes = 256ull << 20;
  // Tests only: called while MoveHostSegmentLocked copies blocks without the lock.
  std::function<void()> during_host_move_for_test;
};

// One key's answer to a lookup.
struct LookupResult {
  uint32_t hit_blocks = 0;  // longest cached prefix
  std::vector<Tier> tiers;  // fastest tier of each hit block
  uint32_t promotions_started = 0;
};

// A block handed to a reader. Either a lease on the host copy (data points into the arena at
// `arena_offset` and stays valid until the lease is released or expires) or bytes read straight
// from disk (owned; lease_id 0).
struct BlockRead {
  Status status;            // OK, NotFound for a miss, or an error for this block only
  Tier from = Tier::kNone;  // where the block was when asked for
  const uint8_t* data = nullptr;
  uint64_t size = 0;
  uint64_t checksum = 0;
  uint64_t lease_id = 0;
  uint64_t arena_offset = 0;
  // Non-zero: the bytes were decoded from a copy stored in this kernels::Encoding (the
  // namespace's encoding on demotion): approximately, not exactly, what was put.
  uint8_t lossy_encoding = 0;
  // Non-zero (only when the read asked to keep encodings): `data` holds the disk copy as stored,
  // in this kernels::Encoding; `layout` decodes it (kernels::DequantizeBlocksCpu) to the block as
  // put, approximately. `size` and `checksum` are those of the encoded bytes.
  uint8_t encoding = 0;
  kernels::BlockLayout layout;
  std::unique_ptr<uint8_t[]> owned;
  // from == kGpu (only for a reader that asked for a device): the lease also holds the block's
  // copy in the gpu tier of CUDA device `gpu_device` (the reader's own or a peer of it), at
  // `gpu_offset` there. `data` and
  // `arena_offset` still name the host copy.
  int gpu_device = -1;
  uint64_t gpu_offset = 0;
  // The gpu copy's device checksum (kernels/device_checksum.h), for a reader that copies it
  // device to device and checks its destination on its GPU.
  uint64_t device_checksum = 0;
};

// A block's copy in a gpu tier (TierManager::GpuCopies).
struct GpuCopyInfo {
  int device = -1;  // the CUDA device of the gpu tier holding it; -1: none
  uint64_t size = 0;
  uint64_t device_checksum = 0;  // kernels/device_checksum.h
  BlockKey parent;               // as TierManager::Parents
};

enum class ReserveState : uint8_t { kReserved, kPresent, kInProgress, kRefused };

struct ReserveOutcome {
  ReserveState state = ReserveState::kRefused;
  uint64_t reservation_id = 0;
  uint64_t arena_offset = 0;  // where a reserved slot is (for writers that map the arena)
  Status status;              // why, when refused
  // >= 0 (only where Reserve was asked for gpu slots): the writer writes the block into the gpu
  // tier of this CUDA device, at `gpu_offset` there, and commits it with its device checksum;
  // `arena_offset` is then the daemon's, for the host copy it makes.
  int gpu_device = -1;
  uint64_t gpu_offset = 0;
};

// Where a reservation's bytes go: the transport writes exactly `size` bytes at `data`.
struct ReservationTarget {
  uint8_t* data = nullptr;
  uint64_t size = 0;
  uint64_t offset = 0;  // in the host arena
  BlockKey key;         // the block it is for
  BlockKey parent;
};

struct TierCounters {
  uint64_t hits = 0;
  uint64_t promotions = 0;
  uint64_t demotions = 0;
  uint64_t evictions = 0;
};

struct GpuTierUsage {
  int device = 0;
  MemoryTierStats memory;
  uint64_t blocks = 0;
  uint64_t hits = 0;       // its copies leased to readers on a GPU
  uint64_t peer_hits = 0;  // of those, to readers on another GPU (peer to peer)
};

struct TierManagerStats {
  HostTierStats host;
  std::vector<GpuTierUsage> gpus;  // one per gpu tier
  TierCounters gpu_counters;       // all gpu tiers: promotions into them, evictions from them
  uint64_t host_blocks = 0;
  uint64_t disk_capacity_bytes = 0;
  uint64_t disk_used_bytes = 0;
  uint64_t disk_blocks = 0;
  uint64_t disk_bytes_on_device = 0;    // RocksDB's SST and blob files
  uint64_t disk_device_room_bytes = 0;  // what disk may still add to its device (DiskDeviceRoom)
  uint64_t disk_memory_bytes = 0;       // what the disk tier's store holds in memory (RocksDB)
  TierCounters host_counters;
  TierCounters disk_counters;
  uint64_t index_entries = 0;
  uint64_t index_bytes = 0;
  // What Recover found and how long it took (reading the meta records and building the index).
  uint64_t index_rebuild_blocks = 0;
  double index_rebuild_seconds = 0;
  uint64_t leases_active = 0;
  uint64_t reservations_active = 0;
  uint64_t prefetches_issued = 0;
  uint64_t prefetches_useful = 0;
  uint64_t checksum_failures = 0;
  uint64_t disk_write_errors = 0;
  uint64_t disk_deletes_pending =
      0;                             // dropped records not yet deleted from disk (a stall grows it)
  uint64_t disk_delete_errors = 0;   // failed deletes (their records come back after a restart)
  uint64_t blocks_lost = 0;          // host-only blocks dropped because disk could not take them
  uint64_t blocks_not_admitted = 0;  // host-only blocks dropped because disk admission said no
  // Host blocks moved to another segment of their namespace, to empty one for a namespace that
  // needed a segment without evicting anything.
  uint64_t host_blocks_moved = 0;
  uint64_t blocks_over_quota = 0;  // copies a namespace gave up (or could not write) over quota
  uint64_t read_aheads = 0;        // promotions started by read-ahead along a chain
  uint64_t encoded_writes = 0;     // blocks written to disk encoded (tiers/demotion_encoding.h)
  uint64_t gpu_hints_dropped = 0;  // gpu placement hints dropped: the GPU's worker was behind
  uint64_t gpu_puts = 0;           // blocks put straight into a gpu tier (device to device)
};

// How far ahead of the key it is looking up a loop over many keys prefetches the index's hash
// slots (BlockIndex::Prefetch): at 10^6 blocks and more the index is far larger than the CPU's
// caches, and those misses of consecutive keys then overlap instead of adding up (the entry a
// hit compares is not prefetched).
inline constexpr size_t kIndexPrefetchAhead = 8;

// What kvpool leaves free on the disk tier's device for RocksDB to flush, compact and delete.
inline constexpr uint64_t kDiskDeviceReserveBytes = 64ull << 20;
// The bytes the disk tier may still add to its device: what the device has free (nullopt: it
// cannot tell, no bound) less kDiskDeviceReserveBytes.
uint64_t DiskDeviceRoom(std::optional<uint64_t> free);

struct EvictOutcome {
  uint64_t evicted = 0;
  uint64_t skipped = 0;
};

class TierManager {
 public:
  // Runs `stack` (tiers/tier.h): blocks land in and are served from its host memory tier and are
  // written down to its disk block store. The tiers must outlive the manager.
  TierManager(const TierManagerOptions& options, TierStack stack);
  ~TierManager();  // calls Shutdown()

  // Rebuilds the index from the disk tier's meta records (no block body is read) and trims
  // disk to its capacity. Call once, before Start. An error (a record the store could not read)
  // may leave the index partly built: the manager must then not be started (kvpoold stops).
  Status Recover();
  void Start();
  // Stops the threads; with flush_on_shutdown writes host-only blocks to disk first.
  void Shutdown();

  // A namespace's strategies (tiers/policy.h). Its blocks stay: a new eviction order takes over
  // its candidates. InvalidArgument for an eviction order no registry knows.
  Status SetNamespacePolicy(NamespaceId ns, NamespacePolicy policy);
  // Back to the default composition.
  void ClearNamespacePolicy(NamespaceId ns);
  // The composition for namespaces without their own. Default: DefaultNamespacePolicy().
  Status SetDefaultPolicy(NamespacePolicy policy);
  // The composition `ns` runs with, its eviction order named.
  NamespacePolicy PolicyOf(NamespaceId ns) const;

  // Longest cached prefix of `chain`; with `prefetch`, starts promoting its disk hits.
  LookupResult Lookup(NamespaceId ns, std::span<const BlockKey> chain, bool prefetch);
  // Leases or reads each block. Waits for promotions in flight. Each lease belongs to `owner`
  // (e.g. a connection) and expires by itself after `ttl` (zero: only Release ends it). With
  // `keep_encoding`, a block only on disk whose copy there is encoded is read as stored (not
  // promoted, not decoded: BlockRead::encoding says so), for a reader that decodes it itself.
  // A block with a copy in a gpu tier `gpu` reaches is leased there too (BlockRead::from ==
  // kGpu), for a reader that copies device to device.
  std::vector<BlockRead> Acquire(NamespaceId ns, std::span<const BlockKey> keys, uint64_t owner = 0,
                                 std::chrono::milliseconds ttl = std::chrono::milliseconds(0),
                                 bool keep_encoding = false, GpuReach gpu = {});
  // Acquire, only when it would not wait: when every cached block of `keys` is in host memory
  // (a miss is answered as NotFound), all are leased there at once; otherwise nullopt, and
  // nothing was done. For a caller that must not block (an I/O thread).
  std::optional<std::vector<BlockRead>> TryAcquireInHost(
      NamespaceId ns, std::span<const BlockKey> keys, uint64_t owner = 0,
      std::chrono::milliseconds ttl = std::chrono::milliseconds(0), GpuReach gpu = {});
  // Ends a read's lease (no-op for disk reads and released leases).
  void Release(BlockRead& read);
  // Ends `owner`'s leases among `lease_ids`; unknown ids (expired, or another owner's) are
  // ignored.
  void ReleaseLeases(uint64_t owner, std::span<const uint64_t> lease_ids);
  // Ends every lease of `owner` (its connection closed).
  void ReleaseOwner(uint64_t owner);
  // Where an arena offset sits for a client mapping, and the descriptor to map it (see
  // HostTier::ExportSegment).
  SegmentLocation Locate(uint64_t arena_offset) const { return host_.Locate(arena_offset); }
  Result<int> ExportSegment(NamespaceId ns, uint32_t segment, uint32_t generation, bool writable) {
    return host_.ExportSegment(segment, generation, ns, writable);
  }
  uint64_t segment_bytes() const { return host_.segment_bytes(); }
  // The gpu tiers, and the same for their segments as above (NotFound for a device without one).
  std::span<GpuTier* const> gpu_tiers() const { return gpus_; }
  Result<SegmentLocation> LocateGpu(int device, uint64_t gpu_offset) const;
  Result<int> ExportGpuSegment(NamespaceId ns, int device, uint32_t segment, uint32_t generation);
  // Starts promoting disk-only blocks of `keys` toward host; returns how many were started.
  uint32_t Prefetch(NamespaceId ns, std::span<const BlockKey> keys);
  // Copies the blocks of `keys` that are in host into the gpu tier of CUDA device `device` (a
  // reader will want them there), making room there tail first; returns how many gained a gpu
  // copy. A key not in host (prefetch it first), already in gpu or busy is skipped. Each copy is
  // verified at its source once done. InvalidArgument when no gpu tier runs on `device`; a failed
  // copy fails the call after undoing what it had placed.
  Result<uint32_t> PromoteToGpu(NamespaceId ns, std::span<const BlockKey> keys, int device);
  // The same on that GPU's copy worker (the one thread that drives its copies), after reading
  // the blocks that are only on disk up to host. With `wait`, returns PromoteToGpu's answer once
  // it ran, or DeadlineExceeded after `wait_limit` (the placement goes on); without, 0 at once
  // (the placement is queued: a put's or a session load's hint; ResourceExhausted when that GPU
  // has too many queued). InvalidArgument when no gpu tier runs on `device`; Unavailable while
  // stopping, Aborted when the manager stopped before the placement ran.
  Result<uint32_t> PlaceOnGpu(NamespaceId ns, std::span<const BlockKey> keys, int device, bool wait,
                              absl::Duration wait_limit = absl::Seconds(5));
  // A reader found the gpu copies of `keys` damaged: each one not leased or busy is checked
  // again on its GPU against its device checksum and dropped when it fails (tail first does not
  // hold a bad copy back; its host copy serves). Returns how many were dropped.
  uint32_t DropDamagedGpuCopies(NamespaceId ns, std::span<const BlockKey> keys);
  // Which blocks of `keys` have a gpu copy, and where (GpuCopyInfo::device -1: none). Marks
  // nothing used and leases nothing: for a peer asking what it could receive device to device.
  std::vector<GpuCopyInfo> GpuCopies(NamespaceId ns, std::span<const BlockKey> keys) const;

  // Put-if-absent, phase one: a host slot for each absent key, owned by `owner` (e.g. a
  // connection) until committed, aborted or expired. Making room may demote blocks (a disk
  // write) and wait for a disk write or read in flight to end; with `ask.may_wait` false it does
  // neither, and a block that would need either is refused with Unavailable. With
  // `ask.gpu_device` >= 0 (a writer whose bytes are in device memory), each block also gets a
  // slot in that device's gpu tier where it has room (dropping cold gpu copies for it) and the
  // namespace does not write to disk on commit (ReserveOutcome::gpu_device says which did);
  // InvalidArgument for a device without a gpu tier.
  //
  // For a durable ask (`ask.durable`) in a namespace that writes to disk on commit, kPresent
  // means on disk: a block cached without a disk copy (its write-through still running, or
  // failed while a reader held it) is waited for, or written down here, first; the write's
  // failure is the block's status. A block another writer has reserved is waited for as well
  // (options().in_flight_put_wait at most, once per call) when `owner` holds no reservation, so
  // no two writers wait for each other; its outcome then answers (kPresent, or a slot of its
  // own when that writer gave up). Otherwise it is kInProgress, as in any namespace. With
  // `ask.may_wait` false, a block that would be waited for is refused with Unavailable. A copy
  // of a block durable elsewhere (`ask.durable` false: a fetched block, a replica) never waits
  // for either: its sender's deadline is short, and its durability is not this put's to give.
  std::vector<ReserveOutcome> Reserve(NamespaceId ns, uint64_t owner,
                                      std::span<const PutRequestItem> items, ReserveAsk ask = {});
  // Reserve, only when it would not wait: when every block can have a slot without a disk
  // write, a wait or a segment renewal, the answer of Reserve; otherwise nullopt, and nothing is
  // reserved. What it did on the way stands, as the Reserve that follows would do it too: blocks
  // already cached were touched, and host copies were evicted for room (copies on disk already,
  // and those of namespaces whose disk does not admit them, which leave the cache). For a caller
  // that must not block (an I/O thread).
  std::optional<std::vector<ReserveOutcome>> TryReserve(NamespaceId ns, uint64_t owner,
                                                        std::span<const PutRequestItem> items,
                                                        bool durable = true);
  // The bytes of a reservation, for the transport to fill. NotFound if unknown, expired or
  // owned by someone else. From the first call on the reservation no longer expires: only
  // Commit, Abort or AbortOwner (which the owner must not call while it still writes) free it.
  Result<ReservationTarget> TargetOf(uint64_t owner, uint64_t reservation_id);
  // Phase two: publishes the block. Without `checksum`, first verifies the slot against the
  // checksum given at reserve time: Corruption when they differ (the slot is reclaimed). With
  // `checksum` (a writer that copied into the slot itself and hashed while it copied), that
  // checksum replaces the reserve-time one and is stored as given, the slot not read again:
  // readers verify (see tier_manager_writes.cc).
  // A reservation with a gpu slot committed here is an ordinary one: its gpu slot is freed and
  // its host slot must hold the bytes.
  Status Commit(uint64_t owner, uint64_t reservation_id,
                std::optional<uint64_t> checksum = std::nullopt);
  // Phase two for reservations with gpu slots, each with the device checksum
  // (kernels/device_checksum.h) of what its writer put there. Each GPU checks its slots (one
  // kernel launch for all of them): Corruption, the slots reclaimed, where a slot differs. Each
  // block is then cached in gpu and host at once, and the GPU's copy worker copies it down into
  // its host slot, checks it there against the device checksum and takes its xxh3 (a copy that
  // fails drops the block); readers of host wait for that. One status per reservation: NotFound
  // as Commit, InvalidArgument (the reservation aborted) for one without a gpu slot.
  std::vector<Status> CommitToGpu(uint64_t owner, std::span<const uint64_t> ids,
                                  std::span<const uint64_t> device_checksums);
  // Commits `ids` with the writer's own checksums (as Commit with `checksum`), under one hold of
  // the lock, only when it would not wait: nullopt, with nothing done, when a namespace of theirs
  // writes to disk on commit. Otherwise each one's status: NotFound for a reservation unknown to
  // `owner`, InvalidArgument (and the reservation aborted) where `sizes` does not match it.
  std::optional<std::vector<Status>> TryCommit(uint64_t owner, std::span<const uint64_t> ids,
                                               std::span<const uint64_t> sizes,
                                               std::span<const uint64_t> checksums);
  void Abort(uint64_t owner, uint64_t reservation_id);
  // The parent that reservation's block is linked under once committed, for a writer that learns
  // it only with the bytes (a fetch from a peer daemon, which names it beside each block).
  // Nothing when the reservation is not `owner`'s.
  void SetReservedParent(uint64_t owner, uint64_t reservation_id, const BlockKey& parent);
  // Links each (key, parent) of `blocks` whose block is in the index without a parent link under
  // that parent, where the parent is in the index now (a block committed before its parent was,
  // as a fetch that received a chain out of order commits it, is stored without the link).
  // Skips a link that would close a loop (BlockIndex::WouldLoop).
  void LinkUnderParents(NamespaceId ns, std::span<const std::pair<BlockKey, BlockKey>> blocks);
  // Whether `owner` holds an open reservation in host segment `segment` (a writable mapping of
  // a segment is given only for that).
  bool OwnerHasReservationIn(uint64_t owner, uint32_t segment) const;
  // Aborts every reservation of `owner` (its connection closed).
  void AbortOwner(uint64_t owner);
  // Waits up to `timeout` while another writer's reservation of (ns, key) is open (Reserve said
  // kInProgress); true when the block is cached once it ends. A second writer of the same block
  // (a cluster fetch racing a replica's push) uses it to report the block as stored only once
  // a lookup would find it.
  bool AwaitInFlightPut(NamespaceId ns, const BlockKey& key, Clock::Duration timeout);

  // Writes each block of `chain` to disk if it is not there yet and pins it (sessions).
  // FailedPrecondition naming the first block that is not cached. Returns the chain's bytes.
  Result<uint64_t> PinChain(NamespaceId ns, std::span<const BlockKey> chain);
  // Pins each key of `chain` without writing (reloading sessions at start); a key whose block
  // is gone keeps its pin on a copy-less entry, so pins stay balanced with UnpinChain.
  void PinExisting(NamespaceId ns, std::span<const BlockKey> chain);
  void UnpinChain(NamespaceId ns, std::span<const BlockKey> chain);
  // Bytes a namespace keeps on the disk tier's device beside its blocks (its session records),
  // held against the disk tier's capacity and the namespace's disk quota as its blocks are:
  // ChargeDisk makes room as a write-down does (the namespace's own blocks over its quota, any
  // evictable block over the tier's capacity) or answers ResourceExhausted. `force` (records
  // found at start) charges without making room; the next write-down does. UnchargeDisk gives
  // bytes back.
  Status ChargeDisk(NamespaceId ns, uint64_t bytes, bool force = false);
  void UnchargeDisk(NamespaceId ns, uint64_t bytes);
  // Every cached block (namespace, key, parent key; zero parent when none), for background
  // scans. A snapshot: blocks may come and go meanwhile.
  struct CachedBlock {
    NamespaceId ns;
    BlockKey key;
    BlockKey parent;
  };
  std::vector<CachedBlock> SnapshotCached() const;
  // Number of blocks of `chain` that are cached now.
  uint32_t CountCached(NamespaceId ns, std::span<const BlockKey> chain);
  // The fastest tier holding each key now (kNone: not cached); moves nothing, touches nothing.
  std::vector<Tier> Where(NamespaceId ns, std::span<const BlockKey> keys) const;
  // Each cached key's parent in its chain, as its put named it, where that parent is in the
  // index too; zero otherwise. For a peer daemon that fetches the blocks, so it can link them as
  // they were put rather than in the order it asked.
  std::vector<BlockKey> Parents(NamespaceId ns, std::span<const BlockKey> keys) const;

  // Admin eviction of a namespace's blocks (all when `keys` is empty) from the gpu tiers (their
  // gpu copies only), from host (demoting what disk does not have; their gpu copies go too) or
  // from the whole cache (tier == kDisk). Tail first: a block with cached descendants that are
  // not also evicted is skipped.
  EvictOutcome Evict(NamespaceId ns, Tier tier, std::span<const BlockKey> keys);

  TierManagerStats GetStats() const;
  // What namespace `ns` holds against its quotas (tiers/policy.h).
  struct NamespaceUsage {
    uint64_t host_segment_bytes = 0;  // bytes of the host segments it holds
    uint64_t disk_bytes = 0;          // stored bytes on disk
  };
  NamespaceUsage UsageOf(NamespaceId ns) const;
  uint64_t max_block_bytes() const { return host_.max_block_bytes(); }
  uint64_t host_capacity_bytes() const { return host_.capacity_bytes(); }

  // Test hook: the gpu copy of (ns, key), its device and slot; nullopt when it has none.
  std::optional<std::pair<int, MemorySlot>> GpuCopyForTest(NamespaceId ns,
                                                           const BlockKey& key) const;
  // Test hook: what disagrees between the blocks each host segment is booked with
  // (tiers/segment_blocks.h) and where the index says their host copies are; empty when nothing.
  std::string HostSegmentsMismatchForTest() const;
  // Test hook: waits until no promotion or demotion is in flight.
  void WaitIdleForTest();
  // Test hook: waits until the flusher has run one whole round (expiring what is due on the
  // clock) that began after this call.
  void WaitFlusherRoundForTest();

 private:
  struct Promotion {
    bool done = false;
    Status status;
  };

  static DiskCopy DiskCopyOf(const Entry& e);
  // Where a reader finds a cached entry fastest (a block mid-promotion counts as on disk).
  static Tier FastestTier(const Entry& e) {
    if (e.In(Tier::kGpu)) return Tier::kGpu;
    return e.LeasableInHost() ? Tier::kHost : Tier::kDisk;
  }
  // Whether a copy of `e` fits the host tier (a block put under a larger segment size does not:
  // it is read straight from disk).
  // Whether a read of `id` up from disk may start now: not in host, not already promoting, not
  // being read straight from disk by a get (a block is never read twice at once), and it fits.
  bool CanStartPromotionLocked(EntryId id, const Entry& e) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !e.In(Tier::kHost) && !promotions_.contains(id) && (e.busy & kBusyReading) == 0 &&
           PromotableLocked(e);
  }
  bool PromotableLocked(const Entry& e) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return e.size <= host_.max_block_bytes();
  }

  uint32_t NowSeconds() const;
  const NamespacePolicy& PolicyLocked(NamespaceId ns) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A live entry with at least one copy, or kNoEntry.
  EntryId FindCachedLocked(NamespaceId ns, const BlockKey& key) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return FindCachedLocked(hasher_.Hashed(ns, key));
  }
  EntryId FindCachedLocked(const HashedKey& k) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The key of `id`'s parent link; zero without one.
  BlockKey ParentKeyLocked(EntryId id) const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    const EntryId parent = index_.at(id).parent;
    return parent != kNoEntry ? index_.at(parent).key : BlockKey{};
  }
  // `keys` with their index hashes (no lock needed); they point into `keys`.
  std::vector<HashedKey> HashKeys(NamespaceId ns, std::span<const BlockKey> keys) const;
  // Each key's cached entry, or kNoEntry; with `prefix`, only up to the first miss. Prefetches
  // the hash slots of the keys ahead (kIndexPrefetchAhead). Reads only: runs under a shared
  // hold.
  std::vector<EntryId> FindEachLocked(std::span<const HashedKey> keys, bool prefix) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Erases `id` and then its copy-less ancestors while nothing holds them.
  void MaybeEraseLocked(EntryId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `id` gets its host copy at arena offset `offset`.
  void AddHostCopyLocked(EntryId id, uint64_t offset) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `id` gets its gpu copy in `slot` of gpu tier gpus_[gpu].
  void AddGpuCopyLocked(EntryId id, size_t gpu, const MemorySlot& slot)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the host copy, and the gpu copy with it.
  void DropHostCopyLocked(EntryId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropGpuCopyLocked(EntryId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The blocks to evict from memory tier `mem` (whose copies `blocks` places, in `tier`) to
  // empty one whole segment for namespace `ns`, which needs `bytes` and may take another segment.
  // Empty when the blocks of `victims` (the tier's coldest candidates) in `ns`'s own segments
  // make that room: they go in their pool's order. Else tried: the few segments holding the most
  // bytes of `victims`; where none of those qualifies, as many more holding the next coldest
  // candidates. A segment qualifies when no reservation or copy in flight holds pages of
  // it and `evictable` accepts each of its blocks and, tail first, each of their descendants in
  // `tier`, wherever they are (at most four segments' worth in all). Of those, the one that costs
  // least is chosen: the bytes it evicts beyond `victims`, plus (host) the bytes it must first
  // write to disk. Descendants come before their ancestors. Empty when none qualifies.
  std::vector<EntryId> SegmentToEmptyLocked(const MemoryTier& mem, const SegmentBlocks& blocks,
                                            Tier tier, NamespaceId ns, uint64_t bytes,
                                            std::span<const EntryId> victims,
                                            const VictimFilter& evictable,
                                            uint32_t* chosen = nullptr)
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Where `id`'s copy in memory tier `tier` (host or gpu) starts.
  uint64_t MemOffsetLocked(EntryId id, Tier tier) const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return tier == Tier::kHost ? index_.Mem(id).host_offset : GpuSlotLocked(id).offset;
  }
  // Where `id`'s gpu copy is in the gpu tier of its device (it must have one).
  MemorySlot GpuSlotLocked(EntryId id) const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return {uint64_t{index_.Mem(id).gpu_page} * MemoryTier::kPageBytes, index_.at(id).size};
  }
  // The gpu tier of `device`, or null; its index in gpus_ (and the mover's gpu workers), or -1.
  GpuTier* GpuOf(int device) const;
  int GpuIndexOf(int device) const;
  // A slot in `gpu` for `ns`, dropping cold gpu copies of that device (its own when it holds
  // its quota there) until one fits. May let go of mu_ while a segment of it is renewed
  // (RenewWithoutLockLocked; without `may_renew`, Unavailable instead).
  Result<MemorySlot> AllocateGpuLocked(GpuTier& gpu, NamespaceId ns, uint64_t bytes,
                                       bool may_renew = true) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the disk copies of `ids` and queues their records for deletion (done off the lock by
  // DeleteDroppedLocked, run by the next write-down, flusher round, admin evict or shutdown).
  void DropDiskCopiesLocked(const std::vector<EntryId>& ids) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Deletes the queued records from disk, with mu_ released while RocksDB works: a stalled
  // device holds no reader back.
  void DeleteDroppedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes disk room for `bytes` more by dropping cold candidates (--disk_capacity counts payload),
  // and accounts them as used. ResourceExhausted, dropping nothing, when the device itself has
  // no room for them (a dropped block's space comes back only when RocksDB compacts).
  Status ReserveDiskLocked(uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads the disk's device's free bytes into disk_device_room_. Releases mu_ meanwhile
  // (flusher only).
  void RefreshDiskSpaceLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the host copies of `ids` (marked kBusyDemoting by the caller) to disk, releasing
  // the mutex for the write, and first for the deletes queued by DropDiskCopiesLocked (those
  // its own room needed among them) and for any other thread's delete of one of its keys. On
  // success each gains a disk copy; when `drop_host`, unleased host copies are then freed, in the
  // order of `ids`, each once no child of it has a host copy left (tail first). On failure the
  // host copies are kept (or dropped when `drop_host`: the block is lost, counted). Clears
  // kBusyDemoting.
  Status WriteDownLocked(const std::vector<EntryId>& ids, bool drop_host, bool sync)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // For an allocation in `tier` that TryAllocate answered Unavailable: gives another namespace's
  // vacant segment fresh memory without mu_ (or waits for one being renewed), so that no other
  // request waits for it; the caller then tries again. The renewal's error, if it failed.
  Status RenewWithoutLockLocked(MemoryTier& tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees host space until `bytes` can be allocated for `ns` or nothing more can be evicted;
  // then waits for a disk write or read in flight to free or unblock more. Without `may_wait`
  // it neither waits nor writes (demotes) anything: Unavailable when dropping copies that are
  // on disk already does not make room. Without `may_renew`, also Unavailable where the host
  // tier would renew a segment for room (MemoryTier::TryAllocate).
  Result<HostSlot> AllocateHostLocked(NamespaceId ns, uint64_t bytes, bool may_wait = true,
                                      bool may_renew = true) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Picks up to `budget` bytes of coldest host candidates; drops those with a disk copy, and
  // demotes the rest (without `may_write`: leaves them, writing nothing). Returns bytes
  // released or scheduled. With `only`, from that namespace's candidates alone (it holds its
  // quota).
  uint64_t EvictHostLocked(uint64_t budget, NamespaceId only = kNoNamespace, bool may_write = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Empties one host segment of another namespace for `ns` without evicting anything: its
  // blocks are copied into free pages of the segments their namespace holds already (the
  // watermarks keep 10-20 % of the tier free, scattered over them). The segment is the one that
  // copies fewest bytes of those whose every block is neither leased nor busy, whose pages hold
  // no reservation, and whose blocks all find room; its blocks are copied without the lock, each
  // moved only if no reader or I/O took it meanwhile. Returns the bytes moved: 0 when no segment
  // qualifies.
  uint64_t MoveHostSegmentLocked(NamespaceId ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts the blocks of one host segment (SegmentToEmptyLocked) for `ns`, which needs `bytes`,
  // so that the segment empties, as EvictHostLocked would: 0 when no segment qualifies or `ns`'s
  // own coldest blocks make its room. Without `may_write`, only a segment whose blocks need no
  // write qualifies.
  uint64_t EvictHostSegmentLocked(NamespaceId ns, uint64_t bytes, bool may_write)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `id`'s memory copies are the approximate bytes decoded from a lossy disk copy that has
  // since been dropped: never written down (they would come back as the block that was put), and
  // replaced by a writer's exact bytes.
  bool ApproximateOnlyLocked(EntryId id) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Whether `e`'s host copy must be written to disk before it may go: it has no disk copy and its
  // namespace's disk takes it.
  bool NeedsWriteLocked(const Entry& e) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Drops `id`'s host copy when that needs no write (NeedsWriteLocked), counted as an eviction;
  // false, dropping nothing, otherwise.
  bool DropHostIfUnwrittenLocked(EntryId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes room for `extra` more disk bytes of `ns` within its disk quota (if it has one) by
  // dropping its own coldest disk copies. ResourceExhausted when it cannot.
  Status EnforceDiskQuotaLocked(NamespaceId ns, uint64_t extra) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::shared_ptr<Promotion> StartPromotionLocked(EntryId id, bool prefetch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Read-ahead: starts promoting the disk-only blocks that follow `id` along its chain, up to
  // the namespace's depth (the most recently used child at each step).
  void ReadAheadLocked(EntryId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PromoteOne(EntryId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleCorruptLocked(EntryId id, const Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireReservationsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Acquire's body; may let go of mu_ while it waits for or reads from disk. `hashed`: `keys`
  // with their index hashes; `found` (empty, or one per key): each key's cached entry, found
  // under this same hold of mu_.
  std::vector<BlockRead> AcquireLocked(NamespaceId ns, std::span<const BlockKey> keys,
                                       std::span<const HashedKey> hashed,
                                       std::span<const EntryId> found, uint64_t owner,
                                       std::chrono::milliseconds ttl, bool keep_encoding,
                                       GpuReach gpu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireLeasesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends a lease the table handed back: the entry's count drops.
  void EndLeaseLocked(EntryId entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeReservationLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reserve's body. With `ask.may_wait` it may let go of mu_ while it makes room; `may_renew`
  // as AllocateHostLocked; `gpu` the gpu tier's index for `ask.gpu_device` (-1: none).
  std::vector<ReserveOutcome> ReserveLocked(NamespaceId ns, uint64_t owner,
                                            std::span<const PutRequestItem> items, ReserveAsk ask,
                                            bool may_renew = true, int gpu = -1)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Commit's end: reservation `reservation_id` (`r`, as it was read) becomes the block's host
  // copy when `actual`, the hash of its slot, matches its checksum.
  Status PublishLocked(uint64_t reservation_id, const Reservation& r, uint64_t actual)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The copy-less entry a publication of `r` fills (inserted, linked under its parent), or
  // kNoEntry when the block is cached already.
  EntryId EntryToPublishLocked(const Reservation& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The same for a reservation written into its gpu slot, whose GPU computed `actual` over it:
  // published in gpu and host, its host copy queued for the GPU's copy worker.
  Status PublishGpuLocked(uint64_t reservation_id, const Reservation& r, uint64_t actual)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The copy worker's job for gpu tier `gpu`: copies down every host copy queued in
  // gpu_fills_[gpu], verifies each against its device checksum, and ends their readers' wait.
  // Releases mu_ while it copies.
  void FillHostCopiesLocked(int gpu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The mover's work: one flusher round (expiry, write-after-hits, demotion to the low
  // watermark), and a promotion it will never run.
  void FlushRoundLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AbandonPromotionLocked(EntryId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The gpu copy worker's job (Mover::place_on_gpu): releases mu_ while it copies.
  void RunGpuPlacementLocked(int gpu, const GpuPlacement& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AbandonGpuPlacementLocked(int gpu, const GpuPlacement& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HostAboveHighWatermarkLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const TierManagerOptions options_;
  const TierStack stack_;
  MemoryTier& host_;                  // stack_.host()
  const std::vector<GpuTier*> gpus_;  // stack_.gpus()
  BlockStore& disk_;                  // stack_.disk()
  Clock& clock_;
  const Clock::TimePoint start_;

  mutable absl::Mutex mu_;
  BlockIndex index_ ABSL_GUARDED_BY(mu_);
  // index_'s (copied from it, so declared after it), immutable: keys are hashed before mu_ is
  // taken.
  const KeyHasher hasher_;
  EvictionPools pools_ ABSL_GUARDED_BY(mu_){index_};
  absl::flat_hash_map<NamespaceId, NamespacePolicy> policies_ ABSL_GUARDED_BY(mu_);
  NamespacePolicy default_policy_ ABSL_GUARDED_BY(mu_);
  ReservationTable reservations_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<EntryId, std::shared_ptr<Promotion>> promotions_ ABSL_GUARDED_BY(mu_);
  std::vector<NamespacedKey> write_queue_ ABSL_GUARDED_BY(mu_);  // write-after-hits candidates
  // Disk records the index has forgotten (DropDiskCopiesLocked) and RocksDB has not yet deleted:
  // queued, then being deleted with mu_ released (DeleteDroppedLocked). A write of one of these
  // keys waits for its delete, so a delete never lands after a newer record of the same block.
  std::vector<std::pair<NamespaceId, BlockKey>> delete_queue_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<NamespacedKey> deleting_ ABSL_GUARDED_BY(mu_);  // queued or in flight
  absl::CondVar changed_;                        // an I/O finished or a busy flag cleared
  uint64_t disk_used_ ABSL_GUARDED_BY(mu_) = 0;  // payload bytes on disk + in flight
  // What the disk tier may still add to its device (DiskDeviceRoom), refreshed each flusher
  // round and lowered by each write reserved meanwhile.
  uint64_t disk_device_room_ ABSL_GUARDED_BY(mu_) = UINT64_MAX;
  uint64_t disk_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rebuild_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  double rebuild_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<NamespaceId, uint64_t> disk_used_of_ ABSL_GUARDED_BY(mu_);  // per namespace
  uint64_t blocks_over_quota_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t host_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint64_t> gpu_blocks_ ABSL_GUARDED_BY(mu_);  // parallel to gpus_
  // GpuTierUsage::hits and ::peer_hits, parallel to gpus_.
  std::vector<std::pair<uint64_t, uint64_t>> gpu_hits_ ABSL_GUARDED_BY(mu_);
  // The blocks in each segment of host and of each gpu tier (parallel to gpus_).
  SegmentBlocks host_segments_ ABSL_GUARDED_BY(mu_);
  std::vector<SegmentBlocks> gpu_segments_ ABSL_GUARDED_BY(mu_);
  TierCounters gpu_counters_ ABSL_GUARDED_BY(mu_);
  // The device checksum of each gpu copy, taken when it was made (and verified against its host
  // source).
  absl::flat_hash_map<EntryId, uint64_t> gpu_checksums_ ABSL_GUARDED_BY(mu_);
  // Per gpu tier: blocks put straight into it whose host copies are not made yet (kBusyFromGpu).
  // A fill job is queued whenever one is added to an empty list; the job takes the whole list.
  std::vector<std::vector<EntryId>> gpu_fills_ ABSL_GUARDED_BY(mu_);
  uint64_t gpu_puts_ ABSL_GUARDED_BY(mu_) = 0;  // blocks put straight into a gpu tier
  // Outcomes of waited-for gpu placements, by ticket, until their caller takes them.
  absl::flat_hash_map<uint64_t, std::pair<Status, uint32_t>> gpu_outcomes_ ABSL_GUARDED_BY(mu_);
  uint64_t next_gpu_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  // Tickets whose caller stopped waiting: their outcome is dropped when it comes.
  absl::flat_hash_set<uint64_t> gpu_tickets_abandoned_ ABSL_GUARDED_BY(mu_);
  uint64_t gpu_hints_dropped_ ABSL_GUARDED_BY(mu_) = 0;  // placement hints over the queue bound
  LeaseTable leases_ ABSL_GUARDED_BY(mu_);
  uint32_t io_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  TierCounters host_counters_ ABSL_GUARDED_BY(mu_);
  TierCounters disk_counters_ ABSL_GUARDED_BY(mu_);
  uint64_t prefetches_issued_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t prefetches_useful_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t checksum_failures_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t disk_write_errors_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t disk_delete_errors_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t blocks_lost_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t blocks_not_admitted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t host_blocks_moved_ ABSL_GUARDED_BY(mu_) = 0;  // MoveHostSegmentLocked
  uint64_t read_aheads_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t encoded_writes_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ = false;

  Mover mover_;  // the flusher, promoters and gpu copy workers; runs the callbacks under mu_
};

}  // namespace kvpool::tiers
