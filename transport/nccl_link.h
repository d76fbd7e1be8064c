#pragma once
// NcclLink: a DeviceLink (transport/device_link.h) that is an NCCL communicator, for moving
// gpu-tier blocks device to device between daemons. Built only where CUDA and NCCL's header are
// both present; libnccl.so.2 is loaded at run time (dlopen), so kvpoold starts where NCCL is not
// installed, and then moves blocks between daemons over UCX only.
//
// NCCL runs non-blocking (ncclConfig_t::blocking = 0) and this class polls it, so every wait is
// bounded by its deadline; a failure or a deadline passed aborts the communicator
// (ncclCommAbort).
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
#include "transport/device_link.h"

namespace kvpool::transport {

class NcclLink final : public DeviceLink {
 public:
  // Bytes of an id (NCCL_UNIQUE_ID_BYTES).
  static constexpr size_t kIdBytes = 128;

  // A fresh id for a new communicator. Needs no GPU; Unavailable when libnccl.so.2 does not load.
  static Result<std::string> NewId();
  // Joins the communicator of `id` as `rank` of `ranks`, on CUDA device `device`, by `deadline`.
  // InvalidArgument for a malformed id or rank; Unavailable without a usable GPU or NCCL;
  // DeadlineExceeded when the other ranks did not join in time (the attempt is aborted).
  static Result<std::unique_ptr<NcclLink>> Join(const std::string& id, int ranks, int rank,
                                                int device, Deadline deadline);
  // Finalizes the communicator (waiting at most a second for the peer), aborts it when broken.
  ~NcclLink() override;
  NcclLink(const NcclLink&) = delete;
  NcclLink& operator=(const NcclLink&) = delete;

  // DeviceLink.
  Status Transfer(std::span<const Op> ops, void* stream, Deadline deadline) override;
  bool broken() const override { return broken_; }
  int device() const override { return device_; }
  void Abort() override { Break(Status::Aborted("dropped")).IgnoreError(); }

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
