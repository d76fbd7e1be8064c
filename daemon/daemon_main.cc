// DaemonMain: kvpoold's whole main (flags, logging, signals, systemd), a library so that a daemon
// built with strategies of its own (examples/custom_eviction.cc) runs exactly as kvpoold does.
// See README.md and `kvpoold --help`.
//
// Flags may also come from a flag file: `kvpoold --flagfile=/etc/kvpool/kvpoold.flags`.
// SIGTERM or SIGINT stop it gracefully (host-only blocks are written to disk, RocksDB is closed);
// SIGHUP re-reads the namespaces file (an invalid one is logged and the running configuration
// stays); under systemd it reports READY and pings the watchdog (Type=notify, WatchdogSec).

#include <gflags/gflags.h>
#include <glog/logging.h>
#include <signal.h>
#include <systemd/sd-daemon.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include "absl/synchronization/mutex.h"
#include "build_info.h"  // generated: cmake/build_info.h.in
#include "common/units.h"
#include "daemon/daemon.h"
#include "daemon/daemon_main.h"
#include "daemon/request_codec.h"
#include "transport/address.h"

DEFINE_string(data_dir, "kvpool-data", "Directory for RocksDB (disk tier, sessions, identity).");
DEFINE_string(socket, "",
              "Unix socket of the control plane. Default: $KVPOOL_SOCKET, else "
              "/run/kvpool/kvpool.sock for root, /tmp/kvpool-<uid>/kvpool.sock otherwise.");
DEFINE_string(
    listen, "",
    "Optional TCP control listener, tcp://HOST:PORT (TLS with --tls_cert). Default: off.");
DEFINE_string(tls_cert, "",
              "PEM certificate chain: the --listen listener speaks TLS (clients dial "
              "tls://HOST:PORT); cluster peers present it too. Default: plain TCP.");
DEFINE_string(tls_key, "", "PEM private key of --tls_cert (not readable by other users).");
DEFINE_string(tls_ca, "",
              "PEM CA file: TLS clients (and peers) must present a certificate it signed; peers' "
              "certificates are verified with it. Default: no client certificates asked for.");
DEFINE_string(
    metrics_listen, "",
    "Optional Prometheus /metrics endpoint, HOST:PORT (e.g. 127.0.0.1:9464). Default: off.");
DEFINE_string(
    host_capacity, "",
    "Host (pinned shared memory) tier size, e.g. 4GiB. Default: 1/8 of RAM, at most 16GiB.");
DEFINE_string(host_segment_size, "64MiB",
              "Host arena segment: the unit given to one namespace and the largest block.");
DEFINE_string(gpu_devices, "",
              "CUDA devices the gpu tier runs on, e.g. 0,1 (one arena each, above host). Default: "
              "none, no gpu tier.");
DEFINE_string(gpu_capacity, "",
              "Gpu tier memory per device, e.g. 8GiB. Required with --gpu_devices.");
DEFINE_string(gpu_segment_size, "64MiB",
              "Gpu tier segment (a multiple of 2MiB): the unit a namespace owns on a GPU and the "
              "largest block kept there.");
DEFINE_bool(nccl, true,
            "In cluster mode with a gpu tier: move gpu-tier blocks between daemons device to "
            "device over NCCL (libnccl.so.2, loaded at start) where the peer has a gpu tier too. "
            "false, or without NCCL: over UCX from host memory.");
DEFINE_string(disk_capacity, "",
              "Disk tier budget for block bytes, e.g. 500GiB. Default: 64GiB or 80% of the free "
              "space under --data_dir, whichever is smaller.");
DEFINE_bool(lock_memory, true,
            "mlock the host arena (warns and runs unlocked if the limit is low).");
DEFINE_bool(host_huge_pages, false,
            "Ask for transparent huge pages for the host arena (clients map them the same way): "
            "copies out of it miss the TLB far less. Needs --host_segment_size a multiple of 2MiB "
            "and /sys/kernel/mm/transparent_hugepage/shmem_enabled set to advise (Debian's "
            "default, never, leaves it without effect; the banner says how much got them).");
DEFINE_uint32(host_spare_segments, 2,
              "Host segments a background thread keeps clean by renewing ones another namespace "
              "emptied, so taking a segment rarely waits for a renewal (0: renew on demand).");
DEFINE_uint32(host_standby_segments, 1,
              "Segments' worth of fresh memory a background thread keeps made ahead, beyond "
              "--host_capacity: a namespace that takes a segment another one emptied just now "
              "then waits a few ms for it instead of ~45 ms per 64 MiB (0: made on demand).");
DEFINE_string(node_id, "",
              "Node id. Default: the stored one, or <hostname>-<random> at first start.");
DEFINE_string(write_policy, "write-back",
              "When blocks reach disk: write-back (on demotion), write-through (at commit), "
              "write-through-after-N (after N hits).");
