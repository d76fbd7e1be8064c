#pragma once
// Daemon: kvpoold assembled from its parts, in start order: RocksDB store, namespace registry and
// node identity, host and disk tiers, the tier manager (index rebuilt from disk), sessions
// re-pinned, request handling, the control server, and the optional /metrics endpoint. The
// namespaces' strategies come from the flags and the namespaces file, applied before recovery.
// Stop() reverses it: stop accepting, flush what must be flushed, close RocksDB.
//
// Thread safety: Start and Stop from one thread.

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/device_arena.h"
#include "tiers/policy.h"
#include "tiers/tier_manager.h"
#include "transport/device_link.h"
#include "transport/frame.h"
#include "transport/tls.h"

namespace kvpool::daemon {

struct DaemonOptions {
  // Where RocksDB and the daemon's identity live. Default: ./kvpool-data
  std::string data_dir = "kvpool-data";
  // Unix socket of the control plane. Default: transport::DefaultSocketPath().
  std::string socket_path;
  // Optional TCP control listener, "tcp://HOST:PORT" (or "tls://HOST:PORT", which needs
  // `tls`). Default: none.
  std::string tcp_listen;
  // TLS on the TCP listener (transport/tls.h): a certificate and key make it speak TLS, a CA
  // file makes it require client certificates; cluster peers present the same certificate and
  // verify each other with the same CA. Default: none (plain TCP).
  transport::TlsFiles tls;
  // Optional Prometheus endpoint "HOST:PORT". Default: none.
  std::string metrics_listen;
  // Host tier arena size. Default (0): an eighth of RAM, at most 16 GiB.
  uint64_t host_capacity_bytes = 0;
  // Segment size of the host arena; also the largest block. Default: 64 MiB.
  uint64_t host_segment_bytes = 64ull << 20;
  // The gpu tier: CUDA devices it runs on (one arena each, above host), and per device its
  // capacity and segment size (a multiple of 2 MiB; also the largest block kept there).
  // Default: no devices, no gpu tier.
  std::vector<int> gpu_devices;
  uint64_t gpu_capacity_bytes = 0;
  uint64_t gpu_segment_bytes = 64ull << 20;
  // How a gpu tier's memory is made: kernels::CreateCudaDeviceArena when empty (kvpoold). Tests
  // without a GPU pass the device double of tests/support/fake_device.h.
  std::function<Result<std::unique_ptr<kernels::DeviceArena>>(int device, uint64_t segment_bytes,
                                                              uint32_t segments)>
      gpu_arena;
  // Device links toward peers' gpu tiers in cluster mode (transport/device_link.h): gpu-tier
  // blocks a peer holds come device to device into this daemon's gpu tier for a reader on a
  // GPU. Made at start when there is a gpu tier and cluster mode: transport::NcclDeviceLinks()
  // when empty (kvpoold; without NCCL, blocks move over UCX from host only, as with
  // `nccl` false). Tests without a GPU pass the double of tests/support/fake_device_link.h.
  std::function<Result<std::unique_ptr<transport::DeviceLinks>>()> device_links;
  // Whether to use device links at all. Default: true.
  bool nccl = true;
  // Disk tier budget. Default (0): 64 GiB or 80% of the free space under data_dir, the smaller.
  uint64_t disk_capacity_bytes = 0;
  // mlock the host arena. Default: true.
  bool lock_memory = true;
  // Host segments kept clean ahead of need (tiers::HostTierOptions::spare_segments). Default: 2.
  uint32_t host_spare_segments = 2;
  // Segments' worth of fresh memory made ahead for renewals, beyond the host capacity
  // (tiers::HostTierOptions::standby_segments). Default: 1.
  uint32_t host_standby_segments = 1;
  // The host arena on huge pages (tiers::HostTierOptions::huge_pages). Default: false.
  bool host_huge_pages = false;
  // Node id; empty: the stored one, or a generated one on first start.
  std::string node_id;
  // Default write policy name for every namespace (tiers/policy.h). Default: write-back.
  std::string write_policy = "write-back";
  // Per-namespace write policies, "NS=POLICY[,NS=POLICY...]". Default: none.
  std::string namespace_policies;
  // The namespaces file (daemon/namespaces_file.h): each namespace's strategies, over the two
  // flags above (daemon/namespace_policies.h says how they combine); re-read by
  // ReloadNamespaces. Default: none (kvpoold's --namespaces_file: /etc/kvpool/namespaces.yaml).
  std::string namespaces_file;
  // Whether a missing namespaces_file stops the start (given explicitly) or means the defaults
  // (the default path). Default: false.
  bool namespaces_file_required = false;
  int io_threads = 2;
  uint32_t io_busy_poll_us = 0;  // ControlServerOptions::io_busy_poll
  int worker_threads = 8;
  int promotion_threads = 2;
  uint32_t max_batch_keys = 4096;
  uint32_t max_namespaces = 1024;
  transport::FrameLimits limits;
  std::chrono::milliseconds frame_timeout{30000};
  // Connections in total and per peer (a TCP address; a Unix user), and how long a connection
  // has to say an accepted hello (transport/control_server.h). Defaults: 4096, 1024, 10 s.
  uint32_t max_connections = 4096;
  uint32_t max_connections_per_peer = 1024;
  std::chrono::milliseconds hello_timeout{10000};
  // Same-node shared-memory data path for local clients. Default: on.
  bool shared_memory = true;
  // A shared-memory lease not released within this ends by itself. Default: 10 s.
  std::chrono::milliseconds lease_timeout{10000};
  // Offer the UCX data path to remote clients. Default: on (off if UCX cannot start).
  bool ucx = true;
  // UCX transports and network devices ("" = UCX's choice, e.g. "tcp" and "eth0"). Default: "".
  std::string ucx_transports;
  std::string ucx_net_devices;
  // The port of the UCX listener clients make their endpoints to, on the --listen host
  // (transport/ucx_bind.h). Default: 0 (a free port, which the hello tells clients).
  uint16_t ucx_port = 0;
  // The ports of UCX's tcp data connections, "LOW-HIGH" (UcxOptions::tcp_port_range). Default:
  // empty (any free port).
  std::string ucx_tcp_ports;
  // Bytes of UCX answers one client may leave unreceived before its UCX requests are refused
  // (a stalled receiver pins their blocks). Default: 1 GiB.
  uint64_t ucx_max_unreceived_bytes = 1ull << 30;
  // Cluster mode (docs/CLUSTER.md): etcd endpoints "etcd://HOST:PORT[,HOST:PORT...]". Default:
  // none (standalone).
  std::string cluster;
  // Cluster name (the etcd prefix /kvpool/<name>/). Default: "kvpool".
  std::string cluster_name = "kvpool";
  // Shared cluster secret, or a file holding it (not world-readable). Required in cluster mode.
  std::string cluster_secret;
  std::string cluster_secret_file;
  // The control address peers use, "tcp://HOST:PORT". Default: the --listen address.
  std::string cluster_advertise;
  // Copies kept beyond the first. Default: 1.
  uint32_t replicas = 1;
  // The etcd lease of this node's membership record (MembershipOptions::lease_ttl), 1-60 s.
  // Default: 2 s.
  std::chrono::seconds cluster_lease{2};
  tiers::TierManagerOptions tiers;
};

class Daemon {
 public:
  static Result<std::unique_ptr<Daemon>> Start(DaemonOptions options);
  virtual ~Daemon() = default;
  virtual void Stop() = 0;
  virtual std::string socket_path() const = 0;
  virtual std::string tcp_address() const = 0;
  virtual std::string metrics_address() const = 0;
  virtual std::string node_id() const = 0;
  // One line per listener and tier, for the startup banner.
  virtual std::string Describe() const = 0;
  // Re-reads the namespaces file and applies it (SIGHUP); blocks stay. On any error the running
  // configuration stays and the error lists every problem, one line each. Call from the thread
  // that started the daemon.
  virtual Status ReloadNamespaces() = 0;
};

}  // namespace kvpool::daemon
