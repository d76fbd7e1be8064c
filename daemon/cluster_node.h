#pragma once
// ClusterNode: this daemon as a member of a kvpool cluster (DESIGN.md section 4).
//
// It owns the etcd membership (daemon/cluster/membership.h), joining at start or, while etcd is
// unreachable, in the background; and it talks to peers through the ordinary kvpool client
// (over UCX when the daemons have it, else the TCP control connection), one pooled connection
// per (peer, namespace):
//  - FetchMissing: blocks a lookup or get misses locally are asked of their home nodes (the
//    first live members of each key's rendezvous order), one batched GET per node, checked
//    against their checksums by the client, and stored in the local host tier;
//  - Replicate: blocks a local client put are copied in the background to the next `replicas`
//    nodes of their order (put-if-absent, so a copy a peer already has costs nothing);
//  - Locate: for a request router, every other live member's cached prefix of a chain, asked
//    of all of them at once by a small pool of fan-out threads.
// A peer that does not answer within `peer_timeout` counts as a miss: inference never waits
// on a dead node longer than that (and the membership drops it within the lease TTL).
//
// Thread safety: every method may be called from any thread. One replication thread and
// `fanout_threads` fan-out threads (ThreadRole::kCluster).

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <kvpool/client.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/block_service.h"
#include "daemon/cluster/fetch_memory.h"
#include "daemon/cluster/membership.h"
#include "daemon/gpu_links.h"
#include "daemon/metrics.h"
#include "tiers/tier_manager.h"
#include "transport/tls.h"

namespace kvpool::daemon {

struct ClusterNodeOptions {
  cluster::MembershipOptions membership;
  // Copies of each block beyond the first. Default: 1.
  uint32_t replicas = 1;
  // Deadline of one request to a peer. Default: 500 ms.
  std::chrono::milliseconds peer_timeout{500};
  // Namespace id -> name (for re-replication scans). Required.
  std::function<std::string(NamespaceId)> namespace_name;
  // Calls `visit` for every session record this node keeps (SessionStore::ForEach), so that a
  // membership change offers each to its homes again, as it does cached blocks: a home that was
  // down when a session was saved, or came back from a crash, gets the record (it keeps only
  // newer ones). Default: none (sessions reach homes at save and by read repair only).
  std::function<void(const std::function<void(NamespaceId, const wire::SessionRecord&)>& visit)>
      for_each_session;
  // UCX settings for peer connections (as the daemon's own). Default: UCX's choice.
  bool ucx = true;
  std::string ucx_transports;
  std::string ucx_net_devices;
  // TLS toward peers whose control address is tls:// (the daemon's own --tls_ files): its
  // certificate presented, theirs verified with the CA file. Default: none.
  transport::TlsFiles tls;
  // Threads asking peers at once for Locate. Default: 4.
  int fanout_threads = 4;
  // How long a failed peer is skipped and a key no member held is a miss without asking
  // (daemon/cluster/fetch_memory.h). Defaults: 2 s, 500 ms.
  cluster::FetchMemoryOptions fetch_memory;
  // Device links toward peers' gpu tiers (transport/device_link.h; NCCL in kvpoold), used only
  // where the daemon has a gpu tier. Not owned; must outlive the node. Default: none (gpu-tier
  // blocks move over UCX from host memory).
  transport::DeviceLinks* device_links = nullptr;
  // Counts replication's retries and drops, and what moves over device links. Not owned; must
  // outlive the node. Default: none (nothing counted).
  Metrics* metrics = nullptr;
};

class ClusterNode final : public ClusterHooks {
 public:
  // Joins (or starts joining) the cluster. InvalidArgument / PermissionDenied / AlreadyExists
  // from the membership stop the start; an unreachable etcd does not.
  static Result<std::unique_ptr<ClusterNode>> Start(ClusterNodeOptions options,
                                                    tiers::TierManager& tiers);
  ~ClusterNode() override;
  // Leaves the cluster (peers drop this node at once) and stops the threads.
  void Stop();

