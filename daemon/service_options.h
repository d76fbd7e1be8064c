#pragma once
// BlockServiceOptions: the settings of the daemon's request handling (daemon/block_service.h and
// the handlers it routes to). Fixed for the service's life; plain data, read from any thread.

#include <chrono>
#include <cstdint>
#include <string>

#include "transport/frame.h"

namespace kvpool::daemon {

struct BlockServiceOptions {
  std::string node_id;
  std::string version = "0.1.0";
  // Keys in one request. Default: 4096.
  uint32_t max_batch_keys = 4096;
  // Limits the server enforces, advertised at hello so clients split batches to fit.
  transport::FrameLimits limits;
  // Same-node path: a lease not released within this ends by itself. Default: 10 s.
  std::chrono::milliseconds lease_timeout{10000};
  // Grant the shared-memory data path to local clients that ask. Default: true.
  bool shared_memory = true;
  // How long a UCX transfer of one request may take before its blocks fail. Default: 30 s.
  std::chrono::milliseconds ucx_timeout{30000};
  // Bytes of UCX sends one connection may leave unreceived before its UCX requests are refused.
  uint64_t ucx_max_unreceived_bytes = 1ull << 30;
  // When set (cluster mode), TCP connections must prove this secret at hello
  // (common/hello_auth.h); Unix-socket connections are local and exempt. Default: none.
  std::string tcp_secret;
  // The daemon runs in a cluster (its hooks are attached once it joins). Default: false.
  bool cluster_mode = false;
};

}  // namespace kvpool::daemon
