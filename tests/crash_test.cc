// Crash test: writers, session savers and readers run against a real kvpoold that is killed with
// SIGKILL at a random moment, then restarted on the same data; every acknowledged session and
// every block acknowledged as durable must come back byte for byte, a session deleted with an
// acknowledgement must stay deleted, and no read, before or after a crash, may ever return
// bytes other than those put.
//
// What counts as acknowledged as durable (README, "What survives what"): a put that returned OK
// in a write-through namespace (the block is on disk before the put returns), and a session save
// that returned OK (the record is synced and its blocks are on disk). Host-only blocks of a
// write-back namespace may be lost to a kill; they are only checked never to be wrong.
//
// Cycles: $KVPOOL_CRASH_CYCLES (default 20, the CI run; docs/RELIABILITY.md records longer runs).
// Seed: $KVPOOL_CRASH_SEED (default: from the clock; printed, so a failure can be replayed).

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "tests/support/daemon_process.h"
#include "tests/support/status_matchers.h"

namespace kvpool::testing {
namespace {

constexpr uint32_t kTokensPerBlock = 16;
constexpr const char* kLayout = "model=crash-test;dtype=bf16";

struct Chain {
  std::vector<BlockKey> keys;
  std::vector<size_t> sizes;
};

// A chain of `blocks` blocks, sizes 1-32 KiB, unique to (`stream`, `n`).
Chain MakeChain(uint64_t stream, uint64_t n, size_t blocks, std::mt19937_64& rng) {
  ChainHasher hasher("crash-" + std::to_string(stream), kLayout, kTokensPerBlock);
  std::vector<int32_t> tokens(blocks * kTokensPerBlock);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>((n * 1000003 + i) % 128000);
  }
  Chain c;
  c.keys = hasher.Hash(tokens);
  std::uniform_int_distribution<size_t> size(1024, 32 * 1024);
  for (size_t i = 0; i < c.keys.size(); ++i) c.sizes.push_back(size(rng));
  return c;
}

// What the daemon acknowledged, shared by the workload threads and the checks.
struct Ledger {
  std::mutex mu;
  // Write-through puts that returned OK: size, and the cycle that acknowledged them; and their
  // keys in order, to pick from at random.
  struct Durable {
    size_t size;
    uint64_t cycle;
  };
  std::map<BlockKey, Durable> durable_blocks;
  std::vector<BlockKey> durable_order;
  // Per session id: the versions it may hold now. Exactly one after an acknowledged save or
  // delete (nullopt: deleted); an unacknowledged save or delete (in flight at the kill) adds
  // the version it would make, since it may or may not have landed.
  std::map<std::string, std::vector<std::optional<Chain>>> sessions;
  std::atomic<uint64_t> wrong_bytes{0};
  std::atomic<uint64_t> acks{0};
};

// Reads `keys` (sizes from the ledger) and checks that every hit is exactly what was put.
// Returns the number of hits; failures of the call itself are ignored (the daemon may be dying).
size_t CheckReads(Client& client, const std::vector<BlockKey>& keys,
                  const std::vector<size_t>& sizes, Ledger& ledger) {
  std::vector<std::vector<uint8_t>> out(keys.size());
  std::vector<MutableBuffer> bufs(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    out[i].assign(sizes[i], 0);
    bufs[i] = {out[i].data(), out[i].size()};
  }
  auto r = client.Get(keys, bufs);
  if (!r.ok()) return 0;
  size_t hits = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!(*r)[i].status.ok()) continue;
    ++hits;
    if ((*r)[i].size != sizes[i] || out[i] != BlockBytes(SeedOf(keys[i]), sizes[i])) {
      ++ledger.wrong_bytes;
      ADD_FAILURE() << "block " << keys[i].ShortHex() << " came back with other bytes";
    }
  }
  return hits;
}

class Workload {
 public:
  Workload(const DaemonProcess& d, Ledger& ledger, uint64_t seed, uint64_t cycle)
      : d_(d), ledger_(ledger), seed_(seed), cycle_(cycle) {}

  void Start() {
    threads_.emplace_back([this] { Writer(0); });
    threads_.emplace_back([this] { Writer(1); });
    threads_.emplace_back([this] { SessionSaver(); });
    threads_.emplace_back([this] { Reader(); });
  }
  void Join() {
    stop_ = true;
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  }

 private:
  std::unique_ptr<Client> Connect(const std::string& ns) {
    ClientOptions o = d_.Options(ns);
    o.timeout = std::chrono::milliseconds(3000);
    o.auto_reconnect = false;  // a dead daemon ends the thread's work for this cycle
    auto c = Client::Connect(o);
    return c.ok() ? std::move(*c) : nullptr;
  }

