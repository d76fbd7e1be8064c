#pragma once
// BlockService: the daemon's request handling, behind the control server.
//
// It decodes each request body (transport/control.proto), checks it (hello first, the
// namespace, key lengths, batch and block sizes), runs it against the tier manager, the session
// store and the namespace registry, and encodes the answer. A malformed body is answered with
// InvalidArgument and the connection stays usable; framing errors never reach here (the server
// closes the connection).
//
// The bulk-data path is the transport's business: this class hands out the host slots that a
// put's bytes go into (PayloadSinks) and the leased slots a get's bytes come from (Response
// payload), so replacing in-frame payloads by shared memory or UCX changes the transport, not
// the request handling.
//
// Data paths (chosen per connection at hello, same requests for all):
//  - socket: a put's bytes follow its PUT_COMMIT frame and are read straight into the reserved
//    slots; a get's bytes follow the response, written from the leased slots.
//  - shared memory (local Unix socket): GET answers each block's (segment, generation, offset)
//    and a lease; the client copies from its read-only mapping and sends RELEASE (no answer).
//    PUT_RESERVE answers where each reserved slot is; MAP_SEGMENTS hands out a writable segment
//    descriptor only while this connection holds an open reservation in it; the client writes
//    its slots and PUT_COMMIT (in place) verifies each block's checksum before publishing it.
//    Ownership protocol: a reserved slot belongs to its writer until commit, abort, expiry or
//    disconnect; after that the writer must not touch it. A writer that breaks this can only
//    reach its own namespace's segments (descriptors are per segment and per namespace, and an
//    emptied segment gets a fresh memfd before another namespace may use it), and readers
//    verify checksums, so the worst it causes is a miss in its own namespace.
//  - UCX (remote clients): block bodies travel as tagged messages between the client's buffers
//    and the slots; the receiver verifies each checksum.
//
// Thread safety: called concurrently for different connections (see ControlServer).

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "daemon/metrics.h"
#include "daemon/namespace_registry.h"
#include "daemon/session_store.h"
#include "tiers/tier_manager.h"
#include "transport/control_server.h"
#include "transport/ucx_engine.h"

namespace kvpool::wire {
class ClusterMembersResponse;
class LocateResponse;
class SessionRecord;
}  // namespace kvpool::wire

namespace kvpool::daemon {

// What request handling asks of the cluster layer (daemon/cluster_node.h); absent standalone.
class ClusterHooks {
 public:
  virtual ~ClusterHooks() = default;
  // The cluster state and member list (status, stats, `kvpool cluster members`).
  virtual void Fill(wire::ClusterMembersResponse* out) = 0;
  // Blocks of `keys` that are not cached here: fetch them from their home nodes and store them
  // locally. Returns how many were stored. Bounded by the peer timeout.
  virtual size_t FetchMissing(NamespaceId ns, const std::string& ns_name,
                              std::span<const BlockKey> keys) = 0;
  // Blocks a client put here (key, parent): copy them to their other homes in the background.
  virtual void Replicate(NamespaceId ns, const std::string& ns_name,
                         std::vector<std::pair<BlockKey, BlockKey>> blocks) = 0;
  // A session saved here: copy it (and its blocks) to its home nodes in the background.
  virtual void ReplicateSession(NamespaceId ns, const std::string& ns_name,
                                const wire::SessionRecord& record) = 0;
  // A session not found here, from its home nodes. NotFound when none has it.
  virtual Result<wire::SessionRecord> LoadRemoteSession(const std::string& ns_name,
                                                        const std::string& session_id) = 0;
  // A session deleted here: delete its copies (background, best effort).
  virtual void DeleteRemoteSession(const std::string& ns_name, const std::string& session_id) = 0;
  // LOCATE: asks every other live member how many leading blocks of `keys` it holds (one lookup
  // each, all at once, nothing promoted), appends one entry per member to `out`, and sets this
  // node's control address on the entry already there for it. Bounded by the peer deadlines.
  virtual void Locate(const std::string& ns_name, std::span<const BlockKey> keys,
                      wire::LocateResponse* out) = 0;
};

struct BlockServiceOptions {
  std::string node_id;
  std::string version = "0.1.0";
  // Keys in one request. Default: 4096.
  uint32_t max_batch_keys = 4096;
  // Limits the server enforces, advertised at hello so clients split batches to fit.
  transport::FrameLimits limits;
  // Same-node path: a lease not released within this ends by itself. Default: 10 s.
  std::chrono::milliseconds lease_timeout{10000};
  // Grant the shared-memory data path to local clients that ask. Default: true.
  bool shared_memory = true;
  // How long a UCX transfer of one request may take before its blocks fail. Default: 30 s.
  std::chrono::milliseconds ucx_timeout{30000};
  // When set (cluster mode), TCP connections must prove this secret at hello
  // (common/hello_auth.h); Unix-socket connections are local and exempt. Default: none.
  std::string tcp_secret;
};

class BlockService final : public transport::RequestHandler {
 public:
  // `ucx` may be null (no UCX data path); it must outlive this service.
  BlockService(const BlockServiceOptions& options, tiers::TierManager& tiers,
               NamespaceRegistry& namespaces, SessionStore& sessions, Metrics& metrics,
               transport::UcxEngine* ucx = nullptr);

