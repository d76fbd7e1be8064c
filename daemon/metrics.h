#pragma once
// Metrics: the daemon's request counters and latency histograms, and their rendering as
// Prometheus text (for /metrics) beside the tier manager's figures.
//
// Thread safety: counters are relaxed atomics (monotonic tallies; no ordering is implied
// between them); Render* may run concurrently with updates.

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

#include "tiers/tier_manager.h"

namespace kvpool::daemon {

// Fixed log-spaced buckets from 10 µs to 1 s.
class LatencyHistogram {
 public:
  static constexpr std::array<double, 16> kBoundsUs = {
      10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 1e5, 2.5e5, 5e5, 1e6};
  void Observe(double micros);
  // Appends `name_bucket{op="...",le=...}` lines etc.
  void Render(const std::string& name, const std::string& op, std::string* out) const;

 private:
  std::array<std::atomic<uint64_t>, kBoundsUs.size() + 1> buckets_{};
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_ns_{0};
};

enum class Op { kLookup, kGet, kPutReserve, kPutCommit, kPrefetch, kSession, kOther, kCount };

struct Metrics {
  std::atomic<uint64_t> lookups{0};
  std::atomic<uint64_t> lookup_blocks{0};
  std::atomic<uint64_t> lookup_hit_blocks{0};
  std::atomic<uint64_t> gets{0};
  std::atomic<uint64_t> get_blocks_served{0};
  std::atomic<uint64_t> get_misses{0};
  std::atomic<uint64_t> puts_offered{0};
  std::atomic<uint64_t> puts_deduplicated{0};
  std::atomic<uint64_t> puts_committed{0};
  std::atomic<uint64_t> bytes_in{0};
  std::atomic<uint64_t> bytes_out{0};
  std::atomic<uint64_t> requests_failed{0};
  std::atomic<uint64_t> connections_total{0};
  // Gpu-tier blocks moved device to device between daemons (daemon/gpu_links.h).
  std::atomic<uint64_t> gpu_link_blocks_received{0};
  std::atomic<uint64_t> gpu_link_bytes_received{0};
  std::atomic<uint64_t> gpu_link_blocks_sent{0};
  std::atomic<uint64_t> gpu_link_bytes_sent{0};
  std::atomic<uint64_t> gpu_link_failures{0};           // joins and transfers that failed
  std::atomic<uint64_t> gpu_link_checksum_failures{0};  // blocks received that failed their check
  // Copies to peers (daemon/cluster_node.h): jobs (a chain's blocks toward one node, or a
  // session record) queued for another attempt, and jobs given up: after the last attempt, or
  // because a queue was full.
  std::atomic<uint64_t> replication_retries{0};
  std::atomic<uint64_t> replication_given_up{0};
  std::atomic<uint64_t> replication_dropped_queue_full{0};
  std::array<LatencyHistogram, static_cast<size_t>(Op::kCount)> latency;

  void Add(std::atomic<uint64_t>& c, uint64_t n = 1) { c.fetch_add(n, std::memory_order_relaxed); }
  static uint64_t Get(const std::atomic<uint64_t>& c) { return c.load(std::memory_order_relaxed); }

  // Prometheus text exposition (version 0.0.4).
  std::string RenderPrometheus(const tiers::TierManagerStats& tiers, uint64_t sessions,
                               uint64_t connections, uint64_t uptime_s) const;
};

const char* OpName(Op op);

}  // namespace kvpool::daemon
