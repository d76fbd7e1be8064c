#pragma once
// Mover: the tier manager's background workers, which move blocks between tiers while nobody
// waits for them: one flusher, which runs a round every `flusher_interval` or when woken (expire
// what is due, write down what the write policy queued, demote to the low watermark),
// `promotion_threads` promoters, which read queued blocks up from disk (prefetches, read-ahead
// and the reads a get waits for), and one copy worker per GPU (`gpu_workers`), which runs that
// GPU's placements in queueing order: every copy into a GPU's tier goes through its worker, so
// one thread drives each device's copy stream.
//
// The mover decides when, its owner what: each round and each promotion is a callback run with
// the owner's mutex held, which it may release while it does I/O. The queue of promotions is
// kept here, guarded by that same mutex, so queueing one is part of the owner's critical section.
//
// Thread safety: Enqueue, WakeFlusher and the accessors need the owner's mutex held; Start,
// Stop and WaitFlusherRound must be called without it. Start once, Stop once (later Stops do
// nothing); the callbacks are never called after Stop returns.

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/namespace_id.h"
#include "tiers/block_index.h"

namespace kvpool::tiers {

struct MoverOptions {
  int promotion_threads = 2;  // at least one runs
  Clock::Duration flusher_interval = std::chrono::milliseconds(200);
  int gpu_workers = 0;  // one per gpu tier, indexed as the tier stack orders them
};

// One job of a GPU's copy worker: copy these blocks of `ns` into that GPU's tier, or (with
// `fill_host`, no keys) make the host copies of the blocks put straight into that GPU's tier.
struct GpuPlacement {
  NamespaceId ns = 0;
  std::vector<BlockKey> keys;
  uint64_t ticket = 0;  // non-zero: a caller waits for the outcome under this ticket
  bool fill_host = false;
};

struct MoverWork {
  // One flusher round.
  std::function<void()> flush_round;
  // Reads entry `id` up to a faster tier (it was queued by Enqueue).
  std::function<void(EntryId id)> promote;
  // At Stop, for each entry queued but never promoted: its waiters must learn it will not be.
  std::function<void(EntryId id)> abandon;
  // Runs a placement on gpu tier `gpu` (queued by EnqueueGpu).
  std::function<void(int gpu, const GpuPlacement& job)> place_on_gpu;
  // At Stop, for each placement queued on gpu tier `gpu` but never run.
  std::function<void(int gpu, const GpuPlacement& job)> abandon_gpu;
};

class Mover {
 public:
  Mover(absl::Mutex& mu, Clock& clock, MoverOptions options, MoverWork work);
  ~Mover();  // Stops
  Mover(const Mover&) = delete;
  Mover& operator=(const Mover&) = delete;

  void Start() ABSL_LOCKS_EXCLUDED(mu_);
  // Wakes and joins the workers (a round or promotion in progress finishes first), then abandons
  // what is still queued.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // Queues a promotion of `id`; one promoter runs it, in queueing order.
  void Enqueue(EntryId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues a placement on gpu tier `gpu` (< gpu_workers); that GPU's worker runs it.
  void EnqueueGpu(int gpu, GpuPlacement job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Placements queued or running on any GPU; queued (not yet running) on GPU `gpu`.
  size_t gpu_pending() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  size_t gpu_queued(int gpu) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return gpu_queues_.at(static_cast<size_t>(gpu)).jobs.size();
  }
  // Starts a flusher round now instead of at the end of its nap.
  void WakeFlusher() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  size_t queued() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return queue_.size(); }
  bool stopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; }

  // Asks for a flusher round now and waits until it has ended (or Stop): a whole round that
  // began after this call, so what was due on the clock when it was called has been done.
  void WaitFlusherRound() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void FlusherLoop();
  void PromoterLoop();
  void GpuCopyLoop(int gpu);

  absl::Mutex& mu_;
  Clock& clock_;
  const MoverOptions options_;
  const MoverWork work_;
  std::deque<EntryId> queue_ ABSL_GUARDED_BY(mu_);
  struct GpuQueue {
    std::deque<GpuPlacement> jobs;
    bool running = false;  // a job taken from `jobs` is running
  };
  std::vector<GpuQueue> gpu_queues_ ABSL_GUARDED_BY(mu_);  // one per GPU worker
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_requested_ ABSL_GUARDED_BY(mu_) = false;  // kept while a round runs
  uint64_t rounds_started_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rounds_done_ ABSL_GUARDED_BY(mu_) = 0;
  absl::CondVar queued_;              // queue_ gained an entry, or stopping
  absl::CondVar gpu_queued_;          // a gpu queue gained a job, or stopping
  absl::CondVar wake_;                // the flusher is asked for a round, or stopping
  absl::CondVar round_done_;          // a flusher round ended, or stopping
  std::vector<std::thread> threads_;  // touched by Start and Stop only
};

}  // namespace kvpool::tiers
