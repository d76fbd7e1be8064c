// EtcdClient against a real etcd (see tests/support/etcd_test_server.h).
#include "daemon/cluster/etcd_client.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "tests/support/etcd_test_server.h"

namespace kvpool::daemon::cluster {
namespace {

using ::kvpool::testing::EtcdTestServer;
using ::kvpool::testing::FreeLoopbackPort;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

class EtcdClientTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto server = EtcdTestServer::Start();
    if (!server.ok()) {
      skip_reason_ = new std::string(server.status().ToString());
      skip_ = server.status().code() == StatusCode::kNotFound;
      return;
    }
    server_ = server->release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    if (server_ == nullptr && skip_) GTEST_SKIP() << "no etcd here: " << *skip_reason_;
    ASSERT_NE(server_, nullptr) << "etcd did not start: " << *skip_reason_;
    auto client = EtcdClient::Create(server_->endpoint());
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    client_ = std::move(*client);
    prefix_ = std::string("/test/") +
              ::testing::UnitTest::GetInstance()->current_test_info()->name() + "/";
  }

  static EtcdTestServer* server_;
  static std::string* skip_reason_;
  static bool skip_;
  std::unique_ptr<EtcdClient> client_;
  std::string prefix_;
};
EtcdTestServer* EtcdClientTest::server_ = nullptr;
std::string* EtcdClientTest::skip_reason_ = nullptr;
bool EtcdClientTest::skip_ = false;

// Collects watch updates; waits for a condition on them.
class Collector {
 public:
  void Add(const WatchUpdate& u) {
    std::lock_guard lock(mu_);
    updates_.push_back(u);
    cv_.notify_all();
  }
  template <typename Pred>
  bool WaitFor(Pred pred, std::chrono::milliseconds timeout = 5000ms) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return pred(updates_); });
  }
  std::vector<WatchUpdate> updates() {
    std::lock_guard lock(mu_);
    return updates_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<WatchUpdate> updates_;
};

