#pragma once
// Loopback ports for child processes that tests and benches start (etcd, redis-server): a port
// is probed by binding 127.0.0.1:0 and reading it back, so another process may take it before the
// child binds it; callers retry or fail with the child's log.
//
// Thread safety: thread-safe.

#include <cstdint>

namespace kvpool::testing {

// A loopback TCP port that was free a moment ago; 0 when none could be had.
uint16_t FreeLoopbackPort();

}  // namespace kvpool::testing
