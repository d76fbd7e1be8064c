#include "daemon/gpu_links.h"

#include <glog/logging.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cstring>

#include "common/packed_keys.h"
#include "common/threads.h"
#include "control.pb.h"
#include "daemon/request_codec.h"
#include "tiers/gpu_tier.h"

namespace kvpool::daemon {
namespace {

// Owns the gpu reservations a fetch over a link makes (never a connection's: those count up
// from 1).
constexpr uint64_t kLinkReceiveOwner = UINT64_MAX - 3;
// The leases of the blocks a link sends: one owner per GPU_SEND, counting up from here.
constexpr uint64_t kFirstSendOwner = uint64_t{1} << 62;

Result<std::string> RandomToken() {
  std::string token(GpuLinks::kTokenBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(token.data()), static_cast<int>(token.size())) !=
      1) {
    return Status::Internal("no random bytes for a device link's token");
  }
  return token;
}

// A failure of the link itself (not of a request): the caller's blocks come over UCX.
Status LinkFailed(const Status& st) {
  return Status::Aborted("device link: " + std::string(st.message()));
}

}  // namespace

GpuLinks::GpuLinks(tiers::TierManager& tiers, transport::DeviceLinks& links, Metrics& metrics,
                   std::chrono::milliseconds timeout)
    : tiers_(tiers),
      links_(links),
      metrics_(metrics),
      timeout_(timeout),
      next_owner_(kFirstSendOwner) {}

void GpuLinks::Stop() {
  std::vector<std::thread> joiners;
  {
    absl::MutexLock lock(&outbound_mu_);
    outbound_stopping_ = true;
    for (auto& [key, out] : outbound_) {
      if (out->joiner.joinable()) joiners.push_back(std::move(out->joiner));
    }
  }
  for (std::thread& t : joiners) t.join();  // each ends by kJoinTimeout
  std::map<std::string, std::unique_ptr<Inbound>> inbound;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    work_.SignalAll();
    inbound.swap(inbound_);
  }
  for (auto& [token, in] : inbound) {
    if (in->worker.joinable()) in->worker.join();
  }
}

uint8_t* GpuLinks::GpuMemory(int device, uint64_t offset, uint64_t size) const {
  for (tiers::GpuTier* gpu : tiers_.gpu_tiers()) {
    if (gpu->device() == device) return gpu->Data({offset, size});
  }
  return nullptr;
}

// ---- The asker's side.

std::shared_ptr<GpuLinks::Outbound> GpuLinks::TakeOutbound(
    const std::tuple<std::string, int, int>& key) {
  std::vector<std::shared_ptr<Outbound>> idle;  // destroyed below, unlocked (a finalize waits)
  std::shared_ptr<Outbound> out;
  {
    absl::MutexLock lock(&outbound_mu_);
    const Clock::time_point now = Clock::now();
    for (auto it = outbound_.begin(); it != outbound_.end();) {
      // (use_count 1: nobody holds it or waits for it.)
      const bool gone = live_peers_.has_value() && !live_peers_->count(std::get<0>(it->first));
      // (use_count 1 first: last_used is the busy holder's, read only when there is none.)
      const Outbound& o = *it->second;
      if (it->second.use_count() != 1 || o.busy || o.joining) {
        ++it;
        continue;
      }
      const bool unused =
          o.joined != nullptr ? now - o.joined_at > kAskerIdle : now - o.last_used > kAskerIdle;
      if (gone || unused) {
        idle.push_back(std::move(it->second));
        it = outbound_.erase(it);
      } else {
        ++it;
      }
    }
    std::shared_ptr<Outbound>& entry = outbound_[key];
    if (entry == nullptr) entry = std::make_shared<Outbound>();
    std::shared_ptr<Outbound> o = entry;  // (the map may change while this waits)
    const absl::Time give_up = absl::Now() + absl::FromChrono(kBusyWait);
    while (o->busy) {
      if (outbound_freed_.WaitWithDeadline(&outbound_mu_, give_up) && o->busy) return nullptr;
    }
    o->busy = true;
    out = o;
  }
  return out;
}

void GpuLinks::SetLivePeers(std::vector<std::string> live) {
  absl::MutexLock lock(&outbound_mu_);
  live_peers_.emplace(live.begin(), live.end());
}

void GpuLinks::GiveBack(const std::shared_ptr<Outbound>& out) {
  absl::MutexLock lock(&outbound_mu_);
  out->busy = false;
  outbound_freed_.SignalAll();
}

