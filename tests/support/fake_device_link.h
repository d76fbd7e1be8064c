#pragma once
// FakeLinkFabric: a test double of NCCL between daemons, for tests without a GPU: the
// transport::DeviceLinks of each daemon in the test's process (LinksOf), whose links move bytes
// between the FakeDevices (tests/support/fake_device.h) of the two sides. Never a shipped path:
// kvpoold's links are NCCL's (transport/nccl_link.h).
//
// As NCCL: a link is joined by every rank of its id (Join waits for the others until its
// deadline); a transfer group waits until each of its sends has met the next receive the peer
// posted from this rank (and each receive the next send), in the order posted, or until its
// deadline, which breaks the link. A send and a receive of different sizes fail both sides.
// Faults for the next group posted: StallNextTransfer (its operations are never met, as with a
// peer that died: both sides fail at their deadlines) and CorruptNextTransfer (the first send of
// the next group that sends lands with its first byte flipped, and the transfer succeeds).
//
// Thread safety: every method may be called from any thread; each link by one thread at a time.

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "tests/support/fake_device.h"
#include "transport/device_link.h"

namespace kvpool::testing {

class FakeLinkFabric {
 public:
  FakeLinkFabric() = default;
  FakeLinkFabric(const FakeLinkFabric&) = delete;
  FakeLinkFabric& operator=(const FakeLinkFabric&) = delete;

  // The links of one process (a daemon), whose CUDA device N is `devices[N]` (not owned; they and
  // this fabric must outlive the links).
  std::unique_ptr<transport::DeviceLinks> LinksOf(std::map<int, FakeDevice*> devices);

  void StallNextTransfer();
  void CorruptNextTransfer();
  // Joins wait (at most until their deadlines) until ReleaseJoins: a communicator slow to form.
  void HoldJoins();
  void ReleaseJoins();

  struct Counters {
    uint64_t joins = 0;      // ranks joined
    uint64_t transfers = 0;  // groups that succeeded
    uint64_t bytes = 0;      // bytes delivered by sends
    uint64_t failures = 0;   // groups that failed (deadline, size mismatch, broken link)
  };
  Counters counters() const;

 private:
  class Links;
  class Link;
  struct Op;
  struct Comm;
  // Meets every pending send of `comm` with its receive, copying the bytes.
  void MatchLocked(Comm& comm);

  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, std::shared_ptr<Comm>> comms_;  // by id
  uint64_t next_id_ = 0;
  bool stall_next_ = false;
  bool corrupt_next_ = false;
  bool hold_joins_ = false;
  Counters counters_;
};

}  // namespace kvpool::testing
