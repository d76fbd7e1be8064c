#pragma once
// Test-only: the small real tier stack of tiers/test_tier_stack.h in a fresh temporary directory,
// with helpers to put blocks, for the daemon's unit tests. Removes its directory
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
#include "tiers/test_tier_stack.h"
#include "tiers/tier_manager.h"

namespace kvpool::daemon {

class TierStackForTest {
 public:
  TierStackForTest() {
    char tmpl[] = "/tmp/kvpool_daemon_test.XXXXXX";
    EXPECT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    tiers::TierManagerOptions to;
    to.disk_capacity_bytes = 64 << 20;
    Status st = stack_.Open(dir_, to);
    EXPECT_TRUE(st.ok()) << st.ToString();
  }
  ~TierStackForTest() {
    stack_.Close();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  tiers::TierManager& manager() { return *stack_.manager; }
  tiers::RocksStore& store() { return *stack_.store; }

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
    return stack_.manager->Reserve(ns, owner, {&item, 1})[0];
  }
  // Puts block `n` of `bytes` (reserve, copy, commit) as owner 999.
  void Put(NamespaceId ns, uint64_t n, const std::vector<uint8_t>& bytes) {
    const tiers::ReserveOutcome o = Reserve(ns, 999, n, bytes);
    ASSERT_EQ(o.state, tiers::ReserveState::kReserved);
    Result<tiers::ReservationTarget> t = stack_.manager->TargetOf(999, o.reservation_id);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    std::memcpy(t->data, bytes.data(), bytes.size());
    ASSERT_TRUE(stack_.manager->Commit(999, o.reservation_id).ok());
  }

 private:
  std::string dir_;
  tiers::TestTierStack stack_;
};

}  // namespace kvpool::daemon
