// Cluster membership end to end: real kvpoold processes joining through a real etcd (started on
// loopback ports in a temp dir by the test): every daemon sees the others, a killed daemon leaves
// within the lease bound, a daemon with the wrong cluster secret is not admitted, and a daemon
// that loses etcd keeps serving its local tiers, reports "degraded", and rejoins.
//
// And blocks across nodes: a chain put through one daemon is a full, byte-identical hit through
// another, and survives the first one's kill -9 through its replicas.
// A session saved through one daemon loads through another while the first is down.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <thread>

#include <cstring>

#include "client/peer_calls.h"
#include "daemon/cluster/rendezvous.h"
#include "kernels/dtype.h"
#include "tests/support/daemon_process.h"
#include "tests/support/etcd_test_server.h"
#include "tests/support/status_matchers.h"
#include "tests/support/test_certificates.h"

namespace kvpool::testing {
namespace {

std::string WriteSecret(const TempDir& dir, const std::string& name, const std::string& secret) {
  const std::string path = dir.path() + "/" + name;
  std::ofstream(path) << secret << "\n";
  chmod(path.c_str(), 0600);
  return path;
}

std::vector<std::string> NodeFlags(const std::string& etcd, const std::string& id,
                                   const std::string& secret_file) {
  return {"--cluster=" + etcd,
          "--cluster_name=test",
          "--node_id=" + id,
          "--cluster_secret_file=" + secret_file,
          "--listen=tcp://127.0.0.1:0",
          "--ucx_transports=tcp",
          "--ucx_net_devices=lo"};
}

// Bytes for a chain of `n` blocks (block i: BlockBytes(seed + i, bytes + i * grow)) and spans
// over them, as PutChain takes them.
std::pair<std::vector<std::vector<uint8_t>>, std::vector<std::span<const uint8_t>>> ChainBlocks(
    size_t n, uint64_t seed, size_t bytes, size_t grow = 0) {
  std::pair<std::vector<std::vector<uint8_t>>, std::vector<std::span<const uint8_t>>> out;
  for (size_t i = 0; i < n; ++i) out.first.push_back(BlockBytes(seed + i, bytes + i * grow));
  out.second.assign(out.first.begin(), out.first.end());
  return out;
}

// Waits up to `seconds` for `pred(view)` on the daemon's cluster view; returns the last view.
template <typename Pred>
ClusterView WaitView(Client& c, Pred pred, int seconds) {
  ClusterView v;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < end) {
    auto r = c.Cluster();
    if (r.ok()) {
      v = *r;
      if (pred(v)) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return v;
}

size_t Alive(const ClusterView& v) {
  size_t n = 0;
  for (const ClusterMember& m : v.members) n += m.state == "alive";
  return n;
}

// Waits until every client's daemon sees `n` alive members; false (with a failure) otherwise.
bool AllSee(std::initializer_list<Client*> clients, size_t n) {
  for (Client* cl : clients) {
    const ClusterView v = WaitView(
        *cl, [n](const ClusterView& v) { return Alive(v) == n; }, 10);
    EXPECT_EQ(Alive(v), n) << "state " << v.state;
    if (Alive(v) != n) return false;
  }
  return true;
}

// Each test gets its own etcd on loopback ports and a cluster secret file; skipped (saying why)
// when there is no etcd binary.
class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto etcd = EtcdTestServer::Start();
    if (!etcd.ok() && etcd.status().IsNotFound()) {
      GTEST_SKIP() << "no etcd binary (" << EtcdTestServer::BinaryPath()
                   << "): " << etcd.status().ToString();
    }
    ASSERT_TRUE(etcd.ok()) << etcd.status().ToString();
    etcd_ = std::move(*etcd);
    secret_ = WriteSecret(dir_, "secret", "correct horse battery staple");
  }

  // A daemon of cluster "test" with node id `id` (and the shared secret, unless another file).
  std::vector<std::string> Flags(const std::string& id, const std::string& secret_file = "") {
    return NodeFlags(etcd_->endpoint(), id, secret_file.empty() ? secret_ : secret_file);
  }

