#include "daemon/cluster_node.h"

#include <glog/logging.h>

#include <algorithm>
#include <cstring>

#include <kvpool/block_key.h>
#include "client/peer_calls.h"
#include "common/checksum.h"
#include "common/clock.h"
#include "common/threads.h"
#include "control.pb.h"
#include "daemon/session_handlers.h"

namespace kvpool::daemon {
namespace {

// Owner id of the reservations and leases this node takes for fetches and replication
// (connection owners count up from 1).
constexpr uint64_t kClusterOwner = UINT64_MAX - 1;
// Bytes asked of a peer in one request: at UCX-over-tcp speeds (0.5-2 GB/s here) a request of
// this size takes well under the 500 ms peer deadline.
constexpr uint64_t kFetchChunkBytes = 32ull << 20;
// A peer that said it has no device links is not asked for gpu-tier blocks again for this long.
constexpr std::chrono::seconds kWithoutLinksFor{30};
// Peer connections say so at hello: their puts are not replicated again.
constexpr const char* kPeerClientName = "kvpool-peer";

}  // namespace

ClusterNode::ClusterNode(ClusterNodeOptions options, tiers::TierManager& tiers)
    : options_(std::move(options)), tiers_(tiers), memory_(options_.fetch_memory) {}

Result<std::unique_ptr<ClusterNode>> ClusterNode::Start(ClusterNodeOptions options,
                                                        tiers::TierManager& tiers) {
  // The membership calls back from its threads, which Leave() joins before the node goes away;
  // the node is set in the cell once constructed (acquire/release: the callback then sees it
  // whole).
  auto cell = std::make_shared<std::atomic<ClusterNode*>>(nullptr);
  options.membership.on_change = [cell] {
    if (ClusterNode* n = cell->load(std::memory_order_acquire)) n->OnViewChange();
  };
  std::unique_ptr<ClusterNode> node(new ClusterNode(std::move(options), tiers));
  // Before the membership calls back (OnViewChange tells the links who is live).
  if (node->options_.device_links != nullptr && node->options_.metrics != nullptr &&
      !tiers.gpu_tiers().empty()) {
    // A transfer of up to a fetch chunk (32 MiB) over NVLink or InfiniBand takes milliseconds;
    // the deadline is the connect timeout's, for a peer busy with other links.
    node->gpu_links_ = std::make_unique<GpuLinks>(
        tiers, *node->options_.device_links, *node->options_.metrics,
        std::max(node->options_.peer_timeout * 4, std::chrono::milliseconds(2000)));
  }
  cell->store(node.get(), std::memory_order_release);
  Result<std::unique_ptr<cluster::Membership>> m =
      cluster::Membership::Join(node->options_.membership);
  if (!m.ok() && m.status().code() != StatusCode::kUnavailable) {
    return m.status().WithContext("joining cluster " + node->options_.membership.cluster_name);
  }
  {
    absl::MutexLock lock(&node->mu_);
    if (m.ok()) {
      node->membership_ = std::move(*m);
    } else {
      LOG(WARNING) << "cannot reach etcd at " << node->options_.membership.etcd << " ("
                   << m.status().ToString()
                   << "): serving the local tiers and retrying in the background";
      node->join_error_ = m.status().message();
    }
  }
  ClusterNode* raw = node.get();
  if (!m.ok())
    node->join_thread_ = StartThread(ThreadRole::kCluster, 1000, [raw] { raw->JoinLoop(); });
  node->replicate_thread_ =
      StartThread(ThreadRole::kCluster, 1001, [raw] { raw->ReplicateLoop(); });
  for (int i = 0; i < std::max(1, node->options_.fanout_threads); ++i) {
    node->fanout_threads_.push_back(
        StartThread(ThreadRole::kCluster, 200 + i, [raw] { raw->FanoutLoop(); }));
  }
  return node;
}

ClusterNode::~ClusterNode() { Stop(); }

void ClusterNode::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    cv_.SignalAll();
    fanout_cv_.SignalAll();
  }
  if (join_thread_.joinable()) join_thread_.join();
  if (replicate_thread_.joinable()) replicate_thread_.join();
  for (std::thread& t : fanout_threads_) t.join();
  fanout_threads_.clear();
  std::unique_ptr<cluster::Membership> m;
  {
    absl::MutexLock lock(&mu_);
    m = std::move(membership_);
    idle_.clear();
  }
  if (m) m->Leave();
  // After leaving: peers stop asking at once, while a join in flight may take its full time.
  if (gpu_links_) gpu_links_->Stop();
}

void ClusterNode::JoinLoop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_ && membership_ == nullptr) {
    cv_.WaitWithTimeout(&mu_, absl::Seconds(2));
    if (stopping_) return;
    mu_.Unlock();
    Result<std::unique_ptr<cluster::Membership>> m = cluster::Membership::Join(options_.membership);
    mu_.Lock();
    if (m.ok()) {
      membership_ = std::move(*m);
      LOG(INFO) << "joined cluster " << options_.membership.cluster_name;
      return;
    }
    join_error_ = m.status().message();
    if (m.status().code() != StatusCode::kUnavailable) {
      LOG(ERROR) << "joining cluster " << options_.membership.cluster_name
                 << " refused: " << m.status().ToString() << " (still serving the local tiers)";
      return;
    }
  }
}

void ClusterNode::Fill(wire::ClusterMembersResponse* out) {
  absl::MutexLock lock(&mu_);
  if (membership_ == nullptr) {
    out->set_cluster_state("joining");
    out->mutable_status()->set_message(join_error_);
    return;
  }
  const cluster::ClusterHealth h = membership_->health();
  out->set_cluster_state(cluster::ClusterStateName(h.state));
  out->mutable_status()->set_message(h.reason);
  for (const cluster::Member& m : membership_->Members()) {
    wire::ClusterMember* w = out->add_members();
    w->set_node_id(m.record.node_id);
    w->set_control_address(m.record.control_address);
    w->set_state(cluster::MemberStateName(m.state));
    w->set_capacity_bytes(m.record.capacity_bytes);
    w->set_used_bytes(m.record.used_bytes);
    w->set_self(m.self);
    w->set_started_unix_ms(m.record.started_at_ms);
  }
}

