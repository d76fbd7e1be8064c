// Consistency stress of the tier manager with gpu tiers, on the device double of
// tests/support/fake_device.h: threads put blocks into host and straight into two GPUs' tiers
// (some with a device checksum that does not match, some abandoned by a writer that goes away),
// read them as host readers and as readers on either GPU, place and promote chains onto the
// GPUs, and evict from gpu, host and the whole cache, all at once, on gpu tiers and a host arena
// far too small for them. Every value is unique to its (namespace, key), so each read is checked
// on the spot: the host bytes of every read, and the device bytes and device checksum of a gpu
// read. At the end every committed block of a namespace never dropped from is still served byte for
// byte, every gpu copy left holds its block's bytes, and the books of host and both GPUs balance.
//
// KVPOOL_GPU_STRESS_OPS (default 200,000, ~10 s on 2 cores) sets the number of operations;
// KVPOOL_STRESS_SEED the seed (printed).

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <deque>
#include <random>
#include <thread>

#include "kernels/device_checksum.h"
#include "tests/support/fake_device.h"
#include "tiers/tier_manager_test_fixture.h"

namespace kvpool::tiers {
namespace {

using testing::FakeDevice;

constexpr int kThreads = 6;
constexpr int kChains = 16;
constexpr int kChainLength = 8;
constexpr int kKeys = kChains * kChainLength;  // 128 keys per namespace, ~6 MiB per namespace
constexpr NamespaceId kNamespaces[] = {1, 2};
constexpr NamespaceId kQuotaNs = 2;    // gpu quota of 1 MiB on each GPU
constexpr NamespaceId kDroppedNs = 2;  // blocks also dropped from the whole cache
constexpr size_t kHeldLeases = 4;      // leases a thread holds on to for a while
constexpr int kDevices = 2;

constexpr uint64_t kFirstKey = 700000;
BlockKey KeyAt(int k) { return StressKey(kFirstKey, k); }
std::vector<uint8_t> ValueOf(NamespaceId ns, int k) { return StressValue(ns, kFirstKey, k); }

struct Counters {
  std::atomic<uint64_t> ops{0}, host_puts{0}, gpu_puts{0}, gpu_puts_in_host{0}, damaged{0},
      abandoned{0}, reads{0}, hits{0}, gpu_hits{0}, placements{0}, evictions{0}, drops{0}, wrong{0},
      wrong_on_gpu{0}, unexpected{0}, phantom{0};
};

class TierManagerGpuStressTest : public TierManagerTest {
 protected:
  void SetUp() override {
    TierManagerTest::SetUp();
    // gpu 0: 4 segments of 1 MiB; gpu 1: 2. The host arena: 8 MiB (the fixture's).
    stack_.gpu_arenas.push_back([this] { return gpus_[0].CreateArena(kMiB, 4); });
    stack_.gpu_arenas.push_back([this] { return gpus_[1].CreateArena(kMiB, 2); });
  }