  TempDir dir_;
  std::unique_ptr<EtcdTestServer> etcd_;
  std::string secret_;
};

TEST_F(ClusterTest, MembersJoinLeaveAndSurviveAnEtcdOutage) {
  const std::string wrong = WriteSecret(dir_, "wrong", "incorrect donkey battery staple");

  DaemonProcess a(Flags("node-a"));
  DaemonProcess b(Flags("node-b"));
  DaemonProcess c(Flags("node-c"));
  ASSERT_OK(a.Start());
  ASSERT_OK(b.Start());
  ASSERT_OK(c.Start());
  auto ca = a.Connect();
  ASSERT_NE(ca, nullptr);
  ClusterView v = WaitView(
      *ca, [](const ClusterView& v) { return Alive(v) == 3; }, 10);
  ASSERT_EQ(Alive(v), 3u) << "state " << v.state;
  EXPECT_EQ(v.state, "joined");
  size_t self = 0;
  for (const ClusterMember& m : v.members) {
    self += m.self;
    EXPECT_EQ(m.control_address.rfind("tcp://127.0.0.1:", 0), 0u) << m.control_address;
    EXPECT_GT(m.capacity_bytes, 0u);
  }
  EXPECT_EQ(self, 1u);

  // A daemon with the wrong secret runs, but nobody admits it (nor does it admit them).
  DaemonProcess d(Flags("node-d", wrong));
  ASSERT_OK(d.Start());
  auto cd = d.Connect();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  auto vd = cd->Cluster();
  ASSERT_TRUE(vd.ok());
  EXPECT_EQ(Alive(*vd), 1u) << "a daemon with the wrong secret admitted others";
  auto va = ca->Cluster();
  ASSERT_TRUE(va.ok());
  for (const ClusterMember& m : va->members) EXPECT_NE(m.node_id, "node-d");
  // Over TCP, a daemon in cluster mode serves only clients that prove the cluster secret.
  {
    const std::string address = a.PrintedAddress("tcp://");
    ASSERT_FALSE(address.empty()) << a.log();
    ClientOptions o = a.Options();
    o.address = address;
    o.data_path = DataPath::kSocket;
    auto none = Client::Connect(o);
    EXPECT_EQ(none.status().code(), StatusCode::kPermissionDenied) << none.status().ToString();
    o.cluster_secret = "incorrect donkey battery staple";
    auto bad = Client::Connect(o);
    EXPECT_EQ(bad.status().code(), StatusCode::kPermissionDenied) << bad.status().ToString();
    o.cluster_secret = "correct horse battery staple";
    auto good = Client::Connect(o);
    ASSERT_TRUE(good.ok()) << good.status().ToString();
    EXPECT_TRUE((*good)->Stats().ok());
  }
  // ...nor does it read the cluster's blocks: a chain put through A is a miss through D.
  {
    ChainHasher h("s", kTestLayout, 16);
    const std::vector<BlockKey> chain = h.Hash(Tokens(5, 4 * 16));
    const std::vector<uint8_t> bytes = BlockBytes(5, 5000);
    std::vector<std::span<const uint8_t>> spans(chain.size(), std::span<const uint8_t>(bytes));
    ASSERT_TRUE(ca->PutChain(chain, spans).ok());
    auto l = cd->Lookup(chain);
    ASSERT_TRUE(l.ok());
    EXPECT_EQ(l->hit_blocks, 0u) << "a daemon with the wrong secret read the cluster's blocks";
  }
  EXPECT_OK(d.Stop());

  // kill -9: node-c stops renewing its lease and leaves everyone's view within the bound.
  c.Kill();
  const auto killed = std::chrono::steady_clock::now();
  v = WaitView(
      *ca, [](const ClusterView& v) { return Alive(v) == 2; }, 10);
  EXPECT_EQ(Alive(v), 2u);
  EXPECT_LT(std::chrono::steady_clock::now() - killed, std::chrono::seconds(5));

  // etcd goes away under load: two clients keep reading and writing through A and B the
  // whole time; no call fails, and every block read back is the one put.
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> load_calls{0}, load_errors{0}, load_wrong{0};
  std::vector<std::thread> load;
  for (int t = 0; t < 2; ++t) {
    load.emplace_back([&, t] {
      auto cl = (t == 0 ? a : b).Connect();
      ChainHasher h("load", kTestLayout, 16);
      for (int round = 0; !stop; ++round) {
        // Distinct chains per client (a chain two clients put at once may be "in progress" by
        // the other writer when this one reads it back: a legitimate, short-lived miss).
        const uint64_t seed = 1'000'000ull * (t + 1) + round;
        const std::vector<BlockKey> chain = h.Hash(Tokens(seed, 4 * 16));
        const std::vector<uint8_t> blk = BlockBytes(seed, 8000);
        std::vector<std::span<const uint8_t>> sp(chain.size(), std::span<const uint8_t>(blk));
        auto p = cl->PutChain(chain, sp);
        auto g = cl->GetBlocks(chain);
        ++load_calls;
        if (!p.ok() || !p->all_ok() || !g.ok()) {
          ++load_errors;
          continue;
        }
        for (const FetchedBlock& b : *g) {
          if (!b.status.ok() || b.bytes != blk) {
            ++load_wrong;
            ADD_FAILURE() << "client " << t << " round " << round << ": " << b.status.ToString()
                          << ", " << b.bytes.size() << " bytes";
          }
        }
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));

  // etcd goes away: the daemon keeps serving its own tiers and says it is degraded.
  etcd_->Kill();
  v = WaitView(
      *ca, [](const ClusterView& v) { return v.state == "degraded"; }, 10);
  EXPECT_EQ(v.state, "degraded");
  ChainHasher hasher("s", kTestLayout, 16);
  const std::vector<BlockKey> keys = hasher.Hash(Tokens(1, 64));
  const std::vector<uint8_t> bytes = BlockBytes(1, 10000);
  std::vector<std::span<const uint8_t>> spans(keys.size(), std::span<const uint8_t>(bytes));
  auto put = ca->PutChain(keys, spans);
  ASSERT_TRUE(put.ok() && put->all_ok());
  auto l = ca->Lookup(keys);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->hit_blocks, keys.size());
  auto stats = ca->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->cluster_state, "degraded");

  // etcd returns: the daemons rejoin and see each other again.
  ASSERT_TRUE(etcd_->Restart().ok());
  v = WaitView(
      *ca, [](const ClusterView& v) { return v.state == "joined" && Alive(v) == 2; }, 15);
  EXPECT_EQ(v.state, "joined");
  EXPECT_EQ(Alive(v), 2u);
  stop = true;
  for (auto& th : load) th.join();
  EXPECT_GT(load_calls.load(), 4u);
  EXPECT_EQ(load_errors.load(), 0u) << "a call failed while etcd was down or coming back";
  EXPECT_EQ(load_wrong.load(), 0u);
}

TEST_F(ClusterTest, AChainPutThroughOneNodeIsAHitThroughTheOthers) {
  DaemonProcess a(Flags("node-a"));
  DaemonProcess b(Flags("node-b"));
  DaemonProcess c(Flags("node-c"));
  ASSERT_OK(a.Start());
  ASSERT_OK(b.Start());
  ASSERT_OK(c.Start());
  auto ca = a.Connect("tenant");
  auto cb = b.Connect("tenant");
  auto cc = c.Connect("tenant");
  ASSERT_TRUE(AllSee({ca.get(), cb.get(), cc.get()}, 3));
  // A system prompt computed only on node A.
  ChainHasher hasher("tenant-secret", kTestLayout, 16);
  const std::vector<BlockKey> keys = hasher.Hash(Tokens(42, 20 * 16));
  auto [blocks, spans] = ChainBlocks(keys.size(), 700, 65536, /*grow=*/1);
  auto put = ca->PutChain(keys, spans);
  ASSERT_TRUE(put.ok() && put->all_ok());

  auto expect_all = [&](Client& cl) {
    auto l = cl.Lookup(keys);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_EQ(l->hit_blocks, keys.size());
    auto got = cl.GetBlocks(keys);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    for (size_t i = 0; i < keys.size(); ++i) {
      ASSERT_TRUE((*got)[i].status.ok()) << i << ": " << (*got)[i].status.ToString();
      EXPECT_EQ((*got)[i].bytes, blocks[i]) << i;
    }
  };
  // Node C never saw the prompt: a full hit anyway, fetched from the blocks' home nodes.
  expect_all(*cc);
  // ...and C now serves it from its own tiers.
  auto sc = cc->Stats();
  ASSERT_TRUE(sc.ok());
  EXPECT_GE(sc->tiers[0].blocks, keys.size());

  // Node A dies; B still serves the chain (from its replicas or C's copies).
  // Replication copies each block A stored to the next node of its order, in the background:
  // B holds its share without ever being asked.
  uint64_t replicated = 0;
  for (int i = 0; i < 50 && replicated == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto sb = cb->Stats();
    ASSERT_TRUE(sb.ok());
    replicated = sb->puts_committed;
  }
  EXPECT_GT(replicated, 0u) << "nothing was replicated to node B";
  a.Kill();
  ClusterView v = WaitView(
      *cb, [](const ClusterView& v) { return Alive(v) == 2; }, 10);
  ASSERT_EQ(Alive(v), 2u);
  const auto start = std::chrono::steady_clock::now();
  expect_all(*cb);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// A node whose host tier is full of blocks that are on no disk yet cannot take a fetched block
// into a reserved slot inside the peer's request (that slot would have to be bought with a disk
// write, under the peer's deadline). It receives such blocks into memory of its own and stores
// them after the request, demoting its own blocks then: still a byte-identical hit, and kept.
TEST_F(ClusterTest, AFetchIntoAHostFullOfUnwrittenBlocksIsStoredAfterTheRequest) {
  auto flags = [&](const std::string& id) {
    std::vector<std::string> f = Flags(id);
    f.push_back("--replicas=0");
    // The flusher stays idle: only a reservation that may wait demotes.
    f.push_back("--host_high_watermark=1.0");
    f.push_back("--host_low_watermark=1.0");
    return f;
  };
  DaemonProcess a(flags("node-a"));
  DaemonProcess c(flags("node-c"));
  ASSERT_OK(a.Start());
  ASSERT_OK(c.Start());
  auto ca = a.Connect("tenant");
  auto cc = c.Connect("tenant");
  ASSERT_TRUE(AllSee({ca.get(), cc.get()}, 2));
  ChainHasher hasher("tenant-secret", kTestLayout, 16);
  constexpr size_t kBlockBytes = 256 << 10;
  auto put_chain = [&](Client& cl, uint64_t seed, size_t n) {
    const std::vector<BlockKey> keys = hasher.Hash(Tokens(seed, n * 16));
    auto [blocks, spans] = ChainBlocks(n, seed * 1000, kBlockBytes);
    auto put = cl.PutChain(keys, spans);
    EXPECT_TRUE(put.ok() && put->all_ok());
    return std::make_pair(keys, blocks);
  };
  // Node C's own chain fills its host tier exactly; none of it is on disk.
  auto cs = cc->Stats();
  ASSERT_TRUE(cs.ok());
  const size_t fill = cs->tiers[0].capacity_bytes / kBlockBytes;
  put_chain(*cc, 51, fill);
  cs = cc->Stats();
  ASSERT_TRUE(cs.ok());
  ASSERT_EQ(cs->tiers[0].blocks, fill);
  ASSERT_EQ(cs->tiers[0].demotions, 0u);

  const auto [keys, blocks] = put_chain(*ca, 52, 8);
  auto got = cc->GetBlocks(keys);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE((*got)[i].status.ok()) << i << ": " << (*got)[i].status.ToString();
    EXPECT_EQ((*got)[i].bytes, blocks[i]) << i;
  }
  // Room was made after the request, by demoting C's own blocks.
  cs = cc->Stats();
  ASSERT_TRUE(cs.ok());
  EXPECT_GE(cs->tiers[0].demotions, keys.size());
  // C kept what it fetched: A gone, C still serves the chain, byte for byte.
  a.Kill();
  ASSERT_TRUE(AllSee({cc.get()}, 1));
  got = cc->GetBlocks(keys);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE((*got)[i].status.ok()) << i << ": " << (*got)[i].status.ToString();
    EXPECT_EQ((*got)[i].bytes, blocks[i]) << i;
  }
}

