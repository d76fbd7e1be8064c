#pragma once
// GpuLinks: this daemon's device links to its peers (transport/device_link.h: NCCL in kvpoold)
// and the moves of gpu-tier blocks over them, device to device (docs/CLUSTER.md, "GPU-resident
// blocks between daemons").
//
// A daemon that misses blocks for a reader on one of its GPUs (Receive, on the request worker
// that fetches them) asks the peer that should hold them which it has in a gpu tier (GPU_OFFER),
// reserves slots for those in its own gpu tier, has the peer send them over the link between the
// two GPUs (GPU_SEND) while it receives them into the slots, and commits each one only when its
// GPU finds in the slot the device checksum the peer gave. Blocks that were not offered, found no
// slot, or failed in any way are left to the caller, which fetches them over UCX from host memory.
//
// The asker's links are kept by (peer, its device, the peer's device) and used by one fetch at a
// time: a fetch that finds its link busy for long leaves its blocks to UCX rather than wait. A
// fetch that finds no link asks the peer to join one (GPU_LINK_JOIN) and joins it in the
// background (an NCCL communicator takes far longer than a request), leaving its own blocks to
// UCX; later fetches use the link once joined. A link that fails in any way after a GPU_SEND was
// asked for is dropped (the peer's sends may be queued without receives to meet them), and the
// next fetch starts a new one; a join that fails is not tried again with that peer for a while
// (1 s, doubling up to a minute).
// Links unused for 30 s are dropped. On the peer's side, each link it was asked to join (Accept)
// gets a worker thread (ThreadRole::kGpuLink) that joins it and then runs its sends in order, each
// under its deadline, and ends the leases that held the sent blocks when done; a link that fails,
// is refused a send out of order, or stays unused for a minute ends with its worker.
//
// Thread safety: every method may be called from any thread. Ownership: `tiers`, `links` and
// `metrics` are borrowed and must outlive this object, which must be stopped before the tier
// manager stops.

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <kvpool/block_key.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/namespace_id.h"
#include "common/status.h"
#include "daemon/metrics.h"
#include "tiers/tier_manager.h"
#include "transport/device_link.h"

namespace kvpool::wire {
class GpuLinkJoinRequest;
class GpuOfferRequest;
class GpuOfferResponse;
class GpuSendRequest;
class GpuSendResponse;
}  // namespace kvpool::wire

namespace kvpool::daemon {

class GpuLinks {
 public:
  // `timeout` bounds every transfer; joins have kJoinTimeout.
  GpuLinks(tiers::TierManager& tiers, transport::DeviceLinks& links, Metrics& metrics,
           std::chrono::milliseconds timeout);
  ~GpuLinks() { Stop(); }
  // Stops the link workers (a transfer in flight ends by its deadline) and drops the links peers
  // joined; later GPU_* requests are refused. Idempotent.
  void Stop();
  GpuLinks(const GpuLinks&) = delete;
  GpuLinks& operator=(const GpuLinks&) = delete;

  // ---- The asker's side.

  // The three requests to one peer, on a connection to it in the fetch's namespace.
  class Peer {
   public:
    virtual ~Peer() = default;
    virtual Status Join(const wire::GpuLinkJoinRequest& req) = 0;
    virtual Status Offer(const wire::GpuOfferRequest& req, wire::GpuOfferResponse* resp) = 0;
    virtual Status Send(const wire::GpuSendRequest& req, wire::GpuSendResponse* resp) = 0;
  };
  // Fetches what `peer` (`peer_name` keys its links) holds of `keys` in a gpu tier into this
  // daemon's gpu tier of CUDA device `device`, device to device, each linked under the parent
  // the peer names for it; (key, parent) of each block stored is appended to `links` (a block
  // committed before its parent is in the index has no link yet: the caller links them with
  // TierManager::LinkUnderParents once its whole fetch is done). Returns, per key, whether it is
  // now stored here (none, when the link is busy, being joined, or failed recently). Errors:
  // GPU_OFFER's failure as is (FailedPrecondition: the peer has no device links); Aborted for any
  // failure after it (the link, if any, is dropped). Every block not stored is the caller's to
  // fetch otherwise.
  Result<std::vector<bool>> Receive(NamespaceId ns, std::span<const BlockKey> keys, int device,
                                    const std::string& peer_name, Peer& peer,
                                    std::vector<std::pair<BlockKey, BlockKey>>& links);

  // The cluster's live members changed: links to peers no longer among `live` (node ids) are
  // dropped by the next fetch (not here: closing a link may wait on its peer).
  void SetLivePeers(std::vector<std::string> live);

  // ---- The peer's side (requests from a peer daemon).

  // GPU_LINK_JOIN: starts joining link `link_id` as rank 1 on `device`, on a worker of its own,
  // and returns at once. FailedPrecondition without a gpu tier on `device`; ResourceExhausted
  // with too many links; InvalidArgument for a malformed token.
  Status Accept(const std::string& token, const std::string& link_id, int device);
  // GPU_OFFER: where `ns`'s blocks of `keys` have gpu copies.
  void Offer(NamespaceId ns, std::span<const BlockKey> keys, wire::GpuOfferResponse* out) const;
  // GPU_SEND number `seq` of link `token`: leases each block of `keys` still in the gpu tier of
  // the link's device with `sizes[i]` and `checksums[i]` (waiting at most for the host copy of a
  // block just put into gpu; never for a disk read), and queues their sends, in order, on the
  // link; returns which it sends. NotFound for a link unknown or ended; Aborted for a `seq` out of
  // order (the link ends: join a new one).
  Result<std::vector<bool>> Send(NamespaceId ns, const std::string& token, uint64_t seq,
                                 std::span<const BlockKey> keys, std::span<const uint64_t> sizes,
                                 std::span<const uint64_t> checksums);