std::shared_ptr<const cluster::Ring> ClusterNode::Ring(
    std::map<std::string, std::string>* addresses) {
  absl::MutexLock lock(&mu_);
  if (membership_ == nullptr) return nullptr;
  for (const cluster::Member& m : membership_->Members()) {
    if (!m.self) (*addresses)[m.record.node_id] = m.record.control_address;
  }
  return membership_->ring();
}

std::unique_ptr<Client> ClusterNode::Checkout(const std::string& address,
                                              const std::string& ns_name) {
  {
    absl::MutexLock lock(&mu_);
    auto it = idle_.find({address, ns_name});
    if (it != idle_.end() && !it->second.empty()) {
      std::unique_ptr<Client> c = std::move(it->second.back());
      it->second.pop_back();
      return c;
    }
  }
  ClientOptions o;
  o.address = address;
  o.namespace_name = ns_name;
  o.client_name = kPeerClientName;
  o.cluster_secret = options_.membership.secret;
  o.timeout = options_.peer_timeout;
  // A new peer connection includes a UCX handshake (an endpoint to the peer's UCX listener, and
  // its bind): give it longer than a request. A dead peer, or a UCX port that refuses, fails at
  // once; only an unreachable host (or UCX ports a firewall drops) costs this, plus the UCX
  // engine's cancel grace (1 s) for a nonce that never comes. After a peer's UCX failed, new
  // connections to it leave UCX alone for 30 s (the socket carries the blocks).
  o.connect_timeout = std::max(options_.peer_timeout * 4, std::chrono::milliseconds(2000));
  bool ucx = options_.ucx;
  if (ucx) {
    absl::MutexLock lock(&mu_);
    auto it = ucx_refused_until_.find(address);
    if (it != ucx_refused_until_.end()) {
      if (std::chrono::steady_clock::now() < it->second)
        ucx = false;
      else
        ucx_refused_until_.erase(it);
    }
  }
  o.data_path = ucx ? DataPath::kAuto : DataPath::kSocket;
  o.ucx_transports = options_.ucx_transports;
  o.ucx_net_devices = options_.ucx_net_devices;
  o.tls_cert_file = options_.tls.cert_file;
  o.tls_key_file = options_.tls.key_file;
  o.tls_ca_file = options_.tls.ca_file;
  Result<std::unique_ptr<Client>> c = Client::Connect(o);
  if (!c.ok()) {
    VLOG(1) << "peer " << address << ": " << c.status().ToString();
    return nullptr;
  }
  if (ucx && !(*c)->server().ucx) {
    LOG_EVERY_N(WARNING, 20) << "peer " << address << ": blocks go on the socket for 30 s: "
                             << (*c)->server().ucx_refused;
    absl::MutexLock lock(&mu_);
    ucx_refused_until_[address] = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  }
  return std::move(*c);
}

void ClusterNode::Return(const std::string& address, const std::string& ns_name,
                         std::unique_ptr<Client> c) {
  absl::MutexLock lock(&mu_);
  auto& pool = idle_[{address, ns_name}];
  if (pool.size() < 4) pool.push_back(std::move(c));
}

ClusterNode::Landing ClusterNode::ReserveLanding(NamespaceId ns, const BlockKey& key,
                                                 uint64_t size) {
  tiers::PutRequestItem item;
  item.key = key;
  item.size = size;
  // The checksum comes at commit (the client verified the bytes against it), and so does the
  // parent, which the peer names beside the bytes.
  Landing l;
  l.asked = true;
  l.size = size;
  // Inside the peer's request, under its deadline: never wait here for room (a disk write in
  // flight); such a block is received into memory of its own and stored after the request.
  const tiers::ReserveOutcome r =
      tiers_.Reserve(ns, kClusterOwner, {&item, 1}, {.may_wait = false, .durable = false})[0];
  l.state = r.state;
  if (r.state == tiers::ReserveState::kReserved) {
    Result<tiers::ReservationTarget> t = tiers_.TargetOf(kClusterOwner, r.reservation_id);
    if (t.ok()) {
      l.reservation_id = r.reservation_id;
      l.data = t->data;
      return l;
    }
    tiers_.Abort(kClusterOwner, r.reservation_id);
    l.state = tiers::ReserveState::kRefused;
    return l;
  }
  // Only a block refused for want of a wait gets memory of its own: room made later stores it.
  // (Refused otherwise, e.g. a tier whose every block is leased, it is not transferred.)
  if (l.state == tiers::ReserveState::kRefused && r.status.code() == StatusCode::kUnavailable) {
    l.spill.resize(size);
  }
  return l;
}

MutableBuffer ClusterNode::Landing::Buffer(uint64_t want) {
  if (want != size) return {};
  if (state == tiers::ReserveState::kReserved) return {data, size};
  if (spilled()) {
    return {spill.data(), spill.size()};
  }
  return {};  // held here already, or being stored: not transferred again
}

