// Membership against a real etcd (see tests/support/etcd_test_server.h): join, see each other,
// leave, die, authentication, and etcd going away and coming back.
#include "daemon/cluster/membership.h"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>

#include "tests/support/etcd_test_server.h"

namespace kvpool::daemon::cluster {
namespace {

using ::kvpool::testing::EtcdTestServer;
using ::kvpool::testing::FreeLoopbackPort;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr char kSecret[] = "correct horse battery staple";

class MembershipTest : public ::testing::Test {
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
    cluster_ = std::string("c-") + ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }

  MembershipOptions Options(const std::string& node, const std::string& secret = kSecret) {
    MembershipOptions o;
    o.etcd = server_->endpoint();
    o.cluster_name = cluster_;
    o.node_id = node;
    o.secret = secret;
    o.control_address = "tcp://127.0.0.1:" + std::to_string(7000 + node.back());
    o.ucx_worker_address = std::string("\0ucx\xff", 5) + node;
    o.capacity_bytes = 1ull << 30;
    return o;
  }

  std::unique_ptr<Membership> MustJoin(MembershipOptions o) {
    auto m = Membership::Join(std::move(o));
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return m.ok() ? std::move(*m) : nullptr;
  }

  static std::set<std::string> Ids(const Membership& m) {
    std::set<std::string> out;
    for (const auto& member : m.Members()) out.insert(member.record.node_id);
    return out;
  }

  // Polls `pred` until it holds or `timeout` passes; returns how long it took (or timeout+).
  template <typename Pred>
  static std::chrono::milliseconds WaitUntil(Pred pred, std::chrono::milliseconds timeout) {
    const auto start = Clock::now();
    while (!pred()) {
      if (Clock::now() - start > timeout) return timeout + 1ms;
      std::this_thread::sleep_for(20ms);
    }
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  }

  static EtcdTestServer* server_;
  static std::string* skip_reason_;
  static bool skip_;
  std::string cluster_;
};
EtcdTestServer* MembershipTest::server_ = nullptr;
std::string* MembershipTest::skip_reason_ = nullptr;
bool MembershipTest::skip_ = false;

const std::set<std::string> kABC = {"node-a", "node-b", "node-c"};

TEST(MemberRecordTest, EncodesDecodesAndAuthenticates) {
  MemberRecord r;
  r.cluster = "prod";
  r.node_id = "n1";
  r.instance = "abc";
  r.control_address = "tcp://10.0.0.1:7100";
  r.ucx_worker_address = std::string("\0\x01\x02\xff", 4);
  r.capacity_bytes = 1ull << 40;
  r.used_bytes = 12345;
  r.started_at_ms = 1700000000000;
  r.auth = MemberRecordAuth(r, kSecret);
  EXPECT_EQ(r.auth.size(), 64u);
  auto back = DecodeMemberRecord(EncodeMemberRecord(r));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->ucx_worker_address, r.ucx_worker_address);
  EXPECT_EQ(back->capacity_bytes, r.capacity_bytes);
  EXPECT_TRUE(VerifyMemberRecord(*back, kSecret));
  EXPECT_FALSE(VerifyMemberRecord(*back, "another secret, also long"));
  // Every field is covered: changing any one breaks the auth.
  for (int field = 0; field < 8; ++field) {
    MemberRecord t = *back;
    switch (field) {
      case 0:
        t.cluster += "x";
        break;
      case 1:
        t.node_id += "x";
        break;
      case 2:
        t.instance += "x";
        break;
      case 3:
        t.control_address = "tcp://6.6.6.6:7100";
        break;
      case 4:
        t.ucx_worker_address += "x";
        break;
      case 5:
        t.capacity_bytes += 1;
        break;
      case 6:
        t.used_bytes += 1;
        break;
      case 7:
        t.started_at_ms += 1;
        break;
    }
    EXPECT_FALSE(VerifyMemberRecord(t, kSecret)) << "field " << field;
  }
  for (const char* bad :
       {"", "{}", "[1]", "{\"version\":1}", "not json", "{\"version\":2,\"cluster\":\"p\"}"}) {
    EXPECT_FALSE(DecodeMemberRecord(bad).ok()) << bad;
  }
  std::string typed = EncodeMemberRecord(r);
  typed.replace(typed.find("\"used_bytes\":12345"), 18, "\"used_bytes\":\"many\"");
  EXPECT_EQ(DecodeMemberRecord(typed).status().code(), StatusCode::kCorruption);
}

