#include "tiers/mover.h"

#include <algorithm>
#include <utility>

#include "common/threads.h"

namespace kvpool::tiers {

Mover::Mover(absl::Mutex& mu, Clock& clock, MoverOptions options, MoverWork work)
    : mu_(mu), clock_(clock), options_(options), work_(std::move(work)) {
  absl::MutexLock lock(&mu_);
  gpu_queues_.resize(std::max(0, options_.gpu_workers));
}

Mover::~Mover() { Stop(); }

void Mover::Start() {
  threads_.push_back(StartThread(ThreadRole::kTierFlusher, 0, [this] { FlusherLoop(); }));
  for (int i = 0; i < std::max(1, options_.promotion_threads); ++i) {
    threads_.push_back(StartThread(ThreadRole::kPrefetcher, i, [this] { PromoterLoop(); }));
  }
  for (int g = 0; g < options_.gpu_workers; ++g) {
    threads_.push_back(StartThread(ThreadRole::kGpuCopy, g, [this, g] { GpuCopyLoop(g); }));
  }
}

void Mover::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    stopping_ = true;
    queued_.SignalAll();
    gpu_queued_.SignalAll();
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
  for (size_t g = 0; g < gpu_queues_.size(); ++g) {
    GpuQueue& q = gpu_queues_[g];
    while (!q.jobs.empty()) {
      if (work_.abandon_gpu) work_.abandon_gpu(static_cast<int>(g), q.jobs.front());
      q.jobs.pop_front();
    }
  }
}

void Mover::Enqueue(EntryId id) {
  queue_.push_back(id);
  queued_.Signal();
}

void Mover::EnqueueGpu(int gpu, GpuPlacement job) {
  gpu_queues_.at(static_cast<size_t>(gpu)).jobs.push_back(std::move(job));
  gpu_queued_.SignalAll();  // one condition for every GPU's worker: wake the right one too
}

size_t Mover::gpu_pending() const {
  size_t n = 0;
  for (const GpuQueue& q : gpu_queues_) n += q.jobs.size() + (q.running ? 1 : 0);
  return n;
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

void Mover::GpuCopyLoop(int gpu) {
  absl::MutexLock lock(&mu_);
  GpuQueue& q = gpu_queues_[static_cast<size_t>(gpu)];
  while (!stopping_) {
    if (q.jobs.empty()) {
      gpu_queued_.Wait(&mu_);
      continue;
    }
    const GpuPlacement job = std::move(q.jobs.front());
    q.jobs.pop_front();
    q.running = true;
    work_.place_on_gpu(gpu, job);
    q.running = false;
  }
}

}  // namespace kvpool::tiers