  // Puts chains into the write-through namespace; each OK put is durable. Every other chain is
  // one both writers put, the same keys and bytes at about the same moment: a writer then finds
  // blocks the other is putting, and its OK must mean on disk too.
  void Writer(int id) {
    std::mt19937_64 rng(seed_ ^ (cycle_ << 8) ^ static_cast<uint64_t>(id));
    auto client = Connect("durable");
    if (client == nullptr) return;
    for (uint64_t n = 0; !stop_; ++n) {
      std::mt19937_64 both(seed_ ^ (cycle_ << 8) ^ 0x5a5a ^ (n << 16));
      Chain c = n % 2 == 1
                    ? MakeChain(cycle_ * 10 + 9, n, 1 + both() % 6, both)
                    : MakeChain(cycle_ * 10 + static_cast<uint64_t>(id), n, 1 + rng() % 6, rng);
      std::vector<std::vector<uint8_t>> bytes;
      std::vector<PutBlock> blocks;
      for (size_t i = 0; i < c.keys.size(); ++i) {
        bytes.push_back(BlockBytes(SeedOf(c.keys[i]), c.sizes[i]));
        blocks.push_back({c.keys[i], bytes.back().data(), bytes.back().size(),
                          i == 0 ? BlockKey{} : c.keys[i - 1]});
      }
      auto r = client->Put(blocks);
      if (!r.ok()) return;  // the daemon is gone
      // A block still in progress (the other writer did not finish in time) is OK but not known
      // to be on disk, and which one it was is not said: such a put is not counted.
      if (r->in_progress > 0) continue;
      std::lock_guard<std::mutex> lock(ledger_.mu);
      for (size_t i = 0; i < c.keys.size(); ++i) {
        if (r->errors.size() == c.keys.size() && r->errors[i].ok()) {
          if (ledger_.durable_blocks.emplace(c.keys[i], Ledger::Durable{c.sizes[i], cycle_})
                  .second) {
            ledger_.durable_order.push_back(c.keys[i]);
          }
          ++ledger_.acks;
        }
      }
    }
  }

  // Saves, re-saves (a longer chain) and deletes sessions in a write-back namespace.
  void SessionSaver() {
    std::mt19937_64 rng(seed_ ^ (cycle_ << 8) ^ 0x5e55);
    auto client = Connect("sessions");
    if (client == nullptr) return;
    for (uint64_t n = 0; !stop_; ++n) {
      const std::string id = "s-" + std::to_string(rng() % 24);  // ids recur across cycles
      const bool remove = rng() % 5 == 0;
      std::optional<Chain> next;
      if (!remove) {
        next = MakeChain(1000 + cycle_, n, 1 + rng() % 4, rng);
        std::vector<std::vector<uint8_t>> bytes;
        std::vector<std::span<const uint8_t>> spans;
        for (size_t i = 0; i < next->keys.size(); ++i) {
          bytes.push_back(BlockBytes(SeedOf(next->keys[i]), next->sizes[i]));
        }
        for (const auto& b : bytes) spans.emplace_back(b);
        auto p = client->PutChain(next->keys, spans);
        if (!p.ok()) return;
        if (!p->all_ok()) continue;  // not all stored: nothing to save
      }
      {
        // In flight: either outcome may be what the daemon holds after a kill. A session never
        // saved before may also still be absent.
        std::lock_guard<std::mutex> lock(ledger_.mu);
        std::vector<std::optional<Chain>>& v = ledger_.sessions[id];
        if (v.empty()) v.push_back(std::nullopt);
        v.push_back(next);
      }
      Status st;
      if (remove) {
        st = client->DeleteSession(id);
        if (st.code() == StatusCode::kNotFound) st = Status::OK();  // deleted either way
      } else {
        Session s;
        s.session_id = id;
        s.keys = next->keys;
        s.token_count = next->keys.size() * kTokensPerBlock;
        st = client->SaveSession(s);
      }
      std::lock_guard<std::mutex> lock(ledger_.mu);
      std::vector<std::optional<Chain>>& v = ledger_.sessions[id];
      if (st.ok()) {
        v = {next};  // acknowledged: the only version it may hold from now on
        ++ledger_.acks;
      } else if (st.code() != StatusCode::kUnavailable &&
                 st.code() != StatusCode::kDeadlineExceeded) {
        v.pop_back();  // refused (not a crash): the save did not happen
      } else {
        return;  // the daemon is gone: the version stays possible
      }
    }
  }

  // Reads back what was acknowledged so far while it is being written and the daemon dies.
  void Reader() {
    std::mt19937_64 rng(seed_ ^ (cycle_ << 8) ^ 0x4ead);
    auto client = Connect("durable");
    if (client == nullptr) return;
    while (!stop_) {
      std::vector<BlockKey> keys;
      std::vector<size_t> sizes;
      {
        std::lock_guard<std::mutex> lock(ledger_.mu);
        const std::vector<BlockKey>& order = ledger_.durable_order;
        for (size_t i = 0; i < 16 && !order.empty(); ++i) {
          const BlockKey& k = order[rng() % order.size()];
          keys.push_back(k);
          sizes.push_back(ledger_.durable_blocks.at(k).size);
        }
      }
      if (keys.empty()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        continue;
      }
      if (!client->Lookup(keys, false).ok()) return;
      CheckReads(*client, keys, sizes, ledger_);
    }
  }