void ClusterNode::SettleLandings(NamespaceId ns, std::span<const BlockKey> keys,
                                 std::span<const size_t> indices, std::vector<Landing>& landing,
                                 const std::vector<GetResult>& got, FetchTally& tally) {
  // First every slot this request reserved is committed or aborted, with no wait between;
  // then the blocks that need one (room for a spilled block, another writer's put) are settled.
  std::vector<size_t> later;
  for (size_t k = 0; k < indices.size(); ++k) {
    const GetResult& r = got[k];
    Landing& l = landing[k];
    const size_t i = indices[k];
    const bool reserved = l.state == tiers::ReserveState::kReserved;
    if (r.status.IsNotFound()) {  // the peer lacks it (also after a retry that had sized it)
      if (reserved) tiers_.Abort(kClusterOwner, l.reservation_id);
      continue;
    }
    if (!l.asked) {  // an error there, before any size: says nothing of the block
      tally.inconclusive[i] = true;
      continue;
    }
    const bool transferred = reserved || l.spilled();
    if (transferred && (!r.status.ok() || r.checksum == 0)) {  // damaged, cut off, unverified
      if (reserved) tiers_.Abort(kClusterOwner, l.reservation_id);
      tally.inconclusive[i] = true;
      continue;
    }
    if (transferred && r.lossy_encoding != 0) {
      // The peer's approximate bytes (decoded from its lossy disk copy): stored here they would
      // be served as the block that was put. A miss here instead.
      if (reserved) tiers_.Abort(kClusterOwner, l.reservation_id);
      continue;
    }
    tally.found[i] = true;
    if (!r.parent.IsZero()) tally.links.emplace_back(keys[i], r.parent);
    tally.bytes += l.size;
    ++tally.blocks;
    if (reserved) {
      // Stored with the checksum the client verified the bytes against on arrival: hashing the
      // slot again would read every fetched byte a second time.
      if (!r.parent.IsZero()) tiers_.SetReservedParent(kClusterOwner, l.reservation_id, r.parent);
      if (tiers_.Commit(kClusterOwner, l.reservation_id, r.checksum).ok()) ++tally.stored;
    } else if (l.state == tiers::ReserveState::kPresent) {
      ++tally.stored;
    } else if (l.state == tiers::ReserveState::kInProgress || l.spilled()) {
      later.push_back(k);
    }  // else refused outright: the peer holds it, this node has no room for it
  }
  for (size_t k : later) {
    const Landing& l = landing[k];
    const size_t i = indices[k];
    const bool now_stored =
        l.state == tiers::ReserveState::kInProgress
            ? AwaitOtherWriter(ns, keys[i])
            : StoreReceived(ns, keys[i], got[k].parent, l.spill, got[k].checksum);
    if (now_stored) ++tally.stored;
  }
}

bool ClusterNode::AwaitOtherWriter(NamespaceId ns, const BlockKey& key) {
  // Another writer (a replica pushed here, a client's put) is storing it right now: the block
  // counts once that put commits, so the lookup after this fetch does not stop short at it.
  return tiers_.AwaitInFlightPut(ns, key, options_.peer_timeout);
}

bool ClusterNode::StoreReceived(NamespaceId ns, const BlockKey& key, const BlockKey& parent,
                                const std::vector<uint8_t>& bytes, uint64_t checksum) {
  tiers::PutRequestItem item;
  item.key = key;
  item.size = bytes.size();
  item.checksum = checksum;
  item.parent = parent;
  const tiers::ReserveOutcome r =
      tiers_.Reserve(ns, kClusterOwner, {&item, 1}, {.durable = false})[0];
  if (r.state == tiers::ReserveState::kPresent) return true;
  if (r.state == tiers::ReserveState::kInProgress) return AwaitOtherWriter(ns, key);
  if (r.state != tiers::ReserveState::kReserved) return false;
  Result<tiers::ReservationTarget> t = tiers_.TargetOf(kClusterOwner, r.reservation_id);
  if (!t.ok()) {
    tiers_.Abort(kClusterOwner, r.reservation_id);
    return false;
  }
  std::memcpy(t->data, bytes.data(), bytes.size());
  return tiers_.Commit(kClusterOwner, r.reservation_id, checksum).ok();
}

namespace {

// GpuLinks' requests on a pooled peer connection.
class PeerOverClient final : public GpuLinks::Peer {
 public:
  explicit PeerOverClient(Client& c) : c_(c) {}
  Status Join(const wire::GpuLinkJoinRequest& req) override {
    wire::GpuLinkJoinResponse resp;
    return client::PeerCall(c_, req, &resp);
  }
  Status Offer(const wire::GpuOfferRequest& req, wire::GpuOfferResponse* resp) override {
    return client::PeerCall(c_, req, resp);
  }
  Status Send(const wire::GpuSendRequest& req, wire::GpuSendResponse* resp) override {
    return client::PeerCall(c_, req, resp);
  }

 private:
  Client& c_;
};

}  // namespace

size_t ClusterNode::FetchOverDeviceLinks(NamespaceId ns, const std::string& ns_name,
                                         std::span<const BlockKey> keys, int gpu_device,
                                         const std::vector<std::vector<cluster::NodeId>>& order,
                                         const std::map<std::string, std::string>& addresses,
                                         const std::vector<bool>& skip, std::vector<bool>& found,
                                         std::vector<std::pair<BlockKey, BlockKey>>& links) {
  // Each key is asked of its first home only: where a put's blocks live once replicated. What
  // that home holds only in host, and what this misses, comes over UCX next.
  std::map<cluster::NodeId, std::vector<size_t>> by_node;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!order[i].empty() && !skip[i]) by_node[order[i][0]].push_back(i);
  }
  size_t stored = 0;
  // The device phase as a whole is bounded: homes left when it is spent are asked over UCX only.
  const auto deadline = std::chrono::steady_clock::now() + 2 * options_.peer_timeout;
  for (const auto& [node, indices] : by_node) {
    const std::string& address = addresses.at(node);
    if (std::chrono::steady_clock::now() >= deadline) break;
    if (memory_.Skip(address)) continue;
    {
      absl::MutexLock lock(&mu_);
      auto it = without_links_.find(node);
      if (it != without_links_.end() && std::chrono::steady_clock::now() < it->second) continue;
    }
    std::unique_ptr<Client> c = Checkout(address, ns_name);
    if (c == nullptr) {
      memory_.Failed(address);  // (the UCX rounds then do not dial it again)
      continue;
    }
    std::vector<BlockKey> asked;
    for (size_t i : indices) asked.push_back(keys[i]);
    PeerOverClient peer(*c);
    Result<std::vector<bool>> got = gpu_links_->Receive(ns, asked, gpu_device, node, peer, links);
    if (!got.ok()) {
      // Its blocks come over UCX. A peer without device links (no gpu tier there, no NCCL)
      // says so at once, and is not asked again for a while; a link that failed (Aborted: any
      // failure after the offer) was dropped; a peer that did not answer the offer is skipped
      // like any failed peer.
      VLOG(1) << "device link to " << node << ": " << got.status().ToString();
      const StatusCode code = got.status().code();
      if (code == StatusCode::kFailedPrecondition) {
        absl::MutexLock lock(&mu_);
        without_links_[node] = std::chrono::steady_clock::now() + kWithoutLinksFor;
      }
      if (code == StatusCode::kUnavailable || code == StatusCode::kDeadlineExceeded) {
        memory_.Failed(address);
        continue;
      }
    } else {
      for (size_t k = 0; k < indices.size(); ++k) {
        if ((*got)[k]) {
          found[indices[k]] = true;
          ++stored;
        }
      }
    }
    Return(address, ns_name, std::move(c));
  }
  return stored;
}

