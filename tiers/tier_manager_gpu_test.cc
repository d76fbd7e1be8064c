// The tier manager with gpu tiers, on the device double of tests/support/fake_device.h (device
// memory the host cannot touch, copies that run when waited for): blocks copied from host into a
// GPU's tier byte for byte on a hint, reported as in gpu, dropped tail first when that GPU needs
// room and with their host copies, evicted alone by an admin, and a failed copy leaves nothing
// placed. Blocks put straight into a gpu tier (a writer's device memory, copied device to device
// into its gpu slot): checked against their device checksum at commit, their host copies made by
// the GPU's worker and verified, served from both, dropped when the copy down goes bad, kept
// across a restart.

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "kernels/device_checksum.h"
#include "tests/support/fake_device.h"
#include "tests/support/status_matchers.h"
#include "tiers/tier_manager_test_fixture.h"

namespace kvpool::tiers {
namespace {

using testing::FakeDevice;

class TierManagerGpuTest : public TierManagerTest {
 protected:
  void SetUp() override {
    TierManagerTest::SetUp();
    // gpu 0: 2 segments of 1 MiB; gpu 1: one.
    stack_.gpu_arenas.push_back([this] { return gpu0_.CreateArena(kMiB, 2); });
    stack_.gpu_arenas.push_back([this] { return gpu1_.CreateArena(kMiB, 1); });
    Open();
  }

  // The gpu copy of `key` holds exactly the bytes put for it.
  void ExpectOnGpu(const BlockKey& key, int device) {
    auto copy = manager_->GpuCopyForTest(kNs, key);
    ASSERT_TRUE(copy.has_value()) << key.ShortHex() << " has no gpu copy";
    EXPECT_EQ(copy->first, device);
    FakeDevice& dev = device == 0 ? gpu0_ : gpu1_;
    GpuTier& tier = *stack_.gpus[device];
    const std::vector<uint8_t>& want = expected_[{kNs, key}];
    EXPECT_EQ(dev.Read(tier.Data(copy->second), copy->second.length), want)
        << "wrong bytes on gpu " << device << " for " << key.ShortHex();
  }

  uint64_t GpuBlocks(int device) { return manager_->GetStats().gpus[device].blocks; }

  // Namespace kNs holds `first` and `second` (700 KiB each) in gpu 0's two segments, then lets
  // the first segment go vacant: another namespace's gpu copy needs it renewed.
  void VacateAGpuSegment(const BlockKey& first, const BlockKey& second) {
    ASSERT_OK(Put(first, 700 * kKiB));
    ASSERT_OK(Put(second, 700 * kKiB));
    const Keys both = {first, second};
    ASSERT_EQ(manager_->PromoteToGpu(kNs, both, 0).value(), 2u);
    ASSERT_EQ(manager_->Evict(kNs, Tier::kGpu, {&first, 1}).evicted, 1u);
  }

  // A put as a writer with the bytes in device memory does it: a reservation with a gpu slot on
  // `device`, the bytes written there, committed with their device checksum (plus `damage`).
  Status PutIntoGpu(const BlockKey& key, uint64_t size, const BlockKey& parent = {}, int device = 0,
                    uint64_t damage = 0) {
    std::vector<uint8_t> bytes = BytesFor(key, size);
    const PutRequestItem item = ItemFor(key, bytes, parent);
    std::vector<ReserveOutcome> r =
        manager_->Reserve(kNs, /*owner=*/1, {&item, 1}, {.gpu_device = device});
    if (r[0].state != ReserveState::kReserved) return r[0].status;
    if (r[0].gpu_device != device) return Status::Internal("no gpu slot");
    FakeDevice& dev = device == 0 ? gpu0_ : gpu1_;
    dev.Write(stack_.gpus[device]->Data({r[0].gpu_offset, size}), bytes.data(), size);
    const uint64_t dsum = kernels::DeviceChecksumCpu(bytes.data(), size);
    const uint64_t committed = dsum ^ damage;
    KVPOOL_RETURN_IF_ERROR(
        manager_->CommitToGpu(/*owner=*/1, {&r[0].reservation_id, 1}, {&committed, 1})[0]);
    expected_[{kNs, key}] = std::move(bytes);
    return Status::OK();
  }

