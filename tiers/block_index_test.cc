// BlockIndex: lookups per namespace, child counts, the per-tier eviction-candidate lists (tail
// first by construction) and erasure rules, checked directly and against a brute-force model.

#include "tiers/block_index.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <list>
#include <map>
#include <random>
#include <set>
#include <string_view>
#include <vector>

#include "tiers/eviction_pools.h"

namespace kvpool::tiers {
namespace {

constexpr Tier kHost = Tier::kHost;
constexpr Tier kDisk = Tier::kDisk;
constexpr int kH = TierSlot(kHost);
constexpr int kD = TierSlot(kDisk);
// The tiers these tests use, by position 0, 1.
constexpr int kTestTiers = 2;
Tier TierAt(int t) { return t == 0 ? kHost : kDisk; }

BlockKey KeyOf(uint64_t n) {
  BlockKey k;
  std::mt19937_64 rng(n + 12345);
  for (auto& b : k.bytes) b = static_cast<uint8_t>(rng());
  return k;
}

// The candidates of `tier` in the daemon's default (LRU) order, coldest first.
std::vector<EntryId> Candidates(EvictionPools& pools, const BlockIndex& index, Tier tier) {
  std::vector<EntryId> out;
  pools.Victims(
      tier, UINT64_MAX, [](EntryId) { return true; }, &out);
  std::set<EntryId> seen;
  for (EntryId id : out) {
    EXPECT_TRUE(seen.insert(id).second) << "a candidate ranked twice";
    EXPECT_TRUE(index.at(id).live);
    EXPECT_TRUE(index.at(id).CandidateOf(tier));
  }
  EXPECT_EQ(out.size(), index.CandidateCount(tier));
  return out;
}

// Inserts a chain of `n` blocks in `ns` (parent links set), each with a copy in `tiers`.
std::vector<EntryId> MakeChain(BlockIndex& index, NamespaceId ns, uint64_t first_key, int n,
                               std::initializer_list<Tier> tiers) {
  std::vector<EntryId> ids;
  for (int i = 0; i < n; ++i) {
    const EntryId id = index.Insert(ns, KeyOf(first_key + i));
    if (!ids.empty()) index.SetParent(id, ids.back());
    for (Tier t : tiers) index.AddCopy(id, t);
    ids.push_back(id);
  }
  return ids;
}

TEST(BlockIndexTest, TheBucketHashIsKeyedAndCoversTheWholeKey) {
  // Issue 12, integrity hole 4: it hashed a key by its first 8 bytes, so a tenant could flood one
  // bucket with keys it chose.
  BlockIndex a, b;
  BlockKey k1, k2;
  for (size_t i = 0; i < k1.bytes.size(); ++i) k1.bytes[i] = k2.bytes[i] = static_cast<uint8_t>(i);
  k2.bytes[31] ^= 1;  // the same first 8 bytes
  EXPECT_NE(a.HashForTest(1, k1), a.HashForTest(1, k2));
  EXPECT_NE(a.HashForTest(1, k1), a.HashForTest(2, k1)) << "the namespace is part of it";
  EXPECT_EQ(a.HashForTest(1, k1), a.HashForTest(1, k1));
  EXPECT_NE(a.HashForTest(1, k1), b.HashForTest(1, k1)) << "each index has its own seed";
  // Many keys that differ only past byte 8 spread over the buckets.
  std::set<uint64_t> low_bits;
  for (int i = 0; i < 1000; ++i) {
    BlockKey k = k1;
    k.bytes[20] = static_cast<uint8_t>(i);
    k.bytes[21] = static_cast<uint8_t>(i >> 8);
    low_bits.insert(a.HashForTest(1, k) & 1023);
  }
  EXPECT_GT(low_bits.size(), 500u);
}

// Two keys that std::hash<std::string_view> (libstdc++'s 64-bit murmur, no seed) maps to one
// value: key `a` with its second word changed, and its third word chosen so that murmur's state
// after it is a's again. Murmur's step per word is invertible, so anyone can do this.
std::pair<BlockKey, BlockKey> MurmurCollision() {
  constexpr uint64_t kMul = (uint64_t{0xc6a4a793} << 32) + 0x5bd1e995;
  uint64_t inverse = kMul;  // Newton's iteration: kMul * inverse == 1 mod 2^64
  for (int i = 0; i < 6; ++i) inverse *= 2 - kMul * inverse;
  auto shift_mix = [](uint64_t v) { return v ^ (v >> 47); };  // its own inverse
  auto data = [&](uint64_t w) { return shift_mix(w * kMul) * kMul; };
  auto word_of = [&](uint64_t d) { return shift_mix(d * inverse) * inverse; };
  uint64_t a[4] = {0x0123456789abcdef, 0x1111111111111111, 0x2222222222222222, 0x3333333333333333};
  uint64_t b[4] = {a[0], a[1] ^ 1, 0, a[3]};
  uint64_t ha = 0xc70f6907 ^ (32 * kMul);  // libstdc++'s seed and the length
  uint64_t hb = ha;
  ha = (ha ^ data(a[0])) * kMul;
  hb = (hb ^ data(b[0])) * kMul;
  ha = (ha ^ data(a[1])) * kMul;
  hb = (hb ^ data(b[1])) * kMul;
  b[2] = word_of(ha ^ hb ^ data(a[2]));  // (hb ^ data(b[2])) == (ha ^ data(a[2]))
  BlockKey ka, kb;
  std::memcpy(ka.bytes.data(), a, 32);
  std::memcpy(kb.bytes.data(), b, 32);
  return {ka, kb};
}

TEST(BlockIndexTest, KeysWhoseUnseededHashCollidesStillHashApart) {
  const auto [k1, k2] = MurmurCollision();
  ASSERT_NE(k1, k2);
  auto as_view = [](const BlockKey& k) {
    return std::string_view(reinterpret_cast<const char*>(k.bytes.data()), k.bytes.size());
  };
  if (std::hash<std::string_view>()(as_view(k1)) != std::hash<std::string_view>()(as_view(k2))) {
    GTEST_SKIP() << "this standard library's std::hash is not the murmur the keys were made for";
  }
  // The index's bucket hash, and abseil's hash of a namespaced key (leases, fetch memory).
  BlockIndex index;
  EXPECT_NE(index.HashForTest(1, k1), index.HashForTest(1, k2));
  EXPECT_NE(absl::Hash<NamespacedKey>()({1, k1}), absl::Hash<NamespacedKey>()({1, k2}));
  BlockKey same_start = k1;
  same_start.bytes[31] ^= 1;
  EXPECT_NE(absl::Hash<NamespacedKey>()({1, k1}), absl::Hash<NamespacedKey>()({1, same_start}))
      << "a namespaced key's hash covers more than its first 8 bytes";
}

TEST(BlockIndexTest, InsertFindErasePerNamespace) {
  BlockIndex index;
  EvictionPools pools(index);
  EXPECT_EQ(index.size(), 0u);
  EXPECT_EQ(index.Find(1, KeyOf(1)), kNoEntry);
  const EntryId a1 = index.Insert(1, KeyOf(1));
  const EntryId a2 = index.Insert(2, KeyOf(1));  // same key, other namespace
  const EntryId b1 = index.Insert(1, KeyOf(2));
  EXPECT_NE(a1, a2);
  EXPECT_EQ(index.size(), 3u);
  EXPECT_EQ(index.Find(1, KeyOf(1)), a1);
  EXPECT_EQ(index.Find(2, KeyOf(1)), a2);
  EXPECT_EQ(index.Find(1, KeyOf(2)), b1);
  EXPECT_EQ(index.Find(2, KeyOf(2)), kNoEntry);
  EXPECT_EQ(index.Find(3, KeyOf(1)), kNoEntry);
  EXPECT_EQ(index.at(a1).key, KeyOf(1));
  EXPECT_EQ(index.at(a2).ns, 2u);
  EXPECT_TRUE(index.at(a1).live);
  EXPECT_EQ(index.at(a1).tiers, 0);

  // Per-namespace iteration.
  std::set<EntryId> ns1;
  index.ForEach(1, [&](EntryId id) { ns1.insert(id); });
  EXPECT_EQ(ns1, (std::set<EntryId>{a1, b1}));
  std::set<EntryId> all;
  index.ForEach(kNoNamespace, [&](EntryId id) { all.insert(id); });
  EXPECT_EQ(all.size(), 3u);

  ASSERT_TRUE(index.CanErase(a1));
  index.Erase(a1);
  EXPECT_EQ(index.Find(1, KeyOf(1)), kNoEntry);
  EXPECT_EQ(index.Find(2, KeyOf(1)), a2);  // the other namespace's entry is untouched
  EXPECT_EQ(index.size(), 2u);
  EXPECT_FALSE(index.CanErase(a1));  // no longer live

  // The slot is reused and the new entry starts clean.
  const EntryId c = index.Insert(1, KeyOf(3));
  EXPECT_EQ(index.Find(1, KeyOf(3)), c);
  EXPECT_EQ(index.at(c).tiers, 0);
  EXPECT_EQ(index.at(c).parent, kNoEntry);
  EXPECT_EQ(index.ChildCount(c), 0u);
  EXPECT_EQ(index.at(c).cached_children(), 0u);
}

// A key hashed once, outside the tier lock (KeyHasher), finds what Find(ns, key) finds; and the
// erasure count a lookup relies on to reuse ids across two holds of the lock moves with every
// Erase, and only then, so an id reused for another key is never taken for the old one.
TEST(BlockIndexTest, HashedKeysFindTheSameAndErasuresCountReuse) {
  BlockIndex index;
  EvictionPools pools(index);
  const EntryId a = index.Insert(1, KeyOf(1));
  const BlockKey k1 = KeyOf(1);
  const BlockKey k2 = KeyOf(2);
  const HashedKey h1 = index.Hashed(1, k1);
  EXPECT_EQ(h1.hash, index.HashForTest(1, k1));
  EXPECT_EQ(KeyHasher(index.hasher())(1, k1), h1.hash);  // a copy hashes alike, lock-free
  EXPECT_EQ(index.Find(h1), a);
  EXPECT_EQ(index.Find(index.Hashed(2, k1)), kNoEntry);
  EXPECT_EQ(index.Find(index.Hashed(1, k2)), kNoEntry);

  EXPECT_EQ(index.erasures(), 0u);
  const EntryId b = index.Insert(1, k2);
  index.AddCopy(b, Tier::kHost);
  index.RemoveCopy(b, Tier::kHost);
  EXPECT_EQ(index.erasures(), 0u) << "only an erase counts";
  index.Erase(a);
  EXPECT_EQ(index.erasures(), 1u);
  // The freed id goes to the next key: the count says so.
  const EntryId c = index.Insert(1, KeyOf(3));
  EXPECT_EQ(c, a);
  EXPECT_EQ(index.at(c).key, KeyOf(3));
  EXPECT_EQ(index.erasures(), 1u);
  EXPECT_EQ(index.Find(h1), kNoEntry);
}

TEST(BlockIndexTest, ManyEntriesAcrossChunksStayFindable) {
  BlockIndex index;
  EvictionPools pools(index);
  constexpr int kN = 70000;  // more than one chunk of entries
  std::vector<EntryId> ids;
  for (int i = 0; i < kN; ++i)
    ids.push_back(index.Insert(static_cast<NamespaceId>(i % 3), KeyOf(i)));
  EXPECT_EQ(index.size(), static_cast<size_t>(kN));
  for (int i = 0; i < kN; i += 7) {
    ASSERT_EQ(index.Find(static_cast<NamespaceId>(i % 3), KeyOf(i)), ids[i]);
    ASSERT_EQ(index.Find(static_cast<NamespaceId>((i + 1) % 3), KeyOf(i)), kNoEntry);
  }
  for (int i = 0; i < kN; i += 2) index.Erase(ids[i]);
  EXPECT_EQ(index.size(), static_cast<size_t>(kN / 2));
  for (int i = 0; i < kN; ++i) {
    ASSERT_EQ(index.Find(static_cast<NamespaceId>(i % 3), KeyOf(i)), i % 2 ? ids[i] : kNoEntry);
  }
}

TEST(BlockIndexTest, MemoryBytesIsSane) {
  BlockIndex index;
  EvictionPools pools(index);
  const size_t empty = index.MemoryBytes();
  EXPECT_LT(empty, 4096u);
  constexpr size_t kN = 10000;
  for (size_t i = 0; i < kN; ++i) index.Insert(1, KeyOf(i));
  const size_t full = index.MemoryBytes();
  // At least the entries and a 4-byte id per hash slot; at most one chunk of entries plus a
  // generous hash table.
  EXPECT_GE(full, kN * (sizeof(Entry) + sizeof(EntryId)));
  EXPECT_LE(full, (size_t{1} << 17) * sizeof(Entry) + kN * 64);
  EXPECT_LE(sizeof(Entry), 112u) << "an index entry grew: check docs/BENCHMARKS.md";
  // Entries on disk alone carry no memory part.
  EXPECT_EQ(index.mem_size(), 0u);
  const size_t disk_only = index.MemoryBytes();
  for (size_t i = 0; i < kN; ++i) index.AddCopy(static_cast<EntryId>(i), Tier::kDisk);
  EXPECT_EQ(index.MemoryBytes(), disk_only);
  EXPECT_EQ(index.mem_size(), 0u);
}

TEST(BlockIndexTest, AMemoryPartComesWithTheFirstMemoryCopyAndGoesWithTheLast) {
  BlockIndex index;
  EvictionPools pools(index);
  const EntryId a = index.Insert(1, KeyOf(1));
  const EntryId b = index.Insert(1, KeyOf(2));
  index.AddCopy(a, Tier::kDisk);
  EXPECT_EQ(index.at(a).mem, kNoMem);

  index.EnsureMem(a).host_offset = 4096;
  index.Mem(a).lossy_encoding = 3;
  index.AddCopy(a, Tier::kHost);
  EXPECT_EQ(&index.EnsureMem(a), &index.Mem(a)) << "a second EnsureMem keeps the part";
  index.Mem(a).gpu_page = 7;
  index.AddCopy(a, Tier::kGpu);
  EXPECT_EQ(index.mem_size(), 1u);
  EXPECT_EQ(index.Mem(a).host_offset, 4096u);

  index.RemoveCopy(a, Tier::kGpu);  // host still holds it
  EXPECT_EQ(index.Mem(a).host_offset, 4096u);
  EXPECT_EQ(index.Mem(a).gpu_page, 7u);
  index.RemoveCopy(a, Tier::kHost);  // the last memory copy
  EXPECT_EQ(index.at(a).mem, kNoMem);
  EXPECT_EQ(index.mem_size(), 0u);
  EXPECT_TRUE(index.at(a).In(Tier::kDisk));

  // The part is reused, fresh: nothing of a's host copy shows through b's.
  const MemCopies& mb = index.EnsureMem(b);
  EXPECT_EQ(mb.host_offset, 0u);
  EXPECT_EQ(mb.lossy_encoding, 0);
  EXPECT_EQ(mb.gpu_page, 0u);
  index.AddCopy(b, Tier::kHost);
  EXPECT_EQ(index.CandidateCount(Tier::kHost), 1u);
  EXPECT_EQ(index.Order(b, Tier::kHost).prev, kNoEntry);
  index.RemoveCopy(b, Tier::kHost);
  EXPECT_EQ(index.mem_size(), 0u);
  // A part given and never used (a promotion that failed) goes with its entry.
  const EntryId c = index.Insert(1, KeyOf(3));
  index.EnsureMem(c);
  EXPECT_EQ(index.mem_size(), 1u);
  index.Erase(c);
  EXPECT_EQ(index.mem_size(), 0u);
}

TEST(BlockIndexTest, LruOrderFollowsTouch) {
  BlockIndex index;
  EvictionPools pools(index);
  std::vector<EntryId> ids;
  for (int i = 0; i < 4; ++i) {
    ids.push_back(index.Insert(1, KeyOf(i)));
    index.AddCopy(ids.back(), kHost);
  }
  // Added in order 0..3: 0 is coldest.
  EXPECT_EQ(Candidates(pools, index, kHost),
            (std::vector<EntryId>{ids[0], ids[1], ids[2], ids[3]}));
  index.Touch(ids[0], 5);
  EXPECT_EQ(index.at(ids[0]).last_use_s, 5u);
  EXPECT_EQ(Candidates(pools, index, kHost),
            (std::vector<EntryId>{ids[1], ids[2], ids[3], ids[0]}));
  index.Touch(ids[2], 6);
  EXPECT_EQ(Candidates(pools, index, kHost),
            (std::vector<EntryId>{ids[1], ids[3], ids[0], ids[2]}));
  // Touching the hottest keeps the order.
  index.Touch(ids[2], 7);
  EXPECT_EQ(Candidates(pools, index, kHost),
            (std::vector<EntryId>{ids[1], ids[3], ids[0], ids[2]}));
  // A touch on a copy-less entry changes no list.
  const EntryId lone = index.Insert(1, KeyOf(99));
  index.Touch(lone, 8);
  EXPECT_EQ(index.CandidateCount(kHost), 4u);
  EXPECT_EQ(index.CandidateCount(kDisk), 0u);
}

TEST(BlockIndexTest, EvictsTailFirstAlongAChain) {
  BlockIndex index;
  EvictionPools pools(index);
  const auto c = MakeChain(index, 1, 0, 3, {kHost});  // A -> B -> C
  const EntryId a = c[0], b = c[1], cc = c[2];
  EXPECT_EQ(index.at(a).children[kH], 1u);
  EXPECT_EQ(index.at(b).children[kH], 1u);
  EXPECT_EQ(index.at(cc).children[kH], 0u);
  EXPECT_EQ(index.ChildCount(a), 1u);
  // Only the tail is a host candidate.
  EXPECT_EQ(Candidates(pools, index, kHost), std::vector<EntryId>{cc});

  // Touching the head does not make it evictable.
  index.Touch(a, 1);
  EXPECT_EQ(Candidates(pools, index, kHost), std::vector<EntryId>{cc});

  index.RemoveCopy(cc, kHost);
  EXPECT_EQ(Candidates(pools, index, kHost), std::vector<EntryId>{b});
  index.RemoveCopy(b, kHost);
  EXPECT_EQ(Candidates(pools, index, kHost), std::vector<EntryId>{a});
  index.RemoveCopy(a, kHost);
  EXPECT_TRUE(Candidates(pools, index, kHost).empty());
}

TEST(BlockIndexTest, EvictsTailFirstParentBecomesColdestCandidate) {
  BlockIndex index;
  EvictionPools pools(index);
  // An unrelated block, added first (cold), then the chain A -> B -> C, then another block.
  const EntryId x = index.Insert(1, KeyOf(100));
  index.AddCopy(x, kHost);
  const auto c = MakeChain(index, 1, 0, 3, {kHost});
  const EntryId y = index.Insert(1, KeyOf(101));
  index.AddCopy(y, kHost);
  EXPECT_EQ(Candidates(pools, index, kHost), (std::vector<EntryId>{x, c[2], y}));

  // Evicting C exposes B, which goes to the cold end: used with C, it is next.
  index.RemoveCopy(c[2], kHost);
  EXPECT_EQ(Candidates(pools, index, kHost)[0], c[1]);
  EXPECT_EQ(Candidates(pools, index, kHost), (std::vector<EntryId>{c[1], x, y}));
  // The entry itself stays as a copy-less leaf; it can be erased.
  EXPECT_TRUE(index.CanErase(c[2]));
  index.Erase(c[2]);
  EXPECT_EQ(index.ChildCount(c[1]), 0u);
}

TEST(BlockIndexTest, BranchingChainsKeepTheSharedPrefixUntilAllBranchesGo) {
  BlockIndex index;
  EvictionPools pools(index);
  // P -> {L1, L2}
  const EntryId p = index.Insert(1, KeyOf(0));
  const EntryId l1 = index.Insert(1, KeyOf(1));
  const EntryId l2 = index.Insert(1, KeyOf(2));
  index.SetParent(l1, p);
  index.SetParent(l2, p);
  for (EntryId id : {p, l1, l2}) index.AddCopy(id, kHost);
  EXPECT_EQ(index.at(p).children[kH], 2u);
  EXPECT_EQ(index.ChildCount(p), 2u);
  EXPECT_EQ(Candidates(pools, index, kHost), (std::vector<EntryId>{l1, l2}));
  index.RemoveCopy(l1, kHost);
  EXPECT_EQ(Candidates(pools, index, kHost), std::vector<EntryId>{l2});
  index.RemoveCopy(l2, kHost);
  EXPECT_EQ(Candidates(pools, index, kHost), std::vector<EntryId>{p});
}

TEST(BlockIndexTest, AChildStoredBeforeItsParentIsAdoptedWithItsCopies) {
  BlockIndex index;
  EvictionPools pools(index);
  // The child came first: no link, so both are candidates of both tiers they are in.
  const EntryId child = index.Insert(1, KeyOf(1));
  index.AddCopy(child, kHost);
  index.AddCopy(child, kDisk);
  const EntryId parent = index.Insert(1, KeyOf(0));
  index.AddCopy(parent, kHost);
  index.AddCopy(parent, kDisk);
  EXPECT_EQ(Candidates(pools, index, kHost).size(), 2u);
  index.Adopt(child, parent);
  EXPECT_EQ(index.at(child).parent, parent);
  EXPECT_EQ(index.ChildCount(parent), 1u);
  EXPECT_EQ(index.at(parent).children[kH], 1u);
  // Tail first from here: the parent waits for its child in each tier.
  EXPECT_EQ(Candidates(pools, index, kHost), std::vector<EntryId>{child});
  EXPECT_EQ(Candidates(pools, index, kDisk), std::vector<EntryId>{child});
  index.RemoveCopy(child, kHost);
  EXPECT_EQ(Candidates(pools, index, kHost), std::vector<EntryId>{parent});
  index.RemoveCopy(child, kDisk);
  EXPECT_EQ(index.at(parent).children[kH], 0u);
  EXPECT_EQ(Candidates(pools, index, kDisk), std::vector<EntryId>{parent});
}

TEST(BlockIndexTest, ALinkUnderItselfOrADescendantWouldLoop) {
  BlockIndex index;
  const auto c = MakeChain(index, 1, 0, 200, {kHost});
  const EntryId loose = index.Insert(1, KeyOf(1000));
  EXPECT_TRUE(index.WouldLoop(c[0], c[0]));
  EXPECT_TRUE(index.WouldLoop(c[0], c[1]));
  EXPECT_TRUE(index.WouldLoop(c[0], c[199])) << "199 links down";
  EXPECT_TRUE(index.WouldLoop(c[150], c[199]));
  EXPECT_FALSE(index.WouldLoop(c[199], c[0])) << "the tail under the head: no loop";
  EXPECT_FALSE(index.WouldLoop(loose, c[199]));
  EXPECT_FALSE(index.WouldLoop(c[0], loose));
}

TEST(BlockIndexTest, HostCandidatesIgnoreChildrenOnlyOnDisk) {
  BlockIndex index;
  EvictionPools pools(index);
  const auto c = MakeChain(index, 1, 0, 2, {kHost});
  // Demote the child: it leaves host for disk.
  index.AddCopy(c[1], kDisk);
  index.RemoveCopy(c[1], kHost);
  // The parent may now leave host (its child is not in host) ...
  EXPECT_EQ(Candidates(pools, index, kHost), std::vector<EntryId>{c[0]});
  // ... but the parent has no disk copy, so the child is the only disk candidate.
  EXPECT_EQ(Candidates(pools, index, kDisk), std::vector<EntryId>{c[1]});
}

TEST(BlockIndexTest, DiskCandidatesExcludePinnedEntriesAndEntriesWithCachedChildren) {
  BlockIndex index;
  EvictionPools pools(index);
  const auto c = MakeChain(index, 1, 0, 3, {kDisk});  // A -> B -> C on disk only
  EXPECT_EQ(Candidates(pools, index, kDisk), std::vector<EntryId>{c[2]});
  EXPECT_TRUE(Candidates(pools, index, kHost).empty());

  // A pinned tail is not a candidate; nothing else is either (it has a cached child).
  index.Pin(c[2]);
  EXPECT_TRUE(Candidates(pools, index, kDisk).empty());
  index.Pin(c[2]);  // two sessions
  index.Unpin(c[2]);
  EXPECT_TRUE(Candidates(pools, index, kDisk).empty());
  index.Unpin(c[2]);
  EXPECT_EQ(Candidates(pools, index, kDisk), std::vector<EntryId>{c[2]});

  // A disk-only block whose child is cached in host only is not a disk candidate either:
  // dropping it would lose the middle of the chain.
  index.AddCopy(c[2], kHost);
  index.RemoveCopy(c[2], kDisk);
  EXPECT_TRUE(Candidates(pools, index, kDisk).empty());
  EXPECT_EQ(Candidates(pools, index, kHost), std::vector<EntryId>{c[2]});
  EXPECT_EQ(index.at(c[1]).children[kH], 1u);
  EXPECT_EQ(index.at(c[1]).children[kD], 0u);

  // Once the child is gone from every tier, B is the disk candidate.
  index.RemoveCopy(c[2], kHost);
  EXPECT_EQ(Candidates(pools, index, kDisk), std::vector<EntryId>{c[1]});
  index.Pin(c[1]);
  EXPECT_TRUE(Candidates(pools, index, kDisk).empty());
}

TEST(BlockIndexTest, DiskCopyOfABlockAlsoInHostMayGoWhileChildrenAreOnlyInHost) {
  BlockIndex index;
  EvictionPools pools(index);
  const auto c = MakeChain(index, 1, 0, 2, {kHost, kDisk});
  // Both on both tiers: only the tail is a candidate anywhere.
  EXPECT_EQ(Candidates(pools, index, kHost), std::vector<EntryId>{c[1]});
  EXPECT_EQ(Candidates(pools, index, kDisk), std::vector<EntryId>{c[1]});
  // The child loses its disk copy: the parent's disk copy may go (the block stays in host).
  index.RemoveCopy(c[1], kDisk);
  EXPECT_EQ(Candidates(pools, index, kDisk), std::vector<EntryId>{c[0]});
  // But not while a session pins it.
  index.Pin(c[0]);
  EXPECT_TRUE(Candidates(pools, index, kDisk).empty());
  index.Unpin(c[0]);
  // Losing its host copy makes the parent disk-only with a child cached in host: it stays.
  index.RemoveCopy(c[0], kHost);
  EXPECT_TRUE(Candidates(pools, index, kDisk).empty());
}

TEST(BlockIndexTest, CanEraseRules) {
  BlockIndex index;
  EvictionPools pools(index);
  const auto c = MakeChain(index, 1, 0, 2, {kHost});
  const EntryId a = c[0], b = c[1];
  // Entries with copies cannot be erased.
  EXPECT_FALSE(index.CanErase(a));
  EXPECT_FALSE(index.CanErase(b));

  // A loses its copy but B is cached: A is a ghost and stays.
  index.RemoveCopy(a, kHost);
  EXPECT_EQ(index.at(a).tiers, 0);
  EXPECT_FALSE(index.CanErase(a));
  EXPECT_EQ(index.Find(1, KeyOf(0)), a);

  // B loses its copy: A has no cached child now, but B still links to it.
  index.RemoveCopy(b, kHost);
  EXPECT_EQ(index.at(a).cached_children(), 0u);
  EXPECT_EQ(index.ChildCount(a), 1u);
  EXPECT_FALSE(index.CanErase(a));
  EXPECT_TRUE(index.CanErase(b));

  // Leases, pins and I/O in flight each keep an entry.
  index.at(b).leases = 1;
  EXPECT_FALSE(index.CanErase(b));
  index.at(b).leases = 0;
  index.at(b).busy = kBusyPromoting;
  EXPECT_FALSE(index.CanErase(b));
  index.at(b).busy = 0;
  index.Pin(b);
  EXPECT_FALSE(index.CanErase(b));
  index.Unpin(b);
  ASSERT_TRUE(index.CanErase(b));

  index.Erase(b);
  EXPECT_EQ(index.ChildCount(a), 0u);
  EXPECT_TRUE(index.CanErase(a));
  index.Erase(a);
  EXPECT_EQ(index.size(), 0u);
}

TEST(BlockIndexTest, GhostParentRegainingACopyIsNotACandidateWhileItsChildIsCached) {
  BlockIndex index;
  EvictionPools pools(index);
  const auto c = MakeChain(index, 1, 0, 2, {kHost});
  index.RemoveCopy(c[0], kHost);  // ghost A, cached child B
  index.AddCopy(c[0], kDisk);     // A comes back, on disk
  EXPECT_EQ(index.at(c[0]).children[kH], 1u);
  EXPECT_TRUE(Candidates(pools, index, kDisk).empty());
  EXPECT_EQ(Candidates(pools, index, kHost), std::vector<EntryId>{c[1]});
}

// ---------------------------------------------------------------------------------------------
// Randomized model test.

// The order the lists should have, kept by the documented rules: a new candidate goes to the
// hot end, except a parent exposed by its child's removal, which goes to the cold end; Touch
// moves a candidate to the hot end.
class OrderModel {
 public:
  void Sync(const BlockIndex&, const std::set<EntryId>& want, Tier tier, bool cold) {
    auto& l = lists_[tier == kHost ? 0 : 1];
    for (auto it = l.begin(); it != l.end();) {
      it = want.count(*it) ? std::next(it) : l.erase(it);
    }
    for (EntryId id : want) {
      if (std::find(l.begin(), l.end(), id) != l.end()) continue;
      cold ? l.push_front(id) : l.push_back(id);
    }
  }
  void Touch(EntryId id) {
    for (auto& l : lists_) {
      auto it = std::find(l.begin(), l.end(), id);
      if (it != l.end()) {
        l.erase(it);
        l.push_back(id);
      }
    }
  }
  std::vector<EntryId> Order(Tier tier) const {
    const auto& l = lists_[tier == kHost ? 0 : 1];
    return {l.begin(), l.end()};  // coldest first
  }

