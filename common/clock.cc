#include "common/clock.h"

#include "absl/time/time.h"

namespace kvpool {
namespace {

class SteadyClock final : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
  bool WaitUntil(absl::CondVar& cv, absl::Mutex& mu, TimePoint deadline) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const Duration left = deadline - Now();
    if (left <= Duration::zero()) return true;
    cv.WaitWithTimeout(&mu, absl::FromChrono(left));
    return Now() >= deadline;
  }
};

// How long a waiter on a manual clock sleeps in real time before it looks at the clock again.
constexpr auto kManualPoll = std::chrono::milliseconds(2);

}  // namespace

Clock& RealClock() {
  static SteadyClock* clock = new SteadyClock();  // never destroyed: threads may outlive main
  return *clock;
}

ManualClock::ManualClock()
    : now_(std::chrono::steady_clock::time_point() + std::chrono::hours(1)) {}

Clock::TimePoint ManualClock::Now() const {
  absl::MutexLock lock(&mu_);
  return now_;
}

bool ManualClock::WaitUntil(absl::CondVar& cv, absl::Mutex& mu, TimePoint deadline) const {
  if (Now() >= deadline) return true;
  // A signal ends the wait at once; otherwise poll the manual time.
  cv.WaitWithTimeout(&mu, absl::FromChrono(kManualPoll));
  return Now() >= deadline;
}

void ManualClock::Advance(Duration by) {
  absl::MutexLock lock(&mu_);
  now_ += by;
}

}  // namespace kvpool
