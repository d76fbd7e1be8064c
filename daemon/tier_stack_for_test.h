#pragma once
// Test-only: a small real tier stack (a RocksStore in a fresh temporary directory, an 8 MiB
// host arena of 1 MiB segments, the disk tier and a started TierManager), built the way
// tiers/tier_manager_test.cc builds one, for the daemon's unit tests. Removes its directory
// when destroyed. One test thread at a time.

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <kvpool/block_key.h>

#include "common/checksum.h"
#include "tiers/tier_manager.h"

namespace kvpool::daemon {

class TierStackForTest {
 public:
  TierStackForTest() {
    char tmpl[] = "/tmp/kvpool_daemon_test.XXXXXX";
    EXPECT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    tiers::RocksStoreOptions ro;
    ro.path = dir_ + "/rocksdb";
    ro.block_cache_bytes = 8 << 20;
    Result<std::unique_ptr<tiers::RocksStore>> store = tiers::RocksStore::Open(ro);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(store).value();
    disk_ = std::make_unique<tiers::DiskTier>(*store_);
    tiers::HostTierOptions ho;
    ho.capacity_bytes = 8 << 20;
    ho.segment_bytes = 1 << 20;
    ho.lock_memory = false;
    Result<std::unique_ptr<tiers::HostTier>> host = tiers::HostTier::Create(ho);
    EXPECT_TRUE(host.ok()) << host.status().ToString();
    host_ = std::move(host).value();
    tiers::TierManagerOptions to;
    to.disk_capacity_bytes = 64 << 20;
    manager_ = std::make_unique<tiers::TierManager>(
        to, tiers::TierStack::Create({host_.get(), disk_.get()}).value());
    Status st = manager_->Recover();
    EXPECT_TRUE(st.ok()) << st.ToString();
    manager_->Start();
  }
  ~TierStackForTest() {
    manager_.reset();
    disk_.reset();
    host_.reset();
    store_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  tiers::TierManager& manager() { return *manager_; }
  tiers::RocksStore& store() { return *store_; }

  static BlockKey KeyOf(uint64_t n) {
    BlockKey k;
    std::mt19937_64 rng(n * 0x9E3779B97F4A7C15ull + 17);
    for (auto& b : k.bytes) b = static_cast<uint8_t>(rng());
    return k;
  }
  static std::vector<uint8_t> BytesOf(uint64_t n, uint64_t size) {
    std::mt19937_64 rng(n ^ size);
    std::vector<uint8_t> out(size);
    for (auto& b : out) b = static_cast<uint8_t>(rng());
    return out;
  }

  // Reserves block `n` of `bytes` for `owner`; returns the reservation (or 0 when not reserved).
  tiers::ReserveOutcome Reserve(NamespaceId ns, uint64_t owner, uint64_t n,
                                const std::vector<uint8_t>& bytes) {
    tiers::PutRequestItem item;
    item.key = KeyOf(n);
    item.size = bytes.size();
    item.checksum = BlockChecksum(bytes.data(), bytes.size());
    return manager_->Reserve(ns, owner, {&item, 1})[0];
  }
  // Puts block `n` of `bytes` (reserve, copy, commit) as owner 999.
  void Put(NamespaceId ns, uint64_t n, const std::vector<uint8_t>& bytes) {
    const tiers::ReserveOutcome o = Reserve(ns, 999, n, bytes);
    ASSERT_EQ(o.state, tiers::ReserveState::kReserved);
    Result<tiers::ReservationTarget> t = manager_->TargetOf(999, o.reservation_id);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    std::memcpy(t->data, bytes.data(), bytes.size());
    ASSERT_TRUE(manager_->Commit(999, o.reservation_id).ok());
  }

 private:
  std::string dir_;
  std::unique_ptr<tiers::RocksStore> store_;
  std::unique_ptr<tiers::DiskTier> disk_;
  std::unique_ptr<tiers::HostTier> host_;
  std::unique_ptr<tiers::TierManager> manager_;
};

}  // namespace kvpool::daemon
