#include "client/ucx_data_path.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/checksum.h"
#include "transport/ucx_bind.h"

namespace kvpool::client {
namespace {

using std::chrono::steady_clock;
using namespace std::chrono_literals;

// UCX over loopback TCP only (never another address).
constexpr char kTransports[] = "tcp";
constexpr char kDevices[] = "lo";

BlockKey Key(uint8_t b) {
  BlockKey k;
  k.bytes.fill(b);
  return k;
}

std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

TEST(UcxDataPathTest, TagBasesCountOneSequenceBelowTheDaemonsPrefix) {
  UcxDataPath path;
  EXPECT_FALSE(path.started());
  EXPECT_FALSE(path.connected());
  EXPECT_EQ(path.NextGetTagBase(), 1ull << 16);
  EXPECT_EQ(path.NextPutTagBase(), 2ull << 16);  // no prefix before a connection
  EXPECT_EQ(path.NextGetTagBase(), 3ull << 16);
}

class UcxDataPathPeerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Status st = path_.Start(kTransports, kDevices);
    if (st.code() == StatusCode::kUnavailable) GTEST_SKIP() << "no UCX here: " << st.ToString();
    ASSERT_TRUE(st.ok()) << st.ToString();
    transport::UcxOptions uo;
    uo.transports = kTransports;
    uo.net_devices = kDevices;
    uo.thread_index = 1;
    auto peer = transport::UcxEngine::Create(uo);
    ASSERT_TRUE(peer.ok()) << peer.status().ToString();
    peer_ = std::move(*peer);
    // The peer listens as kvpoold does (daemon/ucx_listener.h): each endpoint made to it gets
    // the bind nonce.
    auto port = peer_->Listen(
        "127.0.0.1", 0, [](const std::string&, const auto&) { return true; },
        [this](transport::UcxEndpointId ep, const std::string&) {
          accepted_ = ep;
          peer_->SendStream(ep, kNonce, sizeof(kNonce) - 1, [](Status) {});
        });
    ASSERT_TRUE(port.ok()) << port.status().ToString();
    port_ = *port;
  }

  // Makes the path's endpoint to the peer; returns the peer's end of it.
  transport::UcxEndpointId ConnectPath(uint64_t prefix) {
    Result<std::string> nonce = path_.ConnectTo("127.0.0.1", port_, steady_clock::now() + 10s);
    EXPECT_TRUE(nonce.ok()) << nonce.status().ToString();
    if (nonce.ok()) {
      EXPECT_EQ(*nonce, std::string(kNonce));
    }
    EXPECT_FALSE(path_.connected());  // not before UCX_BIND's answer
    path_.Bound(prefix);
    EXPECT_TRUE(path_.connected());
    return accepted_;
  }

  static constexpr char kNonce[] = "0123456789abcdef";  // 16 bytes, as kvpoold's
  UcxDataPath path_;
  std::unique_ptr<transport::UcxEngine> peer_;
  uint16_t port_ = 0;
  std::atomic<transport::UcxEndpointId> accepted_{0};
};

TEST_F(UcxDataPathPeerTest, StartIsOnce) {
  EXPECT_TRUE(path_.started());
  ASSERT_TRUE(path_.Start(kTransports, kDevices).ok());
  EXPECT_TRUE(path_.started());
}

// An engine listening on loopback that admits (or refuses) every request and sends no nonce;
// its port in `port`.
std::unique_ptr<transport::UcxEngine> ListenerWithoutNonces(bool admit, uint16_t* port) {
  transport::UcxOptions uo;
  uo.transports = kTransports;
  uo.net_devices = kDevices;
  uo.thread_index = 2;
  auto engine = transport::UcxEngine::Create(uo);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  if (!engine.ok()) return nullptr;
  auto p = (*engine)->Listen(
      "127.0.0.1", 0, [admit](const std::string&, const auto&) { return admit; },
      [](transport::UcxEndpointId, const std::string&) {});
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  *port = p.ok() ? *p : 0;
  return std::move(*engine);
}

TEST_F(UcxDataPathPeerTest, NoNonceInTimeLeavesNoEndpoint) {
  // An engine that accepts but never sends a nonce (a listener that is not kvpoold's).
  uint16_t port = 0;
  auto silent = ListenerWithoutNonces(/*admit=*/true, &port);
  ASSERT_NE(silent, nullptr);
  Result<std::string> nonce = path_.ConnectTo("127.0.0.1", port, steady_clock::now() + 300ms);
  EXPECT_EQ(nonce.status().code(), StatusCode::kDeadlineExceeded) << nonce.status().ToString();
  EXPECT_FALSE(path_.connected());
  EXPECT_TRUE(path_.started());  // the engine stays: a nonce comes only on its own endpoint
  // The next endpoint, to a listener that sends one, gets its own nonce.
  EXPECT_NE(ConnectPath(0), 0u);
}

TEST_F(UcxDataPathPeerTest, ARefusedEndpointEndsTheWaitForTheNonceAtOnce) {
  uint16_t port = 0;
  auto refusing = ListenerWithoutNonces(/*admit=*/false, &port);
  ASSERT_NE(refusing, nullptr);
  // A minute's deadline: the refusal, not the deadline, must end the wait (a hang check).
  const auto start = steady_clock::now();
  Result<std::string> nonce = path_.ConnectTo("127.0.0.1", port, steady_clock::now() + 60s);
  EXPECT_EQ(nonce.status().code(), StatusCode::kUnavailable) << nonce.status().ToString();
  EXPECT_LT(steady_clock::now() - start, 30s);
  EXPECT_FALSE(path_.connected());
}

