// SharedMemoryDelivery over a socket delivery and a real tier manager: in-place gets answer
// slots and hand their leases to the client, in-place reserves answer where to write, and what
// does not ask in place (or has no slot) falls to the frame.

#include "daemon/shm_delivery.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <vector>

#include "daemon/socket_delivery.h"
#include "daemon/tier_stack_for_test.h"

namespace kvpool::daemon {
namespace {

constexpr NamespaceId kNs = 1;
constexpr uint64_t kOwner = 7;
constexpr std::chrono::milliseconds kLeaseTimeout{1234};

std::unique_ptr<SharedMemoryDelivery> MakeDelivery(TierStackForTest& stack) {
  return std::make_unique<SharedMemoryDelivery>(
      stack.manager(), kOwner, kLeaseTimeout,
      std::make_unique<SocketDelivery>(stack.manager(), kOwner));
}

PathAsk InPlace() {
  PathAsk ask;
  ask.in_place = true;
  return ask;
}

TEST(SharedMemoryDeliveryTest, GrantsSharedMemoryButNotUcx) {
  TierStackForTest stack;
  auto d = MakeDelivery(stack);
  EXPECT_TRUE(d->Check(InPlace()).ok());
  EXPECT_TRUE(d->Check(PathAsk{}).ok());
  PathAsk both = InPlace();
  both.via_ucx = true;
  const Status st = d->Check(both);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(st.message(), "the UCX data path was not granted at hello");
}

TEST(SharedMemoryDeliveryTest, InPlaceGetAnswersTheSlotAndHandsTheLeaseToTheClient) {
  TierStackForTest stack;
  auto d = MakeDelivery(stack);
  const std::vector<uint8_t> bytes = TierStackForTest::BytesOf(1, 6000);
  stack.Put(kNs, 1, bytes);

  const LeaseTerms terms = d->TermsFor(InPlace());
  EXPECT_EQ(terms.owner, kOwner);
  EXPECT_EQ(terms.ttl, kLeaseTimeout);
  const BlockKey key = TierStackForTest::KeyOf(1);
  std::vector<tiers::BlockRead> reads =
      stack.manager().Acquire(kNs, {&key, 1}, terms.owner, terms.ttl);
  ASSERT_TRUE(reads[0].status.ok());
  const uint64_t lease = reads[0].lease_id;
  const tiers::SegmentLocation loc = stack.manager().Locate(reads[0].arena_offset);

  wire::BlockInfo info;
  transport::Response r;
  EXPECT_EQ(d->Send(InPlace(), 0, reads[0], &info, &r), 0u);
  EXPECT_TRUE(r.payload.empty());
  EXPECT_EQ(info.lease_id(), lease);
  EXPECT_EQ(info.slot().segment(), loc.segment);
  EXPECT_EQ(info.slot().generation(), loc.generation);
  EXPECT_EQ(info.slot().offset(), loc.offset);
  EXPECT_EQ(reads[0].lease_id, 0u);   // the client's now
  stack.manager().Release(reads[0]);  // what the handler does after the frame: a no-op here
  EXPECT_EQ(stack.manager().GetStats().leases_active, 1u);
  const uint64_t ids[] = {lease};
  stack.manager().ReleaseLeases(kOwner, ids);  // the client's RELEASE
  EXPECT_EQ(stack.manager().GetStats().leases_active, 0u);
}

TEST(SharedMemoryDeliveryTest, WhatDoesNotAskInPlaceOrHasNoSlotTravelsInTheFrame) {
  TierStackForTest stack;
  auto d = MakeDelivery(stack);
  const std::vector<uint8_t> bytes = TierStackForTest::BytesOf(2, 2048);
  stack.Put(kNs, 2, bytes);
  EXPECT_EQ(d->TermsFor(PathAsk{}).ttl.count(), 0);
  EXPECT_TRUE(d->BoundedByFrame(InPlace()));

  const BlockKey key = TierStackForTest::KeyOf(2);
  std::vector<tiers::BlockRead> reads = stack.manager().Acquire(kNs, {&key, 1}, kOwner);
  ASSERT_TRUE(reads[0].status.ok());
  wire::BlockInfo info;
  transport::Response r;
  EXPECT_EQ(d->Send(PathAsk{}, 0, reads[0], &info, &r), bytes.size());
  ASSERT_EQ(r.payload.size(), 1u);
  EXPECT_FALSE(info.has_slot());
  EXPECT_NE(reads[0].lease_id, 0u);
  stack.manager().Release(reads[0]);

  // A block read straight from disk (no lease, owned bytes) has no slot to name.
  tiers::BlockRead from_disk;
  from_disk.owned = std::make_unique<uint8_t[]>(bytes.size());
  from_disk.data = from_disk.owned.get();
  from_disk.size = bytes.size();
  wire::BlockInfo disk_info;
  transport::Response disk_r;
  EXPECT_EQ(d->Send(InPlace(), 0, from_disk, &disk_info, &disk_r), bytes.size());
  ASSERT_EQ(disk_r.payload.size(), 1u);
  EXPECT_EQ(disk_r.payload[0].first, from_disk.data);
  EXPECT_FALSE(disk_info.has_slot());
}

TEST(SharedMemoryDeliveryTest, InPlaceReserveAnswersWhereToWrite) {
  TierStackForTest stack;
  auto d = MakeDelivery(stack);
  const std::vector<uint8_t> bytes = TierStackForTest::BytesOf(3, 9000);
  const tiers::ReserveOutcome o = stack.Reserve(kNs, kOwner, 3, bytes);
  ASSERT_EQ(o.state, tiers::ReserveState::kReserved);
  const tiers::SegmentLocation loc = stack.manager().Locate(o.arena_offset);

  wire::Reservation in_place;
  d->DescribeSlot(InPlace(), o.arena_offset, &in_place);
  ASSERT_TRUE(in_place.has_slot());
  EXPECT_EQ(in_place.slot().segment(), loc.segment);
  EXPECT_EQ(in_place.slot().generation(), loc.generation);
  EXPECT_EQ(in_place.slot().offset(), loc.offset);
  EXPECT_TRUE(stack.manager().OwnerHasReservationIn(kOwner, loc.segment));

  wire::Reservation framed;
  d->DescribeSlot(PathAsk{}, o.arena_offset, &framed);
  EXPECT_FALSE(framed.has_slot());
  // In place the bytes are already in the slot: nothing to receive, nothing fails.
  PendingCommit commit;
  commit.ids = {o.reservation_id};
  commit.status = {Status::OK()};
  EXPECT_TRUE(d->CheckReceive(InPlace(), 1).ok());
  const uint64_t sizes[] = {bytes.size()};
  d->Receive(InPlace(), commit, sizes);
  EXPECT_TRUE(commit.status[0].ok());
}

}  // namespace
}  // namespace kvpool::daemon
