// Mover: the scheduling of the tier manager's background work, with callbacks that record what
// ran. The clock is a ManualClock, so a flusher round runs only when the test moves time or wakes
// the flusher.

#include "tiers/mover.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"

namespace kvpool::tiers {
namespace {

using std::chrono::milliseconds;

class MoverTest : public ::testing::Test {
 protected:
  // The work each test's mover runs; `mu_` is held around each call, as the tier manager does.
  MoverWork Work() {
    return MoverWork{[this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { ++rounds_; },
                     [this](EntryId id) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                       if (id == gated_ && !gate_.HasBeenNotified()) {
                         // Like a promotion reading from disk: the lock is released for the I/O.
                         mu_.Unlock();
                         in_gate_.Notify();
                         gate_.WaitForNotification();
                         mu_.Lock();
                       }
                       promoted_.push_back(id);
                     },
                     [this](EntryId id)
                         ABSL_NO_THREAD_SAFETY_ANALYSIS { abandoned_.push_back(id); }};
  }

  // Waits (really) until `done` holds under the lock; false after 10 s.
  template <typename Fn>
  bool WaitFor(Fn done) {
    for (int i = 0; i < 10000; ++i) {
      {
        absl::MutexLock lock(&mu_);
        if (done()) return true;
      }
      std::this_thread::sleep_for(milliseconds(1));
    }
    return false;
  }

  absl::Mutex mu_;
  ManualClock clock_;
  std::atomic<int> rounds_{0};
  std::vector<EntryId> promoted_ ABSL_GUARDED_BY(mu_);
  std::vector<EntryId> abandoned_ ABSL_GUARDED_BY(mu_);
  EntryId gated_ = kNoEntry;  // the promotion of this entry waits for gate_
  absl::Notification gate_;
  absl::Notification in_gate_;
};

TEST_F(MoverTest, EachQueuedPromotionRunsOnceInOrderOnOneThread) {
  Mover mover(mu_, clock_, MoverOptions{1}, Work());
  mover.Start();
  {
    absl::MutexLock lock(&mu_);
    for (EntryId id = 1; id <= 50; ++id) mover.Enqueue(id);
  }
  ASSERT_TRUE(WaitFor([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return promoted_.size() == 50; }));
  mover.Stop();
  absl::MutexLock lock(&mu_);
  for (EntryId id = 1; id <= 50; ++id) EXPECT_EQ(promoted_[id - 1], id);
  EXPECT_TRUE(abandoned_.empty());
}

TEST_F(MoverTest, ManyPromotersRunEachPromotionExactlyOnce) {
  Mover mover(mu_, clock_, MoverOptions{4}, Work());
  mover.Start();
  for (EntryId id = 1; id <= 1000; ++id) {
    absl::MutexLock lock(&mu_);
    mover.Enqueue(id);
  }
  ASSERT_TRUE(WaitFor([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return promoted_.size() == 1000; }));
  mover.Stop();
  absl::MutexLock lock(&mu_);
  EXPECT_EQ(std::set<EntryId>(promoted_.begin(), promoted_.end()).size(), 1000u);
}

TEST_F(MoverTest, FlusherRunsARoundWhenTimePassesOrWhenWoken) {
  Mover mover(mu_, clock_, MoverOptions{1, milliseconds(200)}, Work());
  mover.Start();
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(rounds_.load(), 0) << "the manual clock has not moved";

  // Woken: a round at once.
  {
    absl::MutexLock lock(&mu_);
    mover.WakeFlusher();
  }
  ASSERT_TRUE(WaitFor([&] { return rounds_.load() >= 1; }));

  // Its nap ends when the clock passes the interval.
  const int before = rounds_.load();
  clock_.Advance(milliseconds(250));
  ASSERT_TRUE(WaitFor([&] { return rounds_.load() > before; }));
  mover.Stop();
}

TEST_F(MoverTest, WaitFlusherRoundRunsAWholeRoundThatBeganAfterTheCall) {
  // The round blocks in the middle (like a demotion writing to disk, outside the lock) until
  // the test lets it go, so a round already running when the wait begins is seen to not count.
  absl::Notification in_round;
  absl::Notification let_go;
  std::atomic<int> rounds{0};
  MoverWork work = Work();
  work.flush_round = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (rounds.fetch_add(1) == 0) {
      mu_.Unlock();
      in_round.Notify();
      let_go.WaitForNotification();
      mu_.Lock();
    }
  };
  Mover mover(mu_, clock_, MoverOptions{1, milliseconds(200)}, std::move(work));
  mover.Start();
  {
    absl::MutexLock lock(&mu_);
    mover.WakeFlusher();
  }
  in_round.WaitForNotification();  // round 1 is running
  std::atomic<bool> returned{false};
  std::thread waiter([&] {
    mover.WaitFlusherRound();
    returned = true;
  });
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_FALSE(returned.load()) << "round 1 began before the wait";
  let_go.Notify();
  waiter.join();
  EXPECT_EQ(rounds.load(), 2) << "the wait asked for round 2 and saw it end; the clock never moved";
  mover.Stop();
}

TEST_F(MoverTest, StopFinishesThePromotionInProgressAndAbandonsTheQueue) {
  gated_ = 1;
  Mover mover(mu_, clock_, MoverOptions{1}, Work());
  mover.Start();
  {
    absl::MutexLock lock(&mu_);
    for (EntryId id = 1; id <= 6; ++id) mover.Enqueue(id);
  }
  in_gate_.WaitForNotification();  // entry 1 is being read, outside the lock
  std::thread stopper([&] { mover.Stop(); });
  ASSERT_TRUE(WaitFor([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return mover.stopping(); }));
  gate_.Notify();
  stopper.join();
  const int rounds_after_stop = rounds_.load();
  mover.Stop();  // again: nothing
  std::this_thread::sleep_for(milliseconds(20));
  clock_.Advance(milliseconds(1000));
  absl::MutexLock lock(&mu_);
  EXPECT_EQ(promoted_, std::vector<EntryId>{1});
  EXPECT_EQ(abandoned_, (std::vector<EntryId>{2, 3, 4, 5, 6}));
  EXPECT_EQ(rounds_.load(), rounds_after_stop) << "no callback after Stop";
}

}  // namespace
}  // namespace kvpool::tiers