  const DaemonProcess& d_;
  Ledger& ledger_;
  const uint64_t seed_;
  const uint64_t cycle_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

// After a restart: the durable blocks are there and exact (every one with `all`; else those the
// cycle just killed acknowledged, and 2,000 earlier ones at random, each of which was checked
// in full after the kill that followed its acknowledgement); every session holds one of its
// possible versions, with every block of it exact. Settles the ledger to what was found.
void VerifyAfterRestart(const DaemonProcess& d, Ledger& ledger, uint64_t cycle, bool all,
                        std::mt19937_64& rng) {
  std::lock_guard<std::mutex> lock(ledger.mu);
  auto durable = d.Connect("durable");
  ASSERT_NE(durable, nullptr);
  std::vector<BlockKey> keys;
  std::vector<size_t> sizes;
  auto check = [&] {
    const size_t hits = CheckReads(*durable, keys, sizes, ledger);
    EXPECT_EQ(hits, keys.size()) << "cycle " << cycle << ": " << keys.size() - hits
                                 << " acknowledged durable blocks lost";
    keys.clear();
    sizes.clear();
  };
  auto add = [&](const BlockKey& key, size_t size) {
    keys.push_back(key);
    sizes.push_back(size);
    if (keys.size() == 64) check();
  };
  for (const auto& [key, durable] : ledger.durable_blocks) {
    if (all || durable.cycle + 1 == cycle) add(key, durable.size);
  }
  const std::vector<BlockKey>& order = ledger.durable_order;
  for (size_t i = 0; !all && i < 2000 && !order.empty(); ++i) {
    const BlockKey& k = order[rng() % order.size()];
    add(k, ledger.durable_blocks.at(k).size);
  }
  if (!keys.empty()) check();

  auto sessions = d.Connect("sessions");
  ASSERT_NE(sessions, nullptr);
  for (auto& [id, versions] : ledger.sessions) {
    auto loaded = sessions->LoadSession(id, /*prefetch=*/false);
    std::optional<Chain> found;
    bool matched = false;
    for (const std::optional<Chain>& v : versions) {
      if (!v.has_value()) {
        if (loaded.status().code() == StatusCode::kNotFound) matched = true;
      } else if (loaded.ok() && loaded->session.keys == v->keys) {
        matched = true;
        found = v;
      }
      if (matched) break;
    }
    ASSERT_TRUE(matched) << "cycle " << cycle << ": session " << id << " is "
                         << (loaded.ok() ? "a version never saved" : loaded.status().ToString())
                         << " (" << versions.size() << " possible versions)";
    versions = {found};
    if (found.has_value()) {
      const size_t hits = CheckReads(*sessions, found->keys, found->sizes, ledger);
      EXPECT_EQ(hits, found->keys.size())
          << "cycle " << cycle << ": session " << id << " lost blocks of its chain";
    }
  }
}

TEST(CrashTest, EveryAcknowledgedSessionAndDurableBlockSurvivesRandomKills) {
  const uint64_t cycles = EnvOr("KVPOOL_CRASH_CYCLES", 20);
  const uint64_t seed =
      EnvOr("KVPOOL_CRASH_SEED",
            static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()));
  std::printf("crash test: %llu cycles, KVPOOL_CRASH_SEED=%llu\n",
              static_cast<unsigned long long>(cycles), static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  // Disk room for every block of a long run: durable is not immortal, a full disk evicts.
  DaemonProcess d({"--namespace_policy=durable=write-through", "--disk_capacity=64GiB"});
  Ledger ledger;
  for (uint64_t cycle = 0; cycle < cycles; ++cycle) {
    ASSERT_OK(d.Start());
    if (cycle > 0) {
      VerifyAfterRestart(d, ledger, cycle, /*all=*/cycles <= 20, rng);
      if (HasFatalFailure() || HasFailure()) break;
    }
    Workload w(d, ledger, seed, cycle);
    w.Start();
    std::this_thread::sleep_for(std::chrono::milliseconds(50 + rng() % 400));
    d.Kill();
    w.Join();
  }
  ASSERT_OK(d.Start());
  VerifyAfterRestart(d, ledger, cycles, /*all=*/true, rng);
  EXPECT_EQ(ledger.wrong_bytes.load(), 0u);
  std::lock_guard<std::mutex> lock(ledger.mu);
  std::printf("crash test: %llu acknowledgements, %zu durable blocks, %zu sessions checked\n",
              static_cast<unsigned long long>(ledger.acks.load()), ledger.durable_blocks.size(),
              ledger.sessions.size());
  // The workload did something in the time it had (not a timing bound: a count of work).
  EXPECT_GT(ledger.durable_blocks.size(), 0u);
  EXPECT_GT(ledger.sessions.size(), 0u);
}

}  // namespace
}  // namespace kvpool::testing