  FakeDevice gpus_[kDevices] = {FakeDevice{0}, FakeDevice{1}};
};

TEST_F(TierManagerGpuStressTest, ManyThreadsNeverSeeAWrongOrLostBlockOnAnyTier) {
  const uint64_t total_ops = EnvOr("KVPOOL_GPU_STRESS_OPS", 200000);
  const uint64_t seed = EnvOr("KVPOOL_STRESS_SEED", std::random_device()());
  std::printf("gpu stress: %llu operations, seed %llu (KVPOOL_STRESS_SEED to repeat)\n",
              static_cast<unsigned long long>(total_ops), static_cast<unsigned long long>(seed));
  options_.disk_capacity_bytes = 256 * kMiB;  // never full: nothing committed may go missing
  Open();
  NamespacePolicy quota = DefaultNamespacePolicy();
  quota.gpu_quota_bytes = kMiB;
  ASSERT_TRUE(manager_->SetNamespacePolicy(kQuotaNs, quota).ok());

  std::vector<std::vector<uint8_t>> values[3];
  std::vector<uint64_t> device_sums[3];
  for (NamespaceId ns : kNamespaces) {
    for (int k = 0; k < kKeys; ++k) {
      values[ns].push_back(ValueOf(ns, k));
      device_sums[ns].push_back(
          kernels::DeviceChecksumCpu(values[ns].back().data(), values[ns].back().size()));
    }
  }
  // Per (namespace, key): reserved at least once (set before Reserve), committed at least once.
  std::vector<std::atomic<bool>> reserved(3 * kKeys), committed(3 * kKeys);
  Counters c;
  auto parent_of = [](int k) { return k % kChainLength ? KeyAt(k - 1) : BlockKey{}; };
  auto slot_of = [&](int device, uint64_t offset, uint64_t size) {
    return stack_.gpus[device]->Data(MemorySlot{offset, size});
  };

  // A read as a reader asking for `device` (-1: a host reader) gets it.
  auto check = [&](NamespaceId ns, int k, const BlockRead& r) {
    const std::vector<uint8_t>& want = values[ns][k];
    if (!reserved[ns * kKeys + k]) ++c.phantom;  // served a block nobody ever put
    if (r.from == Tier::kGpu) {
      // A gpu reader copies the gpu copy; the lease holds its host copy too (made by now: a read
      // of a block put into a gpu waits for its copy down), checked below.
      ++c.gpu_hits;
      if (r.size != want.size() || r.device_checksum != device_sums[ns][k] ||
          gpus_[r.gpu_device].Read(slot_of(r.gpu_device, r.gpu_offset, r.size), r.size) != want) {
        ++c.wrong_on_gpu;
      }
    }
    if (r.size != want.size() || std::memcmp(r.data, want.data(), want.size()) != 0 ||
        r.checksum != BlockChecksum(want.data(), want.size())) {
      ++c.wrong;
    }
  };

  auto worker = [&](int t) {
    std::mt19937_64 rng(seed + t);
    const uint64_t owner = 100 + t;
    uint64_t gone_owners = 0;  // owners of this thread that went away, each its own id
    std::deque<BlockRead> held;
    const uint64_t ops = total_ops / kThreads;
    for (uint64_t op = 0; op < ops; ++op) {
      ++c.ops;
      const NamespaceId ns = kNamespaces[rng() % 2];
      const int k = static_cast<int>(rng() % kKeys);
      const int device = static_cast<int>(rng() % kDevices);
      const int what = static_cast<int>(rng() % 100);
      const int chain_start = k - k % kChainLength;
      std::vector<BlockKey> tail;  // k to the end of its chain
      for (int i = k; i < chain_start + kChainLength; ++i) tail.push_back(KeyAt(i));

      if (what < 35) {  // put: into host (15), into a GPU (20)
        const bool to_gpu = what >= 15;
        const std::vector<uint8_t>& bytes = values[ns][k];
        const PutRequestItem item = ItemFor(KeyAt(k), bytes, parent_of(k));
        // 1 in 25 puts into a GPU is made by a writer that goes away before it commits.
        const bool goes_away = to_gpu && rng() % 25 == 0;
        const uint64_t writer = goes_away ? 1000000 * (t + 1) + ++gone_owners : owner;
        reserved[ns * kKeys + k] = true;
        std::vector<ReserveOutcome> r =
            manager_->Reserve(ns, writer, {&item, 1}, {.gpu_device = to_gpu ? device : -1});
        if (r[0].state != ReserveState::kReserved) {
          if (r[0].state == ReserveState::kRefused &&
              r[0].status.code() != StatusCode::kResourceExhausted) {
            ++c.unexpected;
          }
          continue;
        }
        if (r[0].gpu_device >= 0) {
          if (r[0].gpu_device != device) ++c.unexpected;
          gpus_[device].Write(slot_of(device, r[0].gpu_offset, bytes.size()), bytes.data(),
                              bytes.size());
          if (goes_away) {
            manager_->AbortOwner(writer);
            ++c.abandoned;
            continue;
          }
          // 1 in 30: the slot does not hold what its writer's checksum says.
          const bool damaged = rng() % 30 == 0;
          const uint64_t sum = device_sums[ns][k] ^ (damaged ? 1 : 0);
          const Status st = manager_->CommitToGpu(writer, {&r[0].reservation_id, 1}, {&sum, 1})[0];
          if (damaged) {
            if (st.code() == StatusCode::kCorruption) {
              ++c.damaged;
            } else {
              ++c.unexpected;
            }
          } else if (st.ok()) {
            committed[ns * kKeys + k] = true;
            ++c.gpu_puts;
          } else {
            ++c.unexpected;
          }
          continue;
        }
        // A host slot (no gpu slot asked for, or none with room on that GPU).
        Result<ReservationTarget> target = manager_->TargetOf(writer, r[0].reservation_id);
        if (!target.ok() || target->size != bytes.size()) {
          ++c.unexpected;
          continue;
        }
        std::memcpy(target->data, bytes.data(), bytes.size());
        if (goes_away) {
          manager_->AbortOwner(writer);
          ++c.abandoned;
        } else if (manager_->Commit(writer, r[0].reservation_id).ok()) {
          committed[ns * kKeys + k] = true;
          ++(to_gpu ? c.gpu_puts_in_host : c.host_puts);
        } else {
          ++c.unexpected;
        }
      } else if (what < 70) {  // read a run of 1-4 blocks as a host reader or on a GPU
        const int n = 1 + static_cast<int>(rng() % 4);
        const int start = std::min(k, kKeys - n);
        const int reader_device = rng() % 3 == 0 ? -1 : device;
        std::vector<BlockKey> batch;
        for (int i = 0; i < n; ++i) batch.push_back(KeyAt(start + i));
        std::vector<BlockRead> reads = manager_->Acquire(
            ns, batch, owner, {}, /*keep_encoding=*/false, GpuReach{reader_device});
        for (int i = 0; i < n; ++i) {
          BlockRead& r = reads[i];
          ++c.reads;
          if (r.status.ok()) {
            ++c.hits;
            if (r.from == Tier::kGpu && r.gpu_device != reader_device) ++c.unexpected;
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
      } else if (what < 80) {  // place a chain's tail on a GPU: queued, waited for, or at once
        Result<uint32_t> placed = Status::OK();
        switch (rng() % 3) {
          case 0:
            placed = manager_->PlaceOnGpu(ns, tail, device, /*wait=*/false);
            break;
          case 1:
            placed = manager_->PlaceOnGpu(ns, tail, device, /*wait=*/true);
            break;
          default:
            placed = manager_->PromoteToGpu(ns, tail, device);
        }
        if (!placed.ok() && placed.status().code() != StatusCode::kResourceExhausted &&
            placed.status().code() != StatusCode::kDeadlineExceeded) {
          ++c.unexpected;
        }
        ++c.placements;
      } else if (what < 86) {  // look a chain up, promoting its disk hits
        std::vector<BlockKey> chain;
        for (int i = 0; i < kChainLength; ++i) chain.push_back(KeyAt(chain_start + i));
        manager_->Lookup(ns, chain, /*prefetch=*/true);
      } else if (what < 92) {  // drop a chain tail's gpu copies
        manager_->Evict(ns, Tier::kGpu, tail);
        ++c.evictions;
      } else if (what < 95 || ns != kDroppedNs) {  // demote a chain's tail to disk
        manager_->Evict(ns, Tier::kHost, tail);
        ++c.evictions;
      } else {  // drop a chain's tail from the whole cache
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
      "gpu stress: %llu ops: %llu puts into host, %llu into a gpu (%llu of them given host "
      "slots), %llu refused as damaged, %llu abandoned; %llu reads (%llu hits, %llu from gpu); "
      "%llu placements, %llu evictions, %llu drops asked\n",
      (unsigned long long)c.ops, (unsigned long long)c.host_puts, (unsigned long long)c.gpu_puts,
      (unsigned long long)c.gpu_puts_in_host, (unsigned long long)c.damaged,
      (unsigned long long)c.abandoned, (unsigned long long)c.reads, (unsigned long long)c.hits,
      (unsigned long long)c.gpu_hits, (unsigned long long)c.placements,
      (unsigned long long)c.evictions, (unsigned long long)c.drops);
  const TierManagerStats s = manager_->GetStats();
  std::printf(
      "gpu stress: gpu promotions %llu, evictions %llu; host evictions %llu, "
      "demotions %llu, promotions %llu\n",
      (unsigned long long)s.gpu_counters.promotions, (unsigned long long)s.gpu_counters.evictions,
      (unsigned long long)s.host_counters.evictions, (unsigned long long)s.host_counters.demotions,
      (unsigned long long)s.host_counters.promotions);
  EXPECT_EQ(c.wrong.load(), 0u) << "host reads served wrong bytes";
  EXPECT_EQ(c.wrong_on_gpu.load(), 0u) << "gpu reads found wrong bytes or device checksums";
  EXPECT_EQ(c.phantom.load(), 0u) << "reads served blocks nobody put";
  EXPECT_EQ(c.unexpected.load(), 0u);
  EXPECT_GT(c.hits.load(), c.reads.load() / 10);
  EXPECT_GT(c.gpu_hits.load(), 0u);
  EXPECT_GT(c.gpu_puts.load(), 0u);
  EXPECT_EQ(s.leases_active, 0u);
  EXPECT_EQ(s.reservations_active, 0u);
  EXPECT_EQ(s.blocks_lost, 0u);
  EXPECT_EQ(s.checksum_failures, c.damaged.load()) << "only the damaged commits fail a check";
  ExpectHostAccountingConsistent();
  // Each GPU's arena holds exactly its cached gpu copies (no reservation is left).
  uint64_t gpu_blocks = 0;
  for (const GpuTierUsage& g : s.gpus) {
    EXPECT_EQ(g.memory.blocks, g.blocks) << "gpu " << g.device;
    gpu_blocks += g.blocks;
  }

  // Every gpu copy left holds its block's bytes (looked at before the reads below: a read of a
  // block only on disk makes room in host, and gpu copies go with their host copies).
  uint64_t on_gpu = 0;
  for (NamespaceId ns : kNamespaces) {
    for (int k = 0; k < kKeys; ++k) {
      const auto copy = manager_->GpuCopyForTest(ns, KeyAt(k));
      if (!copy) continue;
      const auto [device, slot] = *copy;
      EXPECT_TRUE(committed[ns * kKeys + k]) << "a gpu copy of block " << k << ", never committed";
      EXPECT_EQ(gpus_[device].Read(stack_.gpus[device]->Data(slot), slot.length), values[ns][k])
          << "gpu " << device << " holds wrong bytes for block " << k;
      ++on_gpu;
    }
  }
  EXPECT_EQ(on_gpu, gpu_blocks);
  // Nothing committed was lost where nothing was dropped, and what is left is right.
  const uint64_t verified =
      ExpectCommittedServed(kNamespaces, kFirstKey, kKeys, committed, kDroppedNs, check);
  EXPECT_EQ(c.wrong.load(), 0u);
  std::printf("gpu stress: %llu committed blocks verified at the end; %llu gpu copies checked\n",
              (unsigned long long)verified, (unsigned long long)on_gpu);
}

}  // namespace
}  // namespace kvpool::tiers