// The daemon's end of an idle endpoint goes away (its UCX side restarted, the network cut): the
// path says so before any transfer names the endpoint, so a client replaces it first rather
// than failing that transfer's blocks.
TEST_F(UcxDataPathPeerTest, AnEndpointThatFailsWhileIdleIsNoLongerConnected) {
  const transport::UcxEndpointId theirs = ConnectPath(0);
  ASSERT_NE(theirs, 0u);
  peer_->Disconnect(theirs);
  const auto until = steady_clock::now() + 20s;
  while (path_.connected() && steady_clock::now() < until) std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(path_.connected()) << "the endpoint's failure never showed";
  // A new endpoint to the same listener is connected again.
  EXPECT_NE(ConnectPath(0), 0u);
}

TEST_F(UcxDataPathPeerTest, SendsEachBlockUnderItsTag) {
  const uint64_t prefix = 0xABCull << 40;
  ConnectPath(prefix);
  const uint64_t tag_base = path_.NextPutTagBase();
  EXPECT_EQ(tag_base, prefix | (1ull << 16));
  const std::vector<uint8_t> a = Bytes(4096, 1), b = Bytes(300 << 10, 2);
  const UcxDataPath::OutgoingBlock blocks[] = {{a.data(), a.size()}, {b.data(), b.size()}};
  // The peer receives what arrives, as the daemon does.
  std::vector<uint8_t> got_a(a.size()), got_b(b.size());
  std::atomic<int> done{0};
  Status st_a, st_b;
  peer_->ReceiveTagged(tag_base + 0, got_a.data(), got_a.size(), [&](Status st, size_t) {
    st_a = st;
    ++done;
  });
  peer_->ReceiveTagged(tag_base + 1, got_b.data(), got_b.size(), [&](Status st, size_t) {
    st_b = st;
    ++done;
  });
  std::vector<Status> sent = path_.SendBlocks(tag_base, blocks, steady_clock::now() + 10s);
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_TRUE(sent[0].ok()) << sent[0].ToString();
  EXPECT_TRUE(sent[1].ok()) << sent[1].ToString();
  const auto until = steady_clock::now() + 10s;
  while (done < 2 && steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(done, 2);
  EXPECT_TRUE(st_a.ok());
  EXPECT_TRUE(st_b.ok());
  EXPECT_EQ(got_a, a);
  EXPECT_EQ(got_b, b);
  path_.Disconnect();
  EXPECT_FALSE(path_.connected());
}

TEST_F(UcxDataPathPeerTest, ReceivesAndVerifiesEachBlock) {
  const transport::UcxEndpointId to_path = ConnectPath(0);
  ASSERT_NE(to_path, 0u);
  const auto ep = &to_path;
  const uint64_t tag_base = path_.NextGetTagBase();
  const std::vector<uint8_t> good = Bytes(8192, 3), bad = Bytes(1024, 4), big = Bytes(2048, 5);
  std::atomic<int> sent{0};
  auto send = [&](uint64_t position, const std::vector<uint8_t>& v) {
    peer_->SendTagged(*ep, tag_base + position, v.data(), v.size(), [&](Status) { ++sent; });
  };
  send(0, good);
  send(1, bad);
  send(2, big);
  // Position 3 is never sent: it runs into the deadline.

  std::vector<uint8_t> out_good(good.size()), out_bad(bad.size()), out_small(16), out_none(64);
  std::vector<UcxDataPath::IncomingBlock> blocks(4);
  blocks[0] = {tag_base + 0,
               Key(1),
               {out_good.data(), out_good.size()},
               good.size(),
               BlockChecksum(good.data(), good.size()),
               Tier::kHost};
  blocks[1] = {tag_base + 1,
               Key(2),
               {out_bad.data(), out_bad.size()},
               bad.size(),
               BlockChecksum(good.data(), good.size()) + 1,
               Tier::kHost};
  blocks[2] = {tag_base + 2,
               Key(3),
               {out_small.data(), out_small.size()},
               big.size(),
               BlockChecksum(big.data(), big.size()),
               Tier::kDisk};
  blocks[3] = {tag_base + 3, Key(4), {out_none.data(), out_none.size()}, 64, 0, Tier::kHost};
  const auto start = steady_clock::now();
  std::vector<GetResult> r = path_.ReceiveBlocks(blocks, start + 1s);
  EXPECT_LT(steady_clock::now() - start, 5s);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_TRUE(r[0].status.ok()) << r[0].status.ToString();
  EXPECT_EQ(r[0].size, good.size());
  EXPECT_EQ(r[0].tier, Tier::kHost);
  EXPECT_EQ(out_good, good);
  EXPECT_EQ(r[1].status.code(), StatusCode::kCorruption) << r[1].status.ToString();
  EXPECT_EQ(r[1].tier, Tier::kNone);
  // Too small: drained, reported with the block's size.
  EXPECT_EQ(r[2].status.code(), StatusCode::kInvalidArgument) << r[2].status.ToString();
  EXPECT_EQ(r[2].size, big.size());
  EXPECT_NE(r[3].status.code(), StatusCode::kOk);
  EXPECT_NE(r[3].status.ToString().find("UCX transfer of block"), std::string::npos)
      << r[3].status.ToString();
  const auto until = steady_clock::now() + 10s;
  while (sent < 3 && steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(sent, 3);
  peer_->Disconnect(*ep);
}

}  // namespace
}  // namespace kvpool::client