 private:
  std::array<std::list<EntryId>, kTestTiers> lists_;
};

// Candidates recomputed from scratch from the live entries, with child counts recomputed too.
std::set<EntryId> BruteForceCandidates(const BlockIndex& index, const std::set<EntryId>& live,
                                       Tier tier) {
  std::map<EntryId, std::array<uint32_t, kStoredTiers>> children;
  for (EntryId id : live) {
    const Entry& e = index.at(id);
    if (e.parent == kNoEntry) continue;
    for (int t = 0; t < kTestTiers; ++t) {
      if (e.In(TierAt(t))) ++children[e.parent][TierSlot(TierAt(t))];
    }
  }
  std::set<EntryId> out;
  for (EntryId id : live) {
    const Entry& e = index.at(id);
    if (!e.In(tier)) continue;
    const auto ch = children[id];
    bool candidate;
    if (tier == kHost) {
      candidate = ch[kH] == 0;
    } else if (e.pins > 0) {
      candidate = false;
    } else if (e.In(kHost)) {
      candidate = ch[kD] == 0;  // the block stays cached in host
    } else {
      candidate = ch[kH] == 0 && ch[kD] == 0;  // dropping it removes it from the cache
    }
    if (candidate) out.insert(id);
  }
  return out;
}

// Recover's bulk load: copies added in random order without settling, then settled once, give
// the same candidates, child counts and tail-first order as adding them one by one.
TEST(BlockIndexTest, ABulkLoadSettledOnceMatchesCopiesAddedOneByOne) {
  BlockIndex one_by_one;
  EvictionPools pools_a(one_by_one);
  one_by_one.SetObserver(&pools_a);
  BlockIndex bulk;
  EvictionPools pools_b(bulk);
  bulk.SetObserver(&pools_b);
  // Three chains, one branching, and a lone block; some in host too.
  struct Block {
    uint64_t key;
    int parent;  // index into blocks, -1: none
    bool host;
  };
  std::vector<Block> blocks;
  for (int c = 0; c < 3; ++c) {
    for (int i = 0; i < 20; ++i) {
      blocks.push_back({static_cast<uint64_t>(c * 100 + i),
                        i == 0 ? -1 : static_cast<int>(blocks.size()) - 1, c == 1 && i < 5});
    }
  }
  blocks.push_back({900, 25, false});  // a branch off chain 1 at its 6th block
  blocks.push_back({901, 60, false});  // continues the branch
  blocks.push_back({950, -1, false});
  std::vector<EntryId> a_ids;
  for (const Block& b : blocks) {
    const EntryId id = one_by_one.Insert(1, KeyOf(b.key));
    if (b.parent >= 0) one_by_one.SetParent(id, a_ids[static_cast<size_t>(b.parent)]);
    one_by_one.AddCopy(id, kDisk);
    if (b.host) one_by_one.AddCopy(id, kHost);
    a_ids.push_back(id);
  }
  // The bulk load: entries first, then links and copies in a shuffled order, then settled.
  std::vector<EntryId> b_ids;
  for (const Block& b : blocks) b_ids.push_back(bulk.Insert(1, KeyOf(b.key)));
  std::vector<size_t> order(blocks.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937(7));
  for (size_t i : order) {
    if (blocks[i].parent >= 0)
      bulk.SetParent(b_ids[i], b_ids[static_cast<size_t>(blocks[i].parent)]);
    bulk.AddCopyUnsettled(b_ids[i], kDisk);
    if (blocks[i].host) bulk.AddCopyUnsettled(b_ids[i], kHost);
  }
  EXPECT_EQ(bulk.CandidateCount(kDisk), 0u) << "nothing is settled before SettleCandidates";
  bulk.SettleCandidates();
  for (size_t i = 0; i < blocks.size(); ++i) {
    const Entry& x = one_by_one.at(a_ids[i]);
    const Entry& y = bulk.at(b_ids[i]);
    EXPECT_EQ(x.candidate, y.candidate) << "block " << i;
    EXPECT_EQ(x.children, y.children) << "block " << i;
    EXPECT_EQ(x.tiers, y.tiers) << "block " << i;
  }
  EXPECT_EQ(bulk.CandidateCount(kDisk), one_by_one.CandidateCount(kDisk));
  EXPECT_EQ(bulk.CandidateCount(kHost), one_by_one.CandidateCount(kHost));
  // Tail first along every chain: evicting disk candidates until none are left drops each
  // block only after every block below it.
  std::set<EntryId> gone;
  for (int round = 0; round < 100 && bulk.size() > 0; ++round) {
    const std::vector<EntryId> victims = Candidates(pools_b, bulk, kDisk);
    if (victims.empty()) break;
    for (EntryId id : victims) {
      bulk.ForEachChild(id, [&](EntryId c) { EXPECT_TRUE(gone.count(c)) << "a child outlived"; });
      if (bulk.at(id).In(kHost)) bulk.RemoveCopy(id, kHost);
      bulk.RemoveCopy(id, kDisk);
      gone.insert(id);
      if (bulk.CanErase(id)) bulk.Erase(id);
    }
  }
  EXPECT_EQ(gone.size(), blocks.size());
}

TEST(BlockIndexTest, RandomOperationsMatchABruteForceModel) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    BlockIndex index;
    EvictionPools pools(index);
    OrderModel model;
    std::set<EntryId> live;
    std::vector<EntryId> live_vec;
    uint64_t next_key = 0;
    auto pick = [&]() { return live_vec[rng() % live_vec.size()]; };
    auto refresh_live_vec = [&]() { live_vec.assign(live.begin(), live.end()); };