// The watch's stream is up (its create request acknowledged).
bool WaitConnected(const EtcdWatch& watch) {
  const auto deadline = Clock::now() + 5s;
  while (!watch.connected()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

bool HasEvent(const std::vector<WatchUpdate>& updates, WatchEvent::Type type,
              const std::string& key, const std::string& value = "") {
  for (const auto& u : updates) {
    for (const auto& e : u.events) {
      if (e.type == type && e.kv.key == key && (value.empty() || e.kv.value == value)) return true;
    }
  }
  return false;
}

TEST(EtcdEndpointsTest, ParsesListsAndRejectsJunk) {
  auto eps = ParseEtcdEndpoints("etcd://127.0.0.1:2379,[::1]:2380,etcd.local:1");
  ASSERT_TRUE(eps.ok()) << eps.status().ToString();
  ASSERT_EQ(eps->size(), 3u);
  EXPECT_EQ((*eps)[0].ToString(), "127.0.0.1:2379");
  EXPECT_EQ((*eps)[1].host, "::1");
  EXPECT_EQ((*eps)[2].port, 1);
  EXPECT_TRUE(ParseEtcdEndpoints("127.0.0.1:2379").ok());
  for (const char* bad : {"", "etcd://", "etcd://host", "etcd://host:0", "etcd://h:1,",
                          "etcd://h:1,,h:2", "etcd://h:99999", "etcd://:5"}) {
    EXPECT_FALSE(ParseEtcdEndpoints(bad).ok()) << bad;
  }
  EXPECT_EQ(EtcdClient::PrefixEnd("/a/"), "/a0");
  EXPECT_EQ(EtcdClient::PrefixEnd(std::string("a\xff", 2)), "b");
}

TEST_F(EtcdClientTest, PutGetDeleteAndPrefix) {
  const std::string binary_value("\0\x01\xff value", 9);
  auto rev = client_->Put(prefix_ + "a", binary_value);
  ASSERT_TRUE(rev.ok()) << rev.status().ToString();
  EXPECT_GT(*rev, 0);
  ASSERT_TRUE(client_->Put(prefix_ + "b", "2").ok());
  ASSERT_TRUE(client_->Put(prefix_ + "c/d", "3").ok());
  ASSERT_TRUE(client_->Put(prefix_.substr(0, prefix_.size() - 1) + "x", "outside").ok());

  auto got = client_->Get(prefix_ + "a");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(got->kvs.size(), 1u);
  EXPECT_EQ(got->kvs[0].value, binary_value);
  EXPECT_EQ(got->kvs[0].mod_revision, *rev);
  EXPECT_GE(got->revision, *rev);

  auto all = client_->GetPrefix(prefix_);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->kvs.size(), 3u);
  EXPECT_EQ(all->kvs[0].key, prefix_ + "a");
  EXPECT_EQ(all->kvs[2].key, prefix_ + "c/d");

  auto deleted = client_->Delete(prefix_ + "a");
  ASSERT_TRUE(deleted.ok());
  EXPECT_EQ(*deleted, 1);
  EXPECT_EQ(*client_->Delete(prefix_ + "a"), 0);
  EXPECT_TRUE(client_->Get(prefix_ + "a")->kvs.empty());
  EXPECT_EQ(*client_->DeletePrefix(prefix_), 2);
  EXPECT_TRUE(client_->GetPrefix(prefix_)->kvs.empty());
  EXPECT_EQ(client_->Get(prefix_.substr(0, prefix_.size() - 1) + "x")->kvs.size(), 1u);
}

TEST_F(EtcdClientTest, PutIfAbsentCreatesOnceThenReportsTheHolder) {
  auto first = client_->PutIfAbsent(prefix_ + "k", "mine");
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_TRUE(first->created);
  auto second = client_->PutIfAbsent(prefix_ + "k", "theirs");
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_FALSE(second->created);
  ASSERT_TRUE(second->existing.has_value());
  EXPECT_EQ(second->existing->value, "mine");
  EXPECT_EQ(client_->Get(prefix_ + "k")->kvs[0].value, "mine");
}

TEST_F(EtcdClientTest, LeaseExpiryRemovesTheKey) {
  auto lease = client_->GrantLease(2);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_GE(lease->ttl_seconds, 2);
  ASSERT_TRUE(client_->Put(prefix_ + "ephemeral", "x", lease->id).ok());
  ASSERT_EQ(client_->Get(prefix_ + "ephemeral")->kvs.size(), 1u);
  EXPECT_EQ(client_->Get(prefix_ + "ephemeral")->kvs[0].lease, lease->id);
  const auto start = Clock::now();
  while (!client_->Get(prefix_ + "ephemeral")->kvs.empty() && Clock::now() - start < 5s) {
    std::this_thread::sleep_for(50ms);
  }
  const auto gone_after = Clock::now() - start;
  EXPECT_TRUE(client_->Get(prefix_ + "ephemeral")->kvs.empty());
  EXPECT_LE(gone_after, 3s);
  auto renewed = client_->KeepAliveOnce(lease->id);
  EXPECT_EQ(renewed.status().code(), StatusCode::kNotFound) << renewed.status().ToString();
  // A put under the dead lease is refused, not written without it.
  auto put = client_->Put(prefix_ + "ephemeral", "y", lease->id);
  EXPECT_EQ(put.status().code(), StatusCode::kNotFound) << put.status().ToString();
}

TEST_F(EtcdClientTest, KeepAliveHoldsAndRevokeDeletesAtOnce) {
  auto lease = client_->GrantLease(2);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(client_->Put(prefix_ + "held", "x", lease->id).ok());
  for (int i = 0; i < 6; ++i) {  // 3 s: past the TTL
    std::this_thread::sleep_for(500ms);
    auto ttl = client_->KeepAliveOnce(lease->id);
    ASSERT_TRUE(ttl.ok()) << ttl.status().ToString();
    EXPECT_GE(*ttl, 1);
  }
  EXPECT_EQ(client_->Get(prefix_ + "held")->kvs.size(), 1u);
  ASSERT_TRUE(client_->RevokeLease(lease->id).ok());
  EXPECT_TRUE(client_->Get(prefix_ + "held")->kvs.empty());
  EXPECT_EQ(client_->RevokeLease(lease->id).code(), StatusCode::kNotFound);
}

TEST_F(EtcdClientTest, WatchDeliversSnapshotPutsAndDeletes) {
  ASSERT_TRUE(client_->Put(prefix_ + "before", "0").ok());
  Collector got;
  auto watch = client_->Watch(prefix_, 0, [&](const WatchUpdate& u) { got.Add(u); });
  ASSERT_TRUE(got.WaitFor([](auto& u) { return !u.empty(); }));
  const auto first = got.updates()[0];
  EXPECT_TRUE(first.snapshot);
  ASSERT_EQ(first.events.size(), 1u);
  EXPECT_EQ(first.events[0].kv.key, prefix_ + "before");
  ASSERT_TRUE(WaitConnected(*watch));

  ASSERT_TRUE(client_->Put(prefix_ + "x", "1").ok());
  ASSERT_TRUE(client_->Put(prefix_ + "x", "2").ok());
  ASSERT_TRUE(client_->Put("/elsewhere", "ignored").ok());
  ASSERT_TRUE(client_->Delete(prefix_ + "x").ok());
  EXPECT_TRUE(got.WaitFor([&](auto& u) {
    return HasEvent(u, WatchEvent::Type::kPut, prefix_ + "x", "1") &&
           HasEvent(u, WatchEvent::Type::kPut, prefix_ + "x", "2") &&
           HasEvent(u, WatchEvent::Type::kDelete, prefix_ + "x");
  }));
  EXPECT_FALSE(HasEvent(got.updates(), WatchEvent::Type::kPut, "/elsewhere"));
  // Revisions only grow.
  int64_t last = 0;
  for (const auto& u : got.updates()) {
    EXPECT_GE(u.revision, last);
    last = u.revision;
  }
  watch->Stop();
  watch->Stop();  // idempotent
}

TEST_F(EtcdClientTest, WatchFromARevisionReplaysHistory) {
  auto r1 = client_->Put(prefix_ + "h", "1");
  ASSERT_TRUE(r1.ok());
  ASSERT_TRUE(client_->Put(prefix_ + "h", "2").ok());
  Collector got;
  auto watch = client_->Watch(prefix_, *r1, [&](const WatchUpdate& u) { got.Add(u); });
  EXPECT_TRUE(got.WaitFor([&](auto& u) {
    return HasEvent(u, WatchEvent::Type::kPut, prefix_ + "h", "1") &&
           HasEvent(u, WatchEvent::Type::kPut, prefix_ + "h", "2");
  }));
  EXPECT_FALSE(got.updates()[0].snapshot);
}

TEST_F(EtcdClientTest, WatchBehindACompactionGetsASnapshot) {
  auto r1 = client_->Put(prefix_ + "c", "old");
  ASSERT_TRUE(r1.ok());
  auto r2 = client_->Put(prefix_ + "c", "new");
  ASSERT_TRUE(r2.ok());
  ASSERT_TRUE(client_->Compact(*r2).ok());
  Collector got;
  auto watch = client_->Watch(prefix_, *r1, [&](const WatchUpdate& u) { got.Add(u); });
  ASSERT_TRUE(got.WaitFor([](auto& u) { return !u.empty(); }));
  const auto first = got.updates()[0];
  EXPECT_TRUE(first.snapshot);
  ASSERT_EQ(first.events.size(), 1u);
  EXPECT_EQ(first.events[0].kv.value, "new");
}

TEST_F(EtcdClientTest, DownEndpointIsUnavailableWithinTheDeadline) {
  EtcdOptions options;
  options.request_timeout = 300ms;
  auto dead = EtcdClient::Create("etcd://127.0.0.1:" + std::to_string(FreeLoopbackPort()), options);
  ASSERT_TRUE(dead.ok());
  const auto start = Clock::now();
  auto r = (*dead)->Get("/x");
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().ToString();
  EXPECT_LE(Clock::now() - start, 400ms);
  EXPECT_EQ((*dead)->GrantLease(2).status().code(), StatusCode::kUnavailable);
}

TEST_F(EtcdClientTest, FailsOverToALiveEndpoint) {
  auto client = EtcdClient::Create("etcd://127.0.0.1:" + std::to_string(FreeLoopbackPort()) +
                                   ",127.0.0.1:" + std::to_string(server_->client_port()));
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->Put(prefix_ + "f", "v").ok());
  EXPECT_EQ((*client)->Get(prefix_ + "f")->kvs.size(), 1u);
  Collector got;
  auto watch = (*client)->Watch(prefix_, 0, [&](const WatchUpdate& u) { got.Add(u); });
  ASSERT_TRUE(WaitConnected(*watch));
  ASSERT_TRUE((*client)->Put(prefix_ + "g", "v").ok());
  EXPECT_TRUE(
      got.WaitFor([&](auto& u) { return HasEvent(u, WatchEvent::Type::kPut, prefix_ + "g"); }));
}