Result<bool> GpuLinks::Ready(const std::shared_ptr<Outbound>& out, int device, int peer_device,
                             const std::string& peer_name, Peer& peer) {
  {
    absl::MutexLock lock(&outbound_mu_);
    if (out->joining) return false;
    if (out->joiner.joinable()) out->joiner.join();  // it has ended (joining is false)
    if (out->joined != nullptr) {
      Drop(out->link);
      out->link = std::move(out->joined);
      out->token = std::move(out->joined_token);
      out->next_seq = 0;
      out->last_used = out->joined_at;  // (joined long ago: the peer has closed its side)
    }
    if (out->link != nullptr && !out->link->broken() &&
        Clock::now() - out->last_used <= kAskerIdle) {
      return true;
    }
    Drop(out->link);
    auto b = join_backoff_.find(peer_name);
    if (outbound_stopping_ || (b != join_backoff_.end() && Clock::now() < b->second.until)) {
      return false;
    }
  }
  wire::GpuLinkJoinRequest req;
  Result<std::string> id = links_.NewId();
  Status st = id.status();
  if (st.ok()) {
    Result<std::string> token = RandomToken();
    st = token.status();
    if (st.ok()) req.set_token(*token);
  }
  if (st.ok()) {
    req.set_link_id(*id);
    req.set_device(peer_device);
    // The peer starts joining on its worker and answers; this side joins on a thread of its own,
    // and both ranks meet within kJoinTimeout.
    st = peer.Join(req);
  }
  absl::MutexLock lock(&outbound_mu_);
  if (!st.ok()) {
    // (A refused join leaves the id's NCCL bootstrap waiting for ranks that never come: this
    // must not repeat on every miss.)
    BackOffLocked(peer_name);
    return LinkFailed(st);
  }
  if (outbound_stopping_) return false;
  // (The joiner cannot clear `joining` before this hold of the lock ends.)
  out->joiner = StartThread(ThreadRole::kGpuLink, next_joiner_++,
                            [this, out, id = *id, token = req.token(), device, peer_name] {
                              JoinInBackground(out, id, token, device, peer_name);
                            });
  out->joining = true;
  return false;
}

void GpuLinks::BackOffLocked(const std::string& peer_name) {
  Backoff& b = join_backoff_[peer_name];
  b.failures = std::min(b.failures + 1, 7);
  b.until = Clock::now() + std::chrono::seconds(1 << (b.failures - 1));  // 1 s .. 64 s
  metrics_.Add(metrics_.gpu_link_failures);
}

void GpuLinks::JoinInBackground(const std::shared_ptr<Outbound>& out, const std::string& id,
                                const std::string& token, int device,
                                const std::string& peer_name) {
  Result<std::unique_ptr<transport::DeviceLink>> link =
      links_.Join(id, 2, 0, device, Clock::now() + kJoinTimeout);
  absl::MutexLock lock(&outbound_mu_);
  if (link.ok()) {
    out->joined = std::move(link).value();
    out->joined_token = token;
    out->joined_at = Clock::now();
  } else {
    BackOffLocked(peer_name);
    LOG(WARNING) << "joining a device link to " << peer_name
                 << " failed: " << link.status().ToString();
  }
  out->joining = false;
}

