#pragma once
// UcxEngine: kvpool's bulk data path over UCX (one ucp context + one worker + one progress
// thread). Daemons and remote clients move block bytes with it: a client makes its endpoint to
// kvpoold's listener (Listen, ConnectTo; transport/ucx_bind.h binds it to the control
// connection), the control plane (Asio) carries the tags, and the receiver verifies each block's
// checksum. The engine reports length and completion truthfully: a transfer that failed, was cut
// (peer died) or was cancelled completes with a non-OK Status, never OK with partial bytes.
//
// Threading: the worker is created UCS_THREAD_MODE_SINGLE and only the engine's progress thread
// (ThreadRole::kUcxProgress) ever calls into UCX. Public methods enqueue a command (one mutex, one
// eventfd write) that the progress thread runs. Chosen over UCS_THREAD_MODE_MULTI because MULTI
// takes the worker lock on every call and progress, so callers and the progress thread contend on
// it; with one owner, request lifetime, cancellation and shutdown are also simple to reason about.
// The progress thread spins briefly after activity and otherwise sleeps on the worker's event fd.
//
// Completion callbacks (`done`) run exactly once, on the progress thread; they must not block
// (they may call the asynchronous methods, Connect and EndpointTransports, which then run inline;
// the *Sync methods return FailedPrecondition there). The caller keeps each
// buffer valid and untouched until its `done` ran (or its *Sync call returned).
//
// Error mode: every endpoint is created with UCP_ERR_HANDLING_MODE_PEER, so a dead peer fails
// its outstanding operations (Unavailable) instead of hanging them; a peer that stops without
// dying is found by UCX keepalive (UcxOptions::keepalive_interval). A failed endpoint stays
// failed: later sends on it complete with Unavailable; Disconnect it and Connect again.
//
// Thread safety: all public methods may be called from any thread. Ownership: the engine owns its
// UCX objects; ~UcxEngine cancels what is outstanding (callbacks get Aborted) and joins the thread.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace kvpool::transport {

struct UcxOptions {
  // UCX transports, as UCX_TLS would take them ("tcp", "shm,tcp", "rc,sm", ...); applied with
  // ucp_config_modify("TLS"). Default: empty (UCX's own choice, or $UCX_TLS when set).
  std::string transports;

  // Network devices UCX may use ("lo", "eth0", "mlx5_0:1"); ucp_config_modify("NET_DEVICES").
  // Tests set "lo" so nothing but loopback is touched. Default: empty (UCX's choice, or
  // $UCX_NET_DEVICES).
  std::string net_devices;

  // The ports UCX's tcp transport listens on for its data connections, "LOW-HIGH" (UCX's
  // TCP_PORT_RANGE): beside a listener's port (Listen), these are what a firewall must let
  // through. Default: empty (any free port, or $UCX_TCP_PORT_RANGE).
  std::string tcp_port_range;

  // How often UCX checks that a peer with an idle connection is still alive; bounds how long
  // an operation against a stopped (not dead) peer can stay outstanding. Default: 2 s (UCX's own
  // default is 20 s).
  std::chrono::milliseconds keepalive_interval{2000};

  // UCX's tcp transport receives through a buffer ("segment") of this size per endpoint while
  // data comes in (UCX's TCP_RX_SEG_SIZE; a sender's segment, TCP_TX_SEG_SIZE, must not be
  // larger than its peer's receive segment). UCX's own default is 64 KiB; with 256 KiB, blocks of
  // 64 KiB to 4 MiB move 1.3-1.35x faster over loopback (docs/UCX.md). Not applied when
  // $UCX_TCP_RX_SEG_SIZE or $UCX_TCP_TX_SEG_SIZE is set (the environment decides then); 0: UCX's
  // default. Default: 256 KiB.
  uint64_t tcp_receive_segment_bytes = 256 * 1024;

  // After work, the progress thread keeps polling this long before it sleeps on the event fd:
  // back-to-back transfers then avoid a wake-up each. Default: 50 us.
  std::chrono::microseconds spin_before_sleep{50};

  // A cancelled receive that is already receiving from its sender (`from` of ReceiveTagged) and
  // has not ended this long after the cancel gets that sender's endpoint force-closed, which ends
  // it. Default: 1 s.
  std::chrono::milliseconds cancel_grace{1000};

  // How long ~UcxEngine waits for cancelled operations to report before it destroys the worker
  // and reports them Aborted itself. Default: 2 s.
  std::chrono::milliseconds shutdown_grace{2000};

  // Index in the progress thread's name (kvp-ucx-N). Default: 0.
  int thread_index = 0;
};

using UcxEndpointId = uint64_t;  // never 0
using UcxOpId = uint64_t;        // never 0

class UcxEngine {
 public:
  // The operation kvpool uses for block bodies on an endpoint; see docs/UCX.md for the
  // measurements behind the choice.
  enum class BulkOp { kTagged, kActiveMessage, kRmaGet };

