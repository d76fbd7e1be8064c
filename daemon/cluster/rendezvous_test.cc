#include "daemon/cluster/rendezvous.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

namespace kvpool::daemon::cluster {
namespace {

std::vector<BlockKey> RandomKeys(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<BlockKey> keys(n);
  for (auto& k : keys) {
    for (size_t i = 0; i < BlockKey::kSize; i += 8) {
      const uint64_t v = rng();
      for (size_t j = 0; j < 8; ++j) k.bytes[i + j] = static_cast<uint8_t>(v >> (8 * j));
    }
  }
  return keys;
}

const std::vector<NodeId> kFive = {"node-a", "node-b", "node-c", "node-d", "node-e"};

BlockKey KeyOf(uint8_t first) {
  BlockKey k;
  for (size_t i = 0; i < BlockKey::kSize; ++i) k.bytes[i] = static_cast<uint8_t>(first + i);
  return k;
}

// Every daemon, whatever its build, must place a key on the same nodes: the weights are
// pinned to xxh3-64 (frozen since xxHash 0.8.0) of the key seeded by xxh3-64 of the node id.
TEST(RendezvousTest, WeightsAreKnownAnswers) {
  EXPECT_EQ(Ring::Weight(KeyOf(0), "node-a"), 4602030332175723659ull);
  EXPECT_EQ(Ring::Weight(KeyOf(0), "node-b"), 6484435420503031764ull);
  EXPECT_EQ(Ring::Weight(KeyOf(100), "node-a"), 3445845002817709820ull);
  EXPECT_EQ(Order(KeyOf(0), kFive),
            (std::vector<NodeId>{"node-e", "node-d", "node-c", "node-b", "node-a"}));
  EXPECT_EQ(Order(KeyOf(100), kFive),
            (std::vector<NodeId>{"node-e", "node-d", "node-b", "node-c", "node-a"}));
}

TEST(RendezvousTest, OrderIsDeterministicAndIndependentOfMemberListOrder) {
  std::vector<NodeId> shuffled = kFive;
  std::mt19937 rng(3);
  const Ring ring(kFive);
  for (const auto& key : RandomKeys(1000, 1)) {
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    const auto order = ring.Order(key);
    EXPECT_EQ(order, Order(key, shuffled));
    EXPECT_EQ(order, Ring(shuffled).Order(key));
    // A permutation of the members, highest weight first, Home its head, Homes its prefix.
    EXPECT_TRUE(std::is_permutation(order.begin(), order.end(), kFive.begin(), kFive.end()));
    for (size_t i = 1; i < order.size(); ++i) {
      EXPECT_GE(Ring::Weight(key, order[i - 1]), Ring::Weight(key, order[i]));
    }
    EXPECT_EQ(ring.Home(key), order[0]);
    EXPECT_EQ(ring.Homes(key, 2), std::vector<NodeId>(order.begin(), order.begin() + 2));
  }
}

TEST(RendezvousTest, SpreadsKeysEvenlyOverFiveNodes) {
  const Ring ring(kFive);
  const auto keys = RandomKeys(100000, 2);
  std::map<NodeId, int> first, second;
  for (const auto& key : keys) {
    const auto homes = ring.Homes(key, 2);
    ++first[homes[0]];
    ++second[homes[1]];
  }
  // Uniform is 20000 each; the binomial standard deviation is ~126 (0.6 %). Allow 3 %.
  for (const auto& id : kFive) {
    EXPECT_NEAR(first[id], 20000, 600) << id << " as home";
    EXPECT_NEAR(second[id], 20000, 600) << id << " as first replica";
  }
}

TEST(RendezvousTest, RemovingANodeMovesOnlyItsKeys) {
  const Ring before(kFive);
  std::vector<NodeId> four = kFive;
  four.erase(four.begin() + 2);  // node-c leaves
  const Ring after(four);
  int moved = 0;
  for (const auto& key : RandomKeys(20000, 4)) {
    const auto old_order = before.Order(key);
    auto expected = old_order;
    expected.erase(std::find(expected.begin(), expected.end(), "node-c"));
    // The relative order of the remaining nodes is untouched, so every replica set shifts
    // by at most the one node that left.
    EXPECT_EQ(after.Order(key), expected);
    if (old_order[0] == "node-c") ++moved;
    EXPECT_EQ(after.Home(key) != before.Home(key), old_order[0] == "node-c");
  }
  EXPECT_NEAR(moved, 4000, 300);
}

TEST(RendezvousTest, AddingANodeTakesOnlyTheKeysItWins) {
  const Ring before(kFive);
  std::vector<NodeId> six = kFive;
  six.push_back("node-f");
  const Ring after(six);
  int taken = 0;
  for (const auto& key : RandomKeys(20000, 5)) {
    const NodeId& home = after.Home(key);
    if (home == "node-f") {
      ++taken;
    } else {
      EXPECT_EQ(home, before.Home(key));
    }
  }
  EXPECT_NEAR(taken, 20000 / 6, 300);
}

TEST(RendezvousTest, SmallAndDegenerateMemberSets) {
  const BlockKey key = KeyOf(9);
  EXPECT_TRUE(Order(key, {}).empty());
  EXPECT_TRUE(Homes(key, {}, 2).empty());
  EXPECT_EQ(Homes(key, {"solo"}, 2), std::vector<NodeId>{"solo"});
  EXPECT_EQ(Homes(key, kFive, 0), std::vector<NodeId>{});
  // Duplicates count once.
  const Ring dup({"x", "y", "x"});
  EXPECT_EQ(dup.size(), 2u);
  EXPECT_EQ(dup.Order(key).size(), 2u);
}

}  // namespace
}  // namespace kvpool::daemon::cluster
