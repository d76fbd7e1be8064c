#pragma once
// Membership: this daemon's place in a kvpool cluster, kept in etcd.
//
// Joining writes the member record (JSON, see MemberRecord) at
// `/kvpool/<cluster>/nodes/<node-id>` under a lease of `lease_ttl` that a keepalive thread
// renews every `keepalive_interval`; the key is claimed with a put-if-absent transaction, so
// two live daemons never hold one node id. A watch on `/kvpool/<cluster>/nodes/` keeps the view
// of the live members; a daemon that dies stops renewing, etcd expires its lease and deletes
// its record, and every watcher drops it (within lease_ttl + ~0.5 s of its last renewal).
//
// Authentication: each record carries `auth`, an HMAC-SHA256 keyed with the cluster secret over
// every other field. Records whose auth does not verify (another secret, no secret, forged or
// tampered) are ignored and logged; a daemon whose node id is held by such a live record
// refuses to join. This proves to members that a record was written by a holder of the
// secret; it does not protect etcd itself (see docs/CLUSTER.md).
//
// Degraded mode: when keepalives fail (etcd down or unreachable) the state becomes kDegraded;
// the daemon keeps serving and keeps the last known member view (others shown kStale), because
// an etcd outage says nothing about the other daemons, and a stale member costs at most one
// bounded request timeout. When etcd answers again the daemon renews its old lease if etcd
// still has it, or takes a new one and re-claims its key, and the watch resumes from the last
// revision it saw (or re-reads the prefix if etcd compacted it).
//
// Thread safety: every const method may be called from any thread, concurrently. Leave (and
// the destructor) from one thread, never from on_change. on_change runs on the watch or the
// keepalive thread, one call at a time.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/status.h"
#include "daemon/cluster/etcd_client.h"
#include "daemon/cluster/rendezvous.h"

namespace kvpool::daemon::cluster {

// What a member publishes about itself. Stored as JSON:
// {"version":1,"cluster":..,"node_id":..,"instance":..,"control_address":..,
//  "ucx_worker_address":<base64>,"capacity_bytes":N,"used_bytes":N,"started_at_ms":N,
//  "auth":<64 hex>}
struct MemberRecord {
  std::string cluster;
  std::string node_id;
  std::string instance;         // random per process start: tells a restart from a twin
  std::string control_address;  // "tcp://HOST:PORT" where peers send control requests
  // Raw bytes of a ucp worker address. kvpoold publishes it empty now (peers make endpoints to
  // each other's UCX listener, transport/ucx_bind.h); kept in the record for older readers.
  std::string ucx_worker_address;
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
  int64_t started_at_ms = 0;  // Unix time in milliseconds
  std::string auth;           // hex HMAC-SHA256(secret, every field above)
};

std::string EncodeMemberRecord(const MemberRecord& record);
// Corruption when `json` is not a well-formed record.
Result<MemberRecord> DecodeMemberRecord(std::string_view json);
// The auth a record with these fields must carry under `secret`.
std::string MemberRecordAuth(const MemberRecord& record, std::string_view secret);
// Constant-time check of record.auth against `secret`.
bool VerifyMemberRecord(const MemberRecord& record, std::string_view secret);

// "/kvpool/<cluster>/nodes/" and that plus the node id.
std::string MembersPrefix(std::string_view cluster);
std::string MemberKey(std::string_view cluster, std::string_view node_id);

// A cluster name or node id: 1-128 characters of [A-Za-z0-9._-]. InvalidArgument otherwise.
Status ValidateClusterName(std::string_view name, std::string_view what);

// Reads the cluster secret from a file (trailing whitespace stripped). PermissionDenied when
// the file is readable by everyone (mode o+r), InvalidArgument when the secret is shorter
// than kMinSecretBytes, IoError when it cannot be read.
inline constexpr size_t kMinSecretBytes = 16;
Result<std::string> ReadClusterSecretFile(const std::string& path);

enum class MemberState {
  kAlive,     // its record is in etcd and we are connected to etcd
  kStale,     // last known alive; we cannot reach etcd to know more (we are degraded)
  kDegraded,  // this daemon, cut off from etcd (serving its local tiers)
};
const char* MemberStateName(MemberState state);

struct Member {
  MemberRecord record;
  MemberState state = MemberState::kAlive;
  bool self = false;
};

enum class ClusterState { kJoined, kDegraded, kStopped };
const char* ClusterStateName(ClusterState state);

// For `status` and /metrics.
struct ClusterHealth {
  ClusterState state = ClusterState::kStopped;
  std::string reason;               // why degraded; empty when joined
  int64_t state_since_ms = 0;       // Unix ms of the last state change
  uint64_t keepalive_failures = 0;  // failed keepalive calls, ever
  uint64_t rejoins = 0;             // times a new lease had to be taken after the first
  uint64_t ignored_records = 0;     // records dropped for bad auth or format
  size_t members = 0;               // members in the view, this one included
};

struct MembershipOptions {
  // etcd endpoints, "etcd://HOST:PORT[,HOST:PORT...]". Required.
  std::string etcd;
  // Cluster name: the etcd prefix /kvpool/<cluster>/. Required.
  std::string cluster_name;
  // This daemon's node id (the daemon's persistent identity). Required.
  std::string node_id;
  // Shared cluster secret, at least kMinSecretBytes bytes. Required.
  std::string secret;
  // Published for peers: control address ("tcp://HOST:PORT"); UCX worker address (raw; kvpoold
  // leaves it empty, see MemberRecord).
  std::string control_address;
  std::string ucx_worker_address;
  // Capacity published for `kvpool cluster members`.
  uint64_t capacity_bytes = 0;
  // Occupancy probe, called on the keepalive thread every occupancy_interval. Default: none (0).
  std::function<uint64_t()> used_bytes;
  // Lease TTL (whole seconds in etcd). A member that dies leaves the view within about
  // lease_ttl + 0.5 s. etcd raises TTLs under its minimum (2 s with default heartbeat).
  // Default: 2 s.
  std::chrono::seconds lease_ttl{2};
  // Time for the keepalive rounds, renewal ages, occupancy updates and the claim's waits; tests may
  // pass a ManualClock (etcd's own lease TTLs still run in real time). Not owned; must outlive the
  // membership. Default: RealClock().
  Clock* clock = nullptr;
  // Keepalive period. Default (0): lease_ttl / 3.
  std::chrono::milliseconds keepalive_interval{0};
  // How often occupancy is re-published when it changed. Default: 5 s.
  std::chrono::milliseconds occupancy_interval{5000};
  // Deadline of each etcd call. Default: 500 ms.
  std::chrono::milliseconds etcd_timeout{500};
  // How long Join waits for a stale record holding this node id to expire before refusing.
  // Default (0): lease_ttl + 1 s.
  std::chrono::milliseconds claim_wait{0};
  // Called after the member view or the state changed; read Members()/ring()/health() there.
  std::function<void()> on_change;
};

class Membership {
 public:
  // Claims the node id and starts the keepalive and watch threads; returns once the first
  // member view is loaded (or etcd_timeout later). InvalidArgument for bad options,
  // PermissionDenied when a live record without this cluster's secret holds the node id,
  // AlreadyExists when another live daemon of this cluster holds it, Unavailable when etcd
  // cannot be reached.
  static Result<std::unique_ptr<Membership>> Join(MembershipOptions options);
  ~Membership();