size_t ClusterNode::FetchMissing(NamespaceId ns, const std::string& ns_name,
                                 std::span<const BlockKey> keys, int gpu_device) {
  std::map<std::string, std::string> addresses;
  std::shared_ptr<const cluster::Ring> ring = Ring(&addresses);
  if (ring == nullptr || addresses.empty()) return 0;
  // Rounds of one batched request per node: round r asks each still-missing key of the r-th
  // other member in its rendezvous order. The homes come first; later rounds reach the node a
  // put went to while its background copies to the homes are still on their way. A peer that
  // fails or times out only costs its own keys that round.
  constexpr size_t kMaxRounds = 4;
  std::vector<std::vector<cluster::NodeId>> order(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    for (const cluster::NodeId& id : ring->Order(keys[i])) {
      if (addresses.count(id)) order[i].push_back(id);
    }
  }
  std::vector<bool> found(keys.size(), false);
  // Keys no member held a moment ago are misses without asking again (fetch_memory.h); a key
  // some member could not be asked about is not known to be absent.
  std::vector<bool> skip(keys.size(), false);
  std::vector<bool> inconclusive(keys.size(), false);
  for (size_t i = 0; i < keys.size(); ++i) skip[i] = memory_.KnownAbsent(ns, keys[i]);
  std::vector<std::pair<BlockKey, BlockKey>> links;  // (key, parent) of the blocks found
  size_t stored = 0;
  if (gpu_device >= 0 && gpu_links_ != nullptr) {
    stored +=
        FetchOverDeviceLinks(ns, ns_name, keys, gpu_device, order, addresses, skip, found, links);
  }
  for (size_t round = 0; round < kMaxRounds; ++round) {
    std::map<std::string, std::vector<size_t>> by_node;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!found[i] && !skip[i] && round < order[i].size()) by_node[order[i][round]].push_back(i);
    }
    if (by_node.empty()) break;
    for (const auto& asked : by_node) {
      // (Named, not a structured binding: the lambda below uses them, which clang 14 refuses.)
      const std::string& node = asked.first;
      const std::vector<size_t>& indices = asked.second;
      const std::string& address = addresses[node];
      // A peer that failed a moment ago would cost its timeout again: its keys are misses.
      const bool skipped = memory_.Skip(address);
      std::unique_ptr<Client> c = skipped ? nullptr : Checkout(address, ns_name);
      if (c == nullptr) {
        if (!skipped) memory_.Failed(address);  // could not connect
        for (size_t i : indices) inconclusive[i] = true;
        continue;
      }
      // The peer deadline bounds each request, so requests stay small enough to finish well
      // within it: one block first to learn the size, then about kFetchChunkBytes at a time.
      size_t chunk = 1;
      bool failed = false;
      for (size_t start = 0, end = 0; start < indices.size() && !failed; start = end) {
        end = std::min(indices.size(), start + chunk);
        std::vector<BlockKey> ask;
        for (size_t k = start; k < end; ++k) ask.push_back(keys[indices[k]]);
        // Each block is received straight into a slot of the host tier, reserved once the peer
        // has said its size: no private buffer, no copy, no second hash.
        std::vector<Landing> landing(end - start);
        const Client::BufferFor land = [&](size_t k, uint64_t size) -> MutableBuffer {
          Landing& l = landing[k];
          if (!l.asked) {  // (asked again only when the call is retried: the same buffer)
            const size_t i = indices[start + k];
            l = ReserveLanding(ns, keys[i], size);
          }
          return l.Buffer(size);
        };
        Result<std::vector<GetResult>> got = c->GetWith(ask, land);
        if (!got.ok()) {
          VLOG(1) << "fetch from " << node << ": " << got.status().ToString();
          for (const Landing& l : landing) {
            if (l.state == tiers::ReserveState::kReserved) {
              tiers_.Abort(kClusterOwner, l.reservation_id);
            }
          }
          failed = true;  // a dead or slow peer: its remaining blocks are misses this round
          for (size_t k = start; k < indices.size(); ++k) inconclusive[indices[k]] = true;
          break;
        }
        FetchTally tally{found, inconclusive, links};
        SettleLandings(ns, keys, std::span<const size_t>(indices).subspan(start, end - start),
                       landing, *got, tally);
        stored += tally.stored;
        const uint64_t bytes = tally.bytes, blocks = tally.blocks;
        if (blocks > 0) {
          chunk =
              std::clamp<size_t>(kFetchChunkBytes / std::max<uint64_t>(1, bytes / blocks), 1, 256);
        }
      }
      if (failed) {
        memory_.Failed(address);
      } else {
        memory_.Answered(address);
        Return(address, ns_name, std::move(c));
      }
    }
  }
  // A block committed before its parent (asked after it, or in a later request) has no link yet.
  if (!links.empty()) tiers_.LinkUnderParents(ns, links);
  for (size_t i = 0; i < keys.size(); ++i) {
    // Asked of every other member, and none had it.
    if (!found[i] && !skip[i] && !inconclusive[i] && order[i].size() <= kMaxRounds) {
      memory_.Absent(ns, keys[i]);
    }
  }
  return stored;
}

void ClusterNode::Fanout(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  fanout_.push_back(std::move(task));
  fanout_cv_.Signal();
}

void ClusterNode::FanoutLoop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    while (!stopping_ && fanout_.empty()) fanout_cv_.Wait(&mu_);
    if (stopping_) return;
    std::function<void()> task = std::move(fanout_.front());
    fanout_.pop_front();
    mu_.Unlock();
    task();
    mu_.Lock();
  }
}

