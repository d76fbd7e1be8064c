#pragma once
// The daemon's threads, named in one place. Every long-lived thread is started through
// StartThread with its role, so `top -H`, gdb and logs show what each one is; nothing else in
// kvpool creates threads ad hoc.
//
// Thread safety: StartThread may be called from any thread.

#include <functional>
#include <string>
#include <thread>

namespace kvpool {

enum class ThreadRole {
  kControlIo,      // Asio control-plane I/O (accept, read, write frames)
  kRequestWorker,  // runs requests that may block on disk or wait for promotions
  kTierFlusher,    // demotes host blocks to disk, expires reservations
  kPrefetcher,     // promotes disk blocks to host
  kMetricsHttp,    // serves /metrics
  kUcxProgress,    // UCX worker progress (cross-node data path)
  kGpuCopy,        // per-GPU copy worker
  kCluster,        // etcd membership: lease keepalive, watch, rejoin
  kGpuLink,        // one per device link a peer joined: its sends of gpu-tier blocks
};

// "kvp-io-0", "kvp-flush-0", ...: at most 15 characters (the kernel's limit).
std::string ThreadName(ThreadRole role, int index);

// Starts `fn` on a new thread named ThreadName(role, index).
std::thread StartThread(ThreadRole role, int index, std::function<void()> fn);

}  // namespace kvpool
