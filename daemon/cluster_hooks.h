#pragma once
// ClusterHooks: what request handling asks of the cluster layer (daemon/cluster_node.h
// implements it); absent when the daemon runs standalone. ClusterRef: where the handlers find
// it once cluster mode has started.
//
// Thread safety: ClusterHooks methods are called from the control server's request threads, for
// many connections at once. ClusterRef::Set is called once, possibly while requests run; Get
// from any thread.

#include <atomic>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <kvpool/block_key.h>

#include "common/namespace_id.h"
#include "common/status.h"
#include "control.pb.h"

namespace kvpool::daemon {

class GpuLinks;

// A session as its other homes know it (ClusterHooks::LoadRemoteSession).
struct RemoteSession {
  // The newest record among the homes that answered; none when none of them holds one.
  std::optional<wire::SessionRecord> newest;
  // Every other home answered (vacuously with no other home). False without a cluster view.
  bool every_home_answered = false;
  // Which homes did not answer, for messages ("node-b, node-c"); empty when all did.
  std::string silent;
};

class ClusterHooks {
 public:
  virtual ~ClusterHooks() = default;
  // The cluster state and member list (status, stats, `kvpool cluster members`).
  virtual void Fill(wire::ClusterMembersResponse* out) = 0;
  // Blocks of `keys` that are not cached here: fetch them from their home nodes and store them
  // locally. Returns how many were stored. Bounded by the peer timeout. With `gpu_device` >= 0
  // (a reader on that gpu tier's device), blocks a home holds in a gpu tier come device to
  // device into that gpu tier where both daemons have device links; the rest as without.
  virtual size_t FetchMissing(NamespaceId ns, const std::string& ns_name,
                              std::span<const BlockKey> keys, int gpu_device) = 0;
  // The device links serving peers' GPU_* requests (daemon/gpu_links.h); null without them.
  virtual GpuLinks* gpu_links() = 0;
  // Blocks a client put here (key, parent): copy them to their other homes in the background.
  virtual void Replicate(NamespaceId ns, const std::string& ns_name,
                         std::vector<std::pair<BlockKey, BlockKey>> blocks) = 0;
  // A session saved or deleted here (a deletion record), or found newer here than on its homes:
  // copy it (and its blocks) to its home nodes in the background, where it replaces older
  // copies only.
  virtual void ReplicateSession(NamespaceId ns, const std::string& ns_name,
                                const wire::SessionRecord& record) = 0;
  // What a session's home nodes other than this one hold: the newest record among those that
  // answered, deletion records included (record.deleted), and whether every one of them
  // answered. Never an error: a home that is down or slow is one that did not answer.
  virtual RemoteSession LoadRemoteSession(const std::string& ns_name,
                                          const std::string& session_id) = 0;
  // LOCATE: asks every other live member how many leading blocks of `keys` it holds (one lookup
  // each, all at once, nothing promoted), appends one entry per member to `out`, and sets this
  // node's control address on the entry already there for it. Bounded by the peer deadlines.
  virtual void Locate(const std::string& ns_name, std::span<const BlockKey> keys,
                      wire::LocateResponse* out) = 0;
};

// The cluster hooks, null until cluster mode starts (it starts after the TCP listener it
// advertises, so requests may already run).
class ClusterRef {
 public:
  // `hooks` must outlive every handler that holds this reference.
  void Set(ClusterHooks* hooks) { hooks_.store(hooks, std::memory_order_release); }
  // Release/acquire: a request that sees the hooks sees them constructed.
  ClusterHooks* Get() const { return hooks_.load(std::memory_order_acquire); }

 private:
  std::atomic<ClusterHooks*> hooks_{nullptr};
};

}  // namespace kvpool::daemon