void ClusterNode::Locate(const std::string& ns_name, std::span<const BlockKey> keys,
                         wire::LocateResponse* out) {
  std::vector<std::pair<std::string, std::string>> peers;  // node id, control address
  {
    absl::MutexLock lock(&mu_);
    if (membership_ == nullptr) return;
    for (const cluster::Member& m : membership_->Members()) {
      if (m.self) {
        for (wire::NodeLocation& n : *out->mutable_nodes()) {
          if (n.self()) n.set_control_address(m.record.control_address);
        }
      } else {  // alive, or stale while we cannot reach etcd: it may still answer
        peers.emplace_back(m.record.node_id, m.record.control_address);
      }
    }
  }
  // One lookup per peer, all at once; each is bounded by the pooled client's own deadlines
  // (connect, then peer_timeout), so the round ends when the slowest peer answers or times out.
  struct Round {
    absl::Mutex mu;
    size_t pending ABSL_GUARDED_BY(mu) = 0;
    std::vector<Result<LookupResult>> results ABSL_GUARDED_BY(mu);
  };
  auto round = std::make_shared<Round>();
  auto chain = std::make_shared<const std::vector<BlockKey>>(keys.begin(), keys.end());
  {
    absl::MutexLock lock(&round->mu);
    round->pending = peers.size();
    round->results.assign(peers.size(), Status::DeadlineExceeded("peer did not answer in time"));
  }
  for (size_t i = 0; i < peers.size(); ++i) {
    Fanout([this, round, chain, ns_name, i, address = peers[i].second] {
      Result<LookupResult> r = Status::Unavailable("cannot connect to " + address);
      if (std::unique_ptr<Client> c = Checkout(address, ns_name)) {
        r = c->Lookup(*chain, /*prefetch=*/false);
        if (r.ok()) Return(address, ns_name, std::move(c));
      }
      absl::MutexLock lock(&round->mu);
      round->results[i] = std::move(r);
      --round->pending;
    });
  }
  const auto waited =
      std::max(options_.peer_timeout * 4, std::chrono::milliseconds(2000)) + options_.peer_timeout;
  absl::MutexLock lock(&round->mu);
  round->mu.AwaitWithTimeout(absl::Condition(
                                 +[](size_t* pending) { return *pending == 0; }, &round->pending),
                             absl::FromChrono(waited));
  for (size_t i = 0; i < peers.size(); ++i) {
    wire::NodeLocation* n = out->add_nodes();
    n->set_node_id(peers[i].first);
    n->set_control_address(peers[i].second);
    const Result<LookupResult>& r = round->results[i];
    if (!r.ok()) {
      n->mutable_status()->set_code(static_cast<int32_t>(r.status().code()));
      n->mutable_status()->set_message(r.status().message());
      continue;
    }
    n->set_hit_blocks(r->hit_blocks);
    for (Tier t : r->tiers) n->add_tiers(static_cast<wire::Tier>(t));
  }
}

BlockKey ClusterNode::SessionKey(const std::string& ns_name, const std::string& session_id) {
  std::string id = "session";
  id += '\0';
  id += ns_name;
  id += '\0';
  id += session_id;
  return NamespaceSalt(id);  // SHA-256 of the bytes
}

void ClusterNode::Enqueue(Job job) {
  absl::MutexLock lock(&mu_);
  if (jobs_.size() > 10000) {
    LOG_EVERY_N(WARNING, 100) << "replication queue full: copies dropped (peers too slow)";
    Count(&Metrics::replication_dropped_queue_full);
    return;
  }
  jobs_.push_back(std::move(job));
  cv_.Signal();
}

void ClusterNode::Retry(Job job) {
  if (++job.attempt > kMaxReplicationAttempts) {
    LOG(WARNING) << "replication to peers gave up after " << kMaxReplicationAttempts
                 << " attempts on "
                 << (job.kind == Job::Kind::kSession
                         ? "session '" + job.session->session_id() + "'"
                         : std::to_string(job.blocks.size()) + " blocks")
                 << " of namespace " << job.ns_name
                 << "; the next membership change offers them again";
    Count(&Metrics::replication_given_up);
    return;
  }
  const auto at =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(500) * (1 << (job.attempt - 1));
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  if (retry_blocks_ + job.blocks.size() + 1 > kMaxRetryBlocks) {
    LOG_EVERY_N(WARNING, 100) << "replication retry queue full: copies dropped (peers too slow)";
    Count(&Metrics::replication_dropped_queue_full);
    return;
  }
  Count(&Metrics::replication_retries);
  retry_blocks_ += job.blocks.size() + 1;
  retries_.emplace(at, std::move(job));
  cv_.Signal();
}

void ClusterNode::Replicate(NamespaceId ns, const std::string& ns_name,
                            std::vector<std::pair<BlockKey, BlockKey>> blocks) {
  if (blocks.empty() || options_.replicas == 0) return;
  Job job;
  job.ns = ns;
  job.ns_name = ns_name;
  job.blocks = std::move(blocks);
  Enqueue(std::move(job));
}

ClusterNode::Job ClusterNode::SessionJob(NamespaceId ns, const std::string& ns_name,
                                         const wire::SessionRecord& record) {
  Job job;
  job.kind = Job::Kind::kSession;
  job.ns = ns;
  job.ns_name = ns_name;
  job.session = std::make_shared<wire::SessionRecord>(record);
  return job;
}

void ClusterNode::ReplicateSession(NamespaceId ns, const std::string& ns_name,
                                   const wire::SessionRecord& record) {
  Enqueue(SessionJob(ns, ns_name, record));
}

RemoteSession ClusterNode::LoadRemoteSession(const std::string& ns_name,
                                             const std::string& session_id) {
  RemoteSession out;
  std::map<std::string, std::string> addresses;
  std::shared_ptr<const cluster::Ring> ring = Ring(&addresses);
  if (ring == nullptr) {
    out.silent = "any home (no cluster view yet)";
    return out;
  }
  LoadSessionOptions options;
  options.prefetch = false;
  options.include_deleted = true;  // a deletion is news too: it must win over older saves
  auto silent = [&out](const std::string& id) {
    if (!out.silent.empty()) out.silent += ", ";
    out.silent += id;
  };
  for (const cluster::NodeId& id :
       ring->Homes(SessionKey(ns_name, session_id), options_.replicas + 1)) {
    if (id == options_.membership.node_id) continue;
    auto it = addresses.find(id);
    // (A member without an address: the view changed between reading the members and the
    // ring. It may hold the session.)
    std::unique_ptr<Client> c = it == addresses.end() ? nullptr : Checkout(it->second, ns_name);
    if (c == nullptr) {
      silent(id);
      continue;
    }
    Result<LoadedSession> s = c->LoadSession(session_id, options);
    if (!s.ok() && !s.status().IsNotFound()) {
      silent(id);  // a dead or slow home: the others
      continue;
    }
    Return(it->second, ns_name, std::move(c));
    if (!s.ok()) continue;
    wire::SessionRecord r;
    r.set_session_id(s->session.session_id);
    for (const BlockKey& k : s->session.keys) r.add_keys(std::string(k.AsStringView()));
    r.set_token_count(s->session.token_count);
    for (const auto& [k, v] : s->session.metadata) (*r.mutable_metadata())[k] = v;
    r.set_created_unix_ms(s->session.created_unix_ms);
    r.set_updated_unix_ms(s->session.updated_unix_ms);
    r.set_total_bytes(s->session.total_bytes);
    r.set_version(s->session.version);
    r.set_origin(s->session.origin);
    r.set_deleted(s->session.deleted);
    if (!out.newest.has_value() || SessionHandlers::Newer(r, *out.newest)) {
      out.newest = std::move(r);
    }
  }
  out.every_home_answered = out.silent.empty();
  return out;
}

