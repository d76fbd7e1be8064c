#include "daemon/admin_handlers.h"

#include <glog/logging.h>

#include <algorithm>
#include <vector>

#include "control.pb.h"
#include "daemon/request_codec.h"

namespace kvpool::daemon {

using transport::Response;

AdminHandlers::AdminHandlers(const BlockServiceOptions& options, tiers::TierManager& tiers,
                             NamespaceRegistry& namespaces, const SessionHandlers& sessions,
                             Metrics& metrics, const ClusterRef& cluster)
    : options_(options),
      tiers_(tiers),
      namespaces_(namespaces),
      sessions_(sessions),
      metrics_(metrics),
      cluster_(cluster),
      started_(std::chrono::steady_clock::now()) {}

uint64_t AdminHandlers::UptimeSeconds() const {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - started_)
          .count());
}

void AdminHandlers::SetConnectionGauge(std::function<uint64_t()> gauge) {
  absl::MutexLock lock(&mu_);
  connections_ = std::move(gauge);
}

uint64_t AdminHandlers::Connections() const {
  std::function<uint64_t()> gauge;
  {
    absl::MutexLock lock(&mu_);
    gauge = connections_;
  }
  return gauge ? gauge() : 0;
}

Response AdminHandlers::Stats(Connection& c, std::string_view body) {
  wire::StatsResponse resp;
  resp.set_node_id(options_.node_id);
  resp.set_version(options_.version);
  resp.set_uptime_s(UptimeSeconds());
  if (!c.admin) {
    // A tenant sees its own namespace only: what it holds in each tier (daemon-wide counts,
    // other tenants' traffic among them, are the operator's).
    const tiers::TierManager::NamespaceUsage u = tiers_.UsageOf(c.ns);
    resp.set_namespace_only(true);
    wire::TierStats* host = resp.add_tiers();
    host->set_name("host");
    host->set_used_bytes(u.host_segment_bytes);
    host->set_allocated_bytes(u.host_segment_bytes);
    wire::TierStats* disk = resp.add_tiers();
    disk->set_name("disk");
    disk->set_used_bytes(u.disk_bytes);
    resp.set_sessions(sessions_.CountIn(c.ns));
    resp.set_cluster_state(cluster_.Get() != nullptr ? "cluster" : "standalone");
    return Reply(wire::STATS, resp, Status::OK());
  }
  const tiers::TierManagerStats t = tiers_.GetStats();
  for (const tiers::GpuTierUsage& g : t.gpus) {
    wire::TierStats* gpu = resp.add_tiers();
    gpu->set_name("gpu" + std::to_string(g.device));
    gpu->set_capacity_bytes(g.memory.capacity_bytes);
    gpu->set_used_bytes(g.memory.payload_bytes);
    gpu->set_blocks(g.blocks);
    gpu->set_allocated_bytes(g.memory.allocated_bytes);
    gpu->set_fragmentation(g.memory.fragmentation);
    gpu->set_renewals(g.memory.renewals);
    gpu->set_hits(g.hits);
    gpu->set_peer_hits(g.peer_hits);
  }
  if (!t.gpus.empty()) {  // the other gpu counters, all devices together, on the first one
    wire::TierStats* first = resp.mutable_tiers(0);
    first->set_promotions(t.gpu_counters.promotions);
    first->set_evictions(t.gpu_counters.evictions);
  }
  wire::TierStats* host = resp.add_tiers();
  host->set_name("host");
  host->set_capacity_bytes(t.host.capacity_bytes);
  host->set_used_bytes(t.host.payload_bytes);
  host->set_blocks(t.host_blocks);
  host->set_allocated_bytes(t.host.allocated_bytes);
  host->set_fragmentation(t.host.fragmentation);
  host->set_hits(t.host_counters.hits);
  host->set_promotions(t.host_counters.promotions);
  host->set_demotions(t.host_counters.demotions);
  host->set_evictions(t.host_counters.evictions);
  host->set_moves(t.host_blocks_moved);
  host->set_renewals(t.host.renewals);
  host->set_renewals_from_standby(t.host.renewals_from_standby);
  host->set_standby_ready(t.host.standby_ready);
  wire::TierStats* disk = resp.add_tiers();
  disk->set_name("disk");
  disk->set_capacity_bytes(t.disk_capacity_bytes);
  disk->set_used_bytes(t.disk_used_bytes);
  disk->set_blocks(t.disk_blocks);
  disk->set_allocated_bytes(t.disk_bytes_on_device);
  disk->set_hits(t.disk_counters.hits);
  disk->set_promotions(t.disk_counters.promotions);
  disk->set_demotions(t.disk_counters.demotions);
  disk->set_evictions(t.disk_counters.evictions);
  resp.set_index_entries(t.index_entries);
  resp.set_index_bytes(t.index_bytes);
  resp.set_rocksdb_memory_bytes(t.disk_memory_bytes);
  resp.set_index_rebuild_blocks(t.index_rebuild_blocks);
  resp.set_index_rebuild_seconds(t.index_rebuild_seconds);
  resp.set_sessions(sessions_.Count());
  resp.set_connections(Connections());
  resp.set_lookups(Metrics::Get(metrics_.lookups));
  resp.set_lookup_blocks(Metrics::Get(metrics_.lookup_blocks));
  resp.set_lookup_hit_blocks(Metrics::Get(metrics_.lookup_hit_blocks));
  resp.set_gets(Metrics::Get(metrics_.gets));
  resp.set_get_blocks_served(Metrics::Get(metrics_.get_blocks_served));
  resp.set_get_misses(Metrics::Get(metrics_.get_misses));
  resp.set_puts_offered(Metrics::Get(metrics_.puts_offered));
  resp.set_puts_deduplicated(Metrics::Get(metrics_.puts_deduplicated));
  resp.set_puts_committed(Metrics::Get(metrics_.puts_committed));
  resp.set_bytes_in(Metrics::Get(metrics_.bytes_in));
  resp.set_bytes_out(Metrics::Get(metrics_.bytes_out));
  resp.set_prefetches_issued(t.prefetches_issued);
  resp.set_prefetches_useful(t.prefetches_useful);
  resp.set_checksum_failures(t.checksum_failures);
  resp.set_leases_active(t.leases_active);
  resp.set_reservations_active(t.reservations_active);
  {
    wire::ClusterMembersResponse view;
    if (ClusterHooks* cluster = cluster_.Get(); cluster != nullptr) {
      cluster->Fill(&view);
    } else {
      view.set_cluster_state("standalone");
    }
    resp.set_cluster_state(view.cluster_state());
    resp.set_cluster_members(static_cast<uint32_t>(view.members_size()));
    resp.set_cluster_reason(view.status().message());
  }
  resp.set_dedup_ratio(static_cast<double>(resp.puts_offered()) /
                       static_cast<double>(std::max<uint64_t>(1, resp.puts_committed())));
  return Reply(wire::STATS, resp, Status::OK());
}

