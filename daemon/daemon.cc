#include "daemon/daemon.h"

#include <glog/logging.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "common/threads.h"
#include "common/units.h"
#include "control.pb.h"
#include "daemon/block_service.h"
#include "daemon/cluster/membership.h"
#include "daemon/cluster_node.h"
#include "daemon/metrics_http.h"
#include "daemon/namespace_policies.h"
#include "daemon/namespace_registry.h"
#include "daemon/session_store.h"
#include "tiers/disk_tier.h"
#include "tiers/host_tier.h"
#include "tiers/rocks_store.h"
#include "transport/address.h"
#include "transport/control_server.h"

namespace kvpool::daemon {
namespace {

uint64_t DefaultHostCapacity() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  const uint64_t ram = pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * page : 8ull << 30;
  return std::min<uint64_t>(ram / 8, 16ull << 30);
}

uint64_t DefaultDiskCapacity(const std::string& dir) {
  struct statvfs st {};
  if (statvfs(dir.c_str(), &st) != 0) return 64ull << 30;
  const uint64_t avail = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  return std::min<uint64_t>(64ull << 30, avail / 10 * 8);
}

class DaemonImpl final : public Daemon {
 public:
  ~DaemonImpl() override { Stop(); }

  Status Init(DaemonOptions o) {
    options_ = std::move(o);
    if (options_.socket_path.empty()) options_.socket_path = transport::DefaultSocketPath();
    std::error_code ec;
    std::filesystem::create_directories(options_.data_dir, ec);
    if (ec)
      return Status::IoError("cannot create data dir " + options_.data_dir + ": " + ec.message());
    if (options_.host_capacity_bytes == 0) options_.host_capacity_bytes = DefaultHostCapacity();
    if (options_.disk_capacity_bytes == 0) {
      options_.disk_capacity_bytes = DefaultDiskCapacity(options_.data_dir);
    }
    if (options_.host_segment_bytes < (1ull << 20) ||
        options_.host_segment_bytes > transport::kLargestBlockBytes) {
      return Status::InvalidArgument("--host-segment-size must be between 1 MiB and 1 GiB");
    }
    if (options_.max_connections == 0 || options_.max_connections_per_peer == 0) {
      return Status::InvalidArgument(
          "--max_connections and --max_connections_per_peer must be at least 1");
    }
    if (options_.max_connections >= (1u << 24)) {
      // Each live UCX connection holds one of 2^24 tag prefixes (UcxListener::HoldTagPrefix).
      return Status::InvalidArgument("--max_connections must be below 16777216");
    }
    if (options_.hello_timeout.count() <= 0 || options_.frame_timeout.count() <= 0) {
      return Status::InvalidArgument("--hello_timeout_ms and --frame_timeout_ms must be above 0");
    }
    if (transport::IsTlsAddress(options_.tcp_listen) && !tls()) {
      return Status::InvalidArgument("--listen=" + options_.tcp_listen +
                                     " asks for TLS: give --tls_cert and --tls_key");
    }
    if (tls() && options_.tcp_listen.empty()) {
      return Status::InvalidArgument("--tls_cert is for the TCP listener: give --listen too");
    }
    if (options_.cluster_lease < std::chrono::seconds(1) ||
        options_.cluster_lease > std::chrono::seconds(60)) {
      return Status::InvalidArgument(
          "--cluster_lease_seconds=" + std::to_string(options_.cluster_lease.count()) +
          " must be 1-60");
    }

    tiers::RocksStoreOptions ro;
    ro.path = (std::filesystem::path(options_.data_dir) / "rocksdb").string();
    KVPOOL_ASSIGN_OR_RETURN(store_, tiers::RocksStore::Open(ro));
    KVPOOL_ASSIGN_OR_RETURN(namespaces_, NamespaceRegistry::Load(*store_, options_.max_namespaces));
    KVPOOL_ASSIGN_OR_RETURN(node_id_, LoadOrCreateNodeId(*store_, options_.node_id));

    tiers::HostTierOptions ho;
    ho.capacity_bytes = options_.host_capacity_bytes;
    ho.segment_bytes =
        std::min<uint64_t>(options_.host_segment_bytes, options_.host_capacity_bytes);
    ho.segment_bytes -= ho.segment_bytes % tiers::HostTier::kPageBytes;
    ho.lock_memory = options_.lock_memory;
    ho.spare_segments = options_.host_spare_segments;
    ho.standby_segments = options_.host_standby_segments;
    ho.huge_pages = options_.host_huge_pages;
    // Pinned for the gpu tiers' copies, with their first device current (no context elsewhere).
    ho.cuda_device = options_.gpu_devices.empty() ? -1 : options_.gpu_devices[0];
    KVPOOL_ASSIGN_OR_RETURN(host_, tiers::HostTier::Create(ho));
    if (ho.huge_pages && !ShmemHugePagesOnAdvice()) {
      LOG(WARNING) << "--host_huge_pages has no effect: this kernel gives shared memory no huge "
                      "pages (transparent_hugepage/shmem_enabled is \""
                   << ShmemHugePageMode() << "\"; set it to advise)";
    }
    disk_ = std::make_unique<tiers::DiskTier>(*store_);
    std::vector<tiers::StorageTier*> stack_tiers;
    KVPOOL_RETURN_IF_ERROR(CreateGpuTiers());
    for (auto& g : gpus_) stack_tiers.push_back(g.get());
    stack_tiers.push_back(host_.get());
    stack_tiers.push_back(disk_.get());

    tiers::TierManagerOptions to = options_.tiers;
    to.disk_capacity_bytes = options_.disk_capacity_bytes;
    to.promotion_threads = options_.promotion_threads;
    KVPOOL_ASSIGN_OR_RETURN(tiers::TierStack stack, tiers::TierStack::Create(stack_tiers));
    tiers_ = std::make_unique<tiers::TierManager>(to, std::move(stack));
    if (!options_.cluster.empty()) {
      cluster_secret_ = options_.cluster_secret;
      if (!options_.cluster_secret_file.empty()) {
        KVPOOL_ASSIGN_OR_RETURN(cluster_secret_,
                                cluster::ReadClusterSecretFile(options_.cluster_secret_file));
      }
      if (cluster_secret_.empty()) {
        return Status::InvalidArgument(
            "cluster mode needs --cluster_secret or --cluster_secret_file");
      }
    }
    access_ = std::make_unique<AccessControl>(cluster_secret_);
    NamespacePoliciesOptions po;
    po.write_policy = options_.write_policy;
    po.namespace_policies = options_.namespace_policies;
    po.namespaces_file = options_.namespaces_file;
    po.namespaces_file_required = options_.namespaces_file_required;
    policies_ =
        std::make_unique<NamespacePolicies>(std::move(po), *tiers_, *namespaces_, access_.get());
    if (Status st = policies_->Configure(); !st.ok()) {
      if (st.code() != StatusCode::kInvalidArgument || options_.namespaces_file.empty() ||
          st.message().rfind(options_.namespaces_file + ":", 0) != 0) {
        return st;
      }
      // The file's problems, one line each, below a line of their own.
      const size_t n = std::count(st.message().begin(), st.message().end(), '\n') + 1;
      return Status::InvalidArgument("invalid namespaces file " + options_.namespaces_file + " (" +
                                     std::to_string(n) + (n == 1 ? " error" : " errors") + "):\n" +
                                     st.message());
    }
    KVPOOL_RETURN_IF_ERROR(tiers_->Recover());

    if (options_.ucx && !options_.tcp_listen.empty()) {  // UCX serves TCP connections only
      transport::UcxOptions uo;
      uo.transports = options_.ucx_transports;
      uo.net_devices = options_.ucx_net_devices;
      uo.tcp_port_range = options_.ucx_tcp_ports;
      Result<std::unique_ptr<transport::UcxEngine>> ucx = transport::UcxEngine::Create(uo);
      if (ucx.ok()) {
        ucx_ = std::move(*ucx);
      } else if (ucx.status().code() == StatusCode::kInvalidArgument) {
        return ucx.status();  // a flag that says something UCX cannot take (--ucx_tcp_ports)
      } else {
        LOG(WARNING) << "UCX data path off: " << ucx.status().ToString();
      }
    }
    if (ucx_ && !options_.tcp_listen.empty()) {
      // Remote clients make their endpoints to this listener (transport/ucx_bind.h).
      std::string host;
      uint16_t unused = 0;
      KVPOOL_RETURN_IF_ERROR(transport::ParseHostPort(options_.tcp_listen, &host, &unused));
      Result<std::unique_ptr<UcxListener>> listener =
          UcxListener::Start(*ucx_, host, options_.ucx_port);
      if (listener.ok()) {
        ucx_listener_ = std::move(*listener);
      } else if (options_.ucx_port != 0) {
        return listener.status().WithContext("UCX listener on " + host + ":" +
                                             std::to_string(options_.ucx_port) +
                                             " (--ucx_port; --ucx=false turns UCX off)");
      } else {
        LOG(WARNING) << "UCX data path off: no UCX listener on " << host << ": "
                     << listener.status().ToString();
      }
    }
    sessions_ = std::make_unique<SessionStore>(*store_);
    BlockServiceOptions bo;
    bo.tcp_secret = cluster_secret_;
    bo.cluster_mode = !options_.cluster.empty();
    bo.node_id = node_id_;
    bo.max_batch_keys = options_.max_batch_keys;
    bo.limits = options_.limits;
    bo.shared_memory = options_.shared_memory;
    bo.lease_timeout = options_.lease_timeout;
    bo.ucx_max_unreceived_bytes = options_.ucx_max_unreceived_bytes;
    service_ = std::make_unique<BlockService>(bo, *tiers_, *namespaces_, *sessions_, metrics_,
                                              ucx_listener_.get(), access_.get());
    KVPOOL_RETURN_IF_ERROR(service_->LoadSessions());
    service_->SetPolicies(policies_.get());
    tiers_->Start();

    transport::ControlServerOptions so;
    so.unix_path = options_.socket_path;
    so.tcp_listen = options_.tcp_listen;
    so.tls = options_.tls;
    so.io_threads = options_.io_threads;
    so.io_busy_poll = std::chrono::microseconds(options_.io_busy_poll_us);
    so.worker_threads = options_.worker_threads;
    so.limits = options_.limits;
    so.frame_timeout = options_.frame_timeout;
    so.max_connections = options_.max_connections;
    so.max_connections_per_peer = options_.max_connections_per_peer;
    so.hello_timeout = options_.hello_timeout;
    KVPOOL_ASSIGN_OR_RETURN(server_, transport::ControlServer::Start(so, *service_));
    transport::ControlServer* server = server_.get();
    service_->SetConnectionGauge([server] { return server->connections(); });

    if (!options_.cluster.empty()) KVPOOL_RETURN_IF_ERROR(StartCluster());

    if (!options_.metrics_listen.empty()) {
      BlockService* service = service_.get();
      KVPOOL_ASSIGN_OR_RETURN(
          metrics_http_, MetricsHttpServer::Start(options_.metrics_listen,
                                                  [service] { return service->RenderMetrics(); }));
    }
    return Status::OK();
  }

