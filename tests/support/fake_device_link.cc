#include "tests/support/fake_device_link.h"

#include <set>
#include <utility>
#include <vector>

namespace kvpool::testing {

struct FakeLinkFabric::Op {
  int rank = 0;  // who posted it
  bool send = false;
  int peer = 0;
  void* data = nullptr;
  size_t bytes = 0;
  FakeDevice* device = nullptr;  // where `data` lives
  bool stalled = false;          // never met (StallNextTransfer)
  bool corrupt = false;          // lands with its first byte flipped (a send)
  bool met = false;
  bool failed = false;  // met an operation of another size
};

struct FakeLinkFabric::Comm {
  int ranks = 0;
  std::set<int> joined;
  std::vector<std::shared_ptr<Op>> pending;  // not yet met, in the order posted
};

class FakeLinkFabric::Link final : public transport::DeviceLink {
 public:
  Link(FakeLinkFabric& fabric, std::shared_ptr<Comm> comm, int rank, int device, FakeDevice& memory)
      : fabric_(fabric), comm_(std::move(comm)), rank_(rank), device_(device), memory_(memory) {}

  Status Transfer(std::span<const Op> ops, void* /*stream*/, Deadline deadline) override {
    std::unique_lock<std::mutex> lock(fabric_.mu_);
    if (broken_) return Status::FailedPrecondition("this link failed earlier: join a new one");
    for (const Op& op : ops) {
      if (op.peer < 0 || op.peer >= comm_->ranks) {
        return Status::InvalidArgument("no rank " + std::to_string(op.peer) + " on this link");
      }
    }
    std::vector<std::shared_ptr<FakeLinkFabric::Op>> mine;
    const bool stall = std::exchange(fabric_.stall_next_, false);
    // (Armed for the next group that sends: a receiving group leaves it armed.)
    bool corrupt = false;
    for (const Op& op : ops) {
      if (op.send && op.bytes > 0) corrupt = std::exchange(fabric_.corrupt_next_, false);
      if (corrupt) break;
    }
    for (const Op& op : ops) {
      auto o = std::make_shared<FakeLinkFabric::Op>();
      o->rank = rank_;
      o->send = op.send;
      o->peer = op.peer;
      o->data = op.data;
      o->bytes = op.bytes;
      o->device = &memory_;
      o->stalled = stall;
      if (op.send && corrupt && op.bytes > 0) o->corrupt = std::exchange(corrupt, false);
      mine.push_back(o);
      comm_->pending.push_back(std::move(o));
    }
    fabric_.MatchLocked(*comm_);
    fabric_.changed_.notify_all();
    auto done = [&] {
      for (const auto& o : mine) {
        if (!o->met && !o->failed) return false;
      }
      return true;
    };
    if (!fabric_.changed_.wait_until(lock, deadline, done)) {
      std::erase_if(comm_->pending,
                    [&](const std::shared_ptr<FakeLinkFabric::Op>& o) { return o->rank == rank_; });
      broken_ = true;
      ++fabric_.counters_.failures;
      return Status::DeadlineExceeded("fake link: the peer did not take part in time");
    }
    for (const auto& o : mine) {
      if (o->failed) {
        broken_ = true;
        ++fabric_.counters_.failures;
        return Status::Internal("fake link: a send and its receive differ in size");
      }
    }
    ++fabric_.counters_.transfers;
    return Status::OK();
  }
  bool broken() const override {
    std::lock_guard<std::mutex> lock(fabric_.mu_);
    return broken_;
  }
  int device() const override { return device_; }
  void Abort() override {
    std::lock_guard<std::mutex> lock(fabric_.mu_);
    broken_ = true;
  }

 private:
  FakeLinkFabric& fabric_;
  const std::shared_ptr<Comm> comm_;
  const int rank_;
  const int device_;
  FakeDevice& memory_;
  bool broken_ = false;  // guarded by fabric_.mu_
};

class FakeLinkFabric::Links final : public transport::DeviceLinks {
 public:
  Links(FakeLinkFabric& fabric, std::map<int, FakeDevice*> devices)
      : fabric_(fabric), devices_(std::move(devices)) {}

