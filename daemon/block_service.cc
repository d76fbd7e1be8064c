#include "daemon/block_service.h"

#include <atomic>
#include <chrono>

#include "control.pb.h"
#include "daemon/connection.h"
#include "daemon/request_codec.h"
#include "daemon/socket_delivery.h"

namespace kvpool::daemon {

using transport::FrameHeader;
using transport::PayloadSink;
using transport::Response;

namespace {

// Relaxed: only a source of unique ids.
std::atomic<uint64_t> g_next_owner{1};

}  // namespace

BlockService::BlockService(const BlockServiceOptions& options, tiers::TierManager& tiers,
                           NamespaceRegistry& namespaces, SessionStore& sessions, Metrics& metrics,
                           UcxListener* ucx, const AccessControl* access)
    : options_(options),
      tiers_(tiers),
      metrics_(metrics),
      own_access_(access == nullptr ? std::make_unique<AccessControl>(options.tcp_secret)
                                    : nullptr),
      blocks_(options_, tiers, namespaces, metrics, ucx, cluster_,
              access != nullptr ? *access : *own_access_),
      sessions_(tiers, sessions, metrics, cluster_, options.node_id, options.cluster_mode),
      admin_(options_, tiers, namespaces, sessions_, metrics, cluster_) {}

std::unique_ptr<transport::ConnectionState> BlockService::OnConnect(
    const transport::ConnectionInfo& info) {
  auto c = std::make_unique<Connection>();
  c->info = info;
  c->owner = g_next_owner.fetch_add(1, std::memory_order_relaxed);
  c->delivery = std::make_unique<SocketDelivery>(tiers_, c->owner);
  metrics_.Add(metrics_.connections_total);
  return c;
}

void BlockService::OnDisconnect(transport::ConnectionState& state) {
  blocks_.Disconnect(static_cast<Connection&>(state));
}

bool BlockService::Admitted(const transport::ConnectionState& state) const {
  return static_cast<const Connection&>(state).hello;
}

bool BlockService::RunsInline(uint16_t type) const {
  // In cluster mode a lookup or locate may ask peers: it goes to a worker like a get.
  if (type == wire::LOOKUP || type == wire::LOCATE) return cluster_.Get() == nullptr;
  // With gpu tiers a prefetch may wait for its placement on a GPU (and the disk reads before
  // it): a worker runs it.
  if (type == wire::PREFETCH) return tiers_.gpu_tiers().empty();
  return type == wire::RELEASE;
}

std::optional<Response> BlockService::TryInline(transport::ConnectionState& state,
                                                const FrameHeader& header, std::string_view body) {
  auto& c = static_cast<Connection&>(state);
  if (!c.hello) return std::nullopt;
  const auto start = std::chrono::steady_clock::now();
  Op op;
  std::optional<Response> r;
  switch (header.type) {
    case wire::GET:
      if (cluster_.Get() != nullptr) return std::nullopt;  // a miss may be a peer's to fetch
      op = Op::kGet;
      r = blocks_.TryGetInline(c, body);
      break;
    case wire::PUT_RESERVE:
      op = Op::kPutReserve;
      r = blocks_.TryPutReserveInline(c, body);
      break;
    case wire::PUT_COMMIT:
      op = Op::kPutCommit;
      r = blocks_.TryPutCommitInline(c, body);
      break;
    default:
      return std::nullopt;
  }
  if (r) {
    metrics_.latency[static_cast<size_t>(op)].Observe(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
            .count());
  }
  return r;
}

Status BlockService::PayloadSinks(transport::ConnectionState& state, const FrameHeader& header,
                                  std::string_view body, std::vector<PayloadSink>* sinks) {
  if (header.type != wire::PUT_COMMIT) {
    return Status::InvalidArgument("only PUT_COMMIT carries a payload");
  }
  return blocks_.PayloadSinks(static_cast<Connection&>(state), body, sinks);
}

Response BlockService::Handle(transport::ConnectionState& state, const FrameHeader& header,
                              std::string_view body) {
  auto& c = static_cast<Connection&>(state);
  const auto start = std::chrono::steady_clock::now();
  Op op = Op::kOther;
  Response r;
  if (header.type != wire::HELLO && !c.hello) {
    wire::GetResponse any;  // every response's field 1 is its Status
    r = Reply(header.type, any, Status::FailedPrecondition("say hello first"));
    c.commit.ids.clear();  // PayloadSinks may have run for a refused PUT_COMMIT
    c.commit.status.clear();
  } else {
    switch (header.type) {
      // Blocks.
      case wire::HELLO:
        r = blocks_.Hello(c, body);
        break;
      case wire::UCX_BIND:
        r = blocks_.UcxBind(c, body);
        break;
      case wire::LOOKUP:
        op = Op::kLookup;
        r = blocks_.Lookup(c, body);
        break;
      case wire::GET:
        op = Op::kGet;
        r = blocks_.Get(c, body);
        break;
      case wire::PUT_RESERVE:
        op = Op::kPutReserve;
        r = blocks_.PutReserve(c, body);
        break;
      case wire::PUT_COMMIT:
        op = Op::kPutCommit;
        r = blocks_.PutCommit(c, body);
        break;
      case wire::PUT_ABORT:
        r = blocks_.PutAbort(c, body);
        break;
      case wire::PREFETCH:
        op = Op::kPrefetch;
        r = blocks_.Prefetch(c, body);
        break;
      case wire::MAP_SEGMENTS:
        r = blocks_.MapSegments(c, body);
        break;
      case wire::RELEASE:
        r = blocks_.Release(c, body);
        break;
      case wire::REPORT_DAMAGED:
        r = blocks_.ReportDamaged(c, body);
        break;
      case wire::LOCATE:
        r = blocks_.Locate(c, body);
        break;
      case wire::GPU_LINK_JOIN:
        r = blocks_.GpuLinkJoin(c, body);
        break;
      case wire::GPU_OFFER:
        r = blocks_.GpuOffer(c, body);
        break;
      case wire::GPU_SEND:
        r = blocks_.GpuSend(c, body);
        break;
      // Sessions.
      case wire::SESSION_SAVE:
        op = Op::kSession;
        r = sessions_.Save(c, body);
        break;
      case wire::SESSION_LOAD:
        op = Op::kSession;
        r = sessions_.Load(c, body);
        break;
      case wire::SESSION_DELETE:
        op = Op::kSession;
        r = sessions_.Delete(c, body);
        break;
      case wire::SESSION_LIST:
        op = Op::kSession;
        r = sessions_.List(c, body);
        break;
      case wire::SESSION_VERSIONS:
        op = Op::kSession;
        r = sessions_.Versions(c, body);
        break;
      // Admin.
      case wire::STATS:
        r = admin_.Stats(c, body);
        break;
      case wire::EVICT:
        r = admin_.Evict(c, body);
        break;
      case wire::CLUSTER_MEMBERS:
        r = admin_.ClusterMembers(c, body);
        break;
      case wire::POLICIES:
        r = admin_.Policies(c, body);
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

}  // namespace kvpool::daemon
