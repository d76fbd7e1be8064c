// The disk failing under a TierManager: a small real host arena (8 MiB, 1 MiB segments) over a
// RocksStore whose file system (tests/support/fault_injection_fs.h) refuses writes or reads on
// demand. What a user relies on: a block is served byte-identical to what was put or it is a miss,
// never other bytes; blocks the disk could not take are counted as lost; and once the disk works
// again, the tiers take and serve blocks again. Every read is compared with an independent copy of
// the bytes the test put.

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/checksum.h"
#include "common/clock.h"
#include "tests/support/fault_injection_fs.h"
#include "tests/support/temp_dir.h"
#include "tiers/disk_tier.h"
#include "tiers/host_tier.h"
#include "tiers/policy.h"
#include "tiers/rocks_store.h"
#include "tiers/test_tier_stack.h"
#include "tiers/tier_manager.h"

namespace kvpool::tiers {
namespace {

using ::kvpool::testing::FaultInjectionFileSystem;
using Op = FaultInjectionFileSystem::Op;

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kKiB = 1ull << 10;
constexpr NamespaceId kNs = 1;
constexpr uint64_t kBlockBytes = 64 * kKiB;

BlockKey KeyOf(uint64_t n) {
  BlockKey k;
  std::mt19937_64 rng(n * 0x9E3779B97F4A7C15ull + 23);
  for (auto& b : k.bytes) b = static_cast<uint8_t>(rng());
  return k;
}

std::vector<uint8_t> RandomBytes(uint64_t seed, uint64_t size) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> out(size);
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  return out;
}

class DiskFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok()) << dir_.status().ToString();
    fs_ = std::make_shared<FaultInjectionFileSystem>();
    options_.disk_capacity_bytes = 256 * kMiB;
    options_.promotion_threads = 2;
    Open();
  }
  void TearDown() override {
    // So the shutdown flush and close run on a working disk.
    for (Op op : {Op::kWrite, Op::kSync, Op::kRead}) fs_->Resume(op);
    fs_->HealAll();
    Close();
  }

  void Open() {
    Status st = stack_.Open(dir_.path(), options_, fs_);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }

  void Close() { stack_.Close(); }

  // Puts block `n` (reserve -> fill -> commit) and keeps a copy of its bytes.
  Status Put(uint64_t n, uint64_t size = kBlockBytes) {
    const BlockKey key = KeyOf(n);
    std::vector<uint8_t> bytes = RandomBytes(n, size);
    PutRequestItem item;
    item.key = key;
    item.size = size;
    item.checksum = BlockChecksum(bytes.data(), bytes.size());
    std::vector<ReserveOutcome> r = manager_->Reserve(kNs, /*owner=*/1, {&item, 1});
    if (r[0].state != ReserveState::kReserved) {
      return r[0].status.ok() ? Status::AlreadyExists("not reserved") : r[0].status;
    }
    Result<ReservationTarget> t = manager_->TargetOf(1, r[0].reservation_id);
    if (!t.ok()) return t.status();
    std::memcpy(t->data, bytes.data(), size);
    KVPOOL_RETURN_IF_ERROR(manager_->Commit(1, r[0].reservation_id));
    expected_[n] = std::move(bytes);
    return Status::OK();
  }

  // `gone` blocks are missing: the drops the tiers counted, from `before` to now (the flusher may
  // still drop a few meanwhile).
  void ExpectCountedDrops(const TierManagerStats& before, uint64_t gone) {
    const TierManagerStats now = manager_->GetStats();
    EXPECT_GE(gone, before.blocks_lost + before.blocks_not_admitted);
    EXPECT_LE(gone, now.blocks_lost + now.blocks_not_admitted);
  }

  struct Outcome {
    uint64_t served = 0;
    uint64_t missing = 0;  // NotFound
    uint64_t failed = 0;   // another error (e.g. IoError from a failed read)
  };

  // The blocks the test put that the tiers no longer hold (a lookup, no I/O).
  std::set<uint64_t> Uncached() {
    std::set<uint64_t> out;
    for (const auto& [n, bytes] : expected_) {
      const BlockKey key = KeyOf(n);
      if (manager_->Lookup(kNs, {&key, 1}, /*prefetch=*/false).hit_blocks == 0) out.insert(n);
    }
    return out;
  }

  // Acquires every block the test put. Each one served must be exactly its bytes; each one not
  // served must come with no data at all; those in `must_miss` must be NotFound.
  Outcome ReadAll(const std::set<uint64_t>& must_miss = {}) {
    Outcome out;
    for (const auto& [n, want] : expected_) {
      const BlockKey key = KeyOf(n);
      std::vector<BlockRead> reads = manager_->Acquire(kNs, {&key, 1});
      EXPECT_EQ(reads.size(), 1u);
      if (reads.size() != 1) continue;
      BlockRead& r = reads[0];
      if (must_miss.contains(n)) {
        EXPECT_TRUE(r.status.IsNotFound()) << "block " << n << ": " << r.status.ToString();
      }
      if (r.status.ok()) {
        ++out.served;
        EXPECT_NE(r.data, nullptr);
        EXPECT_EQ(r.size, want.size()) << "block " << n;
        EXPECT_TRUE(r.data != nullptr && r.size == want.size() &&
                    std::memcmp(r.data, want.data(), want.size()) == 0)
            << "wrong bytes served for block " << n;
      } else {
        EXPECT_EQ(r.data, nullptr)
            << "block " << n << " failed (" << r.status.ToString() << ") but came with data";
        if (r.status.IsNotFound()) {
          ++out.missing;
        } else {
          ++out.failed;
        }
      }
      manager_->Release(r);
    }
    return out;
  }

  ::kvpool::testing::TempDir dir_{"kvpool-disk-fault-test"};
  std::shared_ptr<FaultInjectionFileSystem> fs_;
  TierManagerOptions options_;
  TestTierStack stack_;
  std::unique_ptr<TierManager>& manager_ = stack_.manager;
  std::map<uint64_t, std::vector<uint8_t>> expected_;  // block number -> the bytes put
};

