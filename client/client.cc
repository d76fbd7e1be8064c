#include <kvpool/client.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <tuple>

#include "client/control_connection.h"
#include "client/device_buffers.h"
#include "client/peer_calls.h"
#include "client/segment_mappings.h"
#include "client/ucx_data_path.h"
#include "common/checksum.h"
#include "common/gpu_reach.h"
#include "common/packed_keys.h"
#include "common/tier_names.h"
#include "control.pb.h"
#include "transport/address.h"
#include "transport/arena_message.h"
#include "transport/frame.h"

// kvpool::Client: the public facade. It composes the control connection
// (client/control_connection.h), the shared-memory mappings (client/segment_mappings.h) and the
// UCX data path (client/ucx_data_path.h), and holds what a call does with them: splitting batches
// to the daemon's limits and choosing, per block, the path its bytes take.

namespace kvpool {

using client::ControlConnection;
using client::FromWire;
using client::GetStaging;
using client::SegmentMappings;
using client::StageToHost;
using client::UcxDataPath;
using transport::Deadline;
using transport::FrameHeader;

const char* TierName(Tier tier) { return TierNameOf(tier); }

bool PutResult::all_ok() const {
  return std::all_of(errors.begin(), errors.end(), [](const Status& s) { return s.ok(); });
}

namespace {
PolicyInfo PolicyFromWire(const wire::NamespacePolicyInfo& p) {
  return {p.namespace_name(),   p.eviction(),       p.write(),  p.admission(),
          p.read_ahead(),       p.encoding(),       p.source(), p.host_quota_bytes(),
          p.disk_quota_bytes(), p.gpu_quota_bytes()};
}

Tier FromWire(int t) {
  switch (t) {
    case wire::TIER_GPU:
      return Tier::kGpu;
    case wire::TIER_HOST:
      return Tier::kHost;
    case wire::TIER_DISK:
      return Tier::kDisk;
    case wire::TIER_REMOTE:
      return Tier::kRemote;
    default:
      return Tier::kNone;
  }
}

std::string KeyBytes(const BlockKey& k) { return std::string(k.AsStringView()); }

// MAP_SEGMENTS over the control connection, for SegmentMappings.
class DaemonSegments final : public client::SegmentDescriptorSource {
 public:
  explicit DaemonSegments(ControlConnection& connection) : connection_(connection) {}

  Status MapSegments(const wire::MapSegmentsRequest& req, wire::MapSegmentsResponse* resp,
                     std::vector<int>* fds, Deadline deadline) override {
    KVPOOL_RETURN_IF_ERROR(connection_.ExchangeOnce(wire::MAP_SEGMENTS, req, {}, resp, deadline));
    *fds = connection_.TakeReceivedFds();
    return Status::OK();
  }

 private:
  ControlConnection& connection_;
};

}  // namespace

// What a BorrowedBlocks holds: its views, the memory they point into, and the leases that keep
// the daemon's copies in place.
struct BorrowedBlocks::State {
  std::vector<BlockView> views;
  std::vector<bool> lent;                          // views[i] points into the daemon's memory
  std::vector<std::vector<uint8_t>> owned;         // blocks that came as bytes
  std::vector<std::shared_ptr<const void>> holds;  // mappings and imported gpu segments
  std::vector<uint64_t> lease_ids;
  std::shared_ptr<Client::Impl*> client;        // null inside once the Client is gone
  kernels::DeviceCopyEngine* engine = nullptr;  // for device views (never destroyed)
  int device = -1;                              // BorrowOptions::gpu_device
  void* stream = nullptr;                       // BorrowOptions::cuda_stream
  uint64_t epoch = 0;                           // the client's connection the leases belong to
  std::chrono::steady_clock::time_point lease_deadline;
  bool released = false;

  void Reset(size_t n) {
    views.assign(n, BlockView{});
    lent.assign(n, false);
    owned.assign(n, {});
    holds.clear();
    lease_ids.clear();
  }
};

class Client::Impl {
 public:
  explicit Impl(ClientOptions options) : options_(std::move(options)), connection_(options_) {
    if (options_.address.empty()) options_.address = transport::DefaultSocketPath();
  }

  ~Impl() {
    *self_ = nullptr;  // blocks still borrowed no longer release through this client
    mappings_.UnmapAll();
    ucx_.Disconnect();
  }

  Status Connect() {
    // Segment numbers and generations belong to the daemon instance we talked to; leases, to
    // the connection.
    connection_.Close();
    ++epoch_;
    mappings_.UnmapAll();
    KVPOOL_RETURN_IF_ERROR(connection_.Dial());
    wire::HelloRequest req;
    req.set_protocol_version(transport::kProtocolVersion);
    req.set_namespace_name(options_.namespace_name);
    req.set_client_name(options_.client_name);
    req.set_admin(options_.admin);
    const bool tcp = transport::IsTcpAddress(options_.address);
    req.set_shared_memory(!tcp && (options_.data_path == DataPath::kAuto ||
                                   options_.data_path == DataPath::kSharedMemory));
    // UCX is not encrypted: over tls:// only when asked for by name.
    // After a failed bind, kAuto leaves UCX alone for a while (a firewalled UCX port would
    // otherwise cost every reconnect its wait).
    const bool want_ucx =
        options_.data_path == DataPath::kUcx || (options_.data_path == DataPath::kAuto && tcp &&
                                                 !transport::IsTlsAddress(options_.address) &&
                                                 std::chrono::steady_clock::now() >= ucx_retry_at_);
    Status ucx_start = Status::OK();
    if (want_ucx && !ucx_.started()) {
      ucx_start = ucx_.Start(options_.ucx_transports, options_.ucx_net_devices);
      if (!ucx_start.ok() && options_.data_path == DataPath::kUcx) {
        connection_.Close();
        return ucx_start.WithContext("starting UCX");
      }
    }
    req.set_ucx(want_ucx && ucx_.started());
    if (req.ucx()) req.set_ucx_client_id(ucx_.client_id());
    wire::HelloResponse resp;
    KVPOOL_RETURN_IF_ERROR(connection_.Hello(std::move(req), &resp));
    server_.node_id = resp.node_id();
    server_.daemon_version = resp.daemon_version();
    server_.max_block_bytes = resp.max_block_bytes();
    server_.max_payload_bytes = resp.max_payload_bytes();
    server_.max_batch_keys = std::max<uint32_t>(1, resp.max_batch_keys());
    server_.shared_memory = resp.shared_memory();
    server_.admin = resp.admin();
    server_.lease_timeout =
        std::chrono::milliseconds(resp.shared_memory() ? resp.lease_timeout_ms() : 0);
    mappings_.Reset(resp.segment_bytes());
    gpu_mappings_.clear();
    import_failed_.clear();
    server_.gpu_tiers.clear();
    for (const wire::GpuTierInfo& g : resp.gpu_tiers()) {
      server_.gpu_tiers.push_back({g.device(), g.segment_bytes(), g.capacity_bytes(), g.uuid()});
    }
    ucx_.Disconnect();
    server_.ucx = false;
    server_.ucx_refused.clear();
    ucx_lost_ = false;
    Status ucx_refused =
        !ucx_start.ok()
            ? ucx_start.WithContext("starting UCX")
            : Status::FailedPrecondition(
                  "kvpoold did not offer the UCX data path (it offers it on TCP connections, "
                  "with --listen and --ucx)");
    if (resp.ucx_port() != 0 && resp.ucx_port() <= 65535 && ucx_.started()) {
      ucx_refused = BindUcx(static_cast<uint16_t>(resp.ucx_port()));
      server_.ucx = ucx_refused.ok();
      if (!ucx_refused.ok()) {
        ucx_retry_at_ = std::chrono::steady_clock::now() + kUcxRetryAfter;
        last_ucx_refusal_ = ucx_refused.ToString();
      }
      if (connection_.broken()) return ucx_refused;
    }
    if (want_ucx && !server_.ucx) {
      server_.ucx_refused = ucx_refused.ToString();
    } else if (!want_ucx && options_.data_path == DataPath::kAuto && tcp &&
               !last_ucx_refusal_.empty() && std::chrono::steady_clock::now() < ucx_retry_at_) {
      server_.ucx_refused = "not asked for again until 30 s after: " + last_ucx_refusal_;
    }
    if (options_.data_path == DataPath::kUcx && !server_.ucx) {
      connection_.Close();
      return ucx_refused.WithContext("the UCX data path");
    }
    if (options_.data_path == DataPath::kSharedMemory && !server_.shared_memory) {
      connection_.Close();
      return Status::FailedPrecondition(
          "kvpoold did not grant the shared-memory data path (not a local Unix socket, or "
          "--shared_memory=false)");
    }
    return Status::OK();
  }

  // Makes the UCX endpoint to the daemon's listener and binds it to this connection
  // (transport/ucx_bind.h). Non-OK: no UCX (blocks go on the socket); the connection is broken
  // only when the UCX_BIND exchange itself failed.
  Status BindUcx(uint16_t port) {
    // On the address this connection reached (UCX is offered to TCP connections only), not the
    // host name again: that may resolve elsewhere (round-robin DNS), where kvpoold would refuse
    // the endpoint, having offered it to this connection's address only.
    std::string host = connection_.peer_ip();
    uint16_t control_port = 0;
    if (host.empty()) {
      KVPOOL_RETURN_IF_ERROR(transport::ParseHostPort(options_.address, &host, &control_port));
    }
    KVPOOL_ASSIGN_OR_RETURN(std::string nonce, ucx_.ConnectTo(host, port,
                                                              std::chrono::steady_clock::now() +
                                                                  connection_.connect_timeout()));
    wire::UcxBindRequest req;
    req.set_nonce(nonce);
    wire::UcxBindResponse resp;
    Status st = connection_.ExchangeOnce(wire::UCX_BIND, req, {}, &resp, connection_.NewDeadline());
    if (st.ok()) st = FromWire(resp.status());
    if (!st.ok()) {
      ucx_.Disconnect();
      return st.WithContext("UCX_BIND");
    }
    ucx_.Bound(resp.ucx_tag_prefix());
    return Status::OK();
  }

  // The UCX endpoint was dropped (a transfer past its deadline, or the endpoint failed): the
  // rest of this call goes on the socket, and the next call reconnects (a new hello makes a new
  // endpoint) where reconnecting is automatic.
  void DropUcx() {
    server_.ucx = false;
    server_.ucx_refused =
        "the UCX endpoint was lost (a transfer past its deadline, or the endpoint failed); the "
        "next call reconnects for a new one";
    ucx_lost_ = true;
  }

  // Runs `call` on a live connection, reconnecting as ControlConnection::Run decides.
  template <typename F>
  auto Run(F call) -> decltype(call()) {
    // An endpoint that failed while idle (the daemon restarted its UCX side, a network cut) is
    // replaced before the call rather than failing the call's blocks.
    if (server_.ucx && !ucx_.connected()) DropUcx();
    if (ucx_lost_ && options_.auto_reconnect) connection_.Close();
    return connection_.Run(call, [this] { return Connect(); });
  }

  // Where block i (of `size` bytes) goes: the caller's buffer, or one allocated on the spot.
  using BufferFor = std::function<MutableBuffer(size_t index, uint64_t size)>;

  // The engine device buffers are copied with: the CUDA runtime's unless a test gave one.
  Result<kernels::DeviceCopyEngine*> DeviceEngine() {
    if (device_engine_ == nullptr) {
      KVPOOL_ASSIGN_OR_RETURN(device_engine_, kernels::CudaCopyEngine());
    }
    return device_engine_;
  }
  static void UseCopyEngine(Client& client, kernels::DeviceCopyEngine* engine) {
    client.impl_->device_engine_ = engine;
  }
  static size_t StagingKeptBytes(Client& client) {
    return client.impl_->staging_pool_->kept_bytes();
  }
  // One request of the daemons' own (client/peer_calls.h).
  template <typename Req, typename Resp>
  static Status PeerCall(Client& client, uint16_t type, const Req& req, Resp* resp) {
    Impl& impl = *client.impl_;
    return impl
        .Run([&]() -> Result<bool> {
          KVPOOL_RETURN_IF_ERROR(impl.connection_.Simple(type, req, resp));
          return true;
        })
        .status();
  }

  struct InPlace {
    size_t index;
    uint32_t segment;
    uint32_t generation;
    uint64_t offset;
    uint64_t size;
    uint64_t checksum;
    uint64_t lease_id;
    Tier tier;
    bool gpu;  // the slot is in the daemon's gpu tier on `gpu_device`
    int gpu_device;
    // gpu slots: the gpu copy's (kernels/device_checksum.h); a slot without one is refused.
    std::optional<uint64_t> device_checksum;
    const uint8_t* src = nullptr;  // a queued host-to-device copy's source, hashed once it ran
  };

