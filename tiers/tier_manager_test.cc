// TierManager over a small real host arena (8 MiB, 1 MiB segments) and a RocksStore in a fresh
// temporary directory: put-if-absent, leases, demotion and promotion tail first, verification
// of every disk read, session pins, recovery, admin eviction and concurrent clients. Every block
// read back is compared with an independent copy of the bytes that were put.

#include "tiers/tier_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "common/checksum.h"
#include "tiers/tier_manager_test_fixture.h"
#include "tiers/without_memfds_for_test.h"

namespace kvpool::tiers {
namespace {

TEST_F(TierManagerTest, ReserveCommitAcquireIsByteIdentical) {
  Open();
  const std::vector<uint64_t> sizes = {1, 100, 4095, 4096, 4097, 100000, 300 * kKiB + 7, kMiB};
  std::vector<BlockKey> keys;
  for (size_t i = 0; i < sizes.size(); ++i) {
    keys.push_back(KeyOf(i));
    ASSERT_TRUE(Put(keys.back(), sizes[i]).ok());
  }
  for (const BlockKey& k : keys) ExpectServed(k);

  // A batch with a missing key: that one is a miss, the others are served.
  std::vector<BlockKey> batch = {keys[0], KeyOf(999), keys[5]};
  std::vector<BlockRead> reads = manager_->Acquire(kNs, batch);
  ASSERT_EQ(reads.size(), 3u);
  EXPECT_TRUE(reads[0].status.ok());
  EXPECT_TRUE(reads[1].status.IsNotFound());
  EXPECT_TRUE(reads[2].status.ok());
  EXPECT_EQ(reads[0].from, Tier::kHost);
  EXPECT_EQ(std::memcmp(reads[2].data, expected_[{kNs, keys[5]}].data(), sizes[5]), 0);
  EXPECT_EQ(manager_->GetStats().leases_active, 2u);
  for (BlockRead& r : reads) manager_->Release(r);
  EXPECT_EQ(manager_->GetStats().leases_active, 0u);

  // Namespaces are separate: the same key is a miss elsewhere.
  ExpectMiss(keys[0], /*ns=*/2);
  const TierManagerStats s = manager_->GetStats();
  EXPECT_EQ(s.host_blocks, sizes.size());
  EXPECT_GE(s.host_counters.hits, sizes.size());
  ExpectHostAccountingConsistent();
}

TEST_F(TierManagerTest, PutIfAbsent) {
  Open();
  const BlockKey key = KeyOf(1);
  const std::vector<uint8_t> bytes = BytesFor(key, 5000);
  const PutRequestItem item = ItemFor(key, bytes);

  auto r1 = manager_->Reserve(kNs, /*owner=*/1, {&item, 1});
  ASSERT_EQ(r1[0].state, ReserveState::kReserved);
  // While it is being written, nobody else gets to write it (nor the same owner twice).
  EXPECT_EQ(manager_->Reserve(kNs, 2, {&item, 1})[0].state, ReserveState::kInProgress);
  EXPECT_EQ(manager_->Reserve(kNs, 1, {&item, 1})[0].state, ReserveState::kInProgress);
  // Another namespace writes its own copy.
  auto other = manager_->Reserve(2, 3, {&item, 1});
  EXPECT_EQ(other[0].state, ReserveState::kReserved);
  manager_->Abort(3, other[0].reservation_id);
  // Not visible before commit.
  ExpectMiss(key);

  Result<ReservationTarget> t = manager_->TargetOf(1, r1[0].reservation_id);
  ASSERT_TRUE(t.ok());
  std::memcpy(t->data, bytes.data(), bytes.size());
  ASSERT_TRUE(manager_->Commit(1, r1[0].reservation_id).ok());
  expected_[{kNs, key}] = bytes;

  EXPECT_EQ(manager_->Reserve(kNs, 2, {&item, 1})[0].state, ReserveState::kPresent);
  EXPECT_EQ(manager_->Reserve(kNs, 1, {&item, 1})[0].state, ReserveState::kPresent);
  // The reservation is spent.
  EXPECT_EQ(manager_->Commit(1, r1[0].reservation_id).code(), StatusCode::kNotFound);
  EXPECT_FALSE(manager_->TargetOf(1, r1[0].reservation_id).ok());
  ExpectServed(key);
  EXPECT_EQ(manager_->GetStats().reservations_active, 0u);
  ExpectHostAccountingConsistent();
}

TEST_F(TierManagerTest, ASecondWriterWaitsForTheFirstOnesPut) {
  Open();
  const BlockKey key = KeyOf(1);
  const std::vector<uint8_t> bytes = BytesFor(key, 5000);
  const PutRequestItem item = ItemFor(key, bytes);
  // Nobody is writing it: nothing to wait for, and it is not cached.
  EXPECT_FALSE(manager_->AwaitInFlightPut(kNs, key, std::chrono::seconds(0)));

  // The first writer aborts: the second learns the block is still absent.
  auto r1 = manager_->Reserve(kNs, /*owner=*/1, {&item, 1});
  ASSERT_EQ(r1[0].state, ReserveState::kReserved);
  ASSERT_EQ(manager_->Reserve(kNs, 2, {&item, 1})[0].state, ReserveState::kInProgress);
  std::thread aborter([&] { manager_->Abort(1, r1[0].reservation_id); });
  EXPECT_FALSE(manager_->AwaitInFlightPut(kNs, key, std::chrono::seconds(30)));
  aborter.join();

  // The first writer commits while the second waits: the block is there when the wait ends.
  r1 = manager_->Reserve(kNs, 1, {&item, 1});
  ASSERT_EQ(r1[0].state, ReserveState::kReserved);
  std::thread committer([&] {
    Result<ReservationTarget> t = manager_->TargetOf(1, r1[0].reservation_id);
    ASSERT_TRUE(t.ok());
    std::memcpy(t->data, bytes.data(), bytes.size());
    ASSERT_TRUE(manager_->Commit(1, r1[0].reservation_id).ok());
  });
  EXPECT_TRUE(manager_->AwaitInFlightPut(kNs, key, std::chrono::seconds(30)));
  committer.join();
  expected_[{kNs, key}] = bytes;
  ExpectServed(key);
}

TEST_F(TierManagerTest, ReserveOfABatchAnswersEachItem) {
  Open();
  ASSERT_TRUE(Put(KeyOf(1), 1000).ok());
  std::vector<uint8_t> b2 = BytesFor(KeyOf(2), 2000);
  std::vector<uint8_t> b1 = BytesFor(KeyOf(1), 1000);
  std::vector<PutRequestItem> items = {ItemFor(KeyOf(1), b1), ItemFor(KeyOf(2), b2),
                                       ItemFor(KeyOf(3), b2)};
  items[2].size = 0;
  auto r = manager_->Reserve(kNs, 1, items);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].state, ReserveState::kPresent);
  EXPECT_EQ(r[1].state, ReserveState::kReserved);
  EXPECT_EQ(r[2].state, ReserveState::kRefused);
  EXPECT_EQ(r[2].status.code(), StatusCode::kInvalidArgument);
}

TEST_F(TierManagerTest, RefusesEmptyAndOversizedBlocks) {
  Open();
  const uint64_t baseline = host_->allocated_bytes();
  PutRequestItem item;
  item.key = KeyOf(1);
  for (uint64_t size : {uint64_t{0}, manager_->max_block_bytes() + 1, uint64_t{1} << 40}) {
    item.size = size;
    auto r = manager_->Reserve(kNs, 1, {&item, 1});
    EXPECT_EQ(r[0].state, ReserveState::kRefused) << size;
    EXPECT_EQ(r[0].status.code(), StatusCode::kInvalidArgument) << size;
  }
  EXPECT_EQ(host_->allocated_bytes(), baseline);
  EXPECT_EQ(manager_->GetStats().reservations_active, 0u);
}

TEST_F(TierManagerTest, ReservationsBelongToTheirOwner) {
  Open();
  const BlockKey key = KeyOf(1);
  const std::vector<uint8_t> bytes = BytesFor(key, 7000);
  const PutRequestItem item = ItemFor(key, bytes);
  auto r = manager_->Reserve(kNs, /*owner=*/10, {&item, 1});
  ASSERT_EQ(r[0].state, ReserveState::kReserved);
  const uint64_t rid = r[0].reservation_id;
  EXPECT_EQ(manager_->TargetOf(11, rid).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(manager_->Commit(11, rid).code(), StatusCode::kNotFound);
  manager_->Abort(11, rid);  // not the owner's: ignored
  manager_->AbortOwner(11);
  EXPECT_EQ(manager_->GetStats().reservations_active, 1u);
  Result<ReservationTarget> t = manager_->TargetOf(10, rid);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->size, bytes.size());
  EXPECT_EQ(t->offset % HostTier::kPageBytes, 0u);
  std::memcpy(t->data, bytes.data(), bytes.size());
  ASSERT_TRUE(manager_->Commit(10, rid).ok());
  expected_[{kNs, key}] = bytes;
  ExpectServed(key);
}

TEST_F(TierManagerTest, WrongChecksumAtCommitIsCorruptionAndReclaimsTheSlot) {
  Open();
  const uint64_t baseline = host_->allocated_bytes();
  const BlockKey key = KeyOf(1);
  std::vector<uint8_t> bytes = BytesFor(key, 64 * kKiB + 3);
  const PutRequestItem item = ItemFor(key, bytes);
  auto r = manager_->Reserve(kNs, 1, {&item, 1});
  ASSERT_EQ(r[0].state, ReserveState::kReserved);
  Result<ReservationTarget> t = manager_->TargetOf(1, r[0].reservation_id);
  ASSERT_TRUE(t.ok());
  EXPECT_GT(host_->allocated_bytes(), baseline);
  bytes[12345] ^= 0x01;  // one bit damaged in transfer
  std::memcpy(t->data, bytes.data(), bytes.size());
  Status st = manager_->Commit(1, r[0].reservation_id);
  EXPECT_EQ(st.code(), StatusCode::kCorruption) << st.ToString();

  EXPECT_EQ(host_->allocated_bytes(), baseline);
  const TierManagerStats s = manager_->GetStats();
  EXPECT_EQ(s.reservations_active, 0u);
  EXPECT_EQ(s.checksum_failures, 1u);
  EXPECT_EQ(s.host_blocks, 0u);
  ExpectMiss(key);
  EXPECT_EQ(manager_->Lookup(kNs, {&key, 1}, false).hit_blocks, 0u);
  // The key is free to be put again, and then served right.
  ASSERT_TRUE(Put(key, 64 * kKiB + 3).ok());
  ExpectServed(key);
}