// What a request router asks: which node holds how much of a chain. No replicas, so each node
// holds exactly what was put through it; locate asks every member in one round and promotes
// nothing.
TEST_F(ClusterTest, LocateTellsARouterHowMuchOfAChainEachNodeHolds) {
  auto flags = [&](const std::string& id) {
    std::vector<std::string> f = Flags(id);
    f.push_back("--replicas=0");
    return f;
  };
  DaemonProcess a(flags("node-a"));
  DaemonProcess b(flags("node-b"));
  DaemonProcess c(flags("node-c"));
  ASSERT_OK(a.Start());
  ASSERT_OK(b.Start());
  ASSERT_OK(c.Start());
  auto ca = a.Connect("tenant");
  auto cb = b.Connect("tenant");
  auto cc = c.Connect("tenant");
  ASSERT_TRUE(AllSee({ca.get(), cb.get(), cc.get()}, 3));
  ChainHasher hasher("tenant-secret", kTestLayout, 16);
  const std::vector<BlockKey> keys = hasher.Hash(Tokens(77, 12 * 16));
  auto [blocks, spans] = ChainBlocks(keys.size(), 900, 4096);
  ASSERT_TRUE(ca->PutChain(keys, spans)->all_ok());
  ASSERT_TRUE(cb->PutChain(std::span(keys).first(5), std::span(spans).first(5))->all_ok());

  auto by_node = [](const std::vector<NodeLocation>& nodes) {
    std::map<std::string, NodeLocation> m;
    for (const NodeLocation& n : nodes) m[n.node_id] = n;
    return m;
  };
  auto located = cc->Locate(keys);
  ASSERT_TRUE(located.ok()) << located.status().ToString();
  ASSERT_EQ(located->size(), 3u);
  EXPECT_EQ((*located)[0].node_id, "node-c");
  EXPECT_TRUE((*located)[0].self);
  std::map<std::string, NodeLocation> m = by_node(*located);
  for (const auto& [id, n] : m) {
    EXPECT_TRUE(n.status.ok()) << id << ": " << n.status.ToString();
    EXPECT_EQ(n.control_address.rfind("tcp://127.0.0.1:", 0), 0u) << id;
  }
  EXPECT_EQ(m["node-a"].hit_blocks, keys.size());
  EXPECT_EQ(m["node-b"].hit_blocks, 5u);
  EXPECT_EQ(m["node-c"].hit_blocks, 0u);
  ASSERT_EQ(m["node-b"].tiers.size(), 5u);
  EXPECT_EQ(m["node-b"].tiers[0], Tier::kHost);
  // Locating fetched nothing: C still holds none of the chain (a lookup through C would).
  EXPECT_EQ(cc->Stats()->tiers[0].blocks, 0u);

  // Another tenant's view of the same keys: nothing anywhere.
  auto other = c.Connect("other-tenant");
  auto none = other->Locate(keys);
  ASSERT_TRUE(none.ok());
  for (const NodeLocation& n : *none) EXPECT_EQ(n.hit_blocks, 0u) << n.node_id;

  // B dies: until its lease runs out it is listed without an answer; then it is gone. A's
  // answer is unaffected either way.
  b.Kill();
  auto after = cc->Locate(keys);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  m = by_node(*after);
  EXPECT_EQ(m["node-a"].hit_blocks, keys.size());
  if (m.count("node-b")) {
    EXPECT_FALSE(m["node-b"].status.ok());
  }
  ASSERT_TRUE(AllSee({ca.get(), cc.get()}, 2));
  after = cc->Locate(keys);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->size(), 2u);
  EXPECT_EQ(by_node(*after)["node-a"].hit_blocks, keys.size());
}

TEST_F(ClusterTest, ASessionSavedThroughOneNodeLoadsThroughAnotherWhileItIsDown) {
  DaemonProcess a(Flags("node-a"));
  DaemonProcess b(Flags("node-b"));
  DaemonProcess c(Flags("node-c"));
  ASSERT_OK(a.Start());
  ASSERT_OK(b.Start());
  ASSERT_OK(c.Start());
  auto ca = a.Connect("tenant");
  auto cb = b.Connect("tenant");
  ASSERT_TRUE(AllSee({ca.get(), cb.get()}, 3));
  ChainHasher hasher("tenant-secret", kTestLayout, 16);
  const std::vector<BlockKey> keys = hasher.Hash(Tokens(77, 12 * 16));
  auto [blocks, spans] = ChainBlocks(keys.size(), 900, 30000, /*grow=*/1);
  ASSERT_TRUE(ca->PutChain(keys, spans).ok());
  Session s;
  s.session_id = "conversation-7";
  s.keys = keys;
  s.token_count = 12 * 16;
  s.metadata = {{"user", "alice"}};
  ASSERT_TRUE(ca->SaveSession(s).ok());
  // The copies go out in the background; then node A goes away (SIGTERM: it also leaves).
  std::this_thread::sleep_for(std::chrono::seconds(1));
  EXPECT_OK(a.Stop());
  ASSERT_EQ(Alive(WaitView(
                *cb, [](const ClusterView& v) { return Alive(v) == 2; }, 10)),
            2u);
  auto loaded = cb->LoadSession("conversation-7");
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->session.keys, keys);
  EXPECT_EQ(loaded->session.metadata.at("user"), "alice");
  EXPECT_EQ(loaded->cached_blocks, keys.size());
  auto got = cb->GetBlocks(keys);
  ASSERT_TRUE(got.ok());
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE((*got)[i].status.ok()) << i << ": " << (*got)[i].status.ToString();
    EXPECT_EQ((*got)[i].bytes, blocks[i]) << i;
  }
  // Deleting it through B removes it everywhere it is kept.
  ASSERT_TRUE(cb->DeleteSession("conversation-7").ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  auto cc = c.Connect("tenant");
  EXPECT_TRUE(cc->LoadSession("conversation-7").status().IsNotFound());
}

