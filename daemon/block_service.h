#pragma once
// BlockService: the daemon's request handling behind the control server: a thin router. It
// owns each connection's state (daemon/connection.h), refuses every request but HELLO until the
// connection said hello, routes each request by message type (transport/control.proto) to the
// handlers of its concern, and times it for the latency histograms:
//  - blocks (daemon/block_handlers.h): hello, lookup, get, put reserve/commit/abort, prefetch,
//    release, map segments, locate;
//  - sessions (daemon/session_handlers.h): save, load, delete, list;
//  - admin (daemon/admin_handlers.h): stats, evict, cluster members, policies, /metrics.
// A malformed body is answered with InvalidArgument and the connection stays usable; framing
// errors never reach here (the server closes the connection). An unknown type is answered
// InvalidArgument ("unsupported request type").
//
// Block bodies travel through each connection's delivery (daemon/delivery.h), chosen at hello:
// in the socket frames, through shared memory (local clients), or as UCX tagged messages
// (remote clients). A data-path change touches its delivery only, not the handlers.
//
// Thread safety: called concurrently for different connections, never concurrently for one
// (see ControlServer); SetConnectionGauge, SetCluster and RenderMetrics from any thread.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "daemon/access_control.h"
#include "daemon/admin_handlers.h"
#include "daemon/block_handlers.h"
#include "daemon/cluster_hooks.h"
#include "daemon/metrics.h"
#include "daemon/namespace_registry.h"
#include "daemon/service_options.h"
#include "daemon/session_handlers.h"
#include "daemon/session_store.h"
#include "daemon/ucx_listener.h"
#include "tiers/tier_manager.h"
#include "transport/control_server.h"

namespace kvpool::daemon {

class BlockService final : public transport::RequestHandler {
 public:
  // `ucx` may be null (no UCX data path); it and every reference must outlive this service.
  // `access`: who may act for which namespace (daemon/access_control.h), updated by its owner;
  // null: no rules but the cluster secret on TCP (options.tcp_secret).
  BlockService(const BlockServiceOptions& options, tiers::TierManager& tiers,
               NamespaceRegistry& namespaces, SessionStore& sessions, Metrics& metrics,
               UcxListener* ucx = nullptr, const AccessControl* access = nullptr);

  // Pins the chains of every persisted session (at start, after TierManager::Recover).
  Status LoadSessions() { return sessions_.LoadSessions(); }
  // Where /metrics and stats get the open-connection count from.
  void SetConnectionGauge(std::function<uint64_t()> gauge) {
    admin_.SetConnectionGauge(std::move(gauge));
  }
  // Cluster mode: remote fetch, replication and the cluster view.
  // Unset: standalone. `cluster` must outlive this service.
  void SetCluster(ClusterHooks* cluster) { cluster_.Set(cluster); }
  std::string RenderMetrics() const { return admin_.RenderMetrics(); }
  // The namespaces' compositions POLICIES reports; set before the control server starts.
  void SetPolicies(const NamespacePolicies* policies) { admin_.SetPolicies(policies); }

  // transport::RequestHandler
  std::unique_ptr<transport::ConnectionState> OnConnect(
      const transport::ConnectionInfo& info) override;
  Status PayloadSinks(transport::ConnectionState& state, const transport::FrameHeader& header,
                      std::string_view body, std::vector<transport::PayloadSink>* sinks) override;
  transport::Response Handle(transport::ConnectionState& state,
                             const transport::FrameHeader& header, std::string_view body) override;
  void OnDisconnect(transport::ConnectionState& state) override;
  // Lookups, prefetch hints (without gpu tiers) and lease releases only take the tier
  // manager's lock (no disk I/O, no waiting): the server runs them on its I/O thread.
  bool RunsInline(uint16_t type) const override;
  // A GET whose blocks are all in host memory, without a cluster (BlockHandlers::TryGetInline);
  // a PUT_RESERVE with room in host without a disk write (TryPutReserveInline); an in-place
  // PUT_COMMIT that does not write to disk, without a cluster (TryPutCommitInline).
  std::optional<transport::Response> TryInline(transport::ConnectionState& state,
                                               const transport::FrameHeader& header,
                                               std::string_view body) override;
  // Once its hello was accepted.
  bool Admitted(const transport::ConnectionState& state) const override;

 private:
  const BlockServiceOptions options_;
  tiers::TierManager& tiers_;
  Metrics& metrics_;
  ClusterRef cluster_;
  std::unique_ptr<AccessControl> own_access_;  // when none was given
  BlockHandlers blocks_;
  SessionHandlers sessions_;
  AdminHandlers admin_;
};

}  // namespace kvpool::daemon