  // Device copies of one GET round, queued on the call's stream and not yet waited for, with the
  // leases and mappings they need until then (GetAsync hands them to its PendingGet).
  struct QueuedCopies {
    std::vector<InPlace> blocks;
    std::vector<size_t> to_device;  // indices into `blocks`: host to device
    std::vector<size_t> from_gpu;   // indices into `blocks`: out of a gpu slot
    std::vector<uint64_t> lease_ids;
    uint64_t epoch = 0;                              // the connection the leases belong to
    std::vector<std::shared_ptr<const void>> holds;  // host mappings, imported gpu segments
  };

  // Copies leased blocks from the shared segments into the caller's buffers, verifying each
  // one's checksum on the way, then releases the leases (no round trip). A device buffer gets
  // its block by one host-to-device copy from the mapping, verified while the copies run.
  // `local_gpu`: this process's ordinal of the GPU the gpu slots are imported for.
  // `queued` (may be null): device copies are left running and handed there, with their leases,
  // instead of waited for here.
  Status CopyInPlace(std::span<const BlockKey> keys, const BufferFor& buffer_for,
                     std::vector<InPlace> blocks, std::vector<GetResult>& out, GetStaging& staging,
                     int local_gpu, Deadline deadline, std::vector<QueuedCopies>* queued) {
    // Host slots through the segment mappings; gpu slots through imported gpu segments.
    std::vector<std::pair<uint32_t, uint32_t>> segs;
    std::vector<size_t> gpu_blocks;
    for (size_t k = 0; k < blocks.size(); ++k) {
      if (blocks[k].gpu) {
        gpu_blocks.push_back(k);
      } else {
        segs.emplace_back(blocks[k].segment, blocks[k].generation);
      }
    }
    Result<std::vector<Status>> mapped = std::vector<Status>{};
    if (!segs.empty()) {
      mapped = mappings_.EnsureMapped(segs, /*writable=*/false, segment_source_, deadline);
    }
    wire::ReleaseRequest release;
    for (const InPlace& b : blocks) release.add_lease_ids(b.lease_id);
    if (!mapped.ok()) {
      if (!connection_.broken()) {
        connection_.SendOnly(wire::RELEASE, release, deadline).IgnoreError();
      }
      return mapped.status();
    }
    std::vector<size_t> to_device;  // indices into `blocks` whose copy is queued
    std::vector<std::shared_ptr<const void>> holds;
    size_t host_k = 0;  // the next host block's place in `mapped`
    for (size_t k = 0; k < blocks.size(); ++k) {
      InPlace& b = blocks[k];
      if (b.gpu) continue;
      const Status& seg_status = (*mapped)[host_k++];
      GetResult& r = out[b.index];
      const MutableBuffer buf = buffer_for(b.index, b.size);
      if (!seg_status.ok()) {
        r.status = seg_status;
      } else if (!mappings_.Holds(b.offset, b.size)) {
        r.status = Status::Internal("block slot outside its segment");
      } else if (buf.data == nullptr || buf.capacity < b.size) {
        r.status = TooSmall(buf, b.size);
        r.size = b.size;
      } else if (buf.memory == Memory::kCuda) {
        b.src = mappings_.ReadBase(b.segment) + b.offset;
        mappings_.PinForCopies(b.segment, /*writable=*/false, local_gpu);
        r.status = staging.engine()->CopyAsync(
            buf.data, b.src, b.size, kernels::CopyDirection::kHostToDevice, staging.stream());
        if (r.status.ok()) {
          to_device.push_back(k);
          holds.push_back(mappings_.HoldRead(b.segment));
        }
      } else {
        const uint8_t* src = mappings_.ReadBase(b.segment) + b.offset;
        if (CopyWithChecksum(buf.data, src, b.size) != b.checksum) {
          r.status = Status::Corruption("block " + keys[b.index].ShortHex() +
                                        " changed while being read (lease expired?)");
        } else {
          r.status = Status::OK();
          r.size = b.size;
          r.tier = b.tier;
          r.checksum = b.checksum;
        }
      }
    }
    std::vector<size_t> from_gpu =
        CopyFromGpu(buffer_for, blocks, gpu_blocks, out, staging, local_gpu, deadline, holds);
    if (queued != nullptr && (!to_device.empty() || !from_gpu.empty())) {
      queued->push_back({std::move(blocks),
                         std::move(to_device),
                         std::move(from_gpu),
                         {release.lease_ids().begin(), release.lease_ids().end()},
                         epoch_,
                         std::move(holds)});
      return Status::OK();
    }
    if (!to_device.empty() || !from_gpu.empty()) {
      FinishQueued(keys, blocks, to_device, from_gpu, out, buffer_for,
                   staging.engine()->Wait(staging.stream()), *staging.engine(), staging.stream());
    }
    return connection_.SendOnly(wire::RELEASE, release, deadline);
  }

  // Lends leased blocks where they are: host slots through this client's read-only mappings
  // (held by `lend`, so they stay mapped), gpu slots through imported gpu segments. The leases
  // become `lend`'s, ended by BorrowedBlocks::Release. With `verify`, each host view is hashed
  // first and one that fails is Corruption.
  Status Lend(std::span<const BlockKey> keys, const std::vector<InPlace>& blocks,
              std::vector<GetResult>& out, BorrowedBlocks::State& lend, int local_gpu, bool verify,
              Deadline deadline) {
    for (const InPlace& b : blocks) lend.lease_ids.push_back(b.lease_id);
    std::vector<std::pair<uint32_t, uint32_t>> segs;
    for (const InPlace& b : blocks) {
      if (!b.gpu) segs.emplace_back(b.segment, b.generation);
    }
    std::vector<Status> mapped;
    if (!segs.empty()) {
      KVPOOL_ASSIGN_OR_RETURN(
          mapped, mappings_.EnsureMapped(segs, /*writable=*/false, segment_source_, deadline));
    }
    size_t host_k = 0;                     // the next host block's place in `mapped`
    std::vector<size_t> device_views;      // caller indices of the device views lent
    std::vector<uint64_t> refused_leases;  // of blocks not lent after all, ended at once
    std::vector<BlockKey> bad;             // gpu copies that failed their check here
    for (const InPlace& b : blocks) {
      GetResult& r = out[b.index];
      BlockView& v = lend.views[b.index];
      const uint8_t* data = nullptr;
      std::shared_ptr<const void> hold;
      if (!b.gpu) {
        r.status = mapped[host_k++];
        if (r.status.ok() && !mappings_.Holds(b.offset, b.size)) {
          r.status = Status::Internal("block slot outside its segment");
        }
        if (r.status.ok()) {
          data = mappings_.ReadBase(b.segment) + b.offset;
          hold = mappings_.HoldRead(b.segment);
          if (verify && BlockChecksum(data, b.size) != b.checksum) {
            r.status = Status::Corruption("block " + keys[b.index].ShortHex() +
                                          " failed its checksum in the host tier");
          }
        }
      } else if (b.offset + b.size > GpuSegmentBytes(b.gpu_device)) {
        r.status = Status::Internal("gpu slot outside its segment");
      } else if (!b.device_checksum) {
        r.status = Status::Corruption("kvpoold sent a gpu slot without its device checksum");
      } else {
        bool refused = false;
        Result<std::shared_ptr<kernels::ImportedSegment>> seg =
            GpuSegment(b.gpu_device, local_gpu, b.segment, b.generation, deadline, &refused);
        if (refused) import_refused_.push_back(b.index);
        r.status = seg.status();
        if (seg.ok()) {
          data = (*seg)->data() + b.offset;
          hold = *std::move(seg);
        }
      }
      if (!r.status.ok()) {
        refused_leases.push_back(b.lease_id);
        continue;
      }
      r.size = b.size;
      r.tier = b.tier;
      v = BlockView{Status::OK(),
                    data,
                    b.size,
                    b.gpu ? Memory::kCuda : Memory::kHost,
                    b.tier,
                    b.checksum,
                    b.gpu ? b.device_checksum.value_or(0) : 0};
      lend.lent[b.index] = true;
      lend.holds.push_back(std::move(hold));
      if (b.gpu) device_views.push_back(b.index);
    }
    if (!device_views.empty()) lend.engine = device_engine_;
    if (verify && !device_views.empty()) {
      std::vector<BlockView*> views;
      for (size_t i : device_views) views.push_back(&lend.views[i]);
      // Each view gets its status.
      VerifyDeviceViews(*device_engine_, views, lend.stream).IgnoreError();
      for (const InPlace& b : blocks) {
        BlockView& v = lend.views[b.index];
        if (!b.gpu || !lend.lent[b.index] || v.status.ok()) continue;
        out[b.index].status = v.status;
        v.data = nullptr;  // refused, not lent
        refused_leases.push_back(b.lease_id);
        if (v.status.code() == StatusCode::kCorruption) bad.push_back(keys[b.index]);
      }
    }
    if (!refused_leases.empty()) {
      std::erase_if(lend.lease_ids, [&](uint64_t id) {
        return std::find(refused_leases.begin(), refused_leases.end(), id) != refused_leases.end();
      });
      KVPOOL_RETURN_IF_ERROR(ReleaseLeases(refused_leases, epoch_));
    }
    DropBadGpuCopies(bad, epoch_);  // after their leases ended: the daemon drops them
    return Status::OK();
  }

  // Checks device views against their device checksums on their GPU; a view that fails turns
  // Corruption (or the reason the check could not run). The first failure, or OK.
  static Status VerifyDeviceViews(kernels::DeviceCopyEngine& engine,
                                  const std::vector<BlockView*>& views, void* stream) {
    std::vector<kernels::ByteRange> ranges;
    for (const BlockView* v : views) ranges.push_back({v->data, v->size});
    Result<std::vector<uint64_t>> dsums =
        engine.DeviceChecksums(ranges.data(), ranges.size(), stream);
    Status first;
    for (size_t k = 0; k < views.size(); ++k) {
      BlockView& v = *views[k];
      if (!dsums.ok()) {
        v.status = dsums.status().WithContext("checking a borrowed gpu copy");
      } else if ((*dsums)[k] != v.device_checksum) {
        v.status = Status::Corruption("a borrowed gpu copy does not match its device checksum");
      } else {
        continue;
      }
      if (first.ok()) first = v.status;
    }
    return first;
  }

  // EVICT of `keys` from `tier` on the connection as it is (Client::Evict runs it under Run).
  Result<EvictResult> EvictKeys(Tier tier, std::span<const BlockKey> keys) {
    wire::EvictRequest req;
    req.set_tier(tier == Tier::kHost  ? wire::TIER_HOST
                 : tier == Tier::kGpu ? wire::TIER_GPU
                                      : wire::TIER_DISK);
    for (const BlockKey& k : keys) req.add_keys(KeyBytes(k));
    wire::EvictResponse resp;
    KVPOOL_RETURN_IF_ERROR(connection_.Simple(wire::EVICT, req, &resp));
    return EvictResult{resp.evicted(), resp.skipped()};
  }

  // Gpu copies that failed their check in this client (after their leases ended): reported, so
  // the daemon checks them itself and drops the bad ones, and the next reads come from host
  // instead of failing again. Best effort (the next read that fails reports again), on
  // connection `epoch` only.
  void DropBadGpuCopies(const std::vector<BlockKey>& keys, uint64_t epoch) {
    if (keys.empty() || epoch != epoch_ || connection_.broken()) return;
    wire::ReportDamagedRequest req;
    req.set_tier(wire::TIER_GPU);
    for (const BlockKey& k : keys) req.add_keys(KeyBytes(k));
    wire::ReportDamagedResponse resp;
    connection_.Simple(wire::REPORT_DAMAGED, req, &resp).IgnoreError();
  }

  // Ends leases taken on connection `epoch` (those of an earlier connection ended with it).
  Status ReleaseLeases(const std::vector<uint64_t>& ids, uint64_t epoch) {
    if (epoch != epoch_ || connection_.broken()) return Status::OK();
    const Deadline deadline = connection_.NewDeadline();
    for (size_t start = 0; start < ids.size(); start += server_.max_batch_keys) {
      wire::ReleaseRequest release;
      const size_t end = std::min(ids.size(), start + server_.max_batch_keys);
      for (size_t i = start; i < end; ++i) release.add_lease_ids(ids[i]);
      KVPOOL_RETURN_IF_ERROR(connection_.SendOnly(wire::RELEASE, release, deadline));
    }
    return Status::OK();
  }

  static Status TooSmall(const MutableBuffer& buf, uint64_t size) {
    return Status::InvalidArgument("buffer of " + std::to_string(buf.capacity) +
                                   " bytes is too small for the " + std::to_string(size) +
                                   "-byte block");
  }