// The disk starts refusing writes while the flusher demotes: host is filled past its watermark
// (to 2.5 times its capacity), a few write-downs succeed, then every one fails. The host-only
// blocks that could not be written are dropped and counted; the rest are served exactly.
TEST_F(DiskFaultTest, WritesFailingDuringDemotionLoseBlocksButNeverServeWrongBytes) {
  // Half the arena, under the watermark: nothing is demoted yet.
  uint64_t next = 0;
  for (; next < 64; ++next) ASSERT_TRUE(Put(next).ok());
  manager_->WaitIdleForTest();
  EXPECT_EQ(manager_->GetStats().disk_blocks, 0u);

  // A few appends still land (the first demotions), then the device is broken.
  fs_->Fail(Op::kWrite, FaultInjectionFileSystem::Error::kIoError, /*after=*/4);
  for (; next < 320; ++next) {
    Status st = Put(next);
    ASSERT_TRUE(st.ok()) << "block " << next << ": " << st.ToString();
  }
  manager_->WaitIdleForTest();

  const TierManagerStats s = manager_->GetStats();
  EXPECT_GT(fs_->failures(Op::kWrite), 0u);
  EXPECT_GT(s.disk_write_errors, 0u);
  EXPECT_GT(s.blocks_lost, 0u);
  EXPECT_EQ(s.disk_counters.evictions, 0u) << "disk is far from full: nothing else drops blocks";

  // Each block gone is one the tiers counted as dropped: lost (its write failed) or, by the
  // namespace's admission policy, never meant for disk.
  const std::set<uint64_t> gone = Uncached();
  ExpectCountedDrops(s, gone.size());

  // Reading promotes disk blocks into the full host, whose host-only blocks the broken disk
  // cannot take: more are lost meanwhile, each counted, none served with wrong bytes.
  const Outcome o = ReadAll(gone);
  const TierManagerStats after = manager_->GetStats();
  EXPECT_EQ(o.served + o.missing + o.failed, expected_.size());
  EXPECT_EQ(o.failed, 0u) << "reads work: a block is served or a miss";
  EXPECT_GE(o.missing, gone.size());
  EXPECT_LE(o.missing, after.blocks_lost + after.blocks_not_admitted);
  EXPECT_GT(o.served, 0u);
  EXPECT_EQ(after.host.blocks, after.host_blocks + after.reservations_active);
}

