// UcxListener over UCX on loopback TCP: offers by address and client id, the nonce each accepted
// endpoint gets, its claim, its expiry, the bound on unclaimed endpoints, and the tag prefixes.
#include "daemon/ucx_listener.h"

#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "transport/ucx_bind.h"

namespace kvpool::daemon {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

transport::UcxOptions LoopbackTcp(int index) {
  transport::UcxOptions o;
  o.transports = "tcp";
  o.net_devices = "lo";
  o.thread_index = index;
  return o;
}

class UcxListenerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto daemon = transport::UcxEngine::Create(LoopbackTcp(0));
    ASSERT_TRUE(daemon.ok()) << daemon.status().ToString();
    daemon_ = std::move(*daemon);
    auto client = transport::UcxEngine::Create(LoopbackTcp(1));
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    client_ = std::move(*client);
  }
  void TearDown() override {
    listener_.reset();
    client_.reset();
    daemon_.reset();
  }

  void Listen(const UcxListenerOptions& options) {
    auto l = UcxListener::Start(*daemon_, "127.0.0.1", 0, options);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    listener_ = std::move(*l);
  }

  // An endpoint from `client` (default: client_) to the listener (after an offer for loopback
  // and client_'s client id, unless `offer` is false), and the nonce that came on it ("" if none
  // came within `wait`).
  std::string Nonce(bool offer = true, std::chrono::milliseconds wait = 10s,
                    transport::UcxEngine* client = nullptr) {
    if (client == nullptr) client = client_.get();
    if (offer) {
      EXPECT_TRUE(listener_->Offer(kLoopback, client_->client_id()));
    }
    auto ep = client->ConnectTo(kLoopback, listener_->port());
    EXPECT_TRUE(ep.ok()) << ep.status().ToString();
    if (!ep.ok()) return "";
    // Often the nonce is there before the receive: it must come whole either way.
    std::this_thread::sleep_for(std::chrono::milliseconds(offer ? 50 : 0));
    std::string nonce(transport::kUcxBindNonceBytes, '\0');
    auto got = client->ReceiveStreamSync(*ep, nonce.data(), nonce.size(), Clock::now() + wait);
    return got.ok() && *got == nonce.size() ? nonce : "";
  }

  static constexpr char kLoopback[] = "127.0.0.1";
  std::unique_ptr<transport::UcxEngine> daemon_, client_;
  std::unique_ptr<UcxListener> listener_;
};

TEST_F(UcxListenerTest, AnEndpointIsClaimedWithItsNonceOnceFromItsOwnAddress) {
  Listen({});
  const std::string a = Nonce(), b = Nonce();
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  EXPECT_NE(a, b);
  std::string wrong = a;
  wrong[3] = static_cast<char>(wrong[3] ^ 0x10);
  EXPECT_EQ(listener_->Claim(wrong, kLoopback).status().code(), StatusCode::kNotFound);
  // A connection from another address cannot take it.
  EXPECT_EQ(listener_->Claim(a, "10.1.2.3").status().code(), StatusCode::kNotFound);
  auto ep_a = listener_->Claim(a, kLoopback);
  ASSERT_TRUE(ep_a.ok()) << ep_a.status().ToString();
  EXPECT_EQ(listener_->Claim(a, kLoopback).status().code(), StatusCode::kNotFound);
  auto ep_b = listener_->Claim(b, kLoopback);
  ASSERT_TRUE(ep_b.ok()) << ep_b.status().ToString();
  EXPECT_NE(*ep_a, *ep_b);
  // The claimed endpoint carries data to the client.
  const std::string hello = "to the client";
  ASSERT_TRUE(
      daemon_->SendTaggedSync(*ep_a, 77, hello.data(), hello.size(), Clock::now() + 10s).ok());
  std::string got(hello.size(), '\0');
  ASSERT_TRUE(client_->ReceiveTaggedSync(77, got.data(), got.size(), Clock::now() + 10s).ok());
  EXPECT_EQ(got, hello);
  daemon_->Disconnect(*ep_a);
  daemon_->Disconnect(*ep_b);
}

TEST_F(UcxListenerTest, ARequestWithoutAnOfferFromItsAddressIsRefused) {
  Listen({});
  EXPECT_EQ(Nonce(/*offer=*/false), "");  // refused: the wait ends with the endpoint's failure
  EXPECT_TRUE(listener_->Offer(
      "10.1.2.3", client_->client_id()));  // another address's offer lets nothing in here
  EXPECT_EQ(Nonce(/*offer=*/false), "");
  EXPECT_FALSE(Nonce().empty());          // with one
  EXPECT_EQ(Nonce(/*offer=*/false), "");  // an offer lets one request in, not two
}

