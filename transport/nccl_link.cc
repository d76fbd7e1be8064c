#include "transport/nccl_link.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstring>
#include <thread>

#include "kernels/cuda_check.h"

namespace kvpool::transport {
namespace {

static_assert(NcclLink::kIdBytes == NCCL_UNIQUE_ID_BYTES);

// The NCCL calls this file makes, from libnccl.so.2 loaded at run time: kvpoold does not need
// NCCL installed to start, only to make links.
struct Nccl {
  decltype(&ncclGetUniqueId) GetUniqueId = nullptr;
  decltype(&ncclCommInitRankConfig) CommInitRankConfig = nullptr;
  decltype(&ncclCommFinalize) CommFinalize = nullptr;
  decltype(&ncclCommDestroy) CommDestroy = nullptr;
  decltype(&ncclCommAbort) CommAbort = nullptr;
  decltype(&ncclCommGetAsyncError) CommGetAsyncError = nullptr;
  decltype(&ncclGetErrorString) GetErrorString = nullptr;
  decltype(&ncclGetLastError) GetLastError = nullptr;
  decltype(&ncclGroupStart) GroupStart = nullptr;
  decltype(&ncclGroupEnd) GroupEnd = nullptr;
  decltype(&ncclSend) Send = nullptr;
  decltype(&ncclRecv) Recv = nullptr;
};

template <typename F>
bool Resolve(void* lib, const char* name, F* fn) {
  *fn = reinterpret_cast<F>(dlsym(lib, name));
  return *fn != nullptr;
}

// Loads NCCL once (never unloaded); Unavailable with dlopen's reason when it cannot.
Result<const Nccl*> LoadNccl() {
  static const Result<const Nccl*> loaded = []() -> Result<const Nccl*> {
    void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      return Status::Unavailable(std::string("NCCL is not installed (libnccl.so.2: ") +
                                 (why != nullptr ? why : "not found") + ")");
    }
    static Nccl n;
    if (!Resolve(lib, "ncclGetUniqueId", &n.GetUniqueId) ||
        !Resolve(lib, "ncclCommInitRankConfig", &n.CommInitRankConfig) ||
        !Resolve(lib, "ncclCommFinalize", &n.CommFinalize) ||
        !Resolve(lib, "ncclCommDestroy", &n.CommDestroy) ||
        !Resolve(lib, "ncclCommAbort", &n.CommAbort) ||
        !Resolve(lib, "ncclCommGetAsyncError", &n.CommGetAsyncError) ||
        !Resolve(lib, "ncclGetErrorString", &n.GetErrorString) ||
        !Resolve(lib, "ncclGetLastError", &n.GetLastError) ||
        !Resolve(lib, "ncclGroupStart", &n.GroupStart) ||
        !Resolve(lib, "ncclGroupEnd", &n.GroupEnd) || !Resolve(lib, "ncclSend", &n.Send) ||
        !Resolve(lib, "ncclRecv", &n.Recv)) {
      return Status::Unavailable("libnccl.so.2 is older than NCCL 2.14 (a call is missing)");
    }
    return &n;
  }();
  return loaded;
}

// Only called once LoadNccl succeeded (every NcclLink was made through it).
const Nccl& Lib() { return **LoadNccl(); }

Status NcclStatus(ncclResult_t r, ncclComm_t comm, const std::string& what) {
  StatusCode code = StatusCode::kInternal;
  switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      code = StatusCode::kInvalidArgument;
      break;
    case ncclUnhandledCudaError:
    case ncclSystemError:
    case ncclRemoteError:
      code = StatusCode::kUnavailable;
      break;
    default:
      break;
  }
  std::string message = what + ": " + Lib().GetErrorString(r);
  if (const char* last = Lib().GetLastError(comm); last != nullptr && *last != '\0') {
    message += std::string(" (") + last + ")";
  }
  return Status(code, std::move(message));
}

// Waits between polls: spins briefly (a short transfer ends within microseconds), then sleeps.
void Pause(int polls) {
  if (polls < 1000) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

}  // namespace

