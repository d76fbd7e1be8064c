#pragma once
// The TierManager test fixture: a small real host arena (8 MiB, 1 MiB segments) and a RocksStore
// in a fresh temporary directory, with helpers that put blocks whose bytes derive from their key
// and check every read against an independent copy. Used by tier_manager_test.cc and
// tier_manager_strategies_test.cc; test-only.

#include "tiers/test_tier_stack.h"
#include "tiers/tier_manager.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <random>
#include <set>
#include <span>
#include <thread>
#include <vector>

#include "common/checksum.h"
#include "common/clock.h"

namespace kvpool::tiers {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kKiB = 1ull << 10;
constexpr NamespaceId kNs = 1;
using Keys = std::vector<BlockKey>;

inline BlockKey KeyOf(uint64_t n) {
  BlockKey k;
  std::mt19937_64 rng(n * 0x9E3779B97F4A7C15ull + 17);
  for (auto& b : k.bytes) b = static_cast<uint8_t>(rng());
  return k;
}

// The bytes of a block, derived from its key alone (so any thread can check any read).
inline std::vector<uint8_t> BytesFor(const BlockKey& key, uint64_t size) {
  uint64_t seed;
  std::memcpy(&seed, key.bytes.data(), sizeof(seed));
  std::mt19937_64 rng(seed ^ size);
  std::vector<uint8_t> out(size);
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    const uint64_t v = rng();
    std::memcpy(out.data() + i, &v, 8);
  }
  for (; i < size; ++i) out[i] = static_cast<uint8_t>(rng());
  return out;
}

// For the consistency stresses: key k of a stress whose keys start at KeyOf(first), its size
// (1 KiB .. ~96 KiB, rarely aligned), and its value in namespace ns, unique to both (the same key
// in two namespaces holds different bytes, so a read served across namespaces is caught too).
inline BlockKey StressKey(uint64_t first, int k) { return KeyOf(first + k); }
inline uint64_t StressSize(int k) { return 1024ull * (1 + (k * 37) % 96) + (k * 131) % 1024; }
inline std::vector<uint8_t> StressValue(NamespaceId ns, uint64_t first, int k) {
  BlockKey salted = StressKey(first, k);
  salted.bytes[0] ^= static_cast<uint8_t>(ns * 0x5b);
  salted.bytes[1] ^= static_cast<uint8_t>(ns);
  return BytesFor(salted, StressSize(k));
}
// A count or seed from the environment, else `fallback`.
inline uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : fallback;
}

inline std::vector<BlockKey> ChainKeys(uint64_t first, int n) {
  std::vector<BlockKey> keys;
  for (int i = 0; i < n; ++i) keys.push_back(KeyOf(first + i));
  return keys;
}

inline PutRequestItem ItemFor(const BlockKey& key, const std::vector<uint8_t>& bytes,
                              const BlockKey& parent = {}) {
  PutRequestItem item;
  item.key = key;
  item.size = bytes.size();
  item.checksum = BlockChecksum(bytes.data(), bytes.size());
  item.parent = parent;
  return item;
}

class TierManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvpool_tier_manager_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    options_.disk_capacity_bytes = 256 * kMiB;
    options_.promotion_threads = 2;
  }
  void TearDown() override {
    Close();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // Opens the store, the tiers and a manager (recovering from the store), and starts it.
  void Open() {
    Status st = stack_.Open(dir_, options_);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }

  // Destroys the manager (Shutdown: flushes when configured), then the tiers and the store.
  void Close() { stack_.Close(); }

  void Reopen() {
    Close();
    Open();
  }

  // Puts one block through reserve -> fill -> commit; remembers its bytes.
  Status Put(const BlockKey& key, uint64_t size, const BlockKey& parent = {}, NamespaceId ns = kNs,
             uint64_t owner = 1) {
    std::vector<uint8_t> bytes = BytesFor(key, size);
    const PutRequestItem item = ItemFor(key, bytes, parent);
    std::vector<ReserveOutcome> r = manager_->Reserve(ns, owner, {&item, 1});
    if (r[0].state != ReserveState::kReserved) {
      return r[0].status.ok() ? Status::AlreadyExists("not reserved") : r[0].status;
    }
    Result<ReservationTarget> t = manager_->TargetOf(owner, r[0].reservation_id);
    if (!t.ok()) return t.status();
    EXPECT_EQ(t->size, size);
    std::memcpy(t->data, bytes.data(), size);
    KVPOOL_RETURN_IF_ERROR(manager_->Commit(owner, r[0].reservation_id));
    expected_[{ns, key}] = std::move(bytes);
    return Status::OK();
  }

  // Opens with the flusher idle (only reservations make room) and fills the 8 x 1 MiB host
  // segments with 128 blocks of 64 KiB of kNs: (*keys)[i] = KeyOf(5000 + i).
  void OpenFullOf64KiBBlocks(std::vector<BlockKey>* keys) {
    options_.host_high_watermark = 1.0;
    options_.host_low_watermark = 1.0;
    Open();
    for (int i = 0; i < 128; ++i) {
      keys->push_back(KeyOf(5000 + i));
      ASSERT_TRUE(Put(keys->back(), 64 * kKiB).ok()) << i;
    }
  }

  // OpenFullOf64KiBBlocks (segment s: blocks 16 s .. 16 s + 15), then free pages in every
  // segment: three blocks of each dropped from host (on disk first), four of segment 5.
  void OpenWithRoomInEverySegment(std::vector<BlockKey>* keys, std::vector<BlockKey>* dropped) {
    ASSERT_NO_FATAL_FAILURE(OpenFullOf64KiBBlocks(keys));
    for (int s = 0; s < 8; ++s) {
      for (int i = 0; i < (s == 5 ? 4 : 3); ++i) dropped->push_back((*keys)[16 * s + i]);
    }
    ASSERT_EQ(manager_->Evict(kNs, Tier::kHost, *dropped).evicted, dropped->size());
  }

  // Puts a chain of `sizes.size()` blocks, each the child of the previous one.
  std::vector<BlockKey> PutChain(uint64_t first, const std::vector<uint64_t>& sizes,
                                 NamespaceId ns = kNs) {
    std::vector<BlockKey> keys = ChainKeys(first, static_cast<int>(sizes.size()));
    for (size_t i = 0; i < keys.size(); ++i) {
      Status st = Put(keys[i], sizes[i], i ? keys[i - 1] : BlockKey{}, ns);
      EXPECT_TRUE(st.ok()) << "block " << i << ": " << st.ToString();
    }
    return keys;
  }

  // Acquires `key` and expects exactly the bytes that were put for it.
  void ExpectServed(const BlockKey& key, NamespaceId ns = kNs) {
    const auto it = expected_.find({ns, key});
    ASSERT_NE(it, expected_.end()) << "test bug: no bytes recorded for " << key.ShortHex();
    const std::vector<uint8_t>& want = it->second;
    std::vector<BlockRead> reads = manager_->Acquire(ns, {&key, 1});
    ASSERT_EQ(reads.size(), 1u);
    BlockRead& r = reads[0];
    ASSERT_TRUE(r.status.ok()) << key.ShortHex() << ": " << r.status.ToString();
    ASSERT_NE(r.data, nullptr);
    EXPECT_NE(r.from, Tier::kNone);
    EXPECT_EQ(r.size, want.size());
    EXPECT_EQ(r.checksum, BlockChecksum(want.data(), want.size()));
    EXPECT_TRUE(r.size == want.size() && std::memcmp(r.data, want.data(), want.size()) == 0)
        << "wrong bytes served for " << key.ShortHex();
    manager_->Release(r);
    EXPECT_EQ(r.lease_id, 0u);
  }

  void ExpectMiss(const BlockKey& key, NamespaceId ns = kNs) {
    std::vector<BlockRead> reads = manager_->Acquire(ns, {&key, 1});
    ASSERT_EQ(reads.size(), 1u);
    EXPECT_TRUE(reads[0].status.IsNotFound()) << reads[0].status.ToString();
    EXPECT_EQ(reads[0].data, nullptr);
    manager_->Release(reads[0]);
  }

  // Moves blocks out of host: each ends up on disk only.
  void DemoteAll(const std::vector<BlockKey>& keys, NamespaceId ns = kNs) {
    EvictOutcome o = manager_->Evict(ns, Tier::kHost, keys);
    EXPECT_EQ(o.evicted, keys.size());
    EXPECT_EQ(o.skipped, 0u);
    manager_->WaitIdleForTest();
  }

  std::vector<Tier> TiersOf(const std::vector<BlockKey>& keys, NamespaceId ns = kNs) {
    return manager_->Lookup(ns, keys, /*prefetch=*/false).tiers;
  }

  // The end of a consistency stress: every key k < `keys` (StressKey(first, k)) committed at
  // least once in one of `namespaces` (`committed[ns * keys + k]`) is still served, and `check`
  // looks at what was read; a miss fails the test except in `dropped_ns`, whose blocks were also
  // dropped from the cache. Returns how many were read.
  uint64_t ExpectCommittedServed(
      std::span<const NamespaceId> namespaces, uint64_t first, int keys,
      const std::vector<std::atomic<bool>>& committed, NamespaceId dropped_ns,
      const std::function<void(NamespaceId, int, const BlockRead&)>& check) {
    uint64_t verified = 0;
    for (NamespaceId ns : namespaces) {
      for (int k = 0; k < keys; ++k) {
        if (!committed[ns * keys + k]) continue;
        const BlockKey key = StressKey(first, k);
        std::vector<BlockRead> reads = manager_->Acquire(ns, {&key, 1});
        BlockRead& r = reads[0];
        if (r.status.ok()) {
          check(ns, k, r);
          ++verified;
        } else if (ns != dropped_ns) {
          ADD_FAILURE() << "namespace " << ns << " lost committed block " << k << ": "
                        << r.status.ToString();
        }
        manager_->Release(r);
      }
    }
    return verified;
  }

  // Host bookkeeping agrees with the arena: every arena block is a cached block or a
  // reservation.
  void ExpectHostAccountingConsistent() {
    const TierManagerStats s = manager_->GetStats();
    EXPECT_EQ(s.host.blocks, s.host_blocks + s.reservations_active);
    EXPECT_EQ(manager_->HostSegmentsMismatchForTest(), "");
  }

  std::string dir_;
  ManualClock clock_;  // tests that move time set options_.clock = &clock_
  TierManagerOptions options_;
  TestTierStack stack_;
  std::unique_ptr<RocksStore>& store_ = stack_.store;
  std::unique_ptr<DiskTier>& disk_ = stack_.disk;
  std::unique_ptr<HostTier>& host_ = stack_.host;
  std::unique_ptr<TierManager>& manager_ = stack_.manager;
  std::map<std::pair<NamespaceId, BlockKey>, std::vector<uint8_t>> expected_;
};

}  // namespace kvpool::tiers