  // ucp_init + worker + progress thread. Unavailable when UCX finds no usable transport (e.g.
  // `transports` names none present here), with UCX's reason.
  static Result<std::unique_ptr<UcxEngine>> Create(const UcxOptions& options);
  ~UcxEngine();
  UcxEngine(const UcxEngine&) = delete;
  UcxEngine& operator=(const UcxEngine&) = delete;

  // Opaque bytes (the packed ucp worker address) for a trusted peer's Connect (kvpool's own
  // daemons and clients use Listen and ConnectTo instead). Stable for the engine's life.
  const std::string& WorkerAddress() const;
  // This engine's client id: random (never 0), fixed for its life, sent with each ConnectTo's
  // connection request, where a listener's `admit` sees it. Known only to whoever this engine's
  // owner tells (kvpool's clients tell kvpoold in their HELLO, so that an offer of UCX made to
  // one connection cannot be taken by another process at the same address).
  uint64_t client_id() const;

  // Creates an endpoint to the worker whose WorkerAddress() is `peer_worker_address` (with
  // error mode PEER). Only for an address from a trusted source: UCX 1.13 unpacks it without a
  // length and aborts the process on some malformed ones (InvalidArgument for others).
  // Unavailable when no common transport reaches the peer. Wire-up completes lazily: a dead peer
  // shows on the first send.
  Result<UcxEndpointId> Connect(std::string_view peer_worker_address);

  // Reads the client id a connection request carries (the connecting engine's client_id(); 0
  // from one that sent none).
  using ClientIdOf = std::function<uint64_t()>;
  using AdmitFn = std::function<bool(const std::string& peer_ip, const ClientIdOf& client_id)>;
  // Listens for endpoints that peers create with ConnectTo: on `ip` (an address or a name;
  // "0.0.0.0" or "::" for every interface) and `port` (0: a free one). Returns the port. For
  // each connection request, `admit` decides from the peer's address ("10.0.0.7"; an
  // IPv4-mapped IPv6 address in IPv4 form) and, where it asks, the client id the request
  // carries, whether it is accepted, before anything is created for it; a refused one is
  // rejected (ucp_listener_reject). Reading the id has UCX 1.13 parse the request's own data,
  // without checking its length and aborting the process on some malformed ones: ask only for a
  // request from an address that is expected to connect. Each accepted
  // endpoint (error mode PEER) goes to `on_accept` with that address. Both run on the progress
  // thread and must not block; the endpoint is the caller's to Disconnect. The peer's worker
  // address travels inside UCX's own wire-up, so a caller never hands UCX address bytes it got from
  // someone else (Connect does). One listener per engine (FailedPrecondition for a second); it ends
  // with StopListening or the engine.
  Result<uint16_t> Listen(std::string_view ip, uint16_t port, AdmitFn admit,
                          std::function<void(UcxEndpointId, const std::string& peer_ip)> on_accept);
  // Stops the listener: later connection requests are refused; accepted endpoints stay.
  void StopListening();

  // Creates an endpoint (error mode PEER) to the engine that listens at `host`:`port` (a name
  // or a numeric address). InvalidArgument when the host does not resolve; a listener that is
  // not there shows as Unavailable on the first transfer, as with Connect.
  Result<UcxEndpointId> ConnectTo(std::string_view host, uint16_t port);

  // Closes the endpoint (flushing, or at once if it failed); its outstanding sends complete
  // (OK if flushed, else Aborted/Unavailable). Unknown ids are ignored.
  void Disconnect(UcxEndpointId ep);
  // The endpoint failed (its peer went away, UCX reported an error, or a transfer's grace close
  // ended it) and is not yet Disconnected: no transfer on it can succeed. Lets a caller whose
  // endpoint has been idle learn that before it names the endpoint in a request. Any thread;
  // a lock, no round trip to the progress thread. False for unknown ids.
  bool EndpointFailed(UcxEndpointId ep) const;

  // Sends `len` bytes tagged `tag`. `done` runs once when `data` may be reused (OK) or the send
  // failed: Unavailable (peer gone, endpoint failed), Aborted (cancelled, engine destroyed,
  // `deadline` passed), NotFound (unknown endpoint). A send still outstanding at `deadline` is
  // cancelled as by Cancel (its endpoint is force-closed), so a receiver that never takes it
  // cannot hold `data` for longer.
  UcxOpId SendTagged(UcxEndpointId ep, uint64_t tag, const void* data, size_t len,
                     std::function<void(Status)> done,
                     std::chrono::steady_clock::time_point deadline =
                         std::chrono::steady_clock::time_point::max());