// Waits (up to 10 s) until a load of `id` through `client` gives `keys` (empty: NotFound).
::testing::AssertionResult Converges(Client& client, const std::string& id,
                                     const std::vector<BlockKey>& keys) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::string last;
  for (;;) {
    auto loaded = client.LoadSession(id, /*prefetch=*/false);
    if (keys.empty() ? loaded.status().IsNotFound() : loaded.ok() && loaded->session.keys == keys) {
      return ::testing::AssertionSuccess();
    }
    last = loaded.ok() ? "a chain of " + std::to_string(loaded->session.keys.size()) + " blocks"
                       : loaded.status().ToString();
    if (std::chrono::steady_clock::now() > until) {
      return ::testing::AssertionFailure()
             << "session " << id << " through " << client.server().node_id << " is " << last
             << ", not " << (keys.empty() ? "deleted" : "the newest save");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

TEST_F(ClusterTest, TheNewestSaveOrDeleteWinsOnEveryNode) {
  DaemonProcess a(Flags("node-a"));
  DaemonProcess b(Flags("node-b"));
  DaemonProcess c(Flags("node-c"));
  ASSERT_OK(a.Start());
  ASSERT_OK(b.Start());
  ASSERT_OK(c.Start());
  auto ca = a.Connect("tenant");
  auto cb = b.Connect("tenant");
  auto cc = c.Connect("tenant");
  ASSERT_TRUE(AllSee({ca.get(), cb.get(), cc.get()}, 3));
  ChainHasher hasher("tenant-secret", kTestLayout, 16);
  auto chain = [&](uint64_t seed, Client& through) {
    const std::vector<BlockKey> keys = hasher.Hash(Tokens(seed, 3 * 16));
    auto [blocks, spans] = ChainBlocks(keys.size(), seed * 10, 4096);
    EXPECT_TRUE(through.PutChain(keys, spans).ok());
    return keys;
  };
  // Several sessions, so that node A (where each is first saved) is a home of some and not of
  // others (it is a home of all ten with a chance of (2/3)^10): a node that is not a home keeps
  // its first copy, which must not win.
  for (int n = 0; n < 10; ++n) {
    const std::string id = "conversation-" + std::to_string(n);
    const std::vector<BlockKey> first = chain(1000 + n, *ca);
    ASSERT_OK(ca->SaveSession({.session_id = id, .keys = first, .token_count = 48}));
    ASSERT_TRUE(Converges(*cc, id, first));
    // Saved again through B: the newer chain wins everywhere, on A too.
    const std::vector<BlockKey> second = chain(2000 + n, *cb);
    ASSERT_OK(cb->SaveSession({.session_id = id, .keys = second, .token_count = 48}));
    for (Client* client : {ca.get(), cb.get(), cc.get()}) {
      EXPECT_TRUE(Converges(*client, id, second));
    }
    // Deleted through C: gone everywhere, and A's first copy does not bring it back.
    ASSERT_OK(cc->DeleteSession(id));
    for (Client* client : {ca.get(), cb.get(), cc.get()}) {
      EXPECT_TRUE(Converges(*client, id, {}));
    }
    // Saved once more after the delete (through A, which held the oldest copy): it is back.
    const std::vector<BlockKey> third = chain(3000 + n, *ca);
    ASSERT_OK(ca->SaveSession({.session_id = id, .keys = third, .token_count = 48}));
    for (Client* client : {ca.get(), cb.get(), cc.get()}) {
      EXPECT_TRUE(Converges(*client, id, third));
    }
  }
  // A client cannot pose as a peer to plant an old copy.
  Session planted;
  planted.session_id = "conversation-0";
  planted.version = UINT64_MAX;
  auto st = ca->SaveSession(planted, SaveSessionOptions{.replica = true});
  EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << st.ToString();
}

// The lines "membership changed: offered N session records (A SESSION_VERSIONS asked); sent S
// ..." of a daemon's log from byte `from` on, as (N, S).
std::vector<std::pair<int, int>> SessionOfferPasses(const std::string& log, size_t from) {
  std::vector<std::pair<int, int>> passes;
  const std::string mark = "membership changed: offered ";
  for (size_t at = log.find(mark, from); at != std::string::npos;
       at = log.find(mark, at + mark.size())) {
    int offered = 0;
    int asked = 0;
    int sent = 0;
    if (std::sscanf(log.c_str() + at + mark.size(),
                    "%d session records (%d SESSION_VERSIONS asked); sent %d", &offered, &asked,
                    &sent) == 3) {
      passes.emplace_back(offered, sent);
    }
  }
  return passes;
}

// The first session offer pass in `daemon`'s log from byte `from` on, waiting up to `seconds`.
std::optional<std::pair<int, int>> NextOfferPass(const DaemonProcess& daemon, size_t from,
                                                 int seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  for (;;) {
    const std::vector<std::pair<int, int>> passes = SessionOfferPasses(daemon.log(), from);
    if (!passes.empty()) return passes.front();
    if (std::chrono::steady_clock::now() >= end) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// The key that picks a session's homes (docs/CLUSTER.md): SHA-256("session" NUL namespace NUL
// id).
BlockKey SessionPlacementKey(const std::string& ns, const std::string& id) {
  std::string bytes = "session";
  bytes += '\0';
  bytes += ns;
  bytes += '\0';
  bytes += id;
  return NamespaceSalt(bytes);
}

// A session id of namespace "tenant" whose two homes (--replicas=1) among node-a, node-b and
// node-c are node-b and node-c.
std::string SessionNotHomedOnA(const std::string& prefix) {
  const daemon::cluster::Ring ring({"node-a", "node-b", "node-c"});
  for (int n = 0;; ++n) {
    const std::string id = prefix + std::to_string(n);
    const std::vector<std::string> homes = ring.Homes(SessionPlacementKey("tenant", id), 2);
    if (std::find(homes.begin(), homes.end(), "node-a") == homes.end()) return id;
  }
}

// A connection to `d` such as a peer daemon makes (the cluster secret and the peers' client
// name, over TCP): a load through it answers the daemon's own record only, and a save with
// `replica` stores the copy as given.
std::unique_ptr<Client> ConnectAsPeer(const DaemonProcess& d) {
  ClientOptions o = d.Options("tenant");
  o.address = d.PrintedAddress("tcp://");
  o.client_name = "kvpool-peer";
  o.cluster_secret = "correct horse battery staple";
  o.data_path = DataPath::kSocket;
  auto c = Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(*c) : nullptr;
}

// Blocks a node fetches from a peer are linked under the parents their put named, whatever order
// its reader asked in (within one fetch), so its evictions stay tail first. (They used to be
// linked under the key asked before them: a chain's blocks asked out of order were linked under
// the wrong ones, and the first block a lookup fetched was linked under none.)
TEST_F(ClusterTest, FetchedBlocksAreLinkedUnderTheParentsTheirPutNamed) {
  DaemonProcess a(Flags("node-a"));
  DaemonProcess b(Flags("node-b"));
  ASSERT_OK(a.Start());
  ASSERT_OK(b.Start());
  auto ca = a.Connect("tenant");
  auto cb = b.Connect("tenant");
  ASSERT_TRUE(AllSee({ca.get(), cb.get()}, 2));
  ChainHasher hasher("tenant-secret", kTestLayout, 16);
  const std::vector<BlockKey> keys = hasher.Hash(Tokens(77, 4 * 16));
  auto [blocks, spans] = ChainBlocks(keys.size(), 770, 4096);
  // A alone holds the chain (a peer's put is not replicated).
  auto peer_a = ConnectAsPeer(a);
  ASSERT_NE(peer_a, nullptr);
  auto put = peer_a->PutChain(keys, spans);
  ASSERT_TRUE(put.ok() && put->all_ok());

  // B's reader asks for the chain's last block, then its first.
  const std::vector<BlockKey> asked{keys[3], keys[0]};
  auto got = cb->GetBlocks(asked);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_TRUE((*got)[0].status.ok() && (*got)[1].status.ok());
  EXPECT_EQ((*got)[0].bytes, blocks[3]);
  EXPECT_EQ((*got)[1].bytes, blocks[0]);
  // The first block is no child of the last: the last has no cached descendant on B.
  auto evicted = cb->Evict(Tier::kDisk, std::vector<BlockKey>{keys[3]});
  ASSERT_TRUE(evicted.ok()) << evicted.status().ToString();
  EXPECT_EQ(evicted->evicted, 1u);
  EXPECT_EQ(evicted->skipped, 0u);

  // A child asked before its parent: the child is stored first (the fetch's first request asks
  // for one block), and linked once the parent is.
  got = cb->GetBlocks(std::vector<BlockKey>{keys[2], keys[1]});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_TRUE((*got)[0].status.ok() && (*got)[1].status.ok());
  evicted = cb->Evict(Tier::kDisk, std::vector<BlockKey>{keys[1]});
  ASSERT_TRUE(evicted.ok()) << evicted.status().ToString();
  EXPECT_EQ(evicted->evicted, 0u);
  EXPECT_EQ(evicted->skipped, 1u) << "a parent went before the child fetched ahead of it";

  // A lookup finds the first three blocks on B and fetches the last: it hangs under them.
  auto looked = cb->Lookup(keys);
  ASSERT_TRUE(looked.ok()) << looked.status().ToString();
  ASSERT_EQ(looked->hit_blocks, keys.size());
  for (const BlockKey& k : {keys[0], keys[1], keys[2]}) {
    evicted = cb->Evict(Tier::kDisk, std::vector<BlockKey>{k});
    ASSERT_TRUE(evicted.ok()) << evicted.status().ToString();
    EXPECT_EQ(evicted->evicted, 0u);
    EXPECT_EQ(evicted->skipped, 1u) << "a block went before its descendants";
  }
  // The whole chain goes tail first.
  evicted = cb->Evict(Tier::kDisk, keys);
  ASSERT_TRUE(evicted.ok()) << evicted.status().ToString();
  EXPECT_EQ(evicted->evicted, keys.size());
}

// A load or delete through a node that holds no copy, while one home answers "none" and the
// other does not answer: the session may be on the silent one. The load says Unavailable, not
// NotFound, and the delete is recorded (OK) so that the silent home's copy does not come back.
TEST_F(ClusterTest, AHomeThatDoesNotAnswerIsNotTakenForOneWithoutTheSession) {
  // C's lease is long: stopped, it stays a member (a home that does not answer) for the test.
  std::vector<std::string> c_flags = Flags("node-c");
  c_flags.push_back("--cluster_lease_seconds=30");
  DaemonProcess a(Flags("node-a"));
  DaemonProcess b(Flags("node-b"));
  DaemonProcess c(c_flags);
  ASSERT_OK(a.Start());
  ASSERT_OK(b.Start());
  ASSERT_OK(c.Start());
  auto ca = a.Connect("tenant");
  auto cb = b.Connect("tenant");
  auto cc = c.Connect("tenant");
  ASSERT_TRUE(AllSee({ca.get(), cb.get(), cc.get()}, 3));
  ChainHasher hasher("tenant-secret", kTestLayout, 16);
  const std::vector<BlockKey> keys = hasher.Hash(Tokens(91, 2 * 16));
  auto [blocks, spans] = ChainBlocks(keys.size(), 910, 4096);
  ASSERT_TRUE(cc->PutChain(keys, spans).ok());
  // C's pass over its sessions for the three joining, if it is still to come, before C holds
  // the session: it would send it to B.
  NextOfferPass(c, 0, 5);
  // C alone holds the session, as a copy a peer sent it (B, its other home, lost its own: a
  // disk replaced, say), with a version and a time C's clock gave a save of another session.
  ASSERT_OK(cc->SaveSession({.session_id = "clock", .keys = keys, .token_count = 32}));
  auto clock = cc->LoadSession("clock", /*prefetch=*/false);
  ASSERT_TRUE(clock.ok()) << clock.status().ToString();
  const std::string id = SessionNotHomedOnA("silent-home-");
  auto peer_c = ConnectAsPeer(c);
  ASSERT_NE(peer_c, nullptr);
  Session copy;
  copy.session_id = id;
  copy.keys = keys;
  copy.token_count = 32;
  copy.created_unix_ms = clock->session.created_unix_ms;
  copy.updated_unix_ms = clock->session.updated_unix_ms;
  copy.version = clock->session.version + 1;
  copy.origin = "node-c";
  ASSERT_OK(peer_c->SaveSession(copy, SaveSessionOptions{.replica = true}));
  // (Read through peer connections, which answer a daemon's own record and repair nothing.)
  LoadSessionOptions own_record;
  own_record.prefetch = false;
  own_record.include_deleted = true;
  ASSERT_TRUE(peer_c->LoadSession(id, own_record).ok());
  auto peer_b = ConnectAsPeer(b);
  ASSERT_NE(peer_b, nullptr);
  ASSERT_TRUE(peer_b->LoadSession(id, own_record).status().IsNotFound());

  ASSERT_EQ(::kill(c.pid(), SIGSTOP), 0);
  auto loaded = ca->LoadSession(id, /*prefetch=*/false);
  const Status deleted = ca->DeleteSession(id);
  ASSERT_EQ(::kill(c.pid(), SIGCONT), 0);
  if (Alive(*ca->Cluster()) != 3) {
    GTEST_SKIP() << "C left A's view while stopped: A then asked B alone";
  }
  EXPECT_EQ(loaded.status().code(), StatusCode::kUnavailable) << loaded.status().ToString();
  EXPECT_NE(loaded.status().message().find("node-c"), std::string::npos)
      << loaded.status().ToString();
  EXPECT_OK(deleted);
  // C's copy does not come back: the deletion reaches both homes and wins on every node.
  for (Client* client : {ca.get(), cb.get(), cc.get()}) EXPECT_TRUE(Converges(*client, id, {}));
  for (const DaemonProcess* home : {&b, &c}) {
    auto peer = ConnectAsPeer(*home);
    ASSERT_NE(peer, nullptr);
    auto own = peer->LoadSession(id, own_record);
    ASSERT_TRUE(own.ok()) << own.status().ToString();
    EXPECT_TRUE(own->session.deleted) << "a home kept the session the delete replaced";
  }
  // With every home answering, a session nowhere is NotFound again, and its delete too.
  EXPECT_TRUE(ca->LoadSession("never-saved", /*prefetch=*/false).status().IsNotFound());
  EXPECT_TRUE(ca->DeleteSession("never-saved").IsNotFound());
}

TEST_F(ClusterTest, SessionsSavedWhileTheirHomesWereDownReachThemWhenTheyComeBack) {
  DaemonProcess a(Flags("node-a"));
  DaemonProcess b(Flags("node-b"));
  DaemonProcess c(Flags("node-c"));
  ASSERT_OK(a.Start());
  ASSERT_OK(b.Start());
  ASSERT_OK(c.Start());
  auto ca = a.Connect("tenant");
  {
    auto cb = b.Connect("tenant");
    auto cc = c.Connect("tenant");
    ASSERT_TRUE(AllSee({ca.get(), cb.get(), cc.get()}, 3));
  }
  b.Kill();
  c.Kill();
  ASSERT_EQ(Alive(WaitView(
                *ca, [](const ClusterView& v) { return Alive(v) == 1; }, 10)),
            1u);
  // Saved through A alone, so no copy reaches a home. Once B and C are back, A is a home of
  // some of the ten and not of others (of all ten with a chance of (2/3)^10): those are found
  // through B and C only if A sends them.
  ChainHasher hasher("tenant-secret", kTestLayout, 16);
  std::vector<std::vector<BlockKey>> chains;
  for (int n = 0; n < 10; ++n) {
    const std::vector<BlockKey> keys = hasher.Hash(Tokens(5000 + n, 2 * 16));
    auto [blocks, spans] = ChainBlocks(keys.size(), n * 10, 4096);
    ASSERT_TRUE(ca->PutChain(keys, spans).ok());
    ASSERT_OK(ca->SaveSession(
        {.session_id = "while-away-" + std::to_string(n), .keys = keys, .token_count = 32}));
    chains.push_back(keys);
  }
  ASSERT_OK(b.Start());
  ASSERT_OK(c.Start());
  auto cb = b.Connect("tenant");
  auto cc = c.Connect("tenant");
  ASSERT_TRUE(AllSee({ca.get(), cb.get(), cc.get()}, 3));
  // Not loaded through A first (a load there would repair its homes): A offers every session it
  // keeps to its homes when the membership changes.
  for (int n = 0; n < 10; ++n) {
    const std::string id = "while-away-" + std::to_string(n);
    EXPECT_TRUE(Converges(*cb, id, chains[n]));
    EXPECT_TRUE(Converges(*cc, id, chains[n]));
  }
}

// A membership change asks each home which session records it lacks or holds older
// (SESSION_VERSIONS) and sends only those: when a home comes back with its disk, only what was
// saved while it was away reaches it. SESSION_VERSIONS is refused to anything but a peer.
TEST_F(ClusterTest, AMembershipChangeSendsOnlyTheSessionsAHomeLacks) {
  DaemonProcess a(Flags("node-a"));
  DaemonProcess b(Flags("node-b"));
  DaemonProcess c(Flags("node-c"));
  ASSERT_OK(a.Start());
  ASSERT_OK(b.Start());
  ASSERT_OK(c.Start());
  auto ca = a.Connect("tenant");
  {
    auto cb = b.Connect("tenant");
    auto cc = c.Connect("tenant");
    ASSERT_TRUE(AllSee({ca.get(), cb.get(), cc.get()}, 3));
  }
  // The pass of the three joining, if it is still to come, before anything is saved.
  NextOfferPass(a, 0, 5);
  wire::SessionVersionsRequest ask;
  ask.add_sessions()->set_session_id("any");
  wire::SessionVersionsResponse answer;
  EXPECT_EQ(client::PeerCall(*ca, ask, &answer).code(), StatusCode::kPermissionDenied);

  ChainHasher hasher("tenant-secret", kTestLayout, 16);
  std::map<std::string, std::vector<BlockKey>> chains;
  auto save = [&](const std::string& id, int n) {
    const std::vector<BlockKey> keys = hasher.Hash(Tokens(7000 + n, 16));
    std::vector<std::vector<uint8_t>> blocks = {BlockBytes(700 + n, 4096)};
    std::vector<std::span<const uint8_t>> spans(blocks.begin(), blocks.end());
    ASSERT_TRUE(ca->PutChain(keys, spans).ok());
    ASSERT_OK(ca->SaveSession({.session_id = id, .keys = keys}));
    chains[id] = keys;
  };
  for (int n = 0; n < 20; ++n) ASSERT_NO_FATAL_FAILURE(save("kept-" + std::to_string(n), n));
  {
    auto cb = b.Connect("tenant");
    auto cc = c.Connect("tenant");
    for (const auto& [id, keys] : chains) {
      ASSERT_TRUE(Converges(*cb, id, keys));
      ASSERT_TRUE(Converges(*cc, id, keys));
    }
  }
  // C leaves; once A has made its pass for that, ten sessions are saved through A (they reach
  // A and B), and C comes back with its disk.
  const size_t before_kill = a.log().size();
  c.Kill();
  ASSERT_EQ(Alive(WaitView(
                *ca, [](const ClusterView& v) { return Alive(v) == 2; }, 20)),
            2u);
  ASSERT_TRUE(NextOfferPass(a, before_kill, 30).has_value()) << "no offer pass after C left";
  for (int n = 0; n < 10; ++n) ASSERT_NO_FATAL_FAILURE(save("away-" + std::to_string(n), 100 + n));
  const size_t a_mark = a.log().size();
  const size_t b_mark = b.log().size();
  ASSERT_OK(c.Start());
  auto cc = c.Connect("tenant");
  ASSERT_TRUE(AllSee({ca.get(), cc.get()}, 3));
  const std::optional<std::pair<int, int>> from_a = NextOfferPass(a, a_mark, 30);
  const std::optional<std::pair<int, int>> from_b = NextOfferPass(b, b_mark, 30);
  ASSERT_TRUE(from_a.has_value() && from_b.has_value()) << "no offer pass after C came back";
  EXPECT_EQ(from_a->first, 30) << "A keeps all 30 records";
  // Only sessions saved while C was away can be missing there (A and B may both send one);
  // every record to every home would be 30 or more from A alone.
  EXPECT_GE(from_a->second + from_b->second, 1) << "nothing reached C";
  EXPECT_LE(from_a->second, 10);
  EXPECT_LE(from_b->second, 10);
  for (const auto& [id, keys] : chains) EXPECT_TRUE(Converges(*cc, id, keys));
}

TEST_F(ClusterTest, ANodeKilledUnderLoadCostsOnlyMissesAndRejoinsWithItsDisk) {
  std::vector<std::string> a_flags = Flags("node-a");
  a_flags.push_back("--write_policy=write-through");  // A's blocks are on its disk at once
  DaemonProcess a(a_flags);
  DaemonProcess b(Flags("node-b"));
  DaemonProcess c(Flags("node-c"));
  ASSERT_OK(a.Start());
  ASSERT_OK(b.Start());
  ASSERT_OK(c.Start());
  {
    auto ca = a.Connect("tenant");
    ASSERT_TRUE(AllSee({ca.get()}, 3));
  }
  ChainHasher hasher("tenant-secret", kTestLayout, 16);
  const std::vector<BlockKey> keys = hasher.Hash(Tokens(99, 30 * 16));
  std::vector<std::vector<uint8_t>> blocks;
  for (size_t i = 0; i < keys.size(); ++i) blocks.push_back(BlockBytes(300 + i, 50000));
  {
    auto ca = a.Connect("tenant");
    std::vector<std::span<const uint8_t>> spans(blocks.begin(), blocks.end());
    auto put = ca->PutChain(keys, spans);
    ASSERT_TRUE(put.ok() && put->all_ok());
  }
  // Clients on B and C read the chain while A is killed.
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> calls{0}, call_errors{0}, wrong{0};
  std::atomic<int64_t> worst_us{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&, t] {
      auto cl = (t % 2 == 0 ? b : c).Connect("tenant");
      while (!stop) {
        const auto start = std::chrono::steady_clock::now();
        auto got = cl->GetBlocks(keys);
        const int64_t us = std::chrono::duration_cast<std::chrono::microseconds>(
                               std::chrono::steady_clock::now() - start)
                               .count();
        int64_t prev = worst_us.load();
        while (us > prev && !worst_us.compare_exchange_weak(prev, us)) {
        }
        ++calls;
        if (!got.ok()) {
          ++call_errors;
          continue;
        }
        for (size_t i = 0; i < keys.size(); ++i) {
          if ((*got)[i].status.ok() && (*got)[i].bytes != blocks[i]) ++wrong;
        }
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  a.Kill();
  std::this_thread::sleep_for(std::chrono::seconds(3));
  stop = true;
  for (auto& r : readers) r.join();
  EXPECT_GT(calls.load(), 8u);
  EXPECT_EQ(call_errors.load(), 0u) << "a call failed instead of reporting misses";
  EXPECT_EQ(wrong.load(), 0u);
  // A dead node costs at most its peer deadline (500 ms) per round that reaches it.
  EXPECT_LT(worst_us.load(), 2'000'000) << "a reader waited on the dead node";

  // A restarts on its data dir, rejoins, and serves the chain from its own disk.
  ASSERT_OK(a.Start());
  auto ca = a.Connect("tenant");
  ASSERT_TRUE(AllSee({ca.get()}, 3));
  auto l = ca->Lookup(keys, /*prefetch=*/false);
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->hit_blocks, keys.size());
  for (Tier tier : l->tiers) EXPECT_EQ(tier, Tier::kDisk);
  auto got = ca->GetBlocks(keys);
  ASSERT_TRUE(got.ok());
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ((*got)[i].bytes, blocks[i]) << i;
}

// A replica push that fails (its peer stopped for a moment, less than the membership lease: no
// membership change follows) is tried again a little later, rather than left to the next
// membership change, which may never come.
TEST_F(ClusterTest, AReplicaPushThatFailsIsTriedAgain) {
  std::vector<std::string> a_flags = Flags("node-a");
  a_flags.push_back("--metrics_listen=127.0.0.1:0");
  DaemonProcess a(a_flags);
  DaemonProcess b(Flags("node-b"));
  ASSERT_OK(a.Start());
  ASSERT_OK(b.Start());
  auto ca = a.Connect("tenant");
  auto cb = b.Connect("tenant");
  ASSERT_TRUE(AllSee({ca.get(), cb.get()}, 2));
  auto committed_on_b = [&] {
    auto s = cb->Stats();
    return s.ok() ? s->puts_committed : 0;
  };
  ChainHasher hasher("tenant-secret", kTestLayout, 16);
  const std::vector<uint8_t> bytes = BlockBytes(56, 20000);
  auto put_chain = [&](uint64_t seed, size_t blocks) {
    const std::vector<BlockKey> keys = hasher.Hash(Tokens(seed, blocks * 16));
    std::vector<std::span<const uint8_t>> spans(keys.size(), std::span<const uint8_t>(bytes));
    auto put = ca->PutChain(keys, spans);
    return put.ok() && put->all_ok();
  };
  // A first chain reaches B (and leaves A a pooled connection to it).
  ASSERT_TRUE(put_chain(1, 4));
  for (int i = 0; i < 100 && committed_on_b() < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(committed_on_b(), 4u);
  auto membership_changes = [&] {
    const std::string log = a.log();
    size_t n = 0;
    for (size_t at = log.find("membership changed: offered"); at != std::string::npos;
         at = log.find("membership changed: offered", at + 1)) {
      ++n;
    }
    return n;
  };
  // The view's first change (B joining) offers A's blocks to B once, a second after it: let
  // that pass first, so that only a retry can copy the next chain.
  for (int i = 0; i < 200 && membership_changes() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const size_t changes_before = membership_changes();
  // B stops answering for 800 ms: A's push of the next chain times out (500 ms a request).
  ASSERT_EQ(::kill(b.pid(), SIGSTOP), 0);
  const bool put = put_chain(2, 6);
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  ASSERT_EQ(::kill(b.pid(), SIGCONT), 0);
  ASSERT_TRUE(put);
  for (int i = 0; i < 200 && committed_on_b() < 10; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (committed_on_b() < 10 && membership_changes() != changes_before) {
    GTEST_SKIP() << "B left the membership view while stopped (a loaded machine): the rescan, "
                    "not a retry, was what had to copy the chain";
  }
  EXPECT_EQ(committed_on_b(), 10u) << "the failed push was not tried again; A's log:\n"
                                   << a.LogTail();
  // Operators see it (Prometheus), not only the log.
  const std::string metrics = a.ScrapeMetrics();
  EXPECT_NE(metrics.find("# TYPE kvpool_replication_retries_total counter"), std::string::npos);
  EXPECT_EQ(metrics.find("kvpool_replication_retries_total 0\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("kvpool_replication_dropped_total{reason=\"attempts\"} 0\n"),
            std::string::npos)
      << metrics;
}

TEST_F(ClusterTest, WhenANodeLeavesItsBlocksAreCopiedAgainToKeepReplicasPlusOne) {
  DaemonProcess a(Flags("node-a"));
  DaemonProcess b(Flags("node-b"));
  DaemonProcess c(Flags("node-c"));
  ASSERT_OK(a.Start());
  ASSERT_OK(b.Start());
  ASSERT_OK(c.Start());
  auto ca = a.Connect("tenant");
  auto cb = b.Connect("tenant");
  auto cc = c.Connect("tenant");
  ASSERT_TRUE(AllSee({ca.get(), cb.get(), cc.get()}, 3));
  ChainHasher hasher("tenant-secret", kTestLayout, 16);
  const std::vector<BlockKey> keys = hasher.Hash(Tokens(55, 40 * 16));
  const std::vector<uint8_t> bytes = BlockBytes(55, 20000);
  std::vector<std::span<const uint8_t>> spans(keys.size(), std::span<const uint8_t>(bytes));
  ASSERT_TRUE(ca->PutChain(keys, spans).ok());
  // --replicas=1: each block on A and one of B or C.
  auto host_blocks = [](Client& cl) {
    auto s = cl.Stats();
    return s.ok() ? s->tiers[0].blocks : 0;
  };
  for (int i = 0; i < 50 && host_blocks(*cb) + host_blocks(*cc) < keys.size(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // (At least: on a loaded machine a member can drop out of A's view for a moment, and the
  // blocks then pushed to the other one stay there too.)
  ASSERT_GE(host_blocks(*cb) + host_blocks(*cc), keys.size());
  ASSERT_LT(host_blocks(*cb), keys.size()) << "the test needs copies split between B and C";
  // A dies: B and C notice, and each copies its blocks to the other.
  a.Kill();
  for (int i = 0; i < 100 && (host_blocks(*cb) < keys.size() || host_blocks(*cc) < keys.size());
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(host_blocks(*cb), keys.size());
  EXPECT_EQ(host_blocks(*cc), keys.size());
}

// Peers over TLS: each node's certificate is presented to the others and verified with the
// cluster's CA; a node that trusts another CA cannot take blocks from them (misses, not errors).
TEST_F(ClusterTest, PeersSpeakTlsAndVerifyEachOthersCertificates) {
  Result<TestCertificates> certs = WriteTestCertificates(dir_.path());
  ASSERT_OK(certs.status());
  auto tls_flags = [&](const std::string& id, const std::string& ca) {
    std::vector<std::string> f = Flags(id);
    f.insert(f.end(), {"--tls_cert=" + certs->server_cert, "--tls_key=" + certs->server_key,
                       "--tls_ca=" + ca});
    return f;
  };
  DaemonProcess a(tls_flags("node-a", certs->ca_cert));
  DaemonProcess b(tls_flags("node-b", certs->ca_cert));
  DaemonProcess c(tls_flags("node-c", certs->other_ca_cert));
  ASSERT_OK(a.Start());
  ASSERT_OK(b.Start());
  ASSERT_OK(c.Start());
  auto ca = a.Connect("tenant");
  auto cb = b.Connect("tenant");
  auto cc = c.Connect("tenant");
  ASSERT_TRUE(AllSee({ca.get(), cb.get(), cc.get()}, 3));
  auto view = ca->Cluster();
  ASSERT_OK(view.status());
  for (const ClusterMember& m : view->members) {
    EXPECT_EQ(m.control_address.rfind("tls://127.0.0.1:", 0), 0u) << m.control_address;
  }

  ChainHasher hasher("tenant-secret", kTestLayout, 16);
  const std::vector<BlockKey> keys = hasher.Hash(Tokens(43, 8 * 16));
  auto [blocks, spans] = ChainBlocks(keys.size(), 900, 32768, /*grow=*/1);
  auto put = ca->PutChain(keys, spans);
  ASSERT_TRUE(put.ok() && put->all_ok());

  // B takes the chain from A over TLS, byte for byte.
  auto got = cb->GetBlocks(keys);
  ASSERT_OK(got.status());
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_OK((*got)[i].status);
    EXPECT_EQ((*got)[i].bytes, blocks[i]) << i;
  }
  // C cannot verify A's or B's certificate: nothing reaches it from them.
  auto lc = cc->Lookup(keys);
  ASSERT_OK(lc.status());
  EXPECT_EQ(lc->hit_blocks, 0u);
}

TEST_F(ClusterTest, ClusterModeNeedsASecretAndATcpListener) {
  // Without --listen the daemon refuses to start, saying why.
  const std::string kvpoold = DefaultKvpooldPath();
  const std::string cmd = kvpoold + " --data_dir=" + dir_.path() + "/d --socket=" + dir_.path() +
                          "/s.sock --host_capacity=64MiB --host_segment_size=1MiB "
                          "--lock_memory=false --cluster=" +
                          etcd_->endpoint() + " --cluster_secret=a-long-enough-secret 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int st = pclose(p);
  EXPECT_NE(st, 0);
  EXPECT_NE(out.find("--listen"), std::string::npos) << out;
  // A lease outside 1-60 s is refused before anything starts, saying so.
  std::vector<std::string> flags = Flags("node-x");
  flags.push_back("--cluster_lease_seconds=0");
  DaemonProcess bad_lease(flags);
  const Status started = bad_lease.Start();
  EXPECT_FALSE(started.ok());
  EXPECT_NE(bad_lease.log().find("--cluster_lease_seconds=0 must be 1-60"), std::string::npos)
      << bad_lease.log();
}

// A block read from its lossy (int8) disk copy comes back as approximate bytes and says so
// (lossy_encoding). Another node fetching it must not store those bytes as the block that was
// put: through that node it is a miss, never approximate bytes reported exact.
TEST_F(ClusterTest, AnApproximateBlockIsNeverStoredAsTheBlockOnAnotherNode) {
  const std::string ns_file = dir_.path() + "/ns.yaml";
  std::ofstream(ns_file) << "namespaces:\n  small-model:\n    encoding: int8\n    lossy: true\n"
                            "    layout: {layers: 2, kv_heads: 2, head_dim: 64, tokens: 16, "
                            "dtype: fp16}\n";
  std::vector<std::string> fa = Flags("node-a");
  std::vector<std::string> fb = Flags("node-b");
  for (auto* f : {&fa, &fb}) {
    f->push_back("--namespaces_file=" + ns_file);
    f->push_back("--replicas=0");
  }
  DaemonProcess a(fa), b(fb);
  ASSERT_OK(a.Start());
  ASSERT_OK(b.Start());
  auto ca = a.Connect("small-model");
  auto cb = b.Connect("small-model");
  ASSERT_TRUE(AllSee({ca.get(), cb.get()}, 2));
  const size_t raw = 2 * 2 * 2 * 64 * 16 * 2;  // layers x (K, V) x heads x head_dim x tokens x fp16
  ChainHasher hasher("secret", kTestLayout, 16);
  const std::vector<BlockKey> keys = hasher.Hash(Tokens(5, 16));
  std::vector<uint8_t> block(raw);
  for (size_t i = 0; i < block.size(); i += 2) {
    const uint16_t h = kernels::FloatToHalf(static_cast<float>((i * 37) % 200) / 50.0f - 2.0f);
    std::memcpy(block.data() + i, &h, 2);
  }
  std::vector<std::span<const uint8_t>> spans{block};
  auto put = ca->PutChain(keys, spans);
  ASSERT_TRUE(put.ok() && put->all_ok());
  ASSERT_OK(ca->Evict(Tier::kHost, keys).status());  // demoted: encoded on disk
  auto on_a = ca->GetBlocks(keys);
  ASSERT_OK(on_a.status());
  ASSERT_OK((*on_a)[0].status);
  ASSERT_NE((*on_a)[0].lossy_encoding, 0) << "the test needs an approximate read on A";
  ASSERT_NE((*on_a)[0].bytes, block);
  for (int round = 0; round < 2; ++round) {
    auto on_b = cb->GetBlocks(keys);
    ASSERT_OK(on_b.status());
    const auto& r = (*on_b)[0];
    if (r.status.ok()) {
      EXPECT_TRUE(r.lossy_encoding != 0 || r.bytes == block)
          << "round " << round << ": approximate bytes served through B as exact";
    }
  }
  auto stats = cb->Stats();
  ASSERT_OK(stats.status());
  EXPECT_EQ(stats->puts_committed, 0u) << "B stored the approximate bytes";
}

}  // namespace
}  // namespace kvpool::testing