TEST_F(TierManagerTest, AbortOwnerReclaimsEverySlot) {
  Open();
  const uint64_t baseline = host_->allocated_bytes();
  std::vector<PutRequestItem> items;
  std::vector<std::vector<uint8_t>> bytes;
  for (int i = 0; i < 6; ++i) {
    bytes.push_back(BytesFor(KeyOf(i), 100 * kKiB + i));
    items.push_back(ItemFor(KeyOf(i), bytes.back()));
  }
  auto r = manager_->Reserve(kNs, /*owner=*/7, items);
  for (const auto& o : r) ASSERT_EQ(o.state, ReserveState::kReserved);
  // Another owner's reservation is not touched.
  const std::vector<uint8_t> keep = BytesFor(KeyOf(100), 5000);
  const PutRequestItem keep_item = ItemFor(KeyOf(100), keep);
  auto kr = manager_->Reserve(kNs, /*owner=*/8, {&keep_item, 1});
  ASSERT_EQ(kr[0].state, ReserveState::kReserved);
  const uint64_t with_keep_only = baseline + 8192;  // 5000 bytes: two pages
  EXPECT_GT(host_->allocated_bytes(), with_keep_only);

  manager_->AbortOwner(7);
  EXPECT_EQ(host_->allocated_bytes(), with_keep_only);
  EXPECT_EQ(manager_->GetStats().reservations_active, 1u);
  for (const auto& o : r) {
    EXPECT_EQ(manager_->Commit(7, o.reservation_id).code(), StatusCode::kNotFound);
  }
  // The keys can be reserved again.
  auto again = manager_->Reserve(kNs, 9, items);
  for (const auto& o : again) EXPECT_EQ(o.state, ReserveState::kReserved);
  manager_->AbortOwner(9);
  manager_->Abort(8, kr[0].reservation_id);
  EXPECT_EQ(host_->allocated_bytes(), baseline);
  EXPECT_EQ(manager_->GetStats().reservations_active, 0u);
}

TEST_F(TierManagerTest, ExpiredReservationIsReclaimed) {
  options_.clock = &clock_;
  options_.reservation_timeout = std::chrono::seconds(30);
  Open();
  const uint64_t baseline = host_->allocated_bytes();
  const std::vector<uint8_t> bytes = BytesFor(KeyOf(1), 10000);
  const PutRequestItem item = ItemFor(KeyOf(1), bytes);
  auto r = manager_->Reserve(kNs, 1, {&item, 1});
  ASSERT_EQ(r[0].state, ReserveState::kReserved);
  clock_.Advance(std::chrono::seconds(29));
  manager_->WaitFlusherRoundForTest();
  EXPECT_EQ(manager_->GetStats().reservations_active, 1u) << "not due yet";
  clock_.Advance(std::chrono::seconds(2));
  manager_->WaitFlusherRoundForTest();
  EXPECT_EQ(manager_->GetStats().reservations_active, 0u);
  EXPECT_EQ(manager_->Commit(1, r[0].reservation_id).code(), StatusCode::kNotFound);
  EXPECT_EQ(host_->allocated_bytes(), baseline);
  ExpectMiss(KeyOf(1));
}

TEST_F(TierManagerTest, ReservationBeingFilledDoesNotExpire) {
  // A slow client's payload may still be streaming into the slot: freeing it on expiry would
  // let another block take those pages and be overwritten.
  options_.clock = &clock_;
  options_.reservation_timeout = std::chrono::seconds(30);
  Open();
  const BlockKey key = KeyOf(1);
  const std::vector<uint8_t> bytes = BytesFor(key, 10000);
  const PutRequestItem item = ItemFor(key, bytes);
  auto r = manager_->Reserve(kNs, 1, {&item, 1});
  ASSERT_EQ(r[0].state, ReserveState::kReserved);
  Result<ReservationTarget> t = manager_->TargetOf(1, r[0].reservation_id);
  ASSERT_TRUE(t.ok());
  std::memcpy(t->data, bytes.data(), bytes.size() / 2);
  // An hour passes, flusher rounds (each expires what is due) run, while the "client" stalls.
  clock_.Advance(std::chrono::hours(1));
  manager_->WaitFlusherRoundForTest();
  EXPECT_EQ(manager_->GetStats().reservations_active, 1u);
  std::memcpy(t->data + bytes.size() / 2, bytes.data() + bytes.size() / 2,
              bytes.size() - bytes.size() / 2);
  ASSERT_TRUE(manager_->Commit(1, r[0].reservation_id).ok());
  expected_[{kNs, key}] = bytes;
  ExpectServed(key);
}

TEST_F(TierManagerTest, UnreleasedLeaseEndsWhenItsTtlPassesOnTheClock) {
  options_.clock = &clock_;
  Open();
  const std::vector<BlockKey> chain = PutChain(1, {64 * kKiB});
  std::vector<BlockRead> reads =
      manager_->Acquire(kNs, chain, /*owner=*/7, std::chrono::seconds(10));
  ASSERT_TRUE(reads[0].status.ok());
  EXPECT_EQ(manager_->GetStats().leases_active, 1u);
  clock_.Advance(std::chrono::seconds(9));
  manager_->WaitFlusherRoundForTest();
  EXPECT_EQ(manager_->GetStats().leases_active, 1u) << "not due yet";
  // A leased block is never evicted...
  EXPECT_EQ(manager_->Evict(kNs, Tier::kDisk, chain).evicted, 0u);
  clock_.Advance(std::chrono::seconds(2));
  manager_->WaitFlusherRoundForTest();
  EXPECT_EQ(manager_->GetStats().leases_active, 0u);
  // ... and once its lease ended by itself, it can go.
  EXPECT_EQ(manager_->Evict(kNs, Tier::kDisk, chain).evicted, 1u);
  // The client's late release of an expired lease is harmless.
  manager_->ReleaseLeases(7, {&reads[0].lease_id, 1});
}

TEST_F(TierManagerTest, HostOverflowDemotesTailFirstAndServesIdenticalBytes) {
  Open();
  // A 6 MiB chain fits the 8 MiB host (below its high watermark) ...
  const std::vector<BlockKey> chain = PutChain(0, std::vector<uint64_t>(24, 256 * kKiB - 100));
  manager_->WaitIdleForTest();
  EXPECT_EQ(TiersOf(chain), std::vector<Tier>(24, Tier::kHost));
  // ... then 4 MiB of unrelated blocks push part of it out.
  std::vector<BlockKey> others;
  for (int i = 0; i < 16; ++i) {
    others.push_back(KeyOf(1000 + i));
    ASSERT_TRUE(Put(others.back(), 256 * kKiB).ok());
  }
  manager_->WaitIdleForTest();

  const TierManagerStats s = manager_->GetStats();
  EXPECT_GT(s.host_counters.demotions, 0u);
  EXPECT_GT(s.disk_blocks, 0u);
  EXPECT_EQ(s.blocks_lost, 0u);
  EXPECT_LE(s.host.allocated_bytes, host_->capacity_bytes());

  // Every block is still cached; the host holds a prefix of the chain and the disk the rest:
  // the chain's last blocks went down first.
  const std::vector<Tier> tiers = TiersOf(chain);
  ASSERT_EQ(tiers.size(), chain.size());
  std::string picture;
  for (Tier f : tiers) picture += f == Tier::kHost ? 'H' : 'D';
  SCOPED_TRACE("tiers along the chain: " + picture);
  const auto first_disk = std::find(tiers.begin(), tiers.end(), Tier::kDisk);
  ASSERT_NE(first_disk, tiers.end()) << "nothing of the chain was demoted";
  EXPECT_NE(first_disk, tiers.begin()) << "the chain's head left host before its tail";
  EXPECT_TRUE(std::all_of(first_disk, tiers.end(), [](Tier f) { return f == Tier::kDisk; }))
      << "a block in the middle of the chain left host before its descendants";
  EXPECT_EQ(manager_->CountCached(kNs, others), others.size());

  // Everything reads back byte-identical, promoted from disk where needed.
  for (const BlockKey& k : chain) ExpectServed(k);
  for (const BlockKey& k : others) ExpectServed(k);
  manager_->WaitIdleForTest();
  EXPECT_GT(manager_->GetStats().host_counters.promotions, 0u);
  ExpectHostAccountingConsistent();
}

TEST_F(TierManagerTest, ALongChainThroughASmallHostStaysWhole) {
  Open();
  // A 12 MiB chain put through the 8 MiB host: blocks are demoted while it is being written.
  const std::vector<BlockKey> chain = PutChain(0, std::vector<uint64_t>(48, 256 * kKiB - 100));
  manager_->WaitIdleForTest();
  const TierManagerStats s = manager_->GetStats();
  EXPECT_GT(s.disk_blocks, 0u);
  EXPECT_EQ(s.blocks_lost, 0u);
  // No block went missing, and the head is still in host.
  const LookupResult l = manager_->Lookup(kNs, chain, /*prefetch=*/false);
  EXPECT_EQ(l.hit_blocks, chain.size());
  ASSERT_FALSE(l.tiers.empty());
  EXPECT_EQ(l.tiers[0], Tier::kHost);
  // Read front to back and back to front (the promotions reshuffle the tiers in between).
  for (const BlockKey& k : chain) ExpectServed(k);
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) ExpectServed(*it);
  ExpectHostAccountingConsistent();
}

// A reservation that may not wait (a daemon fetching from a peer under the peer's deadline)
// neither waits nor writes to make room: with the host full of blocks that have no disk copy it
// is refused with Unavailable and nothing is demoted; one that may wait demotes and succeeds.
TEST_F(TierManagerTest, AReservationThatMayNotWaitDemotesNothing) {
  options_.host_high_watermark = 1.0;  // the flusher stays idle: only reservations make room
  options_.host_low_watermark = 1.0;
  Open();
  std::vector<BlockKey> held;
  for (int i = 0; i < 8; ++i) {  // 8 x 1 MiB segments, each full with one block
    held.push_back(KeyOf(3000 + i));
    ASSERT_TRUE(Put(held.back(), kMiB - 4 * kKiB).ok()) << i;
  }
  manager_->WaitIdleForTest();
  ASSERT_EQ(manager_->GetStats().disk_blocks, 0u);
  const BlockKey key = KeyOf(3100);
  const std::vector<uint8_t> bytes = BytesFor(key, kMiB - 4 * kKiB);
  const PutRequestItem item = ItemFor(key, bytes);

  const ReserveOutcome now = manager_->Reserve(kNs, 1, {&item, 1}, {.may_wait = false})[0];
  EXPECT_EQ(now.state, ReserveState::kRefused);
  EXPECT_EQ(now.status.code(), StatusCode::kUnavailable) << now.status.ToString();
  manager_->WaitIdleForTest();
  EXPECT_EQ(manager_->GetStats().disk_blocks, 0u) << "a no-wait reservation wrote to disk";
  EXPECT_EQ(manager_->GetStats().host_counters.demotions, 0u);

  const ReserveOutcome later = manager_->Reserve(kNs, 1, {&item, 1})[0];
  ASSERT_EQ(later.state, ReserveState::kReserved) << later.status.ToString();
  manager_->Abort(1, later.reservation_id);
  manager_->WaitIdleForTest();
  EXPECT_GT(manager_->GetStats().host_counters.demotions, 0u);
  for (const BlockKey& k : held) ExpectServed(k);
}

TEST_F(TierManagerTest, TryReserveReservesNothingWhenOneBlockWouldWait) {
  options_.host_high_watermark = 1.0;  // the flusher stays idle: only reservations make room
  options_.host_low_watermark = 1.0;
  Open();
  std::vector<BlockKey> held;
  for (int i = 0; i < 8; ++i) {  // 8 x 1 MiB segments, each with one block and 4 KiB free
    held.push_back(KeyOf(3000 + i));
    ASSERT_TRUE(Put(held.back(), kMiB - 4 * kKiB).ok()) << i;
  }
  manager_->WaitIdleForTest();
  const TierManagerStats before = manager_->GetStats();
  ASSERT_EQ(before.disk_blocks, 0u);
  const BlockKey small = KeyOf(3100);
  const BlockKey large = KeyOf(3101);
  const std::vector<uint8_t> small_bytes = BytesFor(small, 4 * kKiB);
  const std::vector<uint8_t> large_bytes = BytesFor(large, kMiB - 4 * kKiB);
  // The small block fits in a free page; the large one needs a block written to disk first.
  const std::vector<uint8_t> held_bytes = BytesFor(held[0], kMiB - 4 * kKiB);
  const std::vector<PutRequestItem> both = {
      ItemFor(small, small_bytes), ItemFor(held[0], held_bytes), ItemFor(large, large_bytes)};
  EXPECT_FALSE(manager_->TryReserve(kNs, 1, both).has_value());
  manager_->WaitIdleForTest();
  TierManagerStats after = manager_->GetStats();
  EXPECT_EQ(after.reservations_active, 0u) << "the small block's slot was kept";
  EXPECT_EQ(after.host.allocated_bytes, before.host.allocated_bytes);
  EXPECT_EQ(after.disk_blocks, 0u) << "a reservation that may not wait wrote to disk";
  EXPECT_EQ(after.host_counters.demotions, 0u);

  // Alone, the small block is reserved, and TryCommit publishes it with the writer's checksum.
  std::optional<std::vector<ReserveOutcome>> now =
      manager_->TryReserve(kNs, 1, std::vector<PutRequestItem>{ItemFor(small, small_bytes)});
  ASSERT_TRUE(now.has_value());
  ASSERT_EQ((*now)[0].state, ReserveState::kReserved) << (*now)[0].status.ToString();
  const uint64_t rid = (*now)[0].reservation_id;
  Result<ReservationTarget> t = manager_->TargetOf(1, rid);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  std::memcpy(t->data, small_bytes.data(), small_bytes.size());
  const uint64_t size = small_bytes.size();
  const uint64_t sum = BlockChecksum(small_bytes.data(), small_bytes.size());
  std::optional<std::vector<Status>> done =
      manager_->TryCommit(1, {&rid, 1}, {&size, 1}, {&sum, 1});
  ASSERT_TRUE(done.has_value());
  ASSERT_TRUE((*done)[0].ok()) << (*done)[0].ToString();
  expected_[{kNs, small}] = small_bytes;
  ExpectServed(small);
  for (const BlockKey& k : held) ExpectServed(k);
}

// A block TryReserve answers as present is used at once: making room for the next block of the
// same call evicts another, never it (the client does not send a block it was told is stored).
TEST_F(TierManagerTest, TryReserveKeepsTheBlocksItAnswersPresent) {
  options_.host_high_watermark = 1.0;  // the flusher stays idle: only reservations make room
  options_.host_low_watermark = 1.0;
  Open();
  Result<NamespacePolicy> wt = ComposePolicy("", "write-through", "", "");
  ASSERT_TRUE(wt.ok()) << wt.status().ToString();
  ASSERT_TRUE(manager_->SetNamespacePolicy(kNs, *wt).ok());
  std::vector<BlockKey> held;  // in host and on disk, coldest first
  for (int i = 0; i < 8; ++i) {
    held.push_back(KeyOf(4000 + i));
    ASSERT_TRUE(Put(held.back(), kMiB - 4 * kKiB).ok()) << i;
  }
  manager_->WaitIdleForTest();
  ASSERT_EQ(manager_->GetStats().disk_blocks, 8u);
  const BlockKey fresh = KeyOf(4100);
  const std::vector<uint8_t> fresh_bytes = BytesFor(fresh, kMiB - 4 * kKiB);
  const std::vector<PutRequestItem> items = {ItemFor(held[0], expected_[{kNs, held[0]}]),
                                             ItemFor(fresh, fresh_bytes)};
  std::optional<std::vector<ReserveOutcome>> r = manager_->TryReserve(kNs, 1, items);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ((*r)[0].state, ReserveState::kPresent);
  ASSERT_EQ((*r)[1].state, ReserveState::kReserved) << (*r)[1].status.ToString();
  EXPECT_EQ(TiersOf({held[0]}), std::vector<Tier>{Tier::kHost}) << "evicted for the next block";
  EXPECT_EQ(TiersOf({held[1]}), std::vector<Tier>{Tier::kDisk}) << "the coldest other block";
  manager_->Abort(1, (*r)[1].reservation_id);
}

TEST_F(TierManagerTest, TryCommitPublishesOnlyWhenNoNamespaceWritesOnCommit) {
  options_.flush_on_shutdown = false;
  Open();
  Result<NamespacePolicy> wt = ComposePolicy("", "write-through", "", "");
  ASSERT_TRUE(wt.ok()) << wt.status().ToString();
  ASSERT_TRUE(manager_->SetNamespacePolicy(2, *wt).ok());
  constexpr uint64_t kOwner = 5;
  const std::vector<BlockKey> keys = {KeyOf(1), KeyOf(2), KeyOf(3)};
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<PutRequestItem> items;
  for (const BlockKey& k : keys) {
    bytes.push_back(BytesFor(k, 5000));
    items.push_back(ItemFor(k, bytes.back()));
  }
  std::vector<ReserveOutcome> r = manager_->Reserve(kNs, kOwner, items);
  std::vector<uint64_t> ids, sizes, sums;
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_EQ(r[i].state, ReserveState::kReserved) << i;
    Result<ReservationTarget> t = manager_->TargetOf(kOwner, r[i].reservation_id);
    ASSERT_TRUE(t.ok());
    std::memcpy(t->data, bytes[i].data(), bytes[i].size());
    ids.push_back(r[i].reservation_id);
    sizes.push_back(bytes[i].size());
    sums.push_back(BlockChecksum(bytes[i].data(), bytes[i].size()));
  }
  // Another owner's commit names nothing of its own.
  std::optional<std::vector<Status>> other = manager_->TryCommit(kOwner + 1, ids, sizes, sums);
  ASSERT_TRUE(other.has_value());
  for (const Status& st : *other) EXPECT_TRUE(st.IsNotFound()) << st.ToString();
  EXPECT_EQ(manager_->GetStats().reservations_active, 3u);

  // Block 0 commits; an unknown reservation is NotFound; block 2 with a wrong size is refused
  // and its reservation ends.
  std::vector<uint64_t> asked_ids = {ids[0], 987654321, ids[2]};
  std::vector<uint64_t> asked_sizes = {sizes[0], sizes[1], sizes[2] + 1};
  std::vector<uint64_t> asked_sums = {sums[0], sums[1], sums[2]};
  std::optional<std::vector<Status>> done =
      manager_->TryCommit(kOwner, asked_ids, asked_sizes, asked_sums);
  ASSERT_TRUE(done.has_value());
  ASSERT_EQ(done->size(), 3u);
  EXPECT_TRUE((*done)[0].ok()) << (*done)[0].ToString();
  EXPECT_TRUE((*done)[1].IsNotFound()) << (*done)[1].ToString();
  EXPECT_EQ((*done)[2].code(), StatusCode::kInvalidArgument) << (*done)[2].ToString();
  expected_[{kNs, keys[0]}] = bytes[0];
  ExpectServed(keys[0]);
  ExpectMiss(keys[2]);
  EXPECT_EQ(manager_->GetStats().reservations_active, 1u);  // block 1's
  manager_->Abort(kOwner, ids[1]);

  // A namespace that writes to disk on commit is left to Commit: nothing is done.
  const BlockKey wkey = KeyOf(10);
  const std::vector<uint8_t> wbytes = BytesFor(wkey, 5000);
  const PutRequestItem witem = ItemFor(wkey, wbytes);
  const ReserveOutcome w = manager_->Reserve(2, kOwner, {&witem, 1})[0];
  ASSERT_EQ(w.state, ReserveState::kReserved);
  Result<ReservationTarget> wt_target = manager_->TargetOf(kOwner, w.reservation_id);
  ASSERT_TRUE(wt_target.ok());
  std::memcpy(wt_target->data, wbytes.data(), wbytes.size());
  const uint64_t wsize = wbytes.size();
  const uint64_t wsum = BlockChecksum(wbytes.data(), wbytes.size());
  EXPECT_FALSE(
      manager_->TryCommit(kOwner, {&w.reservation_id, 1}, {&wsize, 1}, {&wsum, 1}).has_value());
  EXPECT_EQ(manager_->GetStats().reservations_active, 1u);
  EXPECT_EQ(manager_->GetStats().disk_blocks, 0u);
  ASSERT_TRUE(manager_->Commit(kOwner, w.reservation_id, wsum).ok());
  EXPECT_EQ(manager_->GetStats().disk_blocks, 1u);
  expected_[{2, wkey}] = wbytes;
  ExpectServed(wkey, 2);
}

TEST_F(TierManagerTest, LeasedBlocksStayPutWhileTheHostChurns) {
  Open();
  const BlockKey leased_key = KeyOf(1000);
  ASSERT_TRUE(Put(leased_key, 300 * kKiB).ok());
  std::vector<BlockRead> held = manager_->Acquire(kNs, {&leased_key, 1});
  ASSERT_TRUE(held[0].status.ok());
  const uint8_t* data = held[0].data;
  // Put 3x the host's capacity of other blocks.
  for (int i = 0; i < 96; ++i) ASSERT_TRUE(Put(KeyOf(i), 256 * kKiB).ok()) << i;
  manager_->WaitIdleForTest();
  // The leased copy never moved nor changed.
  EXPECT_EQ(held[0].data, data);
  const std::vector<uint8_t>& want = expected_[{kNs, leased_key}];
  EXPECT_EQ(std::memcmp(held[0].data, want.data(), want.size()), 0);
  EXPECT_EQ(TiersOf({leased_key})[0], Tier::kHost);
  manager_->Release(held[0]);
  for (int i = 0; i < 96; i += 7) ExpectServed(KeyOf(i));
}