  // ClusterHooks
  void Fill(wire::ClusterMembersResponse* out) override;
  size_t FetchMissing(NamespaceId ns, const std::string& ns_name, std::span<const BlockKey> keys,
                      int gpu_device) override;
  GpuLinks* gpu_links() override { return gpu_links_.get(); }
  void Replicate(NamespaceId ns, const std::string& ns_name,
                 std::vector<std::pair<BlockKey, BlockKey>> blocks) override;
  void ReplicateSession(NamespaceId ns, const std::string& ns_name,
                        const wire::SessionRecord& record) override;
  RemoteSession LoadRemoteSession(const std::string& ns_name,
                                  const std::string& session_id) override;
  void Locate(const std::string& ns_name, std::span<const BlockKey> keys,
              wire::LocateResponse* out) override;

  // Where a session lives: its id's rendezvous order (SHA-256 of namespace and id as the key).
  static BlockKey SessionKey(const std::string& ns_name, const std::string& session_id);

 private:
  struct Job {
    enum class Kind { kBlocks, kSession } kind = Kind::kBlocks;
    NamespaceId ns = 0;
    std::string ns_name;
    std::vector<std::pair<BlockKey, BlockKey>> blocks;  // key, parent
    // Ask the peer which it lacks before reading and sending any (re-replication: peers hold
    // most already). New puts skip the round trip: nobody has them yet.
    bool offer_first = false;
    std::shared_ptr<const wire::SessionRecord> session;  // a save or a deletion record
    int attempt = 0;                                     // retries so far (Retry)
    // A session copy retried for one home only (empty: every home of the session).
    cluster::NodeId home;
  };
  void Enqueue(Job job);
  // A job whose copies did not all reach their peer (a failed or slow request, no connection)
  // runs again, with only what did not arrive, after a backoff that doubles from 500 ms; after
  // kMaxReplicationAttempts it is dropped with a warning (a membership change still offers every
  // block and session again).
  void Retry(Job job);
  // Adds one to `counter` of options_.metrics, if any.
  void Count(std::atomic<uint64_t> Metrics::*counter) {
    if (options_.metrics != nullptr) options_.metrics->Add(options_.metrics->*counter);
  }
  static constexpr int kMaxReplicationAttempts = 6;
  // A job sending `record` (a save or a deletion) of namespace `ns` to the session's homes.
  static Job SessionJob(NamespaceId ns, const std::string& ns_name,
                        const wire::SessionRecord& record);
  // Runs `task` on a fan-out thread.
  void Fanout(std::function<void()> task);
  void FanoutLoop();
  // Sends the job's blocks to their replicas; returns those that did not all arrive.
  std::vector<std::pair<BlockKey, BlockKey>> RunBlocks(const Job& job);
  // Sends the job's session record to its homes (to `job.home` only, when set). Whether every
  // home took it.
  bool RunSession(const Job& job);
  // Sends session job `job` to home `node` at `address`: its chain's blocks the home lacks, then
  // the record (kept there only if newer). A home that cannot be reached goes into `failed`
  // (when given).
  // Whether it arrived (false: worth sending again).
  bool SendSession(const Job& job, const cluster::NodeId& node, const std::string& address,
                   std::set<cluster::NodeId>* failed);
  // One membership-change offer of session records (Rereplicate).
  struct SessionOffers {
    std::set<cluster::NodeId> unreachable;  // skipped for the rest of the pass
    std::set<cluster::NodeId> send_all;     // did not answer SESSION_VERSIONS (older kvpoold)
    size_t offered = 0;                     // records read
    size_t asked = 0;                       // SESSION_VERSIONS asked (per home, namespace, batch)
    size_t sent = 0;                        // records sent to a home
  };
  // A batch ends at this many records, or at this many chain keys in all (records are read
  // whole).
  static constexpr size_t kSessionOfferBatch = 256;
  static constexpr size_t kSessionOfferBatchKeys = 256 * 1024;
  // Asks each home of the records of `batch` (session jobs) which it would keep, and sends it
  // those (every one to a home in `pass->send_all`). Stops when the node stops.
  void OfferSessions(const std::vector<Job>& batch, SessionOffers* pass);
  // Whether Stop has begun (takes mu_).
  bool Stopping() ABSL_LOCKS_EXCLUDED(mu_);
  // FetchMissing's first round for a reader on gpu tier `gpu_device`: each key's first home is
  // asked for what it holds in a gpu tier, received device to device (GpuLinks::Receive); keys
  // with skip[i] (known absent) are not asked. Sets found[i] for each block stored, and appends
  // its (key, parent) to `links`; returns how many.
  size_t FetchOverDeviceLinks(NamespaceId ns, const std::string& ns_name,
                              std::span<const BlockKey> keys, int gpu_device,
                              const std::vector<std::vector<cluster::NodeId>>& order,
                              const std::map<std::string, std::string>& addresses,
                              const std::vector<bool>& skip, std::vector<bool>& found,
                              std::vector<std::pair<BlockKey, BlockKey>>& links);
  // What a push came to.
  enum class Pushed {
    kDone,         // the peer took them (or they are no longer here to send)
    kIncomplete,   // some were another writer's there (in progress): worth sending again
    kUnreachable,  // no connection, or a request failed: not tried again for kPushBackoff
  };
  static constexpr std::chrono::milliseconds kPushBackoff{400};  // below the first retry's delay
  // Whether copies to the peer at `address` failed less than kPushBackoff ago (blocks or session
  // records): those to it then go to the retry queue without trying, rather than each costing
  // the connect or request timeout on the one replication thread. BackOff starts that.
  bool BackingOff(const std::string& address);
  void BackOff(const std::string& address);
  // A pooled connection for copies to `address`: nullptr while it backs off, or when it cannot
  // be reached (which starts the backoff).
  std::unique_ptr<Client> CheckoutForCopy(const std::string& address, const std::string& ns_name);
  // Copies `keys` (with parents) from the local tiers to the peer at `address`.
  Pushed PushBlocks(NamespaceId ns, const std::string& ns_name, const std::string& address,
                    const std::vector<std::pair<BlockKey, BlockKey>>& blocks, bool offer_first);

