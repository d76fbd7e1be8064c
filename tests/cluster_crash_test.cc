// Crash test across a three-node cluster (a real etcd and three kvpoold processes on loopback):
// each cycle a writer per node puts chains (write-through: a put that returns OK is on that
// node's disk) and a session saver saves and deletes sessions through a node chosen at random,
// while readers on every node read back what was acknowledged, remote hits included; then one
// node, chosen at random, is killed with SIGKILL, the others keep working a moment, and it is
// restarted on its data and rejoins.
//
// After each rejoin: every acknowledged block is served byte for byte through every node (from
// its own tiers or fetched from a peer); every acknowledged session save or delete holds, first
// through the node that took it (its copy is on that node's disk), then, once that load has
// repaired the homes, through every node. No read, ever, may return bytes other than those put.
//
// Cycles: $KVPOOL_CLUSTER_CRASH_CYCLES (default 4, the CI run; docs/RELIABILITY.md records
// longer runs). Seed: $KVPOOL_CRASH_SEED (default: from the clock; printed).

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "tests/support/daemon_process.h"
#include "tests/support/etcd_test_server.h"
#include "tests/support/status_matchers.h"
#include "tests/support/temp_dir.h"

namespace kvpool::testing {
namespace {

using namespace std::chrono_literals;

constexpr uint32_t kTokensPerBlock = 16;
constexpr int kNodes = 3;

size_t SizeOf(const BlockKey& key) { return 1024 + SeedOf(key) % (24 * 1024); }

// Chain n of writer `stream`: keys from tokens unique to both; sizes and bytes from the keys.
std::vector<BlockKey> ChainOf(uint64_t stream, uint64_t n, size_t blocks) {
  ChainHasher hasher("cluster-crash-" + std::to_string(stream), "model=cc;dtype=bf16",
                     kTokensPerBlock);
  std::vector<int32_t> tokens(blocks * kTokensPerBlock);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>((n * 1000003 + i) % 128000);
  }
  return hasher.Hash(tokens);
}

struct Ledger {
  std::mutex mu;
  std::vector<BlockKey> blocks;  // acknowledged write-through puts
  // Session id -> the versions it may hold (nullopt: deleted), and the node that took the last
  // acknowledged save or delete.
  std::map<std::string, std::vector<std::optional<std::vector<BlockKey>>>> sessions;
  std::map<std::string, int> taken_by;
  std::atomic<uint64_t> wrong{0}, acks{0};
  // Verification reads that failed outright (a timeout): retried on a new connection, and
  // printed, since a read that takes seconds is a fault of its own (no timing is asserted).
  std::atomic<uint64_t> failed_reads{0};
};

class ClusterCrashTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto etcd = EtcdTestServer::Start();
    if (!etcd.ok() && etcd.status().IsNotFound()) {
      GTEST_SKIP() << "no etcd binary: " << etcd.status().ToString();
    }
    ASSERT_TRUE(etcd.ok()) << etcd.status().ToString();
    etcd_ = std::move(*etcd);
    const std::string secret = dir_.path() + "/secret";
    std::ofstream(secret) << "correct horse battery staple\n";
    chmod(secret.c_str(), 0600);
    for (int i = 0; i < kNodes; ++i) {
      nodes_[i] = std::make_unique<DaemonProcess>(std::vector<std::string>{
          "--cluster=" + etcd_->endpoint(), "--cluster_name=crash",
          "--node_id=node-" + std::to_string(i), "--cluster_secret_file=" + secret,
          "--listen=tcp://127.0.0.1:0", "--ucx_transports=tcp", "--ucx_net_devices=lo",
          "--write_policy=write-through"});
      ASSERT_OK(nodes_[i]->Start());
    }
    ASSERT_TRUE(AllAlive());
  }

  // Every node sees all three alive (within 15 s).
  bool AllAlive() {
    for (auto& n : nodes_) {
      auto c = n->Connect("crash");
      if (c == nullptr) return false;
      bool ok = false;
      for (int i = 0; i < 150 && !ok; ++i) {
        auto v = c->Cluster();
        size_t alive = 0;
        if (v.ok()) {
          for (const ClusterMember& m : v->members) alive += m.state == "alive";
        }
        ok = alive == kNodes;
        if (!ok) std::this_thread::sleep_for(100ms);
      }
      if (!ok) return false;
    }
    return true;
  }

  std::unique_ptr<Client> Connect(int node) {
    ClientOptions o = nodes_[node]->Options("crash");
    o.timeout = 3000ms;
    o.auto_reconnect = false;
    auto c = Client::Connect(o);
    return c.ok() ? std::move(*c) : nullptr;
  }

  // Reads `keys` through `node`; every hit must be exact. Returns the hits (0 when the call
  // failed: the node may be dying).
  size_t Check(Client& c, const std::vector<BlockKey>& keys, Status* failed = nullptr) {
    auto got = c.GetBlocks(keys);
    if (!got.ok()) {
      if (failed != nullptr) *failed = got.status();
      return 0;
    }
    size_t hits = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!(*got)[i].status.ok()) continue;
      ++hits;
      if ((*got)[i].bytes != BlockBytes(SeedOf(keys[i]), SizeOf(keys[i]))) {
        ++ledger_.wrong;
        ADD_FAILURE() << "block " << keys[i].ShortHex() << " came back with other bytes";
      }
    }
    return hits;
  }

  void Writer(int node, uint64_t cycle, std::mt19937_64 rng) {
    auto c = Connect(node);
    if (c == nullptr) return;
    for (uint64_t n = 0; !stop_; ++n) {
      const std::vector<BlockKey> keys = ChainOf(cycle * 16 + node, n, 1 + rng() % 4);
      std::vector<std::vector<uint8_t>> bytes;
      std::vector<std::span<const uint8_t>> spans;
      for (const BlockKey& k : keys) bytes.push_back(BlockBytes(SeedOf(k), SizeOf(k)));
      for (const auto& b : bytes) spans.emplace_back(b);
      auto r = c->PutChain(keys, spans);
      if (!r.ok()) return;  // the node is gone
      std::lock_guard<std::mutex> lock(ledger_.mu);
      for (size_t i = 0; i < keys.size(); ++i) {
        if (r->errors.size() == keys.size() && r->errors[i].ok()) {
          ledger_.blocks.push_back(keys[i]);
          ++ledger_.acks;
        }
      }
    }
  }

  void Reader(int node, std::mt19937_64 rng) {
    auto c = Connect(node);
    if (c == nullptr) return;
    while (!stop_) {
      std::vector<BlockKey> keys;
      {
        std::lock_guard<std::mutex> lock(ledger_.mu);
        for (int i = 0; i < 8 && !ledger_.blocks.empty(); ++i) {
          keys.push_back(ledger_.blocks[rng() % ledger_.blocks.size()]);
        }
      }
      if (keys.empty()) {
        std::this_thread::sleep_for(5ms);
        continue;
      }
      Check(*c, keys);
    }
  }

  // Saves (a chain of its own writer's blocks) and deletes sessions through random nodes.
  void SessionSaver(uint64_t cycle, std::mt19937_64 rng) {
    for (uint64_t n = 0; !stop_; ++n) {
      const int node = static_cast<int>(rng() % kNodes);
      auto c = Connect(node);
      if (c == nullptr) {
        std::this_thread::sleep_for(20ms);
        continue;
      }
      const std::string id = "s-" + std::to_string(rng() % 12);
      const bool remove = rng() % 4 == 0;
      std::optional<std::vector<BlockKey>> next;
      if (!remove) {
        next = ChainOf(1000 + cycle, n, 1 + rng() % 3);
        std::vector<std::vector<uint8_t>> bytes;
        std::vector<std::span<const uint8_t>> spans;
        for (const BlockKey& k : *next) bytes.push_back(BlockBytes(SeedOf(k), SizeOf(k)));
        for (const auto& b : bytes) spans.emplace_back(b);
        auto p = c->PutChain(*next, spans);
        if (!p.ok() || !p->all_ok()) continue;
      }
      {
        std::lock_guard<std::mutex> lock(ledger_.mu);
        auto& v = ledger_.sessions[id];
        if (v.empty()) v.push_back(std::nullopt);
        v.push_back(next);  // in flight: may or may not land
      }
      Status st;
      if (remove) {
        // NotFound: neither this node nor the session's homes hold a live copy. (Another node
        // may: an acknowledged save reaches the homes in the background. So NotFound changes
        // nothing, unlike on one daemon.)
        st = c->DeleteSession(id);
      } else {
        Session s;
        s.session_id = id;
        s.keys = *next;
        s.token_count = next->size() * kTokensPerBlock;
        st = c->SaveSession(s);
      }
      std::lock_guard<std::mutex> lock(ledger_.mu);
      auto& v = ledger_.sessions[id];
      if (st.ok()) {
        v = {next};
        ledger_.taken_by[id] = node;
        ++ledger_.acks;
      } else if (st.code() != StatusCode::kUnavailable &&
                 st.code() != StatusCode::kDeadlineExceeded) {
        v.pop_back();  // refused: it did not happen
      }
    }
  }

  // After a rejoin: every acknowledged block through every node, every session through the node
  // that took it and then through every node. Misses are retried for a few seconds (a peer that
  // just came back may still be skipped by the others' fetch memory); wrong bytes never are.
  void Verify() {
    std::vector<BlockKey> blocks;
    std::map<std::string, std::vector<std::optional<std::vector<BlockKey>>>> sessions;
    std::map<std::string, int> taken_by;
    {
      std::lock_guard<std::mutex> lock(ledger_.mu);
      blocks = ledger_.blocks;
      sessions = ledger_.sessions;
      taken_by = ledger_.taken_by;
    }
    for (int node = 0; node < kNodes; ++node) {
      auto c = Connect(node);
      ASSERT_NE(c, nullptr) << "node " << node;
      for (size_t i = 0; i < blocks.size(); i += 64) {
        const std::vector<BlockKey> batch(blocks.begin() + i,
                                          blocks.begin() + std::min(blocks.size(), i + 64));
        size_t hits = 0;
        Status failed;
        for (int attempt = 0; attempt < 50 && hits < batch.size(); ++attempt) {
          if (attempt > 0) std::this_thread::sleep_for(100ms);
          if (c == nullptr || !failed.ok()) c = Connect(node);  // a failed call closed it
          failed = Status::OK();
          if (c != nullptr) hits = Check(*c, batch, &failed);
          if (!failed.ok()) ++ledger_.failed_reads;
        }
        ASSERT_EQ(hits, batch.size())
            << "node " << node << " lost acknowledged blocks; the last read: "
            << (failed.ok() ? std::string("answered") : failed.ToString()) << "; the node's log:\n"
            << nodes_[node]->LogTail();
      }
    }
    auto matches = [](const Result<LoadedSession>& got,
                      const std::vector<std::optional<std::vector<BlockKey>>>& allowed) {
      for (const auto& a : allowed) {
        if (!a.has_value() && got.status().IsNotFound()) return true;
        if (a.has_value() && got.ok() && got->session.keys == *a) return true;
      }
      return false;
    };
    for (const auto& [id, allowed] : sessions) {
      const auto by = taken_by.find(id);
      std::vector<int> order;
      if (by != taken_by.end()) order.push_back(by->second);
      for (int n = 0; n < kNodes; ++n) order.push_back(n);
      for (int node : order) {
        auto c = Connect(node);
        ASSERT_NE(c, nullptr);
        Result<LoadedSession> got = Status::Unavailable("not loaded");
        for (int attempt = 0; attempt < 30; ++attempt) {
          if (attempt > 0) std::this_thread::sleep_for(100ms);
          got = c->LoadSession(id, /*prefetch=*/false);
          if (matches(got, allowed)) break;
        }
        if (!matches(got, allowed)) {
          std::string want;
          for (const auto& a : allowed) {
            want += a.has_value()
                        ? std::to_string(a->size()) + " blocks (" + a->front().ShortHex() + "...), "
                        : std::string("deleted, ");
          }
          FAIL() << "session " << id << " through node " << node << " (taken by node "
                 << (by != taken_by.end() ? by->second : -1) << "): "
                 << (got.ok() ? std::to_string(got->session.keys.size()) + " blocks (" +
                                    got->session.keys.front().ShortHex() + "..., version " +
                                    std::to_string(got->session.version) + " from " +
                                    got->session.origin + ")"
                              : got.status().ToString())
                 << "; allowed: " << want;
        }
      }
      // Settled: the session now holds what the node that took it answered.
      Result<LoadedSession> settled = Connect(order.front())->LoadSession(id, false);
      std::lock_guard<std::mutex> lock(ledger_.mu);
      if (settled.ok()) {
        ledger_.sessions[id] = {settled->session.keys};
      } else if (settled.status().IsNotFound()) {
        ledger_.sessions[id] = {std::nullopt};
      }
    }
  }

  TempDir dir_{"kvpool-cluster-crash"};
  std::unique_ptr<EtcdTestServer> etcd_;
  std::array<std::unique_ptr<DaemonProcess>, kNodes> nodes_;
  Ledger ledger_;
  std::atomic<bool> stop_{false};
};

