#pragma once
// CPU pinning for kvpool-bench: which cores the daemon and the bench threads may run on.
//
// Loopback figures on small, shared machines move several-fold with where the scheduler puts
// the client and daemon threads, so every figure the bench prints says which pinning made it.
//
// Thread safety: pure functions, except PinThisThread (affects only the calling thread).

#include <string>
#include <string_view>
#include <vector>

#include <kvpool/status.h>

namespace kvpool::bench {

// "0,2-3" -> {0, 2, 3}. InvalidArgument on anything else.
Result<std::vector<int>> ParseCpuList(std::string_view text);
// {0, 2, 3} -> "0,2-3".
std::string FormatCpuList(const std::vector<int>& cpus);
// The CPUs this process may run on (sched_getaffinity), ascending.
std::vector<int> AllowedCpus();
// Restricts the calling thread to `cpus` (all of them, not one). An empty list does nothing.
Status PinThisThread(const std::vector<int>& cpus);

struct PinPlan {
  bool enabled = false;
  std::vector<int> daemon_cpus;  // empty: the daemon is not pinned (or is not ours)
  std::vector<int> bench_cpus;   // bench thread i runs on bench_cpus[i % size]
  // For the output: "none", or e.g. "daemon=0 bench=1 (one cpu per bench thread, round robin)".
  std::string description;
};

// With `enabled`, the daemon gets `daemon_cpus` and the bench `bench_cpus`; an empty list
// defaults to a split of the allowed CPUs (the first half to the daemon, the rest to the bench;
// with one CPU both share it). `own_daemon` false: the daemon is someone else's and stays as is.
Result<PinPlan> MakePinPlan(bool enabled, std::string_view daemon_cpus, std::string_view bench_cpus,
                            bool own_daemon);

}  // namespace kvpool::bench