  // The daemon's ordinal of this process's CUDA device `local`, matched by UUID (the two may
  // number GPUs differently, e.g. under CUDA_VISIBLE_DEVICES). InvalidArgument when the daemon
  // runs no gpu tier on it (or `local` names no CUDA device here); Unavailable when the daemon
  // runs gpu tiers and this process has no CUDA.
  Result<int> DaemonGpuOf(int local) {
    if (server_.gpu_tiers.empty()) {
      return Status::InvalidArgument("kvpoold runs no gpu tier (or not on this connection)");
    }
    KVPOOL_ASSIGN_OR_RETURN(kernels::DeviceCopyEngine * engine, DeviceEngine());
    KVPOOL_ASSIGN_OR_RETURN(const std::string uuid, UuidOf(*engine, local));
    for (const GpuTierInfo& g : server_.gpu_tiers) {
      if (!g.uuid.empty() && g.uuid == uuid) return g.device;
    }
    return Status::InvalidArgument("kvpoold runs no gpu tier on this process's CUDA device " +
                                   std::to_string(local));
  }

  // The UUID of this process's CUDA device `local`, asked once.
  Result<std::string> UuidOf(kernels::DeviceCopyEngine& engine, int local) {
    auto known = device_uuids_.find(local);
    if (known == device_uuids_.end()) {
      Result<std::string> uuid = engine.DeviceUuid(local);
      if (!uuid.ok()) {
        return Status::InvalidArgument("CUDA device " + std::to_string(local) +
                                       " of this process: " + uuid.status().ToString());
      }
      known = device_uuids_.emplace(local, *std::move(uuid)).first;
    }
    return known->second;
  }

  // The daemon's gpu devices other than `own` (its ordinal of `local`, or -1) whose gpu tiers
  // this process's CUDA device `local` reads peer to peer (GpuReach::peers' bits): the GPU is
  // one this process sees, `local` reaches it (cudaDeviceCanAccessPeer), and no import of that
  // tier for `local` has failed since the last hello.
  uint64_t PeerGpusOf(int local, int own) {
    Result<kernels::DeviceCopyEngine*> engine = DeviceEngine();
    if (!engine.ok() || local < 0) return 0;
    uint64_t peers = 0;
    for (const GpuTierInfo& g : server_.gpu_tiers) {
      if (g.device == own || g.device < 0 || g.device > GpuReach::kMaxPeerDevice ||
          g.uuid.empty() || import_failed_.contains({local, g.device})) {
        continue;
      }
      if (device_count_ < 0) device_count_ = (*engine)->DeviceCount();
      for (int other = 0; other < device_count_; ++other) {
        if (other == local) continue;
        Result<std::string> uuid = UuidOf(**engine, other);
        if (!uuid.ok() || *uuid != g.uuid) continue;
        auto known = peer_access_.find({local, other});
        if (known == peer_access_.end()) {
          known = peer_access_
                      .emplace(std::make_pair(local, other), (*engine)->CanAccessPeer(local, other))
                      .first;
        }
        if (known->second) peers |= uint64_t{1} << g.device;
        break;
      }
    }
    return peers;
  }

  uint64_t GpuSegmentBytes(int daemon_gpu) const {
    for (const GpuTierInfo& g : server_.gpu_tiers) {
      if (g.device == daemon_gpu) return g.segment_bytes;
    }
    return 0;
  }

  // Gpu segment (daemon_gpu, segment, generation) mapped for this process's device
  // `local_gpu` (the same GPU, or one that reaches it peer to peer), imported on first use. An
  // import keeps the segment's memory allocated on the daemon's GPU, also after the daemon renewed
  // the segment (gave it fresh memory, for another namespace): so imports unused for kGpuImportIdle
  // are dropped at the next call here, and an import of an older generation when the segment is
  // next met. A copy in flight holds its own reference. `refused` (may be null) is set when the
  // import itself failed (the pair goes into import_failed_).
  Result<std::shared_ptr<kernels::ImportedSegment>> GpuSegment(int daemon_gpu, int local_gpu,
                                                               uint32_t segment,
                                                               uint32_t generation,
                                                               Deadline deadline,
                                                               bool* refused = nullptr) {
    const int device = daemon_gpu;
    const auto now = std::chrono::steady_clock::now();
    const GpuMappingKey key{device, segment, local_gpu};
    std::erase_if(gpu_mappings_, [&](const auto& m) {
      return m.first != key && now - m.second.last_used > kGpuImportIdle;
    });
    auto it = gpu_mappings_.find(key);
    if (it != gpu_mappings_.end() && it->second.generation == generation) {
      it->second.last_used = now;
      return it->second.segment;
    }
    if (it != gpu_mappings_.end()) gpu_mappings_.erase(it);  // a stale generation
    const uint64_t bytes = GpuSegmentBytes(daemon_gpu);
    wire::MapSegmentsRequest req;
    req.set_gpu(true);
    req.set_gpu_device(device);
    wire::SegmentRequest* sr = req.add_segments();
    sr->set_segment(segment);
    sr->set_generation(generation);
    wire::MapSegmentsResponse resp;
    std::vector<int> fds;
    KVPOOL_RETURN_IF_ERROR(segment_source_.MapSegments(req, &resp, &fds, deadline));
    KVPOOL_RETURN_IF_ERROR(FromWire(resp.status()));
    if (resp.results_size() != 1) {
      for (int fd : fds) close(fd);
      return Status::Internal("kvpoold answered a gpu MAP_SEGMENTS with the wrong count");
    }
    if (Status one = FromWire(resp.results(0)); !one.ok()) {
      for (int fd : fds) close(fd);
      return one;
    }
    if (fds.size() != 1) {
      for (int fd : fds) close(fd);
      return Status::Internal("kvpoold sent no descriptor for a gpu segment");
    }
    Result<std::unique_ptr<kernels::ImportedSegment>> imported =
        device_engine_->ImportSegment(fds[0], bytes, local_gpu);
    close(fds[0]);
    if (!imported.ok()) {
      // This process's device cannot reach that gpu tier (no peer access, an old driver): the
      // next gets and puts on it ask for host slots there.
      import_failed_.insert({local_gpu, device});
      if (refused != nullptr) *refused = true;
      return imported.status().WithContext("importing a gpu segment");
    }
    GpuMapping& m = gpu_mappings_[key];
    m.generation = generation;
    m.segment = std::move(imported).value();
    m.last_used = now;
    return m.segment;
  }

  // Queues the copies out of gpu slots (device to device, or device to host for a host buffer);
  // returns the indices into `blocks` of those queued.
  std::vector<size_t> CopyFromGpu(const BufferFor& buffer_for, const std::vector<InPlace>& blocks,
                                  const std::vector<size_t>& gpu_blocks,
                                  std::vector<GetResult>& out, GetStaging& staging, int local_gpu,
                                  Deadline deadline,
                                  std::vector<std::shared_ptr<const void>>& holds) {
    std::vector<size_t> queued;
    for (size_t k : gpu_blocks) {
      const InPlace& b = blocks[k];
      GetResult& r = out[b.index];
      const MutableBuffer buf = buffer_for(b.index, b.size);
      if (staging.engine() == nullptr) {
        r.status = Status::Internal("kvpoold sent a gpu slot to a get without device buffers");
        continue;
      }
      if (buf.data == nullptr || buf.capacity < b.size) {
        r.status = TooSmall(buf, b.size);
        r.size = b.size;
        continue;
      }
      if (b.offset + b.size > GpuSegmentBytes(b.gpu_device)) {
        r.status = Status::Internal("gpu slot outside its segment");
        continue;
      }
      bool refused = false;
      Result<std::shared_ptr<kernels::ImportedSegment>> seg =
          GpuSegment(b.gpu_device, local_gpu, b.segment, b.generation, deadline, &refused);
      if (refused) import_refused_.push_back(b.index);
      if (!seg.ok()) {
        r.status = seg.status();
        continue;
      }
      r.status = staging.engine()->CopyAsync(buf.data, (*seg)->data() + b.offset, b.size,
                                             buf.memory == Memory::kCuda
                                                 ? kernels::CopyDirection::kDeviceToDevice
                                                 : kernels::CopyDirection::kDeviceToHost,
                                             staging.stream());
      if (r.status.ok()) {
        queued.push_back(k);
        holds.push_back(*std::move(seg));
      }
    }
    return queued;
  }

  // Once the queued copies are done (`done`: how waiting for them went), verifies: the leased
  // host sources of host-to-device copies (hashed after the copies, so a change during them
  // shows), a copy out of a gpu slot into host memory by its checksum, and one into device memory
  // by the gpu copy's device checksum, computed over the destination on its GPU (on `stream`).
  // Uses nothing of the client's but what it is given (a PendingGet may outlive the client).
  static void FinishQueued(std::span<const BlockKey> keys, const std::vector<InPlace>& blocks,
                           const std::vector<size_t>& to_device,
                           const std::vector<size_t>& from_gpu, std::vector<GetResult>& out,
                           const BufferFor& buffer_for, const Status& done,
                           kernels::DeviceCopyEngine& engine, void* stream) {
    const auto changed = [&](const InPlace& b) {
      return Status::Corruption("block " + keys[b.index].ShortHex() +
                                " changed while being read (lease expired?)");
    };
    for (size_t k : to_device) {
      const InPlace& b = blocks[k];
      GetResult& r = out[b.index];
      if (!done.ok()) {
        r.status = done.WithContext("copying to the device");
      } else if (BlockChecksum(b.src, b.size) != b.checksum) {
        r.status = changed(b);
      } else {
        r.size = b.size;
        r.tier = b.tier;
      }
    }
    // The device-to-device copies' destinations, checked on their GPU in one launch.
    std::vector<kernels::ByteRange> on_device;
    for (size_t k : from_gpu) {
      const MutableBuffer buf = buffer_for(blocks[k].index, blocks[k].size);
      if (buf.memory == Memory::kCuda) on_device.push_back({buf.data, blocks[k].size});
    }
    Result<std::vector<uint64_t>> dsums = std::vector<uint64_t>{};
    if (done.ok() && !on_device.empty()) {
      dsums = engine.DeviceChecksums(on_device.data(), on_device.size(), stream);
    }
    size_t next_dsum = 0;
    for (size_t k : from_gpu) {
      const InPlace& b = blocks[k];
      GetResult& r = out[b.index];
      const MutableBuffer buf = buffer_for(b.index, b.size);
      if (!done.ok()) {
        r.status = done.WithContext("copying from the gpu tier");
      } else if (buf.memory != Memory::kCuda) {
        if (BlockChecksum(static_cast<const uint8_t*>(buf.data), b.size) != b.checksum) {
          r.status = changed(b);
        } else {
          r.size = b.size;
          r.tier = b.tier;
          r.checksum = b.checksum;
        }
      } else if (!dsums.ok()) {
        r.status = dsums.status().WithContext("checking a copy from the gpu tier");
      } else if (!b.device_checksum || (*dsums)[next_dsum] != *b.device_checksum) {
        r.status = Status::Corruption("block " + keys[b.index].ShortHex() +
                                      " failed its device checksum after the copy from the gpu "
                                      "tier");
      } else {
        r.size = b.size;
        r.tier = b.tier;
      }
      if (buf.memory == Memory::kCuda) ++next_dsum;
    }
  }

  // Counts a PUT_COMMIT's per-block results into `result`; blocks[j] is the caller's index of
  // the j-th committed block.
  static Status TallyCommit(const wire::PutCommitResponse& resp, const std::vector<size_t>& blocks,
                            PutResult& result) {
    KVPOOL_RETURN_IF_ERROR(FromWire(resp.status()));
    if (resp.results_size() != static_cast<int>(blocks.size())) {
      return Status::Internal("kvpoold answered a PUT_COMMIT with the wrong count");
    }
    for (size_t j = 0; j < blocks.size(); ++j) {
      Status st = FromWire(resp.results(static_cast<int>(j)));
      if (st.ok()) {
        ++result.stored;
      } else {
        result.errors[blocks[j]] = st;
      }
    }
    return Status::OK();
  }

  struct OverUcx {
    size_t index;     // in the caller's keys
    size_t position;  // in the request (the tag offset)
    uint64_t size;
    uint64_t checksum;
    Tier tier;
  };

  // Receives blocks the daemon sends as tagged UCX messages straight into the caller's buffers
  // and verifies each.
  void ReceiveOverUcx(std::span<const BlockKey> keys, const BufferFor& buffer_for,
                      uint64_t tag_base, const std::vector<OverUcx>& blocks,
                      std::vector<GetResult>& out, Deadline deadline) {
    std::vector<UcxDataPath::IncomingBlock> incoming(blocks.size());
    for (size_t k = 0; k < blocks.size(); ++k) {
      const OverUcx& b = blocks[k];
      incoming[k] = {tag_base + b.position,
                     keys[b.index],
                     buffer_for(b.index, b.size),
                     b.size,
                     b.checksum,
                     b.tier};
    }
    std::vector<GetResult> results = ucx_.ReceiveBlocks(incoming, deadline);
    if (!ucx_.connected()) DropUcx();
    for (size_t k = 0; k < blocks.size(); ++k) {
      GetResult& r = out[blocks[k].index];
      const GetResult described = r;  // what the response said of it, kept
      r = std::move(results[k]);
      r.lossy_encoding = described.lossy_encoding;
      r.encoding = described.encoding;
      r.layout = described.layout;
      r.parent = described.parent;
    }
  }

