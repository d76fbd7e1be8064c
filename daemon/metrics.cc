#include "daemon/metrics.h"

#include <cstdio>

namespace kvpool::daemon {

const char* OpName(Op op) {
  switch (op) {
    case Op::kLookup:
      return "lookup";
    case Op::kGet:
      return "get";
    case Op::kPutReserve:
      return "put_reserve";
    case Op::kPutCommit:
      return "put_commit";
    case Op::kPrefetch:
      return "prefetch";
    case Op::kSession:
      return "session";
    case Op::kOther:
      return "other";
    case Op::kCount:
      break;
  }
  return "unknown";
}

void LatencyHistogram::Observe(double micros) {
  size_t i = 0;
  while (i < kBoundsUs.size() && micros > kBoundsUs[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<uint64_t>(micros * 1000), std::memory_order_relaxed);
}

void LatencyHistogram::Render(const std::string& name, const std::string& op,
                              std::string* out) const {
  uint64_t cumulative = 0;
  char line[256];
  for (size_t i = 0; i < kBoundsUs.size(); ++i) {
    cumulative += buckets_[i].load(std::memory_order_relaxed);
    std::snprintf(line, sizeof(line), "%s_bucket{op=\"%s\",le=\"%g\"} %llu\n", name.c_str(),
                  op.c_str(), kBoundsUs[i] / 1e6, static_cast<unsigned long long>(cumulative));
    *out += line;
  }
  cumulative += buckets_[kBoundsUs.size()].load(std::memory_order_relaxed);
  std::snprintf(line, sizeof(line), "%s_bucket{op=\"%s\",le=\"+Inf\"} %llu\n", name.c_str(),
                op.c_str(), static_cast<unsigned long long>(cumulative));
  *out += line;
  std::snprintf(line, sizeof(line), "%s_sum{op=\"%s\"} %.9f\n%s_count{op=\"%s\"} %llu\n",
                name.c_str(), op.c_str(), sum_ns_.load(std::memory_order_relaxed) / 1e9,
                name.c_str(), op.c_str(),
                static_cast<unsigned long long>(count_.load(std::memory_order_relaxed)));
  *out += line;
}

namespace {

void Metric(std::string* out, const char* name, const char* type, const char* help) {
  *out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void Value(std::string* out, const std::string& name_and_labels, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), " %.17g\n", v);
  *out += name_and_labels + buf;
}

}  // namespace

std::string Metrics::RenderPrometheus(const tiers::TierManagerStats& t, uint64_t sessions,
                                      uint64_t connections, uint64_t uptime_s) const {
  std::string o;
  o.reserve(8192);
  Metric(&o, "kvpool_uptime_seconds", "gauge", "Seconds since the daemon started.");
  Value(&o, "kvpool_uptime_seconds", static_cast<double>(uptime_s));

  Metric(&o, "kvpool_tier_capacity_bytes", "gauge", "Capacity of each tier.");
  Value(&o, "kvpool_tier_capacity_bytes{tier=\"host\"}",
        static_cast<double>(t.host.capacity_bytes));
  Value(&o, "kvpool_tier_capacity_bytes{tier=\"disk\"}",
        static_cast<double>(t.disk_capacity_bytes));
  Metric(&o, "kvpool_tier_used_bytes", "gauge",
         "Block payload bytes held in each tier (on disk, session records too).");
  Value(&o, "kvpool_tier_used_bytes{tier=\"host\"}", static_cast<double>(t.host.payload_bytes));
  Value(&o, "kvpool_tier_used_bytes{tier=\"disk\"}", static_cast<double>(t.disk_used_bytes));
  Metric(&o, "kvpool_tier_blocks", "gauge", "Blocks with a copy in each tier.");
  Value(&o, "kvpool_tier_blocks{tier=\"host\"}", static_cast<double>(t.host_blocks));
  Value(&o, "kvpool_tier_blocks{tier=\"disk\"}", static_cast<double>(t.disk_blocks));
  Metric(&o, "kvpool_host_allocated_bytes", "gauge", "Host arena bytes handed out (page rounded).");
  Value(&o, "kvpool_host_allocated_bytes", static_cast<double>(t.host.allocated_bytes));
  Metric(&o, "kvpool_host_fragmentation_ratio", "gauge",
         "1 - largest free run / free bytes in the host arena.");
  Value(&o, "kvpool_host_fragmentation_ratio", t.host.fragmentation);
  Metric(&o, "kvpool_host_free_segments", "gauge",
         "Host segments no block uses: clean ones and vacant ones (still their last namespace's).");
  Value(&o, "kvpool_host_free_segments", static_cast<double>(t.host.free_segments));
  Metric(&o, "kvpool_host_vacant_segments", "gauge",
         "Emptied host segments kept for their namespace until another one needs them.");
  Value(&o, "kvpool_host_vacant_segments", static_cast<double>(t.host.vacant_segments));
  Metric(&o, "kvpool_disk_device_bytes", "gauge", "RocksDB SST and blob file bytes.");
  Value(&o, "kvpool_disk_device_bytes", static_cast<double>(t.disk_bytes_on_device));
  Metric(&o, "kvpool_rocksdb_memory_bytes", "gauge",
         "Memory RocksDB holds: memtables, the block cache's contents, table readers.");
  Value(&o, "kvpool_rocksdb_memory_bytes", static_cast<double>(t.disk_memory_bytes));
  Metric(&o, "kvpool_disk_device_room_bytes", "gauge",
         "Bytes the disk tier may still write to its device: its free space less a 64 MiB "
         "reserve.");
  Value(&o, "kvpool_disk_device_room_bytes",
        static_cast<double>(std::min<uint64_t>(t.disk_device_room_bytes, uint64_t{1} << 62)));

  const std::pair<const char*, const tiers::TierCounters*> tiers[] = {
      {"gpu", &t.gpu_counters}, {"host", &t.host_counters}, {"disk", &t.disk_counters}};
  Metric(&o, "kvpool_hits_total", "counter", "Blocks served, by the tier they were found in.");
  for (auto [n, c] : tiers)
    Value(&o, std::string("kvpool_hits_total{tier=\"") + n + "\"}", c->hits);
  Metric(&o, "kvpool_misses_total", "counter", "Blocks asked for by get and not cached.");
  Value(&o, "kvpool_misses_total", static_cast<double>(Get(get_misses)));
  Metric(&o, "kvpool_promotions_total", "counter", "Copies moved up into a tier.");
  for (auto [n, c] : tiers) {
    Value(&o, std::string("kvpool_promotions_total{tier=\"") + n + "\"}", c->promotions);
  }
  Metric(&o, "kvpool_demotions_total", "counter", "Copies moved down out of a tier.");
  for (auto [n, c] : tiers) {
    Value(&o, std::string("kvpool_demotions_total{tier=\"") + n + "\"}", c->demotions);
  }
  Metric(&o, "kvpool_evictions_total", "counter", "Copies dropped from a tier.");
  for (auto [n, c] : tiers) {
    Value(&o, std::string("kvpool_evictions_total{tier=\"") + n + "\"}", c->evictions);
  }
  Metric(&o, "kvpool_prefetches_total", "counter", "Promotions started ahead of a get.");
  Value(&o, "kvpool_prefetches_total", static_cast<double>(t.prefetches_issued));
  Metric(&o, "kvpool_prefetches_useful_total", "counter", "Prefetched blocks a get then used.");
  Value(&o, "kvpool_prefetches_useful_total", static_cast<double>(t.prefetches_useful));
  Metric(&o, "kvpool_checksum_failures_total", "counter",
         "Blocks that failed checksum verification (dropped, never served).");
  Value(&o, "kvpool_checksum_failures_total", static_cast<double>(t.checksum_failures));
  Metric(&o, "kvpool_gpu_hints_dropped_total", "counter",
         "GPU placement hints (puts, session loads) dropped while the GPU's copy worker was "
         "behind.");
  Value(&o, "kvpool_gpu_hints_dropped_total", static_cast<double>(t.gpu_hints_dropped));
  Metric(&o, "kvpool_host_segment_renewals_total", "counter",
         "Host segments given fresh memory to change namespace, by where the memory came from: "
         "standby (made ahead, --host_standby_segments) or made (on the spot).");
  Value(&o, "kvpool_host_segment_renewals_total{memory=\"standby\"}",
        static_cast<double>(t.host.renewals_from_standby));
  Value(&o, "kvpool_host_segment_renewals_total{memory=\"made\"}",
        static_cast<double>(t.host.renewals - t.host.renewals_from_standby));
  Metric(&o, "kvpool_host_standby_segments", "gauge",
         "Segments' worth of fresh memory made ahead and ready for renewals "
         "(--host_standby_segments; fewer for 250 ms after one is taken, or while making one "
         "fails).");
  Value(&o, "kvpool_host_standby_segments", static_cast<double>(t.host.standby_ready));
  Metric(&o, "kvpool_host_blocks_moved_total", "counter",
         "Host blocks moved to free pages of another segment of their namespace, emptying a "
         "segment for a namespace that needed one without evicting anything.");
  Value(&o, "kvpool_host_blocks_moved_total", static_cast<double>(t.host_blocks_moved));
  Metric(&o, "kvpool_gpu_puts_total", "counter",
         "Blocks put straight into a gpu tier from a client's device memory (device to device); "
         "their host copies are made by the GPU's copy worker.");
  Value(&o, "kvpool_gpu_puts_total", static_cast<double>(t.gpu_puts));
  if (!t.gpus.empty()) {
    Metric(&o, "kvpool_gpu_peer_hits_total", "counter",
           "Blocks a gpu tier served to a reader on another GPU of this node, which copied or "
           "read them peer to peer, by the gpu tier's device.");
    for (const tiers::GpuTierUsage& g : t.gpus) {
      Value(&o, "kvpool_gpu_peer_hits_total{device=\"" + std::to_string(g.device) + "\"}",
            static_cast<double>(g.peer_hits));
    }
  }
  Metric(&o, "kvpool_disk_write_errors_total", "counter", "Failed RocksDB block writes.");
  Value(&o, "kvpool_disk_write_errors_total", static_cast<double>(t.disk_write_errors));
  Metric(&o, "kvpool_disk_deletes_pending", "gauge",
         "Blocks dropped from the disk tier whose RocksDB records are not deleted yet (grows "
         "while the device stalls).");
  Value(&o, "kvpool_disk_deletes_pending", static_cast<double>(t.disk_deletes_pending));
  Metric(&o, "kvpool_disk_delete_errors_total", "counter",
         "Failed RocksDB deletes of dropped blocks (their records come back after a restart).");
  Value(&o, "kvpool_disk_delete_errors_total", static_cast<double>(t.disk_delete_errors));
  Metric(&o, "kvpool_blocks_lost_total", "counter",
         "Host-only blocks dropped because the disk tier could not take them.");
  Value(&o, "kvpool_blocks_lost_total", static_cast<double>(t.blocks_lost));

  Metric(&o, "kvpool_lookup_blocks_total", "counter", "Keys asked for by lookups.");
  Value(&o, "kvpool_lookup_blocks_total", static_cast<double>(Get(lookup_blocks)));
  Metric(&o, "kvpool_lookup_hit_blocks_total", "counter", "Keys in the cached prefix of lookups.");
  Value(&o, "kvpool_lookup_hit_blocks_total", static_cast<double>(Get(lookup_hit_blocks)));
  Metric(&o, "kvpool_put_blocks_offered_total", "counter", "Blocks offered to put.");
  Value(&o, "kvpool_put_blocks_offered_total", static_cast<double>(Get(puts_offered)));
  Metric(&o, "kvpool_put_blocks_deduplicated_total", "counter",
         "Blocks offered to put that were already cached (no payload moved).");
  Value(&o, "kvpool_put_blocks_deduplicated_total", static_cast<double>(Get(puts_deduplicated)));
  Metric(&o, "kvpool_put_blocks_committed_total", "counter", "Blocks stored by put.");
  Value(&o, "kvpool_put_blocks_committed_total", static_cast<double>(Get(puts_committed)));
  Metric(&o, "kvpool_dedup_ratio", "gauge", "Blocks offered / blocks stored.");
  Value(&o, "kvpool_dedup_ratio",
        static_cast<double>(Get(puts_offered)) /
            static_cast<double>(std::max<uint64_t>(1, Get(puts_committed))));
  Metric(&o, "kvpool_bytes_total", "counter", "Payload bytes moved through the control plane.");
  Value(&o, "kvpool_bytes_total{direction=\"in\"}", static_cast<double>(Get(bytes_in)));
  Value(&o, "kvpool_bytes_total{direction=\"out\"}", static_cast<double>(Get(bytes_out)));
  Metric(&o, "kvpool_requests_failed_total", "counter", "Requests answered with an error.");
  Value(&o, "kvpool_requests_failed_total", static_cast<double>(Get(requests_failed)));
  Metric(&o, "kvpool_gpu_link_blocks_total", "counter",
         "Gpu-tier blocks moved device to device between daemons (NCCL).");
  Value(&o, "kvpool_gpu_link_blocks_total{direction=\"in\"}",
        static_cast<double>(Get(gpu_link_blocks_received)));
  Value(&o, "kvpool_gpu_link_blocks_total{direction=\"out\"}",
        static_cast<double>(Get(gpu_link_blocks_sent)));
  Metric(&o, "kvpool_gpu_link_bytes_total", "counter",
         "Bytes of the gpu-tier blocks moved device to device between daemons.");
  Value(&o, "kvpool_gpu_link_bytes_total{direction=\"in\"}",
        static_cast<double>(Get(gpu_link_bytes_received)));
  Value(&o, "kvpool_gpu_link_bytes_total{direction=\"out\"}",
        static_cast<double>(Get(gpu_link_bytes_sent)));
  Metric(&o, "kvpool_gpu_link_failures_total", "counter",
         "Device link joins and transfers that failed (their blocks came over UCX).");
  Value(&o, "kvpool_gpu_link_failures_total", static_cast<double>(Get(gpu_link_failures)));
  Metric(&o, "kvpool_gpu_link_checksum_failures_total", "counter",
         "Blocks received over a device link that failed their device checksum.");
  Value(&o, "kvpool_gpu_link_checksum_failures_total",
        static_cast<double>(Get(gpu_link_checksum_failures)));

  Metric(&o, "kvpool_replication_retries_total", "counter",
         "Copies to peers (a chain's blocks or a session record) queued to be tried again.");
  Value(&o, "kvpool_replication_retries_total", static_cast<double>(Get(replication_retries)));
  Metric(&o, "kvpool_replication_dropped_total", "counter",
         "Copies to peers given up: after their last attempt, or with a queue full (the next "
         "membership change offers them again).");
  Value(&o, "kvpool_replication_dropped_total{reason=\"attempts\"}",
        static_cast<double>(Get(replication_given_up)));
  Value(&o, "kvpool_replication_dropped_total{reason=\"queue_full\"}",
        static_cast<double>(Get(replication_dropped_queue_full)));

  Metric(&o, "kvpool_index_entries", "gauge", "Entries in the block index.");
  Value(&o, "kvpool_index_entries", static_cast<double>(t.index_entries));
  Metric(&o, "kvpool_index_bytes", "gauge", "Memory held by the block index.");
  Value(&o, "kvpool_index_bytes", static_cast<double>(t.index_bytes));
  Metric(&o, "kvpool_index_rebuild_blocks", "gauge",
         "Blocks the index was rebuilt with at start, from the disk tier's records.");
  Value(&o, "kvpool_index_rebuild_blocks", static_cast<double>(t.index_rebuild_blocks));
  Metric(&o, "kvpool_index_rebuild_seconds", "gauge", "Time the index rebuild at start took.");
  Value(&o, "kvpool_index_rebuild_seconds", t.index_rebuild_seconds);
  Metric(&o, "kvpool_leases_active", "gauge", "Host copies leased by readers now.");
  Value(&o, "kvpool_leases_active", static_cast<double>(t.leases_active));
  Metric(&o, "kvpool_reservations_active", "gauge", "Put reservations not yet committed.");
  Value(&o, "kvpool_reservations_active", static_cast<double>(t.reservations_active));
  Metric(&o, "kvpool_sessions", "gauge", "Persisted sessions (deletion records not counted).");
  Value(&o, "kvpool_sessions", static_cast<double>(sessions));
  Metric(&o, "kvpool_connections", "gauge", "Open client connections.");
  Value(&o, "kvpool_connections", static_cast<double>(connections));

  Metric(&o, "kvpool_request_duration_seconds", "histogram", "Request handling time.");
  for (size_t i = 0; i < latency.size(); ++i) {
    latency[i].Render("kvpool_request_duration_seconds", OpName(static_cast<Op>(i)), &o);
  }
  return o;
}

}  // namespace kvpool::daemon
