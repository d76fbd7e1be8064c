#pragma once
// DaemonStats as JSON: one shape for `kvpool stats --json` and kvpool_stats_json().
// Thread safety: pure function.

#include <string>

#include <kvpool/client.h>

namespace kvpool::client {

std::string StatsToJson(const DaemonStats& stats, int indent = -1);

}  // namespace kvpool::client