  // Sends reserved blocks as tagged UCX messages and commits them in one PUT_COMMIT.
  Status CommitOverUcx(std::span<const PutBlock> blocks,
                       const std::vector<std::pair<size_t, uint64_t>>& reserved,
                       PutResult& result) {
    const Deadline deadline = connection_.NewDeadline();
    const uint64_t tag_base = ucx_.NextPutTagBase();
    wire::PutCommitRequest commit;
    commit.set_via_ucx(true);
    commit.set_ucx_tag_base(tag_base);
    for (const auto& [index, rid] : reserved) {
      commit.add_reservation_ids(rid);
      commit.add_sizes(blocks[index].size);
    }
    KVPOOL_ASSIGN_OR_RETURN(uint64_t request_id,
                            connection_.SendRequest(wire::PUT_COMMIT, commit, {}, deadline));
    std::vector<UcxDataPath::OutgoingBlock> bodies;
    bodies.reserve(reserved.size());
    for (const auto& [index, rid] : reserved) {
      bodies.push_back({blocks[index].data, blocks[index].size});
    }
    // The daemon answers once its receives ended (a failed send fails that block there too), so
    // each send's own status is not needed.
    ucx_.SendBlocks(tag_base, bodies, deadline);
    if (!ucx_.connected()) DropUcx();
    wire::PutCommitResponse cresp;
    KVPOOL_RETURN_IF_ERROR(
        connection_.ReceiveResponse(wire::PUT_COMMIT, request_id, &cresp, deadline));
    std::vector<size_t> indices;
    for (const auto& [index, rid] : reserved) indices.push_back(index);
    return TallyCommit(cresp, indices, result);
  }

  // `staging` takes the blocks meant for device buffers that do not come through shared memory.
  // `gpu_device` >= 0: the device buffers are on that device; blocks in the daemon's gpu tier
  // there come as gpu slots and are copied device to device.
  // `lend`: blocks the daemon names in place are lent into it (views under leases) instead of
  // copied into buffer_for's buffers.
  Result<std::vector<GetResult>> Get(std::span<const BlockKey> keys, const BufferFor& buffer_for,
                                     bool accept_encoded, GetStaging& staging, int gpu_device,
                                     BorrowedBlocks::State* lend = nullptr, bool verify_lent = true,
                                     std::vector<QueuedCopies>* queued = nullptr) {
    const BufferFor host_buffer_for = [&](size_t i, uint64_t size) {
      return staging.HostTarget(i, buffer_for(i, size), size);
    };
    std::vector<GetResult> out(keys.size());
    std::vector<size_t> todo(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) todo[i] = i;
    while (!todo.empty()) {
      std::vector<size_t> deferred;
      // Blocks whose gpu slot could not be imported here: asked again, from host.
      std::vector<size_t> through_host;
      for (size_t start = 0; start < todo.size(); start += server_.max_batch_keys) {
        const size_t end = std::min(todo.size(), start + server_.max_batch_keys);
        // The daemon's ordinal for the buffers' GPU, when it runs a gpu tier there, and its gpu
        // tiers on GPUs that one reads peer to peer; each batch, since a gpu tier this process
        // failed to import is asked for no more.
        GpuReach reach;
        if (gpu_device >= 0 && server_.shared_memory && !server_.gpu_tiers.empty()) {
          Result<int> d = DaemonGpuOf(gpu_device);
          if (d.ok() && !import_failed_.contains({gpu_device, *d})) reach.device = *d;
          reach.peers = PeerGpusOf(gpu_device, d.ok() ? *d : -1);
        }
        wire::GetRequest req;
        std::string* packed = req.mutable_packed_keys();
        packed->reserve((end - start) * BlockKey::kSize);
        for (size_t j = start; j < end; ++j) packed->append(keys[todo[j]].AsStringView());
        req.set_in_place(server_.shared_memory);
        req.set_accept_encoded(accept_encoded);
        if (reach.Any()) {
          req.set_to_gpu(true);
          req.set_gpu_device(reach.device);
          for (int d = 0; d <= GpuReach::kMaxPeerDevice; ++d) {
            if ((reach.peers >> d) & 1) req.add_peer_gpu_devices(d);
          }
        }
        const bool via_ucx = server_.ucx && !server_.shared_memory;
        const uint64_t tag_base = ucx_.NextGetTagBase();
        if (via_ucx) {
          req.set_via_ucx(true);
          req.set_ucx_tag_base(tag_base);
        }
        // Parsed without an allocation per block (transport/arena_message.h).
        transport::ArenaMessage<wire::GetResponse> answer;
        wire::GetResponse& resp = *answer;
        FrameHeader rh;
        const Deadline deadline = connection_.NewDeadline();
        KVPOOL_RETURN_IF_ERROR(connection_.ExchangeOnce(wire::GET, req, {}, &resp, deadline, &rh));
        Status st = FromWire(resp.status());
        if (!st.ok()) {
          KVPOOL_RETURN_IF_ERROR(connection_.DiscardPayload(rh.payload_bytes, deadline));
          return st;
        }
        if (resp.blocks_size() != static_cast<int>(end - start)) {
          connection_.Close();
          return Status::Internal("kvpoold answered a GET with the wrong number of blocks");
        }
        uint64_t consumed = 0;
        std::vector<InPlace> in_place;
        wire::ReleaseRequest stray;  // leases of gpu slots on devices not asked for
        std::vector<OverUcx> over_ucx;
        for (size_t j = start; j < end; ++j) {
          const size_t i = todo[j];
          const wire::BlockInfo& info = resp.blocks(static_cast<int>(j - start));
          GetResult& r = out[i];
          if (info.code() == static_cast<int>(StatusCode::kResourceExhausted) && info.size() == 0) {
            deferred.push_back(i);  // did not fit in this response frame
            continue;
          }
          if (info.code() != 0) {
            r.status = info.code() == static_cast<int>(StatusCode::kNotFound)
                           ? Status::NotFound("not cached")
                           : Status(static_cast<StatusCode>(info.code()), "daemon error");
            continue;
          }
          const uint64_t size = info.size();
          const uint64_t largest = std::min(server_.max_block_bytes, transport::kLargestBlockBytes);
          if (size > largest) {
            // Nothing is sized from a block the daemon may not send (a peer that lies).
            connection_.Close();
            return Status::Internal("kvpoold at " + options_.address + " announced a block of " +
                                    std::to_string(size) + " bytes, above the largest it may " +
                                    "send (" + std::to_string(largest) + ")");
          }
          r.lossy_encoding = static_cast<int>(info.lossy_encoding());
          r.encoding = static_cast<int>(info.encoding());
          if (Result<BlockKey> parent = BlockKey::FromBytes(info.parent()); parent.ok()) {
            r.parent = *parent;
          }
          if (r.encoding != 0) {
            const wire::BlockLayout& l = info.layout();
            r.layout = {l.layers(), l.kv_heads(), l.head_dim(),
                        l.tokens(), l.dtype(),    l.encoding()};
          }
          if (info.lease_id() != 0) {
            const int on = info.slot().gpu_device();
            if (info.slot().gpu() && !reach.Reaches(on)) {
              // Nothing is imported or copied for a device this get did not name.
              stray.add_lease_ids(info.lease_id());
              r.status = Status::Internal("kvpoold sent a gpu slot on device " +
                                          std::to_string(on) + ", which this get did not ask for");
              continue;
            }
            in_place.push_back({i, info.slot().segment(), info.slot().generation(),
                                info.slot().offset(), size, info.checksum(), info.lease_id(),
                                FromWire(info.tier()), info.slot().gpu(), info.slot().gpu_device(),
                                info.has_device_checksum()
                                    ? std::optional<uint64_t>(info.device_checksum())
                                    : std::nullopt});
            continue;
          }
          if (via_ucx) {
            over_ucx.push_back({i, j - start, size, info.checksum(), FromWire(info.tier())});
            continue;
          }
          consumed += size;
          if (consumed > rh.payload_bytes) {
            connection_.Close();
            return Status::Internal("GET response payload shorter than its block list");
          }
          const MutableBuffer buf = host_buffer_for(i, size);
          if (buf.data == nullptr || buf.capacity < size) {
            KVPOOL_RETURN_IF_ERROR(connection_.DiscardPayload(size, deadline));
            r.status = Status::InvalidArgument("buffer of " + std::to_string(buf.capacity) +
                                               " bytes is too small for the " +
                                               std::to_string(size) + "-byte block");
            r.size = size;
            continue;
          }
          KVPOOL_RETURN_IF_ERROR(connection_.ReceivePayload(buf.data, size, deadline));
          if (BlockChecksum(buf.data, size) != info.checksum()) {
            r.status = Status::Corruption("block " + keys[i].ShortHex() +
                                          " failed its checksum in transfer");
            continue;
          }
          r.status = Status::OK();
          r.size = size;
          r.tier = FromWire(info.tier());
          r.checksum = info.checksum();
        }
        if (consumed != rh.payload_bytes) {
          connection_.Close();
          return Status::Internal("GET response payload longer than its block list");
        }
        if (stray.lease_ids_size() > 0) {
          KVPOOL_RETURN_IF_ERROR(connection_.SendOnly(wire::RELEASE, stray, deadline));
        }
        import_refused_.clear();
        if (!in_place.empty() && lend != nullptr) {
          KVPOOL_RETURN_IF_ERROR(
              Lend(keys, in_place, out, *lend, gpu_device, verify_lent, deadline));
        } else if (!in_place.empty()) {
          KVPOOL_RETURN_IF_ERROR(CopyInPlace(keys, buffer_for, std::move(in_place), out, staging,
                                             gpu_device, deadline, queued));
        }
        for (size_t i : import_refused_) {
          out[i] = GetResult{};  // its lease ended with the others' (or at once, when lent)
          through_host.push_back(i);
        }
        if (!over_ucx.empty()) {
          ReceiveOverUcx(keys, host_buffer_for, tag_base, over_ucx, out, deadline);
        }
      }
      if (deferred.size() == todo.size()) {
        return Status::Internal("kvpoold deferred every block of a GET");
      }
      // Ends: each block asked again through host added a pair to import_failed_.
      deferred.insert(deferred.end(), through_host.begin(), through_host.end());
      todo = std::move(deferred);
    }
    return out;
  }

