#pragma once
// DeviceLink: a channel between this daemon's GPU and a peer daemon's GPU, moving device memory
// without a copy through host memory (DESIGN.md section 9). DeviceLinks makes them. kvpoold's
// are NCCL communicators (transport/nccl_link.h); tests without a GPU use the in-process double
// of tests/support/fake_device_link.h.
//
// How two daemons make one: one side calls NewId and sends the id to the other over their
// authenticated control connection (the id is what lets a process join, so it never travels any
// other way); both call Join with it, each with its own rank, at about the same time. Everything
// that could wait on a peer is bounded by a deadline: a peer that never joins, dies or stops
// taking part makes the call fail with DeadlineExceeded, and the link is then broken for good.
// Its owner counts the blocks as misses and makes a new link when it next needs one.
//
// Thread safety: one thread at a time per link (NCCL's rule for a communicator). A DeviceLinks
// may be used from any thread.

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "common/status.h"

namespace kvpool::transport {

class DeviceLink {
 public:
  using Deadline = std::chrono::steady_clock::time_point;
  virtual ~DeviceLink() = default;

  // One send or receive of `bytes` of device memory at `data` (on this link's device) to or from
  // rank `peer`.
  struct Op {
    bool send = false;
    int peer = 0;
    void* data = nullptr;
    size_t bytes = 0;
  };
  // Runs `ops` as one group on `stream` (a cudaStream_t of this link's device; null: the link's
  // own stream, which no other link shares) and waits until they are done, at most until
  // `deadline`. The peer must post the
  // matching operations in the same order. On any failure the link is broken: FailedPrecondition
  // for every later call.
  virtual Status Transfer(std::span<const Op> ops, void* stream, Deadline deadline) = 0;
  virtual bool broken() const = 0;
  virtual int device() const = 0;
  // Ends the link at once, without waiting for the peer (ncclCommAbort): for a link its owner
  // drops. Broken from then on. (Destroying a link that is not broken first finalizes it, which
  // waits for the peer up to a second.)
  virtual void Abort() = 0;
};

class DeviceLinks {
 public:
  using Deadline = DeviceLink::Deadline;
  virtual ~DeviceLinks() = default;
  // A fresh id for a new link. Needs no GPU.
  virtual Result<std::string> NewId() = 0;
  // Joins the link of `id` as `rank` of `ranks`, on CUDA device `device`, by `deadline`.
  // InvalidArgument for a malformed id or rank; Unavailable without a usable GPU or library;
  // DeadlineExceeded when the other ranks did not join in time.
  virtual Result<std::unique_ptr<DeviceLink>> Join(const std::string& id, int ranks, int rank,
                                                   int device, Deadline deadline) = 0;
};

// NCCL's links, where kvpool was built with NCCL's header and libnccl.so.2 loads at run time.
// Unavailable (with the reason) otherwise: blocks then move between daemons over UCX only.
Result<std::unique_ptr<DeviceLinks>> NcclDeviceLinks();

}  // namespace kvpool::transport
