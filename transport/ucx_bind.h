#pragma once
// How a client's UCX endpoint is bound to its control connection, without kvpoold ever reading
// UCX address bytes a client sent (UCX 1.13 unpacks a worker address without a length and
// aborts on a malformed one):
//   1. A TCP connection's HELLO with `ucx` asks for the UCX data path; the answer's `ucx_port`
//      offers it: the port of kvpoold's UCX listener, on the host the client dialed. The offer
//      lets one connection request from that connection's address in.
//   2. The client creates an endpoint to that listener (UcxEngine::ConnectTo); UCX's own
//      client-server wire-up connects the two workers. kvpoold rejects a request from an address
//      with no offer waiting.
//   3. kvpoold sends a fresh random nonce of kUcxBindNonceBytes on each endpoint it accepts, on
//      that endpoint's stream (UcxEngine::SendStream), which no other endpoint can write to.
//   4. The client names that nonce in UCX_BIND on its control connection; kvpoold hands the
//      endpoint to that connection, once, if it comes from the endpoint's address, and answers
//      with the connection's tag prefix.
// Only the process at the other end of an endpoint receives its nonce, so a connection can
// claim no endpoint but its own; offers and nonces not taken within seconds expire (the
// endpoint closed).

#include <cstddef>

namespace kvpool::transport {

inline constexpr size_t kUcxBindNonceBytes = 16;

}  // namespace kvpool::transport