Result<std::vector<bool>> GpuLinks::Receive(NamespaceId ns, std::span<const BlockKey> keys,
                                            int device, const std::string& peer_name, Peer& peer,
                                            std::vector<std::pair<BlockKey, BlockKey>>& links) {
  std::vector<bool> stored(keys.size(), false);
  if (GpuMemory(device, 0, 0) == nullptr) {
    return Status::InvalidArgument("no gpu tier on CUDA device " + std::to_string(device));
  }
  {
    absl::MutexLock lock(&outbound_mu_);
    auto b = join_backoff_.find(peer_name);
    if (b != join_backoff_.end() && Clock::now() < b->second.until) return stored;
  }
  wire::GpuOfferRequest offer_req;
  PackKeys(keys, offer_req.mutable_packed_keys());
  wire::GpuOfferResponse offers;
  KVPOOL_RETURN_IF_ERROR(peer.Offer(offer_req, &offers));
  if (offers.offers_size() != static_cast<int>(keys.size())) {
    return Status::Internal("a peer's GPU_OFFER answered " + std::to_string(offers.offers_size()) +
                            " blocks for " + std::to_string(keys.size()));
  }
  // One link, so one of the peer's GPUs: the one holding most of them. The rest are the
  // caller's to fetch over UCX.
  std::map<int, size_t> per_device;
  for (const wire::GpuOffer& o : offers.offers()) {
    if (o.device() >= 0) ++per_device[o.device()];
  }
  if (per_device.empty()) return stored;
  const int peer_device =
      std::max_element(per_device.begin(), per_device.end(), [](const auto& a, const auto& b) {
        return a.second < b.second;
      })->first;

  std::shared_ptr<Outbound> out = TakeOutbound({peer_name, device, peer_device});
  if (out == nullptr) return stored;  // another fetch holds the link: UCX this time
  struct Taken {
    GpuLinks& links;
    const std::shared_ptr<Outbound>& out;
    ~Taken() { links.GiveBack(out); }
  } taken{*this, out};
  KVPOOL_ASSIGN_OR_RETURN(const bool ready, Ready(out, device, peer_device, peer_name, peer));
  if (!ready) return stored;  // being joined: UCX this time

  // Slots in this daemon's gpu tier for what the peer offers, reserved only now that the link is
  // ours (so they are not held while another fetch uses it); nothing waits for room here.
  std::vector<size_t> asked;  // indices into keys
  std::vector<tiers::PutRequestItem> items;
  for (size_t i = 0; i < keys.size(); ++i) {
    const wire::GpuOffer& o = offers.offers(static_cast<int>(i));
    if (o.device() != peer_device || o.size() == 0) continue;
    tiers::PutRequestItem item;
    item.key = keys[i];
    item.size = o.size();
    // As the peer's put named it (absent or malformed: none).
    Result<BlockKey> parent = BlockKey::FromBytes(o.parent());
    if (parent.ok()) item.parent = *parent;
    items.push_back(item);
    asked.push_back(i);
  }
  const std::vector<tiers::ReserveOutcome> reserved = tiers_.Reserve(
      ns, kLinkReceiveOwner, items, {.may_wait = false, .durable = false, .gpu_device = device});
  struct Slot {
    size_t index;  // into keys
    uint64_t reservation_id;
    uint8_t* data;
    uint64_t size;
    uint64_t device_checksum;
    BlockKey parent;  // as the peer named it (zero: none)
  };
  std::vector<Slot> slots;
  for (size_t k = 0; k < reserved.size(); ++k) {
    const tiers::ReserveOutcome& r = reserved[k];
    if (r.state != tiers::ReserveState::kReserved) continue;  // here already, or no room
    uint8_t* data =
        r.gpu_device == device ? GpuMemory(device, r.gpu_offset, items[k].size) : nullptr;
    // The link writes into the slot through a raw pointer until the transfer ends: the
    // reservation must not expire under it (TargetOf pins it; only Commit or Abort end it now).
    if (data == nullptr || !tiers_.TargetOf(kLinkReceiveOwner, r.reservation_id).ok()) {
      tiers_.Abort(kLinkReceiveOwner, r.reservation_id);  // a host slot only: not for a link
      continue;
    }
    const size_t i = asked[k];
    slots.push_back({i, r.reservation_id, data, items[k].size,
                     offers.offers(static_cast<int>(i)).device_checksum(), items[k].parent});
  }
  if (slots.empty()) return stored;
  auto abort_all = [&] {
    for (const Slot& s : slots) tiers_.Abort(kLinkReceiveOwner, s.reservation_id);
  };

  wire::GpuSendRequest send_req;
  send_req.set_token(out->token);
  send_req.set_seq(out->next_seq++);
  std::vector<BlockKey> send_keys;
  for (const Slot& s : slots) {
    send_keys.push_back(keys[s.index]);
    send_req.add_sizes(s.size);
    send_req.add_device_checksums(s.device_checksum);
  }
  PackKeys(send_keys, send_req.mutable_packed_keys());
  wire::GpuSendResponse sending;
  Status st = peer.Send(send_req, &sending);
  if (st.ok() && sending.sending_size() != static_cast<int>(slots.size())) {
    st = Status::Internal("a peer's GPU_SEND answered for the wrong number of blocks");
  }
  out->last_used = Clock::now();
  if (!st.ok()) {
    // The peer may have queued sends no receive will meet: the link is out of step.
    abort_all();
    Drop(out->link);
    absl::MutexLock lock(&outbound_mu_);
    BackOffLocked(peer_name);
    return LinkFailed(st);
  }
  std::vector<transport::DeviceLink::Op> ops;
  std::vector<Slot> coming;
  for (size_t k = 0; k < slots.size(); ++k) {
    if (sending.sending(static_cast<int>(k))) {
      ops.push_back({false, 1, slots[k].data, slots[k].size});
      coming.push_back(slots[k]);
    } else {
      tiers_.Abort(kLinkReceiveOwner, slots[k].reservation_id);  // gone from its gpu meanwhile
    }
  }
  slots = std::move(coming);
  if (slots.empty()) return stored;
  st = out->link->Transfer(ops, nullptr, Clock::now() + timeout_);
  out->last_used = Clock::now();
  if (!st.ok()) {
    abort_all();
    Drop(out->link);  // broken: a later fetch joins a new one
    LOG(WARNING) << "device link to " << peer_name << " failed (its blocks are fetched over "
                 << "UCX instead): " << st.ToString();
    absl::MutexLock lock(&outbound_mu_);
    BackOffLocked(peer_name);
    return LinkFailed(st);
  }
  {
    absl::MutexLock lock(&outbound_mu_);
    join_backoff_.erase(peer_name);  // the link works
  }
  // Each slot is checked on this GPU against the device checksum the peer gave.
  std::vector<uint64_t> ids, checksums;
  for (const Slot& s : slots) {
    ids.push_back(s.reservation_id);
    checksums.push_back(s.device_checksum);
  }
  const std::vector<Status> committed = tiers_.CommitToGpu(kLinkReceiveOwner, ids, checksums);
  uint64_t blocks = 0, bytes = 0;
  for (size_t k = 0; k < slots.size(); ++k) {
    if (committed[k].ok()) {
      stored[slots[k].index] = true;
      ++blocks;
      bytes += slots[k].size;
      if (!slots[k].parent.IsZero()) links.emplace_back(keys[slots[k].index], slots[k].parent);
    } else if (committed[k].code() == StatusCode::kCorruption) {
      metrics_.Add(metrics_.gpu_link_checksum_failures);
    }
  }
  metrics_.Add(metrics_.gpu_link_blocks_received, blocks);
  metrics_.Add(metrics_.gpu_link_bytes_received, bytes);
  return stored;
}