DEFINE_string(namespace_policy, "",
              "Per-namespace write policies: NS=POLICY[,NS=POLICY...]. A namespace the "
              "namespaces file names is configured by the file alone.");
DEFINE_string(namespaces_file, "/etc/kvpool/namespaces.yaml",
              "Each namespace's strategies (eviction, write, admission, read_ahead, encoding, "
              "layout, lossy), quotas and who may act for it (access, admin, credentials), YAML; "
              "re-read on SIGHUP. Its default section wins over --write_policy. Missing at the "
              "default path: the defaults; missing when given: an error. Empty: none.");
DEFINE_int32(io_threads, 2, "Control-plane I/O threads.");
DEFINE_uint32(io_busy_poll_us, 0,
              "After each request, I/O threads poll without sleeping this long before they sleep "
              "(no wake-up for the next request: on a VM most of a short round trip; costs CPU). "
              "0: sleep at once.");
DEFINE_int32(worker_threads, 8, "Request worker threads.");
DEFINE_int32(promotion_threads, 2, "Threads promoting disk blocks to host.");
DEFINE_uint32(max_batch_keys, 4096, "Keys in one request.");
DEFINE_uint32(max_namespaces, 1024,
              "Namespaces the daemon holds before it refuses new names from clients (those the "
              "namespaces file or --namespace_policy configure always get one).");
DEFINE_string(max_frame_payload, "256MiB", "Largest payload in one frame (clients split batches).");
DEFINE_int32(frame_timeout_ms, 30000, "A started frame must arrive completely within this.");
DEFINE_uint32(max_connections, 4096, "Control connections open at once, in total.");
DEFINE_uint32(max_connections_per_peer, 1024,
              "Control connections open at once from one peer (a TCP address; on the Unix "
              "socket, one user).");
DEFINE_int32(hello_timeout_ms, 10000,
             "A connection that has not said an accepted hello within this is closed.");
DEFINE_int32(reservation_timeout_ms, 30000,
             "A put reservation not committed within this is reclaimed.");
DEFINE_bool(shared_memory, true,
            "Let clients on this node read and write blocks through shared memory (Unix socket "
            "connections); off: every byte travels in the socket frames.");
DEFINE_int32(lease_timeout_ms, 10000,
             "A shared-memory read lease not released within this ends by itself (client died).");
DEFINE_bool(ucx, true, "Offer the UCX data path to remote clients (TCP connections).");
DEFINE_string(ucx_transports, "", "UCX transports, e.g. tcp or rc,tcp. Default: UCX's choice.");
DEFINE_string(ucx_net_devices, "", "UCX network devices, e.g. eth0 or lo. Default: UCX's choice.");
DEFINE_int32(ucx_port, 0,
             "Port of the UCX listener remote clients connect to, on the --listen host. Default: "
             "0, a free port (the hello names it). A firewall must let it through beside "
             "--listen's port and --ucx_tcp_ports.");
DEFINE_string(ucx_tcp_ports, "",
              "Ports of UCX's tcp data connections, LOW-HIGH (UCX_TCP_PORT_RANGE). Default: any "
              "free port.");
DEFINE_string(ucx_max_unreceived, "1GiB",
              "Bytes of UCX answers one client may leave unreceived before its UCX requests are "
              "refused (each send also ends after 30 s).");
DEFINE_string(cluster, "",
              "Join a cluster through etcd: etcd://HOST:PORT[,HOST:PORT...]. Default: standalone.");
DEFINE_string(cluster_name, "kvpool", "Cluster name (etcd prefix /kvpool/<name>/).");
DEFINE_string(cluster_secret, "", "Shared cluster secret (prefer --cluster_secret_file).");
DEFINE_string(cluster_secret_file, "",
              "File holding the shared cluster secret (must not be world-readable).");
DEFINE_string(cluster_advertise, "",
              "Control address peers use, tcp://HOST:PORT (tls:// with --tls_cert). Default: the "
              "--listen address.");
DEFINE_uint32(replicas, 1, "Cluster mode: copies of each block beyond the first.");
DEFINE_uint32(cluster_lease_seconds, 2,
              "Cluster mode: the etcd lease of this node's membership record, 1-60 s. A node that "
              "stops renewing it (dead, stopped, cut off from etcd) leaves the others' view this "
              "long after its last renewal; until then they count it as a home that does not "
              "answer (a session load that cannot rule it out is Unavailable). A node that "
              "restarts waits this long plus 1 s for its old record to expire.");
DEFINE_bool(flush_on_shutdown, true, "Write host-only blocks to disk on SIGTERM.");
#ifdef NDEBUG
constexpr bool kDebugBuild = false;
#else
constexpr bool kDebugBuild = true;
#endif
DEFINE_bool(mutex_deadlock_detection, kDebugBuild,
            "Check each mutex acquisition for lock-order cycles and abort on one (abseil's "
            "deadlock detection, which Debian's abseil runs by default: a global lock and a graph "
            "update per acquisition). Default: on in Debug builds of kvpool, off otherwise.");