    for (int step = 0; step < 600; ++step) {
      const int op = static_cast<int>(rng() % 100);
      bool cold = false;
      EntryId touched = kNoEntry;
      if (op < 20 || live.empty()) {
        const NamespaceId ns = static_cast<NamespaceId>(rng() % 2);
        const EntryId id = index.Insert(ns, KeyOf(next_key++));
        if (!live.empty() && rng() % 4 != 0) {
          const EntryId parent = pick();
          if (index.at(parent).ns == ns) index.SetParent(id, parent);
        }
        live.insert(id);
        refresh_live_vec();
      } else if (op < 50) {
        const EntryId id = pick();
        const Tier t = TierAt(static_cast<int>(rng() % 2));
        if (!index.at(id).In(t)) index.AddCopy(id, t);
      } else if (op < 75) {
        const EntryId id = pick();
        const Tier t = TierAt(static_cast<int>(rng() % 2));
        if (index.at(id).In(t)) {
          index.RemoveCopy(id, t);
          cold = true;
        }
      } else if (op < 82) {
        const EntryId id = pick();
        if (index.at(id).pins > 0 && rng() % 2) {
          index.Unpin(id);
        } else {
          index.Pin(id);
        }
      } else if (op < 92) {
        touched = pick();
        index.Touch(touched, static_cast<uint32_t>(step));
      } else {
        const EntryId id = pick();
        if (index.CanErase(id)) {
          index.Erase(id);
          live.erase(id);
          refresh_live_vec();
        }
      }

      // Check every invariant against the model.
      ASSERT_EQ(index.size(), live.size());
      for (EntryId id : live) {
        const Entry& e = index.at(id);
        ASSERT_TRUE(e.live);
        ASSERT_EQ(index.Find(e.ns, e.key), id);
        uint32_t links = 0;
        std::array<uint32_t, kStoredTiers> ch{};
        for (EntryId other : live) {
          const Entry& o = index.at(other);
          if (o.parent != id) continue;
          ++links;
          for (int t = 0; t < kTestTiers; ++t) ch[TierSlot(TierAt(t))] += o.In(TierAt(t));
        }
        ASSERT_EQ(index.ChildCount(id), links) << "step " << step;
        // A memory part exactly while a memory tier holds a copy.
        ASSERT_EQ(e.mem != kNoMem, e.In(Tier::kHost) || e.In(Tier::kGpu)) << "step " << step;
        ASSERT_EQ(e.children, ch) << "step " << step;
        // Erasable exactly when nothing holds the entry.
        const bool erasable =
            e.tiers == 0 && e.pins == 0 && links == 0 && e.leases == 0 && e.busy == 0;
        ASSERT_EQ(index.CanErase(id), erasable) << "step " << step;
      }
      // Candidate sets against the brute-force recomputation, order against the model. At most
      // one entry per tier newly qualifies per operation (the entry itself, or after a
      // RemoveCopy its parent), so the model's insertion order is unambiguous.
      if (touched != kNoEntry) model.Touch(touched);
      for (int t = 0; t < kTestTiers; ++t) {
        const Tier tier = TierAt(t);
        const std::set<EntryId> want = BruteForceCandidates(index, live, tier);
        const std::vector<EntryId> got = Candidates(pools, index, tier);
        ASSERT_EQ(std::set<EntryId>(got.begin(), got.end()), want)
            << "tier " << t << " step " << step;
        model.Sync(index, want, tier, cold);
        ASSERT_EQ(got, model.Order(tier)) << "tier " << t << " step " << step;
      }
    }
  }
}

}  // namespace
}  // namespace kvpool::tiers