bool ClusterNode::BackingOff(const std::string& address) {
  const auto now = std::chrono::steady_clock::now();
  absl::MutexLock lock(&mu_);
  auto it = push_backoff_.find(address);
  if (it == push_backoff_.end()) return false;
  if (now < it->second) return true;
  push_backoff_.erase(it);  // (so entries of peers long gone do not pile up)
  return false;
}

void ClusterNode::BackOff(const std::string& address) {
  absl::MutexLock lock(&mu_);
  push_backoff_[address] = std::chrono::steady_clock::now() + kPushBackoff;
}

std::unique_ptr<Client> ClusterNode::CheckoutForCopy(const std::string& address,
                                                     const std::string& ns_name) {
  if (BackingOff(address)) return nullptr;
  std::unique_ptr<Client> c = Checkout(address, ns_name);
  if (c == nullptr) BackOff(address);
  return c;
}

ClusterNode::Pushed ClusterNode::PushBlocks(NamespaceId ns, const std::string& ns_name,
                                            const std::string& address,
                                            const std::vector<std::pair<BlockKey, BlockKey>>& all,
                                            bool offer_first) {
  std::unique_ptr<Client> c = CheckoutForCopy(address, ns_name);
  if (c == nullptr) return Pushed::kUnreachable;
  auto failed = [&] {
    BackOff(address);
    return Pushed::kUnreachable;
  };
  std::vector<std::pair<BlockKey, BlockKey>> blocks;
  if (offer_first) {
    // Keys first: the peer is sent (and this node reads, from disk too) only what it lacks.
    std::vector<BlockKey> offered;
    for (const auto& [k, p] : all) offered.push_back(k);
    Result<std::vector<Tier>> there = c->Where(offered);
    if (!there.ok()) {
      VLOG(1) << "replication to " << address << ": " << there.status().ToString();
      return failed();
    }
    for (size_t k = 0; k < all.size(); ++k) {
      if ((*there)[k] == Tier::kNone) blocks.push_back(all[k]);
    }
  } else {
    blocks = all;
  }
  std::vector<BlockKey> keys;
  for (const auto& [k, p] : blocks) keys.push_back(k);
  std::vector<tiers::BlockRead> reads = tiers_.Acquire(ns, keys, kClusterOwner);
  std::vector<PutBlock> puts;
  for (size_t k = 0; k < keys.size(); ++k) {
    const tiers::BlockRead& read = reads[k];
    // (Approximate bytes decoded from a lossy disk copy are not sent as the block.)
    if (!read.status.ok() || read.lossy_encoding != 0) continue;
    // Checked here and, with the stored checksum sent along, again by the peer: a damaged copy
    // is never passed on under a fresh hash.
    if (BlockChecksum(read.data, read.size) != read.checksum) {
      LOG(ERROR) << "not replicating block " << keys[k].ShortHex() << " of namespace " << ns_name
                 << " to " << address << ": its copy here does not match its checksum";
      continue;
    }
    puts.push_back({keys[k], read.data, read.size, blocks[k].second, read.checksum});
  }
  // About kFetchChunkBytes per call, so each finishes within the per-request peer deadline.
  bool ok = true;
  bool complete = true;  // every block sent is there (not left to another writer)
  for (size_t start = 0, end = 0; ok && start < puts.size(); start = end) {
    uint64_t bytes = 0;
    end = start;
    while (end < puts.size() && (end == start || bytes + puts[end].size <= kFetchChunkBytes)) {
      bytes += puts[end++].size;
    }
    Result<PutResult> r = c->Put(std::span<const PutBlock>(puts).subspan(start, end - start));
    if (!r.ok()) {
      VLOG(1) << "replication to " << address << ": " << r.status().ToString();
      ok = false;
      continue;
    }
    // Another writer's, there: it may yet give up, so these go again (offered first).
    if (r->in_progress > 0) complete = false;
    for (size_t k = 0; k < r->errors.size(); ++k) {
      if (r->errors[k].code() == StatusCode::kCorruption) {
        LOG(ERROR) << "replica of block " << puts[start + k].key.ShortHex() << " refused by "
                   << address << ": " << r->errors[k].ToString();
      }
    }
  }
  for (tiers::BlockRead& read : reads) tiers_.Release(read);
  if (!ok) return failed();
  Return(address, ns_name, std::move(c));
  return complete ? Pushed::kDone : Pushed::kIncomplete;
}

void ClusterNode::OnViewChange() {
  std::vector<std::string> ids;
  {
    absl::MutexLock lock(&mu_);
    if (membership_ == nullptr) return;
    for (const cluster::Member& m : membership_->Members()) {
      if (m.state == cluster::MemberState::kAlive || m.self) ids.push_back(m.record.node_id);
    }
    std::sort(ids.begin(), ids.end());
    if (ids == last_members_) return;  // an occupancy update, not a membership change
    // Also the first view (a restart rejoining with its disk tier): copies go where they belong.
    if (gpu_links_) gpu_links_->SetLivePeers(ids);  // links to members that left are dropped
    last_members_ = std::move(ids);
    // Debounced: members often come and go in bursts.
    rescan_ = true;
    rescan_at_ = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    cv_.Signal();
  }
}