  void Stop() override {
    if (stopped_) return;
    stopped_ = true;
    if (cluster_) cluster_->Stop();  // peers drop this node at once
    if (metrics_http_) metrics_http_->Stop();
    if (server_) server_->Stop();  // no request runs after this
    ucx_listener_.reset();
    ucx_.reset();  // ends in-flight UCX sends (their leases are released) before the tiers stop
    if (tiers_) tiers_->Shutdown();
    service_.reset();
    policies_.reset();
    tiers_.reset();
    sessions_.reset();
    disk_.reset();
    host_.reset();
    gpus_.clear();
    namespaces_.reset();
    store_.reset();  // flushes memtables and closes RocksDB
    LOG(INFO) << "kvpoold stopped cleanly";
  }

  std::string socket_path() const override { return options_.socket_path; }
  std::string tcp_address() const override { return server_ ? server_->tcp_address() : ""; }
  // The TCP listener as clients dial it: "tls://HOST:PORT" or "tcp://HOST:PORT"; empty without.
  std::string TcpUrl() const {
    return tcp_address().empty() ? "" : (tls() ? "tls://" : "tcp://") + tcp_address();
  }
  bool tls() const { return !options_.tls.cert_file.empty() || !options_.tls.key_file.empty(); }
  std::string metrics_address() const override {
    return metrics_http_ ? metrics_http_->address() : "";
  }
  std::string node_id() const override { return node_id_; }

