#include "tiers/mover.h"

#include <algorithm>
#include <utility>

#include "common/threads.h"

namespace kvpool::tiers {

Mover::Mover(absl::Mutex& mu, Clock& clock, MoverOptions options, MoverWork work)
    : mu_(mu), clock_(clock), options_(options), work_(std::move(work)) {}

Mover::~Mover() { Stop(); }

void Mover::Start() {
  threads_.push_back(StartThread(ThreadRole::kTierFlusher, 0, [this] { FlusherLoop(); }));
  for (int i = 0; i < std::max(1, options_.promotion_threads); ++i) {
    threads_.push_back(StartThread(ThreadRole::kPrefetcher, i, [this] { PromoterLoop(); }));
  }
}

void Mover::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    stopping_ = true;
    queued_.SignalAll();
    wake_.SignalAll();  // else the flusher notices only at the end of its nap
    round_done_.SignalAll();
  }
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  absl::MutexLock lock(&mu_);
  while (!queue_.empty()) {
    const EntryId id = queue_.front();
    queue_.pop_front();
    if (work_.abandon) work_.abandon(id);
  }
}

void Mover::Enqueue(EntryId id) {
  queue_.push_back(id);
  queued_.Signal();
}

void Mover::WakeFlusher() {
  wake_requested_ = true;
  wake_.Signal();
}

void Mover::WaitFlusherRound() {
  absl::MutexLock lock(&mu_);
  // The next round to start is a whole one that begins after this call; ask for it now.
  const uint64_t target = rounds_started_ + 1;
  WakeFlusher();
  while (rounds_done_ < target && !stopping_) round_done_.Wait(&mu_);
}

void Mover::FlusherLoop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    const Clock::TimePoint deadline = clock_.Now() + options_.flusher_interval;
    while (!stopping_ && !wake_requested_ && !clock_.WaitUntil(wake_, mu_, deadline)) {
    }
    if (stopping_) break;
    wake_requested_ = false;
    ++rounds_started_;
    work_.flush_round();
    ++rounds_done_;
    round_done_.SignalAll();
  }
}

void Mover::PromoterLoop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    if (queue_.empty()) {
      queued_.Wait(&mu_);
      continue;
    }
    const EntryId id = queue_.front();
    queue_.pop_front();
    work_.promote(id);
  }
}

}  // namespace kvpool::tiers