TEST_F(TierManagerTest, LookupReportsTiersAndStartsPromotions) {
  Open();
  const std::vector<BlockKey> chain = PutChain(0, std::vector<uint64_t>(6, 200 * kKiB));
  EXPECT_EQ(TiersOf(chain), std::vector<Tier>(6, Tier::kHost));
  DemoteAll(chain);

  LookupResult l = manager_->Lookup(kNs, chain, /*prefetch=*/false);
  EXPECT_EQ(l.hit_blocks, 6u);
  EXPECT_EQ(l.tiers, std::vector<Tier>(6, Tier::kDisk));
  EXPECT_EQ(l.promotions_started, 0u);

  l = manager_->Lookup(kNs, chain, /*prefetch=*/true);
  EXPECT_EQ(l.hit_blocks, 6u);
  EXPECT_EQ(l.promotions_started, 6u);
  manager_->WaitIdleForTest();
  EXPECT_EQ(TiersOf(chain), std::vector<Tier>(6, Tier::kHost));
  TierManagerStats s = manager_->GetStats();
  EXPECT_EQ(s.prefetches_issued, 6u);
  EXPECT_EQ(s.host_counters.promotions, 6u);
  for (const BlockKey& k : chain) ExpectServed(k);
  EXPECT_EQ(manager_->GetStats().prefetches_useful, 6u);

  // The longest cached prefix stops at the first gap.
  std::vector<BlockKey> gapped = chain;
  gapped[3] = KeyOf(777);
  EXPECT_EQ(manager_->Lookup(kNs, gapped, true).hit_blocks, 3u);
  EXPECT_EQ(manager_->Lookup(2, chain, true).hit_blocks, 0u);
  EXPECT_EQ(manager_->CountCached(kNs, gapped), 5u);

  // Prefetch promotes disk-only blocks the same way.
  DemoteAll(chain);
  EXPECT_EQ(manager_->Prefetch(kNs, chain), 6u);
  manager_->WaitIdleForTest();
  EXPECT_EQ(TiersOf(chain), std::vector<Tier>(6, Tier::kHost));
  EXPECT_EQ(manager_->Prefetch(kNs, chain), 0u);  // nothing left to promote
}

// A lookup is a use: the blocks it finds move to the back of their eviction order, so a full
// host gives up blocks nobody asked for first. (Lookups find their keys under a shared hold of
// the tier lock and mark them under an exclusive one.)
TEST_F(TierManagerTest, ALookupMarksItsHitsUsed) {
  Open();
  const BlockKey looked_up = KeyOf(100);
  const BlockKey untouched = KeyOf(101);
  ASSERT_TRUE(Put(looked_up, 256 * kKiB).ok());
  ASSERT_TRUE(Put(untouched, 256 * kKiB).ok());
  std::vector<BlockKey> others;
  for (int i = 0; i < 20; ++i) {
    others.push_back(KeyOf(1000 + i));
    ASSERT_TRUE(Put(others.back(), 256 * kKiB).ok());
  }
  manager_->WaitIdleForTest();
  ASSERT_EQ(manager_->Lookup(kNs, {&looked_up, 1}, /*prefetch=*/false).hit_blocks, 1u);
  // 3 MiB more than the 8 MiB host holds below its watermark: the oldest blocks go to disk.
  for (int i = 20; i < 32; ++i) {
    others.push_back(KeyOf(1000 + i));
    ASSERT_TRUE(Put(others.back(), 256 * kKiB).ok());
  }
  manager_->WaitIdleForTest();
  ASSERT_GT(manager_->GetStats().host_counters.demotions, 0u);
  const std::vector<Tier> where = manager_->Where(kNs, std::vector<BlockKey>{looked_up, untouched});
  EXPECT_EQ(where[0], Tier::kHost) << "the block just looked up was demoted";
  EXPECT_EQ(where[1], Tier::kDisk) << "the older block nobody asked for stayed";
  ExpectServed(looked_up);
  ExpectServed(untouched);
}

TEST_F(TierManagerTest, AcquireOfDiskBlocksPromotesAndServesThem) {
  Open();
  const std::vector<BlockKey> chain = PutChain(0, {5000, 70000, 1, kMiB});
  DemoteAll(chain);
  EXPECT_EQ(TiersOf(chain), std::vector<Tier>(4, Tier::kDisk));
  std::vector<BlockRead> reads = manager_->Acquire(kNs, chain);
  for (size_t i = 0; i < chain.size(); ++i) {
    ASSERT_TRUE(reads[i].status.ok()) << i << ": " << reads[i].status.ToString();
    EXPECT_EQ(reads[i].from, Tier::kDisk);  // a disk hit, promoted on the way
    const std::vector<uint8_t>& want = expected_[{kNs, chain[i]}];
    ASSERT_EQ(reads[i].size, want.size());
    EXPECT_EQ(std::memcmp(reads[i].data, want.data(), want.size()), 0) << i;
    manager_->Release(reads[i]);
  }
  EXPECT_EQ(manager_->GetStats().disk_counters.hits, 4u);
  EXPECT_EQ(TiersOf(chain), std::vector<Tier>(4, Tier::kHost));
}

TEST_F(TierManagerTest, TryAcquireInHostLeasesOnlyWhenNothingWouldWait) {
  Open();
  const std::vector<BlockKey> chain = PutChain(0, {5000, 70000, 3000});
  const BlockKey missing = KeyOf(999);
  // All in host, and a miss: leased at once, the miss a NotFound.
  std::vector<BlockKey> asked = chain;
  asked.push_back(missing);
  std::optional<std::vector<BlockRead>> reads = manager_->TryAcquireInHost(kNs, asked, 7);
  ASSERT_TRUE(reads.has_value());
  ASSERT_EQ(reads->size(), 4u);
  for (size_t i = 0; i < chain.size(); ++i) {
    BlockRead& r = (*reads)[i];
    ASSERT_TRUE(r.status.ok()) << i << ": " << r.status.ToString();
    EXPECT_EQ(r.from, Tier::kHost);
    const std::vector<uint8_t>& want = expected_[{kNs, chain[i]}];
    ASSERT_EQ(r.size, want.size());
    EXPECT_EQ(std::memcmp(r.data, want.data(), want.size()), 0) << i;
  }
  EXPECT_TRUE((*reads)[3].status.IsNotFound());
  EXPECT_EQ(manager_->GetStats().leases_active, 3u);
  for (BlockRead& r : *reads) manager_->Release(r);

  // One block on disk alone: nothing is leased, promoted or counted, and Acquire still serves it.
  DemoteAll({chain[2]});  // the chain's tail (tail-first)
  const TierManagerStats before = manager_->GetStats();
  EXPECT_FALSE(manager_->TryAcquireInHost(kNs, chain, 7).has_value());
  manager_->WaitIdleForTest();
  const TierManagerStats after = manager_->GetStats();
  EXPECT_EQ(after.leases_active, 0u);
  EXPECT_EQ(after.host_counters.hits, before.host_counters.hits);
  EXPECT_EQ(after.host_counters.promotions, before.host_counters.promotions);
  EXPECT_EQ(TiersOf(chain), (std::vector<Tier>{Tier::kHost, Tier::kHost, Tier::kDisk}));
  for (const BlockKey& k : chain) ExpectServed(k);
}

TEST_F(TierManagerTest, CorruptDiskBlockIsAMissNeverWrongBytes) {
  Open();
  const std::vector<BlockKey> keys = {KeyOf(1), KeyOf(2), KeyOf(3)};
  for (const BlockKey& k : keys) ASSERT_TRUE(Put(k, 100 * kKiB + 1).ok());
  DemoteAll(keys);
  ASSERT_TRUE(disk_->CorruptForTest(kNs, keys[0]).ok());
  ASSERT_TRUE(disk_->CorruptForTest(kNs, keys[2]).ok());

  // Through Acquire: a miss, and the good block is served.
  std::vector<BlockRead> reads = manager_->Acquire(kNs, Keys{keys[0], keys[1]});
  EXPECT_TRUE(reads[0].status.IsNotFound()) << reads[0].status.ToString();
  EXPECT_EQ(reads[0].data, nullptr);
  ASSERT_TRUE(reads[1].status.ok());
  EXPECT_EQ(std::memcmp(reads[1].data, expected_[{kNs, keys[1]}].data(), 100 * kKiB + 1), 0);
  for (BlockRead& r : reads) manager_->Release(r);
  EXPECT_EQ(manager_->GetStats().checksum_failures, 1u);
  ExpectMiss(keys[0]);
  EXPECT_EQ(manager_->CountCached(kNs, Keys{keys[0]}), 0u);

  // Through a prefetching lookup: the promotion fails verification and the block is dropped.
  EXPECT_EQ(manager_->Lookup(kNs, Keys{keys[2]}, true).promotions_started, 1u);
  manager_->WaitIdleForTest();
  EXPECT_EQ(manager_->GetStats().checksum_failures, 2u);
  EXPECT_EQ(manager_->Lookup(kNs, Keys{keys[2]}, false).hit_blocks, 0u);
  ExpectMiss(keys[2]);
  // Dropped from disk too: a restart does not bring it back.
  Reopen();
  ExpectMiss(keys[0]);
  ExpectMiss(keys[2]);
  ExpectServed(keys[1]);
}

TEST_F(TierManagerTest, WriteThroughNamespaceWritesAtCommit) {
  options_.flush_on_shutdown = false;
  Open();
  Result<NamespacePolicy> wt = ComposePolicy("", "write-through", "", "");
  ASSERT_TRUE(wt.ok()) << wt.status().ToString();
  ASSERT_TRUE(manager_->SetNamespacePolicy(2, *wt).ok());
  ASSERT_TRUE(Put(KeyOf(1), 5000, {}, /*ns=*/2).ok());
  ASSERT_TRUE(Put(KeyOf(2), 5000, {}, /*ns=*/kNs).ok());
  const TierManagerStats s = manager_->GetStats();
  EXPECT_EQ(s.disk_blocks, 1u);  // only the write-through namespace's block
  EXPECT_EQ(s.host_blocks, 2u);
  // Served from host, and a restart without a shutdown flush still has it.
  ExpectServed(KeyOf(1), 2);
  Reopen();
  ExpectServed(KeyOf(1), 2);
  ExpectMiss(KeyOf(2), kNs);
}

TEST_F(TierManagerTest, PinChainWritesToDiskAndPinnedBlocksSurviveAFullDisk) {
  options_.disk_capacity_bytes = 2 * kMiB;  // eight 256 KiB blocks
  Open();
  const uint64_t block = 256 * kKiB;
  const std::vector<BlockKey> session = PutChain(0, std::vector<uint64_t>(4, block));
  EXPECT_EQ(manager_->GetStats().disk_blocks, 0u);

  Result<uint64_t> pinned = manager_->PinChain(kNs, session);
  ASSERT_TRUE(pinned.ok()) << pinned.status().ToString();
  EXPECT_EQ(*pinned, 4 * block);
  EXPECT_EQ(manager_->GetStats().disk_blocks, 4u);  // written down at once

  // A chain with a block that is not cached cannot be pinned.
  std::vector<BlockKey> broken = session;
  broken.push_back(KeyOf(9999));
  Result<uint64_t> refused = manager_->PinChain(kNs, broken);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);

  DemoteAll(session);  // already on disk: host copies dropped
  // Push 12 unpinned blocks through a disk with room for 4 more.
  std::vector<BlockKey> others;
  for (int i = 0; i < 12; ++i) {
    others.push_back(KeyOf(100 + i));
    ASSERT_TRUE(Put(others.back(), block).ok());
    DemoteAll({others.back()});
  }
  const TierManagerStats s = manager_->GetStats();
  EXPECT_LE(s.disk_used_bytes, options_.disk_capacity_bytes);
  EXPECT_EQ(s.disk_counters.evictions, 8u);
  EXPECT_EQ(s.blocks_lost, 0u);
  // The session survives whole; of the others the four most recent are still cached.
  EXPECT_EQ(manager_->CountCached(kNs, session), 4u);
  for (const BlockKey& k : session) ExpectServed(k);
  EXPECT_EQ(manager_->CountCached(kNs, others), 4u);
  for (int i = 8; i < 12; ++i) EXPECT_EQ(manager_->CountCached(kNs, Keys{others[i]}), 1u) << i;

  // Unpinned, the session's blocks may go like any other (tail first).
  DemoteAll(session);
  manager_->UnpinChain(kNs, session);
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(Put(KeyOf(200 + i), block).ok());
    DemoteAll({KeyOf(200 + i)});
    // Whatever is left of the session is always a prefix. (CountCached, unlike Lookup, does
    // not touch the blocks, so observing does not change the LRU order.)
    const uint32_t left = manager_->CountCached(kNs, session);
    EXPECT_EQ(manager_->CountCached(kNs, std::span(session).first(left)), left);
  }
  EXPECT_EQ(manager_->CountCached(kNs, session), 0u);
}