  std::string Describe() const override {
    std::ostringstream s;
    const tiers::HostTierStats h = host_->GetStats();
    s << "kvpoold " << node_id_ << " listening on unix:" << options_.socket_path;
    if (!tcp_address().empty()) s << " and " << TcpUrl();
    s << "\n  host tier: " << FormatBytes(h.capacity_bytes) << " in " << h.segments << " segments"
      << (h.locked ? " (mlocked)" : " (not mlocked)");
    if (options_.host_huge_pages) {
      s << ", " << FormatBytes(host_->HugePageBytes()) << " of it on huge pages (shared memory "
        << "THP mode: " << ShmemHugePageMode() << ")";
    }
    for (const auto& g : gpus_) {
      const tiers::MemoryTierStats gs = g->GetStats();
      s << "\n  gpu tier: " << FormatBytes(gs.capacity_bytes) << " on CUDA device " << g->device()
        << " in " << gs.segments << " segments";
    }
    s << "\n  disk tier: " << FormatBytes(options_.disk_capacity_bytes) << " under "
      << options_.data_dir << "/rocksdb";
    if (ucx_listener_) {
      s << "\n  UCX data path: " << ucx_->transports_in_use() << ", listening on port "
        << ucx_listener_->port();
    }
    if (!options_.cluster.empty()) {
      s << "\n  cluster " << options_.cluster_name << " through " << options_.cluster;
    }
    if (!metrics_address().empty()) s << "\n  metrics: http://" << metrics_address() << "/metrics";
    return s.str();
  }