Response AdminHandlers::Evict(Connection& c, std::string_view body) {
  wire::EvictRequest req;
  wire::EvictResponse resp;
  std::vector<BlockKey> keys;
  Status st = Parse(body, &req, "EVICT");
  if (st.ok()) st = DecodeKeys(req.keys(), UINT32_MAX, &keys);
  if (st.ok()) {
    const Tier tier = req.tier() == wire::TIER_HOST  ? Tier::kHost
                      : req.tier() == wire::TIER_GPU ? Tier::kGpu
                                                     : Tier::kDisk;
    tiers::EvictOutcome o = tiers_.Evict(c.ns, tier, keys);
    resp.set_evicted(o.evicted);
    resp.set_skipped(o.skipped);
    LOG(INFO) << "admin evict in namespace " << c.ns_name << " (" << (keys.empty() ? "all" : "some")
              << " blocks, tier " << wire::Tier_Name(req.tier()) << "): " << o.evicted
              << " evicted, " << o.skipped << " skipped";
  }
  return Reply(wire::EVICT, resp, st);
}

Response AdminHandlers::ClusterMembers(Connection& c, std::string_view body) {
  wire::ClusterMembersResponse resp;
  if (!c.admin) {
    return Reply(wire::CLUSTER_MEMBERS, resp,
                 Status::PermissionDenied("the cluster view needs admin rights"));
  }
  if (ClusterHooks* cluster = cluster_.Get(); cluster != nullptr) {
    cluster->Fill(&resp);
  } else {
    resp.set_cluster_state("standalone");
  }
  // The fill may put a reason in the status message; the request itself succeeded.
  const std::string reason = resp.status().message();
  Response r = Reply(wire::CLUSTER_MEMBERS, resp, Status::OK());
  if (!reason.empty()) {
    resp.mutable_status()->set_message(reason);
    resp.SerializeToString(&r.body);
  }
  return r;
}