struct NcclLink::Comm {
  ~Comm() {
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
  ncclComm_t comm = nullptr;
  // The link's own stream, for transfers given none: links of one GPU must not share the
  // default stream, where one link's transfer waiting for its peer would hold back every
  // other's (two daemons fetching from each other at once would wait on each other).
  cudaStream_t stream = nullptr;
};

NcclLink::NcclLink(std::unique_ptr<Comm> comm, int device, int ranks, int rank)
    : comm_(std::move(comm)), device_(device), ranks_(ranks), rank_(rank) {}

Result<std::string> NcclLink::NewId() {
  KVPOOL_ASSIGN_OR_RETURN(const Nccl* nccl, LoadNccl());
  ncclUniqueId id;
  const ncclResult_t r = nccl->GetUniqueId(&id);
  if (r != ncclSuccess) return NcclStatus(r, nullptr, "ncclGetUniqueId");
  return std::string(id.internal, sizeof(id.internal));
}

Result<std::unique_ptr<NcclLink>> NcclLink::Join(const std::string& id, int ranks, int rank,
                                                 int device, Deadline deadline) {
  if (id.size() != kIdBytes) {
    return Status::InvalidArgument("an NCCL id is " + std::to_string(kIdBytes) + " bytes, not " +
                                   std::to_string(id.size()));
  }
  if (ranks < 1 || rank < 0 || rank >= ranks) {
    return Status::InvalidArgument("rank " + std::to_string(rank) + " of " + std::to_string(ranks) +
                                   " is not a rank of the communicator");
  }
  KVPOOL_ASSIGN_OR_RETURN(const Nccl* nccl, LoadNccl());
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || device < 0 || device >= count) {
    cudaGetLastError();  // clear it for the caller's next CUDA call
    return Status::Unavailable("no CUDA device " + std::to_string(device) + " for NCCL" +
                               (e != cudaSuccess ? std::string(": ") + cudaGetErrorString(e)
                                                 : " (" + std::to_string(count) + " present)"));
  }
  const kernels::ScopedDevice on(device);
  if (!on.ok()) {
    return Status::Unavailable("cannot use CUDA device " + std::to_string(device) + " for NCCL");
  }
  ncclUniqueId uid;
  std::memcpy(uid.internal, id.data(), kIdBytes);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every wait below is bounded by the deadline instead
  auto comm = std::make_unique<Comm>();
  if (cudaStreamCreateWithFlags(&comm->stream, cudaStreamNonBlocking) != cudaSuccess) {
    return Status::Unavailable(std::string("cannot create a CUDA stream for NCCL: ") +
                               cudaGetErrorString(cudaGetLastError()));
  }
  const ncclResult_t r = nccl->CommInitRankConfig(&comm->comm, ranks, uid, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    Status st = NcclStatus(r, comm->comm, "ncclCommInitRankConfig");
    if (comm->comm != nullptr) nccl->CommAbort(comm->comm);
    return st;
  }
  std::unique_ptr<NcclLink> link(new NcclLink(std::move(comm), device, ranks, rank));
  KVPOOL_RETURN_IF_ERROR(link->WaitIdle(deadline, "joining the NCCL communicator"));
  return link;
}

NcclLink::~NcclLink() {
  if (comm_->comm == nullptr) return;  // aborted
  const kernels::ScopedDevice on(device_);
  const ncclResult_t r = Lib().CommFinalize(comm_->comm);
  if (r != ncclSuccess && r != ncclInProgress) {
    Break(Status::Internal("finalize failed")).IgnoreError();
    return;
  }
  if (!WaitIdle(std::chrono::steady_clock::now() + std::chrono::seconds(1), "finalizing").ok()) {
    return;  // aborted by WaitIdle
  }
  Lib().CommDestroy(comm_->comm);
  comm_->comm = nullptr;
}

Status NcclLink::Break(Status why) {
  broken_ = true;
  if (comm_->comm != nullptr) {
    Lib().CommAbort(comm_->comm);
    comm_->comm = nullptr;
    // The aborted kernels are gone from the link's stream before its owner frees the memory they
    // read or wrote.
    const kernels::ScopedDevice on(device_);
    if (cudaStreamSynchronize(comm_->stream) != cudaSuccess) cudaGetLastError();
  }
  return why;
}

Status NcclLink::WaitIdle(Deadline deadline, const char* what) {
  for (int polls = 0;; ++polls) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = Lib().CommGetAsyncError(comm_->comm, &state);
    if (r != ncclSuccess) return Break(NcclStatus(r, comm_->comm, what));
    if (state == ncclSuccess) return Status::OK();
    if (state != ncclInProgress) return Break(NcclStatus(state, comm_->comm, what));
    if (std::chrono::steady_clock::now() >= deadline) {
      return Break(Status::DeadlineExceeded(std::string(what) +
                                            ": the peer did not take part in time (aborted)"));
    }
    Pause(polls);
  }
}

