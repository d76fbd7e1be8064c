#pragma once
// ControlChannel: the client side of one control connection, blocking, with a deadline on
// every operation (poll on a non-blocking socket). A Unix socket path, "tcp://HOST:PORT", or
// "tls://HOST:PORT" (TLS over TCP, transport/tls.h).
//
// A call is Send (header, body, optional payload gathered from the caller's buffers with no
// copy), then ReceiveHeader and ReceiveBody, then, for a response with a payload, ReceiveInto /
// Discard for each piece in order. Any error or timeout leaves the channel broken(): the
// caller drops it and reconnects, since the stream position is unknown.
//
// Thread safety: one thread at a time.

#include <sys/uio.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/frame.h"
#include "transport/tls.h"

namespace kvpool::transport {

using Deadline = std::chrono::steady_clock::time_point;

class ControlChannel {
 public:
  // Connects within `timeout` (for tls://, the TLS handshake included, verified with `tls`,
  // or with the system's trust store when null). Unavailable when nothing listens,
  // DeadlineExceeded on timeout, PermissionDenied when the daemon's certificate does not
  // verify.
  static Result<std::unique_ptr<ControlChannel>> Connect(
      const std::string& address, std::chrono::milliseconds timeout,
      std::shared_ptr<const TlsClientContext> tls = nullptr);
  ~ControlChannel();

  Status Send(const FrameHeader& header, std::string_view body, std::span<const iovec> payload,
              Deadline deadline);
  // Receives the next frame's header (waiting for it first when nothing is buffered).
  Result<FrameHeader> ReceiveHeader(const FrameLimits& limits, Deadline deadline);
  // Receives exactly `n` bytes. On a plain socket each receive also takes up to kReadAhead
  // bytes beyond them, which the next call returns first: a header and a short body (or a whole
  // short frame) cost one receive.
  Status ReceiveInto(void* dst, size_t n, Deadline deadline);
  Status Discard(size_t n, Deadline deadline);

  // File descriptors that arrived with received bytes (SCM_RIGHTS, Unix sockets), in order; the
  // caller owns them. With the read-ahead, descriptors sent with the next frame may arrive with
  // the end of this one: callers take them per exchange, which is right only while a client
  // never has two answers carrying descriptors on their way at once (none does).
  std::vector<int> TakeReceivedFds();

  // Before blocking for an answer, poll the socket without sleeping for up to `window`: a
  // waiting thread that never sleeps is not woken, which on a virtual machine is most of a
  // short round trip (~45 us per Unix-socket ping-pong on a KVM guest, ~3 us spinning). Costs
  // that CPU while waiting. Default 0: block at once.
  void set_busy_poll(std::chrono::microseconds window) { busy_poll_ = window; }

  bool broken() const { return fd_ < 0; }
  const std::string& address() const { return address_; }
  // The numeric IP address a tcp:// (or tls://) channel connected to, e.g. "10.0.0.7" or
  // "fe80::1%eth0": what a second connection to the same daemon dials, where the address's name
  // could resolve to another (round-robin DNS). Empty for a Unix socket.
  const std::string& peer_ip() const { return peer_ip_; }

 private:
  ControlChannel(int fd, std::string address) : fd_(fd), address_(std::move(address)) {}
  // Waits until the socket is readable (or writable), first spinning for busy_poll_ unless
  // `spin` is false; DeadlineExceeded/Unavailable.
  Status Wait(bool for_write, Deadline deadline, bool spin = true);
  Status Fail(Status st);  // closes, returns st
  // Runs one OpenSSL call on ssl_ until it makes progress, waiting on the socket when it wants
  // to read or write; what it returned (> 0), or the failure (the channel then broken).
  Result<int> RunTls(const std::function<int()>& op, const char* what, Deadline deadline);
  Status SendTls(std::span<const iovec> pieces, Deadline deadline);

  static constexpr size_t kReadAhead = 16 * 1024;

  int fd_;
  SSL* ssl_ = nullptr;          // tls:// only
  std::vector<uint8_t> ahead_;  // ahead_[ahead_pos_, ahead_end_): received, not yet taken
  size_t ahead_pos_ = 0;
  size_t ahead_end_ = 0;
  std::string address_;
  std::string peer_ip_;
  std::vector<int> received_fds_;
  std::chrono::microseconds busy_poll_{0};
};

}  // namespace kvpool::transport
