#pragma once
// ControlConnection: the client's control connection to one kvpoold (a Unix socket or tcp://).
// It dials, says hello (answering the daemon's challenge with a proof of its credential),
// frames requests and their responses with request ids and a deadline on every operation, and
// decides when a call may reconnect and retry (Run). What travels in the hello beyond the
// namespace (the data paths asked for) and what the answer grants are the caller's: Client
// (client.cc) builds the HelloRequest and reads the HelloResponse.
//
// A protocol error (a response to another request, a malformed body, a payload that does not
// match its block list) leaves the stream position unknown: the connection is closed and the
// next call reconnects.
//
// Thread safety: none; one thread at a time (as kvpool::Client). Ownership: owns its
// transport::ControlChannel; `options` is borrowed and must outlive the connection (the Client
// owns both).

#include <sys/uio.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <kvpool/client.h>

#include "control.pb.h"
#include "transport/control_channel.h"
#include "transport/frame.h"

namespace kvpool::client {

using transport::Deadline;

// A wire status as a Status (code 0 is OK).
Status FromWire(const wire::Status& s);

class ControlConnection {
 public:
  // `options.address` must already be resolved (not empty).
  explicit ControlConnection(const ClientOptions& options);
  ControlConnection(const ControlConnection&) = delete;
  ControlConnection& operator=(const ControlConnection&) = delete;

  // Now plus ClientOptions::timeout: the deadline of one call.
  Deadline NewDeadline() const { return std::chrono::steady_clock::now() + options_.timeout; }
  // ClientOptions::connect_timeout, or `timeout` when that is 0.
  std::chrono::milliseconds connect_timeout() const;

  // Closes any connection and opens a new one within connect_timeout(). Unavailable when nothing
  // listens, DeadlineExceeded on timeout.
  Status Dial();
  // Says hello on the dialed connection (within connect_timeout(), a second time with the proof
  // of ClientOptions::credential, else of the cluster secret, when the daemon challenges).
  // PermissionDenied when challenged without either; the daemon's refusal ("kvpoold refused the
  // connection");
  // any transport error. Closes the connection on failure; on success the connection counts as
  // fresh for the next Run.
  Status Hello(wire::HelloRequest req, wire::HelloResponse* resp);
  // Drops the connection (the next Run reconnects).
  void Close();

  // The numeric address the connection reached (ControlChannel::peer_ip); empty without one, or
  // for a Unix socket.
  std::string peer_ip() const { return channel_ == nullptr ? "" : channel_->peer_ip(); }
  // No connection, or the channel failed: a call must reconnect first.
  bool broken() const { return channel_ == nullptr || channel_->broken(); }

  // Runs `call` on a live connection, calling `connect` (which must Dial and Hello) first when
  // there is none. A connection that was already open before this call may have died idle (a
  // daemon restart): on Unavailable, reconnect once and retry. Every kvpool request is
  // idempotent (puts are put-if-absent), so the retry is safe. Without auto_reconnect, a broken
  // connection gives Unavailable. `connect` runs only within this call.
  template <typename F, typename C>
  auto Run(F call, C connect) -> decltype(call()) {
    if (broken()) {
      if (!options_.auto_reconnect && channel_ != nullptr) {
        return Status::Unavailable("connection to kvpoold is closed; call Reconnect()");
      }
      KVPOOL_RETURN_IF_ERROR(connect());
    }
    const bool reused = !fresh_;
    fresh_ = false;
    auto result = call();
    if (!result.ok() && result.status().code() == StatusCode::kUnavailable && reused &&
        options_.auto_reconnect && broken()) {
      KVPOOL_RETURN_IF_ERROR(connect());
      fresh_ = false;
      result = call();
    }
    return result;
  }

  // Sends one request and receives the response header and body. With `out_header`, a
  // response's payload is left for the caller to read (ReceivePayload, DiscardPayload) and its
  // header is returned there; otherwise the payload is discarded.
  template <typename Req, typename Resp>
  Status ExchangeOnce(uint16_t type, const Req& req, std::span<const iovec> payload, Resp* resp,
                      Deadline deadline, transport::FrameHeader* out_header = nullptr) {
    KVPOOL_ASSIGN_OR_RETURN(uint64_t id, SendRequest(type, req, payload, deadline));
    return ReceiveResponse(type, id, resp, deadline, out_header);
  }

  // A request without payloads whose response's status decides the result.
  template <typename Req, typename Resp>
  Status Simple(uint16_t type, const Req& req, Resp* resp) {
    KVPOOL_RETURN_IF_ERROR(ExchangeOnce(type, req, {}, resp, NewDeadline()));
    return FromWire(resp->status());
  }

  // Sends a request the daemon does not answer (RELEASE).
  template <typename Req>
  Status SendOnly(uint16_t type, const Req& req, Deadline deadline) {
    return SendRequest(type, req, {}, deadline).status();
  }

  // Sends one request frame (the payload gathered from `payload`); returns its request id.
  // InvalidArgument for a payload over 4 GiB.
  template <typename Req>
  Result<uint64_t> SendRequest(uint16_t type, const Req& req, std::span<const iovec> payload,
                               Deadline deadline) {
    std::string body;
    if (!req.SerializeToString(&body)) return Status::Internal("cannot serialize request");
    return SendFrame(type, body, payload, deadline);
  }

  // Receives the response to request `id` and parses its body. With `out_header` the caller
  // reads the response's payload; otherwise it is discarded. Internal (and the connection
  // closed) for a response to another request or a malformed body.
  template <typename Resp>
  Status ReceiveResponse(uint16_t type, uint64_t id, Resp* resp, Deadline deadline,
                         transport::FrameHeader* out_header = nullptr) {
    std::string body;
    transport::FrameHeader header;
    KVPOOL_RETURN_IF_ERROR(ReceiveFrame(type, id, &body, &header, deadline));
    if (!resp->ParseFromString(body)) {
      Close();
      return Status::Internal("malformed response body from kvpoold");
    }
    return FinishResponse(header, out_header, deadline);
  }

  // The next `n` payload bytes of the response being read, into `dst` or dropped.
  Status ReceivePayload(void* dst, size_t n, Deadline deadline);
  Status DiscardPayload(size_t n, Deadline deadline);
  // Descriptors that came with received bytes (MAP_SEGMENTS), in order; the caller owns them.
  std::vector<int> TakeReceivedFds();

 private:
  // Sends one frame; returns its request id.
  Result<uint64_t> SendFrame(uint16_t type, const std::string& body, std::span<const iovec> payload,
                             Deadline deadline);
  // Reads the header of the response to (`type`, `id`) and its body.
  Status ReceiveFrame(uint16_t type, uint64_t id, std::string* body, transport::FrameHeader* header,
                      Deadline deadline);
  // Hands the header to `out_header`, or discards the payload.
  Status FinishResponse(const transport::FrameHeader& header, transport::FrameHeader* out_header,
                        Deadline deadline);

  const ClientOptions& options_;
  // tls:// only: made from the options' files at the first Dial, shared by the reconnects.
  std::shared_ptr<const transport::TlsClientContext> tls_;
  std::unique_ptr<transport::ControlChannel> channel_;
  transport::FrameLimits recv_limits_;
  uint64_t next_request_id_ = 1;
  bool fresh_ = false;  // connected since the last Run began
};

}  // namespace kvpool::client