namespace {

void ToWire(const PolicyInfo& p, wire::NamespacePolicyInfo* out) {
  out->set_namespace_name(p.namespace_name);
  out->set_eviction(p.eviction);
  out->set_write(p.write);
  out->set_admission(p.admission);
  out->set_read_ahead(p.read_ahead);
  out->set_encoding(p.encoding);
  out->set_source(p.source);
  out->set_host_quota_bytes(p.host_quota_bytes);
  out->set_disk_quota_bytes(p.disk_quota_bytes);
  out->set_gpu_quota_bytes(p.gpu_quota_bytes);
}

}  // namespace

Response AdminHandlers::Policies(Connection& c, std::string_view body) {
  wire::PoliciesRequest req;
  wire::PoliciesResponse resp;
  Status st = Parse(body, &req, "POLICIES");
  if (st.ok() && policies_ == nullptr) {
    st = Status::Unimplemented("this daemon reports no namespace policies");
  }
  if (st.ok() && !c.admin &&
      (req.all() || (!req.namespace_name().empty() && req.namespace_name() != c.ns_name))) {
    st = Status::PermissionDenied("other namespaces' policies need admin rights");
  }
  if (st.ok()) {
    const NamespacePolicies::Snapshot s = policies_->Show();
    ToWire(s.default_policy, resp.mutable_default_policy());
    if (req.all()) {
      for (const PolicyInfo& p : s.namespaces) ToWire(p, resp.add_namespaces());
    } else {
      const std::string& name = req.namespace_name().empty() ? c.ns_name : req.namespace_name();
      Result<PolicyInfo> one = policies_->ShowNamespace(name);
      if (one.ok()) {
        ToWire(*one, resp.add_namespaces());
      } else {
        st = one.status();
      }
    }
  }
  return Reply(wire::POLICIES, resp, st);
}

std::string AdminHandlers::RenderMetrics() const {
  std::string out = metrics_.RenderPrometheus(tiers_.GetStats(), sessions_.Count(), Connections(),
                                              UptimeSeconds());
  // Per namespace (names are [A-Za-z0-9._:-]: no escaping), for the namespaces holding anything.
  std::string per_ns;
  const std::vector<std::string> names = namespaces_.Names();
  for (size_t id = 0; id < names.size(); ++id) {
    const tiers::TierManager::NamespaceUsage u = tiers_.UsageOf(static_cast<NamespaceId>(id));
    if (u.host_segment_bytes == 0 && u.disk_bytes == 0) continue;
    per_ns += "kvpool_namespace_bytes{namespace=\"" + names[id] + "\",tier=\"host\"} " +
              std::to_string(u.host_segment_bytes) + "\n";
    per_ns += "kvpool_namespace_bytes{namespace=\"" + names[id] + "\",tier=\"disk\"} " +
              std::to_string(u.disk_bytes) + "\n";
  }
  if (!per_ns.empty()) {
    out +=
        "# HELP kvpool_namespace_bytes Bytes a namespace holds: host, its whole host segments; "
        "disk, its stored bytes (what its quotas count).\n"
        "# TYPE kvpool_namespace_bytes gauge\n" +
        per_ns;
  }
  if (ClusterHooks* cluster = cluster_.Get(); cluster != nullptr) {
    wire::ClusterMembersResponse view;
    cluster->Fill(&view);
    out +=
        "# HELP kvpool_cluster_members Members in this daemon's view of the cluster.\n"
        "# TYPE kvpool_cluster_members gauge\n"
        "kvpool_cluster_members " +
        std::to_string(view.members_size()) +
        "\n# HELP kvpool_cluster_degraded 1 while this daemon cannot reach etcd (it serves "
        "its local tiers).\n# TYPE kvpool_cluster_degraded gauge\nkvpool_cluster_degraded " +
        (view.cluster_state() == "joined" ? "0" : "1") + "\n";
  }
  return out;
}

}  // namespace kvpool::daemon
