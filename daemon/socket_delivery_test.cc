// SocketDelivery against a real tier manager: what it refuses, where a commit frame's bytes go,
// and how a leased block is put in the response frame.

#include "daemon/socket_delivery.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "daemon/tier_stack_for_test.h"

namespace kvpool::daemon {
namespace {

constexpr NamespaceId kNs = 1;
constexpr uint64_t kOwner = 7;

TEST(SocketDeliveryTest, RefusesPathsThatWereNotGranted) {
  TierStackForTest stack;
  SocketDelivery d(stack.manager(), kOwner);
  EXPECT_TRUE(d.Check(PathAsk{}).ok());
  PathAsk shm;
  shm.in_place = true;
  Status st = d.Check(shm);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(st.message(), "the shared-memory path was not granted at hello");
  PathAsk ucx;
  ucx.via_ucx = true;
  st = d.Check(ucx);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(st.message(), "the UCX data path was not granted at hello");
  // Shared memory is named first when both are asked for.
  ucx.in_place = true;
  EXPECT_EQ(d.Check(ucx).message(), "the shared-memory path was not granted at hello");
}

TEST(SocketDeliveryTest, CommitFrameBytesGoStraightIntoTheReservation) {
  TierStackForTest stack;
  SocketDelivery d(stack.manager(), kOwner);
  const std::vector<uint8_t> bytes = TierStackForTest::BytesOf(1, 5000);
  const tiers::ReserveOutcome o = stack.Reserve(kNs, kOwner, 1, bytes);
  ASSERT_EQ(o.state, tiers::ReserveState::kReserved);

  Status why;
  const transport::PayloadSink sink = d.InFrameSink(o.reservation_id, bytes.size(), &why);
  ASSERT_TRUE(why.ok()) << why.ToString();
  ASSERT_NE(sink.data, nullptr);
  EXPECT_EQ(sink.size, bytes.size());
  std::memcpy(sink.data, bytes.data(), bytes.size());  // what the server's read does
  ASSERT_TRUE(stack.manager().Commit(kOwner, o.reservation_id).ok());

  const BlockKey key = TierStackForTest::KeyOf(1);
  std::vector<tiers::BlockRead> reads = stack.manager().Acquire(kNs, {&key, 1});
  ASSERT_TRUE(reads[0].status.ok());
  EXPECT_EQ(std::memcmp(reads[0].data, bytes.data(), bytes.size()), 0);
  stack.manager().Release(reads[0]);
}

TEST(SocketDeliveryTest, BytesAReservationCannotTakeAreDiscarded) {
  TierStackForTest stack;
  SocketDelivery d(stack.manager(), kOwner);
  const std::vector<uint8_t> bytes = TierStackForTest::BytesOf(2, 4096);
  const tiers::ReserveOutcome o = stack.Reserve(kNs, kOwner, 2, bytes);
  ASSERT_EQ(o.state, tiers::ReserveState::kReserved);

  Status why;
  transport::PayloadSink sink = d.InFrameSink(o.reservation_id, bytes.size() + 1, &why);
  EXPECT_EQ(sink.data, nullptr);
  EXPECT_EQ(sink.size, bytes.size() + 1);  // still read off the stream
  EXPECT_EQ(why.code(), StatusCode::kInvalidArgument);

  // Another connection's reservation is not found from this one.
  SocketDelivery other(stack.manager(), kOwner + 1);
  why = Status::OK();
  sink = other.InFrameSink(o.reservation_id, bytes.size(), &why);
  EXPECT_EQ(sink.data, nullptr);
  EXPECT_EQ(why.code(), StatusCode::kNotFound);
}

TEST(SocketDeliveryTest, ServedBlockTravelsInTheFrameAndKeepsItsLeaseUntilWritten) {
  TierStackForTest stack;
  SocketDelivery d(stack.manager(), kOwner);
  const std::vector<uint8_t> bytes = TierStackForTest::BytesOf(3, 3000);
  stack.Put(kNs, 3, bytes);
  EXPECT_TRUE(d.BoundedByFrame(PathAsk{}));
  const LeaseTerms terms = d.TermsFor(PathAsk{});
  EXPECT_EQ(terms.owner, kOwner);
  EXPECT_EQ(terms.ttl.count(), 0);

  d.BeginGet();
  const BlockKey key = TierStackForTest::KeyOf(3);
  std::vector<tiers::BlockRead> reads =
      stack.manager().Acquire(kNs, {&key, 1}, terms.owner, terms.ttl);
  ASSERT_TRUE(reads[0].status.ok());
  const uint64_t lease = reads[0].lease_id;
  ASSERT_NE(lease, 0u);
  wire::BlockInfo info;
  transport::Response r;
  EXPECT_EQ(d.Send(PathAsk{}, 0, reads[0], &info, &r), bytes.size());
  ASSERT_EQ(r.payload.size(), 1u);
  EXPECT_EQ(r.payload[0].second, bytes.size());
  EXPECT_EQ(std::memcmp(r.payload[0].first, bytes.data(), bytes.size()), 0);
  EXPECT_EQ(reads[0].lease_id, lease);  // the handler ends it once the frame is out
  EXPECT_FALSE(info.has_slot());
  EXPECT_EQ(stack.manager().GetStats().leases_active, 1u);
  stack.manager().Release(reads[0]);
  EXPECT_EQ(stack.manager().GetStats().leases_active, 0u);
}

}  // namespace
}  // namespace kvpool::daemon