void ClusterNode::Rereplicate() {
  const std::vector<tiers::TierManager::CachedBlock> blocks = tiers_.SnapshotCached();
  std::map<NamespaceId, std::vector<std::pair<BlockKey, BlockKey>>> by_ns;
  for (const auto& b : blocks) by_ns[b.ns].emplace_back(b.key, b.parent);
  size_t pushed = 0;
  for (auto& [ns, list] : by_ns) {
    const std::string name = options_.namespace_name(ns);
    if (name.empty()) continue;
    for (size_t start = 0; start < list.size(); start += 1024) {
      if (Stopping()) return;
      Job job;
      job.ns = ns;
      job.ns_name = name;
      job.offer_first = true;
      job.blocks.assign(list.begin() + start, list.begin() + std::min(list.size(), start + 1024));
      pushed += job.blocks.size();
      job.blocks = RunBlocks(job);
      if (!job.blocks.empty()) Retry(std::move(job));
    }
  }
  LOG(INFO) << "membership changed: offered " << pushed
            << " cached blocks to their homes (put-if-absent)";
  if (!options_.for_each_session) return;
  // Sessions too, a batch at a time as they are read: each home is asked which records of a
  // batch it would keep (SESSION_VERSIONS, one round trip per home and namespace), and only those
  // are sent, so a membership change costs little where the homes are up to date.
  const auto started = std::chrono::steady_clock::now();
  std::vector<Job> batch;
  size_t batch_keys = 0;
  SessionOffers pass;
  const int64_t now_ms = UnixMillis();
  bool stopping = false;
  options_.for_each_session([&](NamespaceId ns, const wire::SessionRecord& record) {
    if (stopping) return;
    stopping = Stopping();
    const std::string name = options_.namespace_name(ns);
    if (stopping || name.empty() || !SessionHandlers::MayRestore(record, now_ms)) return;
    batch.push_back(SessionJob(ns, name, record));
    batch_keys += static_cast<size_t>(record.keys_size());
    if (batch.size() < kSessionOfferBatch && batch_keys < kSessionOfferBatchKeys) return;
    OfferSessions(batch, &pass);
    batch.clear();
    batch_keys = 0;
  });
  if (!stopping) OfferSessions(batch, &pass);
  LOG(INFO) << "membership changed: offered " << pass.offered << " session records (" << pass.asked
            << " SESSION_VERSIONS asked); sent " << pass.sent
            << " that a home lacked or held older, in "
            << std::chrono::duration_cast<std::chrono::milliseconds>(
                   std::chrono::steady_clock::now() - started)
                   .count()
            << " ms";
}

