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
// The asker's links are kept by (peer, its device, the peer's device), used by one fetch at a
// time, and dropped when they break; the next fetch joins a new one (GPU_LINK_JOIN). On the
// peer's side, each link it was asked to join (Accept) gets a worker thread (ThreadRole::kGpuLink)
// that joins it and then runs its sends in order, each under a deadline, and ends the leases that
// held the sent blocks when done. A link that fails is broken for good on both sides; its worker
// ends.
//
// Thread safety: every method may be called from any thread. Ownership: `tiers`, `links` and
// `metrics` are borrowed and must outlive this object, which must be destroyed before requests
// stop being served by them.

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <tuple>
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
  // `timeout` bounds every join and transfer (the peer timeout).
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
  // daemon's gpu tier of CUDA device `device`, device to device; `parents[i]` is keys[i]'s parent.
  // Returns, per key, whether it is now stored here. An error (a peer that failed, a link that
  // broke) leaves nothing stored; every block not stored is the caller's to fetch otherwise.
  Result<std::vector<bool>> Receive(NamespaceId ns, std::span<const BlockKey> keys,
                                    std::span<const BlockKey> parents, int device,
                                    const std::string& peer_name, Peer& peer);

  // ---- The peer's side (requests from a peer daemon).

  // GPU_LINK_JOIN: starts joining link `link_id` as rank 1 on `device`, on a worker of its own,
  // and returns at once. FailedPrecondition without a gpu tier on `device`; ResourceExhausted
  // with too many links; InvalidArgument for a malformed token.
  Status Accept(const std::string& token, const std::string& link_id, int device);
  // GPU_OFFER: where `ns`'s blocks of `keys` have gpu copies.
  void Offer(NamespaceId ns, std::span<const BlockKey> keys, wire::GpuOfferResponse* out) const;
  // GPU_SEND: leases each block of `keys` still in the gpu tier of link `token`'s device with
  // `sizes[i]` and `checksums[i]`, and queues their sends, in order, on the link; returns which
  // it sends. NotFound for a link unknown or broken (join a new one).
  Result<std::vector<bool>> Send(NamespaceId ns, const std::string& token,
                                 std::span<const BlockKey> keys, std::span<const uint64_t> sizes,
                                 std::span<const uint64_t> checksums);

  // Links this daemon accepted that are still up (tests, status).
  size_t accepted_links() const;

  static constexpr size_t kTokenBytes = 16;
  static constexpr size_t kMaxAcceptedLinks = 64;

 private:
  // A link this daemon made (the asker's), used by one fetch at a time.
  struct Outbound {
    absl::Mutex mu;
    std::unique_ptr<transport::DeviceLink> link ABSL_GUARDED_BY(mu);
    std::string token ABSL_GUARDED_BY(mu);
  };
  // Sends of one GPU_SEND, run by the link's worker.
  struct Job {
    std::vector<transport::DeviceLink::Op> ops;
    uint64_t owner = 0;  // holds the leases of the blocks sent
    uint64_t blocks = 0;
    uint64_t bytes = 0;
    transport::DeviceLink::Deadline deadline;
  };
  // A link a peer asked this daemon to join, and its worker.
  struct Inbound {
    std::string link_id;
    int device = 0;
    std::thread worker;
    std::deque<Job> jobs;  // guarded by GpuLinks::mu_, as the two below
    bool done = false;     // the worker ended (the link failed to join or broke)
    bool joined = false;
  };
  // The asker's link for (peer, device, peer_device), joined now when it has none.
  Status JoinLocked(Outbound& out, int device, int peer_device, Peer& peer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(out.mu);
  void WorkerMain(Inbound* in);
  // Takes the links whose workers ended out of inbound_, for the caller to join unlocked.
  std::vector<std::unique_ptr<Inbound>> ReapLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Device memory at `offset` of the gpu tier of `device` (null without one).
  uint8_t* GpuMemory(int device, uint64_t offset, uint64_t size) const;

  tiers::TierManager& tiers_;
  transport::DeviceLinks& links_;
  Metrics& metrics_;
  const std::chrono::milliseconds timeout_;

  absl::Mutex outbound_mu_;  // guards the map only; each link has its own mutex
  std::map<std::tuple<std::string, int, int>, std::shared_ptr<Outbound>> outbound_
      ABSL_GUARDED_BY(outbound_mu_);

  mutable absl::Mutex mu_;
  absl::CondVar work_;  // a job queued, or stopping
  std::map<std::string, std::unique_ptr<Inbound>> inbound_ ABSL_GUARDED_BY(mu_);  // by token
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_owner_ ABSL_GUARDED_BY(mu_);
  int next_worker_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvpool::daemon