  // Receives the next message tagged exactly `tag` from any peer into `data`. A message sent
  // before this call waits in UCX's unexpected queue and is matched here. `done` gets the
  // received length with OK; ResourceExhausted if the message is longer than `capacity`
  // (truncated: the bytes must not be used); Unavailable if the sender died mid-transfer;
  // Aborted if cancelled.
  // `from`, when not 0, is the endpoint whose peer sends under `tag`: UCX 1.13 cannot withdraw a
  // receive already under way, and a sender that stops (SIGSTOP, a hung host: no error reaches
  // UCX) would hold `data` for as long as it stays stopped. A cancel of such a receive that has
  // not ended UcxOptions::cancel_grace later force-closes `from` (its other operations fail;
  // reconnect), which ends the receive with Aborted. And when `from` fails or is closed, the
  // receive ends at once with the endpoint's reason (Unavailable for a peer gone, Aborted for a
  // close here) instead of waiting for a message that cannot come.
  // Without `from` the receive may outlive its cancel for as long as its sender is stopped.
  UcxOpId ReceiveTagged(uint64_t tag, void* data, size_t capacity,
                        std::function<void(Status, size_t received)> done, UcxEndpointId from = 0);

  // Stream bytes on one endpoint (UCX's stream API): what SendStream sends on `ep` arrives, in
  // order, only at ReceiveStream of the other end of that same endpoint; unlike a tagged
  // message, no other endpoint can put bytes there. For small handshakes (the UCX bind nonce,
  // transport/ucx_bind.h). `done` as for SendTagged.
  UcxOpId SendStream(UcxEndpointId ep, const void* data, size_t len,
                     std::function<void(Status)> done);
  // Receives exactly `len` bytes from `ep`'s stream into `data`, by `deadline`: OK with `len`;
  // the endpoint's failure (Unavailable, or Aborted once closed) as soon as it fails;
  // DeadlineExceeded past `deadline`, returned UcxOptions::cancel_grace later: UCX 1.13 cannot
  // cancel a stream receive, so the endpoint is then force-closed to end it (later operations on
  // it fail). FailedPrecondition on the progress thread.
  Result<size_t> ReceiveStreamSync(UcxEndpointId ep, void* data, size_t len,
                                   std::chrono::steady_clock::time_point deadline);

  // Asks that `op` stop: its `done` runs with Aborted (or with its real result if it finished
  // first). A receive not yet matched is cancelled at once; one already receiving finishes or
  // fails with its sender. UCX 1.13 cannot withdraw a send in flight, so cancelling a send that is
  // still outstanding force-closes its endpoint (its other sends complete Aborted; later sends
  // fail; reconnect). Unknown or finished ids are ignored.
  void Cancel(UcxOpId op);

  // Blocking forms for synchronous callers. On `deadline` the operation is cancelled (as
  // Cancel), the call waits until UCX has released the buffer, and returns DeadlineExceeded.
  // FailedPrecondition when called on the progress thread.
  Status SendTaggedSync(UcxEndpointId ep, uint64_t tag, const void* data, size_t len,
                        std::chrono::steady_clock::time_point deadline);
  Result<size_t> ReceiveTaggedSync(uint64_t tag, void* data, size_t capacity,
                                   std::chrono::steady_clock::time_point deadline,
                                   UcxEndpointId from = 0);

  // Transports the worker opened, e.g. "tcp/lo" or "posix/memory cma/memory tcp/lo"
  // (from ucp_context_print_info).
  const std::string& transports_in_use() const;

  // Transports an endpoint's lanes use, e.g. "tcp/lo" (from ucp_ep_print_info). Wire-up may
  // still be completing right after Connect; after a first transfer it is final.
  Result<std::string> EndpointTransports(UcxEndpointId ep);

  // The operation for block bodies on this engine's transports: kTagged everywhere today (see
  // ucx_engine.cc and docs/UCX.md for why, with the figures; RMA get is not implemented).
  BulkOp bulk_op() const;

  class Impl;  // in ucx_engine.cc; keeps <ucp/api/ucp.h> out of this header

 private:
  explicit UcxEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

const char* BulkOpName(UcxEngine::BulkOp op);

// Converts a ucs_status_t (passed as int so this header needs no UCX include) to a Status:
// CANCELED → Aborted, TIMED_OUT → DeadlineExceeded, MESSAGE_TRUNCATED / NO_MEMORY →
// ResourceExhausted, connection and endpoint failures → Unavailable, ... OK stays OK.
Status UcsStatusToStatus(int ucs_status, std::string_view context);

}  // namespace kvpool::transport

// The UCX boundary macro: `KVPOOL_UCS_STATUS(st, "ucp_init")` is a Status carrying file, line,
// the context and ucs_status_string(st); OK for UCS_OK. Use with KVPOOL_RETURN_IF_ERROR.
#define KVPOOL_UCS_STATUS(ucs_status, context)                         \
  ::kvpool::transport::UcsStatusToStatus(static_cast<int>(ucs_status), \
                                         ::kvpool::SourceLocation(__FILE__, __LINE__) + (context))
