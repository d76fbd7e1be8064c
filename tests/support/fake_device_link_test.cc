// FakeLinkFabric, the double the daemon's device-link tests stand on: two ranks of one id move
// bytes between two FakeDevices in the order posted; a stalled group fails both sides at their
// deadlines and breaks both links; sizes that differ fail both; a rank that nobody joins times
// out.

#include "tests/support/fake_device_link.h"

#include <gtest/gtest.h>

#include <thread>

#include "tests/support/status_matchers.h"

namespace kvpool::testing {
namespace {

using std::chrono::steady_clock;
using transport::DeviceLink;

std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

struct TwoSides {
  FakeLinkFabric fabric;
  FakeDevice a{0}, b{0};
  std::unique_ptr<transport::DeviceLinks> links_a = fabric.LinksOf({{0, &a}});
  std::unique_ptr<transport::DeviceLinks> links_b = fabric.LinksOf({{0, &b}});
  std::unique_ptr<DeviceLink> link_a, link_b;

  void Join() {
    const std::string id = *links_a->NewId();
    const auto deadline = steady_clock::now() + std::chrono::seconds(5);
    std::thread t([&] { link_b = links_b->Join(id, 2, 1, 0, deadline).value(); });
    link_a = links_a->Join(id, 2, 0, 0, deadline).value();
    t.join();
  }
};

TEST(FakeLinkFabricTest, TwoRanksMoveBlocksInTheOrderPosted) {
  TwoSides s;
  s.Join();
  ASSERT_NE(s.link_a, nullptr);
  ASSERT_NE(s.link_b, nullptr);
  const auto one = Bytes(5000, 1), two = Bytes(70000, 2);
  void* src1 = s.b.Alloc(one.size());
  void* src2 = s.b.Alloc(two.size());
  s.b.Write(src1, one.data(), one.size());
  s.b.Write(src2, two.data(), two.size());
  void* dst1 = s.a.Alloc(one.size());
  void* dst2 = s.a.Alloc(two.size());
  const auto deadline = steady_clock::now() + std::chrono::seconds(5);
  Status sent;
  std::thread t([&] {
    const DeviceLink::Op ops[] = {{true, 0, src1, one.size()}, {true, 0, src2, two.size()}};
    sent = s.link_b->Transfer(ops, nullptr, deadline);
  });
  const DeviceLink::Op ops[] = {{false, 1, dst1, one.size()}, {false, 1, dst2, two.size()}};
  ASSERT_OK(s.link_a->Transfer(ops, nullptr, deadline));
  t.join();
  ASSERT_OK(sent);
  EXPECT_EQ(s.a.Read(dst1, one.size()), one);
  EXPECT_EQ(s.a.Read(dst2, two.size()), two);
  EXPECT_EQ(s.fabric.counters().bytes, one.size() + two.size());

  // A corrupted transfer: its first send lands with its first byte flipped, and succeeds.
  s.fabric.CorruptNextTransfer();
  std::thread again([&] {
    const DeviceLink::Op ops[] = {{true, 0, src1, one.size()}, {true, 0, src2, two.size()}};
    sent = s.link_b->Transfer(ops, nullptr, deadline);
  });
  ASSERT_OK(s.link_a->Transfer(ops, nullptr, deadline));
  again.join();
  ASSERT_OK(sent);
  std::vector<uint8_t> damaged = one;
  damaged[0] ^= 0xff;
  EXPECT_EQ(s.a.Read(dst1, one.size()), damaged);
  EXPECT_EQ(s.a.Read(dst2, two.size()), two);
}

TEST(FakeLinkFabricTest, AStalledTransferFailsBothSidesByTheirDeadlinesAndBreaksTheLinks) {
  TwoSides s;
  s.Join();
  void* src = s.b.Alloc(4096);
  void* dst = s.a.Alloc(4096);
  s.fabric.StallNextTransfer();
  const auto deadline = steady_clock::now() + std::chrono::milliseconds(200);
  Status sent;
  std::thread t([&] {
    const DeviceLink::Op op{true, 0, src, 4096};
    sent = s.link_b->Transfer({&op, 1}, nullptr, deadline);
  });
  const DeviceLink::Op op{false, 1, dst, 4096};
  EXPECT_EQ(s.link_a->Transfer({&op, 1}, nullptr, deadline).code(), StatusCode::kDeadlineExceeded);
  t.join();
  EXPECT_EQ(sent.code(), StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(s.link_a->broken());
  EXPECT_TRUE(s.link_b->broken());
  EXPECT_EQ(s.link_a->Transfer({&op, 1}, nullptr, deadline).code(),
            StatusCode::kFailedPrecondition);
}

TEST(FakeLinkFabricTest, SizesThatDifferFailBothSides) {
  TwoSides s;
  s.Join();
  void* src = s.b.Alloc(4096);
  void* dst = s.a.Alloc(8192);
  const auto deadline = steady_clock::now() + std::chrono::seconds(5);
  Status sent;
  std::thread t([&] {
    const DeviceLink::Op op{true, 0, src, 4096};
    sent = s.link_b->Transfer({&op, 1}, nullptr, deadline);
  });
  const DeviceLink::Op op{false, 1, dst, 8192};
  EXPECT_FALSE(s.link_a->Transfer({&op, 1}, nullptr, deadline).ok());
  t.join();
  EXPECT_FALSE(sent.ok());
}

TEST(FakeLinkFabricTest, ARankNobodyJoinsTimesOutAndABadRankIsRefused) {
  FakeLinkFabric fabric;
  FakeDevice a{0};
  auto links = fabric.LinksOf({{0, &a}});
  const std::string id = *links->NewId();
  EXPECT_EQ(links->Join(id, 2, 0, 0, steady_clock::now() + std::chrono::milliseconds(100))
                .status()
                .code(),
            StatusCode::kDeadlineExceeded);
  EXPECT_EQ(links->Join(id, 2, 2, 0, steady_clock::now()).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(links->Join(id, 2, 0, 1, steady_clock::now()).status().code(),
            StatusCode::kUnavailable);
}

}  // namespace
}  // namespace kvpool::testing