// ---- The peer's side.

std::vector<std::unique_ptr<GpuLinks::Inbound>> GpuLinks::ReapLocked() {
  std::vector<std::unique_ptr<Inbound>> ended;
  for (auto it = inbound_.begin(); it != inbound_.end();) {
    if (it->second->done) {
      ended.push_back(std::move(it->second));
      it = inbound_.erase(it);
    } else {
      ++it;
    }
  }
  return ended;
}

Status GpuLinks::Accept(const std::string& token, const std::string& link_id, int device) {
  if (token.size() != kTokenBytes) {
    return Status::InvalidArgument("a device link's token is " + std::to_string(kTokenBytes) +
                                   " bytes");
  }
  if (GpuMemory(device, 0, 0) == nullptr) {
    return Status::FailedPrecondition("no gpu tier on CUDA device " + std::to_string(device) +
                                      " here");
  }
  std::vector<std::unique_ptr<Inbound>> ended;
  Status st;
  {
    absl::MutexLock lock(&mu_);
    ended = ReapLocked();
    if (stopping_) {
      st = Status::Unavailable("kvpoold is stopping");
    } else if (inbound_.count(token)) {
      st = Status::InvalidArgument("this link token is taken");
    } else if (inbound_.size() >= kMaxAcceptedLinks) {
      st = Status::ResourceExhausted("too many device links (" + std::to_string(kMaxAcceptedLinks) +
                                     ")");
    } else {
      auto in = std::make_unique<Inbound>();
      in->link_id = link_id;
      in->device = device;
      Inbound* raw = in.get();
      inbound_[token] = std::move(in);
      raw->worker =
          StartThread(ThreadRole::kGpuLink, next_worker_++, [this, raw] { WorkerMain(raw); });
    }
  }
  for (auto& in : ended) in->worker.join();  // each has ended, or is about to
  return st;
}

void GpuLinks::WorkerMain(Inbound* in) {
  Result<std::unique_ptr<transport::DeviceLink>> joined =
      links_.Join(in->link_id, 2, 1, in->device, Clock::now() + kJoinTimeout);
  std::unique_ptr<transport::DeviceLink> link;
  if (joined.ok()) {
    link = std::move(joined).value();
  } else {
    LOG(WARNING) << "joining a peer's device link failed: " << joined.status().ToString();
    metrics_.Add(metrics_.gpu_link_failures);
  }
  mu_.Lock();
  while (link != nullptr) {
    const absl::Time idle_until = absl::Now() + absl::FromChrono(kPeerIdle);
    while (!stopping_ && !in->closing && in->jobs.empty()) {
      if (work_.WaitWithDeadline(&mu_, idle_until)) break;
    }
    if (stopping_ || in->closing || in->jobs.empty()) break;  // (empty: unused for kPeerIdle)
    Job job = std::move(in->jobs.front());
    in->jobs.pop_front();
    mu_.Unlock();
    // A job whose deadline passed while queued has no receives waiting for it any more.
    const Status st = Clock::now() < job.deadline
                          ? link->Transfer(job.ops, nullptr, job.deadline)
                          : Status::DeadlineExceeded("queued past its deadline");
    tiers_.ReleaseOwner(job.owner);
    if (st.ok()) {
      metrics_.Add(metrics_.gpu_link_blocks_sent, job.blocks);
      metrics_.Add(metrics_.gpu_link_bytes_sent, job.bytes);
    } else {
      metrics_.Add(metrics_.gpu_link_failures);
      LOG(WARNING) << "sending over a peer's device link failed: " << st.ToString();
    }
    mu_.Lock();
    if (!st.ok()) break;
  }
  std::deque<Job> left;
  left.swap(in->jobs);
  in->done = true;  // from here the worker touches nothing of `in`
  mu_.Unlock();
  for (const Job& job : left) tiers_.ReleaseOwner(job.owner);
  Drop(link);  // (not under mu_)
}

void GpuLinks::Offer(NamespaceId ns, std::span<const BlockKey> keys,
                     wire::GpuOfferResponse* out) const {
  for (const tiers::GpuCopyInfo& c : tiers_.GpuCopies(ns, keys)) {
    wire::GpuOffer* o = out->add_offers();
    o->set_device(c.device);
    o->set_size(c.size);
    o->set_device_checksum(c.device_checksum);
    if (!c.parent.IsZero()) o->set_parent(std::string(c.parent.AsStringView()));
  }
}

Result<std::vector<bool>> GpuLinks::Send(NamespaceId ns, const std::string& token, uint64_t seq,
                                         std::span<const BlockKey> keys,
                                         std::span<const uint64_t> sizes,
                                         std::span<const uint64_t> checksums) {
  if (sizes.size() != keys.size() || checksums.size() != keys.size()) {
    return Status::InvalidArgument("GPU_SEND needs a size and a device checksum per key");
  }
  int device = -1;
  uint64_t owner = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = inbound_.find(token);
    if (stopping_ || it == inbound_.end() || it->second->done || it->second->closing) {
      return Status::NotFound("no such device link here (it ended or was never joined)");
    }
    Inbound& in = *it->second;
    if (seq != in.next_seq) {
      in.closing = true;
      work_.SignalAll();
      return Status::Aborted("GPU_SEND " + std::to_string(seq) + " on a link expecting " +
                             std::to_string(in.next_seq) + ": the link ends, join a new one");
    }
    ++in.next_seq;
    device = in.device;
    owner = next_owner_++;
  }
  std::vector<bool> sending(keys.size(), false);
  // Only blocks still in this link's gpu tier as offered are leased (so nothing waits here for
  // a disk read): the lease waits at most for a block put into gpu whose host copy its GPU's copy
  // worker is making. Leased until the worker has sent them (or the lease outlives a stuck
  // transfer).
  const std::vector<tiers::GpuCopyInfo> held = tiers_.GpuCopies(ns, keys);
  std::vector<size_t> asked;
  std::vector<BlockKey> asked_keys;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (held[i].device == device && held[i].size == sizes[i] &&
        held[i].device_checksum == checksums[i]) {
      asked.push_back(i);
      asked_keys.push_back(keys[i]);
    }
  }
  std::vector<tiers::BlockRead> reads = tiers_.Acquire(ns, asked_keys, owner, 2 * timeout_,
                                                       /*keep_encoding=*/false, GpuReach{device});
  Job job;
  job.owner = owner;
  job.deadline = Clock::now() + timeout_;
  for (size_t k = 0; k < reads.size(); ++k) {
    tiers::BlockRead& r = reads[k];
    const size_t i = asked[k];
    uint8_t* data = nullptr;
    if (r.status.ok() && r.from == Tier::kGpu && r.gpu_device == device && r.size == sizes[i] &&
        r.device_checksum == checksums[i]) {
      data = GpuMemory(device, r.gpu_offset, r.size);
    }
    if (data == nullptr) {
      tiers_.Release(r);
      continue;
    }
    sending[i] = true;
    job.ops.push_back({true, 0, data, r.size});
    ++job.blocks;
    job.bytes += r.size;
  }
  if (job.ops.empty()) {
    tiers_.ReleaseOwner(owner);
    return sending;
  }
  absl::MutexLock lock(&mu_);
  auto it = inbound_.find(token);
  if (stopping_ || it == inbound_.end() || it->second->done || it->second->closing) {
    tiers_.ReleaseOwner(owner);
    return Status::NotFound("the device link ended");
  }
  it->second->jobs.push_back(std::move(job));
  work_.SignalAll();
  return sending;
}

}  // namespace kvpool::daemon