// Another process at the client's address (a multi-user host, a NAT) does not know the client
// id the client's hello named: its request does not take the client's offer, which stays for
// the client.
TEST_F(UcxListenerTest, AnOfferIsTakenOnlyByARequestWithItsClientId) {
  Listen({});
  auto other = transport::UcxEngine::Create(LoopbackTcp(2));
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  ASSERT_NE((*other)->client_id(), client_->client_id());
  EXPECT_TRUE(listener_->Offer(kLoopback, client_->client_id()));
  EXPECT_EQ(Nonce(/*offer=*/false, 10s, other->get()), "");
  EXPECT_FALSE(Nonce(/*offer=*/false).empty());  // the client's offer is still there
  // An offer for no id (a client before ids) is not taken by a request that carries one.
  EXPECT_TRUE(listener_->Offer(kLoopback, 0));
  EXPECT_EQ(Nonce(/*offer=*/false, 10s, other->get()), "");
}

TEST_F(UcxListenerTest, OffersPerAddressAreBounded) {
  UcxListenerOptions o;
  o.max_offers_per_address = 2;
  Listen(o);
  EXPECT_TRUE(listener_->Offer(kLoopback, client_->client_id()));
  EXPECT_TRUE(listener_->Offer(kLoopback, client_->client_id()));
  EXPECT_FALSE(listener_->Offer(kLoopback, client_->client_id()));
  EXPECT_TRUE(listener_->Offer("10.1.2.3", client_->client_id()));
  EXPECT_FALSE(Nonce(/*offer=*/false).empty());  // takes one
  EXPECT_TRUE(listener_->Offer(kLoopback, client_->client_id()));
}

TEST_F(UcxListenerTest, OffersAndNoncesNotTakenInTimeExpire) {
  UcxListenerOptions o;
  o.claim_within = 100ms;
  Listen(o);
  const std::string a = Nonce();
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(listener_->Offer(kLoopback, client_->client_id()));
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(listener_->Claim(a, kLoopback).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(Nonce(/*offer=*/false), "");  // the offer expired too
}

TEST_F(UcxListenerTest, PastTheBoundANewEndpointIsRefused) {
  UcxListenerOptions o;
  o.max_unclaimed = 1;
  Listen(o);
  const std::string a = Nonce();
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(Nonce(), "");  // refused at once: no nonce
  ASSERT_TRUE(listener_->Claim(a, kLoopback).ok());
  EXPECT_FALSE(Nonce().empty());  // room again
}

TEST_F(UcxListenerTest, TagPrefixesAreDistinctPerConnectionAndPerDaemon) {
  Listen({});
  auto other_engine = transport::UcxEngine::Create(LoopbackTcp(2));
  ASSERT_TRUE(other_engine.ok());
  auto other = UcxListener::Start(**other_engine, "127.0.0.1", 0);
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  std::set<uint64_t> seen;
  int same_as_other = 0, same_as_id = 0;
  constexpr uint64_t kIds = 1 << 16;
  for (uint64_t id = 1; id <= kIds; ++id) {
    const uint64_t p = listener_->TagPrefixFor(id);
    EXPECT_EQ(p & ((uint64_t{1} << 40) - 1), 0u);
    seen.insert(p);
    same_as_other += p == (*other)->TagPrefixFor(id);
    same_as_id += p == (id << 40);
  }
  EXPECT_EQ(seen.size(), kIds);  // a permutation: no two connections share a prefix
  // Keyed: another daemon's prefixes, and the ids themselves, match only by chance (2^-24 each).
  EXPECT_LT(same_as_other, 8);
  EXPECT_LT(same_as_id, 8);
  EXPECT_EQ(listener_->TagPrefixFor(5), listener_->TagPrefixFor(5 + (1 << 24)));
  other->reset();
}

// Ids 2^24 apart map to one prefix; two such connections alive at once still get two (the later
// one that of the next id none holds), and a prefix is free again once its holder goes.
TEST_F(UcxListenerTest, NoTwoLiveConnectionsHoldOnePrefix) {
  Listen({});
  constexpr uint64_t kWrap = uint64_t{1} << 24;
  std::optional<TagPrefix> first = listener_->HoldTagPrefix(5);
  EXPECT_EQ(first->value(), listener_->TagPrefixFor(5));
  const TagPrefix second = listener_->HoldTagPrefix(5 + kWrap);
  EXPECT_NE(second.value(), first->value());
  EXPECT_EQ(second.value(), listener_->TagPrefixFor(6));
  const TagPrefix third = listener_->HoldTagPrefix(6);  // its own is held by `second`
  EXPECT_EQ(third.value(), listener_->TagPrefixFor(7));
  first.reset();
  EXPECT_EQ(listener_->HoldTagPrefix(5 + 2 * kWrap).value(), listener_->TagPrefixFor(5));
  TagPrefix moved = listener_->HoldTagPrefix(9);
  TagPrefix into = std::move(moved);
  EXPECT_EQ(into.value(), listener_->TagPrefixFor(9));
  EXPECT_NE(listener_->HoldTagPrefix(9 + kWrap).value(), into.value()) << "held by the move";
}

}  // namespace
}  // namespace kvpool::daemon