Status NcclLink::Transfer(std::span<const Op> ops, void* stream, Deadline deadline) {
  if (broken_) {
    return Status::FailedPrecondition("this NCCL link failed earlier: join a new one");
  }
  for (const Op& op : ops) {
    if (op.peer < 0 || op.peer >= ranks_ || (op.data == nullptr && op.bytes > 0)) {
      return Status::InvalidArgument("an NCCL operation names rank " + std::to_string(op.peer) +
                                     " of " + std::to_string(ranks_) + " or no memory");
    }
  }
  if (ops.empty()) return Status::OK();
  const kernels::ScopedDevice on(device_);
  if (!on.ok()) return Break(Status::Unavailable("cannot use CUDA device for NCCL"));
  auto* s = stream != nullptr ? static_cast<cudaStream_t>(stream) : comm_->stream;
  ncclResult_t r = Lib().GroupStart();
  if (r != ncclSuccess) return Break(NcclStatus(r, comm_->comm, "ncclGroupStart"));
  for (const Op& op : ops) {
    r = op.send ? Lib().Send(op.data, op.bytes, ncclUint8, op.peer, comm_->comm, s)
                : Lib().Recv(op.data, op.bytes, ncclUint8, op.peer, comm_->comm, s);
    if (r != ncclSuccess && r != ncclInProgress) {
      Lib().GroupEnd();
      return Break(NcclStatus(r, comm_->comm, op.send ? "ncclSend" : "ncclRecv"));
    }
  }
  r = Lib().GroupEnd();
  if (r != ncclSuccess && r != ncclInProgress) {
    return Break(NcclStatus(r, comm_->comm, "ncclGroupEnd"));
  }
  KVPOOL_RETURN_IF_ERROR(WaitIdle(deadline, "posting NCCL sends and receives"));
  // Posted on the stream: wait for it there, watching the communicator for a failed peer.
  cudaEvent_t done = nullptr;
  if (cudaEventCreateWithFlags(&done, cudaEventDisableTiming) != cudaSuccess ||
      cudaEventRecord(done, s) != cudaSuccess) {
    if (done != nullptr) cudaEventDestroy(done);
    return Break(Status::Internal(std::string("recording a CUDA event after NCCL: ") +
                                  cudaGetErrorString(cudaGetLastError())));
  }
  Status st;
  for (int polls = 0;; ++polls) {
    const cudaError_t q = cudaEventQuery(done);
    if (q == cudaSuccess) break;
    if (q != cudaErrorNotReady) {
      st = Break(Status::Internal(std::string("waiting for NCCL on its stream: ") +
                                  cudaGetErrorString(q)));
      break;
    }
    ncclResult_t state = ncclSuccess;
    const ncclResult_t asked = Lib().CommGetAsyncError(comm_->comm, &state);
    if (asked != ncclSuccess) state = asked;
    if (state != ncclSuccess && state != ncclInProgress) {
      st = Break(NcclStatus(state, comm_->comm, "NCCL transfer"));
      break;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      st = Break(Status::DeadlineExceeded(
          "NCCL transfer not finished by its deadline: a peer is gone or not receiving "
          "(aborted)"));
      break;
    }
    Pause(polls);
  }
  cudaEventDestroy(done);
  return st;
}

namespace {

class NcclLinks final : public DeviceLinks {
 public:
  Result<std::string> NewId() override { return NcclLink::NewId(); }
  Result<std::unique_ptr<DeviceLink>> Join(const std::string& id, int ranks, int rank, int device,
                                           Deadline deadline) override {
    KVPOOL_ASSIGN_OR_RETURN(std::unique_ptr<NcclLink> link,
                            NcclLink::Join(id, ranks, rank, device, deadline));
    return std::unique_ptr<DeviceLink>(std::move(link));
  }
};

}  // namespace

Result<std::unique_ptr<DeviceLinks>> NcclDeviceLinks() {
  KVPOOL_RETURN_IF_ERROR(LoadNccl().status());
  return std::unique_ptr<DeviceLinks>(std::make_unique<NcclLinks>());
}

}  // namespace kvpool::transport