DEFINE_double(host_high_watermark, 0.90, "Host occupancy at which demotion to disk starts.");
DEFINE_double(host_low_watermark, 0.80, "Host occupancy at which demotion stops.");

namespace {

kvpool::Result<uint64_t> SizeFlag(const char* name, const std::string& value) {
  if (value.empty()) return uint64_t{0};
  kvpool::Result<uint64_t> v = kvpool::ParseBytes(value);
  if (!v.ok()) return v.status().WithContext(std::string("--") + name);
  return v;
}

int Fail(const kvpool::Status& st) {
  LOG(ERROR) << st.ToString();
  std::fprintf(stderr, "kvpoold: %s\n", st.ToString().c_str());
  return 1;
}

}  // namespace

int kvpool::daemon::DaemonMain(int argc, char** argv) {
  gflags::SetUsageMessage("kvpoold [flags]: the kvpool KV-cache block daemon");
  gflags::SetVersionString(kvpool::kBuildVersionLine);
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  // Before any thread starts.
  absl::SetMutexDeadlockDetectionMode(FLAGS_mutex_deadlock_detection
                                          ? absl::OnDeadlockCycle::kAbort
                                          : absl::OnDeadlockCycle::kIgnore);
  google::InstallFailureSignalHandler();
  kvpool::daemon::QuietProtobufLogs();

  // Block the stop signals in every thread; the main thread waits for them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGHUP);  // not a stop: reloads the namespaces file
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  kvpool::daemon::DaemonOptions o;
  o.data_dir = FLAGS_data_dir;
  o.socket_path = FLAGS_socket;
  o.tcp_listen = FLAGS_listen;
  o.tls = {FLAGS_tls_cert, FLAGS_tls_key, FLAGS_tls_ca};
  o.metrics_listen = FLAGS_metrics_listen;
  auto host = SizeFlag("host-capacity", FLAGS_host_capacity);
  auto segment = SizeFlag("host-segment-size", FLAGS_host_segment_size);
  auto disk = SizeFlag("disk-capacity", FLAGS_disk_capacity);
  auto payload = SizeFlag("max-frame-payload", FLAGS_max_frame_payload);
  for (const auto* r : {&host, &segment, &disk, &payload}) {
    if (!r->ok()) return Fail(r->status());
  }
  if (*payload < (1ull << 20) || *payload > 0xFFFFFFFFull) {
    return Fail(kvpool::Status::InvalidArgument("--max-frame-payload must be 1MiB..4GiB"));
  }
  if (FLAGS_host_low_watermark <= 0 || FLAGS_host_low_watermark > FLAGS_host_high_watermark ||
      FLAGS_host_high_watermark > 1) {
    return Fail(kvpool::Status::InvalidArgument(
        "watermarks must satisfy 0 < --host-low-watermark <= --host-high-watermark <= 1"));
  }
  if (!FLAGS_gpu_devices.empty()) {
    auto gpu_capacity = SizeFlag("gpu-capacity", FLAGS_gpu_capacity);
    auto gpu_segment = SizeFlag("gpu-segment-size", FLAGS_gpu_segment_size);
    if (!gpu_capacity.ok()) return Fail(gpu_capacity.status());
    if (!gpu_segment.ok()) return Fail(gpu_segment.status());
    if (*gpu_capacity == 0) {
      return Fail(kvpool::Status::InvalidArgument("--gpu_devices needs --gpu_capacity"));
    }
    std::istringstream list(FLAGS_gpu_devices);
    for (std::string d; std::getline(list, d, ',');) {
      char* end = nullptr;
      const long device = std::strtol(d.c_str(), &end, 10);
      if (d.empty() || *end != '\0' || device < 0 || device > 255) {
        return Fail(kvpool::Status::InvalidArgument("--gpu_devices: '" + d +
                                                    "' is not a CUDA device number"));
      }
      o.gpu_devices.push_back(static_cast<int>(device));
    }
    o.gpu_capacity_bytes = *gpu_capacity;
    o.gpu_segment_bytes = *gpu_segment;
  }
  o.nccl = FLAGS_nccl;
  o.host_capacity_bytes = *host;
  o.host_segment_bytes = *segment;
  o.disk_capacity_bytes = *disk;
  o.lock_memory = FLAGS_lock_memory;
  o.host_spare_segments = FLAGS_host_spare_segments;
  o.host_standby_segments = FLAGS_host_standby_segments;
  o.host_huge_pages = FLAGS_host_huge_pages;
  o.node_id = FLAGS_node_id;
  o.write_policy = FLAGS_write_policy;
  o.namespace_policies = FLAGS_namespace_policy;
  o.namespaces_file = FLAGS_namespaces_file;
  o.namespaces_file_required = !gflags::GetCommandLineFlagInfoOrDie("namespaces_file").is_default;
  o.io_threads = FLAGS_io_threads;
  o.io_busy_poll_us = FLAGS_io_busy_poll_us;
  o.worker_threads = FLAGS_worker_threads;
  o.promotion_threads = FLAGS_promotion_threads;
  o.max_batch_keys = FLAGS_max_batch_keys;
  o.max_namespaces = FLAGS_max_namespaces;
  o.limits.max_payload_bytes = static_cast<uint32_t>(*payload);
  o.frame_timeout = std::chrono::milliseconds(FLAGS_frame_timeout_ms);
  o.max_connections = FLAGS_max_connections;
  o.max_connections_per_peer = FLAGS_max_connections_per_peer;
  o.hello_timeout = std::chrono::milliseconds(FLAGS_hello_timeout_ms);
  o.tiers.reservation_timeout = std::chrono::milliseconds(FLAGS_reservation_timeout_ms);
  o.shared_memory = FLAGS_shared_memory;
  o.ucx = FLAGS_ucx;
  o.ucx_transports = FLAGS_ucx_transports;
  o.ucx_net_devices = FLAGS_ucx_net_devices;
  if (FLAGS_ucx_port < 0 || FLAGS_ucx_port > 65535) {
    return Fail(Status::InvalidArgument("--ucx_port must be 0..65535"));
  }
  o.ucx_port = static_cast<uint16_t>(FLAGS_ucx_port);
  o.ucx_tcp_ports = FLAGS_ucx_tcp_ports;
  auto unreceived = SizeFlag("ucx-max-unreceived", FLAGS_ucx_max_unreceived);
  if (!unreceived.ok()) return Fail(unreceived.status());
  o.ucx_max_unreceived_bytes = *unreceived;
  o.cluster = FLAGS_cluster;
  o.cluster_name = FLAGS_cluster_name;
  o.cluster_secret = FLAGS_cluster_secret;
  o.cluster_secret_file = FLAGS_cluster_secret_file;
  o.cluster_advertise = FLAGS_cluster_advertise;
  o.replicas = FLAGS_replicas;
  o.cluster_lease = std::chrono::seconds(FLAGS_cluster_lease_seconds);
  o.lease_timeout = std::chrono::milliseconds(FLAGS_lease_timeout_ms);
  o.tiers.flush_on_shutdown = FLAGS_flush_on_shutdown;
  o.tiers.host_high_watermark = FLAGS_host_high_watermark;
  o.tiers.host_low_watermark = FLAGS_host_low_watermark;

  kvpool::Result<std::unique_ptr<kvpool::daemon::Daemon>> daemon =
      kvpool::daemon::Daemon::Start(std::move(o));
  if (!daemon.ok()) return Fail(daemon.status().WithContext("kvpoold failed to start"));
  std::cout << (*daemon)->Describe() << std::endl;
  LOG(INFO) << "ready";
  sd_notify(0, "READY=1");

  uint64_t watchdog_usec = 0;
  const bool watchdog = sd_watchdog_enabled(0, &watchdog_usec) > 0 && watchdog_usec > 0;
  timespec wait{};
  if (watchdog) {
    const uint64_t half = watchdog_usec / 2;
    wait.tv_sec = static_cast<time_t>(half / 1000000);
    wait.tv_nsec = static_cast<long>(half % 1000000 * 1000);
  } else {
    wait.tv_sec = 3600;
  }
  int sig = -1;
  for (;;) {
    sig = sigtimedwait(&stop_signals, nullptr, &wait);
    if (sig == SIGTERM || sig == SIGINT) break;
    if (sig == SIGHUP) {
      sd_notify(0, "RELOADING=1");
      LOG(INFO) << "received SIGHUP, reloading the namespaces file";
      const kvpool::Status st = (*daemon)->ReloadNamespaces();
      if (!st.ok()) {
        // One log line per problem, as at start; what ran before keeps running.
        LOG(ERROR) << "namespaces file not reloaded, the running configuration stays ("
                   << kvpool::StatusCodeName(st.code()) << "):";
        size_t begin = 0;
        while (begin <= st.message().size()) {
          const size_t end = std::min(st.message().find('\n', begin), st.message().size());
          LOG(ERROR) << st.message().substr(begin, end - begin);
          begin = end + 1;
        }
      }
      sd_notify(0, "READY=1");
    }
    if (watchdog) sd_notify(0, "WATCHDOG=1");
  }
  LOG(INFO) << "received " << (sig == SIGTERM ? "SIGTERM" : "SIGINT") << ", stopping";
  sd_notify(0, "STOPPING=1");
  (*daemon)->Stop();
  return 0;
}