// Reads failing in the device are misses for the reader (an error, no data), never other bytes;
// the blocks stay on disk and are served again, exactly, once reads work.
TEST_F(DiskFaultTest, ReadsFailingAreMissesNotWrongBytes) {
  std::vector<BlockKey> keys;
  for (uint64_t n = 0; n < 32; ++n) {
    ASSERT_TRUE(Put(n).ok());
    keys.push_back(KeyOf(n));
  }
  // Every block to disk only, and out of RocksDB's memtables into its blob files.
  const EvictOutcome ev = manager_->Evict(kNs, Tier::kHost, keys);
  EXPECT_EQ(ev.evicted, keys.size());
  manager_->WaitIdleForTest();
  ASSERT_TRUE(stack_.store->Flush().ok());
  ASSERT_EQ(manager_->GetStats().disk_blocks, keys.size());
  ASSERT_EQ(manager_->GetStats().host_blocks, 0u);

  fs_->Fail(Op::kRead);
  const Outcome broken = ReadAll();
  EXPECT_GT(fs_->failures(Op::kRead), 0u);
  EXPECT_EQ(broken.served, 0u) << "every body is in a blob file the device cannot read";
  EXPECT_EQ(broken.served + broken.missing + broken.failed, keys.size());
  manager_->WaitIdleForTest();

  fs_->Heal(Op::kRead);
  const Outcome healed = ReadAll();
  EXPECT_EQ(healed.served + healed.missing, keys.size());
  EXPECT_EQ(healed.failed, 0u);
  // An I/O error is not proof the block is bad: the ones that failed with one are still there.
  EXPECT_EQ(healed.missing, broken.missing);
  EXPECT_EQ(manager_->GetStats().checksum_failures, broken.missing);
}

// After the disk refused writes and works again, the tiers go on taking and serving blocks: the
// host tier at once, and the disk tier after a restart on the same data. (RocksDB 7.8 treats a
// failed WAL write as fatal: DB::Resume() refuses, so the running store keeps refusing writes
// until it is reopened, and until then every demotion loses its blocks, counted.)
TEST_F(DiskFaultTest, TiersWorkAgainAfterTheDiskRecovers) {
  fs_->Fail(Op::kWrite);
  uint64_t next = 0;
  for (; next < 256; ++next) ASSERT_TRUE(Put(next).ok());
  manager_->WaitIdleForTest();
  const TierManagerStats broken = manager_->GetStats();
  ASSERT_GT(broken.blocks_lost, 0u);
  EXPECT_EQ(broken.disk_blocks, 0u);

  // The device works again: puts go on, and what is served is exact.
  fs_->Heal(Op::kWrite);
  for (; next < 320; ++next) ASSERT_TRUE(Put(next).ok());
  manager_->WaitIdleForTest();
  TierManagerStats s = manager_->GetStats();
  const std::set<uint64_t> gone = Uncached();
  ExpectCountedDrops(s, gone.size());
  Outcome o = ReadAll(gone);
  EXPECT_EQ(o.failed, 0u);
  EXPECT_GT(o.served, 0u);

  // A restart on the same data dir: the shutdown flush either lands or is refused (RocksDB may
  // still be stopped); afterwards writes reach the disk again and demoted blocks are served from
  // it, exactly.
  Close();
  expected_.clear();  // host-only blocks do not survive a restart unless the flush landed
  Open();
  const uint64_t first_after = 1000;
  for (next = first_after; next < first_after + 256; ++next) ASSERT_TRUE(Put(next).ok());
  manager_->WaitIdleForTest();
  s = manager_->GetStats();
  EXPECT_GT(s.disk_blocks, 0u) << "demotion writes succeed again";
  EXPECT_GT(s.host_counters.demotions, 0u);
  EXPECT_EQ(s.blocks_lost, 0u);
  o = ReadAll();
  EXPECT_EQ(o.failed, 0u);
  EXPECT_EQ(o.missing, manager_->GetStats().blocks_not_admitted);
  EXPECT_GT(o.served, 0u);
}

