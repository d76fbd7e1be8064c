#pragma once
// UcxDataPath: the client's UCX data path, for block bodies to and from a daemon on another node
// (tcp:// addresses). It owns the client's UcxEngine (created at the first hello that asks for
// UCX, and kept across reconnects) and the endpoint it makes to the daemon's UCX listener, which
// the control connection binds with UCX_BIND (transport/ucx_bind.h). Block bodies travel as tagged
// messages: a GET's blocks arrive under the tags the request named (ReceiveBlocks verifies each
// one's checksum), a PUT_COMMIT's blocks leave under tags below the daemon's prefix (SendBlocks).
// The control messages that name the tags go over the control connection, which is the caller's.
//
// Thread safety: none; one thread at a time (as kvpool::Client); the engine's own progress thread
// runs the completions, which only touch state the waiting call owns. Ownership: owns the engine
// and the endpoint (closed by Disconnect and the destructor); the caller's buffers are borrowed
// until the call that got them returns.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <kvpool/client.h>

#include "transport/control_channel.h"
#include "transport/ucx_engine.h"

namespace kvpool::client {

class UcxDataPath {
 public:
  // A block the daemon sends: `size` bytes tagged `tag`, for `target`.
  struct IncomingBlock {
    uint64_t tag = 0;
    BlockKey key;  // named in errors
    MutableBuffer target;
    uint64_t size = 0;
    uint64_t checksum = 0;  // BlockChecksum of the bytes
    Tier tier = Tier::kNone;
  };
  // A block this client sends.
  struct OutgoingBlock {
    const void* data = nullptr;
    size_t size = 0;
  };

  UcxDataPath() = default;
  ~UcxDataPath();
  UcxDataPath(const UcxDataPath&) = delete;
  UcxDataPath& operator=(const UcxDataPath&) = delete;

  // Creates the engine (ClientOptions::ucx_transports, ucx_net_devices) unless started(). The
  // engine's Unavailable when UCX finds no usable transport; nothing is kept then.
  Status Start(const std::string& transports, const std::string& net_devices);
  bool started() const { return engine_ != nullptr; }
  // The engine's client id (UcxEngine::client_id), which the hello names. Only when started().
  uint64_t client_id() const { return engine_->client_id(); }
  // Creates the endpoint to the daemon's UCX listener at `host`:`port` (the hello's ucx_port)
  // and returns the bind nonce the daemon sends on it, for UCX_BIND; Bound then records the
  // daemon's tag prefix. No nonce by `deadline` (DeadlineExceeded, returned
  // UcxOptions::cancel_grace later), or any UCX error: no endpoint (the nonce comes on the
  // endpoint's own stream, so a late one is never taken for another endpoint's). Only when
  // started() and not connected().
  Result<std::string> ConnectTo(const std::string& host, uint16_t port,
                                transport::Deadline deadline);
  void Bound(uint64_t tag_prefix);
  // Closes the endpoint, if any.
  void Disconnect();
  // An endpoint is bound and has not failed (an endpoint that failed while idle shows here
  // before a transfer names it).
  bool connected() const { return endpoint_ != 0 && bound_ && !engine_->EndpointFailed(endpoint_); }

  // The tag base of the next GET (bits 16..39; the block's position in the request below) and
  // of the next PUT_COMMIT over UCX (the daemon's prefix above). Both count one sequence.
  uint64_t NextGetTagBase() { return (++sequence_ & 0xFFFFFF) << 16; }
  uint64_t NextPutTagBase() { return tag_prefix_ | NextGetTagBase(); }

  // Receives `blocks` straight into their targets (a target too small, or null, gets the
  // message drained into scratch memory) and verifies each. Returns each block's result: OK
  // with its size and tier; InvalidArgument (with the size) for a target too small; Corruption
  // for a wrong length or checksum; the transfer's error (with context) otherwise. Past
  // `deadline` what has not arrived is cancelled (Aborted); a block still arriving then has the
  // daemon's endpoint closed after UcxOptions::cancel_grace (a stopped daemon must not hold the
  // caller's buffer). After a deadline or an endpoint failure the endpoint is dropped
  // (connected() false: the caller makes a new one at its next hello). Only when started().
  std::vector<GetResult> ReceiveBlocks(std::span<const IncomingBlock> blocks,
                                       transport::Deadline deadline);

  // Sends `blocks` on the endpoint, block k tagged `tag_base + k`, and waits until each send
  // ended; past `deadline` the rest are cancelled, and the endpoint is dropped as by
  // ReceiveBlocks. Returns each send's status (the daemon's answer to the commit is what decides
  // a block). Only when connected().
  std::vector<Status> SendBlocks(uint64_t tag_base, std::span<const OutgoingBlock> blocks,
                                 transport::Deadline deadline);

 private:
  std::unique_ptr<transport::UcxEngine> engine_;
  transport::UcxEndpointId endpoint_ = 0;
  bool bound_ = false;
  uint64_t tag_prefix_ = 0;
  uint64_t sequence_ = 0;
};

}  // namespace kvpool::client