TEST(MemberRecordTest, NamesAndSecretsAreValidated) {
  EXPECT_TRUE(ValidateClusterName("prod-1.eu_west", "cluster").ok());
  for (const char* bad : {"", "a/b", "a b", "../x", "x\n"}) {
    EXPECT_FALSE(ValidateClusterName(bad, "cluster").ok()) << bad;
  }
  EXPECT_FALSE(ValidateClusterName(std::string(129, 'a'), "node id").ok());
  EXPECT_EQ(MemberKey("prod", "n1"), "/kvpool/prod/nodes/n1");
}

TEST_F(MembershipTest, ThreeMembersSeeEachOther) {
  std::atomic<int> changes{0};
  auto o = Options("node-a");
  o.on_change = [&] { changes.fetch_add(1); };
  o.used_bytes = [] { return uint64_t{4096}; };
  auto a = MustJoin(std::move(o));
  auto b = MustJoin(Options("node-b"));
  auto c = MustJoin(Options("node-c"));
  ASSERT_TRUE(a && b && c);
  for (auto* m : {a.get(), b.get(), c.get()}) {
    EXPECT_LT(WaitUntil([&] { return Ids(*m) == kABC; }, 3000ms), 3000ms) << m->node_id();
    EXPECT_EQ(m->state(), ClusterState::kJoined);
    EXPECT_EQ(m->ring()->members(), std::vector<NodeId>(kABC.begin(), kABC.end()));
  }
  EXPECT_GT(changes.load(), 0);
  // What `kvpool cluster members` shows: address, state, capacity and occupancy.
  bool saw_a = false;
  for (const auto& member : b->Members()) {
    EXPECT_EQ(member.state, MemberState::kAlive);
    EXPECT_EQ(member.self, member.record.node_id == "node-b");
    EXPECT_EQ(member.record.capacity_bytes, 1ull << 30);
    if (member.record.node_id == "node-a") {
      saw_a = true;
      EXPECT_EQ(member.record.control_address, Options("node-a").control_address);
      EXPECT_EQ(member.record.ucx_worker_address, Options("node-a").ucx_worker_address);
      EXPECT_EQ(member.record.used_bytes, 4096u);
    }
  }
  EXPECT_TRUE(saw_a);
  EXPECT_EQ(a->health().members, 3u);
}

TEST_F(MembershipTest, LeavingIsSeenAtOnceAndDyingWithinTheLeaseTtl) {
  auto a = MustJoin(Options("node-a"));
  auto b = MustJoin(Options("node-b"));
  auto c = MustJoin(Options("node-c"));
  ASSERT_TRUE(a && b && c);
  for (auto* m : {a.get(), c.get()}) {
    ASSERT_LT(WaitUntil([&] { return Ids(*m) == kABC; }, 3000ms), 3000ms);
  }

  // A daemon that shuts down revokes its lease: gone from every view at once.
  b->Leave();
  EXPECT_EQ(b->state(), ClusterState::kStopped);
  const auto left = WaitUntil([&] { return Ids(*a).count("node-b") == 0; }, 1000ms);
  RecordProperty("left_member_gone_ms", static_cast<int>(left.count()));
  EXPECT_LT(left, 500ms);
  EXPECT_LT(WaitUntil([&] { return Ids(*c).count("node-b") == 0; }, 1000ms), 500ms);

  // A daemon that hangs or dies stops renewing: gone within the TTL (2 s) plus etcd's expiry
  // sweep (0.5 s), measured from its last renewal.
  c->PauseKeepAliveForTesting(true);
  const auto gone = WaitUntil([&] { return Ids(*a).count("node-c") == 0; }, 4000ms);
  RecordProperty("dead_member_gone_ms", static_cast<int>(gone.count()));
  EXPECT_LE(gone, 3000ms);
  EXPECT_GE(gone, 1000ms);
  EXPECT_EQ(a->ring()->members(), std::vector<NodeId>{"node-a"});
}

TEST_F(MembershipTest, StalledMemberRejoinsWhenItWakes) {
  auto a = MustJoin(Options("node-a"));
  auto b = MustJoin(Options("node-b"));
  ASSERT_TRUE(a && b);
  ASSERT_LE(WaitUntil([&] { return Ids(*a).count("node-b") == 1; }, 3000ms), 3000ms);
  b->PauseKeepAliveForTesting(true);
  ASSERT_LE(WaitUntil([&] { return Ids(*a).count("node-b") == 0; }, 4000ms), 4000ms);
  b->PauseKeepAliveForTesting(false);
  EXPECT_LE(WaitUntil([&] { return Ids(*a).count("node-b") == 1; }, 3000ms), 3000ms);
  // A sees B's new record as soon as B's claim writes it, a moment before B counts the re-join
  // and reports itself joined again.
  EXPECT_LE(
      WaitUntil([&] { return b->health().rejoins == 1 && b->state() == ClusterState::kJoined; },
                1000ms),
      1000ms);
  EXPECT_EQ(b->state(), ClusterState::kJoined);
  EXPECT_EQ(b->health().rejoins, 1u);
}

