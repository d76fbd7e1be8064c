// The strategies a namespace composes, through the TierManager: disk admission (none never
// touches disk, after-N-hits demotes only blocks read N times), read-ahead along a chain, and a
// change of eviction order that keeps every block. Every block served is compared with an
// independent copy of what was put.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/quantize.h"
#include "tiers/test_kv_blocks.h"
#include "tiers/tier_manager_test_fixture.h"

namespace kvpool::tiers {
namespace {

NamespacePolicy Compose(std::string_view eviction, std::string_view write,
                        std::string_view admission, std::string_view read_ahead) {
  Result<NamespacePolicy> p = ComposePolicy(eviction, write, admission, read_ahead);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? *p : DefaultNamespacePolicy();
}

TEST_F(TierManagerTest, AdmissionNoneNeverWritesTheNamespaceToDisk) {
  options_.flush_on_shutdown = true;
  Open();
  constexpr NamespaceId kScratch = 2;
  ASSERT_TRUE(manager_->SetNamespacePolicy(kScratch, Compose("", "", "none", "")).ok());
  // 24 MiB into an 8 MiB host tier: most must go, none to disk.
  std::vector<BlockKey> keys;
  for (int i = 0; i < 48; ++i) {
    keys.push_back(KeyOf(1000 + i));
    ASSERT_TRUE(Put(keys.back(), 512 * kKiB, {}, kScratch).ok());
  }
  manager_->WaitIdleForTest();
  const TierManagerStats s = manager_->GetStats();
  EXPECT_EQ(s.disk_blocks, 0u);
  EXPECT_GT(s.blocks_not_admitted, 0u);
  EXPECT_EQ(s.blocks_lost, 0u) << "dropped by policy is not lost";
  int served = 0;
  for (const BlockKey& k : keys) {
    std::vector<BlockRead> r = manager_->Acquire(kScratch, {&k, 1});
    if (r[0].status.ok()) {
      manager_->Release(r[0]);
      ExpectServed(k, kScratch);
      ++served;
    } else {
      EXPECT_TRUE(r[0].status.IsNotFound()) << r[0].status.ToString();
    }
  }
  EXPECT_GT(served, 0);
  EXPECT_LT(served, 48);
  // A session cannot be persisted in it; the caller is told why.
  Result<uint64_t> pin = manager_->PinChain(kScratch, {&keys.back(), 1});
  EXPECT_EQ(pin.status().code(), StatusCode::kFailedPrecondition) << pin.status().ToString();
  // Another namespace is untouched by it: its blocks still demote to disk.
  const std::vector<BlockKey> other = PutChain(1, {kMiB, kMiB});
  DemoteAll(other);
  EXPECT_EQ(manager_->GetStats().disk_blocks, 2u);
  for (const BlockKey& k : other) ExpectServed(k);
  // Shutdown writes nothing of the scratch namespace either.
  Reopen();
  EXPECT_EQ(manager_->GetStats().disk_blocks, 2u);
}

TEST_F(TierManagerTest, AdmissionAfterHitsDemotesOnlyBlocksReadEnough) {
  Open();
  ASSERT_TRUE(manager_->SetNamespacePolicy(kNs, Compose("", "", "after-2-hits", "none")).ok());
  const std::vector<BlockKey> hot = {KeyOf(1)};
  const std::vector<BlockKey> cold = {KeyOf(2)};
  ASSERT_TRUE(Put(hot[0], 64 * kKiB).ok());
  ASSERT_TRUE(Put(cold[0], 64 * kKiB).ok());
  ExpectServed(hot[0]);
  ExpectServed(hot[0]);
  ExpectServed(cold[0]);
  EXPECT_EQ(manager_->Evict(kNs, Tier::kHost, {}).evicted, 2u);
  manager_->WaitIdleForTest();
  EXPECT_EQ(TiersOf(hot), std::vector<Tier>{Tier::kDisk});
  ExpectMiss(cold[0]);
  ExpectServed(hot[0]);
  EXPECT_FALSE(ComposePolicy("", "write-through", "after-2-hits", "").ok())
      << "write-through writes fresh blocks that after-2-hits refuses";
  EXPECT_FALSE(ComposePolicy("", "", "after-0-hits", "").ok());
  // A block's hits stop counting at 65,535: a larger N could never be reached.
  EXPECT_TRUE(ComposePolicy("", "", "after-65535-hits", "").ok());
  EXPECT_FALSE(ComposePolicy("", "", "after-65536-hits", "").ok());
  EXPECT_FALSE(ComposePolicy("", "write-through-after-70000", "", "").ok());
}

TEST_F(TierManagerTest, ReadAheadPromotesTheNextBlocksOfTheChain) {
  Open();
  ASSERT_TRUE(manager_->SetNamespacePolicy(kNs, Compose("", "", "", "chain-2")).ok());
  const std::vector<BlockKey> chain =
      PutChain(10, {64 * kKiB, 64 * kKiB, 64 * kKiB, 64 * kKiB, 64 * kKiB, 64 * kKiB});
  DemoteAll(chain);
  ASSERT_EQ(TiersOf(chain), std::vector<Tier>(6, Tier::kDisk));
  ExpectServed(chain[0]);  // promoted for the get, and the next two read ahead
  manager_->WaitIdleForTest();
  EXPECT_EQ(TiersOf(chain), (std::vector<Tier>{Tier::kHost, Tier::kHost, Tier::kHost, Tier::kDisk,
                                               Tier::kDisk, Tier::kDisk}));
  EXPECT_EQ(manager_->GetStats().read_aheads, 2u);
  ExpectServed(chain[1]);  // already in host: reads ahead one more
  manager_->WaitIdleForTest();
  EXPECT_EQ(TiersOf(chain)[3], Tier::kHost);
  for (const BlockKey& k : chain) ExpectServed(k);

  // With read-ahead off a get moves only what it reads.
  ASSERT_TRUE(manager_->SetNamespacePolicy(kNs, Compose("", "", "", "none")).ok());
  DemoteAll(chain);
  const uint64_t before = manager_->GetStats().read_aheads;
  ExpectServed(chain[0]);
  manager_->WaitIdleForTest();
  EXPECT_EQ(TiersOf(chain)[1], Tier::kDisk);
  EXPECT_EQ(manager_->GetStats().read_aheads, before);
}

TEST_F(TierManagerTest, ChangingTheEvictionOrderKeepsEveryBlock) {
  Open();
  std::vector<BlockKey> all;
  for (int c = 0; c < 4; ++c) {
    const std::vector<BlockKey> chain = PutChain(100 * (c + 1), {kMiB / 2, kMiB / 2, kMiB / 2});
    all.insert(all.end(), chain.begin(), chain.end());
  }
  uint64_t next_key = 1000;
  for (const char* order : {"s3fifo", "lfu", "lru"}) {
    SCOPED_TRACE(order);
    ASSERT_TRUE(manager_->SetNamespacePolicy(kNs, Compose(order, "", "", "none")).ok());
    EXPECT_EQ(manager_->PolicyOf(kNs).eviction, order);
    for (const BlockKey& k : all) ExpectServed(k);
    // Fill host past its capacity so the new order evicts (to disk): still all served.
    const std::vector<BlockKey> filler = PutChain(next_key, std::vector<uint64_t>(12, kMiB / 2));
    next_key += 100;
    manager_->WaitIdleForTest();
    for (const BlockKey& k : all) ExpectServed(k);
    for (const BlockKey& k : filler) ExpectServed(k);
  }
  EXPECT_EQ(manager_->GetStats().blocks_lost, 0u);
  NamespacePolicy bad = DefaultNamespacePolicy();
  bad.eviction = "arc";
  EXPECT_EQ(manager_->SetNamespacePolicy(kNs, bad).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(manager_->PolicyOf(kNs).eviction, "lru") << "a refused change changes nothing";
}

TEST_F(TierManagerTest, EncodingOnDemotionStoresFewerBytesAndServesTheDecodedBlock) {
  Open();
  const kernels::BlockLayout raw = SmallLayout();
  NamespaceId ns = 10;  // one namespace per encoding: 11 int8, 12 fp8, 13 int4
  for (const char* name : {"int8", "fp8-e4m3", "int4-g32"}) {
    SCOPED_TRACE(name);
    ++ns;
    NamespacePolicy policy = Compose("", "", "", "none");
    Result<std::shared_ptr<const DemotionEncoding>> enc = CreateDemotionEncoding(name, raw);
    ASSERT_TRUE(enc.ok()) << enc.status().ToString();
    policy.encoding = *enc;
    ASSERT_TRUE(manager_->SetNamespacePolicy(ns, policy).ok());

    // One block of the layout's size and one of another size (stays raw, exact).
    const BlockKey kv_key = KeyOf(500 + ns);
    const BlockKey other_key = KeyOf(600 + ns);
    const std::vector<uint8_t> kv = KvBytes(raw, ns);
    const PutRequestItem item = ItemFor(kv_key, kv);
    std::vector<ReserveOutcome> r = manager_->Reserve(ns, 1, {&item, 1});
    ASSERT_EQ(r[0].state, ReserveState::kReserved);
    Result<ReservationTarget> t = manager_->TargetOf(1, r[0].reservation_id);
    ASSERT_TRUE(t.ok());
    std::memcpy(t->data, kv.data(), kv.size());
    ASSERT_TRUE(manager_->Commit(1, r[0].reservation_id).ok());
    ASSERT_TRUE(Put(other_key, 5000, {}, ns).ok());

    const uint64_t disk_before = manager_->GetStats().disk_used_bytes;
    const std::vector<BlockKey> both = {kv_key, other_key};
    DemoteAll(both, ns);
    const TierManagerStats s = manager_->GetStats();
    EXPECT_EQ(s.disk_used_bytes - disk_before, (*enc)->encoded_bytes() + 5000)
        << "capacity counts the stored bytes";
    EXPECT_LT((*enc)->encoded_bytes(), kv.size());

    // The reference: the kernels' own round trip of the same bytes.
    std::vector<uint8_t> encoded((*enc)->encoded_bytes());
    std::vector<uint8_t> want(kv.size());
    ASSERT_TRUE((*enc)->Encode(kv.data(), encoded.data()).ok());
    ASSERT_TRUE((*enc)->Decode(encoded.data(), want.data()).ok());
    {
      // A reader that keeps encodings gets the stored bytes as they are, and the block stays on
      // disk only; the raw block beside it comes as always.
      std::vector<BlockRead> stored =
          manager_->Acquire(ns, both, 0, std::chrono::milliseconds(0), /*keep_encoding=*/true);
      ASSERT_TRUE(stored[0].status.ok()) << stored[0].status.ToString();
      EXPECT_EQ(stored[0].encoding, static_cast<uint8_t>((*enc)->encoding()));
      EXPECT_EQ(stored[0].layout.encoding, (*enc)->encoding());
      EXPECT_EQ(stored[0].layout.num_layers, raw.num_layers);
      ASSERT_EQ(stored[0].size, encoded.size());
      EXPECT_EQ(std::memcmp(stored[0].data, encoded.data(), encoded.size()), 0);
      EXPECT_EQ(stored[0].checksum, BlockChecksum(encoded.data(), encoded.size()));
      ASSERT_TRUE(stored[1].status.ok());
      EXPECT_EQ(stored[1].encoding, 0);
      EXPECT_EQ(stored[1].size, 5000u);
      for (BlockRead& r : stored) manager_->Release(r);
      manager_->WaitIdleForTest();
      EXPECT_EQ(TiersOf({kv_key}, ns), std::vector<Tier>{Tier::kDisk});
    }
    for (int round = 0; round < 2; ++round) {  // straight from disk, then promoted into host
      std::vector<BlockRead> reads = manager_->Acquire(ns, {&kv_key, 1});
      ASSERT_TRUE(reads[0].status.ok()) << reads[0].status.ToString();
      EXPECT_EQ(reads[0].lossy_encoding, static_cast<uint8_t>((*enc)->encoding()));
      ASSERT_EQ(reads[0].size, want.size());
      EXPECT_EQ(std::memcmp(reads[0].data, want.data(), want.size()), 0);
      EXPECT_EQ(reads[0].checksum, BlockChecksum(want.data(), want.size()));
      manager_->Release(reads[0]);
      manager_->WaitIdleForTest();
    }
    ExpectServed(other_key, ns);  // raw: exact, not lossy
    std::vector<BlockRead> other = manager_->Acquire(ns, {&other_key, 1});
    EXPECT_EQ(other[0].lossy_encoding, 0);
    manager_->Release(other[0]);
  }
  EXPECT_EQ(manager_->GetStats().encoded_writes, 3u);

  // A restart finds the encoded copies from their meta records alone.
  const uint64_t used = manager_->GetStats().disk_used_bytes;
  Reopen();
  EXPECT_EQ(manager_->GetStats().disk_used_bytes, used);
  const BlockKey kv_key = KeyOf(500 + 11);  // the int8 one
  std::vector<BlockRead> reads = manager_->Acquire(11, {&kv_key, 1});
  ASSERT_TRUE(reads[0].status.ok()) << reads[0].status.ToString();
  EXPECT_EQ(reads[0].lossy_encoding, static_cast<uint8_t>(kernels::Encoding::kInt8));
  manager_->Release(reads[0]);
}

// A block read from its lossy (int8) disk copy is held in host as the decoded, approximate
// bytes. Once its disk copy is dropped for room, those bytes are all there is of it: they must
// never be written down as the block (they would come back exact), and a writer's exact bytes
// replace them.
class ApproximateCopyTest : public TierManagerTest {
 protected:
  static constexpr NamespaceId kInt8 = 31;

  void SetUp() override {
    TierManagerTest::SetUp();
    options_.disk_capacity_bytes = 40 * kKiB;
    Open();
    NamespacePolicy int8 = Compose("", "", "", "none");
    int8.encoding = *CreateDemotionEncoding("int8", raw_);
    ASSERT_TRUE(manager_->SetNamespacePolicy(kInt8, int8).ok());
  }

  // Puts `key` (16 KiB of KV) into kInt8, demotes it (encoded), reads it back into host (the
  // approximate bytes) and drops its disk copy for another block's room.
  void MakeApproximateOnly(const BlockKey& key) {
    ASSERT_EQ(kv_.size(), 16 * kKiB);
    const PutRequestItem item = ItemFor(key, kv_);
    std::vector<ReserveOutcome> r = manager_->Reserve(kInt8, 1, {&item, 1});
    ASSERT_EQ(r[0].state, ReserveState::kReserved);
    Result<ReservationTarget> t = manager_->TargetOf(1, r[0].reservation_id);
    ASSERT_TRUE(t.ok());
    std::memcpy(t->data, kv_.data(), kv_.size());
    ASSERT_TRUE(manager_->Commit(1, r[0].reservation_id).ok());
    DemoteAll({key}, kInt8);
    for (int round = 0; round < 2; ++round) {  // from disk, then from host (promoted)
      std::vector<BlockRead> reads = manager_->Acquire(kInt8, {&key, 1});
      ASSERT_TRUE(reads[0].status.ok()) << reads[0].status.ToString();
      EXPECT_NE(reads[0].lossy_encoding, 0);
      manager_->Release(reads[0]);
      manager_->WaitIdleForTest();
    }
    const BlockKey filler = KeyOf(901);  // disk-only, in another namespace: takes the room
    ASSERT_TRUE(Put(filler, 32 * kKiB).ok());
    DemoteAll({filler});
    ASSERT_EQ(TiersOf({key}, kInt8), std::vector<Tier>{Tier::kHost});
    std::vector<BlockRead> held = manager_->Acquire(kInt8, {&key, 1});
    ASSERT_TRUE(held[0].status.ok());
    EXPECT_NE(held[0].lossy_encoding, 0) << "served as approximate from host";
    manager_->Release(held[0]);
  }

  const kernels::BlockLayout raw_ = SmallLayout();
  const std::vector<uint8_t> kv_ = KvBytes(raw_, 9);
  const BlockKey key_ = KeyOf(900);
};

TEST_F(ApproximateCopyTest, DemotionDropsItRatherThanStoreItAsTheBlock) {
  MakeApproximateOnly(key_);
  // The namespace stops encoding; demotion drops the block rather than store it raw.
  ASSERT_TRUE(manager_->SetNamespacePolicy(kInt8, Compose("", "", "", "none")).ok());
  manager_->Evict(kInt8, Tier::kHost, {&key_, 1});
  manager_->WaitIdleForTest();
  EXPECT_TRUE(TiersOf({key_}, kInt8).empty()) << "not cached any more";
  Reopen();
  ExpectMiss(key_, kInt8);
}

TEST_F(ApproximateCopyTest, TheShutdownFlushLeavesItOutAndWritesTheRest) {
  MakeApproximateOnly(key_);
  const BlockKey other = KeyOf(902);
  ASSERT_TRUE(Put(other, 5000).ok());  // host only, exact
  Reopen();                            // the shutdown flush
  ExpectMiss(key_, kInt8);
  ExpectServed(other);
}

TEST_F(ApproximateCopyTest, AWritersExactBytesReplaceIt) {
  MakeApproximateOnly(key_);
  const PutRequestItem item = ItemFor(key_, kv_);
  std::vector<ReserveOutcome> r = manager_->Reserve(kInt8, 2, {&item, 1});
  ASSERT_EQ(r[0].state, ReserveState::kReserved) << "answered present for approximate bytes";
  Result<ReservationTarget> t = manager_->TargetOf(2, r[0].reservation_id);
  ASSERT_TRUE(t.ok());
  std::memcpy(t->data, kv_.data(), kv_.size());
  ASSERT_TRUE(manager_->Commit(2, r[0].reservation_id).ok());
  std::vector<BlockRead> reads = manager_->Acquire(kInt8, {&key_, 1});
  ASSERT_TRUE(reads[0].status.ok());
  EXPECT_EQ(reads[0].lossy_encoding, 0);
  ASSERT_EQ(reads[0].size, kv_.size());
  EXPECT_EQ(std::memcmp(reads[0].data, kv_.data(), kv_.size()), 0);
  manager_->Release(reads[0]);
}

TEST_F(TierManagerTest, AnEncodedBodyDamagedOnDiskIsAMissNeverWrongBytes) {
  Open();
  const kernels::BlockLayout raw = SmallLayout();
  NamespacePolicy policy = Compose("", "", "", "none");
  policy.encoding = *CreateDemotionEncoding("int8", raw);
  ASSERT_TRUE(manager_->SetNamespacePolicy(kNs, policy).ok());
  const BlockKey key = KeyOf(7);
  const std::vector<uint8_t> kv = KvBytes(raw, 7);
  const PutRequestItem item = ItemFor(key, kv);
  std::vector<ReserveOutcome> r = manager_->Reserve(kNs, 1, {&item, 1});
  Result<ReservationTarget> t = manager_->TargetOf(1, r[0].reservation_id);
  ASSERT_TRUE(t.ok());
  std::memcpy(t->data, kv.data(), kv.size());
  ASSERT_TRUE(manager_->Commit(1, r[0].reservation_id).ok());
  DemoteAll({key});
  ASSERT_TRUE(disk_->CorruptForTest(kNs, key).ok());
  ExpectMiss(key);
  EXPECT_EQ(manager_->GetStats().checksum_failures, 1u);
}

// An in-place writer's checksum is stored as given (Commit does not hash the slot again). A
// writer whose bytes do not match it gets no good copy out of demotion: encoding would re-hash
// the bytes, so the block is written raw and fails its checksum when read back, raw or encoded
// namespace alike.
TEST_F(TierManagerTest, AWriterWhoseBytesDoNotMatchItsChecksumGetsNoGoodCopyFromDemotion) {
  Open();
  const kernels::BlockLayout raw = SmallLayout();
  NamespacePolicy encoded = Compose("", "", "", "none");
  encoded.encoding = *CreateDemotionEncoding("int8", raw);
  constexpr NamespaceId kEncoded = 21;
  ASSERT_TRUE(manager_->SetNamespacePolicy(kEncoded, encoded).ok());
  for (const NamespaceId ns : {kNs, kEncoded}) {
    SCOPED_TRACE(ns);
    const BlockKey key = KeyOf(800 + ns);
    const std::vector<uint8_t> kv = KvBytes(raw, ns);
    const PutRequestItem item = ItemFor(key, kv);
    std::vector<ReserveOutcome> r = manager_->Reserve(ns, 1, {&item, 1});
    ASSERT_EQ(r[0].state, ReserveState::kReserved);
    Result<ReservationTarget> t = manager_->TargetOf(1, r[0].reservation_id);
    ASSERT_TRUE(t.ok());
    std::memcpy(t->data, kv.data(), kv.size());
    t->data[kv.size() / 2] ^= 0x40;  // not what the writer hashed
    const uint64_t failures = manager_->GetStats().checksum_failures;
    ASSERT_TRUE(manager_->Commit(1, r[0].reservation_id, BlockChecksum(kv.data(), kv.size())).ok())
        << "stored as given: readers verify";
    // A host read hands out the bytes with the checksum they fail (clients verify it).
    std::vector<BlockRead> reads = manager_->Acquire(ns, Keys{key});
    ASSERT_TRUE(reads[0].status.ok());
    EXPECT_NE(BlockChecksum(reads[0].data, reads[0].size), reads[0].checksum);
    manager_->Release(reads[0]);

    const uint64_t disk_before = manager_->GetStats().disk_used_bytes;
    DemoteAll({key}, ns);
    EXPECT_EQ(manager_->GetStats().encoded_writes, 0u) << "written raw, not encoded";
    // Charged for what it takes on disk, raw, so that dropping it gives back what it took.
    EXPECT_EQ(manager_->GetStats().disk_used_bytes, disk_before + kv.size());
    EXPECT_EQ(manager_->UsageOf(ns).disk_bytes, kv.size());
    ExpectMiss(key, ns);
    EXPECT_EQ(manager_->GetStats().checksum_failures, failures + 1);
    EXPECT_EQ(manager_->GetStats().disk_used_bytes, disk_before) << "the damaged copy's bytes";
    EXPECT_EQ(manager_->UsageOf(ns).disk_bytes, 0u);
  }
}

// Quotas: the fixture's host tier is 8 MiB of 1 MiB segments.
NamespacePolicy WithQuotas(uint64_t host, uint64_t disk) {
  NamespacePolicy p = DefaultNamespacePolicy();
  p.host_quota_bytes = host;
  p.disk_quota_bytes = disk;
  return p;
}

TEST_F(TierManagerTest, AHostQuotaKeepsANamespaceToItsSegmentsAndItEvictsOnlyItsOwn) {
  Open();
  constexpr NamespaceId kOther = 2;
  ASSERT_TRUE(manager_->SetNamespacePolicy(kNs, WithQuotas(2 * kMiB, 0)).ok());
  std::vector<BlockKey> others;
  for (int i = 0; i < 12; ++i) {  // 3 MiB, no quota
    others.push_back(KeyOf(1000 + i));
    ASSERT_TRUE(Put(others.back(), 256 * kKiB, {}, kOther).ok());
  }
  std::vector<BlockKey> mine;
  for (int i = 0; i < 16; ++i) {  // 4 MiB into a 2 MiB quota: its older blocks make room
    mine.push_back(KeyOf(i));
    ASSERT_TRUE(Put(mine.back(), 256 * kKiB).ok()) << i;
    EXPECT_LE(manager_->UsageOf(kNs).host_segment_bytes, 2 * kMiB) << i;
  }
  manager_->WaitIdleForTest();
  for (const BlockKey& k : others) {
    EXPECT_EQ(TiersOf({k}, kOther), std::vector<Tier>{Tier::kHost}) << "another's block moved";
  }
  EXPECT_EQ(TiersOf({mine.back()}), std::vector<Tier>{Tier::kHost});
  EXPECT_EQ(TiersOf({mine.front()}), std::vector<Tier>{Tier::kDisk}) << "demoted, not lost";
  for (const BlockKey& k : mine) ExpectServed(k);
  for (const BlockKey& k : others) ExpectServed(k, kOther);
  EXPECT_EQ(manager_->GetStats().blocks_lost, 0u);
  ExpectHostAccountingConsistent();
}

// A tenant that leases one block in each of many segments pins them all (a segment is freed only
// when it empties). The default policy's quota bounds every namespace without its own: such a
// tenant holds at most its quota's segments, and the others still get theirs.
TEST_F(TierManagerTest, ADefaultQuotaKeepsATenantLeasingOneBlockPerSegmentToItsShare) {
  Open();
  ASSERT_TRUE(manager_->SetDefaultPolicy(WithQuotas(2 * kMiB, 0)).ok());
  constexpr NamespaceId kGreedy = 7;
  constexpr NamespaceId kOther = 8;
  std::vector<BlockRead> held;
  int refused = 0;
  for (int i = 0; i < 32; ++i) {  // 32 x 256 KiB = every segment of the 8 MiB host, if it could
    const BlockKey k = KeyOf(500 + i);
    Status st = Put(k, 256 * kKiB, {}, kGreedy);
    if (!st.ok()) {
      EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.ToString();
      ++refused;
      continue;
    }
    if (i % 4 == 0) {  // one leased block in each segment it fills
      std::vector<BlockRead> r = manager_->Acquire(kGreedy, {&k, 1});
      if (r[0].status.ok()) held.push_back(std::move(r[0]));
    }
    EXPECT_LE(manager_->UsageOf(kGreedy).host_segment_bytes, 2 * kMiB) << i;
  }
  EXPECT_LE(manager_->UsageOf(kGreedy).host_segment_bytes, 2 * kMiB);
  // The rest of the host tier is still there for another tenant.
  for (int i = 0; i < 20; ++i) {  // 5 MiB
    ASSERT_TRUE(Put(KeyOf(900 + i), 256 * kKiB, {}, kOther).ok()) << i;
  }
  EXPECT_EQ(manager_->GetStats().blocks_lost, 0u);
  for (BlockRead& r : held) manager_->Release(r);
  ExpectHostAccountingConsistent();
}

TEST_F(TierManagerTest, ANamespaceWhoseQuotaIsAllLeasedIsRefusedAndOnlyIt) {
  Open();
  constexpr NamespaceId kOther = 2;
  ASSERT_TRUE(manager_->SetNamespacePolicy(kNs, WithQuotas(1 * kMiB, 0)).ok());
  std::vector<BlockKey> mine;
  for (int i = 0; i < 4; ++i) {  // exactly its one segment
    mine.push_back(KeyOf(i));
    ASSERT_TRUE(Put(mine.back(), 256 * kKiB).ok());
  }
  std::vector<BlockRead> held = manager_->Acquire(kNs, mine);
  for (const BlockRead& r : held) ASSERT_TRUE(r.status.ok());
  Status refused = Put(KeyOf(9), 256 * kKiB);
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("host quota"), std::string::npos) << refused.ToString();
  EXPECT_TRUE(Put(KeyOf(100), 256 * kKiB, {}, kOther).ok()) << "others are not refused";
  for (BlockRead& r : held) manager_->Release(r);
  EXPECT_TRUE(Put(KeyOf(9), 256 * kKiB).ok()) << "once its leases end it makes room again";
  for (const BlockKey& k : mine) ExpectServed(k);
}

TEST_F(TierManagerTest, ADiskQuotaDropsTheNamespacesOwnColdestDiskBlocks) {
  Open();
  constexpr NamespaceId kOther = 2;
  ASSERT_TRUE(manager_->SetNamespacePolicy(kNs, WithQuotas(0, 1 * kMiB)).ok());
  std::vector<BlockKey> others;
  for (int i = 0; i < 4; ++i) {
    others.push_back(KeyOf(1000 + i));
    ASSERT_TRUE(Put(others.back(), 256 * kKiB, {}, kOther).ok());
  }
  DemoteAll(others, kOther);
  std::vector<BlockKey> mine;
  for (int i = 0; i < 8; ++i) {  // 2 MiB through a 1 MiB disk quota, one at a time
    mine.push_back(KeyOf(i));
    ASSERT_TRUE(Put(mine.back(), 256 * kKiB).ok());
    DemoteAll({mine.back()});
    EXPECT_LE(manager_->UsageOf(kNs).disk_bytes, 1 * kMiB) << i;
  }
  EXPECT_EQ(manager_->UsageOf(kNs).disk_bytes, 1 * kMiB);
  EXPECT_EQ(manager_->UsageOf(kOther).disk_bytes, 1 * kMiB);
  for (int i = 0; i < 4; ++i) ExpectMiss(mine[i]);  // the coldest went
  for (int i = 4; i < 8; ++i) ExpectServed(mine[i]);
  for (const BlockKey& k : others) ExpectServed(k, kOther);
  EXPECT_EQ(manager_->GetStats().blocks_over_quota, 4u);

  // A batch larger than the quota keeps its hottest (last) blocks that fit; the rest leave.
  std::vector<BlockKey> batch;
  for (int i = 0; i < 6; ++i) {
    batch.push_back(KeyOf(20 + i));
    ASSERT_TRUE(Put(batch.back(), 256 * kKiB).ok());
  }
  manager_->Evict(kNs, Tier::kHost, batch);
  manager_->WaitIdleForTest();
  EXPECT_LE(manager_->UsageOf(kNs).disk_bytes, 1 * kMiB);
  for (int i = 2; i < 6; ++i) ExpectServed(batch[i]);
  for (const BlockKey& k : others) ExpectServed(k, kOther);
  EXPECT_EQ(manager_->GetStats().blocks_lost, 0u);
}

TEST_F(TierManagerTest, TheShutdownFlushGoesOnPastANamespaceOverItsDiskQuota) {
  options_.flush_on_shutdown = true;
  options_.demotion_batch_bytes = 64 * kKiB;  // a batch per block
  Open();
  constexpr NamespaceId kOther = 2;
  ASSERT_TRUE(manager_->SetNamespacePolicy(kNs, WithQuotas(0, 100 * kKiB)).ok());
  ASSERT_TRUE(Put(KeyOf(1), 200 * kKiB).ok());  // alone larger than its namespace's quota
  std::vector<BlockKey> others;
  for (int i = 0; i < 3; ++i) {
    others.push_back(KeyOf(100 + i));
    ASSERT_TRUE(Put(others.back(), 100 * kKiB, {}, kOther).ok());
  }
  Reopen();  // shuts down (flushing host-only blocks) and recovers from disk
  for (const BlockKey& k : others) ExpectServed(k, kOther);
  ExpectMiss(KeyOf(1));
}

TEST_F(TierManagerTest, QuotasAreDescribedAndTheDefaultsBoundEachNamespaceOnItsOwn) {
  Open();
  ASSERT_TRUE(manager_->SetDefaultPolicy(WithQuotas(kMiB, 0)).ok());
  // One segment each, not one for all of them together.
  ASSERT_TRUE(Put(KeyOf(1), 256 * kKiB, {}, 11).ok());
  ASSERT_TRUE(Put(KeyOf(2), 256 * kKiB, {}, 12).ok());
  EXPECT_EQ(manager_->UsageOf(11).host_segment_bytes, kMiB);
  EXPECT_EQ(manager_->UsageOf(12).host_segment_bytes, kMiB);
  EXPECT_NE(DescribePolicy(WithQuotas(2 * kMiB, 3 * kMiB))
                .find("host-quota=2.00 MiB disk-quota=3.00 MiB"),
            std::string::npos)
      << DescribePolicy(WithQuotas(2 * kMiB, 3 * kMiB));
}

TEST(DemotionEncodingTest, NamesAndLayouts) {
  const kernels::BlockLayout raw = SmallLayout();
  Result<std::shared_ptr<const DemotionEncoding>> none = CreateDemotionEncoding("raw", raw);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
  EXPECT_FALSE(CreateDemotionEncoding("zstd", raw).ok());
  kernels::BlockLayout odd = raw;
  odd.head_dim = 48;  // not a multiple of int4's group of 64
  EXPECT_FALSE(CreateDemotionEncoding("int4-g64", odd).ok());
  Result<std::shared_ptr<const DemotionEncoding>> int8 = CreateDemotionEncoding("int8", raw);
  ASSERT_TRUE(int8.ok());
  EXPECT_EQ((*int8)->name(), "int8");
  EXPECT_TRUE((*int8)->Applies(kernels::RawBytes(raw)));
  EXPECT_FALSE((*int8)->Applies(kernels::RawBytes(raw) + 2));
}

}  // namespace
}  // namespace kvpool::tiers