TEST_F(EtcdClientTest, WatchResumesAfterEtcdRestarts) {
  Collector got;
  auto watch = client_->Watch(prefix_, 0, [&](const WatchUpdate& u) { got.Add(u); });
  ASSERT_TRUE(WaitConnected(*watch));
  ASSERT_TRUE(client_->Put(prefix_ + "a", "1").ok());
  ASSERT_TRUE(
      got.WaitFor([&](auto& u) { return HasEvent(u, WatchEvent::Type::kPut, prefix_ + "a"); }));

  server_->Kill();
  EXPECT_EQ(client_->Get(prefix_ + "a").status().code(), StatusCode::kUnavailable);
  ASSERT_TRUE(server_->Restart().ok());
  ASSERT_TRUE(client_->Put(prefix_ + "b", "2").ok());
  EXPECT_TRUE(
      got.WaitFor([&](auto& u) { return HasEvent(u, WatchEvent::Type::kPut, prefix_ + "b"); }));
  // Nothing was replayed as new: "a" was delivered once.
  int a_puts = 0;
  for (const auto& u : got.updates()) {
    for (const auto& e : u.events) a_puts += !u.snapshot && e.kv.key == prefix_ + "a";
  }
  EXPECT_EQ(a_puts, 1);
}

// Kept last: it replaces etcd's data.
TEST_F(EtcdClientTest, WatchResnapshotsWhenEtcdsHistoryIsReplaced) {
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(client_->Put(prefix_ + "old", std::to_string(i)).ok());
  Collector got;
  auto watch = client_->Watch(prefix_, 0, [&](const WatchUpdate& u) { got.Add(u); });
  ASSERT_TRUE(WaitConnected(*watch));
  const size_t before = got.updates().size();
  ASSERT_TRUE(server_->Restart(/*wipe=*/true).ok());
  // A fresh store restarts its revisions at 1: resuming from the old revision would skip this.
  ASSERT_TRUE(client_->Put(prefix_ + "new", "1").ok());
  // A snapshot of the new store replaces the view ("old" gone), and "new" arrives in it or
  // after it.
  EXPECT_TRUE(got.WaitFor([&](auto& updates) {
    for (size_t i = before; i < updates.size(); ++i) {
      if (!updates[i].snapshot) continue;
      for (const auto& e : updates[i].events) {
        if (e.kv.key == prefix_ + "old") return false;
      }
      return HasEvent({updates.begin() + i, updates.end()}, WatchEvent::Type::kPut,
                      prefix_ + "new");
    }
    return false;
  }));
}

}  // namespace
}  // namespace kvpool::daemon::cluster