TEST_F(ClusterCrashTest, KillingOneNodeACycleLosesNothingAcknowledged) {
  const uint64_t cycles = EnvOr("KVPOOL_CLUSTER_CRASH_CYCLES", 4);
  const uint64_t seed = EnvOr("KVPOOL_CRASH_SEED", std::random_device()());
  std::printf("cluster crash test: %llu cycles, seed %llu\n", (unsigned long long)cycles,
              (unsigned long long)seed);
  std::mt19937_64 rng(seed);
  for (uint64_t cycle = 0; cycle < cycles; ++cycle) {
    stop_ = false;
    std::vector<std::thread> threads;
    for (int node = 0; node < kNodes; ++node) {
      threads.emplace_back(
          [this, node, cycle, r = rng()] { Writer(node, cycle, std::mt19937_64(r)); });
      threads.emplace_back([this, node, r = rng()] { Reader(node, std::mt19937_64(r)); });
    }
    threads.emplace_back([this, cycle, r = rng()] { SessionSaver(cycle, std::mt19937_64(r)); });
    std::this_thread::sleep_for(std::chrono::milliseconds(800 + rng() % 1500));
    const int victim = static_cast<int>(rng() % kNodes);
    nodes_[victim]->Kill();
    std::this_thread::sleep_for(std::chrono::milliseconds(300 + rng() % 700));
    stop_ = true;
    for (auto& t : threads) t.join();
    ASSERT_OK(nodes_[victim]->Start());
    ASSERT_TRUE(AllAlive()) << "node " << victim << " did not rejoin";
    Verify();
    if (HasFatalFailure()) return;
    std::printf(
        "cycle %llu: killed node-%d; %zu blocks and %zu sessions verified on every node (%llu "
        "reads failed and were retried)\n",
        (unsigned long long)cycle, victim, ledger_.blocks.size(), ledger_.sessions.size(),
        (unsigned long long)ledger_.failed_reads.load());
  }
  std::printf("cluster crash test: %llu acknowledgements, %zu blocks, %llu wrong reads\n",
              (unsigned long long)ledger_.acks.load(), ledger_.blocks.size(),
              (unsigned long long)ledger_.wrong.load());
  EXPECT_EQ(ledger_.wrong.load(), 0u);
  EXPECT_GT(ledger_.acks.load(), 0u);
}

}  // namespace
}  // namespace kvpool::testing