  static constexpr size_t kTokenBytes = 16;
  static constexpr size_t kMaxAcceptedLinks = 64;
  // The asker drops a link unused this long; the peer ends one unused twice as long (so the
  // asker never sends on a link its peer has closed for idleness).
  static constexpr std::chrono::seconds kAskerIdle{30};
  static constexpr std::chrono::seconds kPeerIdle{60};
  // How long a fetch waits for its link while another fetch uses it.
  static constexpr std::chrono::milliseconds kBusyWait{200};
  // How long both sides may take to join a link (in the background).
  static constexpr std::chrono::seconds kJoinTimeout{10};

 private:
  using Clock = std::chrono::steady_clock;
  // A link this daemon made (the asker's). `link` to `last_used` belong to the fetch that set
  // `busy`; the rest is guarded by outbound_mu_.
  struct Outbound {
    ~Outbound() {
      if (joiner.joinable()) joiner.join();  // (ended: it held a reference while it ran)
      Drop(joined);
      Drop(link);
    }
    bool busy = false;
    bool joining = false;  // `joiner` is joining a link for it
    std::thread joiner;
    std::unique_ptr<transport::DeviceLink> joined;  // what `joiner` joined, for the next fetch
    std::string joined_token;
    Clock::time_point joined_at;
    std::unique_ptr<transport::DeviceLink> link;
    std::string token;
    uint64_t next_seq = 0;
    Clock::time_point last_used;
  };
  // Sends of one GPU_SEND, run by the link's worker.
  struct Job {
    std::vector<transport::DeviceLink::Op> ops;
    uint64_t owner = 0;  // holds the leases of the blocks sent
    uint64_t blocks = 0;
    uint64_t bytes = 0;
    Clock::time_point deadline;
  };
  // A link a peer asked this daemon to join, and its worker.
  struct Inbound {
    std::string link_id;
    int device = 0;
    std::thread worker;
    std::deque<Job> jobs;   // guarded by GpuLinks::mu_, as the fields below
    uint64_t next_seq = 0;  // of the next GPU_SEND
    bool closing = false;   // a GPU_SEND came out of order: the worker ends the link
    bool done = false;      // the worker ended (the link failed to join, broke, or idled out)
  };
  // Aborts and frees a link being dropped: never waits for its peer (the peer's side ends by its
  // own deadline or idleness).
  static void Drop(std::unique_ptr<transport::DeviceLink>& link) {
    if (link != nullptr) link->Abort();
    link.reset();
  }
  // Failures to join a link with one peer, or of a link's transfers (reset by a transfer that
  // succeeds): no new join until `until`.
  struct Backoff {
    int failures = 0;
    Clock::time_point until;
  };

  // Takes the link for `key`, waiting a little while another fetch holds it; null when it stays
  // busy. Drops links unused for kAskerIdle on the way.
  std::shared_ptr<Outbound> TakeOutbound(const std::tuple<std::string, int, int>& key);
  void GiveBack(const std::shared_ptr<Outbound>& out);
  // Whether `out` (taken by this fetch) has a link to use now. Otherwise, unless one is being
  // joined or joins with this peer back off, asks the peer to join a new one and starts joining
  // it in the background.
  Result<bool> Ready(const std::shared_ptr<Outbound>& out, int device, int peer_device,
                     const std::string& peer_name, Peer& peer);
  // The asker's join, on its own thread (ThreadRole::kGpuLink): leaves the link in out->joined,
  // or backs off joins with `peer_name`.
  void BackOffLocked(const std::string& peer_name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(outbound_mu_);
  void JoinInBackground(const std::shared_ptr<Outbound>& out, const std::string& id,
                        const std::string& token, int device, const std::string& peer_name);
  void WorkerMain(Inbound* in);
  // Takes the links whose workers ended out of inbound_, for the caller to join unlocked.
  std::vector<std::unique_ptr<Inbound>> ReapLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Device memory at `offset` of the gpu tier of `device` (null without one).
  uint8_t* GpuMemory(int device, uint64_t offset, uint64_t size) const;

  tiers::TierManager& tiers_;
  transport::DeviceLinks& links_;
  Metrics& metrics_;
  const std::chrono::milliseconds timeout_;

  absl::Mutex outbound_mu_;
  absl::CondVar outbound_freed_;  // an Outbound stopped being busy
  std::map<std::tuple<std::string, int, int>, std::shared_ptr<Outbound>> outbound_
      ABSL_GUARDED_BY(outbound_mu_);
  std::map<std::string, Backoff> join_backoff_ ABSL_GUARDED_BY(outbound_mu_);  // by peer
  std::optional<std::set<std::string>> live_peers_ ABSL_GUARDED_BY(outbound_mu_);
  bool outbound_stopping_ ABSL_GUARDED_BY(outbound_mu_) = false;
  int next_joiner_ ABSL_GUARDED_BY(outbound_mu_) = 1000;

  mutable absl::Mutex mu_;
  absl::CondVar work_;  // a job queued, or stopping
  std::map<std::string, std::unique_ptr<Inbound>> inbound_ ABSL_GUARDED_BY(mu_);  // by token
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_owner_ ABSL_GUARDED_BY(mu_);
  int next_worker_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvpool::daemon
