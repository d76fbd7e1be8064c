// Consistency stress of the tier manager in the style of CacheLib's stress tests: many threads
// put, read, look up, demote and drop blocks of three namespaces at once on a host tier far too
// small for them, so evictions, write-back demotions, promotions, read-ahead, quota evictions and
// direct disk reads run all the time. Every value is unique to its (namespace, key) and derived
// from them alone, so every read is checked against an independent reference on the spot. At
// the end every block committed in a namespace that was never dropped from must still be served,
// byte for byte, and the manager's books must balance.
//
// KVPOOL_STRESS_OPS (default 200,000, ~1 min on 2 cores; CI) sets the number of operations;
// KVPOOL_STRESS_SEED the seed (printed). docs/RELIABILITY.md records a 1,000,000-operation run.

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <deque>
#include <random>
#include <thread>

#include "tiers/tier_manager_test_fixture.h"

namespace kvpool::tiers {
namespace {

constexpr int kThreads = 8;
constexpr int kChains = 64;
constexpr int kChainLength = 8;
constexpr int kKeys = kChains * kChainLength;  // 512 keys per namespace, ~24 MiB per namespace
constexpr NamespaceId kNamespaces[] = {1, 2, 3};
constexpr NamespaceId kQuotaNs = 2;    // host quota of 2 MiB
constexpr NamespaceId kDroppedNs = 3;  // blocks also dropped from the whole cache
constexpr size_t kHeldLeases = 6;      // leases a thread holds on to for a while

constexpr uint64_t kFirstKey = 500000;
BlockKey KeyAt(int k) { return StressKey(kFirstKey, k); }
std::vector<uint8_t> ValueOf(NamespaceId ns, int k) { return StressValue(ns, kFirstKey, k); }

struct Counters {
  std::atomic<uint64_t> ops{0}, puts{0}, aborts{0}, reads{0}, hits{0}, lookups{0}, demotes{0},
      drops{0}, wrong{0}, unexpected{0}, phantom{0};
};

TEST_F(TierManagerTest, ManyThreadsNeverSeeAWrongOrLostBlock) {
  const uint64_t total_ops = EnvOr("KVPOOL_STRESS_OPS", 200000);
  const uint64_t seed = EnvOr("KVPOOL_STRESS_SEED", std::random_device()());
  std::printf("stress: %llu operations, seed %llu (KVPOOL_STRESS_SEED to repeat)\n",
              static_cast<unsigned long long>(total_ops), static_cast<unsigned long long>(seed));
  options_.disk_capacity_bytes = 512 * kMiB;  // never full: nothing committed may go missing
  Open();
  NamespacePolicy quota = DefaultNamespacePolicy();
  quota.host_quota_bytes = 2 * kMiB;
  ASSERT_TRUE(manager_->SetNamespacePolicy(kQuotaNs, quota).ok());

  std::vector<std::vector<uint8_t>> values[4];
  for (NamespaceId ns : kNamespaces) {
    for (int k = 0; k < kKeys; ++k) values[ns].push_back(ValueOf(ns, k));
  }
  // Per (namespace, key): reserved at least once (set before Reserve), committed at least once.
  std::vector<std::atomic<bool>> reserved(4 * kKeys), committed(4 * kKeys);
  Counters c;
  auto parent_of = [](int k) { return k % kChainLength ? KeyAt(k - 1) : BlockKey{}; };

  auto check = [&](NamespaceId ns, int k, const BlockRead& r) {
    const std::vector<uint8_t>& want = values[ns][k];
    if (r.size != want.size() || std::memcmp(r.data, want.data(), want.size()) != 0 ||
        r.checksum != BlockChecksum(want.data(), want.size())) {
      ++c.wrong;
    }
    if (!reserved[ns * kKeys + k]) ++c.phantom;  // served a block nobody ever put
  };

  auto worker = [&](int t) {
    std::mt19937_64 rng(seed + t);
    const uint64_t owner = 100 + t;
    std::deque<BlockRead> held;
    const uint64_t ops = total_ops / kThreads;
    for (uint64_t op = 0; op < ops; ++op) {
      ++c.ops;
      const NamespaceId ns = kNamespaces[rng() % 3];
      const int k = static_cast<int>(rng() % kKeys);
      const int what = static_cast<int>(rng() % 100);
      if (what < 30) {  // put (5% of them abort instead of committing)
        const std::vector<uint8_t>& bytes = values[ns][k];
        const PutRequestItem item = ItemFor(KeyAt(k), bytes, parent_of(k));
        reserved[ns * kKeys + k] = true;
        auto r = manager_->Reserve(ns, owner, {&item, 1});
        if (r[0].state != ReserveState::kReserved) {
          if (r[0].state == ReserveState::kRefused &&
              r[0].status.code() != StatusCode::kResourceExhausted) {
            ++c.unexpected;
          }
          continue;
        }
        Result<ReservationTarget> target = manager_->TargetOf(owner, r[0].reservation_id);
        if (!target.ok() || target->size != bytes.size()) {
          ++c.unexpected;
          continue;
        }
        std::memcpy(target->data, bytes.data(), bytes.size());
        if (rng() % 20 == 0) {
          manager_->Abort(owner, r[0].reservation_id);
          ++c.aborts;
        } else if (manager_->Commit(owner, r[0].reservation_id).ok()) {
          committed[ns * kKeys + k] = true;
          ++c.puts;
        } else {
          ++c.unexpected;
        }
      } else if (what < 75) {  // read a run of 1-4 blocks of one chain
        const int n = 1 + static_cast<int>(rng() % 4);
        const int start = std::min(k, kKeys - n);
        std::vector<BlockKey> batch;
        for (int i = 0; i < n; ++i) batch.push_back(KeyAt(start + i));
        std::vector<BlockRead> reads = manager_->Acquire(ns, batch, owner);
        for (int i = 0; i < n; ++i) {
          BlockRead& r = reads[i];
          ++c.reads;
          if (r.status.ok()) {
            ++c.hits;
            check(ns, start + i, r);
            if (r.lease_id != 0 && rng() % 10 == 0) {  // hold on to it for a while
              held.push_back(std::move(r));
              continue;
            }
          } else if (!r.status.IsNotFound() && r.status.code() != StatusCode::kUnavailable &&
                     r.status.code() != StatusCode::kResourceExhausted) {
            ++c.unexpected;
          }
          manager_->Release(r);
        }
        while (held.size() > kHeldLeases) {
          manager_->Release(held.front());
          held.pop_front();
        }
      } else if (what < 87) {  // look a chain up, promoting its disk hits
        const int start = k - k % kChainLength;
        std::vector<BlockKey> chain;
        for (int i = 0; i < kChainLength; ++i) chain.push_back(KeyAt(start + i));
        manager_->Lookup(ns, chain, /*prefetch=*/true);
        ++c.lookups;
      } else if (what < 97 || ns != kDroppedNs) {  // demote a chain's tail to disk
        const int end = k - k % kChainLength + kChainLength;
        std::vector<BlockKey> tail;
        for (int i = k; i < end; ++i) tail.push_back(KeyAt(i));
        manager_->Evict(ns, Tier::kHost, tail);
        ++c.demotes;
      } else {  // drop a chain's tail from the whole cache
        const int end = k - k % kChainLength + kChainLength;
        std::vector<BlockKey> tail;
        for (int i = k; i < end; ++i) tail.push_back(KeyAt(i));
        manager_->Evict(ns, Tier::kDisk, tail);
        ++c.drops;
      }
    }
    for (BlockRead& r : held) manager_->Release(r);
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();
  manager_->WaitIdleForTest();

  std::printf(
      "stress: %llu ops: %llu puts, %llu aborts, %llu reads (%llu hits), %llu lookups, "
      "%llu demotions asked, %llu drops asked\n",
      (unsigned long long)c.ops, (unsigned long long)c.puts, (unsigned long long)c.aborts,
      (unsigned long long)c.reads, (unsigned long long)c.hits, (unsigned long long)c.lookups,
      (unsigned long long)c.demotes, (unsigned long long)c.drops);
  const TierManagerStats s = manager_->GetStats();
  std::printf(
      "stress: host evictions %llu, demotions %llu, promotions %llu, over quota %llu\n",
      (unsigned long long)s.host_counters.evictions, (unsigned long long)s.host_counters.demotions,
      (unsigned long long)s.host_counters.promotions, (unsigned long long)s.blocks_over_quota);
  EXPECT_EQ(c.wrong.load(), 0u) << "reads served wrong bytes";
  EXPECT_EQ(c.phantom.load(), 0u) << "reads served blocks nobody put";
  EXPECT_EQ(c.unexpected.load(), 0u);
  EXPECT_GT(c.hits.load(), c.reads.load() / 10);
  EXPECT_EQ(s.leases_active, 0u);
  EXPECT_EQ(s.reservations_active, 0u);
  EXPECT_EQ(s.blocks_lost, 0u);
  EXPECT_EQ(s.checksum_failures, 0u);
  ExpectHostAccountingConsistent();

  // Nothing committed was lost where nothing was dropped; what remains elsewhere is right.
  const uint64_t verified =
      ExpectCommittedServed(kNamespaces, kFirstKey, kKeys, committed, kDroppedNs, check);
  EXPECT_EQ(c.wrong.load(), 0u);
  std::printf("stress: %llu committed blocks verified at the end\n", (unsigned long long)verified);
}

}  // namespace
}  // namespace kvpool::tiers