  Result<std::string> NewId() override {
    std::lock_guard<std::mutex> lock(fabric_.mu_);
    std::string id = "fake-link-" + std::to_string(fabric_.next_id_++);
    id.resize(128, '\0');
    return id;
  }

  Result<std::unique_ptr<transport::DeviceLink>> Join(const std::string& id, int ranks, int rank,
                                                      int device, Deadline deadline) override {
    if (ranks < 1 || rank < 0 || rank >= ranks) {
      return Status::InvalidArgument("rank " + std::to_string(rank) + " of " +
                                     std::to_string(ranks));
    }
    auto d = devices_.find(device);
    if (d == devices_.end()) {
      return Status::Unavailable("no CUDA device " + std::to_string(device) + " for the link");
    }
    std::unique_lock<std::mutex> lock(fabric_.mu_);
    if (!fabric_.changed_.wait_until(lock, deadline, [&] { return !fabric_.hold_joins_; })) {
      return Status::DeadlineExceeded("fake link: joins were held past the deadline");
    }
    std::shared_ptr<Comm>& comm = fabric_.comms_[id];
    if (comm == nullptr) {
      comm = std::make_shared<Comm>();
      comm->ranks = ranks;
    }
    if (comm->ranks != ranks || comm->joined.count(rank)) {
      return Status::InvalidArgument("rank " + std::to_string(rank) + " of " +
                                     std::to_string(ranks) + " cannot join this link");
    }
    comm->joined.insert(rank);
    ++fabric_.counters_.joins;
    fabric_.changed_.notify_all();
    std::shared_ptr<Comm> held = comm;
    if (!fabric_.changed_.wait_until(
            lock, deadline, [&] { return static_cast<int>(held->joined.size()) == held->ranks; })) {
      held->joined.erase(rank);
      return Status::DeadlineExceeded("fake link: the other ranks did not join in time");
    }
    return std::unique_ptr<transport::DeviceLink>(
        std::make_unique<Link>(fabric_, std::move(held), rank, device, *d->second));
  }

 private:
  FakeLinkFabric& fabric_;
  const std::map<int, FakeDevice*> devices_;
};

std::unique_ptr<transport::DeviceLinks> FakeLinkFabric::LinksOf(
    std::map<int, FakeDevice*> devices) {
  return std::make_unique<Links>(*this, std::move(devices));
}

void FakeLinkFabric::StallNextTransfer() {
  std::lock_guard<std::mutex> lock(mu_);
  stall_next_ = true;
}

void FakeLinkFabric::CorruptNextTransfer() {
  std::lock_guard<std::mutex> lock(mu_);
  corrupt_next_ = true;
}

void FakeLinkFabric::HoldJoins() {
  std::lock_guard<std::mutex> lock(mu_);
  hold_joins_ = true;
}

void FakeLinkFabric::ReleaseJoins() {
  std::lock_guard<std::mutex> lock(mu_);
  hold_joins_ = false;
  changed_.notify_all();
}

FakeLinkFabric::Counters FakeLinkFabric::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

void FakeLinkFabric::MatchLocked(Comm& comm) {
  for (const auto& s : comm.pending) {
    if (!s->send || s->met || s->failed || s->stalled) continue;
    for (const auto& r : comm.pending) {
      if (r->send || r->met || r->failed) continue;
      if (r->rank != s->peer || r->peer != s->rank) continue;
      // The first receive of this pair not yet met: it is this send's, unless it never meets.
      if (r->stalled) break;
      if (r->bytes != s->bytes) {
        s->failed = r->failed = true;
        break;
      }
      if (s->bytes > 0) {
        std::vector<uint8_t> bytes = s->device->Read(s->data, s->bytes);
        if (s->corrupt) bytes[0] ^= 0xff;
        r->device->Write(r->data, bytes.data(), bytes.size());
      }
      s->met = r->met = true;
      counters_.bytes += s->bytes;
      break;
    }
  }
  std::erase_if(comm.pending, [](const std::shared_ptr<Op>& o) { return o->met || o->failed; });
}

}  // namespace kvpool::testing