  // Leaves the cluster: stops the threads and revokes the lease, so every member drops this
  // node at once. Idempotent; afterwards state() is kStopped.
  void Leave();

  ClusterState state() const;
  ClusterHealth health() const;
  // Every member in the view, this one included (with its current occupancy), by node id.
  std::vector<Member> Members() const;
  // The node ids to place keys over: the view's members and this one. In degraded mode the
  // last known view.
  std::vector<NodeId> NodeIds() const;
  // A Ring over NodeIds(), rebuilt on each change; cheap to take per request.
  std::shared_ptr<const Ring> ring() const;
  const std::string& node_id() const { return options_.node_id; }
  const std::string& key() const { return key_; }

  // Tests: stop renewing the lease without leaving, as a hung or crashed daemon would.
  void PauseKeepAliveForTesting(bool paused);

 private:
  explicit Membership(MembershipOptions options, std::unique_ptr<EtcdClient> etcd);

  Status Claim(const char* why);
  Status Publish(const char* why);
  void KeepAliveLoop();
  void Tick();
  void SetState(ClusterState state, std::string reason);
  void OnWatch(const WatchUpdate& update);
  void ApplyPut(const KeyValue& kv) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RebuildRing() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NotifyChange();
  MemberRecord CurrentRecord() const;

  const MembershipOptions options_;
  Clock& clock_;
  const std::string prefix_;
  const std::string key_;
  const std::unique_ptr<EtcdClient> etcd_;

  mutable absl::Mutex mu_;
  MemberRecord self_ ABSL_GUARDED_BY(mu_);
  int64_t lease_ ABSL_GUARDED_BY(mu_) = 0;
  ClusterState state_ ABSL_GUARDED_BY(mu_) = ClusterState::kJoined;
  std::string reason_ ABSL_GUARDED_BY(mu_);
  int64_t state_since_ms_ ABSL_GUARDED_BY(mu_) = 0;
  // Valid records by node id, from the watch.
  absl::flat_hash_map<std::string, MemberRecord> view_ ABSL_GUARDED_BY(mu_);
  // Key -> mod_revision last warned about, so one bad record is logged once.
  absl::flat_hash_map<std::string, int64_t> warned_ ABSL_GUARDED_BY(mu_);
  bool have_snapshot_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<const Ring> ring_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar stop_cv_;  // signalled when stopping_ is set
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t keepalive_failures_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t rejoins_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t ignored_records_ ABSL_GUARDED_BY(mu_) = 0;

  // Keepalive-thread only.
  int consecutive_failures_ = 0;
  Clock::TimePoint last_renewal_;
  Clock::TimePoint next_occupancy_;
  uint64_t published_used_ = 0;

  absl::Mutex callback_mu_;  // serializes on_change; never taken with mu_ held
  std::unique_ptr<EtcdWatch> watch_;
  std::thread keepalive_thread_;
  bool left_ = false;  // Leave's thread only
};

}  // namespace kvpool::daemon::cluster
