#include "client/stats_json.h"

#include <nlohmann/json.hpp>

namespace kvpool::client {

std::string StatsToJson(const DaemonStats& s, int indent) {
  nlohmann::json j;
  j["node_id"] = s.node_id;
  j["version"] = s.version;
  j["uptime_s"] = s.uptime_s;
  nlohmann::json tiers = nlohmann::json::array();
  for (const TierStats& t : s.tiers) {
    tiers.push_back({{"name", t.name},
                     {"capacity_bytes", t.capacity_bytes},
                     {"used_bytes", t.used_bytes},
                     {"blocks", t.blocks},
                     {"allocated_bytes", t.allocated_bytes},
                     {"fragmentation", t.fragmentation},
                     {"hits", t.hits},
                     {"promotions", t.promotions},
                     {"demotions", t.demotions},
                     {"evictions", t.evictions},
                     {"moves", t.moves},
                     {"renewals", t.renewals},
                     {"renewals_from_standby", t.renewals_from_standby},
                     {"standby_ready", t.standby_ready},
                     {"peer_hits", t.peer_hits}});
  }
  j["tiers"] = tiers;
  j["index_entries"] = s.index_entries;
  j["index_bytes"] = s.index_bytes;
  j["rocksdb_memory_bytes"] = s.rocksdb_memory_bytes;
  j["index_rebuild_blocks"] = s.index_rebuild_blocks;
  j["index_rebuild_seconds"] = s.index_rebuild_seconds;
  j["sessions"] = s.sessions;
  j["connections"] = s.connections;
  j["lookups"] = s.lookups;
  j["lookup_blocks"] = s.lookup_blocks;
  j["lookup_hit_blocks"] = s.lookup_hit_blocks;
  j["gets"] = s.gets;
  j["get_blocks_served"] = s.get_blocks_served;
  j["get_misses"] = s.get_misses;
  j["puts_offered"] = s.puts_offered;
  j["puts_deduplicated"] = s.puts_deduplicated;
  j["puts_committed"] = s.puts_committed;
  j["bytes_in"] = s.bytes_in;
  j["bytes_out"] = s.bytes_out;
  j["prefetches_issued"] = s.prefetches_issued;
  j["prefetches_useful"] = s.prefetches_useful;
  j["checksum_failures"] = s.checksum_failures;
  j["leases_active"] = s.leases_active;
  j["reservations_active"] = s.reservations_active;
  j["dedup_ratio"] = s.dedup_ratio;
  j["namespace_only"] = s.namespace_only;
  j["cluster_state"] = s.cluster_state;
  j["cluster_members"] = s.cluster_members;
  j["cluster_reason"] = s.cluster_reason;
  return j.dump(indent);
}

}  // namespace kvpool::client