bool ClusterNode::Stopping() {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

void ClusterNode::OfferSessions(const std::vector<Job>& batch, SessionOffers* pass) {
  if (batch.empty()) return;
  std::map<std::string, std::string> addresses;
  std::shared_ptr<const cluster::Ring> ring = Ring(&addresses);
  if (ring == nullptr) return;
  pass->offered += batch.size();
  // Which records each home (in each namespace) is asked about.
  std::map<std::pair<cluster::NodeId, NamespaceId>, std::vector<size_t>> asks;
  for (size_t i = 0; i < batch.size(); ++i) {
    const Job& job = batch[i];
    for (const cluster::NodeId& node :
         ring->Homes(SessionKey(job.ns_name, job.session->session_id()), options_.replicas + 1)) {
      if (addresses.count(node) > 0) asks[{node, job.ns}].push_back(i);  // not this node
    }
  }
  // Records that did not reach `node` go again later, to that home only.
  auto retry = [&](const cluster::NodeId& node, std::span<const size_t> which) {
    for (size_t i : which) {
      Job again = batch[i];
      again.home = node;
      Retry(std::move(again));
    }
  };
  for (const auto& [home, indices] : asks) {
    const cluster::NodeId& node = home.first;
    if (Stopping()) return;
    if (pass->unreachable.count(node) > 0) {
      retry(node, indices);
      continue;
    }
    const std::string& address = addresses[node];
    const std::string& ns_name = batch[indices.front()].ns_name;
    std::vector<size_t> send;
    if (pass->send_all.count(node) > 0) {
      send = indices;
    } else {
      std::unique_ptr<Client> c = CheckoutForCopy(address, ns_name);
      if (c == nullptr) {
        pass->unreachable.insert(node);
        retry(node, indices);
        continue;
      }
      wire::SessionVersionsRequest req;
      for (size_t i : indices) {
        const wire::SessionRecord& r = *batch[i].session;
        wire::SessionVersion* v = req.add_sessions();
        v->set_session_id(r.session_id());
        v->set_version(r.version());
        v->set_origin(r.origin());
      }
      wire::SessionVersionsResponse resp;
      const Status st = client::PeerCall(*c, req, &resp);
      ++pass->asked;
      if (st.ok()) {
        for (uint32_t w : resp.wanted()) {
          if (w < indices.size()) send.push_back(indices[w]);
        }
        Return(address, ns_name, std::move(c));
      } else if (st.code() == StatusCode::kDeadlineExceeded) {
        BackOff(address);
        pass->unreachable.insert(node);
        retry(node, indices);
        continue;
      } else {
        // An older kvpoold closes the connection on a message type it does not know (Unavailable
        // here) or answers an error: it is sent every record for the rest of the pass, as before
        // SESSION_VERSIONS existed. A home that is really down fails the first send instead.
        LOG(WARNING) << "SESSION_VERSIONS to " << node << ": " << st.ToString()
                     << "; sending it every session record this pass";
        pass->send_all.insert(node);
        send = indices;
        if (st.code() != StatusCode::kUnavailable) Return(address, ns_name, std::move(c));
      }
    }
    for (size_t k = 0; k < send.size(); ++k) {
      if (Stopping()) break;
      if (pass->unreachable.count(node) > 0) {
        retry(node, std::span<const size_t>(send).subspan(k));
        break;
      }
      if (SendSession(batch[send[k]], node, address, &pass->unreachable)) {
        ++pass->sent;
      } else {
        retry(node, std::span<const size_t>(send).subspan(k, 1));
      }
    }
  }
}

void ClusterNode::ReplicateLoop() {
  for (;;) {
    Job job;
    bool rescan = false;
    {
      absl::MutexLock lock(&mu_);
      // New copies first, then retries that are due, then a membership change's rescan.
      for (;;) {
        if (stopping_) return;
        const auto now = std::chrono::steady_clock::now();
        const bool retry_due = !retries_.empty() && retries_.begin()->first <= now;
        // New copies first, but a due retry at least every kNewJobsPerRetry of them.
        if (!jobs_.empty() && !(retry_due && new_since_retry_ >= kNewJobsPerRetry)) {
          job = std::move(jobs_.front());
          jobs_.pop_front();
          ++new_since_retry_;
          break;
        }
        if (retry_due) {
          job = std::move(retries_.begin()->second);
          retries_.erase(retries_.begin());
          retry_blocks_ -= std::min(retry_blocks_, job.blocks.size() + 1);
          new_since_retry_ = 0;
          break;
        }
        if (rescan_ && now >= rescan_at_) {
          rescan_ = false;
          rescan = true;
          break;
        }
        auto until = std::chrono::steady_clock::time_point::max();
        if (!retries_.empty()) until = retries_.begin()->first;
        if (rescan_) until = std::min(until, rescan_at_);
        if (until == std::chrono::steady_clock::time_point::max()) {
          cv_.Wait(&mu_);
        } else {
          cv_.WaitWithTimeout(&mu_, absl::FromChrono(until - now));
        }
      }
    }
    if (rescan) {
      Rereplicate();
    } else if (job.kind == Job::Kind::kBlocks) {
      std::vector<std::pair<BlockKey, BlockKey>> left = RunBlocks(job);
      if (!left.empty()) {
        job.blocks = std::move(left);
        job.offer_first = true;  // some may have arrived before the failure
        Retry(std::move(job));
      }
    } else {
      if (!RunSession(job)) Retry(std::move(job));
    }
  }
}

std::vector<std::pair<BlockKey, BlockKey>> ClusterNode::RunBlocks(const Job& job) {
  std::map<std::string, std::string> addresses;
  std::shared_ptr<const cluster::Ring> ring = Ring(&addresses);
  if (ring == nullptr) return {};
  const std::string& self = options_.membership.node_id;
  // The next `replicas` nodes of each key's order, besides this one.
  std::map<std::string, std::vector<std::pair<BlockKey, BlockKey>>> by_node;
  for (const auto& block : job.blocks) {
    uint32_t picked = 0;
    for (const cluster::NodeId& id : ring->Order(block.first)) {
      if (picked == options_.replicas) break;
      if (id == self || !addresses.count(id)) continue;
      by_node[id].push_back(block);
      ++picked;
    }
  }
  std::set<BlockKey> failed;
  for (const auto& [node, blocks] : by_node) {
    if (PushBlocks(job.ns, job.ns_name, addresses[node], blocks, job.offer_first) !=
        Pushed::kDone) {
      for (const auto& b : blocks) failed.insert(b.first);
    }
  }
  // In the job's order (a chain's parents before their children).
  std::vector<std::pair<BlockKey, BlockKey>> left;
  for (const auto& b : job.blocks) {
    if (failed.count(b.first) > 0) left.push_back(b);
  }
  return left;
}

bool ClusterNode::RunSession(const Job& job) {
  std::map<std::string, std::string> addresses;
  std::shared_ptr<const cluster::Ring> ring = Ring(&addresses);
  if (ring == nullptr) return true;  // no view: nothing to send it to
  bool delivered = true;
  for (const cluster::NodeId& node :
       ring->Homes(SessionKey(job.ns_name, job.session->session_id()), options_.replicas + 1)) {
    auto it = addresses.find(node);
    if (it == addresses.end()) continue;                  // this node (it has it already)
    if (!job.home.empty() && node != job.home) continue;  // a retry for one home
    delivered = SendSession(job, node, it->second, /*failed=*/nullptr) && delivered;
  }
  return delivered;
}

bool ClusterNode::SendSession(const Job& job, const cluster::NodeId& node,
                              const std::string& address, std::set<cluster::NodeId>* failed) {
  if (!job.session->deleted()) {
    // The chain's blocks first: a session pins blocks the node must hold.
    std::vector<std::pair<BlockKey, BlockKey>> chain;
    BlockKey parent;
    for (const std::string& raw : job.session->keys()) {
      Result<BlockKey> k = BlockKey::FromBytes(raw);
      if (!k.ok()) return true;  // a record that cannot be sent as it is: nothing to retry
      chain.emplace_back(*k, parent);
      parent = *k;
    }
    // Not all there: the record would pin blocks the home lacks, so both go again.
    const Pushed pushed = PushBlocks(job.ns, job.ns_name, address, chain, /*offer_first=*/true);
    if (pushed == Pushed::kUnreachable && failed != nullptr) failed->insert(node);
    if (pushed != Pushed::kDone) return false;
  }
  std::unique_ptr<Client> c = CheckoutForCopy(address, job.ns_name);
  if (c == nullptr) {
    if (failed != nullptr) failed->insert(node);
    return false;
  }
  // The record as it is here, version and all: the home keeps it only if it is newer.
  Session s;
  s.session_id = job.session->session_id();
  for (const std::string& raw : job.session->keys()) s.keys.push_back(*BlockKey::FromBytes(raw));
  s.token_count = job.session->token_count();
  for (const auto& [k, v] : job.session->metadata()) s.metadata[k] = v;
  s.created_unix_ms = job.session->created_unix_ms();
  s.updated_unix_ms = job.session->updated_unix_ms();
  s.version = job.session->version();
  s.origin = job.session->origin();
  s.deleted = job.session->deleted();
  const Status st = c->SaveSession(s, SaveSessionOptions{.replica = true});
  if (st.ok() || st.code() != StatusCode::kUnavailable) {
    Return(address, job.ns_name, std::move(c));
  }
  if (!st.ok()) VLOG(1) << "session copy to " << node << ": " << st.ToString();
  const bool unreachable =
      st.code() == StatusCode::kUnavailable || st.code() == StatusCode::kDeadlineExceeded;
  if (unreachable) BackOff(address);
  if (failed != nullptr && unreachable) failed->insert(node);
  return !unreachable;  // (another error, e.g. a refusal, would only repeat)
}

}  // namespace kvpool::daemon