TEST_F(MembershipTest, WrongSecretMembersAreIgnored) {
  auto a = MustJoin(Options("node-a"));
  auto b = MustJoin(Options("node-b"));
  auto intruder = MustJoin(Options("node-x", "a different secret entirely"));
  ASSERT_TRUE(a && b && intruder);
  ASSERT_LT(WaitUntil([&] { return Ids(*a).count("node-b") == 1; }, 3000ms), 3000ms);
  // Give the intruder's record time to arrive, then check it was dropped.
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(Ids(*a), (std::set<std::string>{"node-a", "node-b"}));
  EXPECT_EQ(Ids(*b), (std::set<std::string>{"node-a", "node-b"}));
  EXPECT_GE(a->health().ignored_records, 1u);
  // And the intruder, whose secret is different, trusts none of them.
  EXPECT_EQ(Ids(*intruder), std::set<std::string>{"node-x"});

  // Hand-written records: garbage, a valid record copied under another id, a forged auth.
  auto etcd = EtcdClient::Create(server_->endpoint());
  ASSERT_TRUE(etcd.ok());
  const std::string prefix = MembersPrefix(cluster_);
  const uint64_t ignored_before = a->health().ignored_records;
  ASSERT_TRUE((*etcd)->Put(prefix + "junk", "{not json").ok());
  auto b_record = (*etcd)->Get(prefix + "node-b");
  ASSERT_TRUE(b_record.ok() && b_record->kvs.size() == 1);
  ASSERT_TRUE((*etcd)->Put(prefix + "node-copy", b_record->kvs[0].value).ok());
  auto forged = DecodeMemberRecord(b_record->kvs[0].value);
  ASSERT_TRUE(forged.ok());
  forged->node_id = "node-forged";
  forged->control_address = "tcp://6.6.6.6:1";
  ASSERT_TRUE((*etcd)->Put(prefix + "node-forged", EncodeMemberRecord(*forged)).ok());
  ASSERT_LE(WaitUntil([&] { return a->health().ignored_records >= ignored_before + 3; }, 2000ms),
            2000ms);
  EXPECT_EQ(Ids(*a), (std::set<std::string>{"node-a", "node-b"}));
  ASSERT_TRUE((*etcd)->DeletePrefix(prefix + "node-copy").ok());
  ASSERT_TRUE((*etcd)->Delete(prefix + "node-forged").ok());
  ASSERT_TRUE((*etcd)->Delete(prefix + "junk").ok());
}

TEST_F(MembershipTest, JoinWithoutASecretIsRefused) {
  auto o = Options("node-a", "");
  auto m = Membership::Join(o);
  EXPECT_EQ(m.status().code(), StatusCode::kPermissionDenied) << m.status().ToString();
  o.secret = "short";
  EXPECT_EQ(Membership::Join(o).status().code(), StatusCode::kPermissionDenied);
  o.secret = kSecret;
  o.node_id = "bad/id";
  EXPECT_EQ(Membership::Join(o).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(MembershipTest, JoinWithoutEtcdIsUnavailableQuickly) {
  auto o = Options("node-a");
  o.etcd = "etcd://127.0.0.1:" + std::to_string(FreeLoopbackPort());
  const auto start = Clock::now();
  auto m = Membership::Join(o);
  EXPECT_EQ(m.status().code(), StatusCode::kUnavailable) << m.status().ToString();
  EXPECT_LE(Clock::now() - start, 1s);
}

TEST_F(MembershipTest, NodeIdHeldByAnotherSecretIsRefused) {
  auto a = MustJoin(Options("node-a"));
  ASSERT_TRUE(a);
  auto o = Options("node-a", "a different secret entirely");
  o.claim_wait = 500ms;
  auto twin = Membership::Join(o);
  EXPECT_EQ(twin.status().code(), StatusCode::kPermissionDenied) << twin.status().ToString();
  // The rightful holder is untouched.
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(a->state(), ClusterState::kJoined);
  EXPECT_EQ(Ids(*a), std::set<std::string>{"node-a"});
}

TEST_F(MembershipTest, NodeIdHeldByALiveTwinIsRefused) {
  auto a = MustJoin(Options("node-a"));
  ASSERT_TRUE(a);
  auto o = Options("node-a");
  o.claim_wait = 500ms;
  auto twin = Membership::Join(o);
  EXPECT_EQ(twin.status().code(), StatusCode::kAlreadyExists) << twin.status().ToString();
}

TEST_F(MembershipTest, RestartAfterACrashReclaimsTheNodeId) {
  auto a = MustJoin(Options("node-a"));
  auto b = MustJoin(Options("node-b"));
  ASSERT_TRUE(a && b);
  b->PauseKeepAliveForTesting(true);  // crashed: its record lives until its lease ends
  b.reset();
  const auto start = Clock::now();
  // Its claim asks etcd again and again while the dead one's lease runs out: on a loaded 2-core
  // machine one of those answers once took longer than the default 500 ms.
  auto again = Options("node-b");
  again.etcd_timeout = 2000ms;
  auto b2 = MustJoin(again);  // waits (claim_wait) for the dead one's lease
  ASSERT_TRUE(b2);
  EXPECT_LE(Clock::now() - start, 3500ms);
  EXPECT_LE(WaitUntil([&] { return Ids(*a).count("node-b") == 1; }, 2000ms), 2000ms);
}

TEST_F(MembershipTest, OccupancyIsRepublished) {
  std::atomic<uint64_t> used{100};
  auto o = Options("node-a");
  o.used_bytes = [&] { return used.load(); };
  o.occupancy_interval = 200ms;
  auto a = MustJoin(std::move(o));
  auto b = MustJoin(Options("node-b"));
  ASSERT_TRUE(a && b);
  auto used_seen_by_b = [&]() -> uint64_t {
    for (const auto& m : b->Members()) {
      if (m.record.node_id == "node-a") return m.record.used_bytes;
    }
    return 0;
  };
  EXPECT_LE(WaitUntil([&] { return used_seen_by_b() == 100; }, 2000ms), 2000ms);
  used = 777;
  EXPECT_LE(WaitUntil([&] { return used_seen_by_b() == 777; }, 2000ms), 2000ms);
}

// Kept last: it kills etcd and restarts it on the same data dir and port.
TEST_F(MembershipTest, EtcdLossDegradesKeepsTheViewAndRejoins) {
  std::vector<std::unique_ptr<Membership>> members;
  for (const char* id : {"node-a", "node-b", "node-c"}) members.push_back(MustJoin(Options(id)));
  for (auto& m : members) {
    ASSERT_TRUE(m);
    ASSERT_LT(WaitUntil([&] { return Ids(*m) == kABC; }, 3000ms), 3000ms);
  }

  server_->Kill();
  for (auto& m : members) {
    const auto degraded = WaitUntil([&] { return m->state() == ClusterState::kDegraded; }, 3000ms);
    RecordProperty("degraded_after_ms_" + m->node_id(), static_cast<int>(degraded.count()));
    EXPECT_LE(degraded, 2000ms) << m->node_id();
    const auto h = m->health();
    EXPECT_FALSE(h.reason.empty());
    EXPECT_GT(h.keepalive_failures, 0u);
    // The last known view stays, marked stale; the ring keeps placing keys over it.
    EXPECT_EQ(Ids(*m), kABC);
    for (const auto& member : m->Members()) {
      EXPECT_EQ(member.state, member.self ? MemberState::kDegraded : MemberState::kStale);
    }
    EXPECT_EQ(m->ring()->size(), 3u);
  }
  std::this_thread::sleep_for(2500ms);  // longer than the lease TTL, still degraded
  for (auto& m : members) EXPECT_EQ(m->state(), ClusterState::kDegraded);

  ASSERT_TRUE(server_->Restart().ok());
  for (auto& m : members) {
    const auto rejoined = WaitUntil([&] { return m->state() == ClusterState::kJoined; }, 5000ms);
    RecordProperty("rejoined_after_ms_" + m->node_id(), static_cast<int>(rejoined.count()));
    EXPECT_LE(rejoined, 5000ms) << m->node_id();
    EXPECT_EQ(Ids(*m), kABC);
  }
  // The watches work again: a member that dies now is seen leaving.
  members[2]->PauseKeepAliveForTesting(true);
  EXPECT_LE(WaitUntil([&] { return Ids(*members[0]).count("node-c") == 0; }, 4000ms), 4000ms);
  EXPECT_LE(WaitUntil([&] { return Ids(*members[1]).count("node-c") == 0; }, 1000ms), 1000ms);
  for (const auto& member : members[0]->Members()) EXPECT_EQ(member.state, MemberState::kAlive);
}

}  // namespace
}  // namespace kvpool::daemon::cluster