  // `device`: the engine for the blocks in device memory (nullptr when there are none).
  // `daemon_gpu` >= 0: the daemon places what it commits in that gpu tier (shared memory only);
  // with device blocks, it gives slots there where it has room, which this process writes
  // through its mapping on `local_gpu` (its ordinal of that GPU) device to device.
  // `ask_again`: blocks answered IN_PROGRESS are asked for once more at the end (see there).
  Result<PutResult> Put(std::span<const PutBlock> blocks, kernels::DeviceCopyEngine* device,
                        void* stream, int daemon_gpu = -1, int local_gpu = -1,
                        bool ask_again = true) {
    if (device != nullptr && !server_.shared_memory) {
      // Only the shared-memory path copies device memory into its slot directly.
      std::vector<std::vector<uint8_t>> storage;
      KVPOOL_ASSIGN_OR_RETURN(std::vector<PutBlock> host,
                              StageToHost(*device, stream, blocks, storage));
      return Put(host, nullptr, nullptr);
    }
    PutResult result;
    result.errors.assign(blocks.size(), Status::OK());
    // Slots in the daemon's gpu tier: for device blocks, where this process can map that tier.
    // A block whose caller gave its xxh3 goes through host, where it is checked before commit.
    const bool gpu_slots = device != nullptr && daemon_gpu >= 0 && local_gpu >= 0 &&
                           server_.shared_memory &&
                           !import_failed_.contains({local_gpu, daemon_gpu}) &&
                           std::none_of(blocks.begin(), blocks.end(),
                                        [](const PutBlock& b) { return b.checksum.has_value(); });
    std::vector<uint64_t> checksums(blocks.size());
    std::vector<size_t> in_progress;  // blocks another writer was putting
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (blocks[i].size == 0 || blocks[i].data == nullptr) {
        result.errors[i] = Status::InvalidArgument("block " + std::to_string(i) + " is empty");
      } else if (blocks[i].size > server_.max_block_bytes) {
        result.errors[i] = Status::InvalidArgument(
            "block " + std::to_string(i) + " of " + std::to_string(blocks[i].size) +
            " bytes exceeds the daemon's limit of " + std::to_string(server_.max_block_bytes));
      } else if (!server_.shared_memory) {
        // In place, the block is hashed while it is copied into its slot instead.
        checksums[i] = blocks[i].checksum.value_or(BlockChecksum(blocks[i].data, blocks[i].size));
      }
    }
    // Rounds of at most max_batch_keys blocks and max_payload_bytes bytes: what one round
    // reserves in the daemon's host tier is bounded, and fits one commit frame.
    size_t end = 0;
    for (size_t start = 0; start < blocks.size(); start = end) {
      uint64_t round_bytes = 0;
      end = start;
      while (end < blocks.size() && end - start < server_.max_batch_keys &&
             (end == start || round_bytes + blocks[end].size <= server_.max_payload_bytes)) {
        if (result.errors[end].ok()) round_bytes += blocks[end].size;
        ++end;
      }
      // Built and parsed without an allocation per block (transport/arena_message.h).
      transport::ArenaMessage<wire::PutReserveRequest> request;
      wire::PutReserveRequest& req = *request;
      std::vector<size_t> asked;
      for (size_t i = start; i < end; ++i) {
        if (!result.errors[i].ok()) continue;
        wire::PutItem* item = req.add_items();
        item->set_key(KeyBytes(blocks[i].key));
        item->set_size(blocks[i].size);
        item->set_checksum(checksums[i]);
        if (!blocks[i].parent.IsZero()) item->set_parent(KeyBytes(blocks[i].parent));
        asked.push_back(i);
      }
      if (asked.empty()) continue;
      req.set_in_place(server_.shared_memory);
      // Half the deadline for other writers of these blocks: the rest is for the answer, the
      // commit and, for blocks still in progress, the second ask.
      req.set_wait_ms(static_cast<uint32_t>(
          std::clamp<int64_t>(options_.timeout.count() / 2, 1, int64_t{UINT32_MAX})));
      if (gpu_slots) {
        req.set_to_gpu(true);
        req.set_gpu_device(daemon_gpu);
      }
      transport::ArenaMessage<wire::PutReserveResponse> answer;
      wire::PutReserveResponse& resp = *answer;
      KVPOOL_RETURN_IF_ERROR(connection_.Simple(wire::PUT_RESERVE, req, &resp));
      if (resp.reservations_size() != static_cast<int>(asked.size())) {
        return Status::Internal("kvpoold answered a PUT_RESERVE with the wrong count");
      }
      std::vector<std::pair<size_t, uint64_t>> reserved;  // block index, reservation id
      std::vector<wire::SegmentSlot> slots;
      std::vector<std::pair<size_t, uint64_t>> reserved_gpu;  // the same, slots in gpu
      std::vector<wire::SegmentSlot> gpu_slots_given;
      for (size_t j = 0; j < asked.size(); ++j) {
        const wire::Reservation& r = resp.reservations(static_cast<int>(j));
        switch (r.state()) {
          case wire::RESERVED:
            if (r.slot().gpu()) {
              reserved_gpu.emplace_back(asked[j], r.reservation_id());
              gpu_slots_given.push_back(r.slot());
              break;
            }
            reserved.emplace_back(asked[j], r.reservation_id());
            slots.push_back(r.slot());
            break;
          case wire::PRESENT:
            ++result.already_present;
            break;
          case wire::IN_PROGRESS:
            ++result.in_progress;
            in_progress.push_back(asked[j]);
            break;
          default:
            result.errors[asked[j]] = Status(static_cast<StatusCode>(r.code()), r.message());
        }
      }
      if (!reserved_gpu.empty()) {
        if (!gpu_slots) return Status::Internal("kvpoold gave gpu slots to a put that asked none");
        std::vector<size_t> through_host;
        KVPOOL_RETURN_IF_ERROR(CommitIntoGpu(blocks, reserved_gpu, gpu_slots_given, result, *device,
                                             stream, local_gpu, through_host));
        if (!through_host.empty()) {
          // This process could not map the gpu tier: those blocks go through host instead (and
          // so do this client's later puts and gets on that GPU: import_failed_).
          std::vector<PutBlock> again;
          for (size_t i : through_host) again.push_back(blocks[i]);
          KVPOOL_ASSIGN_OR_RETURN(PutResult r, Put(again, device, stream, daemon_gpu));
          result.stored += r.stored;
          result.already_present += r.already_present;
          result.in_progress += r.in_progress;
          for (size_t j = 0; j < through_host.size(); ++j) {
            result.errors[through_host[j]] = r.errors[j];
          }
        }
      }
      if (server_.shared_memory && !reserved.empty()) {
        KVPOOL_RETURN_IF_ERROR(
            CommitInPlace(blocks, reserved, slots, result, device, stream, daemon_gpu, local_gpu));
        continue;
      }
      if (server_.ucx && !reserved.empty()) {
        KVPOOL_RETURN_IF_ERROR(CommitOverUcx(blocks, reserved, result));
        continue;
      }
      // Commit in frames that fit the daemon's payload limit, straight from caller memory.
      size_t k = 0;
      while (k < reserved.size()) {
        wire::PutCommitRequest commit;
        std::vector<iovec> iov;
        std::vector<size_t> in_frame;
        uint64_t bytes = 0;
        while (k < reserved.size()) {
          const PutBlock& b = blocks[reserved[k].first];
          if (!in_frame.empty() && bytes + b.size > server_.max_payload_bytes) break;
          commit.add_reservation_ids(reserved[k].second);
          commit.add_sizes(b.size);
          iov.push_back({const_cast<void*>(b.data), b.size});
          in_frame.push_back(reserved[k].first);
          bytes += b.size;
          ++k;
        }
        wire::PutCommitResponse cresp;
        KVPOOL_RETURN_IF_ERROR(connection_.ExchangeOnce(wire::PUT_COMMIT, commit, iov, &cresp,
                                                        connection_.NewDeadline()));
        KVPOOL_RETURN_IF_ERROR(TallyCommit(cresp, in_frame, result));
      }
    }
    if (ask_again && !in_progress.empty()) {
      // Asked again now that this connection holds no reservation of its own. In a namespace
      // that writes to disk on commit, kvpoold then waits for the other writer (a little while)
      // and answers PRESENT only for a block on disk: an OK put there means stored on disk. The
      // other writer may also have given up, and this put then stores the block itself.
      std::vector<PutBlock> again;
      for (size_t i : in_progress) again.push_back(blocks[i]);
      Result<PutResult> r = Put(again, device, stream, daemon_gpu, local_gpu, false);
      if (!r.ok()) {
        // What this put stored stands; these blocks' outcome is not known.
        for (size_t i : in_progress) result.errors[i] = r.status();
        result.in_progress -= static_cast<uint32_t>(in_progress.size());
        return result;
      }
      result.in_progress -= static_cast<uint32_t>(again.size());
      result.stored += r->stored;
      result.already_present += r->already_present;
      result.in_progress += r->in_progress;
      for (size_t j = 0; j < in_progress.size(); ++j) result.errors[in_progress[j]] = r->errors[j];
    }
    return result;
  }

  // Writes reserved blocks straight into their slots through writable mappings of this
  // namespace's segments, hashing as it copies, then commits them with those hashes (which the
  // daemon stores as given). A block in device memory is copied into its slot on `stream` by
  // `device` and hashed once the copies are done.
  Status CommitInPlace(std::span<const PutBlock> blocks,
                       const std::vector<std::pair<size_t, uint64_t>>& reserved,
                       const std::vector<wire::SegmentSlot>& slots, PutResult& result,
                       kernels::DeviceCopyEngine* device, void* stream, int daemon_gpu,
                       int local_gpu) {
    const Deadline deadline = connection_.NewDeadline();
    std::vector<std::pair<uint32_t, uint32_t>> segs;
    for (const wire::SegmentSlot& s : slots) segs.emplace_back(s.segment(), s.generation());
    KVPOOL_ASSIGN_OR_RETURN(
        std::vector<Status> mapped,
        mappings_.EnsureMapped(segs, /*writable=*/true, segment_source_, deadline));
    wire::PutCommitRequest commit;
    commit.set_in_place(true);
    if (daemon_gpu >= 0) {
      commit.set_to_gpu(true);
      commit.set_gpu_device(daemon_gpu);
    }
    wire::PutAbortRequest abort;
    std::vector<size_t> in_frame;
    const auto fail = [&](size_t k, Status why) {
      result.errors[reserved[k].first] = std::move(why);
      abort.add_reservation_ids(reserved[k].second);
    };
    // `copied`: the hash of the bytes now in the slot. The daemon stores it as given (it does not
    // read the slot again), so a block whose caller gave another checksum (a copy from another
    // store) is refused here: its bytes were damaged before they reached this client.
    const auto add = [&](size_t k, uint64_t copied) {
      const PutBlock& b = blocks[reserved[k].first];
      if (b.checksum.has_value() && *b.checksum != copied) {
        fail(k, Status::Corruption("block " + b.key.ShortHex() +
                                   ": its bytes do not match the checksum given with them"));
        return;
      }
      commit.add_checksums(copied);
      commit.add_reservation_ids(reserved[k].second);
      commit.add_sizes(b.size);
      in_frame.push_back(reserved[k].first);
    };
    std::vector<size_t> from_device;  // indices into `reserved` whose copy is queued
    for (size_t k = 0; k < reserved.size(); ++k) {
      const PutBlock& b = blocks[reserved[k].first];
      if (!mapped[k].ok() || !mappings_.Holds(slots[k].offset(), b.size)) {
        fail(k, mapped[k].ok() ? Status::Internal("reserved slot outside its segment") : mapped[k]);
        continue;
      }
      uint8_t* slot = mappings_.WriteBase(slots[k].segment()) + slots[k].offset();
      if (b.memory == Memory::kCuda) {
        mappings_.PinForCopies(slots[k].segment(), /*writable=*/true, local_gpu);
        Status st =
            device->CopyAsync(slot, b.data, b.size, kernels::CopyDirection::kDeviceToHost, stream);
        if (st.ok()) {
          from_device.push_back(k);
        } else {
          fail(k, std::move(st));
        }
        continue;
      }
      // One pass: copy into the slot and hash what was copied.
      add(k, CopyWithChecksum(slot, b.data, b.size, CopyCache::kBypass));
    }
    if (!from_device.empty()) {
      const Status done = device->Wait(stream);
      for (size_t k : from_device) {
        if (!done.ok()) {
          fail(k, done.WithContext("copying from the device"));
          continue;
        }
        const PutBlock& b = blocks[reserved[k].first];
        add(k, BlockChecksum(mappings_.WriteBase(slots[k].segment()) + slots[k].offset(), b.size));
      }
    }
    return AbortThenCommit(abort, commit, in_frame, result);
  }

  // The end of an in-place put: gives back the reservations in `abort`, then commits those in
  // `commit` (whose bytes are in their slots; in_frame[j]: the caller's index of the j-th) and
  // counts the outcome into `result`.
  Status AbortThenCommit(const wire::PutAbortRequest& abort, const wire::PutCommitRequest& commit,
                         const std::vector<size_t>& in_frame, PutResult& result) {
    if (abort.reservation_ids_size() > 0) {
      wire::PutAbortResponse aresp;
      KVPOOL_RETURN_IF_ERROR(connection_.Simple(wire::PUT_ABORT, abort, &aresp));
    }
    if (in_frame.empty()) return Status::OK();
    wire::PutCommitResponse cresp;
    KVPOOL_RETURN_IF_ERROR(
        connection_.ExchangeOnce(wire::PUT_COMMIT, commit, {}, &cresp, connection_.NewDeadline()));
    return TallyCommit(cresp, in_frame, result);
  }

  // Writes reserved blocks into their slots of the daemon's gpu tier (mapped on `local_gpu`),
  // device to device (host to device for a block in host memory), on `stream`; then checks what
  // landed there on the GPU (one kernel) and commits each with that device checksum, which the
  // daemon checks again on its side before it makes the block's host copy itself. A block whose
  // segment this process cannot map is aborted and left in `through_host` (indices into
  // `blocks`) for the caller to put through host.
  Status CommitIntoGpu(std::span<const PutBlock> blocks,
                       const std::vector<std::pair<size_t, uint64_t>>& reserved,
                       const std::vector<wire::SegmentSlot>& slots, PutResult& result,
                       kernels::DeviceCopyEngine& device, void* stream, int local_gpu,
                       std::vector<size_t>& through_host) {
    const Deadline deadline = connection_.NewDeadline();
    wire::PutCommitRequest commit;
    commit.set_in_place(true);
    wire::PutAbortRequest abort;
    std::vector<size_t> in_frame;
    const auto fail = [&](size_t k, Status why) {
      result.errors[reserved[k].first] = std::move(why);
      abort.add_reservation_ids(reserved[k].second);
    };
    std::vector<size_t> queued;  // indices into `reserved`
    std::vector<kernels::ByteRange> written;
    std::vector<std::shared_ptr<kernels::ImportedSegment>> holds;
    for (size_t k = 0; k < reserved.size(); ++k) {
      const PutBlock& b = blocks[reserved[k].first];
      const wire::SegmentSlot& s = slots[k];
      if (s.offset() + b.size > GpuSegmentBytes(s.gpu_device())) {
        fail(k, Status::Internal("reserved gpu slot outside its segment"));
        continue;
      }
      Result<std::shared_ptr<kernels::ImportedSegment>> seg =
          GpuSegment(s.gpu_device(), local_gpu, s.segment(), s.generation(), deadline);
      if (!seg.ok()) {
        abort.add_reservation_ids(reserved[k].second);
        through_host.push_back(reserved[k].first);
        continue;
      }
      uint8_t* slot = (*seg)->data() + s.offset();
      Status st =
          device.CopyAsync(slot, b.data, b.size,
                           b.memory == Memory::kCuda ? kernels::CopyDirection::kDeviceToDevice
                                                     : kernels::CopyDirection::kHostToDevice,
                           stream);
      if (!st.ok()) {
        fail(k, std::move(st));
        continue;
      }
      queued.push_back(k);
      written.push_back({slot, b.size});
      holds.push_back(*std::move(seg));
    }
    if (!queued.empty()) {
      Status done = device.Wait(stream);
      Result<std::vector<uint64_t>> dsums =
          done.ok() ? device.DeviceChecksums(written.data(), written.size(), stream)
                    : Result<std::vector<uint64_t>>(done.WithContext("copying into the gpu tier"));
      for (size_t j = 0; j < queued.size(); ++j) {
        const size_t k = queued[j];
        if (!dsums.ok()) {
          fail(k, dsums.status());
          continue;
        }
        commit.add_reservation_ids(reserved[k].second);
        commit.add_sizes(blocks[reserved[k].first].size);
        commit.add_device_checksums((*dsums)[j]);
        in_frame.push_back(reserved[k].first);
      }
    }
    return AbortThenCommit(abort, commit, in_frame, result);
  }