// The device stops answering (a stalled WAL append) while blocks are dropped from disk. Their
// records are deleted with the tier lock released, so a read of a host block goes on meanwhile.
// A block put again and written down while its old record's delete is stalled waits for that
// delete, and once the device answers a restart finds the dropped block gone and the rewritten
// one whole. (That half checks the outcome only: RocksDB itself queues a write behind a stalled
// one, so the window the wait closes, a delete taken off the queue but not yet given to RocksDB
// when the write starts, is not forced here.)
TEST_F(DiskFaultTest, AStalledDiskDeleteHoldsNoReaderBack) {
  std::vector<BlockKey> on_disk;
  for (uint64_t n = 0; n < 4; ++n) {
    ASSERT_TRUE(Put(n).ok());
    on_disk.push_back(KeyOf(n));
  }
  ASSERT_EQ(manager_->Evict(kNs, Tier::kHost, on_disk).evicted, 4u);  // written down, host dropped
  manager_->WaitIdleForTest();
  ASSERT_EQ(manager_->GetStats().disk_blocks, 4u);
  ASSERT_TRUE(Put(10).ok());
  const BlockKey hot = KeyOf(10);

  std::thread dropper;
  std::thread rewriter;
  std::future<bool> read;
  // However the test ends, the device answers again and the threads end first.
  struct AtExit {
    std::function<void()> fn;
    ~AtExit() { fn(); }
  } at_exit{[&] {
    fs_->Resume(Op::kWrite);
    if (dropper.joinable()) dropper.join();
    if (rewriter.joinable()) rewriter.join();
  }};

  fs_->Stall(Op::kWrite);
  dropper = std::thread([&] {
    const std::vector<BlockKey> drop = {KeyOf(0), KeyOf(1)};
    EXPECT_EQ(manager_->Evict(kNs, Tier::kDisk, drop).evicted, 2u);
  });
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (fs_->stalled(Op::kWrite) == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_GT(fs_->stalled(Op::kWrite), 0u) << "the delete never reached the device";
  EXPECT_EQ(manager_->GetStats().disk_deletes_pending, 2u);  // what an operator sees meanwhile

  read = std::async(std::launch::async, [&] {
    std::vector<BlockRead> reads = manager_->Acquire(kNs, {&hot, 1});
    const std::vector<uint8_t>& want = expected_[10];
    const bool same = reads[0].status.ok() && reads[0].size == want.size() &&
                      std::memcmp(reads[0].data, want.data(), want.size()) == 0;
    manager_->Release(reads[0]);
    return same;
  });
  const bool answered = read.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  ASSERT_TRUE(answered) << "a read of a host block waited for a stalled disk delete";
  EXPECT_TRUE(read.get());

  // Block 1 again, written down while its old record's delete is stalled.
  ASSERT_TRUE(Put(1).ok());
  rewriter = std::thread([&] {
    const BlockKey again = KeyOf(1);
    EXPECT_EQ(manager_->Evict(kNs, Tier::kHost, {&again, 1}).evicted, 1u);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  fs_->Resume(Op::kWrite);
  dropper.join();
  rewriter.join();
  EXPECT_EQ(manager_->GetStats().disk_deletes_pending, 0u);
  EXPECT_EQ(manager_->GetStats().disk_delete_errors, 0u);

  Close();
  Open();
  const Outcome o = ReadAll(/*must_miss=*/{0});
  EXPECT_EQ(o.served, 4u);  // 1 (rewritten), 2, 3 and 10 (flushed at shutdown)
  EXPECT_EQ(o.missing, 1u);
  EXPECT_EQ(o.failed, 0u);
}

// A full device (ENOSPC) under RocksDB: its writes stop (with Debian's RocksDB 7.8 a NoSpace
// WAL failure followed by another write aborted the process; tiers/full_device_fs.h), demotions
// lose their blocks, counted, and nothing wrong is served; the host tier goes on; after a restart
// on the same data the disk takes writes again.
TEST_F(DiskFaultTest, AFullDeviceStopsDiskWritesWithoutTakingTheProcessDown) {
  fs_->Fail(Op::kWrite, FaultInjectionFileSystem::Error::kNoSpace);
  uint64_t next = 0;
  for (; next < 256; ++next) ASSERT_TRUE(Put(next).ok());
  manager_->WaitIdleForTest();
  for (; next < 320; ++next) ASSERT_TRUE(Put(next).ok());  // more writes after the first failure
  manager_->WaitIdleForTest();
  const TierManagerStats full = manager_->GetStats();
  ASSERT_GT(full.disk_write_errors, 1u);
  EXPECT_EQ(full.disk_blocks, 0u);
  ExpectCountedDrops(full, Uncached().size());
  Outcome o = ReadAll();
  EXPECT_EQ(o.failed, 0u);
  EXPECT_GT(o.served, 0u);

  fs_->Heal(Op::kWrite);
  Close();
  expected_.clear();
  Open();
  for (next = 1000; next < 1256; ++next) ASSERT_TRUE(Put(next).ok());
  manager_->WaitIdleForTest();
  const TierManagerStats s = manager_->GetStats();
  EXPECT_GT(s.disk_blocks, 0u) << "demotion writes succeed again";
  EXPECT_EQ(s.blocks_lost, 0u);
  o = ReadAll();
  EXPECT_EQ(o.failed, 0u);
  EXPECT_GT(o.served, 0u);
}

// The device fills up before --disk_capacity is reached (something else writes to it, or it is
// smaller than the flag says): at 64 MiB free kvpool stops writing to it, before RocksDB ever
// sees ENOSPC. Demotions then lose their blocks (counted), what is on disk stays and is served,
// and when room comes back the same running daemon writes to disk again.
TEST_F(DiskFaultTest, ADeviceWithoutRoomStopsDiskWritesUntilRoomComesBack) {
  for (uint64_t n = 0; n < 256; ++n) ASSERT_TRUE(Put(n).ok());  // 16 MiB through an 8 MiB host
  manager_->WaitIdleForTest();
  manager_->WaitFlusherRoundForTest();
  const TierManagerStats before = manager_->GetStats();
  ASSERT_GT(before.disk_blocks, 0u);
  ASSERT_GT(before.disk_device_room_bytes, 64 * kMiB);

  fs_->SetFreeSpace(64 * kMiB);  // exactly the reserve: no room
  manager_->WaitFlusherRoundForTest();
  manager_->WaitFlusherRoundForTest();
  EXPECT_EQ(manager_->GetStats().disk_device_room_bytes, 0u);
  for (uint64_t n = 256; n < 512; ++n) ASSERT_TRUE(Put(n).ok());
  manager_->WaitIdleForTest();
  const TierManagerStats full = manager_->GetStats();
  EXPECT_EQ(full.disk_blocks, before.disk_blocks) << "nothing written, nothing dropped";
  EXPECT_EQ(full.disk_counters.evictions, before.disk_counters.evictions);
  EXPECT_GT(full.blocks_lost, 0u);
  EXPECT_EQ(full.disk_write_errors, 0u) << "RocksDB never saw a full device";
  ExpectCountedDrops(full, Uncached().size());
  Outcome o = ReadAll();
  EXPECT_EQ(o.failed, 0u);
  EXPECT_GE(o.served, before.disk_blocks);

  fs_->ClearFreeSpace();
  manager_->WaitFlusherRoundForTest();
  manager_->WaitFlusherRoundForTest();
  for (uint64_t n = 512; n < 768; ++n) ASSERT_TRUE(Put(n).ok());
  manager_->WaitIdleForTest();
  const TierManagerStats after = manager_->GetStats();
  EXPECT_GT(after.disk_blocks, full.disk_blocks) << "demotions reach the disk again";
  EXPECT_EQ(after.disk_write_errors, 0u);
  o = ReadAll();
  EXPECT_EQ(o.failed, 0u);
}

// In a namespace that writes to disk on commit, a put answered "already there" (PRESENT) is one
// on disk: a second writer of a block whose write-through is still running waits for it, and a
// block left in host by a failed write-through (a reader held it) is written down by the next
// put of it, or that put fails.
class WriteThroughTest : public DiskFaultTest {
 protected:
  void SetUp() override {
    DiskFaultTest::SetUp();
    Close();
    options_.in_flight_put_wait = std::chrono::seconds(30);  // waits end by events, not by time
    options_.flush_on_shutdown = false;
    Open();
    Result<NamespacePolicy> wt = ComposePolicy("", "write-through", "", "");
    ASSERT_TRUE(wt.ok()) << wt.status().ToString();
    ASSERT_TRUE(manager_->SetNamespacePolicy(kNs, *wt).ok());
  }

  PutRequestItem ItemOf(uint64_t n) {
    bytes_[n] = RandomBytes(n, kBlockBytes);
    PutRequestItem item;
    item.key = KeyOf(n);
    item.size = kBlockBytes;
    item.checksum = BlockChecksum(bytes_[n].data(), kBlockBytes);
    return item;
  }
  // Fills reservation `rid` of `owner` with block n's bytes.
  void Fill(uint64_t owner, uint64_t rid, uint64_t n) {
    Result<ReservationTarget> t = manager_->TargetOf(owner, rid);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    std::memcpy(t->data, bytes_[n].data(), kBlockBytes);
  }
  // Reserves and fills block n as writer 1, stalls the disk's writes and commits it on another
  // thread: returns once that commit's write-through waits on the stalled write.
  std::future<Status> CommitIntoAStalledWrite(const PutRequestItem& item, uint64_t n) {
    std::vector<ReserveOutcome> first = manager_->Reserve(kNs, 1, {&item, 1});
    EXPECT_EQ(first[0].state, ReserveState::kReserved);
    const uint64_t rid = first[0].reservation_id;
    Fill(1, rid, n);
    fs_->Stall(Op::kWrite);
    std::future<Status> commit =
        std::async(std::launch::async, [this, rid] { return manager_->Commit(1, rid); });
    AwaitStalledWrite();
    return commit;
  }
  void AwaitStalledWrite() {
    for (int i = 0; i < 5000 && fs_->stalled(Op::kWrite) == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_GT(fs_->stalled(Op::kWrite), 0u);
  }
  // Whether block n is on disk: it survives a restart without a shutdown flush.
  bool OnDiskAfterRestart(uint64_t n) {
    Close();
    Open();
    const BlockKey key = KeyOf(n);
    std::vector<BlockRead> reads = manager_->Acquire(kNs, {&key, 1});
    const bool ok = reads[0].status.ok() && reads[0].size == kBlockBytes &&
                    std::memcmp(reads[0].data, bytes_[n].data(), kBlockBytes) == 0;
    manager_->Release(reads[0]);
    return ok;
  }

  std::map<uint64_t, std::vector<uint8_t>> bytes_;
};

TEST_F(WriteThroughTest, ASecondWriterIsAnsweredPresentOnlyOnceTheFirstOnesWriteHasLanded) {
  const PutRequestItem item = ItemOf(1);
  std::future<Status> commit = CommitIntoAStalledWrite(item, 1);
  // Cached in host now, its disk write stalled: an I/O thread's try hands it to a worker...
  EXPECT_FALSE(manager_->TryReserve(kNs, 2, {&item, 1}).has_value());
  // ...whose reserve waits for the write.
  auto second = std::async(std::launch::async, [&] {
    return manager_->Reserve(kNs, 2, {&item, 1})[0];
  });
  EXPECT_EQ(second.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout)
      << "answered while the block's write to disk was stalled";
  fs_->Resume(Op::kWrite);
  EXPECT_TRUE(commit.get().ok());
  const ReserveOutcome o = second.get();
  EXPECT_EQ(o.state, ReserveState::kPresent) << o.status.ToString();
  EXPECT_TRUE(OnDiskAfterRestart(1));
}

TEST_F(WriteThroughTest, ACopyOfABlockDurableElsewhereIsAnsweredWithoutWaiting) {
  // A peer's replica or a fetched block (durable on the node that took it) comes under the
  // peer's short deadline: neither a running write nor another writer's put holds it up.
  const PutRequestItem item = ItemOf(7);
  std::future<Status> commit = CommitIntoAStalledWrite(item, 7);
  const ReserveAsk replica{.durable = false};
  auto cached = std::async(std::launch::async, [&] {
    return manager_->Reserve(kNs, 2, {&item, 1}, replica)[0];
  });
  ASSERT_EQ(cached.wait_for(std::chrono::seconds(10)), std::future_status::ready)
      << "a replica waited for another writer's write to disk";
  EXPECT_EQ(cached.get().state, ReserveState::kPresent);
  EXPECT_TRUE(manager_->TryReserve(kNs, 2, {&item, 1}, /*durable=*/false).has_value());

  const PutRequestItem other = ItemOf(8);
  std::vector<ReserveOutcome> first = manager_->Reserve(kNs, 3, {&other, 1});
  ASSERT_EQ(first[0].state, ReserveState::kReserved);
  auto reserved = std::async(std::launch::async, [&] {
    return manager_->Reserve(kNs, 4, {&other, 1}, replica)[0];
  });
  ASSERT_EQ(reserved.wait_for(std::chrono::seconds(10)), std::future_status::ready)
      << "a replica waited for another writer's put";
  EXPECT_EQ(reserved.get().state, ReserveState::kInProgress);
  manager_->Abort(3, first[0].reservation_id);
  fs_->Resume(Op::kWrite);
  EXPECT_TRUE(commit.get().ok());
}

TEST_F(WriteThroughTest, ABlockAFailedWriteLeftInHostFailsTheNextPutOfItToo) {
  const PutRequestItem item = ItemOf(2);
  std::future<Status> commit = CommitIntoAStalledWrite(item, 2);
  // A reader leases it meanwhile, so the failed write cannot take it back out of host.
  const BlockKey key = KeyOf(2);
  std::vector<BlockRead> held = manager_->Acquire(kNs, {&key, 1});
  ASSERT_TRUE(held[0].status.ok()) << held[0].status.ToString();
  fs_->Fail(Op::kWrite);
  fs_->Resume(Op::kWrite);
  EXPECT_FALSE(commit.get().ok()) << "the write-through failed";
  // The next put of it tries the disk again, and fails as the first did, rather than answer
  // PRESENT for a block in host only. (RocksDB stays stopped after a failed WAL write until a
  // restart: that the same put succeeds on a working disk is the next test.)
  const ReserveOutcome again = manager_->Reserve(kNs, 2, {&item, 1})[0];
  EXPECT_EQ(again.state, ReserveState::kRefused);
  EXPECT_EQ(again.status.code(), StatusCode::kIoError) << again.status.ToString();
  manager_->Release(held[0]);
}

TEST_F(WriteThroughTest, ABlockCachedBeforeItsNamespaceWroteThroughIsWrittenDownByTheNextPut) {
  Result<NamespacePolicy> wb = ComposePolicy("", "write-back", "", "");
  ASSERT_TRUE(wb.ok()) << wb.status().ToString();
  ASSERT_TRUE(manager_->SetNamespacePolicy(kNs, *wb).ok());
  const PutRequestItem item = ItemOf(6);
  std::vector<ReserveOutcome> first = manager_->Reserve(kNs, 1, {&item, 1});
  ASSERT_EQ(first[0].state, ReserveState::kReserved);
  Fill(1, first[0].reservation_id, 6);
  ASSERT_TRUE(manager_->Commit(1, first[0].reservation_id).ok());
  EXPECT_EQ(manager_->GetStats().disk_blocks, 0u) << "write-back: in host only";

  Result<NamespacePolicy> wt = ComposePolicy("", "write-through", "", "");
  ASSERT_TRUE(wt.ok());
  ASSERT_TRUE(manager_->SetNamespacePolicy(kNs, *wt).ok());
  // Without a wait allowed, it is refused (an I/O thread hands it to a worker)...
  EXPECT_EQ(manager_->Reserve(kNs, 2, {&item, 1}, {.may_wait = false})[0].status.code(),
            StatusCode::kUnavailable);
  // ...which writes it down and answers PRESENT.
  const ReserveOutcome again = manager_->Reserve(kNs, 2, {&item, 1})[0];
  EXPECT_EQ(again.state, ReserveState::kPresent) << again.status.ToString();
  EXPECT_EQ(manager_->GetStats().disk_blocks, 1u);
  EXPECT_TRUE(OnDiskAfterRestart(6));
}

TEST_F(WriteThroughTest, AWriterHoldingNoReservationWaitsForAnotherWritersPut) {
  const PutRequestItem a = ItemOf(3);
  const PutRequestItem b = ItemOf(4);
  std::vector<ReserveOutcome> first = manager_->Reserve(kNs, 1, {&a, 1});
  ASSERT_EQ(first[0].state, ReserveState::kReserved);

  // A writer holding a reservation of its own is not made to wait (two writers could then wait
  // for each other): the block another writer has is in progress.
  const std::vector<PutRequestItem> b_then_a = {b, a};
  std::vector<ReserveOutcome> mixed = manager_->Reserve(kNs, 2, b_then_a);
  ASSERT_EQ(mixed[0].state, ReserveState::kReserved);
  EXPECT_EQ(mixed[1].state, ReserveState::kInProgress);
  manager_->Abort(2, mixed[0].reservation_id);

  // One holding none waits, and learns the outcome: on disk once the first writer commits...
  auto waiting = std::async(std::launch::async, [&] {
    return manager_->Reserve(kNs, 2, {&a, 1})[0];
  });
  EXPECT_EQ(waiting.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  Fill(1, first[0].reservation_id, 3);
  ASSERT_TRUE(manager_->Commit(1, first[0].reservation_id).ok());
  EXPECT_EQ(waiting.get().state, ReserveState::kPresent);

  // ...or a slot of its own when the first writer gives up.
  first = manager_->Reserve(kNs, 1, {&b, 1});
  ASSERT_EQ(first[0].state, ReserveState::kReserved);
  waiting = std::async(std::launch::async, [&] { return manager_->Reserve(kNs, 2, {&b, 1})[0]; });
  EXPECT_EQ(waiting.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  manager_->Abort(1, first[0].reservation_id);
  const ReserveOutcome mine = waiting.get();
  ASSERT_EQ(mine.state, ReserveState::kReserved);
  Fill(2, mine.reservation_id, 4);
  ASSERT_TRUE(manager_->Commit(2, mine.reservation_id).ok());
  EXPECT_TRUE(OnDiskAfterRestart(3));
  EXPECT_TRUE(OnDiskAfterRestart(4));
}

TEST_F(WriteThroughTest, AWaitThatOutlastsItsLimitAnswersInProgressOncePerCall) {
  // On a clock that moves only when told: one step past the limit must end the whole call.
  ManualClock clock;
  Close();
  options_.clock = &clock;
  options_.in_flight_put_wait = std::chrono::seconds(2);
  Open();
  Result<NamespacePolicy> wt = ComposePolicy("", "write-through", "", "");
  ASSERT_TRUE(wt.ok());
  ASSERT_TRUE(manager_->SetNamespacePolicy(kNs, *wt).ok());
  // Another writer holds six blocks and never commits them: a put of all six waits once, for
  // the call's limit, not once per block (six times would outlast a client's timeout).
  std::vector<PutRequestItem> items;
  for (uint64_t n = 10; n < 16; ++n) items.push_back(ItemOf(n));
  std::vector<ReserveOutcome> first = manager_->Reserve(kNs, 1, items);
  for (const ReserveOutcome& o : first) ASSERT_EQ(o.state, ReserveState::kReserved);
  // How many steps of `step` the clock takes to end `f`'s wait (at most 8). A step may come
  // before the waiter has set its deadline (a loaded machine: two), so a wait of one limit
  // takes one to three steps.
  auto steps_until_ready = [&clock](auto& f, std::chrono::milliseconds step) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    int steps = 0;
    while (f.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready && steps < 8) {
      clock.Advance(step);
      ++steps;
    }
    return steps;
  };
  // Steps of 3 s: once the call's 2 s have passed, no later block waits again (a wait per
  // block would take six steps).
  auto second = std::async(std::launch::async, [&] { return manager_->Reserve(kNs, 2, items); });
  EXPECT_LE(steps_until_ready(second, std::chrono::seconds(3)), 3)
      << "a later block waited again after the call's limit had passed";
  for (const ReserveOutcome& o : second.get()) EXPECT_EQ(o.state, ReserveState::kInProgress);

  // A writer whose deadline is nearer (a client sends half its timeout as wait_ms) waits only
  // that long: steps of 600 ms end a wait of 500 ms in one to three, one of 2 s in four.
  auto third = std::async(std::launch::async, [&] {
    return manager_->Reserve(kNs, 3, items, {.wait_limit = std::chrono::milliseconds(500)});
  });
  EXPECT_LE(steps_until_ready(third, std::chrono::milliseconds(600)), 3)
      << "waited past the writer's own limit";
  for (const ReserveOutcome& o : third.get()) EXPECT_EQ(o.state, ReserveState::kInProgress);
  for (const ReserveOutcome& o : first) manager_->Abort(1, o.reservation_id);
  Close();
  options_.clock = nullptr;
  Open();
}

TEST(DiskDeviceRoom, TheFreeSpaceLessTheReserve) {
  EXPECT_EQ(DiskDeviceRoom(std::nullopt), UINT64_MAX);
  EXPECT_EQ(DiskDeviceRoom(0), 0u);
  EXPECT_EQ(DiskDeviceRoom(64 * kMiB), 0u);
  EXPECT_EQ(DiskDeviceRoom(1024 * kMiB), 960 * kMiB);
}

}  // namespace
}  // namespace kvpool::tiers
