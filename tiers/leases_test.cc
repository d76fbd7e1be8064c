// LeaseTable and ReservationTable: owners, deadlines, lookups by key, and that nothing is handed
// back twice.

#include "tiers/leases.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace kvpool::tiers {
namespace {

BlockKey KeyOf(uint8_t n) {
  BlockKey k;
  k.bytes[0] = n;
  return k;
}

TEST(LeaseTableTest, OwnersAndDeadlinesEndLeasesOnce) {
  ManualClock clock;
  LeaseTable t;
  const auto never = Clock::TimePoint::max();
  const uint64_t a = t.Add(/*entry=*/10, /*owner=*/1, never);
  const uint64_t b = t.Add(11, 1, clock.Now() + std::chrono::seconds(5));
  const uint64_t c = t.Add(12, 2, never);
  EXPECT_NE(a, 0u);
  EXPECT_EQ(t.size(), 3u);
  EXPECT_EQ(t.EndIfOwned(c, /*owner=*/1), std::nullopt) << "another owner's lease stays";
  EXPECT_EQ(t.EndExpired(clock.Now()), std::vector<EntryId>{});
  clock.Advance(std::chrono::seconds(6));
  EXPECT_EQ(t.EndExpired(clock.Now()), std::vector<EntryId>{11});
  EXPECT_EQ(t.End(b), std::nullopt) << "already ended by expiry";
  EXPECT_EQ(t.EndOwner(1), std::vector<EntryId>{10});
  EXPECT_EQ(t.End(a), std::nullopt);
  EXPECT_EQ(t.EndIfOwned(c, 2), std::optional<EntryId>(12));
  EXPECT_EQ(t.size(), 0u);
  EXPECT_GT(t.Add(10, 1, never), c) << "ids are never reused";
}

TEST(ReservationTableTest, FindsByIdOwnerAndKey) {
  ManualClock clock;
  ReservationTable t;
  Reservation r;
  r.owner = 7;
  r.ns = 3;
  r.item.key = KeyOf(1);
  r.slot = {2 << 20, 4096};  // in the third 1 MiB segment
  r.deadline = clock.Now() + std::chrono::seconds(30);
  const uint64_t id = t.Add(r);
  EXPECT_TRUE(t.Reserved(3, KeyOf(1)));
  EXPECT_FALSE(t.Reserved(4, KeyOf(1))) << "per namespace";
  EXPECT_EQ(t.FindOwned(id, 8), nullptr);
  ASSERT_NE(t.FindOwned(id, 7), nullptr);
  EXPECT_TRUE(t.OwnerHasSlotIn(7, 2, 1 << 20));
  EXPECT_FALSE(t.OwnerHasSlotIn(7, 1, 1 << 20));
  EXPECT_FALSE(t.OwnerHasSlotIn(8, 2, 1 << 20));
  EXPECT_TRUE(t.Expired(clock.Now()).empty());
  clock.Advance(std::chrono::seconds(31));
  EXPECT_EQ(t.Expired(clock.Now()), std::vector<uint64_t>{id});
  // Being written: never expires.
  t.FindOwned(id, 7)->deadline = Clock::TimePoint::max();
  EXPECT_TRUE(t.Expired(clock.Now()).empty());
  EXPECT_EQ(t.OwnedBy(7), std::vector<uint64_t>{id});
  std::optional<Reservation> out = t.Remove(id);
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->slot.offset, uint64_t{2 << 20});
  EXPECT_FALSE(t.Reserved(3, KeyOf(1)));
  EXPECT_FALSE(t.Remove(id).has_value()) << "handed back once";
  EXPECT_EQ(t.size(), 0u);
}

}  // namespace
}  // namespace kvpool::tiers
