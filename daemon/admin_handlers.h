#pragma once
// AdminHandlers: the operator's requests and views: STATS (the daemon's figures, `kvpool
// stats`), EVICT (admin eviction of a namespace's blocks), CLUSTER_MEMBERS (`kvpool cluster
// members`), POLICIES (the strategies each namespace runs with, `kvpool policies show`) and the
// Prometheus text behind /metrics. Requests that show or change how the daemon runs, rather than
// what it caches, belong here too.
//
// Called by BlockService (daemon/block_service.h) after hello, on request workers, and
// RenderMetrics by the metrics endpoint's thread; everything here reads thread-safe sources
// (tier manager, session store, relaxed counters), so any number of calls may run at once.

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/cluster_hooks.h"
#include "daemon/connection.h"
#include "daemon/metrics.h"
#include "daemon/namespace_policies.h"
#include "daemon/namespace_registry.h"
#include "daemon/service_options.h"
#include "daemon/session_handlers.h"
#include "tiers/tier_manager.h"
#include "transport/control_server.h"

namespace kvpool::daemon {

class AdminHandlers {
 public:
  // All references outlive the handlers. Uptime counts from construction.
  AdminHandlers(const BlockServiceOptions& options, tiers::TierManager& tiers,
                NamespaceRegistry& namespaces, const SessionHandlers& sessions, Metrics& metrics,
                const ClusterRef& cluster);

  // Where stats and /metrics get the open-connection count from (0 until set). May be set
  // while requests run (the daemon sets it once its server is up).
  void SetConnectionGauge(std::function<uint64_t()> gauge) ABSL_LOCKS_EXCLUDED(mu_);
  // Where POLICIES gets the compositions from (Unimplemented until set). Set once, before the
  // control server starts; `policies` outlives the handlers.
  void SetPolicies(const NamespacePolicies* policies) { policies_ = policies; }

  transport::Response Stats(Connection& c, std::string_view body);
  transport::Response Evict(Connection& c, std::string_view body);
  transport::Response ClusterMembers(Connection& c, std::string_view body);
  // `all`: the default and every configured namespace; else one namespace, the request's or the
  // connection's own. InvalidArgument for a bad namespace name.
  transport::Response Policies(Connection& c, std::string_view body);
  std::string RenderMetrics() const;

 private:
  uint64_t UptimeSeconds() const;
  uint64_t Connections() const ABSL_LOCKS_EXCLUDED(mu_);

  const BlockServiceOptions& options_;
  tiers::TierManager& tiers_;
  NamespaceRegistry& namespaces_;
  const SessionHandlers& sessions_;
  Metrics& metrics_;
  const ClusterRef& cluster_;
  const NamespacePolicies* policies_ = nullptr;  // set before any request runs
  mutable absl::Mutex mu_;
  std::function<uint64_t()> connections_ ABSL_GUARDED_BY(mu_);
  const std::chrono::steady_clock::time_point started_;
};

}  // namespace kvpool::daemon
