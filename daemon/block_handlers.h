#pragma once
// BlockHandlers: the requests about blocks: HELLO (which also picks the connection's data path),
// LOOKUP, GET, PUT_RESERVE / PUT_COMMIT / PUT_ABORT, PREFETCH, RELEASE, MAP_SEGMENTS and LOCATE.
// Each decodes and checks its body (namespace via hello, key counts, block and batch sizes),
// runs it against the tier manager (and, in cluster mode, the cluster hooks: remote fetch on a
// miss, replication of what was put, locate across members) and encodes the answer. Block
// bodies move through the connection's delivery (daemon/delivery.h), never here.
//
// Called by BlockService (daemon/block_service.h), which routes by message type and has
// already refused every request but HELLO on a connection that did not say hello.
// Thread safety: called concurrently for different connections, never for one connection at
// once; LOOKUP, LOCATE (standalone), PREFETCH and RELEASE run on the control I/O thread, so do
// the Try*Inline calls, the rest on request workers.

#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "daemon/access_control.h"
#include "daemon/cluster_hooks.h"
#include "daemon/connection.h"
#include "daemon/metrics.h"
#include "daemon/namespace_registry.h"
#include "daemon/service_options.h"
#include "daemon/ucx_listener.h"
#include "tiers/tier_manager.h"
#include "transport/control_server.h"

namespace kvpool::daemon {

class BlockHandlers {
 public:
  // `ucx` may be null (no UCX data path). All references outlive the handlers.
  BlockHandlers(const BlockServiceOptions& options, tiers::TierManager& tiers,
                NamespaceRegistry& namespaces, Metrics& metrics, UcxListener* ucx,
                const ClusterRef& cluster, const AccessControl& access);

  // Admits the connection to its namespace as `access` decides (daemon/access_control.h),
  // challenging it first when a proof would decide. A refused hello closes the connection
  // after its answer (unless the answer is a challenge).
  transport::Response Hello(Connection& c, std::string_view body);
  // Gives the connection the UCX endpoint whose nonce it names (transport/ucx_bind.h): its
  // requests may then ask for UCX. NotFound for a nonce that waits for no claim;
  // FailedPrecondition when UCX was not offered or the connection has its endpoint already.
  transport::Response UcxBind(Connection& c, std::string_view body);
  transport::Response Lookup(Connection& c, std::string_view body);
  transport::Response Get(Connection& c, std::string_view body);
  // Get, answered only if it need not wait: not over UCX, not asking for encoded copies, and
  // every cached block in host memory (TierManager::TryAcquireInHost). nullopt otherwise, with
  // nothing done (a malformed request is answered: that does not wait either).
  std::optional<transport::Response> TryGetInline(Connection& c, std::string_view body);
  transport::Response PutReserve(Connection& c, std::string_view body);
  // PutReserve, answered only if it need not wait: every block has room in host without a disk
  // write or a wait (TierManager::TryReserve). nullopt otherwise, with nothing reserved (a
  // malformed request is answered).
  std::optional<transport::Response> TryPutReserveInline(Connection& c, std::string_view body);
  // Where the payload of a PUT_COMMIT frame goes (into c.commit). Non-OK only for a body that
  // cannot be parsed or does not match its payload (the server closes the connection); a
  // reservation that cannot take its bytes gets a null sink and its error in c.commit.
  Status PayloadSinks(Connection& c, std::string_view body,
                      std::vector<transport::PayloadSink>* sinks);
  transport::Response PutCommit(Connection& c, std::string_view body);
  // PutCommit of an in-place writer that gives its checksums, answered only if it need not
  // wait: no payload in the frame, no cluster, no gpu placement, and no namespace that writes
  // to disk on commit (TierManager::TryCommit). nullopt otherwise, with nothing done.
  std::optional<transport::Response> TryPutCommitInline(Connection& c, std::string_view body);
  transport::Response PutAbort(Connection& c, std::string_view body);
  transport::Response Prefetch(Connection& c, std::string_view body);
  // No answer is sent.
  transport::Response Release(Connection& c, std::string_view body);
  transport::Response ReportDamaged(Connection& c, std::string_view body);
  transport::Response MapSegments(Connection& c, std::string_view body);
  transport::Response Locate(Connection& c, std::string_view body);
  // GPU_LINK_JOIN, GPU_OFFER and GPU_SEND: a peer daemon's only (PermissionDenied for anyone
  // else), served by the cluster's device links (daemon/gpu_links.h); FailedPrecondition where
  // this daemon has none.
  transport::Response GpuLinkJoin(Connection& c, std::string_view body);
  transport::Response GpuOffer(Connection& c, std::string_view body);
  transport::Response GpuSend(Connection& c, std::string_view body);
  // The connection closed: its delivery ends (UCX sends are cancelled), then its reservations
  // and leases.
  void Disconnect(Connection& c);

 private:
  // Get and TryGetInline: with `inline_only`, nullopt where the blocks would have to be waited
  // for; otherwise always an answer.
  std::optional<transport::Response> GetBlocks(Connection& c, std::string_view body,
                                               bool inline_only);
  // PutReserve and TryPutReserveInline, the same way.
  // A reservation's gpu slot, for the client that writes it (PUT_RESERVE to_gpu).
  void DescribeGpuSlot(uint64_t owner, const tiers::ReserveOutcome& o, wire::Reservation* out);
  std::optional<transport::Response> ReserveBlocks(Connection& c, std::string_view body,
                                                   bool inline_only);
  // Queues the placement of `keys` (in host) into the gpu tier on `device`, behind the request
  // (`what` names it in the log): a hint, which the request stands without.
  void PlaceOnGpuBehind(NamespaceId ns, std::span<const BlockKey> keys, int device,
                        const char* what);

  const BlockServiceOptions& options_;
  tiers::TierManager& tiers_;
  NamespaceRegistry& namespaces_;
  Metrics& metrics_;
  UcxListener* const ucx_;
  const ClusterRef& cluster_;
  const AccessControl& access_;
};

}  // namespace kvpool::daemon