TEST_F(TierManagerTest, DiskFullOfPinnedBlocksRefusesOthersButKeepsThePinned) {
  options_.disk_capacity_bytes = 1 * kMiB;
  Open();
  const uint64_t block = 256 * kKiB;
  const std::vector<BlockKey> session = PutChain(0, std::vector<uint64_t>(4, block));
  ASSERT_TRUE(manager_->PinChain(kNs, session).ok());
  DemoteAll(session);
  // Disk is full of pinned blocks: an unpinned block cannot go down.
  ASSERT_TRUE(Put(KeyOf(50), block).ok());
  manager_->Evict(kNs, Tier::kHost, Keys{KeyOf(50)});
  manager_->WaitIdleForTest();
  const TierManagerStats s = manager_->GetStats();
  EXPECT_LE(s.disk_used_bytes, options_.disk_capacity_bytes);
  EXPECT_EQ(s.disk_blocks, 4u);
  for (const BlockKey& k : session) ExpectServed(k);
}

TEST_F(TierManagerTest, PinChainLargerThanTheFreeDiskFailsInsteadOfLooping) {
  options_.disk_capacity_bytes = 256 * kKiB;  // room for one block
  Open();
  // The head in host and on disk, the tail in host only: writing the tail needs the room the
  // head's disk copy takes, and the head's copy must not be what makes that room.
  const std::vector<BlockKey> chain = ChainKeys(0, 2);
  ASSERT_TRUE(Put(chain[0], 256 * kKiB).ok());
  DemoteAll({chain[0]});
  ExpectServed(chain[0]);  // promoted back: host and disk
  ASSERT_TRUE(Put(chain[1], 256 * kKiB, chain[0]).ok());
  ASSERT_EQ(TiersOf(chain), std::vector<Tier>(2, Tier::kHost));
  auto pinned = std::async(std::launch::async, [&] { return manager_->PinChain(kNs, chain); });
  if (pinned.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    ADD_FAILURE() << "PinChain never returned";
    std::_Exit(1);  // the manager is wedged: no clean teardown is possible
  }
  Result<uint64_t> r = pinned.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
  // Nothing was lost on the way, and nothing stays pinned: the head can still leave disk.
  EXPECT_EQ(manager_->CountCached(kNs, chain), 2u);
  for (const BlockKey& k : chain) ExpectServed(k);
  EXPECT_EQ(manager_->Evict(kNs, Tier::kDisk, chain).evicted, 2u);
}

TEST_F(TierManagerTest, PinChainNamingABlockTwiceWritesItOnce) {
  Open();
  const std::vector<BlockKey> chain = PutChain(0, {5000, 6000});
  const Keys twice = {chain[0], chain[0], chain[1], chain[1]};
  Result<uint64_t> pinned = manager_->PinChain(kNs, twice);
  ASSERT_TRUE(pinned.ok()) << pinned.status().ToString();
  EXPECT_EQ(*pinned, 2 * 5000u + 2 * 6000u);
  TierManagerStats s = manager_->GetStats();
  EXPECT_EQ(s.disk_blocks, 2u);
  EXPECT_EQ(s.disk_used_bytes, 11000u);
  for (const BlockKey& k : chain) ExpectServed(k);
  // Pinned: not dropped from disk.
  EXPECT_EQ(manager_->Evict(kNs, Tier::kDisk, chain).evicted, 0u);
  // Unpinning the same list releases every pin.
  manager_->UnpinChain(kNs, twice);
  EXPECT_EQ(manager_->Evict(kNs, Tier::kDisk, chain).evicted, 2u);
  s = manager_->GetStats();
  EXPECT_EQ(s.disk_blocks, 0u);
  EXPECT_EQ(s.disk_used_bytes, 0u);
}

TEST_F(TierManagerTest, RecoverFindsEveryDiskBlockWithItsSizeAndServesIt) {
  options_.flush_on_shutdown = false;
  Open();
  const std::vector<BlockKey> chain = PutChain(0, {4096, 100000, 1, 700 * kKiB, 4097});
  const std::vector<BlockKey> other = PutChain(100, {3000, 5000}, /*ns=*/2);
  std::vector<BlockKey> singles;
  for (int i = 0; i < 3; ++i) {
    singles.push_back(KeyOf(200 + i));
    ASSERT_TRUE(Put(singles.back(), 10000 + 999 * i).ok());
  }
  DemoteAll(chain);
  DemoteAll(other, 2);
  DemoteAll(singles);
  const uint64_t used = manager_->GetStats().disk_used_bytes;
  uint64_t total = 0;
  for (const auto& [k, v] : expected_) total += v.size();
  EXPECT_EQ(used, total);

  Reopen();
  const TierManagerStats s = manager_->GetStats();
  EXPECT_EQ(s.disk_blocks, 10u);
  EXPECT_EQ(s.disk_used_bytes, total);
  EXPECT_EQ(s.host_blocks, 0u);
  EXPECT_EQ(s.index_rebuild_blocks, 10u);
  EXPECT_GT(s.index_rebuild_seconds, 0);
  LookupResult l = manager_->Lookup(kNs, chain, false);
  EXPECT_EQ(l.hit_blocks, chain.size());
  EXPECT_EQ(l.tiers, std::vector<Tier>(chain.size(), Tier::kDisk));
  EXPECT_EQ(manager_->Lookup(2, other, false).hit_blocks, 2u);
  EXPECT_EQ(manager_->Lookup(2, chain, false).hit_blocks, 0u);
  for (const auto& [nk, bytes] : expected_) ExpectServed(nk.second, nk.first);

  // The chain's links came back too: its head cannot be evicted before its tail.
  EvictOutcome o = manager_->Evict(kNs, Tier::kDisk, Keys{chain[0]});
  EXPECT_EQ(o.evicted, 0u);
  EXPECT_EQ(manager_->CountCached(kNs, chain), chain.size());
}

TEST_F(TierManagerTest, ASmallerHostSegmentSizeKeepsLargerDiskBlocksAndServesThemFromDisk) {
  // Issue 12's integrity hole 1: a restart with a smaller --host_segment_size used to delete every
  // larger disk block at recovery, session-pinned ones too, gone for good.
  options_.flush_on_shutdown = false;
  Open();
  const std::vector<BlockKey> chain = PutChain(0, {1 * kMiB, 100 * kKiB, 1 * kMiB});
  DemoteAll(chain);
  ASSERT_TRUE(manager_->PinChain(kNs, chain).ok());

  stack_.host_segment_bytes = 512 * kKiB;
  Reopen();
  EXPECT_EQ(manager_->GetStats().disk_blocks, 3u);
  LookupResult l = manager_->Lookup(kNs, chain, /*prefetch=*/true);
  EXPECT_EQ(l.hit_blocks, 3u);
  EXPECT_EQ(l.promotions_started, 1u) << "only the block that fits a segment moves to host";
  for (const BlockKey& k : chain) ExpectServed(k);
  manager_->WaitIdleForTest();
  EXPECT_EQ(TiersOf(chain), (std::vector<Tier>{Tier::kDisk, Tier::kHost, Tier::kDisk}));
  EXPECT_EQ(manager_->GetStats().checksum_failures, 0u);

  // Back to the old size: nothing was lost, and they fit in host again.
  stack_.host_segment_bytes = 1 * kMiB;
  Reopen();
  EXPECT_EQ(manager_->GetStats().disk_blocks, 3u);
  for (const BlockKey& k : chain) ExpectServed(k);
  manager_->WaitIdleForTest();
  EXPECT_EQ(TiersOf({chain[0]}), std::vector<Tier>{Tier::kHost});
}

TEST_F(TierManagerTest, RecoverIntoASmallerDiskKeepsChainPrefixes) {
  options_.flush_on_shutdown = false;
  Open();
  const std::vector<BlockKey> chain = PutChain(0, std::vector<uint64_t>(8, 256 * kKiB));
  DemoteAll(chain);
  options_.disk_capacity_bytes = 1 * kMiB;
  Reopen();
  const TierManagerStats s = manager_->GetStats();
  EXPECT_LE(s.disk_used_bytes, 1 * kMiB);
  EXPECT_EQ(manager_->Lookup(kNs, chain, false).hit_blocks, 4u);
  EXPECT_EQ(manager_->CountCached(kNs, chain), 4u);
  for (int i = 0; i < 4; ++i) ExpectServed(chain[i]);
}

TEST_F(TierManagerTest, ShutdownFlushesHostOnlyBlocksForTheNextStart) {
  options_.flush_on_shutdown = true;
  Open();
  const std::vector<BlockKey> chain = PutChain(0, {5000, 300 * kKiB, 1});
  EXPECT_EQ(manager_->GetStats().disk_blocks, 0u);
  Reopen();
  EXPECT_EQ(manager_->GetStats().disk_blocks, 3u);
  EXPECT_EQ(manager_->Lookup(kNs, chain, false).hit_blocks, 3u);
  for (const BlockKey& k : chain) ExpectServed(k);
}

TEST_F(TierManagerTest, ShutdownWithoutFlushLosesOnlyHostOnlyBlocks) {
  options_.flush_on_shutdown = false;
  Open();
  ASSERT_TRUE(Put(KeyOf(1), 5000).ok());
  ASSERT_TRUE(Put(KeyOf(2), 5000).ok());
  DemoteAll({KeyOf(2)});
  Reopen();
  ExpectMiss(KeyOf(1));
  ExpectServed(KeyOf(2));
}