  FakeDevice gpu0_{0};
  FakeDevice gpu1_{1};
};

TEST_F(TierManagerGpuTest, CopiesHostBlocksIntoTheGpuOnAHint) {
  const Keys keys = PutChain(10, {100 * kKiB, 100 * kKiB, 4097, 1});
  auto placed = manager_->PromoteToGpu(kNs, keys, 0);
  ASSERT_TRUE(placed.ok()) << placed.status().ToString();
  EXPECT_EQ(*placed, 4u);
  for (const BlockKey& k : keys) ExpectOnGpu(k, 0);
  EXPECT_EQ(TiersOf(keys), std::vector<Tier>(4, Tier::kGpu));
  EXPECT_EQ(manager_->Where(kNs, keys), std::vector<Tier>(4, Tier::kGpu));
  const TierManagerStats s = manager_->GetStats();
  ASSERT_EQ(s.gpus.size(), 2u);
  EXPECT_EQ(s.gpus[0].device, 0);
  EXPECT_EQ(s.gpus[0].blocks, 4u);
  EXPECT_EQ(s.gpus[0].memory.blocks, 4u);
  EXPECT_EQ(s.gpus[1].blocks, 0u);
  EXPECT_EQ(s.gpu_counters.promotions, 4u);
  // Host still serves them, byte exact; promoting again places nothing twice.
  for (const BlockKey& k : keys) ExpectServed(k);
  EXPECT_EQ(manager_->PromoteToGpu(kNs, keys, 0).value(), 0u);
  // Another device takes its own copies only of what it has not... each block has one gpu copy.
  EXPECT_EQ(manager_->PromoteToGpu(kNs, keys, 1).value(), 0u);
}

TEST_F(TierManagerGpuTest, SkipsWhatIsNotInHostAndUnknownDevices) {
  const Keys keys = PutChain(20, {64 * kKiB, 64 * kKiB});
  DemoteAll({keys[1]});
  EXPECT_EQ(manager_->PromoteToGpu(kNs, keys, 0).value(), 1u);  // keys[1] is on disk only
  EXPECT_EQ(TiersOf(keys), (std::vector<Tier>{Tier::kGpu, Tier::kDisk}));
  auto none = manager_->PromoteToGpu(kNs, keys, 7);
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  const Keys unknown = {KeyOf(999)};
  EXPECT_EQ(manager_->PromoteToGpu(kNs, unknown, 1).value(), 0u);
}

TEST_F(TierManagerGpuTest, AReaderLeasesGpuCopiesOnTheGpusItReachesAndHostOtherwise) {
  // keys[0] on gpu 0, keys[1] on gpu 1, keys[2] in host only.
  const Keys keys = PutChain(60, {64 * kKiB, 64 * kKiB, 64 * kKiB});
  ASSERT_EQ(manager_->PromoteToGpu(kNs, {&keys[0], 1}, 0).value(), 1u);
  ASSERT_EQ(manager_->PromoteToGpu(kNs, {&keys[1], 1}, 1).value(), 1u);
  struct Want {
    GpuReach reach;
    std::vector<int> devices;  // per key: the gpu leased, -1 for host
  };
  const std::vector<Want> cases = {
      {GpuReach{}, {-1, -1, -1}},
      {GpuReach{0}, {0, -1, -1}},
      {GpuReach{1}, {-1, 1, -1}},
      {GpuReach{0, uint64_t{1} << 1}, {0, 1, -1}},     // gpu 1 peer to peer
      {GpuReach{-1, uint64_t{1} << 1}, {-1, 1, -1}},   // a GPU without a tier, reaching gpu 1
      {GpuReach{-1, uint64_t{1} << 5}, {-1, -1, -1}},  // a peer the daemon has no tier on
  };
  for (const Want& w : cases) {
    std::vector<BlockRead> reads = manager_->Acquire(kNs, keys, 7, {}, false, w.reach);
    for (size_t i = 0; i < keys.size(); ++i) {
      ASSERT_OK(reads[i].status);
      const int want = w.devices[i];
      EXPECT_EQ(reads[i].from, want >= 0 ? Tier::kGpu : Tier::kHost)
          << "reach " << w.reach.device << "/" << w.reach.peers << ", block " << i;
      if (want >= 0) {
        EXPECT_EQ(reads[i].gpu_device, want);
        const std::vector<uint8_t>& bytes = expected_[{kNs, keys[i]}];
        EXPECT_EQ(reads[i].device_checksum, kernels::DeviceChecksumCpu(bytes.data(), bytes.size()));
      }
      manager_->Release(reads[i]);
    }
  }
  // A gpu copy leased by a peer reader stays while the lease does.
  std::vector<BlockRead> held =
      manager_->Acquire(kNs, {&keys[1], 1}, 7, {}, false, GpuReach{0, uint64_t{1} << 1});
  ASSERT_EQ(held[0].from, Tier::kGpu);
  EXPECT_EQ(manager_->Evict(kNs, Tier::kGpu, {&keys[1], 1}).evicted, 0u);
  manager_->Release(held[0]);
  EXPECT_EQ(manager_->Evict(kNs, Tier::kGpu, {&keys[1], 1}).evicted, 1u);
}

TEST_F(TierManagerGpuTest, AFullGpuDropsItsColdestTailsFirst) {
  // 300 KiB blocks: three fit a 1 MiB segment, six fill gpu 0.
  const Keys a = PutChain(100, std::vector<uint64_t>(6, 300 * kKiB));
  ASSERT_EQ(manager_->PromoteToGpu(kNs, a, 0).value(), 6u);
  const Keys b = PutChain(200, std::vector<uint64_t>(3, 300 * kKiB));
  ASSERT_EQ(manager_->PromoteToGpu(kNs, b, 0).value(), 3u);
  // A's tail left the gpu, tail first; its head and all of B are there, byte exact.
  EXPECT_EQ(TiersOf(a), (std::vector<Tier>{Tier::kGpu, Tier::kGpu, Tier::kGpu, Tier::kHost,
                                           Tier::kHost, Tier::kHost}));
  for (int i = 0; i < 3; ++i) ExpectOnGpu(a[i], 0);
  for (const BlockKey& k : b) ExpectOnGpu(k, 0);
  const TierManagerStats s = manager_->GetStats();
  EXPECT_EQ(s.gpu_counters.evictions, 3u);
  EXPECT_EQ(s.gpus[0].blocks, 6u);
  EXPECT_LE(s.gpus[0].memory.allocated_bytes, s.gpus[0].memory.capacity_bytes);
  for (const BlockKey& k : a) ExpectServed(k);  // nothing left the cache
}

TEST_F(TierManagerGpuTest, GpuCopiesGoWithTheirHostCopies) {
  const Keys keys = PutChain(30, {128 * kKiB, 128 * kKiB, 128 * kKiB});
  ASSERT_EQ(manager_->PromoteToGpu(kNs, keys, 1).value(), 3u);
  EXPECT_EQ(GpuBlocks(1), 3u);
  DemoteAll(keys);  // host -> disk: the gpu copies go too
  EXPECT_EQ(TiersOf(keys), std::vector<Tier>(3, Tier::kDisk));
  EXPECT_EQ(GpuBlocks(1), 0u);
  EXPECT_EQ(manager_->GetStats().gpus[1].memory.allocated_bytes, 0u);
  for (const BlockKey& k : keys) ExpectServed(k);
}

TEST_F(TierManagerGpuTest, AdminEvictionFromGpuKeepsTheHostCopyAndGoesTailFirst) {
  const Keys keys = PutChain(40, {64 * kKiB, 64 * kKiB, 64 * kKiB});
  ASSERT_EQ(manager_->PromoteToGpu(kNs, keys, 0).value(), 3u);
  // The head alone: its children hold gpu copies, so it stays.
  EvictOutcome head = manager_->Evict(kNs, Tier::kGpu, {&keys[0], 1});
  EXPECT_EQ(head.evicted, 0u);
  EXPECT_EQ(head.skipped, 1u);
  EvictOutcome all = manager_->Evict(kNs, Tier::kGpu, {});
  EXPECT_EQ(all.evicted, 3u);
  EXPECT_EQ(TiersOf(keys), std::vector<Tier>(3, Tier::kHost));
  EXPECT_EQ(GpuBlocks(0), 0u);
  for (const BlockKey& k : keys) ExpectServed(k);
}

TEST_F(TierManagerGpuTest, AFailedCopyPlacesNothing) {
  const Keys keys = PutChain(50, {64 * kKiB, 64 * kKiB});
  gpu0_.FailNextWait(Status::Internal("injected: DMA error"));
  auto placed = manager_->PromoteToGpu(kNs, keys, 0);
  ASSERT_FALSE(placed.ok());
  EXPECT_NE(placed.status().message().find("injected"), std::string::npos);
  EXPECT_EQ(TiersOf(keys), std::vector<Tier>(2, Tier::kHost));
  EXPECT_EQ(GpuBlocks(0), 0u);
  EXPECT_EQ(manager_->GetStats().gpus[0].memory.allocated_bytes, 0u);
  // Nothing stays busy: the blocks still move as usual.
  DemoteAll(keys);
  for (const BlockKey& k : keys) ExpectServed(k);
  // And the next hint works (the reads above brought them back into host).
  EXPECT_EQ(manager_->PromoteToGpu(kNs, keys, 0).value(), 2u);
  for (const BlockKey& k : keys) ExpectOnGpu(k, 0);
}

TEST_F(TierManagerGpuTest, NamespacesGetTheirOwnGpuSegments) {
  const Keys mine = PutChain(60, {8 * kKiB});
  const Keys theirs = PutChain(70, {8 * kKiB}, /*ns=*/2);
  ASSERT_EQ(manager_->PromoteToGpu(kNs, mine, 0).value(), 1u);
  ASSERT_EQ(manager_->PromoteToGpu(2, theirs, 0).value(), 1u);
  auto a = manager_->GpuCopyForTest(kNs, mine[0]);
  auto b = manager_->GpuCopyForTest(2, theirs[0]);
  ASSERT_TRUE(a && b);
  EXPECT_NE(a->second.offset / kMiB, b->second.offset / kMiB) << "one segment, two namespaces";
  EXPECT_EQ(stack_.gpus[0]->SegmentsOf(kNs), 1u);
  EXPECT_EQ(stack_.gpus[0]->SegmentsOf(2), 1u);
  // A namespace never sees another's gpu copy.
  EXPECT_FALSE(manager_->GpuCopyForTest(kNs, theirs[0]).has_value());
}

// A namespace's first gpu copy, with both segments of gpu 0 held by another namespace, empties
// one of them (16 copies), not the coldest copies of both until one happens to empty (all 32).
TEST_F(TierManagerGpuTest, ANamespaceThatNeedsAGpuSegmentEmptiesOne) {
  Keys mine;
  for (int i = 0; i < 32; ++i) mine.push_back(PutChain(300 + 2 * i, {64 * kKiB})[0]);
  ASSERT_EQ(manager_->PromoteToGpu(kNs, mine, 0).value(), 32u);
  Keys shuffled = mine;
  std::mt19937 rng(5);
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  for (const BlockKey& k : shuffled) ExpectServed(k);  // recency scattered over both segments
  const Keys theirs = PutChain(400, {64 * kKiB}, /*ns=*/2);
  const uint64_t before = manager_->GetStats().gpu_counters.evictions;
  ASSERT_EQ(manager_->PromoteToGpu(2, theirs, 0).value(), 1u);
  EXPECT_EQ(manager_->GetStats().gpu_counters.evictions - before, 16u);
  EXPECT_EQ(GpuBlocks(0), 17u);
  int on_gpu = 0;
  for (const BlockKey& k : mine) {
    if (!manager_->GpuCopyForTest(kNs, k).has_value()) continue;
    ExpectOnGpu(k, 0);
    ++on_gpu;
  }
  EXPECT_EQ(on_gpu, 16);
  for (const BlockKey& k : mine) ExpectServed(k);  // host still holds every one
}

TEST_F(TierManagerGpuTest, AGpuQuotaKeepsANamespaceToItsSegmentsAndItsOwnBlocksGo) {
  NamespacePolicy limited = DefaultNamespacePolicy();
  limited.gpu_quota_bytes = kMiB;  // one segment on each GPU
  ASSERT_OK(manager_->SetNamespacePolicy(kNs, limited));
  const Keys mine = PutChain(80, std::vector<uint64_t>(5, 300 * kKiB));
  const Keys theirs = PutChain(90, {300 * kKiB}, /*ns=*/2);
  ASSERT_EQ(manager_->PromoteToGpu(2, theirs, 0).value(), 1u);
  // Three fit its one segment (a hint's own blocks are not in the gpu yet to make room)...
  EXPECT_EQ(manager_->PromoteToGpu(kNs, mine, 0).value(), 3u);
  // ... and the next hint pushes out its own coldest tail, never namespace 2's block.
  const Keys rest(mine.begin() + 3, mine.end());
  EXPECT_EQ(manager_->PromoteToGpu(kNs, rest, 0).value(), 2u);
  EXPECT_EQ(stack_.gpus[0]->SegmentsOf(kNs), 1u);
  EXPECT_TRUE(manager_->GpuCopyForTest(2, theirs[0]).has_value());
  int on_gpu = 0;
  for (const BlockKey& k : mine) on_gpu += manager_->GpuCopyForTest(kNs, k).has_value();
  EXPECT_EQ(on_gpu, 3);
  manager_->ClearNamespacePolicy(kNs);
  EXPECT_FALSE(stack_.gpus[0]->AtSegmentLimit(kNs));
}

TEST_F(TierManagerGpuTest, PlacementsRunOnTheGpuWorkerAndReadDiskBlocksUpFirst) {
  const Keys keys = PutChain(300, {200 * kKiB, 200 * kKiB, 200 * kKiB});
  DemoteAll({keys[1], keys[2]});  // only on disk now
  ASSERT_EQ(TiersOf(keys), (std::vector<Tier>{Tier::kHost, Tier::kDisk, Tier::kDisk}));
  auto placed = manager_->PlaceOnGpu(kNs, keys, 1, /*wait=*/true);
  ASSERT_TRUE(placed.ok()) << placed.status().ToString();
  EXPECT_EQ(*placed, 3u);
  for (const BlockKey& k : keys) ExpectOnGpu(k, 1);
  EXPECT_EQ(manager_->GetStats().gpu_counters.promotions, 3u);
  EXPECT_EQ(manager_->PlaceOnGpu(kNs, keys, 9, true).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(TierManagerGpuTest, AQueuedPlacementLandsInTheGpuAfterTheCallReturns) {
  const Keys keys = PutChain(310, {100 * kKiB, 100 * kKiB});
  DemoteAll({keys[1]});
  auto queued = manager_->PlaceOnGpu(kNs, keys, 0, /*wait=*/false);
  ASSERT_TRUE(queued.ok()) << queued.status().ToString();
  EXPECT_EQ(*queued, 0u);
  manager_->WaitIdleForTest();  // the worker ran it
  for (const BlockKey& k : keys) ExpectOnGpu(k, 0);
  EXPECT_EQ(GpuBlocks(0), 2u);
}

TEST_F(TierManagerGpuTest, PlacementsAfterShutdownAreRefused) {
  const Keys keys = PutChain(320, {100 * kKiB});
  manager_->Shutdown();
  EXPECT_EQ(manager_->PlaceOnGpu(kNs, keys, 0, /*wait=*/true).status().code(),
            StatusCode::kUnavailable);
}

TEST_F(TierManagerGpuTest, ACopyThatLandsDamagedOnTheGpuIsNotPlaced) {
  const Keys keys = PutChain(330, {64 * kKiB, 64 * kKiB});
  gpu0_.CorruptNextCopy();  // the first block's copy arrives with a flipped byte
  auto placed = manager_->PromoteToGpu(kNs, keys, 0);
  ASSERT_TRUE(placed.ok()) << placed.status().ToString();
  EXPECT_EQ(*placed, 1u);
  EXPECT_FALSE(manager_->GpuCopyForTest(kNs, keys[0]).has_value());
  ExpectOnGpu(keys[1], 0);
  const TierManagerStats s = manager_->GetStats();
  EXPECT_EQ(s.checksum_failures, 1u);
  EXPECT_EQ(s.gpus[0].blocks, 1u);
  EXPECT_GE(gpu0_.counters().checksums, 2u);  // both copies were checked on the device
  ExpectServed(keys[0]);                      // host still has the good bytes
}

TEST_F(TierManagerGpuTest, AReportedDamagedCopyIsDroppedOnlyWhenTheDaemonFindsItBadToo) {
  const Keys keys = PutChain(340, {64 * kKiB, 64 * kKiB});
  ASSERT_EQ(manager_->PromoteToGpu(kNs, keys, 0).value(), 2u);
  // A report about good copies drops nothing (a client's word alone does not).
  EXPECT_EQ(manager_->DropDamagedGpuCopies(kNs, keys), 0u);
  EXPECT_EQ(TiersOf(keys), std::vector<Tier>(2, Tier::kGpu));
  // Block 0's copy goes bad: it alone is dropped, though block 1 (its child) is still in gpu.
  auto copy = manager_->GpuCopyForTest(kNs, keys[0]);
  ASSERT_TRUE(copy.has_value());
  const uint8_t junk = 0x5A;
  gpu0_.Write(stack_.gpus[0]->Data(copy->second) + 7, &junk, 1);
  EXPECT_EQ(manager_->DropDamagedGpuCopies(kNs, keys), 1u);
  EXPECT_EQ(TiersOf(keys), (std::vector<Tier>{Tier::kHost, Tier::kGpu}));
  EXPECT_EQ(manager_->GetStats().checksum_failures, 1u);
  ExpectServed(keys[0]);  // host still serves it, byte exact
}

TEST_F(TierManagerGpuTest, AWaitThatEndsFirstLeavesThePlacementGoingOn) {
  const Keys keys = PutChain(350, {64 * kKiB, 64 * kKiB});
  DemoteAll(keys);  // a disk read first: the worker cannot be done at once
  auto placed = manager_->PlaceOnGpu(kNs, keys, 0, /*wait=*/true, absl::ZeroDuration());
  if (placed.ok()) {
    EXPECT_EQ(*placed, 2u);  // the worker was faster than the wait's end: fine too
  } else {
    EXPECT_EQ(placed.status().code(), StatusCode::kDeadlineExceeded) << placed.status().ToString();
  }
  manager_->WaitIdleForTest();
  for (const BlockKey& k : keys) ExpectOnGpu(k, 0);
  // The next waited placement answers as always.
  const Keys more = PutChain(360, {64 * kKiB});
  auto next = manager_->PlaceOnGpu(kNs, more, 0, /*wait=*/true);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(*next, 1u);
}

TEST_F(TierManagerGpuTest, APutIntoTheGpuIsServedFromThereAndFromTheHostCopyMadeOfIt) {
  const Keys keys = ChainKeys(400, 3);
  const std::vector<uint64_t> sizes = {100 * kKiB, 4097, 1};
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_OK(PutIntoGpu(keys[i], sizes[i], i ? keys[i - 1] : BlockKey{}));
  }
  // A reader of host right after the commit waits for the host copy, then gets the bytes put.
  ExpectServed(keys[2]);
  manager_->WaitIdleForTest();
  for (const BlockKey& k : keys) {
    ExpectOnGpu(k, 0);
    ExpectServed(k);
  }
  EXPECT_EQ(TiersOf(keys), std::vector<Tier>(3, Tier::kGpu));
  // A reader on that GPU leases the gpu copy, with the device checksum the writer committed.
  std::vector<BlockRead> reads = manager_->Acquire(kNs, keys, 7, {}, false, GpuReach{0});
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_OK(reads[i].status);
    EXPECT_EQ(reads[i].from, Tier::kGpu);
    const std::vector<uint8_t>& want = expected_[{kNs, keys[i]}];
    EXPECT_EQ(reads[i].device_checksum, kernels::DeviceChecksumCpu(want.data(), want.size()));
    manager_->Release(reads[i]);
  }
  const TierManagerStats s = manager_->GetStats();
  EXPECT_EQ(s.gpu_puts, 3u);
  EXPECT_EQ(s.gpus[0].blocks, 3u);
  EXPECT_EQ(s.host_blocks, 3u);
  EXPECT_EQ(s.gpu_counters.promotions, 0u);  // nothing copied up: the writer put it there
  EXPECT_EQ(gpu0_.counters().to_host_copies, 3u);
  EXPECT_EQ(gpu0_.counters().to_device_copies, 0u);
  ExpectHostAccountingConsistent();
  // The chain is one chain: tail first holds for its gpu and host copies alike.
  EXPECT_EQ(manager_->Evict(kNs, Tier::kGpu, {keys.data(), 1}).skipped, 1u);
  EXPECT_EQ(manager_->Evict(kNs, Tier::kGpu, keys).evicted, 3u);
  EXPECT_EQ(TiersOf(keys), std::vector<Tier>(3, Tier::kHost));
  for (const BlockKey& k : keys) ExpectServed(k);
}

TEST_F(TierManagerGpuTest, AGpuSlotThatDoesNotMatchItsDeviceChecksumIsRefused) {
  const BlockKey key = KeyOf(410);
  const Status st = PutIntoGpu(key, 64 * kKiB, {}, 0, /*damage=*/1);
  EXPECT_EQ(st.code(), StatusCode::kCorruption) << st.ToString();
  ExpectMiss(key);
  const TierManagerStats s = manager_->GetStats();
  EXPECT_EQ(s.checksum_failures, 1u);
  EXPECT_EQ(s.reservations_active, 0u);
  EXPECT_EQ(s.gpus[0].memory.blocks, 0u);  // both slots freed
  EXPECT_EQ(s.host.blocks, 0u);
  EXPECT_EQ(s.gpu_puts, 0u);
}

TEST_F(TierManagerGpuTest, AHostCopyDamagedOnItsWayDownDropsTheBlock) {
  const BlockKey key = KeyOf(420);
  gpu0_.CorruptNextCopy();  // the worker's copy down is the next copy to run
  ASSERT_OK(PutIntoGpu(key, 64 * kKiB));
  manager_->WaitIdleForTest();
  ExpectMiss(key);  // never served with wrong bytes: gone from gpu and host
  const TierManagerStats s = manager_->GetStats();
  EXPECT_EQ(s.checksum_failures, 1u);
  EXPECT_EQ(s.blocks_lost, 1u);
  EXPECT_EQ(s.gpus[0].memory.blocks, 0u);
  EXPECT_EQ(s.host_blocks, 0u);
  ExpectHostAccountingConsistent();
}

TEST_F(TierManagerGpuTest, GpuSlotsAreOnlyWhereTheyCanBeUsed) {
  const std::vector<uint8_t> bytes = BytesFor(KeyOf(430), 8 * kKiB);
  const PutRequestItem item = ItemFor(KeyOf(430), bytes, {});
  // No gpu tier on that device.
  std::vector<ReserveOutcome> r = manager_->Reserve(kNs, 1, {&item, 1}, {.gpu_device = 5});
  EXPECT_EQ(r[0].status.code(), StatusCode::kInvalidArgument) << r[0].status.ToString();
  // A device checksum for a host slot is refused, and the reservation is gone.
  r = manager_->Reserve(kNs, 1, {&item, 1});
  ASSERT_EQ(r[0].state, ReserveState::kReserved);
  EXPECT_EQ(r[0].gpu_device, -1);
  const uint64_t dsum = 42;
  EXPECT_EQ(manager_->CommitToGpu(1, {&r[0].reservation_id, 1}, {&dsum, 1})[0].code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(manager_->GetStats().reservations_active, 0u);
  // A gpu reservation committed the ordinary way uses its host slot and frees its gpu slot.
  r = manager_->Reserve(kNs, 1, {&item, 1}, {.gpu_device = 0});
  ASSERT_EQ(r[0].gpu_device, 0);
  Result<ReservationTarget> t = manager_->TargetOf(1, r[0].reservation_id);
  ASSERT_OK(t.status());
  std::memcpy(t->data, bytes.data(), bytes.size());
  ASSERT_OK(manager_->Commit(1, r[0].reservation_id));
  expected_[{kNs, KeyOf(430)}] = bytes;
  ExpectServed(KeyOf(430));
  EXPECT_EQ(manager_->GetStats().gpus[0].memory.blocks, 0u);
  EXPECT_EQ(TiersOf({KeyOf(430)}), std::vector<Tier>{Tier::kHost});
  // A namespace that writes to disk on commit needs its bytes in host then: host slots only.
  constexpr NamespaceId kThrough = 9;
  Result<NamespacePolicy> through = ComposePolicy("", "write-through", "", "");
  ASSERT_OK(through.status());
  ASSERT_OK(manager_->SetNamespacePolicy(kThrough, *through));
  r = manager_->Reserve(kThrough, 1, {&item, 1}, {.gpu_device = 0});
  ASSERT_EQ(r[0].state, ReserveState::kReserved);
  EXPECT_EQ(r[0].gpu_device, -1);
  manager_->Abort(1, r[0].reservation_id);
}

// A writer that reserved gpu slots and never commits (it died, or its connection did) gives back
// both slots of each block: at once when its owner goes, or when the reservation expires.
TEST_F(TierManagerGpuTest, AWriterThatGoesAwayGivesItsGpuSlotsBack) {
  options_.clock = &clock_;
  options_.reservation_timeout = std::chrono::seconds(30);
  Reopen();
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<PutRequestItem> items;
  for (uint64_t i = 0; i < 3; ++i) bytes.push_back(BytesFor(KeyOf(470 + i), 200 * kKiB));
  for (uint64_t i = 0; i < 3; ++i) items.push_back(ItemFor(KeyOf(470 + i), bytes[i], {}));
  auto expect_all_back = [&] {
    const TierManagerStats s = manager_->GetStats();
    EXPECT_EQ(s.reservations_active, 0u);
    EXPECT_EQ(s.gpus[0].memory.blocks, 0u);
    EXPECT_EQ(s.host.blocks, 0u);
    for (uint64_t i = 0; i < 3; ++i) ExpectMiss(KeyOf(470 + i));
  };
  // The owner goes (its connection closed): AbortOwner.
  std::vector<ReserveOutcome> r = manager_->Reserve(kNs, /*owner=*/5, items, {.gpu_device = 0});
  for (const ReserveOutcome& o : r) ASSERT_EQ(o.gpu_device, 0);
  EXPECT_EQ(manager_->GetStats().gpus[0].memory.blocks, 3u);
  manager_->AbortOwner(5);
  expect_all_back();
  // The owner stays but never commits: the reservations expire.
  r = manager_->Reserve(kNs, /*owner=*/6, items, {.gpu_device = 0});
  for (const ReserveOutcome& o : r) ASSERT_EQ(o.gpu_device, 0);
  clock_.Advance(std::chrono::seconds(31));
  manager_->WaitFlusherRoundForTest();
  expect_all_back();
  const uint64_t dsum = 0;
  EXPECT_EQ(manager_->CommitToGpu(6, {&r[0].reservation_id, 1}, {&dsum, 1})[0].code(),
            StatusCode::kNotFound);
  // The slots serve the next writer.
  for (uint64_t i = 0; i < 3; ++i) {
    ASSERT_OK(PutIntoGpu(KeyOf(480 + i), 200 * kKiB));
  }
  EXPECT_EQ(GpuBlocks(0), 3u);
}

TEST_F(TierManagerGpuTest, AFullGpuPutsIntoHostInstead) {
  // Every gpu page leased: no gpu copy can be dropped for room.
  const Keys held = PutChain(440, {1 * kMiB, 1 * kMiB});
  ASSERT_EQ(manager_->PromoteToGpu(kNs, held, 0).value(), 2u);
  std::vector<BlockRead> leases = manager_->Acquire(kNs, held, 7, {}, false, GpuReach{0});
  const std::vector<uint8_t> bytes = BytesFor(KeyOf(450), 8 * kKiB);
  const PutRequestItem item = ItemFor(KeyOf(450), bytes, {});
  std::vector<ReserveOutcome> r = manager_->Reserve(kNs, 1, {&item, 1}, {.gpu_device = 0});
  ASSERT_EQ(r[0].state, ReserveState::kReserved);
  EXPECT_EQ(r[0].gpu_device, -1);  // a host slot, as without a device
  manager_->Abort(1, r[0].reservation_id);
  for (BlockRead& l : leases) manager_->Release(l);
}

TEST_F(TierManagerGpuTest, ABlockPutIntoTheGpuSurvivesARestart) {
  options_.flush_on_shutdown = true;
  const Keys keys = ChainKeys(460, 2);
  ASSERT_OK(PutIntoGpu(keys[0], 32 * kKiB));
  ASSERT_OK(PutIntoGpu(keys[1], 32 * kKiB, keys[0]));
  Reopen();  // at once: the host copies are made by the worker or at shutdown, then written
  EXPECT_EQ(TiersOf(keys), std::vector<Tier>(2, Tier::kDisk));
  for (const BlockKey& k : keys) ExpectServed(k);
}

TEST_F(TierManagerGpuTest, AReaderOfHostWaitsForTheCopyDownOfAPutIntoTheGpu) {
  const BlockKey key = KeyOf(470);
  gpu0_.HoldNextCopies();  // the copy down stays on its way until released
  ASSERT_OK(PutIntoGpu(key, 48 * kKiB));
  gpu0_.WaitUntilHeld();
  EXPECT_EQ(TiersOf({key}), std::vector<Tier>{Tier::kGpu});  // found at once
  auto reader = std::async(std::launch::async, [&] { ExpectServed(key); });
  // Not served while its host slot does not hold the bytes yet.
  EXPECT_EQ(reader.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  gpu0_.ReleaseHeldWait();
  reader.get();
  EXPECT_EQ(manager_->GetStats().leases_active, 0u);
}

TEST_F(TierManagerGpuTest, APlacementQueuedBeforeAPutIntoTheGpuDoesNotWaitForIt) {
  // The GPU's worker busy with a copy down; a placement of a block not yet cached queued behind
  // it; then that block put into the gpu: its copy down queues behind the placement, which must
  // not wait for it (it would wait forever, and so would every reader of host).
  const BlockKey first = KeyOf(480);
  const BlockKey second = KeyOf(481);
  gpu0_.HoldNextCopies();
  ASSERT_OK(PutIntoGpu(first, 16 * kKiB));
  gpu0_.WaitUntilHeld();
  ASSERT_OK(manager_->PlaceOnGpu(kNs, {&second, 1}, 0, /*wait=*/false));
  ASSERT_OK(PutIntoGpu(second, 16 * kKiB));
  gpu0_.ReleaseHeldWait();
  ExpectServed(first);
  ExpectServed(second);
  manager_->WaitIdleForTest();
}

TEST_F(TierManagerGpuTest, CopiesDownStillQueuedAtShutdownAreMadeAndFlushed) {
  options_.flush_on_shutdown = true;
  const BlockKey first = KeyOf(490);
  const BlockKey second = KeyOf(491);
  gpu0_.HoldNextCopies();
  ASSERT_OK(PutIntoGpu(first, 16 * kKiB));
  gpu0_.WaitUntilHeld();
  ASSERT_OK(PutIntoGpu(second, 16 * kKiB));  // its copy down queued behind the held one
  // Shut down meanwhile: the worker ends with the held copy, and the queued one is made at Stop,
  // before the flush writes both down.
  auto closing = std::async(std::launch::async, [&] { Close(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  gpu0_.ReleaseHeldWait();
  closing.get();
  Open();
  EXPECT_EQ(TiersOf({first, second}), std::vector<Tier>(2, Tier::kDisk));
  ExpectServed(first);
  ExpectServed(second);
}

// A segment moving to another namespace gets fresh memory first; where the GPU has none (a
// client still importing old memory keeps it allocated), the renewal fails. The segment is then
// nobody's and renewed again when next needed, not lost for good; and the allocation that met
// the failure evicts nothing more for renewals that would fail the same way.
TEST_F(TierManagerGpuTest, ARenewalThatFindsNoMemoryIsRetriedLaterAndEvictsNothingMore) {
  constexpr NamespaceId kOther = 2;
  const BlockKey first = KeyOf(700), second = KeyOf(701), theirs = KeyOf(702);
  ASSERT_OK(Put(theirs, 700 * kKiB, {}, kOther));
  VacateAGpuSegment(first, second);

  gpu0_.FailNextRenewals(1);
  manager_->PromoteToGpu(kOther, {&theirs, 1}, 0).status().IgnoreError();
  EXPECT_FALSE(manager_->GpuCopyForTest(kOther, theirs).has_value());
  EXPECT_TRUE(manager_->GpuCopyForTest(kNs, second).has_value())
      << "a block was evicted for a renewal that could not succeed";

  // The GPU has memory again: the same segment is renewed and serves the other namespace.
  ASSERT_EQ(manager_->PromoteToGpu(kOther, {&theirs, 1}, 0).value(), 1u);
  auto copy = manager_->GpuCopyForTest(kOther, theirs);
  ASSERT_TRUE(copy.has_value());
  const std::vector<uint8_t>& want = expected_[std::make_pair(kOther, theirs)];
  EXPECT_EQ(gpu0_.Read(stack_.gpus[0]->Data(copy->second), copy->second.length), want);
  EXPECT_TRUE(manager_->GpuCopyForTest(kNs, second).has_value());
  EXPECT_EQ(GpuBlocks(0), 2u);
}

// A gpu segment moving to another namespace gets fresh memory without the tier manager's lock:
// other requests go on meanwhile.
TEST_F(TierManagerGpuTest, AGpuSegmentIsRenewedWithoutHoldingUpOtherRequests) {
  constexpr NamespaceId kOther = 2;
  const BlockKey first = KeyOf(730), second = KeyOf(731), theirs = KeyOf(732);
  ASSERT_OK(Put(theirs, 700 * kKiB, {}, kOther));
  VacateAGpuSegment(first, second);

  gpu0_.HoldNextRenewal();
  Result<uint32_t> placed = 0u;
  std::thread promote([&] { placed = manager_->PromoteToGpu(kOther, {&theirs, 1}, 0); });
  gpu0_.WaitUntilRenewalHeld();
  // While the renewal holds: a put and a read of another namespace's block, and a gpu copy of
  // the same device dropped (the gpu tier's own lock), which would wait for the renewal if it
  // held either lock (so they run on a thread of their own, given 10 s).
  const BlockKey meanwhile = KeyOf(733);
  Status put;
  std::atomic<bool> done{false};
  std::thread other([&] {
    put = Put(meanwhile, 16 * kKiB);
    ExpectServed(second);
    EXPECT_EQ(manager_->Evict(kNs, Tier::kGpu, {&second, 1}).evicted, 1u);
    done = true;
  });
  for (int i = 0; i < 1000 && !done; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(done) << "a put and a read waited for a gpu segment's renewal";
  gpu0_.ReleaseHeldRenewal();
  other.join();
  promote.join();
  ASSERT_OK(put);
  ExpectServed(meanwhile);
  ASSERT_TRUE(placed.ok()) << placed.status().ToString();
  EXPECT_EQ(*placed, 1u);
  auto copy = manager_->GpuCopyForTest(kOther, theirs);
  ASSERT_TRUE(copy.has_value());
  EXPECT_EQ(gpu0_.Read(stack_.gpus[0]->Data(copy->second), copy->second.length),
            (expected_[std::make_pair(kOther, theirs)]));
  EXPECT_FALSE(manager_->GpuCopyForTest(kNs, second).has_value());
  ExpectServed(second);
}

// A put with a gpu slot lets the lock go while a segment is renewed for it. Where that renewal
// fails, another put of the same block may have reserved it meanwhile: the first does not
// reserve it a second time (which the reservation table refuses by aborting the daemon).
TEST_F(TierManagerGpuTest, ABlockReservedWhileAGpuRenewalFailedIsNotReservedTwice) {
  constexpr NamespaceId kOther = 2;
  const BlockKey first = KeyOf(740), second = KeyOf(741), key = KeyOf(742);
  VacateAGpuSegment(first, second);
  gpu0_.HoldNextRenewal();
  gpu0_.FailNextRenewals(1);
  const std::vector<uint8_t> bytes = BytesFor(key, 64 * kKiB);
  const PutRequestItem item = ItemFor(key, bytes, {});
  std::vector<ReserveOutcome> with_gpu;
  std::thread put([&] {
    with_gpu = manager_->Reserve(kOther, /*owner=*/1, {&item, 1}, {.gpu_device = 0});
  });
  gpu0_.WaitUntilRenewalHeld();
  const std::vector<ReserveOutcome> plain = manager_->Reserve(kOther, /*owner=*/2, {&item, 1});
  ASSERT_EQ(plain[0].state, ReserveState::kReserved);
  gpu0_.ReleaseHeldRenewal();
  put.join();
  EXPECT_EQ(with_gpu[0].state, ReserveState::kInProgress);
  manager_->AbortOwner(2);
}

// A prefetch onto a GPU that outwaits its limit stays queued; repeated, such prefetches would
// grow the GPU worker's queue without bound. Past 256 queued, they are refused.
TEST_F(TierManagerGpuTest, WaitingPlacementsThatTimeOutDoNotQueueWithoutBound) {
  const Keys keys = PutChain(720, {16 * kKiB});
  const BlockKey held = KeyOf(730);
  gpu0_.HoldNextCopies();  // the worker is stuck on a copy until released
  ASSERT_OK(PutIntoGpu(held, 16 * kKiB));
  gpu0_.WaitUntilHeld();
  int timed_out = 0;
  Status refused;
  for (int i = 0; i < 300 && refused.ok(); ++i) {
    Result<uint32_t> r = manager_->PlaceOnGpu(kNs, keys, 0, /*wait=*/true, absl::Milliseconds(1));
    if (r.status().code() == StatusCode::kDeadlineExceeded) {
      ++timed_out;
    } else {
      refused = r.status();
    }
  }
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted) << refused.ToString();
  EXPECT_GE(timed_out, 200);
  EXPECT_LE(timed_out, 256);
  gpu0_.ReleaseHeldWait();
  manager_->WaitIdleForTest();
  ExpectServed(held);
  EXPECT_TRUE(manager_->GpuCopyForTest(kNs, keys[0]).has_value());
}

}  // namespace
}  // namespace kvpool::tiers