  ClusterNode(ClusterNodeOptions options, tiers::TierManager& tiers);
  void JoinLoop();
  void ReplicateLoop();
  // The member set changed: schedule a re-replication scan (only when node ids changed).
  void OnViewChange();
  // Pushes every locally cached block to the next `replicas` members of its order (put-if-absent:
  // copies they already hold cost one reservation round trip per batch).
  void Rereplicate();
  // The live members (by node id) and their control addresses, excluding this node.
  std::shared_ptr<const cluster::Ring> Ring(std::map<std::string, std::string>* addresses);
  // A pooled client of `ns_name` on the peer at `address`; nullptr when it cannot connect.
  std::unique_ptr<Client> Checkout(const std::string& address, const std::string& ns_name);
  void Return(const std::string& address, const std::string& ns_name, std::unique_ptr<Client> c);
  // Where FetchMissing receives one block, chosen once the peer has said its size (`asked`): a
  // host-tier slot reserved for it without waiting (state kReserved), or memory of its own when
  // there was no room without a wait (kRefused and spilled(); stored after the request), or
  // nowhere: this node holds it (kPresent), is storing it (kInProgress), or has no room for it
  // (kRefused).
  struct Landing {
    bool asked = false;
    tiers::ReserveState state = tiers::ReserveState::kRefused;
    uint64_t reservation_id = 0;
    uint8_t* data = nullptr;
    uint64_t size = 0;
    std::vector<uint8_t> spill;
    // The buffer for a block of `want` bytes (empty: do not transfer it).
    MutableBuffer Buffer(uint64_t want);
    bool spilled() const { return state == tiers::ReserveState::kRefused && !spill.empty(); }
  };
  Landing ReserveLanding(NamespaceId ns, const BlockKey& key, uint64_t size);
  // What one fetch request found, for FetchMissing's bookkeeping.
  struct FetchTally {
    std::vector<bool>& found;         // by key index: a peer holds it
    std::vector<bool>& inconclusive;  // by key index: an error said nothing of it
    // (key, parent) of each block found, with the parent the peer named: linked once the fetch
    // is done (TierManager::LinkUnderParents), for the blocks committed before their parents.
    std::vector<std::pair<BlockKey, BlockKey>>& links;
    size_t stored = 0;   // now stored here
    uint64_t bytes = 0;  // of the blocks found
    uint64_t blocks = 0;
  };
  // After a fetch request answered: commits each block that landed in a reserved slot (with the
  // checksum it was verified against) or aborts its slot, then stores the blocks received into
  // their own memory and waits for the local puts storing the others. `indices`: the key index
  // of each block asked; `landing` and `got` by the same position.
  void SettleLandings(NamespaceId ns, std::span<const BlockKey> keys,
                      std::span<const size_t> indices, std::vector<Landing>& landing,
                      const std::vector<GetResult>& got, FetchTally& tally);
  // Waits (up to the peer timeout) for the local put storing `key`; whether it is stored now.
  bool AwaitOtherWriter(NamespaceId ns, const BlockKey& key);
  // Stores a fetched block, verified against `checksum`, in the host tier as a local put would
  // (waiting for room), linked under `parent` (the one the peer named; zero: none). Whether it
  // is stored here now.
  bool StoreReceived(NamespaceId ns, const BlockKey& key, const BlockKey& parent,
                     const std::vector<uint8_t>& bytes, uint64_t checksum);

