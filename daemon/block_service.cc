#include "daemon/block_service.h"

#include <glog/logging.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>

#include "common/hello_auth.h"
#include "common/units.h"
#include "control.pb.h"

namespace kvpool::daemon {

using transport::FrameHeader;
using transport::PayloadSink;
using transport::Response;

namespace {

// Relaxed: only a source of unique ids.
std::atomic<uint64_t> g_next_owner{1};
// Owner of the leases UCX sends hold: never a connection's, so no disconnect releases them.
constexpr uint64_t kUcxSendOwner = UINT64_MAX - 2;

void SetStatus(wire::Status* out, const Status& st) {
  out->set_code(static_cast<int32_t>(st.code()));
  out->set_message(st.message());
}

template <typename Message>
Response Reply(uint16_t type, Message& msg, const Status& st) {
  SetStatus(msg.mutable_status(), st);
  Response r;
  r.type = type;
  msg.SerializeToString(&r.body);
  return r;
}

template <typename Message>
Status Parse(std::string_view body, Message* msg, const char* what) {
  if (!msg->ParseFromArray(body.data(), static_cast<int>(body.size()))) {
    return Status::InvalidArgument(std::string("malformed ") + what + " request body");
  }
  return Status::OK();
}

Status DecodeKeys(const google::protobuf::RepeatedPtrField<std::string>& in, uint32_t max,
                  std::vector<BlockKey>* out) {
  if (static_cast<uint64_t>(in.size()) > max) {
    return Status::InvalidArgument("request has " + std::to_string(in.size()) +
                                   " keys; the limit is " + std::to_string(max));
  }
  out->reserve(in.size());
  for (int i = 0; i < in.size(); ++i) {
    Result<BlockKey> k = BlockKey::FromBytes(in[i]);
    if (!k.ok()) return k.status().WithContext("key " + std::to_string(i));
    out->push_back(*k);
  }
  return Status::OK();
}

// Keys sent as one packed string (32 bytes each) or as repeated fields, not both.
Status DecodeKeysOf(const google::protobuf::RepeatedPtrField<std::string>& keys,
                    const std::string& packed, uint32_t max, std::vector<BlockKey>* out) {
  if (packed.empty()) return DecodeKeys(keys, max, out);
  if (!keys.empty()) return Status::InvalidArgument("keys given both packed and one by one");
  if (packed.size() % BlockKey::kSize != 0) {
    return Status::InvalidArgument("packed keys are not a multiple of 32 bytes");
  }
  const size_t n = packed.size() / BlockKey::kSize;
  if (n > max) {
    return Status::InvalidArgument("request has " + std::to_string(n) + " keys; the limit is " +
                                   std::to_string(max));
  }
  out->resize(n);
  for (size_t i = 0; i < n; ++i) {
    std::memcpy((*out)[i].bytes.data(), packed.data() + i * BlockKey::kSize, BlockKey::kSize);
  }
  return Status::OK();
}

wire::Tier ToWire(Tier tier) {
  switch (tier) {
    case Tier::kGpu:
      return wire::TIER_GPU;
    case Tier::kHost:
      return wire::TIER_HOST;
    case Tier::kDisk:
      return wire::TIER_DISK;
    case Tier::kRemote:
      return wire::TIER_REMOTE;
    case Tier::kNone:
      break;
  }
  return wire::TIER_NONE;
}

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

struct BlockService::Conn : transport::ConnectionState {
  transport::ConnectionInfo info;
  bool hello = false;
  NamespaceId ns = kNoNamespace;
  std::string ns_name;
  uint64_t owner = 0;     // owner id of this connection's reservations and leases
  bool shm = false;       // the shared-memory data path was granted at hello
  bool peer = false;      // another kvpoold (cluster fetch or replication): no replication back
  std::string challenge;  // cluster mode, TCP: what this connection's hello proof covers
  // UCX sends of GET answers and when they must have finished; one still running then (or at
  // disconnect) is cancelled, which ends its lease.
  std::deque<std::pair<transport::UcxOpId, std::chrono::steady_clock::time_point>> ucx_sends;
  transport::UcxEndpointId ucx_ep = 0;  // the client's UCX worker, when granted
  uint64_t ucx_tag_prefix = 0;          // this connection's tags on the daemon's worker
  // Set by PayloadSinks for the PUT_COMMIT being received: which reservations got a real slot.
  std::vector<uint64_t> commit_ids;
  std::vector<Status> commit_status;
  std::vector<uint64_t> commit_checksums;  // in-place commits that send their checksums late
};

BlockService::BlockService(const BlockServiceOptions& options, tiers::TierManager& tiers,
                           NamespaceRegistry& namespaces, SessionStore& sessions, Metrics& metrics,
                           transport::UcxEngine* ucx)
    : options_(options),
      tiers_(tiers),
      namespaces_(namespaces),
      sessions_(sessions),
      metrics_(metrics),
      ucx_(ucx),
      started_(std::chrono::steady_clock::now()) {}

Status BlockService::LoadSessions() {
  uint64_t n = 0;
  KVPOOL_RETURN_IF_ERROR(sessions_.ForEach([&](NamespaceId ns, const wire::SessionRecord& r) {
    std::vector<BlockKey> keys;
    if (!DecodeKeys(r.keys(), UINT32_MAX, &keys).ok()) {
      LOG(ERROR) << "session '" << r.session_id() << "' has a malformed key; not pinned";
      return;
    }
    tiers_.PinExisting(ns, keys);
    ++n;
  }));
  LOG(INFO) << "pinned the chains of " << n << " persisted sessions";
  return Status::OK();
}

std::unique_ptr<transport::ConnectionState> BlockService::OnConnect(
    const transport::ConnectionInfo& info) {
  auto c = std::make_unique<Conn>();
  c->info = info;
  c->owner = g_next_owner.fetch_add(1, std::memory_order_relaxed);
  metrics_.Add(metrics_.connections_total);
  return c;
}

void BlockService::OnDisconnect(transport::ConnectionState& state) {
  auto& c = static_cast<Conn&>(state);
  if (c.ucx_ep != 0) {
    // A closed connection's sends are not waited for: cancelling them ends their leases.
    for (const auto& [op, deadline] : c.ucx_sends) ucx_->Cancel(op);
    ucx_->Disconnect(c.ucx_ep);
  }
  tiers_.AbortOwner(c.owner);
  tiers_.ReleaseOwner(c.owner);
}

bool BlockService::RunsInline(uint16_t type) const {
  // In cluster mode a lookup or locate may ask peers: it goes to a worker like a get.
  if (type == wire::LOOKUP || type == wire::LOCATE) return cluster() == nullptr;
  return type == wire::PREFETCH || type == wire::RELEASE;
}

Status BlockService::PayloadSinks(transport::ConnectionState& state, const FrameHeader& header,
                                  std::string_view body, std::vector<PayloadSink>* sinks) {
  auto& c = static_cast<Conn&>(state);
  if (header.type != wire::PUT_COMMIT) {
    return Status::InvalidArgument("only PUT_COMMIT carries a payload");
  }
  wire::PutCommitRequest req;
  KVPOOL_RETURN_IF_ERROR(Parse(body, &req, "PUT_COMMIT"));
  if (req.reservation_ids_size() != req.sizes_size()) {
    return Status::InvalidArgument(
        "PUT_COMMIT lists " + std::to_string(req.reservation_ids_size()) + " reservations but " +
        std::to_string(req.sizes_size()) + " sizes");
  }
  c.commit_ids.assign(req.reservation_ids().begin(), req.reservation_ids().end());
  c.commit_status.assign(c.commit_ids.size(), Status::OK());
  sinks->clear();
  for (int i = 0; i < req.reservation_ids_size(); ++i) {
    const uint64_t size = req.sizes(i);
    if (size > options_.limits.max_payload_bytes) {
      return Status::InvalidArgument("PUT_COMMIT names a block larger than a frame may carry");
    }
    PayloadSink sink{nullptr, size};
    if (!c.hello) {
      c.commit_status[i] = Status::FailedPrecondition("say hello first");
    } else {
      Result<tiers::ReservationTarget> t = tiers_.TargetOf(c.owner, req.reservation_ids(i));
      if (!t.ok()) {
        c.commit_status[i] = t.status();
      } else if (t->size != size) {
        c.commit_status[i] = Status::InvalidArgument(
            "reservation " + std::to_string(req.reservation_ids(i)) + " is for " +
            std::to_string(t->size) + " bytes, not " + std::to_string(size));
      } else {
        sink.data = t->data;
      }
    }
    sinks->push_back(sink);
  }
  return Status::OK();
}

Response BlockService::Handle(transport::ConnectionState& state, const FrameHeader& header,
                              std::string_view body) {
  auto& c = static_cast<Conn&>(state);
  const auto start = std::chrono::steady_clock::now();
  Op op = Op::kOther;
  Response r;
  if (header.type != wire::HELLO && !c.hello) {
    wire::GetResponse any;  // every response's field 1 is its Status
    r = Reply(header.type, any, Status::FailedPrecondition("say hello first"));
    c.commit_ids.clear();  // PayloadSinks may have run for a refused PUT_COMMIT
    c.commit_status.clear();
  } else {
    switch (header.type) {
      case wire::HELLO:
        r = Hello(c, body);
        break;
      case wire::LOOKUP:
        op = Op::kLookup;
        r = Lookup(c, body);
        break;
      case wire::GET:
        op = Op::kGet;
        r = Get(c, body);
        break;
      case wire::PUT_RESERVE:
        op = Op::kPutReserve;
        r = PutReserve(c, body);
        break;
      case wire::PUT_COMMIT:
        op = Op::kPutCommit;
        r = PutCommit(c, body);
        break;
      case wire::PUT_ABORT:
        r = PutAbort(c, body);
        break;
      case wire::PREFETCH:
        op = Op::kPrefetch;
        r = Prefetch(c, body);
        break;
      case wire::SESSION_SAVE:
        op = Op::kSession;
        r = SessionSave(c, body);
        break;
      case wire::SESSION_LOAD:
        op = Op::kSession;
        r = SessionLoad(c, body);
        break;
      case wire::SESSION_DELETE:
        op = Op::kSession;
        r = SessionDelete(c, body);
        break;
      case wire::SESSION_LIST:
        op = Op::kSession;
        r = SessionList(c, body);
        break;
      case wire::STATS:
        r = Stats(c, body);
        break;
      case wire::EVICT:
        r = Evict(c, body);
        break;
      case wire::MAP_SEGMENTS:
        r = MapSegments(c, body);
        break;
      case wire::RELEASE:
        r = Release(c, body);
        break;
      case wire::CLUSTER_MEMBERS:
        r = ClusterMembers(c, body);
        break;
      case wire::LOCATE:
        r = Locate(c, body);
        break;
      default: {
        wire::GetResponse any;
        r = Reply(header.type, any, Status::InvalidArgument("unsupported request type"));
      }
    }
  }
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  metrics_.latency[static_cast<size_t>(op)].Observe(us);
  return r;
}

Response BlockService::Hello(Conn& c, std::string_view body) {
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
  bool challenged = false;
  if (st.ok() && !c.info.local && !options_.tcp_secret.empty() && !c.hello) {
    // Cluster mode: a TCP client proves the cluster secret over this connection's challenge.
    if (c.challenge.empty()) c.challenge = NewHelloChallenge();
    if (req.auth().empty()) {
      st = Status::PermissionDenied(
          "this daemon requires the cluster secret on TCP connections: answer the challenge");
      resp.set_challenge(c.challenge);
      challenged = true;  // the client may answer on this connection
    } else if (!VerifyHelloProof(options_.tcp_secret, c.challenge, req.namespace_name(),
                                 req.auth())) {
      st = Status::PermissionDenied("wrong cluster secret");
    }
  }
  if (st.ok()) {
    Result<NamespaceId> ns = namespaces_.Resolve(req.namespace_name());
    if (ns.ok()) {
      c.hello = true;
      c.ns = *ns;
      c.ns_name = req.namespace_name();
      c.shm = req.shared_memory() && c.info.local && options_.shared_memory;
      c.peer = req.client_name() == "kvpool-peer";
      resp.set_shared_memory(c.shm);
      resp.set_segment_bytes(tiers_.segment_bytes());
      resp.set_lease_timeout_ms(static_cast<uint32_t>(options_.lease_timeout.count()));
      if (!req.ucx_worker_address().empty() && ucx_ != nullptr && c.ucx_ep == 0) {
        Result<transport::UcxEndpointId> ep = ucx_->Connect(req.ucx_worker_address());
        if (ep.ok()) {
          c.ucx_ep = *ep;
          // 24 bits of connection id above the client's 40: unique tags on our worker.
          c.ucx_tag_prefix = (c.info.id & 0xFFFFFF) << 40;
          resp.set_ucx(true);
          resp.set_ucx_worker_address(ucx_->WorkerAddress());
          resp.set_ucx_tag_prefix(c.ucx_tag_prefix);
        } else {
          LOG(WARNING) << "connection " << c.info.id << ": cannot reach the client's UCX worker ("
                       << ep.status().ToString() << "); blocks stay on the socket";
        }
      }
    } else {
      st = ns.status();
    }
  }
  Response r = Reply(wire::HELLO, resp, st);
  if (!st.ok() && !challenged) {
    metrics_.Add(metrics_.requests_failed);
    LOG(INFO) << "hello refused on connection " << c.info.id << " (" << c.info.peer
              << "): " << st.ToString();
    r.close_after = true;
  }
  return r;
}

Response BlockService::Lookup(Conn& c, std::string_view body) {
  wire::LookupRequest req;
  wire::LookupResponse resp;
  std::vector<BlockKey> keys;
  Status st = Parse(body, &req, "LOOKUP");
  if (st.ok()) st = DecodeKeysOf(req.keys(), req.packed_keys(), options_.max_batch_keys, &keys);
  if (st.ok()) {
    tiers::LookupResult lr = tiers_.Lookup(c.ns, keys, !req.no_prefetch());
    if (cluster() != nullptr && !c.peer && lr.hit_blocks < keys.size() &&
        cluster()->FetchMissing(c.ns, c.ns_name,
                                std::span<const BlockKey>(keys).subspan(lr.hit_blocks)) > 0) {
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

Response BlockService::Get(Conn& c, std::string_view body) {
  wire::GetRequest req;
  wire::GetResponse resp;
  std::vector<BlockKey> keys;
  Status st = Parse(body, &req, "GET");
  if (st.ok()) st = DecodeKeysOf(req.keys(), req.packed_keys(), options_.max_batch_keys, &keys);
  if (!st.ok()) {
    metrics_.Add(metrics_.requests_failed);
    return Reply(wire::GET, resp, st);
  }
  if (req.in_place() && !c.shm) {
    metrics_.Add(metrics_.requests_failed);
    return Reply(wire::GET, resp,
                 Status::FailedPrecondition("the shared-memory path was not granted at hello"));
  }
  if (req.via_ucx() && c.ucx_ep == 0) {
    metrics_.Add(metrics_.requests_failed);
    return Reply(wire::GET, resp,
                 Status::FailedPrecondition("the UCX data path was not granted at hello"));
  }
  const bool in_place = req.in_place();
  const bool via_ucx = req.via_ucx();
  // Sends of earlier answers this client never received in time: cancel (finished ones are
  // ignored by the engine), so their leases end.
  while (!c.ucx_sends.empty() && c.ucx_sends.front().second < std::chrono::steady_clock::now()) {
    ucx_->Cancel(c.ucx_sends.front().first);
    c.ucx_sends.pop_front();
  }
  // In-place leases are the client's: they end on RELEASE, disconnect or expiry. A UCX send's
  // lease belongs to the send alone (no owner a disconnect releases, no expiry): UCX reads the
  // slot until the send completes, so only its completion may end the lease.
  const std::chrono::milliseconds ttl =
      in_place ? options_.lease_timeout : std::chrono::milliseconds(0);
  const uint64_t owner = via_ucx ? kUcxSendOwner : c.owner;
  auto reads =
      std::make_shared<std::vector<tiers::BlockRead>>(tiers_.Acquire(c.ns, keys, owner, ttl));
  if (cluster() != nullptr && !c.peer) {
    std::vector<BlockKey> missing;
    std::vector<size_t> where;
    for (size_t i = 0; i < keys.size(); ++i) {
      if ((*reads)[i].status.IsNotFound()) {
        missing.push_back(keys[i]);
        where.push_back(i);
      }
    }
    if (!missing.empty() && cluster()->FetchMissing(c.ns, c.ns_name, missing) > 0) {
      std::vector<tiers::BlockRead> again = tiers_.Acquire(c.ns, missing, owner, ttl);
      for (size_t k = 0; k < where.size(); ++k) (*reads)[where[k]] = std::move(again[k]);
    }
  }
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
    if (!via_ucx && payload + read.size > options_.limits.max_payload_bytes) {
      // Past what one frame may carry: the client asks again for these.
      info->set_code(static_cast<int32_t>(StatusCode::kResourceExhausted));
      tiers_.Release(read);
      read.owned.reset();
      continue;
    }
    info->set_code(0);
    info->set_size(read.size);
    info->set_checksum(read.checksum);
    info->set_tier(ToWire(read.from));
    if (via_ucx) {
      // The bytes go as a tagged message; the lease (or the owned disk copy) lives until the
      // send completes or fails. The client verifies the checksum from this response.
      tiers::TierManager* tiers = &tiers_;
      auto held = std::make_shared<tiers::BlockRead>(std::move(read));
      read.lease_id = 0;  // the send's now: it ends the lease
      read.data = nullptr;
      const transport::UcxOpId op = ucx_->SendTagged(
          c.ucx_ep, req.ucx_tag_base() + static_cast<uint64_t>(resp.blocks_size() - 1), held->data,
          held->size, [tiers, held](Status st) {
            if (!st.ok()) VLOG(1) << "UCX send of a block: " << st.ToString();
            tiers->Release(*held);
          });
      c.ucx_sends.emplace_back(op, std::chrono::steady_clock::now() + options_.ucx_timeout);
      payload += held->size;
      ++served;
      continue;
    }
    if (in_place && read.lease_id != 0) {
      // The client copies it from its mapping and releases the lease; nothing in the frame.
      const tiers::SegmentLocation loc = tiers_.Locate(read.arena_offset);
      info->mutable_slot()->set_segment(loc.segment);
      info->mutable_slot()->set_generation(loc.generation);
      info->mutable_slot()->set_offset(loc.offset);
      info->set_lease_id(read.lease_id);
      read.lease_id = 0;  // the client's now: RELEASE, disconnect or expiry ends it
      ++served;
      continue;
    }
    r.payload.emplace_back(read.data, read.size);
    payload += read.size;
    ++served;
  }
  metrics_.Add(metrics_.gets);
  metrics_.Add(metrics_.get_blocks_served, served);
  metrics_.Add(metrics_.get_misses, misses);
  metrics_.Add(metrics_.bytes_out, payload);
  SetStatus(resp.mutable_status(), Status::OK());
  r.type = wire::GET;
  resp.SerializeToString(&r.body);
  tiers::TierManager* tiers = &tiers_;
  r.release = [tiers, reads] {
    for (tiers::BlockRead& read : *reads) tiers->Release(read);
  };
  return r;
}

Response BlockService::PutReserve(Conn& c, std::string_view body) {
  wire::PutReserveRequest req;
  wire::PutReserveResponse resp;
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
  if (!st.ok()) {
    metrics_.Add(metrics_.requests_failed);
    return Reply(wire::PUT_RESERVE, resp, st);
  }
  if (req.in_place() && !c.shm) {
    metrics_.Add(metrics_.requests_failed);
    return Reply(wire::PUT_RESERVE, resp,
                 Status::FailedPrecondition("the shared-memory path was not granted at hello"));
  }
  std::vector<tiers::ReserveOutcome> outcomes = tiers_.Reserve(c.ns, c.owner, items);
  uint64_t dedup = 0;
  for (const tiers::ReserveOutcome& o : outcomes) {
    wire::Reservation* out = resp.add_reservations();
    switch (o.state) {
      case tiers::ReserveState::kReserved:
        out->set_state(wire::RESERVED);
        out->set_reservation_id(o.reservation_id);
        if (req.in_place()) {
          // The client writes through its own mapping; the reservation still expires if it is
          // never committed (a late write can then only touch this namespace's own segment).
          const tiers::SegmentLocation loc = tiers_.Locate(o.arena_offset);
          out->mutable_slot()->set_segment(loc.segment);
          out->mutable_slot()->set_generation(loc.generation);
          out->mutable_slot()->set_offset(loc.offset);
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

Response BlockService::PutCommit(Conn& c, std::string_view body) {
  wire::PutCommitResponse resp;
  // PayloadSinks parsed the body and received the bytes; a commit without payload bytes (all
  // sizes zero is impossible: blocks are never empty) only arrives when the frame had none.
  if (c.commit_ids.empty()) {
    wire::PutCommitRequest req;
    Status st = Parse(body, &req, "PUT_COMMIT");
    if (st.ok() && req.reservation_ids_size() > 0) {
      if (!req.in_place() && !req.via_ucx()) {
        st = Status::InvalidArgument("PUT_COMMIT without the payload of its reservations");
      } else if (!c.shm && !req.via_ucx()) {
        st = Status::FailedPrecondition("the shared-memory path was not granted at hello");
      } else if (req.sizes_size() != req.reservation_ids_size()) {
        st = Status::InvalidArgument("PUT_COMMIT lists reservations and sizes of different counts");
      }
    }
    if (st.ok() && req.via_ucx() && c.ucx_ep == 0) {
      st = Status::FailedPrecondition("the UCX data path was not granted at hello");
    }
    if (st.ok() && req.reservation_ids_size() > static_cast<int>(options_.max_batch_keys)) {
      st = Status::InvalidArgument("PUT_COMMIT has more reservations than a batch may");
    }
    // Every tag base + k must stay inside this connection's 40-bit tag space.
    if (st.ok() && req.via_ucx() &&
        ((req.ucx_tag_base() >> 40) != (c.ucx_tag_prefix >> 40) ||
         (req.ucx_tag_base() & ((1ull << 40) - 1)) + req.reservation_ids_size() > (1ull << 40))) {
      st = Status::InvalidArgument("UCX tags outside this connection's prefix");
    }
    if (!st.ok() || req.reservation_ids_size() == 0) return Reply(wire::PUT_COMMIT, resp, st);
    // The client wrote the bytes into its reservations itself: check the sizes, then commit.
    c.commit_ids.assign(req.reservation_ids().begin(), req.reservation_ids().end());
    c.commit_status.assign(c.commit_ids.size(), Status::OK());
    if (req.checksums_size() > 0) {
      if (!req.in_place() || req.checksums_size() != req.reservation_ids_size()) {
        c.commit_ids.clear();
        return Reply(wire::PUT_COMMIT, resp,
                     Status::InvalidArgument("late checksums need in_place and one per block"));
      }
      c.commit_checksums.assign(req.checksums().begin(), req.checksums().end());
    }
    for (int i = 0; i < req.reservation_ids_size(); ++i) {
      Result<tiers::ReservationTarget> t = tiers_.TargetOf(c.owner, req.reservation_ids(i));
      if (!t.ok()) {
        c.commit_status[i] = t.status();
      } else if (t->size != req.sizes(i)) {
        c.commit_status[i] = Status::InvalidArgument("reservation size mismatch");
      }
    }
    if (req.via_ucx()) {
      ReceiveViaUcx(c, req.ucx_tag_base(),
                    std::vector<uint64_t>(req.sizes().begin(), req.sizes().end()));
    }
  }
  uint64_t committed = 0;
  uint64_t bytes = 0;
  std::vector<std::pair<BlockKey, BlockKey>> replicate;  // committed blocks (key, parent)
  for (size_t i = 0; i < c.commit_ids.size(); ++i) {
    Status st = c.commit_status[i];
    if (st.ok()) {
      Result<tiers::ReservationTarget> t = tiers_.TargetOf(c.owner, c.commit_ids[i]);
      const uint64_t size = t.ok() ? t->size : 0;
      st = tiers_.Commit(c.owner, c.commit_ids[i],
                         c.commit_checksums.empty()
                             ? std::nullopt
                             : std::optional<uint64_t>(c.commit_checksums[i]));
      if (st.ok()) {
        ++committed;
        bytes += size;
        if (t.ok() && cluster() != nullptr && !c.peer) replicate.emplace_back(t->key, t->parent);
      }
    } else {
      tiers_.Abort(c.owner, c.commit_ids[i]);
    }
    SetStatus(resp.add_results(), st);
  }
  c.commit_ids.clear();
  c.commit_status.clear();
  c.commit_checksums.clear();
  if (!replicate.empty()) cluster()->Replicate(c.ns, c.ns_name, std::move(replicate));
  metrics_.Add(metrics_.puts_committed, committed);
  metrics_.Add(metrics_.bytes_in, bytes);
  return Reply(wire::PUT_COMMIT, resp, Status::OK());
}

void BlockService::ReceiveViaUcx(Conn& c, uint64_t tag_base, const std::vector<uint64_t>& sizes) {
  struct Pending {
    absl::Mutex mu;
    size_t left ABSL_GUARDED_BY(mu) = 0;
    std::vector<Status> status ABSL_GUARDED_BY(mu);
  };
  auto pending = std::make_shared<Pending>();
  std::vector<transport::UcxOpId> ops(c.commit_ids.size(), 0);
  {
    absl::MutexLock lock(&pending->mu);
    pending->status.assign(c.commit_ids.size(), Status::OK());
  }
  // A one-byte sink for the messages of positions that get no slot: receiving them (truncated)
  // keeps them from piling up in the worker's unexpected queue.
  auto drain = std::make_shared<uint8_t>(0);
  for (size_t k = 0; k < c.commit_ids.size(); ++k) {
    Result<tiers::ReservationTarget> t = Status::NotFound("no slot");
    if (c.commit_status[k].ok()) {
      t = tiers_.TargetOf(c.owner, c.commit_ids[k]);
      if (!t.ok()) c.commit_status[k] = t.status();
    }
    {
      absl::MutexLock lock(&pending->mu);
      ++pending->left;
    }
    const uint64_t expect = sizes[k];
    uint8_t* into = t.ok() ? t->data : drain.get();
    const uint64_t capacity = t.ok() ? t->size : 1;
    ops[k] = ucx_->ReceiveTagged(tag_base + k, into, capacity,
                                 [pending, k, expect, drain](Status st, size_t received) {
                                   absl::MutexLock lock(&pending->mu);
                                   if (st.ok() && received != expect) {
                                     st = Status::Corruption("short UCX transfer");
                                   }
                                   pending->status[k] = st;
                                   --pending->left;
                                 });
  }
  absl::MutexLock lock(&pending->mu);
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(pending->mu) { return pending->left == 0; };
  const absl::Time deadline = absl::Now() + absl::FromChrono(options_.ucx_timeout);
  if (!pending->mu.AwaitWithDeadline(absl::Condition(&done), deadline)) {
    // Cancel what is still open and wait for UCX to let go of the slots before they are freed.
    pending->mu.Unlock();
    for (transport::UcxOpId op : ops) {
      if (op != 0) ucx_->Cancel(op);
    }
    pending->mu.Lock();
    pending->mu.Await(absl::Condition(&done));
  }
  for (size_t k = 0; k < c.commit_ids.size(); ++k) {
    if (c.commit_status[k].ok() && !pending->status[k].ok()) {
      c.commit_status[k] = pending->status[k].WithContext("UCX transfer");
    }
  }
}

Response BlockService::PutAbort(Conn& c, std::string_view body) {
  wire::PutAbortRequest req;
  wire::PutAbortResponse resp;
  Status st = Parse(body, &req, "PUT_ABORT");
  if (st.ok()) {
    for (uint64_t id : req.reservation_ids()) tiers_.Abort(c.owner, id);
  }
  return Reply(wire::PUT_ABORT, resp, st);
}

Response BlockService::Prefetch(Conn& c, std::string_view body) {
  wire::PrefetchRequest req;
  wire::PrefetchResponse resp;
  std::vector<BlockKey> keys;
  Status st = Parse(body, &req, "PREFETCH");
  if (st.ok()) st = DecodeKeys(req.keys(), options_.max_batch_keys, &keys);
  if (st.ok()) resp.set_scheduled(tiers_.Prefetch(c.ns, keys));
  return Reply(wire::PREFETCH, resp, st);
}

Response BlockService::SessionSave(Conn& c, std::string_view body) {
  wire::SessionSaveRequest req;
  wire::SessionSaveResponse resp;
  std::vector<BlockKey> keys;
  Status st = Parse(body, &req, "SESSION_SAVE");
  wire::SessionRecord& record = *req.mutable_record();
  if (st.ok()) st = SessionStore::ValidateId(record.session_id());
  if (st.ok()) st = DecodeKeys(record.keys(), UINT32_MAX, &keys);
  if (!st.ok()) {
    metrics_.Add(metrics_.requests_failed);
    return Reply(wire::SESSION_SAVE, resp, st);
  }
  absl::MutexLock lock(&session_mu_);
  Result<wire::SessionRecord> old = sessions_.Get(c.ns, record.session_id());
  if (!old.ok() && !old.status().IsNotFound()) return Reply(wire::SESSION_SAVE, resp, old.status());
  Result<uint64_t> bytes = tiers_.PinChain(c.ns, keys);
  if (!bytes.ok()) {
    metrics_.Add(metrics_.requests_failed);
    return Reply(wire::SESSION_SAVE, resp, bytes.status());
  }
  const int64_t now = NowUnixMs();
  record.set_created_unix_ms(old.ok() ? old->created_unix_ms() : now);
  record.set_updated_unix_ms(now);
  record.set_total_bytes(*bytes);
  st = sessions_.Put(c.ns, record);
  if (!st.ok()) {
    tiers_.UnpinChain(c.ns, keys);
    metrics_.Add(metrics_.requests_failed);
    return Reply(wire::SESSION_SAVE, resp, st);
  }
  if (old.ok()) {
    std::vector<BlockKey> old_keys;
    if (DecodeKeys(old->keys(), UINT32_MAX, &old_keys).ok()) tiers_.UnpinChain(c.ns, old_keys);
  }
  if (cluster() != nullptr && !c.peer) cluster()->ReplicateSession(c.ns, c.ns_name, record);
  return Reply(wire::SESSION_SAVE, resp, Status::OK());
}

Response BlockService::SessionLoad(Conn& c, std::string_view body) {
  wire::SessionLoadRequest req;
  wire::SessionLoadResponse resp;
  Status st = Parse(body, &req, "SESSION_LOAD");
  if (st.ok()) {
    Result<wire::SessionRecord> record = sessions_.Get(c.ns, req.session_id());
    const bool remote =
        !record.ok() && record.status().IsNotFound() && cluster() != nullptr && !c.peer;
    if (remote) {
      // Saved through another node (maybe one that is down now): ask the session's homes.
      record = cluster()->LoadRemoteSession(c.ns_name, req.session_id());
    }
    if (record.ok()) {
      std::vector<BlockKey> keys;
      st = DecodeKeys(record->keys(), UINT32_MAX, &keys);
      if (st.ok()) {
        // A remote session's blocks come here now, so the gets that follow are local hits.
        if (remote && !req.no_prefetch()) cluster()->FetchMissing(c.ns, c.ns_name, keys);
        resp.set_cached_blocks(tiers_.CountCached(c.ns, keys));
        if (!req.no_prefetch()) tiers_.Prefetch(c.ns, keys);
        *resp.mutable_record() = std::move(*record);
      }
    } else {
      st = record.status();
    }
  }
  return Reply(wire::SESSION_LOAD, resp, st);
}

Response BlockService::SessionDelete(Conn& c, std::string_view body) {
  wire::SessionDeleteRequest req;
  wire::SessionDeleteResponse resp;
  Status st = Parse(body, &req, "SESSION_DELETE");
  if (st.ok()) {
    absl::MutexLock lock(&session_mu_);
    Result<wire::SessionRecord> old = sessions_.Get(c.ns, req.session_id());
    st = old.status();
    if (st.ok()) st = sessions_.Delete(c.ns, req.session_id());
    if (st.ok()) {
      std::vector<BlockKey> keys;
      if (DecodeKeys(old->keys(), UINT32_MAX, &keys).ok()) tiers_.UnpinChain(c.ns, keys);
    }
    if (cluster() != nullptr && !c.peer && (st.ok() || st.IsNotFound())) {
      // Its copies on the session's home nodes go too (a session saved elsewhere as well).
      const bool remote_only =
          st.IsNotFound() && cluster()->LoadRemoteSession(c.ns_name, req.session_id()).ok();
      cluster()->DeleteRemoteSession(c.ns_name, req.session_id());
      if (remote_only) st = Status::OK();
    }
  }
  return Reply(wire::SESSION_DELETE, resp, st);
}

Response BlockService::SessionList(Conn& c, std::string_view body) {
  wire::SessionListRequest req;
  wire::SessionListResponse resp;
  Status st = Parse(body, &req, "SESSION_LIST");
  if (st.ok()) {
    bool truncated = false;
    const uint32_t limit = req.limit() == 0 ? 1000 : std::min<uint32_t>(req.limit(), 100000);
    Result<std::vector<wire::SessionRecord>> list =
        sessions_.List(c.ns, req.prefix(), limit, &truncated);
    if (list.ok()) {
      for (const wire::SessionRecord& r : *list) {
        wire::SessionSummary* s = resp.add_sessions();
        s->set_session_id(r.session_id());
        s->set_blocks(static_cast<uint32_t>(r.keys_size()));
        s->set_token_count(r.token_count());
        s->set_updated_unix_ms(r.updated_unix_ms());
        s->set_total_bytes(r.total_bytes());
      }
      resp.set_truncated(truncated);
    } else {
      st = list.status();
    }
  }
  return Reply(wire::SESSION_LIST, resp, st);
}

Response BlockService::Stats(Conn& c, std::string_view body) {
  wire::StatsResponse resp;
  const tiers::TierManagerStats t = tiers_.GetStats();
  resp.set_node_id(options_.node_id);
  resp.set_version(options_.version);
  resp.set_uptime_s(static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - started_)
          .count()));
  wire::TierStats* host = resp.add_tiers();
  host->set_name("host");
  host->set_capacity_bytes(t.host.capacity_bytes);
  host->set_used_bytes(t.host.payload_bytes);
  host->set_blocks(t.host_blocks);
  host->set_allocated_bytes(t.host.allocated_bytes);
  host->set_fragmentation(t.host.fragmentation);
  host->set_hits(t.host_counters.hits);
  host->set_promotions(t.host_counters.promotions);
  host->set_demotions(t.host_counters.demotions);
  host->set_evictions(t.host_counters.evictions);
  wire::TierStats* disk = resp.add_tiers();
  disk->set_name("disk");
  disk->set_capacity_bytes(t.disk_capacity_bytes);
  disk->set_used_bytes(t.disk_used_bytes);
  disk->set_blocks(t.disk_blocks);
  disk->set_allocated_bytes(t.disk_bytes_on_device);
  disk->set_hits(t.disk_counters.hits);
  disk->set_promotions(t.disk_counters.promotions);
  disk->set_demotions(t.disk_counters.demotions);
  disk->set_evictions(t.disk_counters.evictions);
  resp.set_index_entries(t.index_entries);
  resp.set_index_bytes(t.index_bytes);
  resp.set_sessions(sessions_.Count());
  resp.set_connections(connections_ ? connections_() : 0);
  resp.set_lookups(Metrics::Get(metrics_.lookups));
  resp.set_lookup_blocks(Metrics::Get(metrics_.lookup_blocks));
  resp.set_lookup_hit_blocks(Metrics::Get(metrics_.lookup_hit_blocks));
  resp.set_gets(Metrics::Get(metrics_.gets));
  resp.set_get_blocks_served(Metrics::Get(metrics_.get_blocks_served));
  resp.set_get_misses(Metrics::Get(metrics_.get_misses));
  resp.set_puts_offered(Metrics::Get(metrics_.puts_offered));
  resp.set_puts_deduplicated(Metrics::Get(metrics_.puts_deduplicated));
  resp.set_puts_committed(Metrics::Get(metrics_.puts_committed));
  resp.set_bytes_in(Metrics::Get(metrics_.bytes_in));
  resp.set_bytes_out(Metrics::Get(metrics_.bytes_out));
  resp.set_prefetches_issued(t.prefetches_issued);
  resp.set_prefetches_useful(t.prefetches_useful);
  resp.set_checksum_failures(t.checksum_failures);
  resp.set_leases_active(t.leases_active);
  resp.set_reservations_active(t.reservations_active);
  {
    wire::ClusterMembersResponse view;
    if (ClusterHooks* c = cluster(); c != nullptr) {
      c->Fill(&view);
    } else {
      view.set_cluster_state("standalone");
    }
    resp.set_cluster_state(view.cluster_state());
    resp.set_cluster_members(static_cast<uint32_t>(view.members_size()));
    resp.set_cluster_reason(view.status().message());
  }
  resp.set_dedup_ratio(static_cast<double>(resp.puts_offered()) /
                       static_cast<double>(std::max<uint64_t>(1, resp.puts_committed())));
  return Reply(wire::STATS, resp, Status::OK());
}

Response BlockService::Evict(Conn& c, std::string_view body) {
  wire::EvictRequest req;
  wire::EvictResponse resp;
  std::vector<BlockKey> keys;
  Status st = Parse(body, &req, "EVICT");
  if (st.ok()) st = DecodeKeys(req.keys(), UINT32_MAX, &keys);
  if (st.ok()) {
    const Tier tier = req.tier() == wire::TIER_HOST ? Tier::kHost : Tier::kDisk;
    tiers::EvictOutcome o = tiers_.Evict(c.ns, tier, keys);
    resp.set_evicted(o.evicted);
    resp.set_skipped(o.skipped);
    LOG(INFO) << "admin evict in namespace " << c.ns_name << " (" << (keys.empty() ? "all" : "some")
              << " blocks, tier " << wire::Tier_Name(req.tier()) << "): " << o.evicted
              << " evicted, " << o.skipped << " skipped";
  }
  return Reply(wire::EVICT, resp, st);
}

Response BlockService::MapSegments(Conn& c, std::string_view body) {
  wire::MapSegmentsRequest req;
  wire::MapSegmentsResponse resp;
  Status st = Parse(body, &req, "MAP_SEGMENTS");
  if (st.ok() && !c.shm) {
    st = Status::FailedPrecondition("the shared-memory path was not granted at hello");
  }
  if (st.ok() && req.segments_size() > 64) {
    st = Status::InvalidArgument("at most 64 segments per MAP_SEGMENTS request");
  }
  Response r;
  if (st.ok()) {
    for (const wire::SegmentRequest& sr : req.segments()) {
      Status one;
      if (sr.writable() && !tiers_.OwnerHasReservationIn(c.owner, sr.segment())) {
        one = Status::PermissionDenied("a writable mapping needs an open reservation in segment " +
                                       std::to_string(sr.segment()));
      } else {
        Result<int> fd = tiers_.ExportSegment(c.ns, sr.segment(), sr.generation(), sr.writable());
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

Response BlockService::ClusterMembers(Conn& c, std::string_view body) {
  wire::ClusterMembersResponse resp;
  if (cluster() != nullptr) {
    cluster()->Fill(&resp);
  } else {
    resp.set_cluster_state("standalone");
  }
  // The fill may put a reason in the status message; the request itself succeeded.
  const std::string reason = resp.status().message();
  Response r = Reply(wire::CLUSTER_MEMBERS, resp, Status::OK());
  if (!reason.empty()) {
    resp.mutable_status()->set_message(reason);
    resp.SerializeToString(&r.body);
  }
  return r;
}

Response BlockService::Locate(Conn& c, std::string_view body) {
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
    if (cluster() != nullptr && !c.peer) cluster()->Locate(c.ns_name, keys, &resp);
  } else {
    metrics_.Add(metrics_.requests_failed);
  }
  return Reply(wire::LOCATE, resp, st);
}

Response BlockService::Release(Conn& c, std::string_view body) {
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

std::string BlockService::RenderMetrics() const {
  const uint64_t uptime = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - started_)
          .count());
  std::string out = metrics_.RenderPrometheus(tiers_.GetStats(), sessions_.Count(),
                                              connections_ ? connections_() : 0, uptime);
  if (cluster() != nullptr) {
    wire::ClusterMembersResponse view;
    cluster()->Fill(&view);
    out +=
        "# HELP kvpool_cluster_members Members in this daemon's view of the cluster.\n"
        "# TYPE kvpool_cluster_members gauge\n"
        "kvpool_cluster_members " +
        std::to_string(view.members_size()) +
        "\n# HELP kvpool_cluster_degraded 1 while this daemon cannot reach etcd (it serves "
        "its local tiers).\n# TYPE kvpool_cluster_degraded gauge\nkvpool_cluster_degraded " +
        (view.cluster_state() == "joined" ? "0" : "1") + "\n";
  }
  return out;
}

}  // namespace kvpool::daemon