TEST_F(TierManagerTest, EvictRespectsTailFirst) {
  Open();
  const std::vector<BlockKey> chain = PutChain(0, {5000, 6000, 7000});  // A -> B -> C
  // A has cached descendants: not evicted alone.
  EvictOutcome o = manager_->Evict(kNs, Tier::kHost, Keys{chain[0]});
  EXPECT_EQ(o.evicted, 0u);
  EXPECT_EQ(o.skipped, 1u);
  EXPECT_EQ(TiersOf(chain), std::vector<Tier>(3, Tier::kHost));
  // A leased tail is not evicted, and so neither is the rest.
  std::vector<BlockRead> held = manager_->Acquire(kNs, {&chain[2], 1});
  ASSERT_TRUE(held[0].status.ok());
  o = manager_->Evict(kNs, Tier::kHost, chain);
  EXPECT_EQ(o.evicted, 0u);
  EXPECT_EQ(o.skipped, 3u);
  manager_->Release(held[0]);
  // All three together: deepest first, so all go (to disk: host-only blocks are demoted).
  o = manager_->Evict(kNs, Tier::kHost, chain);
  EXPECT_EQ(o.evicted, 3u);
  manager_->WaitIdleForTest();
  EXPECT_EQ(TiersOf(chain), std::vector<Tier>(3, Tier::kDisk));
  // From the whole cache: the head stays while its descendants are cached...
  o = manager_->Evict(kNs, Tier::kDisk, Keys{chain[0], chain[1]});
  EXPECT_EQ(o.evicted, 0u);
  EXPECT_EQ(manager_->CountCached(kNs, chain), 3u);
  // ...and the tail goes first.
  o = manager_->Evict(kNs, Tier::kDisk, Keys{chain[2]});
  EXPECT_EQ(o.evicted, 1u);
  EXPECT_EQ(manager_->Lookup(kNs, chain, false).hit_blocks, 2u);
  // Everything of the namespace (empty key list), other namespaces untouched.
  ASSERT_TRUE(Put(KeyOf(50), 1000, {}, /*ns=*/2).ok());
  o = manager_->Evict(kNs, Tier::kDisk, Keys{});
  EXPECT_EQ(o.evicted, 2u);
  EXPECT_EQ(manager_->CountCached(kNs, chain), 0u);
  ExpectServed(KeyOf(50), 2);
  const TierManagerStats s = manager_->GetStats();
  EXPECT_EQ(s.disk_blocks, 0u);
  EXPECT_EQ(s.disk_used_bytes, 0u);
  EXPECT_EQ(s.index_entries, 1u) << "evicted blocks left index entries behind";
}

TEST_F(TierManagerTest, CommitRacingAbortOwnerNeverPublishesAFreedSlot) {
  Open();
  const uint64_t size = kMiB;  // hashing a whole segment leaves a window to race in
  int committed = 0;
  int aborted = 0;
  int mid_commit = 0;
  std::mt19937_64 rng(42);
  for (int iter = 0; iter < 150; ++iter) {
    const uint64_t owner = 1000 + iter;
    const BlockKey key = KeyOf(5000 + iter);
    const std::vector<uint8_t> bytes = BytesFor(key, size);
    const PutRequestItem item = ItemFor(key, bytes);
    auto r = manager_->Reserve(kNs, owner, {&item, 1});
    ASSERT_EQ(r[0].state, ReserveState::kReserved);
    Result<ReservationTarget> t = manager_->TargetOf(owner, r[0].reservation_id);
    ASSERT_TRUE(t.ok());
    std::memcpy(t->data, bytes.data(), size);

    std::atomic<bool> go{false};
    const int spin = static_cast<int>(rng() % 40000);
    std::thread aborter([&] {
      while (!go.load(std::memory_order_acquire)) {
      }
      // A random delay, so the abort lands anywhere in Commit's run.
      std::atomic<int> sink{0};
      for (int i = 0; i < spin; ++i) sink.fetch_add(1, std::memory_order_relaxed);
      manager_->AbortOwner(owner);
    });
    go.store(true, std::memory_order_release);
    Status st = manager_->Commit(owner, r[0].reservation_id);
    aborter.join();

    ASSERT_EQ(manager_->GetStats().reservations_active, 0u);
    ExpectHostAccountingConsistent();
    if (st.ok()) {
      ++committed;
      expected_[{kNs, key}] = bytes;
      ExpectServed(key);
      // Drop it from host again so the next rounds have room without disk writes.
      EXPECT_EQ(manager_->Evict(kNs, Tier::kDisk, Keys{key}).evicted, 1u);
    } else {
      ++aborted;
      if (st.code() == StatusCode::kAborted) ++mid_commit;
      EXPECT_TRUE(st.code() == StatusCode::kNotFound || st.code() == StatusCode::kAborted)
          << st.ToString();
      ExpectMiss(key);
    }
    ASSERT_EQ(host_->allocated_bytes(), 0u) << "iteration " << iter;
  }
  EXPECT_EQ(committed + aborted, 150);
  RecordProperty("aborted_mid_commit", mid_commit);  // how often the race window was hit
}

