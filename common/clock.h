#pragma once
// Clock: the one source of time for leases, reservation expiry, the flusher's naps and cluster
// membership, so tests can move time instead of sleeping (as LevelDB's Env does for its clock).
//
// RealClock() is std::chrono::steady_clock. ManualClock (tests) only moves when Advance is
// called; a thread waiting on it with WaitUntil sees an advance within a few milliseconds.
//
// Thread safety: every method of both clocks may be called from any thread. RealClock() lives
// for the whole process.

#include <chrono>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace kvpool {

class Clock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  using Duration = std::chrono::steady_clock::duration;

  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;
  // Waits on `cv` (with `mu` held) until this clock reaches `deadline` or `cv` is signalled
  // (spurious wake-ups included). Returns true when the deadline has passed. Callers loop:
  //   while (!ready && !clock.WaitUntil(cv, mu, deadline)) {}
  // A manual clock returns after at most a few real milliseconds, so the loop re-checks.
  virtual bool WaitUntil(absl::CondVar& cv, absl::Mutex& mu, TimePoint deadline) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;
  bool WaitFor(absl::CondVar& cv, absl::Mutex& mu, Duration timeout) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return WaitUntil(cv, mu, Now() + timeout);
  }
};

// The process's steady clock.
Clock& RealClock();

// Wall-clock time in milliseconds since the Unix epoch, for what must compare across nodes and
// restarts (session versions, membership records), never for deadlines.
inline int64_t UnixMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A clock for tests: starts at an arbitrary point and moves only by Advance.
class ManualClock final : public Clock {
 public:
  ManualClock();

  // Clock
  TimePoint Now() const override;
  bool WaitUntil(absl::CondVar& cv, absl::Mutex& mu, TimePoint deadline) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Moves time forward; waiters whose deadline passed see it within a few milliseconds.
  void Advance(Duration by);

 private:
  mutable absl::Mutex mu_;
  TimePoint now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvpool
