#include "daemon/block_handlers.h"

#include <glog/logging.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "common/hello_auth.h"
#include "control.pb.h"
#include "daemon/gpu_links.h"
#include "daemon/request_codec.h"
#include "daemon/shm_delivery.h"
#include "daemon/socket_delivery.h"
#include "daemon/ucx_delivery.h"
#include "transport/address.h"
#include "transport/arena_message.h"

namespace kvpool::daemon {

using transport::PayloadSink;
using transport::Response;

BlockHandlers::BlockHandlers(const BlockServiceOptions& options, tiers::TierManager& tiers,
                             NamespaceRegistry& namespaces, Metrics& metrics, UcxListener* ucx,
                             const ClusterRef& cluster, const AccessControl& access)
    : options_(options),
      tiers_(tiers),
      namespaces_(namespaces),
      metrics_(metrics),
      ucx_(ucx),
      cluster_(cluster),
      access_(access) {}

namespace {
// The IP address of a TCP connection's peer (transport::CanonicalIp form); empty for a Unix
// socket.
std::string PeerIp(const transport::ConnectionInfo& info) {
  constexpr std::string_view kTcp = "tcp:";
  const std::string_view peer = info.peer;
  const size_t port = peer.rfind(':');
  if (peer.substr(0, kTcp.size()) != kTcp || port == std::string_view::npos ||
      port <= kTcp.size()) {
    return "";
  }
  return transport::CanonicalIp(peer.substr(kTcp.size(), port - kTcp.size()));
}
}  // namespace

Response BlockHandlers::Hello(Connection& c, std::string_view body) {
  wire::HelloRequest req;
  wire::HelloResponse resp;
  resp.set_protocol_version(transport::kProtocolVersion);
  resp.set_daemon_version(options_.version);
  resp.set_node_id(options_.node_id);
  resp.set_max_block_bytes(tiers_.max_block_bytes());
  // One frame's payload is also what a client reserves in the host tier at once: keep it to a
  // quarter of the tier so reservations in flight never crowd out committed blocks.
  resp.set_max_payload_bytes(std::max<uint64_t>(
      tiers_.max_block_bytes(),
      std::min<uint64_t>(options_.limits.max_payload_bytes, tiers_.host_capacity_bytes() / 4)));
  resp.set_max_body_bytes(options_.limits.max_body_bytes);
  resp.set_max_batch_keys(options_.max_batch_keys);
  Status st = Parse(body, &req, "HELLO");
  if (st.ok() && req.protocol_version() != transport::kProtocolVersion) {
    st = Status::FailedPrecondition("client speaks protocol " +
                                    std::to_string(req.protocol_version()) + ", daemon speaks " +
                                    std::to_string(transport::kProtocolVersion));
  }
  if (st.ok() && c.hello && req.namespace_name() != c.ns_name) {
    st = Status::PermissionDenied("a connection cannot change its namespace");
  }
  if (st.ok() && c.hello && req.admin() && !c.admin) {
    st = Status::PermissionDenied("a connection cannot gain admin rights after its hello");
  }
  bool challenged = false;
  bool proved_cluster_secret = false;
  std::string refused_detail;  // the refusal in full, for the log (HelloVerdict::detail)
  if (st.ok() && !c.hello) {
    HelloClaim claim;
    claim.namespace_name = req.namespace_name();
    claim.admin = req.admin();
    claim.challenge = c.challenge;
    claim.proof = req.auth();
    claim.client_challenge = req.client_challenge();
    claim.local = c.info.local;
    claim.credentials = c.info.credentials ? &*c.info.credentials : nullptr;
    const HelloVerdict v = access_.Admit(claim);
    if (v.outcome == HelloVerdict::Outcome::kAdmitted) {
      c.admin = v.admin;
      proved_cluster_secret = v.peer;
      resp.set_server_proof(v.server_proof);
    } else if (v.outcome == HelloVerdict::Outcome::kProve && c.challenge.empty()) {
      VLOG(1) << "connection " << c.info.id << " (" << c.info.peer << ") challenged: " << v.detail;
      // The client may answer this connection's challenge with a proof of its credential.
      c.challenge = NewHelloChallenge();
      resp.set_challenge(c.challenge);
      st = Status::PermissionDenied(v.reason);
      challenged = true;
    } else {
      st = Status::PermissionDenied(v.reason);
      refused_detail = v.detail;
    }
  }
  if (st.ok()) {
    Result<NamespaceId> ns = namespaces_.Resolve(req.namespace_name());
    if (ns.ok()) {
      if (!c.hello) {
        // Another kvpoold: it proved the cluster secret and says so (a remote worker that holds
        // the secret is still a worker: its puts are replicated). A repeated hello keeps it.
        c.peer = proved_cluster_secret && req.client_name() == "kvpool-peer";
      }
      c.hello = true;
      c.ns = *ns;
      c.ns_name = req.namespace_name();
      resp.set_admin(c.admin);
      // The data paths, socket at the bottom (daemon/delivery.h).
      const bool shm = req.shared_memory() && c.info.local && options_.shared_memory;
      std::unique_ptr<BlockDelivery> delivery = std::make_unique<SocketDelivery>(tiers_, c.owner);
      if (shm) {
        delivery = std::make_unique<SharedMemoryDelivery>(tiers_, c.owner, options_.lease_timeout,
                                                          std::move(delivery));
      }
      resp.set_shared_memory(shm);
      resp.set_segment_bytes(tiers_.segment_bytes());
      if (shm) {
        for (const tiers::GpuTier* g : tiers_.gpu_tiers()) {
          wire::GpuTierInfo* info = resp.add_gpu_tiers();
          info->set_device(g->device());
          info->set_segment_bytes(g->segment_bytes());
          info->set_capacity_bytes(g->capacity_bytes());
          info->set_uuid(g->uuid());
        }
      }
      resp.set_lease_timeout_ms(static_cast<uint32_t>(options_.lease_timeout.count()));
      if (c.ucx != nullptr) {
        // A repeated hello: the UCX endpoint stays (it is not granted again).
        c.ucx->ReplaceBelow(std::move(delivery));
      } else {
        // UCX is granted by UCX_BIND, on the endpoint the client makes to our listener; offered
        // to TCP connections (same-node clients have shared memory), once per connection.
        const std::string ip = PeerIp(c.info);
        if (!c.ucx_offered && req.ucx() && ucx_ != nullptr && !ip.empty()) {
          c.ucx_offered = ucx_->Offer(ip, req.ucx_client_id());
        }
        if (c.ucx_offered) resp.set_ucx_port(ucx_->port());
        c.delivery = std::move(delivery);
      }
    } else {
      st = ns.status();
    }
  }
  Response r = Reply(wire::HELLO, resp, st);
  if (!st.ok() && !challenged) {
    metrics_.Add(metrics_.requests_failed);
    LOG(INFO) << "hello refused on connection " << c.info.id << " (" << c.info.peer
              << "): " << (refused_detail.empty() ? st.ToString() : refused_detail);
    r.close_after = true;
  }
  return r;
}

Response BlockHandlers::UcxBind(Connection& c, std::string_view body) {
  wire::UcxBindRequest req;
  wire::UcxBindResponse resp;
  Status st = Parse(body, &req, "UCX_BIND");
  if (st.ok() && !c.ucx_offered) {
    st = Status::FailedPrecondition("UCX was not offered to this connection (ask in HELLO)");
  }
  if (st.ok() && c.ucx != nullptr) {
    st = Status::FailedPrecondition("this connection has its UCX endpoint already");
  }
  Result<transport::UcxEndpointId> ep = Status::OK();
  if (st.ok()) {
    ep = ucx_->Claim(req.nonce(), PeerIp(c.info));
    st = ep.status();
  }
  if (st.ok()) {
    std::unique_ptr<UcxDelivery> u = UcxDelivery::Adopt(
        ucx_->engine(), *ep, ucx_->HoldTagPrefix(c.info.id), tiers_, c.owner, options_.ucx_timeout,
        options_.ucx_max_unreceived_bytes, std::move(c.delivery));
    c.ucx = u.get();
    resp.set_ucx_tag_prefix(c.ucx->tag_prefix());
    c.delivery = std::move(u);
  } else {
    metrics_.Add(metrics_.requests_failed);
    LOG(INFO) << "connection " << c.info.id << " (" << c.info.peer
              << "): UCX not bound: " << st.ToString();
  }
  return Reply(wire::UCX_BIND, resp, st);
}

Response BlockHandlers::Lookup(Connection& c, std::string_view body) {
  wire::LookupRequest req;
  wire::LookupResponse resp;
  std::vector<BlockKey> keys;
  Status st = Parse(body, &req, "LOOKUP");
  if (st.ok()) st = DecodeKeysOf(req.keys(), req.packed_keys(), options_.max_batch_keys, &keys);
  if (st.ok() && req.each_key()) {
    uint32_t cached = 0;
    for (Tier t : tiers_.Where(c.ns, keys)) {
      resp.add_tiers(ToWire(t));
      cached += t != Tier::kNone;
    }
    resp.set_hit_blocks(cached);
    metrics_.Add(metrics_.lookups);
    return Reply(wire::LOOKUP, resp, st);
  }
  if (st.ok()) {
    tiers::LookupResult lr = tiers_.Lookup(c.ns, keys, !req.no_prefetch());
    ClusterHooks* cluster = cluster_.Get();
    if (cluster != nullptr && !c.peer && lr.hit_blocks < keys.size() &&
        cluster->FetchMissing(c.ns, c.ns_name,
                              std::span<const BlockKey>(keys).subspan(lr.hit_blocks),
                              /*gpu_device=*/-1) > 0) {
      // Some of the rest came from the blocks' home nodes and are cached here now.
      lr = tiers_.Lookup(c.ns, keys, !req.no_prefetch());
    }
    resp.set_hit_blocks(lr.hit_blocks);
    for (Tier t : lr.tiers) resp.add_tiers(ToWire(t));
    metrics_.Add(metrics_.lookups);
    metrics_.Add(metrics_.lookup_blocks, keys.size());
    metrics_.Add(metrics_.lookup_hit_blocks, lr.hit_blocks);
  } else {
    metrics_.Add(metrics_.requests_failed);
  }
  return Reply(wire::LOOKUP, resp, st);
}

Response BlockHandlers::Get(Connection& c, std::string_view body) {
  return *GetBlocks(c, body, /*inline_only=*/false);
}

std::optional<Response> BlockHandlers::TryGetInline(Connection& c, std::string_view body) {
  return GetBlocks(c, body, /*inline_only=*/true);
}

std::optional<Response> BlockHandlers::GetBlocks(Connection& c, std::string_view body,
                                                 bool inline_only) {
  wire::GetRequest req;
  // Built without an allocation per block (transport/arena_message.h).
  transport::ArenaMessage<wire::GetResponse> answer;
  wire::GetResponse& resp = *answer;
  std::vector<BlockKey> keys;
  Status st = Parse(body, &req, "GET");
  if (st.ok()) st = DecodeKeysOf(req.keys(), req.packed_keys(), options_.max_batch_keys, &keys);
  const PathAsk ask{req.in_place(), req.via_ucx(), req.ucx_tag_base()};
  BlockDelivery& delivery = *c.delivery;
  if (st.ok()) st = delivery.Check(ask);
  if (!st.ok()) {
    metrics_.Add(metrics_.requests_failed);
    return Reply(wire::GET, resp, st);
  }
  // A UCX send and a read of an encoded copy are a worker's to run; so is a miss a peer may hold
  // (BlockService::TryInline asks only without a cluster).
  if (inline_only && (ask.via_ucx || req.accept_encoded())) return std::nullopt;
  const LeaseTerms terms = delivery.TermsFor(ask);
  // Gpu slots only in place (the shared-memory path checked above names them to the client).
  GpuReach gpu;
  if (req.to_gpu() && ask.in_place) {
    gpu.device = req.gpu_device();
    for (int32_t d : req.peer_gpu_devices()) {
      if (d < 0 || d > GpuReach::kMaxPeerDevice) {
        metrics_.Add(metrics_.requests_failed);
        return Reply(
            wire::GET, resp,
            Status::InvalidArgument("GET names peer gpu device " + std::to_string(d) + " (0-" +
                                    std::to_string(GpuReach::kMaxPeerDevice) + ")"));
      }
      gpu.peers |= uint64_t{1} << d;
    }
  }
  const int gpu_device = gpu.device;
  std::vector<tiers::BlockRead> acquired;
  if (inline_only) {
    std::optional<std::vector<tiers::BlockRead>> held =
        tiers_.TryAcquireInHost(c.ns, keys, terms.owner, terms.ttl, gpu);
    if (!held) return std::nullopt;  // the worker's attempt calls BeginGet, once
    delivery.BeginGet();
    acquired = std::move(*held);
  } else {
    delivery.BeginGet();
    acquired = tiers_.Acquire(c.ns, keys, terms.owner, terms.ttl, req.accept_encoded(), gpu);
  }
  auto reads = std::make_shared<std::vector<tiers::BlockRead>>(std::move(acquired));
  if (ClusterHooks* cluster = cluster_.Get(); cluster != nullptr && !c.peer) {
    std::vector<BlockKey> missing;
    std::vector<size_t> where;
    for (size_t i = 0; i < keys.size(); ++i) {
      if ((*reads)[i].status.IsNotFound()) {
        missing.push_back(keys[i]);
        where.push_back(i);
      }
    }
    if (!missing.empty() && cluster->FetchMissing(c.ns, c.ns_name, missing, gpu_device) > 0) {
      std::vector<tiers::BlockRead> again =
          tiers_.Acquire(c.ns, missing, terms.owner, terms.ttl, req.accept_encoded(), gpu);
      std::vector<BlockKey> to_gpu;
      for (size_t k = 0; k < where.size(); ++k) {
        if (gpu_device >= 0 && again[k].status.ok() && again[k].from != Tier::kGpu) {
          to_gpu.push_back(missing[k]);
        }
        (*reads)[where[k]] = std::move(again[k]);
      }
      // A remote hit for a reader on a GPU with a gpu tier here came device to device into that
      // gpu tier where the peer held it in one and both have device links. Otherwise this read
      // copies it from host (arriving over UCX, it is in host already), and it is placed in the
      // gpu tier behind the read, so the next reader on that GPU copies device to device.
      PlaceOnGpuBehind(c.ns, to_gpu, gpu_device, "GET (remote hits)");
    }
  }
  // A peer daemon fetching these links each under its parent (BlockInfo.parent).
  const std::vector<BlockKey> parents =
      c.peer ? tiers_.Parents(c.ns, keys) : std::vector<BlockKey>{};
  Response r;
  uint64_t payload = 0;
  uint64_t served = 0;
  uint64_t misses = 0;
  for (tiers::BlockRead& read : *reads) {
    wire::BlockInfo* info = resp.add_blocks();
    if (!read.status.ok()) {
      info->set_code(static_cast<int32_t>(read.status.code()));
      if (read.status.IsNotFound()) ++misses;
      continue;
    }
    if (delivery.BoundedByFrame(ask) && payload + read.size > options_.limits.max_payload_bytes) {
      tiers_.Release(read);
      read.owned.reset();
      if (payload == 0) {
        // Alone it does not fit a frame (a block put under a larger --host_segment_size): asking
        // again would not help.
        info->set_code(static_cast<int32_t>(StatusCode::kInvalidArgument));
        continue;
      }
      // Past what one frame may carry: the client asks again for these.
      info->set_code(static_cast<int32_t>(StatusCode::kResourceExhausted));
      continue;
    }
    info->set_code(0);
    info->set_size(read.size);
    info->set_checksum(read.checksum);
    info->set_tier(ToWire(read.from));
    info->set_lossy_encoding(read.lossy_encoding);
    if (const size_t i = resp.blocks_size() - 1; i < parents.size() && !parents[i].IsZero()) {
      info->set_parent(std::string(parents[i].AsStringView()));
    }
    if (read.encoding != 0) {
      info->set_encoding(read.encoding);
      wire::BlockLayout* l = info->mutable_layout();
      l->set_layers(read.layout.num_layers);
      l->set_kv_heads(read.layout.num_kv_heads);
      l->set_head_dim(read.layout.head_dim);
      l->set_tokens(read.layout.tokens);
      l->set_dtype(static_cast<int32_t>(read.layout.dtype));
      l->set_encoding(static_cast<int32_t>(read.layout.encoding));
    }
    payload += delivery.Send(ask, static_cast<uint32_t>(resp.blocks_size() - 1), read, info, &r);
    ++served;
  }
  metrics_.Add(metrics_.gets);
  metrics_.Add(metrics_.get_blocks_served, served);
  metrics_.Add(metrics_.get_misses, misses);
  metrics_.Add(metrics_.bytes_out, payload);
  SetStatus(resp.mutable_status(), Status::OK());
  r.type = wire::GET;
  resp.SerializeToString(&r.body);
  // What the delivery did not take (in-frame leases, disk copies) ends once the frame is out.
  tiers::TierManager* tiers = &tiers_;
  r.release = [tiers, reads] {
    for (tiers::BlockRead& read : *reads) tiers->Release(read);
  };
  return r;
}

Response BlockHandlers::PutReserve(Connection& c, std::string_view body) {
  return *ReserveBlocks(c, body, /*inline_only=*/false);
}

std::optional<Response> BlockHandlers::TryPutReserveInline(Connection& c, std::string_view body) {
  return ReserveBlocks(c, body, /*inline_only=*/true);
}

std::optional<Response> BlockHandlers::ReserveBlocks(Connection& c, std::string_view body,
                                                     bool inline_only) {
  // Parsed and built without an allocation per block (transport/arena_message.h).
  transport::ArenaMessage<wire::PutReserveRequest> request;
  transport::ArenaMessage<wire::PutReserveResponse> answer;
  wire::PutReserveRequest& req = *request;
  wire::PutReserveResponse& resp = *answer;
  Status st = Parse(body, &req, "PUT_RESERVE");
  if (st.ok() && req.items_size() > static_cast<int>(options_.max_batch_keys)) {
    st =
        Status::InvalidArgument("request has " + std::to_string(req.items_size()) +
                                " blocks; the limit is " + std::to_string(options_.max_batch_keys));
  }
  std::vector<tiers::PutRequestItem> items;
  if (st.ok()) {
    items.reserve(req.items_size());
    for (int i = 0; i < req.items_size() && st.ok(); ++i) {
      const wire::PutItem& in = req.items(i);
      tiers::PutRequestItem item;
      Result<BlockKey> key = BlockKey::FromBytes(in.key());
      if (!key.ok()) {
        st = key.status().WithContext("item " + std::to_string(i));
        break;
      }
      item.key = *key;
      if (!in.parent().empty()) {
        Result<BlockKey> parent = BlockKey::FromBytes(in.parent());
        if (!parent.ok()) {
          st = parent.status().WithContext("parent of item " + std::to_string(i));
          break;
        }
        item.parent = *parent;
      }
      item.size = in.size();
      item.checksum = in.checksum();
      items.push_back(item);
    }
  }
  PathAsk ask;
  ask.in_place = req.in_place();
  if (st.ok()) st = c.delivery->Check(ask);
  if (st.ok() && req.to_gpu() && !req.in_place()) {
    st = Status::InvalidArgument(
        "PUT_RESERVE to_gpu needs in_place (gpu slots are written "
        "through the shared-memory path only)");
  }
  if (!st.ok()) {
    metrics_.Add(metrics_.requests_failed);
    return Reply(wire::PUT_RESERVE, resp, st);
  }
  // A peer's put is a replica of a block durable on the node that took it, under the peer's
  // short deadline: never waited for as a client's put is (TierManager::Reserve).
  tiers::ReserveAsk reserve_ask;
  reserve_ask.durable = !c.peer;
  reserve_ask.wait_limit = std::chrono::milliseconds(req.wait_ms());
  std::vector<tiers::ReserveOutcome> outcomes;
  if (req.to_gpu()) {
    if (inline_only) return std::nullopt;  // gpu slots: a worker's to make
    reserve_ask.gpu_device = req.gpu_device();
    outcomes = tiers_.Reserve(c.ns, c.owner, items, reserve_ask);
  } else if (inline_only) {
    std::optional<std::vector<tiers::ReserveOutcome>> now =
        tiers_.TryReserve(c.ns, c.owner, items, reserve_ask.durable);
    if (!now) return std::nullopt;  // room needs a disk write or a wait: a worker's to make
    outcomes = std::move(*now);
  } else {
    outcomes = tiers_.Reserve(c.ns, c.owner, items, reserve_ask);
  }
  uint64_t dedup = 0;
  for (const tiers::ReserveOutcome& o : outcomes) {
    wire::Reservation* out = resp.add_reservations();
    switch (o.state) {
      case tiers::ReserveState::kReserved:
        out->set_state(wire::RESERVED);
        out->set_reservation_id(o.reservation_id);
        if (o.gpu_device >= 0) {
          DescribeGpuSlot(c.owner, o, out);
        } else {
          c.delivery->DescribeSlot(ask, o.arena_offset, out);
        }
        break;
      case tiers::ReserveState::kPresent:
        out->set_state(wire::PRESENT);
        ++dedup;
        break;
      case tiers::ReserveState::kInProgress:
        out->set_state(wire::IN_PROGRESS);
        ++dedup;
        break;
      case tiers::ReserveState::kRefused:
        out->set_state(wire::REFUSED);
        out->set_code(static_cast<int32_t>(o.status.code()));
        out->set_message(o.status.message());
        break;
    }
  }
  metrics_.Add(metrics_.puts_offered, items.size());
  metrics_.Add(metrics_.puts_deduplicated, dedup);
  return Reply(wire::PUT_RESERVE, resp, Status::OK());
}

Status BlockHandlers::PayloadSinks(Connection& c, std::string_view body,
                                   std::vector<PayloadSink>* sinks) {
  wire::PutCommitRequest req;
  KVPOOL_RETURN_IF_ERROR(Parse(body, &req, "PUT_COMMIT"));
  if (req.reservation_ids_size() != req.sizes_size()) {
    return Status::InvalidArgument(
        "PUT_COMMIT lists " + std::to_string(req.reservation_ids_size()) + " reservations but " +
        std::to_string(req.sizes_size()) + " sizes");
  }
  c.commit.ids.assign(req.reservation_ids().begin(), req.reservation_ids().end());
  c.commit.status.assign(c.commit.ids.size(), Status::OK());
  sinks->clear();
  for (int i = 0; i < req.reservation_ids_size(); ++i) {
    const uint64_t size = req.sizes(i);
    if (size > options_.limits.max_payload_bytes) {
      return Status::InvalidArgument("PUT_COMMIT names a block larger than a frame may carry");
    }
    if (!c.hello) {
      c.commit.status[i] = Status::FailedPrecondition("say hello first");
      sinks->push_back(PayloadSink{nullptr, size});
    } else {
      sinks->push_back(c.delivery->InFrameSink(req.reservation_ids(i), size, &c.commit.status[i]));
    }
  }
  return Status::OK();
}

Response BlockHandlers::PutCommit(Connection& c, std::string_view body) {
  wire::PutCommitResponse resp;
  PendingCommit& commit = c.commit;
  int gpu_device = -1;  // the daemon's gpu to place the committed blocks on (in place only)
  // PayloadSinks parsed the body and received the bytes; a commit without payload bytes (all
  // sizes zero is impossible: blocks are never empty) only arrives when the frame had none.
  if (commit.ids.empty()) {
    wire::PutCommitRequest req;
    Status st = Parse(body, &req, "PUT_COMMIT");
    const PathAsk ask{req.in_place(), req.via_ucx(), req.ucx_tag_base()};
    const int n = req.reservation_ids_size();
    if (req.to_gpu()) gpu_device = req.gpu_device();
    if (st.ok() && n > 0) {
      if (!req.in_place() && !req.via_ucx()) {
        st = Status::InvalidArgument("PUT_COMMIT without the payload of its reservations");
      } else if (!req.via_ucx()) {
        PathAsk in_place;
        in_place.in_place = true;
        st = c.delivery->Check(in_place);
      }
      if (st.ok() && req.sizes_size() != n) {
        st = Status::InvalidArgument("PUT_COMMIT lists reservations and sizes of different counts");
      }
    }
    if (st.ok() && req.via_ucx()) {
      PathAsk via_ucx;
      via_ucx.via_ucx = true;
      st = c.delivery->Check(via_ucx);
    }
    if (st.ok() && n > static_cast<int>(options_.max_batch_keys)) {
      st = Status::InvalidArgument("PUT_COMMIT has more reservations than a batch may");
    }
    if (st.ok()) st = c.delivery->CheckReceive(ask, static_cast<size_t>(n));
    if (!st.ok() || n == 0) return Reply(wire::PUT_COMMIT, resp, st);
    // The client wrote (or sends) the bytes outside the frame: check the sizes, then commit.
    commit.ids.assign(req.reservation_ids().begin(), req.reservation_ids().end());
    commit.status.assign(commit.ids.size(), Status::OK());
    if (req.checksums_size() > 0) {
      if (!req.in_place() || req.checksums_size() != n) {
        commit.Clear();
        return Reply(wire::PUT_COMMIT, resp,
                     Status::InvalidArgument("late checksums need in_place and one per block"));
      }
      commit.checksums.assign(req.checksums().begin(), req.checksums().end());
    }
    if (req.device_checksums_size() > 0) {
      if (!req.in_place() || req.device_checksums_size() != n || req.checksums_size() > 0) {
        commit.Clear();
        return Reply(wire::PUT_COMMIT, resp,
                     Status::InvalidArgument(
                         "device checksums need in_place, one per block and no checksums"));
      }
      commit.device_checksums.assign(req.device_checksums().begin(), req.device_checksums().end());
    }
    for (int i = 0; i < n; ++i) {
      Result<tiers::ReservationTarget> t = tiers_.TargetOf(c.owner, req.reservation_ids(i));
      if (!t.ok()) {
        commit.status[i] = t.status();
      } else if (t->size != req.sizes(i)) {
        commit.status[i] = Status::InvalidArgument("reservation size mismatch");
      }
    }
    c.delivery->Receive(
        ask, commit,
        std::span<const uint64_t>(req.sizes().data(), static_cast<size_t>(req.sizes_size())));
  }
  uint64_t committed = 0;
  uint64_t bytes = 0;
  ClusterHooks* cluster = cluster_.Get();
  std::vector<std::pair<BlockKey, BlockKey>> replicate;  // committed blocks (key, parent)
  std::vector<BlockKey> to_gpu;                          // committed blocks, for req.to_gpu()
  // The blocks (key, parent, size) of the reservations that passed the checks, read before
  // they are committed.
  const size_t n = commit.ids.size();
  std::vector<Result<tiers::ReservationTarget>> targets;
  targets.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    targets.push_back(commit.status[i].ok() ? tiers_.TargetOf(c.owner, commit.ids[i])
                                            : Result<tiers::ReservationTarget>(commit.status[i]));
  }
  std::vector<Status> results = commit.status;
  if (!commit.device_checksums.empty()) {
    // Into gpu slots: each GPU checks all of its slots in one launch.
    std::vector<uint64_t> ids;
    std::vector<uint64_t> dsums;
    std::vector<size_t> at;
    for (size_t i = 0; i < n; ++i) {
      if (!results[i].ok()) continue;
      ids.push_back(commit.ids[i]);
      dsums.push_back(commit.device_checksums[i]);
      at.push_back(i);
    }
    std::vector<Status> done = tiers_.CommitToGpu(c.owner, ids, dsums);
    for (size_t j = 0; j < at.size(); ++j) results[at[j]] = std::move(done[j]);
  } else {
    for (size_t i = 0; i < n; ++i) {
      if (!results[i].ok()) continue;
      results[i] = tiers_.Commit(
          c.owner, commit.ids[i],
          commit.checksums.empty() ? std::nullopt : std::optional<uint64_t>(commit.checksums[i]));
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const Status& st = results[i];
    if (!commit.status[i].ok()) {
      tiers_.Abort(c.owner, commit.ids[i]);
    } else if (st.ok()) {
      const Result<tiers::ReservationTarget>& t = targets[i];
      ++committed;
      bytes += t.ok() ? t->size : 0;
      if (t.ok() && cluster != nullptr && !c.peer) replicate.emplace_back(t->key, t->parent);
      if (t.ok() && gpu_device >= 0) to_gpu.push_back(t->key);
    }
    SetStatus(resp.add_results(), st);
  }
  commit.Clear();
  if (!replicate.empty()) cluster->Replicate(c.ns, c.ns_name, std::move(replicate));
  PlaceOnGpuBehind(c.ns, to_gpu, gpu_device, "PUT_COMMIT");
  metrics_.Add(metrics_.puts_committed, committed);
  metrics_.Add(metrics_.bytes_in, bytes);
  return Reply(wire::PUT_COMMIT, resp, Status::OK());
}

std::optional<Response> BlockHandlers::TryPutCommitInline(Connection& c, std::string_view body) {
  // Bytes that came in the frame are hashed before they are published, and a cluster replicates
  // what is committed: both are a worker's to run. So is anything unusual (the worker answers
  // the malformed request, or the gpu placement).
  if (!c.commit.ids.empty() || cluster_.Get() != nullptr) return std::nullopt;
  wire::PutCommitRequest req;
  if (!Parse(body, &req, "PUT_COMMIT").ok()) return std::nullopt;
  const int n = req.reservation_ids_size();
  if (!req.in_place() || req.via_ucx() || req.to_gpu() || req.device_checksums_size() > 0 ||
      n == 0 || n > static_cast<int>(options_.max_batch_keys) || req.sizes_size() != n ||
      req.checksums_size() != n) {
    return std::nullopt;
  }
  PathAsk in_place;
  in_place.in_place = true;
  if (!c.delivery->Check(in_place).ok()) return std::nullopt;
  const auto span = [](const google::protobuf::RepeatedField<uint64_t>& f) {
    return std::span<const uint64_t>(f.data(), static_cast<size_t>(f.size()));
  };
  std::optional<std::vector<Status>> done = tiers_.TryCommit(
      c.owner, span(req.reservation_ids()), span(req.sizes()), span(req.checksums()));
  if (!done) return std::nullopt;  // a namespace writes to disk on commit
  wire::PutCommitResponse resp;
  uint64_t committed = 0;
  uint64_t bytes = 0;
  for (int i = 0; i < n; ++i) {
    const Status& st = (*done)[static_cast<size_t>(i)];
    if (st.ok()) {
      ++committed;
      bytes += req.sizes(i);
    }
    SetStatus(resp.add_results(), st);
  }
  metrics_.Add(metrics_.puts_committed, committed);
  metrics_.Add(metrics_.bytes_in, bytes);
  return Reply(wire::PUT_COMMIT, resp, Status::OK());
}

void BlockHandlers::PlaceOnGpuBehind(NamespaceId ns, std::span<const BlockKey> keys, int device,
                                     const char* what) {
  if (keys.empty()) return;
  // The client checked at hello that the daemon runs a gpu tier on `device`.
  Result<uint32_t> queued = tiers_.PlaceOnGpu(ns, keys, device, /*wait=*/false);
  if (!queued.ok()) {
    LOG_EVERY_N(WARNING, 100) << what << " to gpu " << device << ": " << queued.status().ToString();
  }
}

void BlockHandlers::DescribeGpuSlot(uint64_t owner, const tiers::ReserveOutcome& o,
                                    wire::Reservation* out) {
  const Status st = SetGpuSlot(tiers_, o.gpu_device, o.gpu_offset, out->mutable_slot());
  if (!st.ok()) {  // cannot happen for a slot the tier just gave; refused if it does
    tiers_.Abort(owner, o.reservation_id);
    out->clear_slot();
    out->set_state(wire::REFUSED);
    out->set_code(static_cast<int32_t>(StatusCode::kInternal));
    out->set_message(st.message());
  }
}

Response BlockHandlers::PutAbort(Connection& c, std::string_view body) {
  wire::PutAbortRequest req;
  wire::PutAbortResponse resp;
  Status st = Parse(body, &req, "PUT_ABORT");
  if (st.ok()) {
    for (uint64_t id : req.reservation_ids()) tiers_.Abort(c.owner, id);
  }
  return Reply(wire::PUT_ABORT, resp, st);
}

Response BlockHandlers::Prefetch(Connection& c, std::string_view body) {
  wire::PrefetchRequest req;
  wire::PrefetchResponse resp;
  std::vector<BlockKey> keys;
  Status st = Parse(body, &req, "PREFETCH");
  if (st.ok()) st = DecodeKeys(req.keys(), options_.max_batch_keys, &keys);
  if (st.ok()) resp.set_scheduled(tiers_.Prefetch(c.ns, keys));
  if (st.ok() && req.to_gpu()) {
    Result<uint32_t> placed = tiers_.PlaceOnGpu(c.ns, keys, req.gpu_device(), /*wait=*/true);
    if (placed.ok()) {
      resp.set_gpu_placed(*placed);
    } else {
      st = placed.status();
    }
  }
  return Reply(wire::PREFETCH, resp, st);
}

Response BlockHandlers::ReportDamaged(Connection& c, std::string_view body) {
  wire::ReportDamagedRequest req;
  wire::ReportDamagedResponse resp;
  std::vector<BlockKey> keys;
  Status st = Parse(body, &req, "REPORT_DAMAGED");
  if (st.ok()) st = DecodeKeys(req.keys(), options_.max_batch_keys, &keys);
  if (st.ok() && req.tier() != wire::TIER_GPU) {
    st = Status::InvalidArgument("REPORT_DAMAGED names gpu copies only");
  }
  if (st.ok()) {
    // Checked again here: a client's word alone drops nothing.
    resp.set_dropped(tiers_.DropDamagedGpuCopies(c.ns, keys));
    if (resp.dropped() > 0) {
      LOG(WARNING) << "connection " << c.info.id << " (namespace " << c.ns_name << ") reported "
                   << keys.size() << " damaged gpu copies; " << resp.dropped()
                   << " failed the daemon's check too and were dropped";
    }
  }
  return Reply(wire::REPORT_DAMAGED, resp, st);
}

Response BlockHandlers::Release(Connection& c, std::string_view body) {
  wire::ReleaseRequest req;
  Response r;
  r.type = wire::RELEASE;
  r.no_reply = true;
  if (Parse(body, &req, "RELEASE").ok()) {
    tiers_.ReleaseLeases(c.owner,
                         {req.lease_ids().data(), static_cast<size_t>(req.lease_ids_size())});
  }
  return r;
}

Response BlockHandlers::MapSegments(Connection& c, std::string_view body) {
  wire::MapSegmentsRequest req;
  wire::MapSegmentsResponse resp;
  Status st = Parse(body, &req, "MAP_SEGMENTS");
  if (st.ok()) {
    PathAsk in_place;
    in_place.in_place = true;
    st = c.delivery->Check(in_place);
  }
  if (st.ok() && req.segments_size() > 64) {
    st = Status::InvalidArgument("at most 64 segments per MAP_SEGMENTS request");
  }
  Response r;
  if (st.ok()) {
    for (const wire::SegmentRequest& sr : req.segments()) {
      Status one;
      if (sr.writable() && !req.gpu() && !tiers_.OwnerHasReservationIn(c.owner, sr.segment())) {
        one = Status::PermissionDenied("a writable mapping needs an open reservation in segment " +
                                       std::to_string(sr.segment()));
      } else {
        Result<int> fd =
            req.gpu()
                ? tiers_.ExportGpuSegment(c.ns, req.gpu_device(), sr.segment(), sr.generation())
                : tiers_.ExportSegment(c.ns, sr.segment(), sr.generation(), sr.writable());
        if (fd.ok()) {
          r.fds.push_back(*fd);
        } else {
          one = fd.status();
        }
      }
      SetStatus(resp.add_results(), one);
    }
  }
  SetStatus(resp.mutable_status(), st);
  r.type = wire::MAP_SEGMENTS;
  resp.SerializeToString(&r.body);
  return r;
}

Response BlockHandlers::Locate(Connection& c, std::string_view body) {
  wire::LocateRequest req;
  wire::LocateResponse resp;
  std::vector<BlockKey> keys;
  Status st = Parse(body, &req, "LOCATE");
  if (st.ok()) {
    const google::protobuf::RepeatedPtrField<std::string> none;
    st = DecodeKeysOf(none, req.packed_keys(), options_.max_batch_keys, &keys);
  }
  if (st.ok()) {
    const tiers::LookupResult lr = tiers_.Lookup(c.ns, keys, /*prefetch=*/false);
    wire::NodeLocation* self = resp.add_nodes();
    self->set_node_id(options_.node_id);
    self->set_self(true);
    self->set_hit_blocks(lr.hit_blocks);
    for (Tier t : lr.tiers) self->add_tiers(ToWire(t));
    // A peer's LOCATE would fan out again: peers ask each other plain lookups only.
    if (ClusterHooks* cluster = cluster_.Get(); cluster != nullptr && !c.peer) {
      cluster->Locate(c.ns_name, keys, &resp);
    }
  } else {
    metrics_.Add(metrics_.requests_failed);
  }
  return Reply(wire::LOCATE, resp, st);
}

namespace {

// The device links a peer's GPU_* request may use, or why not.
Result<GpuLinks*> LinksFor(const Connection& c, const ClusterRef& cluster) {
  if (!c.peer) return Status::PermissionDenied("only a peer kvpoold may ask for device links");
  ClusterHooks* hooks = cluster.Get();
  GpuLinks* links = hooks != nullptr ? hooks->gpu_links() : nullptr;
  if (links == nullptr) {
    return Status::FailedPrecondition(
        "no device links here (no gpu tier, or kvpoold runs without NCCL)");
  }
  return links;
}

// A peer's GPU_OFFER or GPU_SEND: its body, the links it is for, and its keys.
template <typename Req>
Status ParseGpuRequest(const Connection& c, const ClusterRef& cluster, std::string_view body,
                       const char* what, uint32_t max_keys, Req* req, GpuLinks** links,
                       std::vector<BlockKey>* keys) {
  KVPOOL_RETURN_IF_ERROR(Parse(body, req, what));
  KVPOOL_ASSIGN_OR_RETURN(*links, LinksFor(c, cluster));
  const google::protobuf::RepeatedPtrField<std::string> none;
  return DecodeKeysOf(none, req->packed_keys(), max_keys, keys);
}

}  // namespace

Response BlockHandlers::GpuLinkJoin(Connection& c, std::string_view body) {
  wire::GpuLinkJoinRequest req;
  wire::GpuLinkJoinResponse resp;
  Status st = Parse(body, &req, "GPU_LINK_JOIN");
  Result<GpuLinks*> links = LinksFor(c, cluster_);
  if (st.ok()) st = links.status();
  if (st.ok()) st = (*links)->Accept(req.token(), req.link_id(), req.device());
  if (!st.ok()) metrics_.Add(metrics_.requests_failed);
  return Reply(wire::GPU_LINK_JOIN, resp, st);
}

Response BlockHandlers::GpuOffer(Connection& c, std::string_view body) {
  wire::GpuOfferRequest req;
  wire::GpuOfferResponse resp;
  GpuLinks* links = nullptr;
  std::vector<BlockKey> keys;
  const Status st =
      ParseGpuRequest(c, cluster_, body, "GPU_OFFER", options_.max_batch_keys, &req, &links, &keys);
  if (st.ok()) {
    links->Offer(c.ns, keys, &resp);
  } else {
    metrics_.Add(metrics_.requests_failed);
  }
  return Reply(wire::GPU_OFFER, resp, st);
}

Response BlockHandlers::GpuSend(Connection& c, std::string_view body) {
  wire::GpuSendRequest req;
  wire::GpuSendResponse resp;
  GpuLinks* links = nullptr;
  std::vector<BlockKey> keys;
  Status st =
      ParseGpuRequest(c, cluster_, body, "GPU_SEND", options_.max_batch_keys, &req, &links, &keys);
  if (st.ok()) {
    Result<std::vector<bool>> sending = links->Send(
        c.ns, req.token(), req.seq(), keys, {req.sizes().data(), size_t(req.sizes_size())},
        {req.device_checksums().data(), size_t(req.device_checksums_size())});
    st = sending.status();
    if (st.ok()) {
      for (bool b : *sending) resp.add_sending(b);
    }
  }
  if (!st.ok()) metrics_.Add(metrics_.requests_failed);
  return Reply(wire::GPU_SEND, resp, st);
}

void BlockHandlers::Disconnect(Connection& c) {
  c.ucx = nullptr;
  c.delivery.reset();  // UCX: cancels the connection's sends and closes its endpoint
  tiers_.AbortOwner(c.owner);
  tiers_.ReleaseOwner(c.owner);
}

}  // namespace kvpool::daemon