  Status ReloadNamespaces() override {
    if (policies_ == nullptr) return Status::FailedPrecondition("the daemon is stopped");
    return policies_->Reload();
  }

 private:
  // One gpu tier per --gpu_devices entry, each of --gpu_capacity.
  Status CreateGpuTiers() {
    if (options_.gpu_devices.empty()) return Status::OK();
    const uint64_t seg = options_.gpu_segment_bytes;
    if (seg == 0 || seg % (2ull << 20) != 0) {
      return Status::InvalidArgument("--gpu_segment_size must be a positive multiple of 2MiB");
    }
    const uint64_t count = options_.gpu_capacity_bytes / seg;
    if (count == 0 || count > UINT32_MAX) {
      return Status::InvalidArgument("--gpu_capacity (" + FormatBytes(options_.gpu_capacity_bytes) +
                                     ") must hold at least one --gpu_segment_size segment (" +
                                     FormatBytes(seg) + ")");
    }
    for (int device : options_.gpu_devices) {
      Result<std::unique_ptr<kernels::DeviceArena>> arena =
          options_.gpu_arena
              ? options_.gpu_arena(device, seg, static_cast<uint32_t>(count))
              : kernels::CreateCudaDeviceArena(device, seg, static_cast<uint32_t>(count));
      if (!arena.ok()) {
        return arena.status().WithContext("gpu tier on CUDA device " + std::to_string(device));
      }
      gpus_.push_back(std::make_unique<tiers::GpuTier>(std::move(arena).value()));
    }
    return Status::OK();
  }

