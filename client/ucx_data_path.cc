#include "client/ucx_data_path.h"

#include <algorithm>
#include <chrono>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#include "common/checksum.h"
#include "transport/ucx_bind.h"

namespace kvpool::client {
namespace {

// Waits for a set of asynchronous UCX operations.
struct UcxBatch {
  explicit UcxBatch(size_t n) {
    absl::MutexLock lock(&mu);
    left = n;
    status.assign(n, Status::OK());
    received.assign(n, 0);
  }

  absl::Mutex mu;
  size_t left ABSL_GUARDED_BY(mu) = 0;
  std::vector<Status> status ABSL_GUARDED_BY(mu);
  std::vector<size_t> received ABSL_GUARDED_BY(mu);
};

// Waits until every operation of `batch` ended; past `deadline` cancels the rest (UCX lets go of
// their buffers before their callbacks run) and waits for those callbacks. True when the
// endpoint may no longer carry transfers: the deadline passed (a cancelled send closes its
// endpoint, a receive still under way has its sender's closed), or an operation found it failed.
bool WaitUcx(transport::UcxEngine& engine, UcxBatch& batch,
             const std::vector<transport::UcxOpId>& ops, transport::Deadline deadline) {
  absl::MutexLock lock(&batch.mu);
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(batch.mu) { return batch.left == 0; };
  bool lost = false;
  if (!batch.mu.AwaitWithDeadline(
          absl::Condition(&done),
          absl::FromChrono(std::chrono::system_clock::now() +
                           (deadline - std::chrono::steady_clock::now())))) {
    batch.mu.Unlock();
    for (transport::UcxOpId op : ops) {
      if (op != 0) engine.Cancel(op);
    }
    batch.mu.Lock();
    batch.mu.Await(absl::Condition(&done));
    lost = true;
  }
  for (const Status& st : batch.status) lost = lost || st.code() == StatusCode::kUnavailable;
  return lost;
}

}  // namespace

UcxDataPath::~UcxDataPath() { Disconnect(); }

Status UcxDataPath::Start(const std::string& transports, const std::string& net_devices) {
  if (engine_ != nullptr) return Status::OK();
  transport::UcxOptions uo;
  uo.transports = transports;
  uo.net_devices = net_devices;
  KVPOOL_ASSIGN_OR_RETURN(engine_, transport::UcxEngine::Create(uo));
  return Status::OK();
}

Result<std::string> UcxDataPath::ConnectTo(const std::string& host, uint16_t port,
                                           transport::Deadline deadline) {
  Disconnect();
  Result<transport::UcxEndpointId> ep = engine_->ConnectTo(host, port);
  Result<size_t> got = ep.status();
  std::string nonce(transport::kUcxBindNonceBytes, '\0');
  if (ep.ok()) {
    endpoint_ = *ep;
    // From this endpoint only: its failure (nobody listens, the daemon refused it) ends the wait.
    got = engine_->ReceiveStreamSync(endpoint_, nonce.data(), nonce.size(), deadline);
    if (got.ok() && *got != nonce.size()) got = Status::Corruption("short UCX bind nonce");
  }
  if (!got.ok()) {
    Disconnect();
    return got.status().WithContext("UCX endpoint to " + host + ":" + std::to_string(port));
  }
  return nonce;
}

void UcxDataPath::Bound(uint64_t tag_prefix) {
  bound_ = true;
  tag_prefix_ = tag_prefix;
}

void UcxDataPath::Disconnect() {
  bound_ = false;
  if (endpoint_ == 0) return;
  engine_->Disconnect(endpoint_);
  endpoint_ = 0;
}

std::vector<GetResult> UcxDataPath::ReceiveBlocks(std::span<const IncomingBlock> blocks,
                                                  transport::Deadline deadline) {
  UcxBatch batch(blocks.size());
  std::vector<std::unique_ptr<uint8_t[]>> scratch(blocks.size());
  std::vector<transport::UcxOpId> ops(blocks.size(), 0);
  for (size_t k = 0; k < blocks.size(); ++k) {
    const IncomingBlock& b = blocks[k];
    void* dst = b.target.data;
    if (dst == nullptr || b.target.capacity < b.size) {
      scratch[k].reset(new uint8_t[std::max<uint64_t>(1, b.size)]);
      dst = scratch[k].get();
    }
    ops[k] = engine_->ReceiveTagged(
        b.tag, dst, b.size,
        [&batch, k](Status st, size_t n) {
          absl::MutexLock lock(&batch.mu);
          batch.status[k] = st;
          batch.received[k] = n;
          --batch.left;
        },
        endpoint_);
  }
  if (WaitUcx(*engine_, batch, ops, deadline)) Disconnect();
  std::vector<GetResult> out(blocks.size());
  absl::MutexLock lock(&batch.mu);
  for (size_t k = 0; k < blocks.size(); ++k) {
    const IncomingBlock& b = blocks[k];
    GetResult& r = out[k];
    if (!batch.status[k].ok()) {
      r.status = batch.status[k].WithContext("UCX transfer of block " + b.key.ShortHex());
    } else if (scratch[k] != nullptr) {
      r.status = Status::InvalidArgument("buffer of " + std::to_string(b.target.capacity) +
                                         " bytes is too small for the " + std::to_string(b.size) +
                                         "-byte block");
      r.size = b.size;
    } else if (batch.received[k] != b.size || BlockChecksum(b.target.data, b.size) != b.checksum) {
      r.status =
          Status::Corruption("block " + b.key.ShortHex() + " failed its checksum in transfer");
    } else {
      r.status = Status::OK();
      r.size = b.size;
      r.tier = b.tier;
      r.checksum = b.checksum;
    }
  }
  return out;
}

std::vector<Status> UcxDataPath::SendBlocks(uint64_t tag_base,
                                            std::span<const OutgoingBlock> blocks,
                                            transport::Deadline deadline) {
  UcxBatch batch(blocks.size());
  std::vector<transport::UcxOpId> ops(blocks.size(), 0);
  for (size_t k = 0; k < blocks.size(); ++k) {
    ops[k] = engine_->SendTagged(endpoint_, tag_base + k, blocks[k].data, blocks[k].size,
                                 [&batch, k](Status st) {
                                   absl::MutexLock lock(&batch.mu);
                                   batch.status[k] = st;
                                   --batch.left;
                                 });
  }
  if (WaitUcx(*engine_, batch, ops, deadline)) Disconnect();
  absl::MutexLock lock(&batch.mu);
  return batch.status;
}

}  // namespace kvpool::client
