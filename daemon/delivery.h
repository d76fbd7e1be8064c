#pragma once
// BlockDelivery: how one connection's block bodies travel between the client and the host
// tier's slots. The get and put handlers (daemon/block_handlers.h) decide what is served and
// committed; the delivery moves the bytes, so a data-path change touches only its delivery.
//
// Implementations, one per data path:
//  - SocketDelivery (daemon/socket_delivery.h): bytes inside the control frames. Every
//    connection has it, from connect on.
//  - SharedMemoryDelivery (daemon/shm_delivery.h): segment/offset of each slot plus a lease;
//    the client copies through its own mapping. Granted at hello to local clients that ask.
//  - UcxDelivery (daemon/ucx_delivery.h): tagged UCX messages. Granted by UCX_BIND to a TCP
//    connection whose hello asked for it, on the endpoint its client made to kvpoold's UCX
//    listener (transport/ucx_bind.h). The only code that calls UCX for client data.
// Each request still names its path (GET in_place / via_ucx, ...), and a request without those
// flags uses the socket: the granted paths are layered (LayeredDelivery), each taking the
// requests that ask for it and handing the rest to the one below, down to the socket. The
// handlers call the top of that stack and never ask which path it is.
//
// Ownership: the connection (daemon/connection.h) owns its delivery; a delivery holds only
// references to the tier manager and the UCX engine, which outlive every connection.
// Thread safety: called for one connection at a time (ControlServer never runs two requests of
// one connection at once); UCX completions run on the UCX progress thread and touch only what
// they own.

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/status.h"
#include "control.pb.h"
#include "tiers/tier_manager.h"
#include "transport/control_server.h"

namespace kvpool::daemon {

// What one request asks of the data path, from its own flags.
struct PathAsk {
  bool in_place = false;      // shared memory: slots named in the answer, bytes in the mapping
  bool via_ucx = false;       // UCX: block i travels as a tagged message, tag ucx_tag_base + i
  uint64_t ucx_tag_base = 0;  // with via_ucx
};

// Who holds the leases of a GET's blocks and when they end by themselves (zero: never).
struct LeaseTerms {
  uint64_t owner = 0;
  std::chrono::milliseconds ttl{0};
};

// A PUT_COMMIT from the time its frame arrived (PayloadSinks, or the handler for bytes not in
// the frame) to its answer: one entry per reservation it names.
struct PendingCommit {
  std::vector<uint64_t> ids;
  std::vector<Status> status;              // non-OK: that block is aborted, not committed
  std::vector<uint64_t> checksums;         // in-place commits that send their checksums late
  std::vector<uint64_t> device_checksums;  // in-place commits into gpu slots
  void Clear() {
    ids.clear();
    status.clear();
    checksums.clear();
    device_checksums.clear();
  }
};

class BlockDelivery {
 public:
  virtual ~BlockDelivery() = default;

  // OK when this connection was granted every path `ask` names; FailedPrecondition naming the
  // first one that was not (shared memory before UCX).
  virtual Status Check(const PathAsk& ask) const = 0;

  // GET, in this order: BeginGet once (after Check passed), TermsFor to acquire the blocks,
  // then for each served block BoundedByFrame and Send.
  //
  // Housekeeping before a GET's blocks are acquired (UCX: ends sends of earlier answers that are
  // past their deadline).
  virtual void BeginGet() = 0;
  virtual LeaseTerms TermsFor(const PathAsk& ask) const = 0;
  // Whether a block sent for `ask` counts against the frame's payload limit (one that would
  // pass it is deferred: the client asks again).
  virtual bool BoundedByFrame(const PathAsk& ask) const = 0;
  // Hands over block `position` of the answer; `info` already has its size, checksum and tier.
  // Takes `read`'s lease (zeroing read.lease_id) where the lease must outlive the response;
  // otherwise the handler releases it once the response is written. Returns the bytes this
  // moved itself (frame payload or UCX), for bytes_out.
  virtual uint64_t Send(const PathAsk& ask, uint32_t position, tiers::BlockRead& read,
                        wire::BlockInfo* info, transport::Response* response) = 0;

  // PUT_RESERVE: adds what the client needs to write reserved slot at `arena_offset` (shared
  // memory: where it is).
  virtual void DescribeSlot(const PathAsk& ask, uint64_t arena_offset, wire::Reservation* out) = 0;

  // PUT_COMMIT with its bytes in the frame: where reservation `id`'s `size` bytes go. A null sink
  // (the bytes are discarded) with *why set when the reservation cannot take them.
  virtual transport::PayloadSink InFrameSink(uint64_t id, uint64_t size, Status* why) = 0;
  // PUT_COMMIT with its bytes outside the frame: whether `blocks` bodies may come as `ask` says
  // (UCX: their tags must lie in this connection's tag space). InvalidArgument when not.
  virtual Status CheckReceive(const PathAsk& ask, size_t blocks) const = 0;
  // ...and brings the body of each reservation still OK in `commit` into its slot (in place:
  // already there). A block whose transfer fails gets its error in commit.status.
  virtual void Receive(const PathAsk& ask, PendingCommit& commit,
                       std::span<const uint64_t> sizes) = 0;
};

// A path granted on top of another: by default every call goes to the one below; a layer
// overrides what it does for the requests that ask for it.
class LayeredDelivery : public BlockDelivery {
 public:
  explicit LayeredDelivery(std::unique_ptr<BlockDelivery> below) : below_(std::move(below)) {}
  // A repeated hello re-decides the layers under this one.
  void ReplaceBelow(std::unique_ptr<BlockDelivery> below) { below_ = std::move(below); }

  // BlockDelivery
  Status Check(const PathAsk& ask) const override { return below_->Check(ask); }
  void BeginGet() override { below_->BeginGet(); }
  LeaseTerms TermsFor(const PathAsk& ask) const override { return below_->TermsFor(ask); }
  bool BoundedByFrame(const PathAsk& ask) const override { return below_->BoundedByFrame(ask); }
  uint64_t Send(const PathAsk& ask, uint32_t position, tiers::BlockRead& read,
                wire::BlockInfo* info, transport::Response* response) override {
    return below_->Send(ask, position, read, info, response);
  }
  void DescribeSlot(const PathAsk& ask, uint64_t arena_offset, wire::Reservation* out) override {
    below_->DescribeSlot(ask, arena_offset, out);
  }
  transport::PayloadSink InFrameSink(uint64_t id, uint64_t size, Status* why) override {
    return below_->InFrameSink(id, size, why);
  }
  Status CheckReceive(const PathAsk& ask, size_t blocks) const override {
    return below_->CheckReceive(ask, blocks);
  }
  void Receive(const PathAsk& ask, PendingCommit& commit,
               std::span<const uint64_t> sizes) override {
    below_->Receive(ask, commit, sizes);
  }

 protected:
  BlockDelivery& below() const { return *below_; }

 private:
  std::unique_ptr<BlockDelivery> below_;
};

}  // namespace kvpool::daemon
