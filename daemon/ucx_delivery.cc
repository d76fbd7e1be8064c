#include "daemon/ucx_delivery.h"

#include <glog/logging.h>

#include <vector>

#include "absl/synchronization/mutex.h"

namespace kvpool::daemon {

namespace {

// Owner of the leases UCX sends hold: never a connection's, so no disconnect releases them.
constexpr uint64_t kUcxSendOwner = UINT64_MAX - 2;
// The client's part of a tag; the upper 24 bits are the connection's.
constexpr int kClientTagBits = 40;

}  // namespace

std::unique_ptr<UcxDelivery> UcxDelivery::Adopt(transport::UcxEngine& engine,
                                                transport::UcxEndpointId ep, TagPrefix tag_prefix,
                                                tiers::TierManager& tiers, uint64_t owner,
                                                std::chrono::milliseconds timeout,
                                                uint64_t max_unreceived_bytes,
                                                std::unique_ptr<BlockDelivery> below) {
  return std::unique_ptr<UcxDelivery>(new UcxDelivery(engine, ep, std::move(tag_prefix), tiers,
                                                      owner, timeout, max_unreceived_bytes,
                                                      std::move(below)));
}

UcxDelivery::UcxDelivery(transport::UcxEngine& engine, transport::UcxEndpointId ep,
                         TagPrefix tag_prefix, tiers::TierManager& tiers, uint64_t owner,
                         std::chrono::milliseconds timeout, uint64_t max_unreceived_bytes,
                         std::unique_ptr<BlockDelivery> below)
    : LayeredDelivery(std::move(below)),
      engine_(engine),
      ep_(ep),
      tag_prefix_(std::move(tag_prefix)),
      tiers_(tiers),
      owner_(owner),
      timeout_(timeout),
      max_unreceived_bytes_(max_unreceived_bytes) {}

UcxDelivery::~UcxDelivery() {
  // A closed connection's sends are not waited for: cancelling them ends their leases.
  for (const auto& [op, deadline] : sends_) engine_.Cancel(op);
  engine_.Disconnect(ep_);
}

Status UcxDelivery::Check(const PathAsk& ask) const {
  const uint64_t unreceived = unreceived_->load(std::memory_order_relaxed);
  if (ask.via_ucx && unreceived > max_unreceived_bytes_) {
    return Status::ResourceExhausted(std::to_string(unreceived) +
                                     " bytes of earlier answers wait for this client to receive "
                                     "them over UCX (at most " +
                                     std::to_string(max_unreceived_bytes_) +
                                     "): receive them first");
  }
  PathAsk rest = ask;
  rest.via_ucx = false;  // granted
  return below().Check(rest);
}

void UcxDelivery::BeginGet() {
  // Sends of earlier answers this client never received in time: cancel (finished ones are
  // ignored by the engine), so their leases end.
  while (!sends_.empty() && sends_.front().second < std::chrono::steady_clock::now()) {
    engine_.Cancel(sends_.front().first);
    sends_.pop_front();
  }
  below().BeginGet();
}

LeaseTerms UcxDelivery::TermsFor(const PathAsk& ask) const {
  LeaseTerms terms = below().TermsFor(ask);
  // A UCX send's lease belongs to the send alone (no owner a disconnect releases): UCX reads
  // the slot until the send completes, so only its completion may end the lease.
  if (ask.via_ucx) terms.owner = kUcxSendOwner;
  return terms;
}

bool UcxDelivery::BoundedByFrame(const PathAsk& ask) const {
  return !ask.via_ucx && below().BoundedByFrame(ask);
}

uint64_t UcxDelivery::Send(const PathAsk& ask, uint32_t position, tiers::BlockRead& read,
                           wire::BlockInfo* info, transport::Response* response) {
  if (!ask.via_ucx) return below().Send(ask, position, read, info, response);
  // The bytes go as a tagged message; the lease (or the owned disk copy) lives until the send
  // completes or fails. The client verifies the checksum from the response.
  tiers::TierManager* tiers = &tiers_;
  auto held = std::make_shared<tiers::BlockRead>(std::move(read));
  read.lease_id = 0;  // the send's now: it ends the lease
  read.data = nullptr;
  // Bounded in time even if this connection never sends another request: a receiver that does
  // not take the block gets its send cancelled at the deadline, which ends the lease (or frees
  // the disk copy).
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  std::shared_ptr<std::atomic<uint64_t>> unreceived = unreceived_;
  unreceived->fetch_add(held->size, std::memory_order_relaxed);
  const transport::UcxOpId op = engine_.SendTagged(
      ep_, ask.ucx_tag_base + position, held->data, held->size,
      [tiers, held, unreceived](Status st) {
        if (!st.ok()) VLOG(1) << "UCX send of a block: " << st.ToString();
        unreceived->fetch_sub(held->size, std::memory_order_relaxed);
        tiers->Release(*held);
      },
      deadline);
  sends_.emplace_back(op, deadline);
  return held->size;
}

Status UcxDelivery::CheckReceive(const PathAsk& ask, size_t blocks) const {
  if (!ask.via_ucx) return below().CheckReceive(ask, blocks);
  // Every tag base + k must stay inside this connection's 40-bit tag space.
  constexpr uint64_t kClientMask = (1ull << kClientTagBits) - 1;
  if ((ask.ucx_tag_base >> kClientTagBits) != (tag_prefix_.value() >> kClientTagBits) ||
      (ask.ucx_tag_base & kClientMask) + blocks > (1ull << kClientTagBits)) {
    return Status::InvalidArgument("UCX tags outside this connection's prefix");
  }
  return Status::OK();
}

void UcxDelivery::Receive(const PathAsk& ask, PendingCommit& commit,
                          std::span<const uint64_t> sizes) {
  if (!ask.via_ucx) return below().Receive(ask, commit, sizes);
  struct Pending {
    absl::Mutex mu;
    size_t left ABSL_GUARDED_BY(mu) = 0;
    std::vector<Status> status ABSL_GUARDED_BY(mu);
  };
  const size_t n = commit.ids.size();
  auto pending = std::make_shared<Pending>();
  std::vector<transport::UcxOpId> ops(n, 0);
  {
    absl::MutexLock lock(&pending->mu);
    pending->status.assign(n, Status::OK());
  }
  // A one-byte sink for the messages of positions that get no slot: receiving them (truncated)
  // keeps them from piling up in the worker's unexpected queue.
  auto drain = std::make_shared<uint8_t>(0);
  for (size_t k = 0; k < n; ++k) {
    Result<tiers::ReservationTarget> t = Status::NotFound("no slot");
    if (commit.status[k].ok()) {
      t = tiers_.TargetOf(owner_, commit.ids[k]);
      if (!t.ok()) commit.status[k] = t.status();
    }
    {
      absl::MutexLock lock(&pending->mu);
      ++pending->left;
    }
    const uint64_t expect = sizes[k];
    uint8_t* into = t.ok() ? t->data : drain.get();
    const uint64_t capacity = t.ok() ? t->size : 1;
    // From this client's endpoint: a receive still under way after its cancel has that
    // endpoint closed, so a stopped client cannot hold the slot.
    ops[k] = engine_.ReceiveTagged(
        ask.ucx_tag_base + k, into, capacity,
        [pending, k, expect, drain](Status st, size_t received) {
          absl::MutexLock lock(&pending->mu);
          if (st.ok() && received != expect) st = Status::Corruption("short UCX transfer");
          pending->status[k] = st;
          --pending->left;
        },
        ep_);
  }
  absl::MutexLock lock(&pending->mu);
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(pending->mu) { return pending->left == 0; };
  const absl::Time deadline = absl::Now() + absl::FromChrono(timeout_);
  if (!pending->mu.AwaitWithDeadline(absl::Condition(&done), deadline)) {
    // Cancel what is still open and wait for UCX to let go of the slots before they are freed.
    pending->mu.Unlock();
    for (transport::UcxOpId op : ops) {
      if (op != 0) engine_.Cancel(op);
    }
    pending->mu.Lock();
    pending->mu.Await(absl::Condition(&done));
  }
  for (size_t k = 0; k < n; ++k) {
    if (commit.status[k].ok() && !pending->status[k].ok()) {
      commit.status[k] = pending->status[k].WithContext("UCX transfer");
    }
  }
}

}  // namespace kvpool::daemon
