// The strategies a namespace composes, through the TierManager: disk admission (none never
// touches disk, after-N-hits demotes only blocks read N times), read-ahead along a chain, and a
// change of eviction order that keeps every block. Every block served is compared with an
// independent copy of what was put.

#include <gtest/gtest.h>

#include <vector>

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

}  // namespace
}  // namespace kvpool::tiers
