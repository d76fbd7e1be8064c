#pragma once
// kvpool-bench's shared runner: runs one timed phase on N threads that start together, collects
// one latency sample per call, and turns a phase into a Figure (GB/s, ops/s, p50, p99) that it
// prints as a JSON line or as a row of the table. Nothing here knows which system it measures:
// the workers (bench_main.cc) call a BenchTarget, or memcpy.
//
// Units: GB/s is 1e9 bytes per second of wall time (first thread started to last thread done,
// summed over threads); ops/s counts calls; p50/p99 are nearest-rank percentiles of the per-call
// latency in microseconds, over every call of every thread.
//
// Thread safety: RunPhase is called from one thread; each worker runs on its own thread and
// touches only its own PhaseClock.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <kvpool/status.h>

namespace kvpool::bench {

using Clock = std::chrono::steady_clock;

struct PhaseLimits {
  double seconds = 2;    // 0: no time limit
  uint64_t max_ops = 0;  // calls over all threads; 0: no limit
};

// Why a phase ended.
enum class StopReason { kTime, kOps, kData };
const char* StopReasonName(StopReason r);

// One thread's view of a running phase.
class PhaseClock {
 public:
  // False once the phase's time or call budget is spent (also claims one call of the budget).
  bool Continue();
  // One call: its latency and the payload bytes it moved.
  void Record(Clock::duration latency, uint64_t bytes);
  // This thread has no more data to move (e.g. every fresh key is stored).
  void OutOfData() { out_of_data_ = true; }

 private:
  friend struct PhaseClockAccess;
  Clock::time_point deadline_ = Clock::time_point::max();
  uint64_t max_ops_ = 0;
  std::atomic<uint64_t>* ops_claimed_ = nullptr;
  bool out_of_data_ = false;
  bool hit_ops_ = false;
  uint64_t bytes_ = 0;
  std::vector<double> latencies_us_;
  Clock::time_point finished_;
};

// A worker: Prepare runs on its thread before the common start, untimed (connect, allocate,
// touch buffers); Run loops `while (clock.Continue())` and times each call with Record.
class PhaseWorker {
 public:
  virtual ~PhaseWorker() = default;
  virtual Status Prepare() { return Status::OK(); }
  virtual Status Run(PhaseClock& clock) = 0;
};

struct PhaseStats {
  uint64_t ops = 0;
  uint64_t bytes = 0;
  double seconds = 0;                // wall
  std::vector<double> latencies_us;  // sorted
  StopReason stop = StopReason::kTime;
};

// Runs each worker on its own thread, thread i restricted to cpus[i % cpus.size()] when `cpus`
// is not empty. Returns the first worker error, or the merged statistics.
Result<PhaseStats> RunPhase(std::vector<std::unique_ptr<PhaseWorker>>& workers,
                            const std::vector<int>& cpus, const PhaseLimits& limits);

// Nearest-rank percentile (q in (0, 1]) of sorted samples; 0 for none.
double Percentile(const std::vector<double>& sorted, double q);

// One result line.
struct Figure {
  std::string system;        // "kvpool", "memcpy", "socketpair"
  std::string path;          // "socket", "memory", "unix"
  std::string op;            // "put", "get", "lookup", "copy", "stream"
  uint64_t block_bytes = 0;  // 0: a mixed-size workload
  int concurrency = 1;
  double gbps = 0;
  double ops_per_s = 0;
  double p50_us = 0;
  double p99_us = 0;
  nlohmann::json extra = nlohmann::json::object();  // further keys of the JSON line

  // Fills the measured fields from a phase.
  void SetFrom(const PhaseStats& s);
  nlohmann::json ToJson() const;
};

// The human-readable table: every kvpool put/get beside the memcpy and socketpair figures of the
// same block size.
std::string FormatTable(const std::vector<Figure>& figures);

// The path of program `name` in a directory of $PATH (/usr/bin:/bin without one); empty when
// none has it executable. How a peer that is missing becomes NotFound, not a failed exec.
std::string FindOnPath(const std::string& name);

// Runs `command` through the shell: its output (stdout and stderr) and pclose's status.
std::pair<std::string, int> CaptureCommand(const std::string& command);

// `cpus`, or every online CPU when empty, as a taskset / fio list ("0,2,3").
std::string CpuList(const std::vector<int>& cpus);

}  // namespace kvpool::bench
