#pragma once
// ControlServer: the daemon's control plane on Boost.Asio.
//
// Listens on a Unix socket (always) and a TCP address (when configured; TLS over it when given a
// certificate), reads frames
// (transport/frame.h), and hands each request to a RequestHandler on a worker pool, so a request
// that waits on disk never stalls the I/O threads. A connection runs one request at a time: it
// reads the next frame only after the response is written (clients are synchronous; use more
// connections for parallelism).
//
// A frame that fails validation, a body or payload that arrives slower than
// `frame_timeout`, or a payload that does not match what the handler expects closes that
// connection with a logged reason; nothing else is affected. Until the handler admits a
// connection (its hello) it may send only small frames, and only for `hello_timeout`;
// connections are bounded in total and per peer.
//
// Payloads travel without intermediate copies: for a request with a payload the handler first
// names where each byte goes (PayloadSinks), and the connection reads straight into those
// places; a response's payload is written from the handler's buffers (e.g. leased arena
// slots), and `release` runs once the bytes are on the wire or the connection died.
//
// Threads: `io_threads` (ThreadRole::kControlIo), each running an I/O context of its own that
// the connections are spread over (a connection stays on one I/O thread for its life), and
// `worker_threads` (ThreadRole::kRequestWorker). Thread safety: Start/Stop from one thread; the
// handler is called concurrently for different connections, never concurrently for one connection.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "transport/frame.h"
#include "transport/tls.h"

namespace kvpool::transport {

// Per-connection state owned by the handler (e.g. its namespace after hello).
class ConnectionState {
 public:
  virtual ~ConnectionState() = default;
};

// Who is at the other end of a Unix socket, as the kernel saw it when it connected
// (SO_PEERCRED): what a namespace bound to Unix users or groups is checked against.
struct PeerCredentials {
  int32_t pid = 0;
  uint32_t uid = 0;
  uint32_t gid = 0;
  std::vector<uint32_t> groups;  // its supplementary groups (SO_PEERGROUPS)
};

struct ConnectionInfo {
  uint64_t id = 0;     // unique for the life of the server
  std::string peer;    // "unix:pid=12,uid=1000" (or "unix") or "tcp:1.2.3.4:5678"
  bool local = false;  // a Unix socket: file descriptors can travel
  // Unix sockets: the connecting process's credentials; nullopt for TCP (or when the kernel
  // did not say).
  std::optional<PeerCredentials> credentials;
};

// Where payload bytes go. `data == nullptr` discards `size` bytes (e.g. for a reservation that
// expired), so the stream stays in sync and the handler can answer with an error.
struct PayloadSink {
  uint8_t* data = nullptr;
  uint64_t size = 0;
};

struct Response {
  uint16_t type = 0;
  std::string body;  // serialized protobuf
  std::vector<std::pair<const uint8_t*, size_t>> payload;
  std::function<void()> release;  // runs after the payload is written or dropped
  bool close_after = false;       // close the connection after sending (e.g. failed hello)
  // Sent with the response (SCM_RIGHTS, Unix sockets only) and closed here afterwards.
  std::vector<int> fds;
  // The request wants no answer (e.g. RELEASE): nothing is written.
  bool no_reply = false;
};

class RequestHandler {
 public:
  virtual ~RequestHandler() = default;
  virtual std::unique_ptr<ConnectionState> OnConnect(const ConnectionInfo& info) = 0;
  // For a request frame with a payload: where its bytes go. The sinks' sizes must add up to
  // header.payload_bytes; a non-OK status is a protocol error and closes the connection.
  virtual Status PayloadSinks(ConnectionState& state, const FrameHeader& header,
                              std::string_view body, std::vector<PayloadSink>* sinks) = 0;
  virtual Response Handle(ConnectionState& state, const FrameHeader& header,
                          std::string_view body) = 0;
  // Whether the connection said hello and was admitted. Until then its frames are held to
  // ControlServerOptions::max_hello_body_bytes without payload, and it is closed when
  // hello_timeout passes first. Default: always (no hello phase).
  virtual bool Admitted(const ConnectionState& state) const { return true; }
  // Whether requests of `type` never wait on disk or on other requests, so they may run on the
  // I/O thread without a hop to a worker (e.g. lookups). Default: false.
  virtual bool RunsInline(uint16_t type) const { return false; }
  // For a request RunsInline does not claim: its answer, on the I/O thread, when it turns out
  // not to wait after all (e.g. a get of blocks that are all in host memory); nullopt, having
  // changed nothing, to have a worker Handle it. Default: always nullopt.
  virtual std::optional<Response> TryInline(ConnectionState& state, const FrameHeader& header,
                                            std::string_view body) {
    return std::nullopt;
  }
  // The connection closed (orderly or not); no Handle call for it is running or will run.
  virtual void OnDisconnect(ConnectionState& state) = 0;
};

struct ControlServerOptions {
  // Unix socket path; its directory is created. A stale socket file is replaced; a live one
  // (another daemon answers) is an error.
  std::string unix_path;
  // Optional TCP listener "HOST:PORT" (port 0: any free port). Default: none.
  std::string tcp_listen;
  // With a certificate and key, the TCP listener speaks TLS (transport/tls.h); with a CA file
  // too, it requires client certificates signed by it. Default: none (plain TCP).
  TlsFiles tls;
  // Default: 2.
  int io_threads = 2;
  // After each request an I/O thread keeps polling its sockets this long before it sleeps, so
  // the next request does not have to wake it (on a virtual machine most of a short round trip;
  // ClientOptions::busy_poll is the client's side). Burns up to that much CPU per I/O thread
  // after every request. Default 0: sleep at once.
  std::chrono::microseconds io_busy_poll{0};
  // Default: 8.
  int worker_threads = 8;
  FrameLimits limits;
  // Once a frame's header arrived, the rest must arrive within this. Default: 30 s.
  std::chrono::milliseconds frame_timeout{30000};
  // Connections beyond this are closed at once. Default: 4096.
  uint32_t max_connections = 4096;
  // Connections from one peer (a TCP peer's address; on the Unix socket, one user) beyond this
  // are closed at once, so one tenant cannot take every connection. Default: 1024.
  uint32_t max_connections_per_peer = 1024;
  // Before the handler admits a connection (RequestHandler::Admitted): the largest frame body it
  // may send (a hello), and how long it has to be admitted. Default: 16 KiB, 10 s.
  uint32_t max_hello_body_bytes = 16 * 1024;
  std::chrono::milliseconds hello_timeout{10000};
};

class ControlServer {
 public:
  // Binds and starts serving. IoError/InvalidArgument with the address when it cannot.
  static Result<std::unique_ptr<ControlServer>> Start(const ControlServerOptions& options,
                                                      RequestHandler& handler);
  virtual ~ControlServer() = default;
  // Stops accepting, closes every connection and joins the threads. Idempotent.
  virtual void Stop() = 0;
  virtual std::string unix_path() const = 0;
  // "host:port" actually bound, empty without TCP.
  virtual std::string tcp_address() const = 0;
  virtual uint64_t connections() const = 0;
};

}  // namespace kvpool::transport