  const ClusterNodeOptions options_;
  tiers::TierManager& tiers_;

  cluster::FetchMemory memory_;  // of FetchMissing: peers in backoff, keys known absent
  // Device links to peers' gpu tiers; null without device links or a gpu tier here. Stopped by
  // Stop, destroyed with the node.
  std::unique_ptr<GpuLinks> gpu_links_;
  // Peers (by node id) that answered they have no device links, until when they are not asked.
  std::map<std::string, std::chrono::steady_clock::time_point> without_links_ ABSL_GUARDED_BY(mu_);
  absl::Mutex mu_;
  absl::CondVar cv_;
  std::unique_ptr<cluster::Membership> membership_ ABSL_GUARDED_BY(mu_);
  std::string join_error_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::string> last_members_ ABSL_GUARDED_BY(mu_);  // node ids, sorted
  bool rescan_ ABSL_GUARDED_BY(mu_) = false;
  std::chrono::steady_clock::time_point rescan_at_ ABSL_GUARDED_BY(mu_);
  std::deque<Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::multimap<std::chrono::steady_clock::time_point, Job> retries_ ABSL_GUARDED_BY(mu_);
  size_t retry_blocks_ ABSL_GUARDED_BY(mu_) = 0;  // in retries_ (a job counts one more)
  static constexpr size_t kMaxRetryBlocks = 1 << 20;
  // New jobs run before due retries, but no more than this many in a row.
  size_t new_since_retry_ ABSL_GUARDED_BY(mu_) = 0;
  static constexpr size_t kNewJobsPerRetry = 8;
  // Peers (control addresses) a push failed to, and until when pushes to them are not tried.
  std::map<std::string, std::chrono::steady_clock::time_point> push_backoff_ ABSL_GUARDED_BY(mu_);
  // Peers whose UCX failed at a connect: new connections to them use the socket until then.
  std::map<std::string, std::chrono::steady_clock::time_point> ucx_refused_until_
      ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, std::string>, std::vector<std::unique_ptr<Client>>> idle_
      ABSL_GUARDED_BY(mu_);
  absl::CondVar fanout_cv_;  // fanout_ has a task, or stopping_
  std::deque<std::function<void()>> fanout_ ABSL_GUARDED_BY(mu_);
  std::thread join_thread_;
  std::thread replicate_thread_;
  std::vector<std::thread> fanout_threads_;
};

}  // namespace kvpool::daemon