  ClientOptions options_;
  ServerInfo server_;
  // Destroyed last to first: the channel closes before the UCX engine goes.
  SegmentMappings mappings_;
  UcxDataPath ucx_;        // its engine is created at the first hello that wants UCX
  bool ucx_lost_ = false;  // DropUcx: reconnect before the next call
  // A bind failed: kAuto asks for UCX again from then on.
  std::chrono::steady_clock::time_point ucx_retry_at_;
  std::string last_ucx_refusal_;  // why, for ServerInfo::ucx_refused meanwhile
  static constexpr std::chrono::seconds kUcxRetryAfter{30};
  ControlConnection connection_;
  DaemonSegments segment_source_{connection_};
  kernels::DeviceCopyEngine* device_engine_ = nullptr;  // set at the first device buffer
  // Gpu segments imported through device_engine_, by (the daemon's device, segment, this
  // process's device it is mapped for).
  using GpuMappingKey = std::tuple<int, uint32_t, int>;
  struct GpuMapping {
    uint32_t generation = 0;
    std::shared_ptr<kernels::ImportedSegment> segment;
    std::chrono::steady_clock::time_point last_used;
  };
  // How long an imported gpu segment stays imported unused (see GpuSegment).
  static constexpr std::chrono::seconds kGpuImportIdle{10};
  std::map<GpuMappingKey, GpuMapping> gpu_mappings_;
  std::map<int, std::string> device_uuids_;  // this process's CUDA devices asked about so far
  // What this process's CUDA devices are and reach, asked once (the topology does not change).
  int device_count_ = -1;
  std::map<std::pair<int, int>, bool> peer_access_;  // CanAccessPeer(device, peer)
  // (this process's device, the daemon's gpu device) pairs whose import failed since the last
  // hello: reads and writes on that device then take host slots for that gpu tier.
  std::set<std::pair<int, int>> import_failed_;
  // The blocks (indices into a get's keys) whose gpu slot Lend or CopyFromGpu could not import
  // in the batch under way: Get asks for them again, from host.
  std::vector<size_t> import_refused_;
  uint64_t epoch_ = 0;  // counts connections (hellos), for borrowed blocks' leases
  // What borrowed blocks reach this client through; nulled when it goes.
  std::shared_ptr<Impl*> self_ = std::make_shared<Impl*>(this);
  // Pinned bounce buffers for device-bound blocks that come as bytes (GetAsync).
  const std::shared_ptr<client::StagingPool> staging_pool_ =
      std::make_shared<client::StagingPool>();
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

Result<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  KVPOOL_RETURN_IF_ERROR(impl->Connect());
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

namespace client {
void UseCopyEngineForTest(Client& client, kernels::DeviceCopyEngine* engine) {
  Client::Impl::UseCopyEngine(client, engine);
}

size_t StagingKeptBytesForTest(Client& client) { return Client::Impl::StagingKeptBytes(client); }

Status PeerCall(Client& client, const wire::GpuLinkJoinRequest& req,
                wire::GpuLinkJoinResponse* resp) {
  return Client::Impl::PeerCall(client, wire::GPU_LINK_JOIN, req, resp);
}
Status PeerCall(Client& client, const wire::GpuOfferRequest& req, wire::GpuOfferResponse* resp) {
  return Client::Impl::PeerCall(client, wire::GPU_OFFER, req, resp);
}
Status PeerCall(Client& client, const wire::GpuSendRequest& req, wire::GpuSendResponse* resp) {
  return Client::Impl::PeerCall(client, wire::GPU_SEND, req, resp);
}
Status PeerCall(Client& client, const wire::SessionVersionsRequest& req,
                wire::SessionVersionsResponse* resp) {
  return Client::Impl::PeerCall(client, wire::SESSION_VERSIONS, req, resp);
}
}  // namespace client

Result<int> Client::GpuTierOf(int cuda_device) {
  return impl_->Run([&]() -> Result<int> {
    if (!impl_->server_.shared_memory) {
      return Status::InvalidArgument(
          "the daemon's gpu tier is only reached through shared memory (same node)");
    }
    KVPOOL_ASSIGN_OR_RETURN(int daemon_gpu, impl_->DaemonGpuOf(cuda_device));
    if (impl_->import_failed_.contains({cuda_device, daemon_gpu})) {
      return Status::InvalidArgument(
          "this client could not map the daemon's gpu tier (see the log); it uses host");
    }
    return daemon_gpu;
  });
}

Status Client::Reconnect() { return impl_->Connect(); }
const ServerInfo& Client::server() const { return impl_->server_; }
const ClientOptions& Client::options() const { return impl_->options_; }

Result<LookupResult> Client::Lookup(std::span<const BlockKey> chain, bool prefetch) {
  return impl_->Run([&]() -> Result<LookupResult> {
    LookupResult out;
    // A chain longer than one request is looked up piecewise; the prefix stops at the first miss.
    for (size_t start = 0; start < chain.size(); start += impl_->server_.max_batch_keys) {
      const size_t end = std::min(chain.size(), start + impl_->server_.max_batch_keys);
      wire::LookupRequest req;
      PackKeys(chain.subspan(start, end - start), req.mutable_packed_keys());
      req.set_no_prefetch(!prefetch);
      wire::LookupResponse resp;
      KVPOOL_RETURN_IF_ERROR(impl_->connection_.Simple(wire::LOOKUP, req, &resp));
      if (resp.hit_blocks() > end - start || resp.tiers_size() > static_cast<int>(end - start)) {
        return Status::Internal("kvpoold answered a LOOKUP with more blocks than were asked");
      }
      out.hit_blocks += resp.hit_blocks();
      for (int t : resp.tiers()) out.tiers.push_back(FromWire(t));
      if (resp.hit_blocks() < end - start) break;
    }
    return out;
  });
}

Result<std::vector<Tier>> Client::Where(std::span<const BlockKey> keys) {
  return impl_->Run([&]() -> Result<std::vector<Tier>> {
    std::vector<Tier> out;
    out.reserve(keys.size());
    for (size_t start = 0; start < keys.size(); start += impl_->server_.max_batch_keys) {
      const size_t end = std::min(keys.size(), start + impl_->server_.max_batch_keys);
      wire::LookupRequest req;
      PackKeys(keys.subspan(start, end - start), req.mutable_packed_keys());
      req.set_each_key(true);
      req.set_no_prefetch(true);
      wire::LookupResponse resp;
      KVPOOL_RETURN_IF_ERROR(impl_->connection_.Simple(wire::LOOKUP, req, &resp));
      if (resp.tiers_size() != static_cast<int>(end - start)) {
        return Status::Internal("kvpoold answered a per-key LOOKUP with the wrong count");
      }
      for (int t : resp.tiers()) out.push_back(FromWire(t));
    }
    return out;
  });
}

namespace {

// Decodes the `r.size` encoded bytes at `encoded` into `raw` (capacity bytes) by r.layout, with
// the kernels' CPU twin; r then describes the decoded block. `encoded` and `raw` may be the same
// buffer. Corruption when the layout the daemon sent does not describe those bytes;
// InvalidArgument when the decoded block does not fit.
Status DecodeBlock(GetResult& r, const uint8_t* encoded, uint8_t* raw, size_t capacity) {
  const size_t raw_bytes = kvpool_kernel_raw_bytes(&r.layout);
  if (raw_bytes == 0 || r.layout.encoding != r.encoding ||
      kvpool_kernel_encoded_bytes(&r.layout) != r.size) {
    return Status::Corruption("kvpoold sent an encoded block whose layout does not describe it");
  }
  if (raw == nullptr || capacity < raw_bytes) {
    return Status::InvalidArgument("buffer of " + std::to_string(capacity) +
                                   " bytes is too small for the decoded " +
                                   std::to_string(raw_bytes) + "-byte block");
  }
  const std::vector<uint8_t> copy(encoded, encoded + r.size);  // the output overlaps the input
  const void* in[1] = {copy.data()};
  void* outs[1] = {raw};
  const kvpool_exec cpu{KVPOOL_DEVICE_CPU, nullptr};
  if (int rc = kvpool_kernel_dequantize(&cpu, &r.layout, in, outs, 1); rc != 0) {
    return Status(static_cast<StatusCode>(rc), kvpool_kernel_last_error());
  }
  r.size = raw_bytes;
  r.encoding = 0;
  r.layout = {};
  return Status::OK();
}

}  // namespace

// A GetAsync's results and what its queued copies need until Wait.
struct PendingGet::State {
  std::vector<BlockKey> keys;
  std::vector<MutableBuffer> buffers;
  std::vector<GetResult> results;
  std::vector<Client::Impl::QueuedCopies> queued;
  // Copies queued from bounce buffers (blocks that came as bytes), and those buffers.
  client::GetStaging::Queued staged;
  kernels::DeviceCopyEngine* engine = nullptr;  // never destroyed
  void* stream = nullptr;
  int device = -1;       // the CUDA device of the buffers
  void* mark = nullptr;  // the end of the queued copies (DeviceCopyEngine::Mark), or null
  std::shared_ptr<Client::Impl*> client;  // null inside once the Client is gone
  bool waited = false;
};

PendingGet::PendingGet() = default;
PendingGet::~PendingGet() {
  if (state_ != nullptr && !state_->waited) Wait().status().IgnoreError();
}
PendingGet::PendingGet(PendingGet&&) noexcept = default;
PendingGet& PendingGet::operator=(PendingGet&& other) noexcept {
  if (this != &other) {
    if (state_ != nullptr && !state_->waited) Wait().status().IgnoreError();
    state_ = std::move(other.state_);
  }
  return *this;
}

bool PendingGet::pending() const {
  return state_ != nullptr && !state_->waited &&
         (!state_->queued.empty() || !state_->staged.indices.empty());
}

Result<std::vector<GetResult>> PendingGet::Wait() {
  if (state_ == nullptr || state_->waited) {
    return Status::FailedPrecondition("PendingGet::Wait called twice (or on a moved-from one)");
  }
  State& st = *state_;
  st.waited = true;
  const Client::Impl::BufferFor buffer_for = [&](size_t i, uint64_t) { return st.buffers[i]; };
  // On the buffers' device (the null stream is that device's), possibly on another thread than
  // the one that queued the copies: the mark made there waits for exactly them.
  const std::shared_ptr<void> on =
      st.engine != nullptr ? st.engine->UseDevice(st.device) : std::shared_ptr<void>();
  Status done;
  if (st.mark != nullptr) {
    done = st.engine->WaitMarked(st.mark);
    st.mark = nullptr;
  } else if (!st.queued.empty() || !st.staged.indices.empty()) {
    done = st.engine->Wait(st.stream);
  }
  if (!done.ok()) {
    for (size_t i : st.staged.indices) {
      st.results[i].status = done.WithContext("copying to the device");
    }
  }
  st.staged = {};  // the copies are done: the bounce buffers go back to their pool
  for (const Client::Impl::QueuedCopies& q : st.queued) {
    Client::Impl::FinishQueued(st.keys, q.blocks, q.to_device, q.from_gpu, st.results, buffer_for,
                               done, *st.engine, st.stream);
    Client::Impl* client = st.client == nullptr ? nullptr : *st.client;
    if (client == nullptr) continue;  // its connection, and the leases with it, are gone
    // The copies are done: the leases may end; then gpu copies that failed their check go.
    client->ReleaseLeases(q.lease_ids, q.epoch).IgnoreError();
    std::vector<BlockKey> bad;
    for (size_t k : q.from_gpu) {
      const size_t i = q.blocks[k].index;
      if (st.results[i].status.code() == StatusCode::kCorruption) bad.push_back(st.keys[i]);
    }
    client->DropBadGpuCopies(bad, q.epoch);
  }
  st.queued.clear();  // and the mappings they held
  return std::move(st.results);
}

namespace {

// Folds the device `on` of one more Memory::kCuda buffer into `gpu`, the call's device (-1 before
// the first). InvalidArgument for a second device: one stream cannot order work on two.
Status OneDevice(int& gpu, int on, const char* call) {
  if (gpu >= 0 && on != gpu) {
    return Status::InvalidArgument("buffers on CUDA devices " + std::to_string(gpu) + " and " +
                                   std::to_string(on) + " in one " + call +
                                   ": one device (and its stream) per call");
  }
  gpu = on;
  return Status::OK();
}

// InvalidArgument when the caller's `stream` is known to be on another device than `gpu`, the
// call's buffers' (its copies there would not be ordered with the caller's work on them).
Status StreamOnDevice(const kernels::DeviceCopyEngine* engine, void* stream, int gpu,
                      const char* call) {
  if (engine == nullptr || stream == nullptr || gpu < 0) return Status::OK();
  KVPOOL_ASSIGN_OR_RETURN(const int on, engine->StreamDevice(stream));
  if (on >= 0 && on != gpu) {
    return Status::InvalidArgument(std::string("the cuda_stream of this ") + call +
                                   " is on CUDA device " + std::to_string(on) +
                                   ", its buffers on device " + std::to_string(gpu) +
                                   ": pass a stream of the buffers' device");
  }
  return Status::OK();
}

}  // namespace

Result<std::vector<GetResult>> Client::Get(std::span<const BlockKey> keys,
                                           std::span<const MutableBuffer> buffers,
                                           const GetOptions& options) {
  KVPOOL_ASSIGN_OR_RETURN(PendingGet pending, GetAsync(keys, buffers, options));
  return pending.Wait();
}

Result<PendingGet> Client::GetAsync(std::span<const BlockKey> keys,
                                    std::span<const MutableBuffer> buffers,
                                    const GetOptions& options) {
  if (buffers.size() != keys.size()) {
    return Status::InvalidArgument("Get needs one buffer per key");
  }
  kernels::DeviceCopyEngine* device = nullptr;
  int gpu = -1;  // the CUDA device of every Memory::kCuda buffer (one per call)
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (buffers[i].memory != Memory::kCuda) continue;
    if (device == nullptr) {
      KVPOOL_ASSIGN_OR_RETURN(device, impl_->DeviceEngine());
    }
    KVPOOL_ASSIGN_OR_RETURN(
        int on, client::CheckDeviceRange(*device, buffers[i].data, buffers[i].capacity,
                                         "buffer " + std::to_string(i) + " (Memory::kCuda)"));
    KVPOOL_RETURN_IF_ERROR(OneDevice(gpu, on, "get"));
  }
  KVPOOL_RETURN_IF_ERROR(StreamOnDevice(device, options.cuda_stream, gpu, "get"));
  // The buffers' device is current for the copies: the null stream is then that device's.
  const std::shared_ptr<void> on_device =
      device != nullptr ? device->UseDevice(gpu) : std::shared_ptr<void>();
  client::GetStaging staging(device, options.cuda_stream, gpu, impl_->staging_pool_);
  const Impl::BufferFor caller = [&](size_t i, uint64_t) { return buffers[i]; };
  PendingGet pending;
  pending.state_ = std::make_unique<PendingGet::State>();
  PendingGet::State& st = *pending.state_;
  st.engine = device;
  st.stream = options.cuda_stream;
  st.device = gpu;
  st.client = impl_->self_;
  st.keys.assign(keys.begin(), keys.end());
  st.buffers.assign(buffers.begin(), buffers.end());
  st.results.resize(keys.size());
  Result<std::vector<GetResult>> got = impl_->Run([&] {
    if (!st.queued.empty()) {
      // A try that broke after queueing copies: let them end before their buffers are reused
      // (their leases ended with the connection).
      device->Wait(options.cuda_stream).IgnoreError();
      st.queued.clear();
    }
    // Only what this try stages is copied at the end: a block an earlier try half received may
    // come in place now.
    staging.Reset();
    return impl_->Get(keys, caller, options.accept_encoded, staging, gpu, /*lend=*/nullptr,
                      /*verify_lent=*/true, &st.queued);
  });
  if (!got.ok()) {
    // Earlier rounds' copies may be running: they end (and their leases with them) first.
    pending.Wait().status().IgnoreError();
    return got.status();
  }
  std::vector<GetResult> out = *std::move(got);
  if (options.decode) {
    for (size_t i = 0; i < out.size(); ++i) {
      GetResult& r = out[i];
      if (!r.status.ok() || r.encoding == 0) continue;
      // An encoded block never comes through shared memory: a device target's bytes are staged.
      uint8_t* staged = staging.Staged(i);
      uint8_t* buf = staged != nullptr ? staged : static_cast<uint8_t*>(buffers[i].data);
      r.status = DecodeBlock(r, buf, buf, buffers[i].capacity);
    }
  }
  st.staged = staging.Finish(buffers, out);
  st.results = std::move(out);
  if (!st.queued.empty() || !st.staged.indices.empty()) {
    // Without a mark, Wait waits on the stream itself (right unless it is called on another
    // thread with a per-thread stream).
    Result<void*> mark = device->Mark(options.cuda_stream);
    if (mark.ok()) st.mark = *mark;
  }
  return pending;
}

