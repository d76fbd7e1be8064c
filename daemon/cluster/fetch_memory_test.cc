// FetchMemory on a manual clock: peers in backoff are skipped until it ends, absent keys are
// misses until their TTL ends, and the absent set stays bounded.

#include "daemon/cluster/fetch_memory.h"

#include <gtest/gtest.h>

#include <chrono>

namespace kvpool::daemon::cluster {
namespace {

using std::chrono::milliseconds;

BlockKey KeyOf(uint8_t n) {
  BlockKey k;
  k.bytes.fill(n);
  return k;
}

TEST(FetchMemoryTest, AFailedPeerIsSkippedUntilItsBackoffEnds) {
  ManualClock clock;
  FetchMemory m({.backoff = milliseconds(2000), .clock = &clock});
  EXPECT_FALSE(m.Skip("tcp://a"));
  m.Failed("tcp://a");
  EXPECT_TRUE(m.Skip("tcp://a"));
  EXPECT_FALSE(m.Skip("tcp://b")) << "only that peer";
  clock.Advance(milliseconds(1999));
  EXPECT_TRUE(m.Skip("tcp://a"));
  clock.Advance(milliseconds(1));
  EXPECT_FALSE(m.Skip("tcp://a")) << "tried again once the backoff is over";
  m.Failed("tcp://a");
  m.Answered("tcp://a");
  EXPECT_FALSE(m.Skip("tcp://a")) << "an answer ends the backoff";
  EXPECT_EQ(m.GetStats().peers_skipped, 2u);
}

TEST(FetchMemoryTest, AnAbsentKeyIsAMissUntilItsTtlEnds) {
  ManualClock clock;
  FetchMemory m({.absent_ttl = milliseconds(500), .clock = &clock});
  EXPECT_FALSE(m.KnownAbsent(1, KeyOf(1)));
  m.Absent(1, KeyOf(1));
  EXPECT_TRUE(m.KnownAbsent(1, KeyOf(1)));
  EXPECT_FALSE(m.KnownAbsent(2, KeyOf(1))) << "per namespace";
  EXPECT_FALSE(m.KnownAbsent(1, KeyOf(2)));
  clock.Advance(milliseconds(500));
  EXPECT_FALSE(m.KnownAbsent(1, KeyOf(1)));
  EXPECT_EQ(m.GetStats().absent_hits, 1u);
}

TEST(FetchMemoryTest, TheAbsentSetStaysBoundedAndKeepsTheNewest) {
  ManualClock clock;
  FetchMemory m({.absent_ttl = milliseconds(10000), .max_absent = 8, .clock = &clock});
  for (uint8_t i = 0; i < 40; ++i) {
    m.Absent(1, KeyOf(i));
    clock.Advance(milliseconds(1));
  }
  int kept = 0;
  for (uint8_t i = 0; i < 40; ++i) kept += m.KnownAbsent(1, KeyOf(i));
  EXPECT_LE(kept, 8);
  EXPECT_TRUE(m.KnownAbsent(1, KeyOf(39))) << "the newest stays";
}

}  // namespace
}  // namespace kvpool::daemon::cluster
