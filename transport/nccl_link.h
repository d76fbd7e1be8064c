#pragma once
// NcclLink: an NCCL communicator between this daemon and its peers (DESIGN.md section 9), for
// moving gpu-tier blocks device to device between nodes. Built only where CUDA and NCCL are
// both present; everywhere else blocks keep moving over UCX from host memory.
//
// How two daemons make one: one side calls NewId and sends the id to the other over their
// authenticated control connection (the id is what lets a process join, so it never travels
// any other way); both call Join with it, each with its own rank, at about the same time.
// Everything that could wait on a peer is bounded by a deadline instead: NCCL runs
// non-blocking (ncclConfig_t::blocking = 0) and this class polls it. A peer that never joins,
// dies, or stops receiving makes the call fail with DeadlineExceeded; the communicator is then
// aborted (ncclCommAbort) and the link is broken for good: its owner counts the blocks as
// misses and builds a new link when it next needs one.
//
// One GPU cannot hold two ranks of one communicator (NCCL refuses a duplicate GPU), so a
// one-GPU machine can check only a single-rank link sending to itself; two ranks need two GPUs.
//
// Thread safety: one thread at a time per link (NCCL's own rule for a communicator).

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "common/status.h"

namespace kvpool::transport {

class NcclLink {
 public:
  using Deadline = std::chrono::steady_clock::time_point;
  // Bytes of an id (NCCL_UNIQUE_ID_BYTES).
  static constexpr size_t kIdBytes = 128;

  // A fresh id for a new communicator. Needs no GPU.
  static Result<std::string> NewId();
  // Joins the communicator of `id` as `rank` of `ranks`, on CUDA device `device`, by `deadline`.
  // InvalidArgument for a malformed id or rank; Unavailable without a usable GPU or NCCL;
  // DeadlineExceeded when the other ranks did not join in time (the attempt is aborted).
  static Result<std::unique_ptr<NcclLink>> Join(const std::string& id, int ranks, int rank,
                                                int device, Deadline deadline);
  // Finalizes the communicator (waiting at most a second for the peer), aborts it when broken.
  ~NcclLink();
  NcclLink(const NcclLink&) = delete;
  NcclLink& operator=(const NcclLink&) = delete;

  // One send or receive of `bytes` of device memory at `data` (on this link's device) to or
  // from rank `peer`.
  struct Op {
    bool send = false;
    int peer = 0;
    void* data = nullptr;
    size_t bytes = 0;
  };
  // Runs `ops` as one NCCL group on `stream` (a cudaStream_t of this link's device; null: the
  // default stream) and waits until they are done, at most until `deadline`. Each peer must
  // post the matching operations in the same order. On any failure the link is broken.
  Status Transfer(std::span<const Op> ops, void* stream, Deadline deadline);

  bool broken() const { return broken_; }
  int device() const { return device_; }
  int rank() const { return rank_; }
  int ranks() const { return ranks_; }

 private:
  struct Comm;  // the ncclComm_t, kept out of this header
  NcclLink(std::unique_ptr<Comm> comm, int device, int ranks, int rank);
  // Polls the communicator until its pending operation ends or `deadline` passes.
  Status WaitIdle(Deadline deadline, const char* what);
  Status Break(Status why);  // aborts the communicator; returns `why`

  std::unique_ptr<Comm> comm_;
  int device_;
  int ranks_;
  int rank_;
  bool broken_ = false;
};

}  // namespace kvpool::transport