Result<std::vector<FetchedBlock>> Client::GetBlocks(std::span<const BlockKey> keys,
                                                    const GetOptions& options) {
  std::vector<FetchedBlock> out(keys.size());
  const Impl::BufferFor allocate = [&](size_t i, uint64_t size) {
    out[i].bytes.resize(size);
    return MutableBuffer{out[i].bytes.data(), out[i].bytes.size()};
  };
  client::GetStaging no_device(nullptr, nullptr);  // the library's buffers are host memory
  KVPOOL_ASSIGN_OR_RETURN(std::vector<GetResult> results, impl_->Run([&] {
    return impl_->Get(keys, allocate, options.accept_encoded, no_device, /*gpu_device=*/-1);
  }));
  for (size_t i = 0; i < keys.size(); ++i) {
    GetResult& r = results[i];
    if (r.status.ok() && r.encoding != 0 && options.decode) {
      // Sized from the layout only once it describes the bytes received (DecodeBlock checks).
      const bool plausible = kvpool_kernel_encoded_bytes(&r.layout) == r.size;
      std::vector<uint8_t> raw(plausible ? kvpool_kernel_raw_bytes(&r.layout) : 0);
      r.status = DecodeBlock(r, out[i].bytes.data(), raw.data(), raw.size());
      if (r.status.ok()) out[i].bytes = std::move(raw);
    }
    out[i].status = r.status;
    out[i].tier = r.tier;
    out[i].lossy_encoding = r.lossy_encoding;
    out[i].encoding = r.encoding;
    out[i].layout = r.layout;
    if (!out[i].status.ok()) out[i].bytes.clear();
  }
  return out;
}

Result<std::vector<GetResult>> Client::GetWith(std::span<const BlockKey> keys,
                                               const BufferFor& buffer_for) {
  const Impl::BufferFor host_only = [&](size_t i, uint64_t size) {
    MutableBuffer buf = buffer_for(i, size);
    if (buf.memory != Memory::kHost) return MutableBuffer{};  // host memory only (see client.h)
    return buf;
  };
  client::GetStaging no_device(nullptr, nullptr);
  return impl_->Run([&] {
    return impl_->Get(keys, host_only, /*accept_encoded=*/false, no_device, /*gpu_device=*/-1);
  });
}

Result<BorrowedBlocks> Client::Borrow(std::span<const BlockKey> keys,
                                      const BorrowOptions& options) {
  kernels::DeviceCopyEngine* device = nullptr;
  if (options.gpu_device >= 0) {
    KVPOOL_ASSIGN_OR_RETURN(device, impl_->DeviceEngine());
    KVPOOL_RETURN_IF_ERROR(
        device->DeviceUuid(options.gpu_device)
            .status()
            .WithContext("BorrowOptions::gpu_device " + std::to_string(options.gpu_device)));
    KVPOOL_RETURN_IF_ERROR(
        StreamOnDevice(device, options.cuda_stream, options.gpu_device, "borrow"));
  }
  BorrowedBlocks borrowed;
  borrowed.state_ = std::make_unique<BorrowedBlocks::State>();
  BorrowedBlocks::State& st = *borrowed.state_;
  st.client = impl_->self_;
  st.device = options.gpu_device;
  st.stream = options.cuda_stream;
  // gpu_device is current for the device views' checks (the null stream is then its own).
  const std::shared_ptr<void> on_device =
      device != nullptr ? device->UseDevice(options.gpu_device) : std::shared_ptr<void>();
  const Impl::BufferFor allocate = [&](size_t i, uint64_t size) {
    st.owned[i].resize(size);
    return MutableBuffer{st.owned[i].data(), st.owned[i].size()};
  };
  client::GetStaging no_device(nullptr, nullptr);  // nothing is copied to a device
  KVPOOL_ASSIGN_OR_RETURN(std::vector<GetResult> results, impl_->Run([&] {
    // A retry after a reconnect starts over: the first connection's leases ended with it.
    st.Reset(keys.size());
    st.epoch = impl_->epoch_;
    st.lease_deadline = std::chrono::steady_clock::now() + impl_->server_.lease_timeout;
    return impl_->Get(keys, allocate, /*accept_encoded=*/false, no_device, options.gpu_device, &st,
                      options.verify);
  }));
  for (size_t i = 0; i < keys.size(); ++i) {
    if (st.lent[i]) continue;
    const GetResult& r = results[i];
    BlockView& v = st.views[i];
    v.status = r.status;
    if (!r.status.ok()) continue;
    // Came as bytes (from disk, or another data path), verified on receipt.
    v.data = st.owned[i].data();
    v.size = r.size;
    v.tier = r.tier;
    v.checksum = BlockChecksum(st.owned[i].data(), r.size);
  }
  return borrowed;
}

BorrowedBlocks::BorrowedBlocks() = default;
BorrowedBlocks::~BorrowedBlocks() { Release().IgnoreError(); }
BorrowedBlocks::BorrowedBlocks(BorrowedBlocks&&) noexcept = default;
BorrowedBlocks& BorrowedBlocks::operator=(BorrowedBlocks&& other) noexcept {
  if (this != &other) {
    Release().IgnoreError();
    state_ = std::move(other.state_);
  }
  return *this;
}

std::span<const BlockView> BorrowedBlocks::views() const {
  if (state_ == nullptr) return {};
  return state_->views;
}

std::chrono::steady_clock::time_point BorrowedBlocks::lease_deadline() const {
  return state_ == nullptr ? std::chrono::steady_clock::time_point{} : state_->lease_deadline;
}

Status BorrowedBlocks::Verify() {
  if (state_ == nullptr) return Status::OK();
  Status first;
  std::vector<BlockView*> on_device;
  for (BlockView& v : state_->views) {
    if (!v.status.ok()) continue;
    if (v.memory == Memory::kCuda) {
      on_device.push_back(&v);
    } else if (BlockChecksum(v.data, v.size) != v.checksum) {
      v.status =
          Status::Corruption("a borrowed block changed (its lease ended before it was read)");
      if (first.ok()) first = v.status;
    }
  }
  if (!on_device.empty() && state_->engine != nullptr) {
    const std::shared_ptr<void> current = state_->engine->UseDevice(state_->device);
    const Status device =
        Client::Impl::VerifyDeviceViews(*state_->engine, on_device, state_->stream);
    if (first.ok()) first = device;
  }
  return first;
}

Status BorrowedBlocks::Release() {
  if (state_ == nullptr || state_->released) return Status::OK();
  state_->released = true;
  Client::Impl* client = state_->client == nullptr ? nullptr : *state_->client;
  if (client == nullptr || state_->lease_ids.empty()) return Status::OK();
  return client->ReleaseLeases(state_->lease_ids, state_->epoch);
}

Result<PutResult> Client::Put(std::span<const PutBlock> blocks, const PutOptions& options) {
  kernels::DeviceCopyEngine* device = nullptr;
  int gpu = -1;  // the CUDA device of every Memory::kCuda block (one per call)
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i].memory != Memory::kCuda) continue;
    if (device == nullptr) {
      KVPOOL_ASSIGN_OR_RETURN(device, impl_->DeviceEngine());
    }
    KVPOOL_ASSIGN_OR_RETURN(
        const int on, client::CheckDeviceRange(*device, blocks[i].data, blocks[i].size,
                                               "block " + std::to_string(i) + " (Memory::kCuda)"));
    // A put into a gpu tier copies device to device on that GPU, which reaches only its own
    // memory (and checks the slots with a kernel on the caller's stream, of that GPU).
    if (options.gpu_device >= 0 && on != options.gpu_device) {
      return Status::InvalidArgument("block " + std::to_string(i) + " is on CUDA device " +
                                     std::to_string(on) + ", but the put names gpu_device " +
                                     std::to_string(options.gpu_device));
    }
    KVPOOL_RETURN_IF_ERROR(OneDevice(gpu, on, "put"));
  }
  KVPOOL_RETURN_IF_ERROR(StreamOnDevice(device, options.cuda_stream, gpu, "put"));
  // The blocks' device is current for the copies: the null stream is then that device's.
  const std::shared_ptr<void> on_device =
      device != nullptr ? device->UseDevice(gpu) : std::shared_ptr<void>();
  return impl_->Run([&]() -> Result<PutResult> {
    int daemon_gpu = -1;
    if (options.gpu_device >= 0) {
      KVPOOL_ASSIGN_OR_RETURN(daemon_gpu, impl_->DaemonGpuOf(options.gpu_device));
    }
    return impl_->Put(blocks, device, options.cuda_stream, daemon_gpu,
                      gpu >= 0 ? gpu : options.gpu_device);
  });
}