  // Pins the chains of every persisted session (at start, after TierManager::Recover).
  Status LoadSessions();
  // Where /metrics and stats get the open-connection count from.
  void SetConnectionGauge(std::function<uint64_t()> gauge) { connections_ = std::move(gauge); }
  // Cluster mode: remote fetch, replication and the cluster view.
  // Unset: standalone. `cluster` must outlive this service.
  void SetCluster(ClusterHooks* cluster) { cluster_.store(cluster, std::memory_order_release); }
  std::string RenderMetrics() const;

  // transport::RequestHandler
  std::unique_ptr<transport::ConnectionState> OnConnect(
      const transport::ConnectionInfo& info) override;
  Status PayloadSinks(transport::ConnectionState& state, const transport::FrameHeader& header,
                      std::string_view body, std::vector<transport::PayloadSink>* sinks) override;
  transport::Response Handle(transport::ConnectionState& state,
                             const transport::FrameHeader& header, std::string_view body) override;
  void OnDisconnect(transport::ConnectionState& state) override;
  // Lookups, prefetch hints and lease releases only take the tier manager's lock (no disk I/O,
  // no waiting): the server runs them on its I/O thread.
  bool RunsInline(uint16_t type) const override;

 private:
  struct Conn;

  transport::Response Hello(Conn& c, std::string_view body);
  transport::Response Lookup(Conn& c, std::string_view body);
  transport::Response Get(Conn& c, std::string_view body);
  transport::Response PutReserve(Conn& c, std::string_view body);
  transport::Response PutCommit(Conn& c, std::string_view body);
  transport::Response PutAbort(Conn& c, std::string_view body);
  transport::Response Prefetch(Conn& c, std::string_view body);
  transport::Response SessionSave(Conn& c, std::string_view body);
  transport::Response SessionLoad(Conn& c, std::string_view body);
  transport::Response SessionDelete(Conn& c, std::string_view body);
  transport::Response SessionList(Conn& c, std::string_view body);
  transport::Response Stats(Conn& c, std::string_view body);
  transport::Response Evict(Conn& c, std::string_view body);
  transport::Response MapSegments(Conn& c, std::string_view body);
  transport::Response Release(Conn& c, std::string_view body);
  transport::Response ClusterMembers(Conn& c, std::string_view body);
  transport::Response Locate(Conn& c, std::string_view body);
  // Receives the UCX bodies of c.commit_ids (those still OK) into their reservations; a block
  // whose transfer fails or times out gets an error in c.commit_status.
  void ReceiveViaUcx(Conn& c, uint64_t tag_base, const std::vector<uint64_t>& sizes);

  const BlockServiceOptions options_;
  tiers::TierManager& tiers_;
  NamespaceRegistry& namespaces_;
  SessionStore& sessions_;
  Metrics& metrics_;
  transport::UcxEngine* const ucx_;
  std::function<uint64_t()> connections_;
  // Set once, possibly while requests run (the cluster starts after the TCP listener it
  // advertises): release/acquire so a request that sees it sees it constructed.
  std::atomic<ClusterHooks*> cluster_{nullptr};
  ClusterHooks* cluster() const { return cluster_.load(std::memory_order_acquire); }
  const std::chrono::steady_clock::time_point started_;
  // Serializes session saves and deletes: a save pins the new chain, writes the record and
  // unpins the old chain as one step.
  absl::Mutex session_mu_;
};

}  // namespace kvpool::daemon