  // Joins the cluster (see daemon/cluster_node.h): an unreachable etcd does not stop the start,
  // a refused join (wrong secret, a live twin with this node id, bad options) does.
  Status StartCluster() {
    const std::string& secret = cluster_secret_;
    std::string control = options_.cluster_advertise;
    if (control.empty()) {
      if (tcp_address().empty()) {
        return Status::InvalidArgument(
            "cluster mode needs --listen=tcp://HOST:PORT: peers reach this daemon over TCP");
      }
      control = TcpUrl();
      if (tcp_address().rfind("0.0.0.0:", 0) == 0 || tcp_address().rfind("[::]:", 0) == 0) {
        return Status::InvalidArgument(
            "--listen binds every address; give --cluster_advertise=tcp://HOST:PORT for peers");
      }
    } else if (transport::IsTlsAddress(control) != tls()) {
      return Status::InvalidArgument("--cluster_advertise=" + control + " must be " +
                                     (tls() ? "tls://" : "tcp://") +
                                     "HOST:PORT: it is what the TCP listener speaks");
    }
    ClusterNodeOptions co;
    cluster::MembershipOptions& mo = co.membership;
    mo.etcd = options_.cluster;
    mo.cluster_name = options_.cluster_name;
    mo.node_id = node_id_;
    mo.secret = secret;
    mo.control_address = control;
    mo.lease_ttl = options_.cluster_lease;
    // (mo.ucx_worker_address stays empty: nothing dials a worker address; peers make endpoints
    // to each other's UCX listener, transport/ucx_bind.h.)
    mo.capacity_bytes = options_.host_capacity_bytes + options_.disk_capacity_bytes;
    tiers::TierManager* tiers = tiers_.get();
    mo.used_bytes = [tiers] {
      const tiers::TierManagerStats s = tiers->GetStats();
      return s.host.payload_bytes + s.disk_used_bytes;
    };
    co.replicas = options_.replicas;
    NamespaceRegistry* namespaces = namespaces_.get();
    co.namespace_name = [namespaces](NamespaceId ns) { return namespaces->NameOf(ns); };
    SessionStore* sessions = sessions_.get();
    co.for_each_session = [sessions](const auto& visit) {
      if (Status st = sessions->ForEach(visit); !st.ok()) {
        LOG(WARNING) << "sessions not all offered to their homes: " << st.ToString();
      }
    };
    co.ucx = ucx_ != nullptr;
    co.ucx_transports = options_.ucx_transports;
    co.ucx_net_devices = options_.ucx_net_devices;
    co.tls = options_.tls;
    co.metrics = &metrics_;
    if (options_.nccl && !tiers_->gpu_tiers().empty()) {
      Result<std::unique_ptr<transport::DeviceLinks>> links =
          options_.device_links ? options_.device_links() : transport::NcclDeviceLinks();
      if (links.ok()) {
        device_links_ = std::move(links).value();
        co.device_links = device_links_.get();
        LOG(INFO) << "gpu-tier blocks move between daemons over device links (NCCL) where both "
                     "have a gpu tier";
      } else {
        LOG(WARNING) << "no device links (" << links.status().ToString()
                     << "): gpu-tier blocks move between daemons over UCX from host memory";
      }
    }
    KVPOOL_ASSIGN_OR_RETURN(cluster_, ClusterNode::Start(std::move(co), *tiers_));
    service_->SetCluster(cluster_.get());
    return Status::OK();
  }

  DaemonOptions options_;
  std::string node_id_;
  Metrics metrics_;
  std::unique_ptr<tiers::RocksStore> store_;
  std::unique_ptr<NamespaceRegistry> namespaces_;
  std::vector<std::unique_ptr<tiers::GpuTier>> gpus_;  // destroyed after the tier manager
  std::unique_ptr<tiers::HostTier> host_;
  std::unique_ptr<tiers::DiskTier> disk_;
  std::unique_ptr<tiers::TierManager> tiers_;
  std::unique_ptr<AccessControl> access_;
  std::unique_ptr<NamespacePolicies> policies_;
  std::unique_ptr<transport::UcxEngine> ucx_;
  std::unique_ptr<UcxListener> ucx_listener_;  // clients' UCX endpoints; null without --listen
  std::unique_ptr<transport::DeviceLinks> device_links_;  // cluster_'s device links, if any
  std::unique_ptr<SessionStore> sessions_;
  std::unique_ptr<BlockService> service_;
  std::unique_ptr<transport::ControlServer> server_;
  std::unique_ptr<MetricsHttpServer> metrics_http_;
  std::unique_ptr<ClusterNode> cluster_;  // cluster mode only
  std::string cluster_secret_;
  bool stopped_ = false;
};

}  // namespace

Result<std::unique_ptr<Daemon>> Daemon::Start(DaemonOptions options) {
  auto d = std::make_unique<DaemonImpl>();
  Status st = d->Init(std::move(options));
  if (!st.ok()) {
    d->Stop();
    return st;
  }
  return std::unique_ptr<Daemon>(std::move(d));
}

}  // namespace kvpool::daemon