TEST_F(TierManagerTest, ConcurrentClientsNeverSeeWrongBytes) {
  Open();
  constexpr int kThreads = 6;
  constexpr int kChains = 6;
  constexpr int kChainLength = 8;
  constexpr int kOps = 400;
  // 48 keys of 4 KiB .. ~400 KiB: about 10 MiB in all, more than the 8 MiB host.
  auto size_of = [](int k) -> uint64_t {
    return 4096ull * (1 + (k * 37) % 100) + (k * 131) % 4096;
  };
  std::vector<BlockKey> keys;
  for (int k = 0; k < kChains * kChainLength; ++k) keys.push_back(KeyOf(10000 + k));
  auto parent_of = [&](int k) { return k % kChainLength ? keys[k - 1] : BlockKey{}; };

  std::atomic<uint64_t> mismatches{0};
  std::atomic<uint64_t> served{0};
  std::atomic<uint64_t> commits{0};
  std::atomic<uint64_t> unexpected{0};
  std::vector<std::atomic<bool>> committed(keys.size());
  for (auto& c : committed) c = false;

  auto worker = [&](int t) {
    std::mt19937_64 rng(t + 1);
    const uint64_t owner = 100 + t;
    for (int op = 0; op < kOps; ++op) {
      const int k = static_cast<int>(rng() % keys.size());
      const int what = static_cast<int>(rng() % 100);
      if (what < 35) {
        const std::vector<uint8_t> bytes = BytesFor(keys[k], size_of(k));
        const PutRequestItem item = ItemFor(keys[k], bytes, parent_of(k));
        auto r = manager_->Reserve(kNs, owner, {&item, 1});
        if (r[0].state != ReserveState::kReserved) {
          if (r[0].state == ReserveState::kRefused &&
              r[0].status.code() != StatusCode::kResourceExhausted) {
            ++unexpected;
          }
          continue;
        }
        Result<ReservationTarget> target = manager_->TargetOf(owner, r[0].reservation_id);
        if (!target.ok() || target->size != bytes.size()) {
          ++unexpected;
          continue;
        }
        std::memcpy(target->data, bytes.data(), bytes.size());
        Status st = manager_->Commit(owner, r[0].reservation_id);
        if (st.ok()) {
          ++commits;
          committed[k] = true;
        } else {
          ++unexpected;
        }
      } else if (what < 85) {
        // Acquire a short run of one chain.
        const int n = 1 + static_cast<int>(rng() % 3);
        const int start = std::min<int>(k, static_cast<int>(keys.size()) - n);
        std::vector<BlockKey> batch(keys.begin() + start, keys.begin() + start + n);
        std::vector<BlockRead> reads = manager_->Acquire(kNs, batch);
        for (int i = 0; i < n; ++i) {
          BlockRead& r = reads[i];
          if (r.status.ok()) {
            const std::vector<uint8_t> want = BytesFor(batch[i], size_of(start + i));
            if (r.size != want.size() || std::memcmp(r.data, want.data(), want.size()) != 0 ||
                r.checksum != BlockChecksum(want.data(), want.size())) {
              ++mismatches;
            }
            ++served;
          } else if (!r.status.IsNotFound() && r.status.code() != StatusCode::kUnavailable &&
                     r.status.code() != StatusCode::kResourceExhausted) {
            ++unexpected;
          }
          manager_->Release(r);
        }
      } else if (what < 95) {
        // Lookups find under a shared hold of the tier lock, beside the writers above.
        const int start = k - k % kChainLength;
        std::vector<BlockKey> chain(keys.begin() + start, keys.begin() + start + kChainLength);
        const LookupResult l = manager_->Lookup(kNs, chain, /*prefetch=*/true);
        if (l.hit_blocks > chain.size() || l.tiers.size() != l.hit_blocks) ++unexpected;
        const std::vector<Tier> where = manager_->Where(kNs, chain);
        if (where.size() != chain.size() ||
            manager_->CountCached(kNs, chain) > static_cast<uint32_t>(chain.size())) {
          ++unexpected;
        }
      } else {
        manager_->Evict(kNs, Tier::kHost, {&keys[k], 1});
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();
  manager_->WaitIdleForTest();

  EXPECT_EQ(mismatches.load(), 0u);
  EXPECT_EQ(unexpected.load(), 0u);
  EXPECT_GT(served.load(), 100u);
  EXPECT_GT(commits.load(), 0u);
  const TierManagerStats s = manager_->GetStats();
  EXPECT_EQ(s.leases_active, 0u);
  EXPECT_EQ(s.reservations_active, 0u);
  EXPECT_EQ(s.blocks_lost, 0u);
  EXPECT_EQ(s.checksum_failures, 0u);
  ExpectHostAccountingConsistent();
  // The disk is large: nothing committed was lost, and all of it reads back right.
  for (size_t k = 0; k < keys.size(); ++k) {
    if (!committed[k]) continue;
    expected_[{kNs, keys[k]}] = BytesFor(keys[k], size_of(static_cast<int>(k)));
    ExpectServed(keys[k]);
  }
}

// A namespace's first block, with every segment held by another namespace, empties one segment:
// its blocks (the coldest segment's worth of them, by the order reads left) go to disk, not the
// coldest blocks of every segment until one happens to empty, which here was all 128 of them.
TEST_F(TierManagerTest, ANamespaceThatNeedsASegmentEmptiesOneNotTheTier) {
  std::vector<BlockKey> keys;
  ASSERT_NO_FATAL_FAILURE(OpenFullOf64KiBBlocks(&keys));
  std::vector<BlockKey> shuffled = keys;
  std::mt19937 rng(7);
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  for (const BlockKey& k : shuffled) ExpectServed(k);  // recency scattered over the segments
  manager_->WaitIdleForTest();
  const TierManagerStats before = manager_->GetStats();
  ASSERT_EQ(before.host_blocks, 128u);

  ASSERT_TRUE(Put(KeyOf(9999), 64 * kKiB, {}, /*ns=*/2).ok());
  manager_->WaitIdleForTest();
  const TierManagerStats after = manager_->GetStats();
  EXPECT_EQ(after.host_counters.demotions - before.host_counters.demotions, 16u);
  EXPECT_EQ(after.host_counters.evictions, before.host_counters.evictions);
  EXPECT_EQ(after.host_blocks, 128u - 16u + 1u);
  EXPECT_EQ(after.blocks_lost, 0u);
  ExpectServed(KeyOf(9999), 2);
  for (const BlockKey& k : keys) ExpectServed(k);
  ExpectHostAccountingConsistent();
}

// A namespace that needs a segment while the host has no fresh memory for one (out of
// descriptors: memfd_create fails) is refused after the first segment emptied for it, instead of
// emptying one segment after another, each renewal failing the same way, until the tier is bare.
TEST_F(TierManagerTest, ASegmentThatGetsNoFreshMemoryStopsTheEvictionForIt) {
  std::vector<BlockKey> keys;
  ASSERT_NO_FATAL_FAILURE(OpenFullOf64KiBBlocks(&keys));
  const TierManagerStats before = manager_->GetStats();
  ASSERT_EQ(before.host_blocks, 128u);
  Status put;
  if (const int refused = WithoutMemfds([&] { put = Put(KeyOf(9999), 64 * kKiB, {}, 2); })) {
    GTEST_SKIP() << "no seccomp filter allowed here: " << std::strerror(refused);
  }
  EXPECT_EQ(put.code(), StatusCode::kResourceExhausted) << put.ToString();
  EXPECT_NE(put.message().find("no fresh memory for a host segment"), std::string::npos)
      << put.ToString();
  manager_->WaitIdleForTest();
  const TierManagerStats after = manager_->GetStats();
  EXPECT_EQ(after.host_counters.demotions - before.host_counters.demotions, 16u);
  EXPECT_EQ(after.host_blocks, 128u - 16u);
  EXPECT_EQ(after.blocks_lost, 0u);
  for (const BlockKey& k : keys) ExpectServed(k);
  // With descriptors back, the segment emptied is renewed for it.
  ASSERT_TRUE(Put(KeyOf(9999), 64 * kKiB, {}, 2).ok());
  ExpectServed(KeyOf(9999), 2);
  ExpectHostAccountingConsistent();
}

// After another namespace's vacant segment could not be renewed for it, a namespace whose own
// segments are full still makes room from its own blocks (they need no renewal): its put is not
// refused for want of a segment it does not need.
TEST_F(TierManagerTest, ANamespaceMakesRoomFromItsOwnBlocksWhenARenewalFails) {
  options_.host_high_watermark = 1.0;
  options_.host_low_watermark = 1.0;
  Open();
  std::vector<BlockKey> theirs, ours;
  for (int i = 0; i < 16; ++i) {  // one segment of namespace 2's ...
    theirs.push_back(KeyOf(7000 + i));
    ASSERT_TRUE(Put(theirs.back(), 64 * kKiB, {}, 2).ok()) << i;
  }
  for (int i = 0; i < 112; ++i) {  // ... and seven of ours: the arena is full
    ours.push_back(KeyOf(7100 + i));
    ASSERT_TRUE(Put(ours.back(), 64 * kKiB).ok()) << i;
  }
  ASSERT_EQ(manager_->Evict(2, Tier::kHost, theirs).evicted, theirs.size());  // vacant, theirs
  manager_->WaitIdleForTest();
  const TierManagerStats before = manager_->GetStats();
  ASSERT_EQ(before.host_blocks, 112u);
  Status put;
  if (const int refused = WithoutMemfds([&] { put = Put(KeyOf(7999), 64 * kKiB); })) {
    GTEST_SKIP() << "no seccomp filter allowed here: " << std::strerror(refused);
  }
  EXPECT_TRUE(put.ok()) << put.ToString();
  manager_->WaitIdleForTest();
  const TierManagerStats after = manager_->GetStats();
  EXPECT_EQ(after.host_counters.demotions - before.host_counters.demotions, 16u);
  EXPECT_EQ(after.host_blocks, 112u - 16u + 1u);
  EXPECT_EQ(after.blocks_lost, 0u);
  for (const BlockKey& k : ours) ExpectServed(k);
  for (const BlockKey& k : theirs) ExpectServed(k, 2);
  ExpectServed(KeyOf(7999));
  ExpectHostAccountingConsistent();
}

// The same with chains that cross segments: emptying a segment takes, tail first, the blocks
// that follow its blocks in other segments, so no chain keeps a host copy of a block whose
// parent lost its own; the segment chosen is the one that costs the fewest blocks.
TEST_F(TierManagerTest, EmptyingASegmentForANamespaceKeepsChainsTailFirst) {
  options_.host_high_watermark = 1.0;
  options_.host_low_watermark = 1.0;
  Open();
  std::vector<std::vector<BlockKey>> chains;
  for (int c = 0; c < 21; ++c) {  // 126 blocks of 64 KiB: six-block chains cross segments
    chains.push_back(PutChain(6000 + 10 * c, std::vector<uint64_t>(6, 64 * kKiB)));
  }
  std::vector<BlockKey> all;
  for (const auto& chain : chains) all.insert(all.end(), chain.begin(), chain.end());
  std::vector<BlockKey> shuffled = all;
  std::mt19937 rng(11);
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  for (const BlockKey& k : shuffled) ExpectServed(k);
  manager_->WaitIdleForTest();
  const TierManagerStats before = manager_->GetStats();

  ASSERT_TRUE(Put(KeyOf(9999), 64 * kKiB, {}, /*ns=*/2).ok());
  manager_->WaitIdleForTest();
  const TierManagerStats after = manager_->GetStats();
  const uint64_t moved = (after.host_counters.demotions - before.host_counters.demotions) +
                         (after.host_counters.evictions - before.host_counters.evictions);
  EXPECT_GE(moved, 1u);
  EXPECT_LE(moved, 24u) << "one segment and the chain blocks that follow its blocks";
  EXPECT_EQ(after.blocks_lost, 0u);
  for (const auto& chain : chains) {
    const std::vector<Tier> tiers = TiersOf(chain);
    ASSERT_EQ(tiers.size(), chain.size());
    bool left_host = false;
    for (size_t i = 0; i < tiers.size(); ++i) {
      if (tiers[i] != Tier::kHost) left_host = true;
      EXPECT_FALSE(left_host && tiers[i] == Tier::kHost)
          << "block " << i << " of a chain is in host, an earlier one is not";
    }
  }
  ExpectServed(KeyOf(9999), 2);
  for (const BlockKey& k : all) ExpectServed(k);
  ExpectHostAccountingConsistent();
}

// A namespace whose own segments hold enough of the coldest blocks makes its room from those, in
// its eviction order: a single-tenant daemon evicts exactly its coldest blocks, as before.
TEST_F(TierManagerTest, ANamespaceWithColdBlocksOfItsOwnEvictsThemInOrder) {
  std::vector<BlockKey> keys;
  ASSERT_NO_FATAL_FAILURE(OpenFullOf64KiBBlocks(&keys));
  std::vector<BlockKey> shuffled = keys;
  std::mt19937 rng(7);
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  for (const BlockKey& k : shuffled) ExpectServed(k);
  manager_->WaitIdleForTest();
  ASSERT_TRUE(Put(KeyOf(9999), 64 * kKiB).ok());
  manager_->WaitIdleForTest();
  const std::vector<Tier> where = manager_->Where(kNs, shuffled);
  for (size_t i = 0; i < shuffled.size(); ++i) {
    EXPECT_EQ(where[i], i < 16 ? Tier::kDisk : Tier::kHost) << "block read " << i << "th";
  }
}

// A client names any parent it likes. A link that would close a loop is not made: blocks whose
// links loop each have a cached child, so they could never leave, tail first or otherwise.
TEST_F(TierManagerTest, ABlockIsNeverLinkedUnderItsOwnDescendant) {
  Open();
  // Through a put: r is held only by a session's pin (an entry without copies and without a
  // parent), a is put under it, then r is put naming a.
  const BlockKey r = KeyOf(1);
  const BlockKey a = KeyOf(2);
  manager_->PinExisting(kNs, {&r, 1});
  ASSERT_TRUE(Put(a, 64 * kKiB, r).ok());
  ASSERT_TRUE(Put(r, 64 * kKiB, a).ok());
  EXPECT_EQ(manager_->Parents(kNs, Keys{a, r}), (Keys{r, BlockKey{}}));
  // Through a fetch's links (LinkUnderParents): a chain longer than any fixed walk, whose first
  // block is said to be its last one's child.
  Keys chain;
  for (int i = 0; i < 100; ++i) {
    chain.push_back(KeyOf(100 + i));
    ASSERT_TRUE(Put(chain.back(), 4 * kKiB, i == 0 ? BlockKey{} : chain[i - 1]).ok());
  }
  const std::pair<BlockKey, BlockKey> loop{chain.front(), chain.back()};
  manager_->LinkUnderParents(kNs, {&loop, 1});
  EXPECT_TRUE(manager_->Parents(kNs, Keys{chain.front()})[0].IsZero());
  // So everything leaves, tail first.
  const EvictOutcome out = manager_->Evict(kNs, Tier::kHost, {});
  EXPECT_EQ(out.evicted, 102u);
  EXPECT_EQ(out.skipped, 0u);
  ExpectHostAccountingConsistent();
}

// Links that loop all the same (disk records written by a version that let a client make them)
// can never leave tail first: their segment is passed over, and another one is emptied.
TEST_F(TierManagerTest, BlocksWhoseParentsLoopKeepTheirSegmentAndAnotherIsEmptied) {
  options_.host_high_watermark = 1.0;
  options_.host_low_watermark = 1.0;
  Open();
  const BlockKey r = KeyOf(1);
  const BlockKey a = KeyOf(2);
  {
    const std::vector<uint8_t> r_bytes = BytesFor(r, 64 * kKiB);
    const std::vector<uint8_t> a_bytes = BytesFor(a, 64 * kKiB);
    std::vector<DiskWrite> writes(2);
    for (auto [w, key, bytes, parent] :
         {std::tuple{&writes[0], r, &r_bytes, a}, std::tuple{&writes[1], a, &a_bytes, r}}) {
      w->ns = kNs;
      w->key = key;
      w->meta.size = bytes->size();
      w->meta.checksum = BlockChecksum(bytes->data(), bytes->size());
      w->meta.parent = parent;
      w->data = bytes->data();
      expected_[{kNs, key}] = *bytes;
    }
    ASSERT_TRUE(disk_->Write(writes, /*sync=*/true).ok());
  }
  Reopen();
  EXPECT_EQ(manager_->Parents(kNs, Keys{a, r}), (Keys{r, a})) << "loaded as written";
  ExpectServed(a);  // promoted to host
  ExpectServed(r);
  manager_->WaitIdleForTest();
  ASSERT_EQ(TiersOf({a, r}), (std::vector<Tier>{Tier::kHost, Tier::kHost}));
  std::vector<BlockKey> rest;
  for (int i = 0; i < 126; ++i) {
    rest.push_back(KeyOf(100 + i));
    ASSERT_TRUE(Put(rest.back(), 64 * kKiB).ok()) << i;
  }
  for (int i = 14; i < 126; ++i) ExpectServed(rest[i]);  // segment 0's other blocks: the coldest
  manager_->WaitIdleForTest();
  ASSERT_TRUE(Put(KeyOf(9999), 64 * kKiB, {}, /*ns=*/2).ok());
  manager_->WaitIdleForTest();
  EXPECT_EQ(TiersOf({a, r}), (std::vector<Tier>{Tier::kHost, Tier::kHost}));
  ExpectServed(KeyOf(9999), 2);
  for (const BlockKey& k : rest) ExpectServed(k);
  ExpectHostAccountingConsistent();
}

// A leased block holds its segment: another segment is emptied, and the leased bytes stay.
TEST_F(TierManagerTest, ALeasedBlockKeepsItsSegmentFromBeingEmptied) {
  std::vector<BlockKey> keys;
  ASSERT_NO_FATAL_FAILURE(OpenFullOf64KiBBlocks(&keys));
  for (int i = 16; i < 128; ++i) ExpectServed(keys[i]);  // segment 0's blocks: the coldest
  std::vector<BlockRead> held = manager_->Acquire(kNs, {&keys[0], 1});
  ASSERT_TRUE(held[0].status.ok()) << held[0].status.ToString();
  manager_->WaitIdleForTest();
  const TierManagerStats before = manager_->GetStats();
  ASSERT_TRUE(Put(KeyOf(9999), 64 * kKiB, {}, /*ns=*/2).ok());
  manager_->WaitIdleForTest();
  const TierManagerStats after = manager_->GetStats();
  EXPECT_EQ(after.host_counters.demotions - before.host_counters.demotions, 16u);
  EXPECT_EQ(TiersOf({keys[0], keys[1]}), (std::vector<Tier>{Tier::kHost, Tier::kHost}))
      << "segment 0 was emptied around a leased block";
  const std::vector<uint8_t>& want = expected_[{kNs, keys[0]}];
  EXPECT_EQ(std::memcmp(held[0].data, want.data(), want.size()), 0);
  manager_->Release(held[0]);
  for (const BlockKey& k : keys) ExpectServed(k);
  ExpectHostAccountingConsistent();
}

// When every segment holding the coldest blocks has a leased one, a segment of warmer blocks is
// emptied instead, not the coldest blocks evicted wherever they are until one happens to empty
// (which, around the leases, evicted 64 blocks here before: every unleased one of segments 0-3).
TEST_F(TierManagerTest, WhenTheColdestBlocksSegmentsAreLeasedAnotherSegmentIsEmptied) {
  std::vector<BlockKey> keys;
  ASSERT_NO_FATAL_FAILURE(OpenFullOf64KiBBlocks(&keys));  // segment s: blocks 16 s .. 16 s + 15
  // Segments 0-3 hold the coldest blocks (their first four, never read since put), and each has
  // a leased block; segments 4-7 were read after them.
  std::vector<BlockRead> held;
  for (int s = 0; s < 4; ++s) {
    for (int i = 4; i < 16; ++i) ExpectServed(keys[16 * s + i]);
  }
  for (int i = 64; i < 128; ++i) ExpectServed(keys[i]);
  for (int s = 0; s < 4; ++s) {
    std::vector<BlockRead> r = manager_->Acquire(kNs, {&keys[16 * s], 1});
    ASSERT_TRUE(r[0].status.ok()) << r[0].status.ToString();
    held.push_back(std::move(r[0]));
  }
  manager_->WaitIdleForTest();
  const TierManagerStats before = manager_->GetStats();
  ASSERT_TRUE(Put(KeyOf(9999), 64 * kKiB, {}, /*ns=*/2).ok());
  manager_->WaitIdleForTest();
  const TierManagerStats after = manager_->GetStats();
  EXPECT_EQ(after.host_counters.demotions - before.host_counters.demotions, 16u);
  std::vector<BlockKey> first_four;
  for (int s = 0; s < 4; ++s) {
    for (int i = 0; i < 4; ++i) first_four.push_back(keys[16 * s + i]);
  }
  EXPECT_EQ(TiersOf(first_four), std::vector<Tier>(16, Tier::kHost))
      << "blocks of the leased segments were evicted";
  for (int s = 0; s < 4; ++s) {
    const std::vector<uint8_t>& want = expected_[{kNs, keys[16 * s]}];
    EXPECT_EQ(std::memcmp(held[s].data, want.data(), want.size()), 0);
    manager_->Release(held[s]);
  }
  ExpectServed(KeyOf(9999), 2);
  for (const BlockKey& k : keys) ExpectServed(k);
  ExpectHostAccountingConsistent();
}

// The segment of the host arena the block's host copy is in (leased for the look).
uint32_t HostSegmentOf(TierManager& manager, NamespaceId ns, const BlockKey& key,
                       uint64_t segment_bytes) {
  std::vector<BlockRead> r = manager.Acquire(ns, {&key, 1});
  EXPECT_TRUE(r[0].status.ok()) << r[0].status.ToString();
  const uint32_t segment = static_cast<uint32_t>(r[0].arena_offset / segment_bytes);
  manager.Release(r[0]);
  return segment;
}

// A namespace that needs a segment while the others hold free pages in theirs gets one without
// an eviction: the blocks of the segment that copies fewest bytes move into those free pages.
// Every block stays in host, byte for byte, and none is written to disk.
TEST_F(TierManagerTest, ANamespaceThatNeedsASegmentGetsOneByMovingBlocksWhereTheirsHaveRoom) {
  std::vector<BlockKey> keys, dropped;
  ASSERT_NO_FATAL_FAILURE(OpenWithRoomInEverySegment(&keys, &dropped));
  const uint64_t segment_bytes = host_->segment_bytes();
  manager_->WaitIdleForTest();
  const TierManagerStats before = manager_->GetStats();
  ASSERT_EQ(before.host_blocks, 128u - 25u);

  ASSERT_TRUE(Put(KeyOf(9999), 64 * kKiB, {}, /*ns=*/2).ok());
  manager_->WaitIdleForTest();
  const TierManagerStats after = manager_->GetStats();
  EXPECT_EQ(after.host_blocks_moved - before.host_blocks_moved, 12u);  // segment 5's
  EXPECT_EQ(after.host_counters.demotions, before.host_counters.demotions);
  EXPECT_EQ(after.host_counters.evictions, before.host_counters.evictions);
  EXPECT_EQ(after.host_blocks, before.host_blocks + 1);
  EXPECT_EQ(HostSegmentOf(*manager_, 2, KeyOf(9999), segment_bytes), 5u);
  for (int i = 4; i < 16; ++i) {
    EXPECT_NE(HostSegmentOf(*manager_, kNs, keys[16 * 5 + i], segment_bytes), 5u);
  }
  std::vector<BlockKey> kept;
  for (const BlockKey& k : keys) {
    if (std::find(dropped.begin(), dropped.end(), k) == dropped.end()) kept.push_back(k);
  }
  EXPECT_EQ(TiersOf(kept), std::vector<Tier>(kept.size(), Tier::kHost));
  ExpectServed(KeyOf(9999), 2);
  for (const BlockKey& k : keys) ExpectServed(k);
  ExpectHostAccountingConsistent();
}

// A segment with a leased block is not moved out of (the reader holds its copy where it is):
// another one is, though it copies more.
TEST_F(TierManagerTest, ALeasedBlockKeepsItsSegmentFromBeingMovedOutOf) {
  std::vector<BlockKey> keys, dropped;
  ASSERT_NO_FATAL_FAILURE(OpenWithRoomInEverySegment(&keys, &dropped));
  const uint64_t segment_bytes = host_->segment_bytes();
  std::vector<BlockRead> held = manager_->Acquire(kNs, {&keys[16 * 5 + 8], 1});
  ASSERT_TRUE(held[0].status.ok()) << held[0].status.ToString();
  manager_->WaitIdleForTest();
  const TierManagerStats before = manager_->GetStats();
  ASSERT_TRUE(Put(KeyOf(9999), 64 * kKiB, {}, /*ns=*/2).ok());
  manager_->WaitIdleForTest();
  const TierManagerStats after = manager_->GetStats();
  EXPECT_EQ(after.host_blocks_moved - before.host_blocks_moved, 13u);  // segment 0's
  EXPECT_EQ(after.host_counters.demotions, before.host_counters.demotions);
  EXPECT_EQ(HostSegmentOf(*manager_, 2, KeyOf(9999), segment_bytes), 0u);
  const std::vector<uint8_t>& want = expected_[{kNs, keys[16 * 5 + 8]}];
  EXPECT_EQ(std::memcmp(held[0].data, want.data(), want.size()), 0);
  manager_->Release(held[0]);
  for (const BlockKey& k : keys) ExpectServed(k);
  ExpectHostAccountingConsistent();
}

// While a segment's blocks are copied without the lock, a reader leases one of them and their
// owner puts a block. The leased block stays where it was, so that segment does not empty and
// another is emptied for the newcomer; the owner's block lands outside the segment being emptied
// (it is draining; the owner makes room elsewhere); the books agree, and every block is served
// byte for byte.
TEST_F(TierManagerTest, AReadAndAPutDuringAMoveKeepTheBooksRight) {
  std::vector<BlockKey> keys, dropped;
  std::vector<BlockRead> held;
  Status owners_put;
  uint32_t owners_segment = 0;
  bool once = false;
  options_.during_host_move_for_test = [&] {
    if (std::exchange(once, true)) return;
    held = manager_->Acquire(kNs, {&keys[16 * 5 + 8], 1});
    // 256 KiB: only segment 5's run of four dropped blocks has room for it.
    owners_put = Put(KeyOf(8888), 256 * kKiB);
    if (owners_put.ok()) {
      owners_segment = HostSegmentOf(*manager_, kNs, KeyOf(8888), host_->segment_bytes());
    }
  };
  ASSERT_NO_FATAL_FAILURE(OpenWithRoomInEverySegment(&keys, &dropped));
  const uint64_t segment_bytes = host_->segment_bytes();
  manager_->WaitIdleForTest();
  ASSERT_TRUE(Put(KeyOf(9999), 64 * kKiB, {}, /*ns=*/2).ok());
  manager_->WaitIdleForTest();
  ASSERT_TRUE(once) << "no move ran";
  ASSERT_TRUE(owners_put.ok()) << owners_put.ToString();
  ASSERT_EQ(held.size(), 1u);
  ASSERT_TRUE(held[0].status.ok()) << held[0].status.ToString();
  EXPECT_EQ(HostSegmentOf(*manager_, kNs, keys[16 * 5 + 8], segment_bytes), 5u)
      << "a block leased during its copy was moved";
  EXPECT_NE(owners_segment, 5u) << "a put took pages of the segment being emptied";
  EXPECT_NE(HostSegmentOf(*manager_, 2, KeyOf(9999), segment_bytes), 5u);
  const std::vector<uint8_t>& want = expected_[{kNs, keys[16 * 5 + 8]}];
  EXPECT_EQ(std::memcmp(held[0].data, want.data(), want.size()), 0);
  manager_->Release(held[0]);
  ExpectServed(KeyOf(9999), 2);
  ExpectServed(KeyOf(8888));
  for (const BlockKey& k : keys) ExpectServed(k);
  ExpectHostAccountingConsistent();
}

}  // namespace
}  // namespace kvpool::tiers