Result<PutResult> Client::PutChain(std::span<const BlockKey> keys,
                                   std::span<const std::span<const uint8_t>> blocks,
                                   const BlockKey& parent) {
  if (keys.size() != blocks.size()) {
    return Status::InvalidArgument("PutChain needs one block per key");
  }
  std::vector<PutBlock> puts(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    puts[i].key = keys[i];
    puts[i].data = blocks[i].data();
    puts[i].size = blocks[i].size();
    puts[i].parent = i == 0 ? parent : keys[i - 1];
  }
  return Put(puts);
}

Result<uint32_t> Client::Prefetch(std::span<const BlockKey> keys) {
  KVPOOL_ASSIGN_OR_RETURN(PrefetchResult r, Prefetch(keys, PrefetchOptions{}));
  return r.scheduled;
}

Result<PrefetchResult> Client::Prefetch(std::span<const BlockKey> keys,
                                        const PrefetchOptions& options) {
  return impl_->Run([&]() -> Result<PrefetchResult> {
    PrefetchResult out;
    int daemon_gpu = -1;
    if (options.gpu_device >= 0) {
      KVPOOL_ASSIGN_OR_RETURN(daemon_gpu, impl_->DaemonGpuOf(options.gpu_device));
    }
    for (size_t start = 0; start < keys.size(); start += impl_->server_.max_batch_keys) {
      const size_t end = std::min(keys.size(), start + impl_->server_.max_batch_keys);
      wire::PrefetchRequest req;
      for (size_t i = start; i < end; ++i) req.add_keys(KeyBytes(keys[i]));
      if (daemon_gpu >= 0) {
        req.set_to_gpu(true);
        req.set_gpu_device(daemon_gpu);
      }
      wire::PrefetchResponse resp;
      KVPOOL_RETURN_IF_ERROR(impl_->connection_.Simple(wire::PREFETCH, req, &resp));
      out.scheduled += resp.scheduled();
      out.gpu_placed += resp.gpu_placed();
    }
    return out;
  });
}

Status Client::SaveSession(const Session& session) { return SaveSession(session, {}); }

Status Client::SaveSession(const Session& session, const SaveSessionOptions& options) {
  return impl_
      ->Run([&]() -> Result<bool> {
        wire::SessionSaveRequest req;
        wire::SessionRecord* r = req.mutable_record();
        r->set_session_id(session.session_id);
        for (const BlockKey& k : session.keys) r->add_keys(KeyBytes(k));
        r->set_token_count(session.token_count);
        for (const auto& [k, v] : session.metadata) (*r->mutable_metadata())[k] = v;
        if (options.replica) {
          req.set_replica(true);
          r->set_version(session.version);
          r->set_origin(session.origin);
          r->set_deleted(session.deleted);
          r->set_created_unix_ms(session.created_unix_ms);
          r->set_updated_unix_ms(session.updated_unix_ms);
        }
        wire::SessionSaveResponse resp;
        KVPOOL_RETURN_IF_ERROR(impl_->connection_.Simple(wire::SESSION_SAVE, req, &resp));
        return true;
      })
      .status();
}

Result<LoadedSession> Client::LoadSession(const std::string& session_id, bool prefetch) {
  return LoadSession(session_id, LoadSessionOptions{.prefetch = prefetch});
}

Result<LoadedSession> Client::LoadSession(const std::string& session_id,
                                          const LoadSessionOptions& options) {
  return impl_->Run([&]() -> Result<LoadedSession> {
    wire::SessionLoadRequest req;
    req.set_session_id(session_id);
    req.set_no_prefetch(!options.prefetch);
    req.set_include_deleted(options.include_deleted);
    if (options.prefetch && options.gpu_device >= 0) {
      KVPOOL_ASSIGN_OR_RETURN(int daemon_gpu, impl_->DaemonGpuOf(options.gpu_device));
      req.set_to_gpu(true);
      req.set_gpu_device(daemon_gpu);
    }
    wire::SessionLoadResponse resp;
    KVPOOL_RETURN_IF_ERROR(impl_->connection_.Simple(wire::SESSION_LOAD, req, &resp));
    LoadedSession out;
    const wire::SessionRecord& r = resp.record();
    out.session.session_id = r.session_id();
    for (const std::string& k : r.keys()) {
      KVPOOL_ASSIGN_OR_RETURN(BlockKey key, BlockKey::FromBytes(k));
      out.session.keys.push_back(key);
    }
    out.session.token_count = r.token_count();
    for (const auto& [k, v] : r.metadata()) out.session.metadata[k] = v;
    out.session.created_unix_ms = r.created_unix_ms();
    out.session.updated_unix_ms = r.updated_unix_ms();
    out.session.total_bytes = r.total_bytes();
    out.session.version = r.version();
    out.session.origin = r.origin();
    out.session.deleted = r.deleted();
    out.cached_blocks = resp.cached_blocks();
    return out;
  });
}

Status Client::DeleteSession(const std::string& session_id) {
  return impl_
      ->Run([&]() -> Result<bool> {
        wire::SessionDeleteRequest req;
        req.set_session_id(session_id);
        wire::SessionDeleteResponse resp;
        KVPOOL_RETURN_IF_ERROR(impl_->connection_.Simple(wire::SESSION_DELETE, req, &resp));
        return true;
      })
      .status();
}

Result<std::vector<SessionSummary>> Client::ListSessions(const std::string& prefix,
                                                         uint32_t limit) {
  return impl_->Run([&]() -> Result<std::vector<SessionSummary>> {
    // A page at a time (the daemon answers at most 1000 unasked), each after the last id.
    std::vector<SessionSummary> out;
    for (;;) {
      wire::SessionListRequest req;
      req.set_prefix(prefix);
      req.set_limit(limit == 0 ? 0 : limit - static_cast<uint32_t>(out.size()));
      if (!out.empty()) req.set_start_after(out.back().session_id);
      wire::SessionListResponse resp;
      KVPOOL_RETURN_IF_ERROR(impl_->connection_.Simple(wire::SESSION_LIST, req, &resp));
      // A daemon from before start_after answers its first page again: stop there.
      if (!out.empty() && resp.sessions_size() > 0 &&
          resp.sessions(0).session_id() <= out.back().session_id) {
        break;
      }
      for (const wire::SessionSummary& s : resp.sessions()) {
        out.push_back(
            {s.session_id(), s.blocks(), s.token_count(), s.updated_unix_ms(), s.total_bytes()});
      }
      if (!resp.truncated() || resp.sessions_size() == 0 || (limit != 0 && out.size() >= limit)) {
        break;
      }
    }
    return out;
  });
}

Result<DaemonStats> Client::Stats() {
  return impl_->Run([&]() -> Result<DaemonStats> {
    wire::StatsRequest req;
    wire::StatsResponse r;
    KVPOOL_RETURN_IF_ERROR(impl_->connection_.Simple(wire::STATS, req, &r));
    DaemonStats s;
    s.node_id = r.node_id();
    s.version = r.version();
    s.uptime_s = r.uptime_s();
    for (const wire::TierStats& t : r.tiers()) {
      s.tiers.push_back({t.name(), t.capacity_bytes(), t.used_bytes(), t.blocks(),
                         t.allocated_bytes(), t.fragmentation(), t.hits(), t.promotions(),
                         t.demotions(), t.evictions(), t.moves(), t.renewals(),
                         t.renewals_from_standby(), t.standby_ready(), t.peer_hits()});
    }
    s.index_entries = r.index_entries();
    s.index_bytes = r.index_bytes();
    s.rocksdb_memory_bytes = r.rocksdb_memory_bytes();
    s.index_rebuild_blocks = r.index_rebuild_blocks();
    s.index_rebuild_seconds = r.index_rebuild_seconds();
    s.sessions = r.sessions();
    s.connections = r.connections();
    s.lookups = r.lookups();
    s.lookup_blocks = r.lookup_blocks();
    s.lookup_hit_blocks = r.lookup_hit_blocks();
    s.gets = r.gets();
    s.get_blocks_served = r.get_blocks_served();
    s.get_misses = r.get_misses();
    s.puts_offered = r.puts_offered();
    s.puts_deduplicated = r.puts_deduplicated();
    s.puts_committed = r.puts_committed();
    s.bytes_in = r.bytes_in();
    s.bytes_out = r.bytes_out();
    s.prefetches_issued = r.prefetches_issued();
    s.prefetches_useful = r.prefetches_useful();
    s.checksum_failures = r.checksum_failures();
    s.leases_active = r.leases_active();
    s.reservations_active = r.reservations_active();
    s.dedup_ratio = r.dedup_ratio();
    s.namespace_only = r.namespace_only();
    s.cluster_state = r.cluster_state();
    s.cluster_members = r.cluster_members();
    s.cluster_reason = r.cluster_reason();
    return s;
  });
}

Result<ClusterView> Client::Cluster() {
  return impl_->Run([&]() -> Result<ClusterView> {
    wire::ClusterMembersRequest req;
    wire::ClusterMembersResponse resp;
    KVPOOL_RETURN_IF_ERROR(impl_->connection_.ExchangeOnce(wire::CLUSTER_MEMBERS, req, {}, &resp,
                                                           impl_->connection_.NewDeadline()));
    if (resp.status().code() != 0) return FromWire(resp.status());
    ClusterView v;
    v.state = resp.cluster_state();
    v.reason = resp.status().message();
    for (const wire::ClusterMember& m : resp.members()) {
      v.members.push_back({m.node_id(), m.control_address(), m.state(), m.capacity_bytes(),
                           m.used_bytes(), m.self(), m.started_unix_ms()});
    }
    return v;
  });
}

Result<std::vector<NodeLocation>> Client::Locate(std::span<const BlockKey> chain) {
  return impl_->Run([&]() -> Result<std::vector<NodeLocation>> {
    std::vector<NodeLocation> out;
    // A chain longer than one request is located piecewise: a node's prefix grows with a piece
    // only while it held every block before it.
    for (size_t start = 0;; start += impl_->server_.max_batch_keys) {
      const size_t end = std::min(chain.size(), start + impl_->server_.max_batch_keys);
      wire::LocateRequest req;
      PackKeys(chain.subspan(start, end - start), req.mutable_packed_keys());
      wire::LocateResponse resp;
      KVPOOL_RETURN_IF_ERROR(impl_->connection_.Simple(wire::LOCATE, req, &resp));
      for (const wire::NodeLocation& n : resp.nodes()) {
        NodeLocation* loc = nullptr;
        for (NodeLocation& o : out) loc = o.node_id == n.node_id() ? &o : loc;
        if (loc == nullptr) {
          if (start != 0) continue;  // joined between two pieces: its first piece is unknown
          out.push_back({n.node_id(), n.control_address(), n.self(), FromWire(n.status()), 0, {}});
          loc = &out.back();
        }
        if (!loc->status.ok() || loc->hit_blocks != start) continue;
        if (n.status().code() != 0) {
          loc->status = FromWire(n.status());
          continue;
        }
        loc->hit_blocks += n.hit_blocks();
        for (int t : n.tiers()) loc->tiers.push_back(FromWire(t));
      }
      if (end >= chain.size()) break;
    }
    return out;
  });
}

Result<PoliciesView> Client::Policies(const std::string& namespace_name) {
  return impl_->Run([&]() -> Result<PoliciesView> {
    wire::PoliciesRequest req;
    req.set_all(namespace_name.empty());
    req.set_namespace_name(namespace_name);
    wire::PoliciesResponse resp;
    KVPOOL_RETURN_IF_ERROR(impl_->connection_.Simple(wire::POLICIES, req, &resp));
    PoliciesView v;
    v.default_policy = PolicyFromWire(resp.default_policy());
    for (const wire::NamespacePolicyInfo& p : resp.namespaces())
      v.namespaces.push_back(PolicyFromWire(p));
    return v;
  });
}

Result<EvictResult> Client::Evict(Tier tier, std::span<const BlockKey> keys) {
  return impl_->Run([&] { return impl_->EvictKeys(tier, keys); });
}

}  // namespace kvpool
