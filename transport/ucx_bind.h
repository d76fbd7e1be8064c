#pragma once
// How a client's UCX endpoint is bound to its control connection, without kvpoold ever reading
// UCX address bytes a client sent (UCX 1.13 unpacks a worker address without a length and
// aborts on a malformed one):
//   1. HELLO with `ucx` asks for the UCX data path; the answer's `ucx_port` offers it: the port
//      of kvpoold's UCX listener, on the host the client dialed (127.0.0.1 for a Unix socket).
//   2. The client creates an endpoint to that listener (UcxEngine::ConnectTo); UCX's own
//      client-server wire-up connects the two workers.
//   3. kvpoold sends a fresh random nonce of kUcxBindNonceBytes on each endpoint it accepts,
//      tagged kUcxBindTag (no block tag is ever this large).
//   4. The client names that nonce in UCX_BIND on its control connection; kvpoold hands the
//      endpoint to that connection, once, and answers with the connection's tag prefix.
// Only the process at the other end of an endpoint receives its nonce, so a connection can
// claim no endpoint but its own; a nonce not claimed within seconds expires with its endpoint.

#include <cstddef>
#include <cstdint>

namespace kvpool::transport {

inline constexpr uint64_t kUcxBindTag = ~uint64_t{0};
inline constexpr size_t kUcxBindNonceBytes = 16;

}  // namespace kvpool::transport
