// Eviction orders and pools: each built-in order ranks exactly the index's candidates (so all
// evict tail first), honours the filter, and follows its own rule; pools keep a namespace's
// candidates when it changes order and take victims from the largest pool first.

#include "tiers/eviction_order.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "tiers/eviction_pools.h"

namespace kvpool::tiers {
namespace {

BlockKey KeyOf(uint64_t n) {
  BlockKey k;
  std::mt19937_64 rng(n + 777);
  for (auto& b : k.bytes) b = static_cast<uint8_t>(rng());
  return k;
}

const auto kAll = [](EntryId) { return true; };

// Every victim of `tier` in order, all bytes asked for.
std::vector<EntryId> AllVictims(EvictionPools& pools, Tier tier) {
  std::vector<EntryId> out;
  pools.Victims(tier, UINT64_MAX, kAll, &out);
  return out;
}

EntryId AddBlock(BlockIndex& index, NamespaceId ns, uint64_t key, EntryId parent = kNoEntry,
                 uint32_t size = 4096) {
  const EntryId id = index.Insert(ns, KeyOf(key));
  if (parent != kNoEntry) index.SetParent(id, parent);
  index.at(id).size = size;
  index.AddCopy(id, Tier::kHost);
  return id;
}

class EveryOrderTest : public ::testing::TestWithParam<std::string> {};

TEST_P(EveryOrderTest, RanksExactlyTheCandidatesUnderRandomOperations) {
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    BlockIndex index;
    EvictionPools pools(index);
    ASSERT_TRUE(pools.SetDefaultOrder(GetParam()).ok());
    std::vector<EntryId> live;
    for (int step = 0; step < 400; ++step) {
      const int op = static_cast<int>(rng() % 100);
      if (op < 30 || live.empty()) {
        const EntryId parent = !live.empty() && rng() % 3 ? live[rng() % live.size()] : kNoEntry;
        const EntryId id = index.Insert(1, KeyOf(seed * 100000 + step));
        if (parent != kNoEntry) index.SetParent(id, parent);
        index.at(id).size = 4096;
        live.push_back(id);
      } else if (op < 60) {
        const EntryId id = live[rng() % live.size()];
        const Tier t = rng() % 2 ? Tier::kHost : Tier::kDisk;
        index.at(id).In(t) ? index.RemoveCopy(id, t) : index.AddCopy(id, t);
      } else if (op < 85) {
        index.Touch(live[rng() % live.size()], static_cast<uint32_t>(step));
      } else {
        // Ask for a few victims: orders may reorganize themselves while choosing.
        std::vector<EntryId> some;
        pools.Victims(Tier::kHost, 3 * 4096, kAll, &some);
      }
      for (Tier t : {Tier::kHost, Tier::kDisk}) {
        std::set<EntryId> want;
        for (EntryId id : live) {
          if (index.at(id).CandidateOf(t)) want.insert(id);
        }
        const std::vector<EntryId> got = AllVictims(pools, t);
        ASSERT_EQ(got.size(), want.size()) << "step " << step << ": each candidate once";
        ASSERT_EQ(std::set<EntryId>(got.begin(), got.end()), want) << "step " << step;
      }
    }
  }
}

TEST_P(EveryOrderTest, SkipsWhatTheFilterRefusesAndStopsAtTheBytesAskedFor) {
  BlockIndex index;
  EvictionPools pools(index);
  ASSERT_TRUE(pools.SetDefaultOrder(GetParam()).ok());
  std::vector<EntryId> ids;
  for (int i = 0; i < 10; ++i) ids.push_back(AddBlock(index, 1, i));
  const EntryId leased = ids[0];
  std::vector<EntryId> out;
  pools.Victims(
      Tier::kHost, 3 * 4096, [&](EntryId id) { return id != leased; }, &out);
  EXPECT_EQ(out.size(), 3u);
  EXPECT_EQ(std::count(out.begin(), out.end(), leased), 0);
}

TEST_P(EveryOrderTest, NeverOffersTheMiddleOfAChain) {
  BlockIndex index;
  EvictionPools pools(index);
  ASSERT_TRUE(pools.SetDefaultOrder(GetParam()).ok());
  const EntryId a = AddBlock(index, 1, 1);
  const EntryId b = AddBlock(index, 1, 2, a);
  const EntryId c = AddBlock(index, 1, 3, b);
  for (int i = 0; i < 5; ++i) index.Touch(c, i);  // the tail is hot; the head is cold
  EXPECT_EQ(AllVictims(pools, Tier::kHost), std::vector<EntryId>{c});
  index.RemoveCopy(c, Tier::kHost);
  EXPECT_EQ(AllVictims(pools, Tier::kHost), std::vector<EntryId>{b});
}

INSTANTIATE_TEST_SUITE_P(BuiltIn, EveryOrderTest, ::testing::Values("lru", "s3fifo", "lfu"));

TEST(S3FifoOrderTest, OneHitWondersLeaveBeforeBlocksUsedAgain) {
  BlockIndex index;
  EvictionPools pools(index);
  ASSERT_TRUE(pools.SetDefaultOrder("s3fifo").ok());
  std::vector<EntryId> ids;
  for (int i = 0; i < 10; ++i) ids.push_back(AddBlock(index, 1, i));
  index.Touch(ids[0], 1);  // the oldest, but used again
  index.Touch(ids[5], 2);
  std::vector<EntryId> out;
  pools.Victims(Tier::kHost, 8 * 4096, kAll, &out);
  ASSERT_EQ(out.size(), 8u);
  EXPECT_EQ(std::count(out.begin(), out.end(), ids[0]), 0) << "used again: moved to main";
  EXPECT_EQ(std::count(out.begin(), out.end(), ids[5]), 0);
  EXPECT_EQ(out[0], ids[1]);
}

TEST(S3FifoOrderTest, AReturningEvictedBlockGoesStraightToMain) {
  BlockIndex index;
  EvictionPools pools(index);
  ASSERT_TRUE(pools.SetDefaultOrder("s3fifo").ok());
  const EntryId back = AddBlock(index, 1, 1);
  std::vector<EntryId> out;
  pools.Victims(Tier::kHost, 4096, kAll, &out);  // remembered as a ghost
  ASSERT_EQ(out, std::vector<EntryId>{back});
  index.RemoveCopy(back, Tier::kHost);
  // Main holds the returning block; nine newcomers fill small.
  index.AddCopy(back, Tier::kHost);
  for (int i = 10; i < 19; ++i) AddBlock(index, 1, i);
  out.clear();
  pools.Victims(Tier::kHost, 9 * 4096, kAll, &out);
  EXPECT_EQ(std::count(out.begin(), out.end(), back), 0) << "newcomers in small go first";
}

TEST(LfuOrderTest, FrequentBlocksStayAndAgingLetsOldFavouritesGo) {
  BlockIndex index;
  EvictionPools pools(index);
  ASSERT_TRUE(pools.SetDefaultOrder("lfu").ok());
  std::vector<EntryId> ids;
  for (int i = 0; i < 4; ++i) ids.push_back(AddBlock(index, 1, i));
  for (int i = 0; i < 5; ++i) index.Touch(ids[0], i);
  index.Touch(ids[1], 9);
  EXPECT_EQ(AllVictims(pools, Tier::kHost), (std::vector<EntryId>{ids[2], ids[3], ids[1], ids[0]}));
  // Much later traffic goes elsewhere: counts halve, and a steadily used block overtakes.
  for (int round = 0; round < 400; ++round) index.Touch(ids[3], 100 + round);
  const std::vector<EntryId> after = AllVictims(pools, Tier::kHost);
  EXPECT_EQ(after.back(), ids[3]);
}

TEST(EvictionPoolsTest, ANamespaceChangingItsOrderKeepsItsCandidates) {
  BlockIndex index;
  EvictionPools pools(index);
  for (int i = 0; i < 6; ++i) AddBlock(index, /*ns=*/1, i);
  for (int i = 0; i < 4; ++i) AddBlock(index, /*ns=*/2, 100 + i);
  ASSERT_EQ(AllVictims(pools, Tier::kHost).size(), 10u);
  ASSERT_TRUE(pools.SetOrder(1, "s3fifo").ok());
  EXPECT_EQ(pools.OrderName(1), "s3fifo");
  EXPECT_EQ(pools.OrderName(2), "lru");
  EXPECT_EQ(AllVictims(pools, Tier::kHost).size(), 10u);
  ASSERT_TRUE(pools.SetOrder(1, "lfu").ok());
  EXPECT_EQ(AllVictims(pools, Tier::kHost).size(), 10u);
  ASSERT_TRUE(pools.SetOrder(1, "").ok());
  EXPECT_EQ(pools.OrderName(1), "lru");
  EXPECT_EQ(AllVictims(pools, Tier::kHost).size(), 10u);
  EXPECT_FALSE(pools.SetOrder(1, "mru-nonsense").ok());
  EXPECT_EQ(AllVictims(pools, Tier::kHost).size(), 10u);
}

TEST(EvictionPoolsTest, TheLargestPoolGivesUpVictimsFirst) {
  BlockIndex index;
  EvictionPools pools(index);
  ASSERT_TRUE(pools.SetOrder(2, "lru").ok());  // its own pool, smaller
  for (int i = 0; i < 6; ++i) AddBlock(index, 1, i);
  for (int i = 0; i < 2; ++i) AddBlock(index, 2, 100 + i);
  std::vector<EntryId> out;
  pools.Victims(Tier::kHost, 2 * 4096, kAll, &out);
  ASSERT_EQ(out.size(), 2u);
  for (EntryId id : out) EXPECT_EQ(index.at(id).ns, 1u);
}

TEST(EvictionOrderRegistryTest, UnknownNamesListTheKnownOnes) {
  BlockIndex index;
  auto r = EvictionOrderRegistry().Create("arc", EvictionContext{&index, Tier::kHost});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("lru"), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find("s3fifo"), std::string::npos);
}

}  // namespace
}  // namespace kvpool::tiers
