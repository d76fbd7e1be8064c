// Cross-process tests: a real kvpoold on a temp dir and socket, driven through the C++ client.
// Every byte read back is compared with an independent copy kept by the test.

#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <map>
#include <random>
#include <thread>

#include "common/checksum.h"
#include "tests/support/daemon_process.h"
#include "tests/support/status_matchers.h"

namespace kvpool::testing {
namespace {

constexpr uint32_t kTokensPerBlock = 16;

struct Chain {
  std::vector<BlockKey> keys;
  std::vector<std::vector<uint8_t>> blocks;
};

// A chain of `n_blocks` blocks of `size` bytes hashed from tokens; the bytes derive from the key.
Chain MakeChain(const std::vector<int32_t>& tokens, size_t size, const std::string& secret = "s") {
  ChainHasher hasher(secret, kTestLayout, kTokensPerBlock);
  Chain c;
  c.keys = hasher.Hash(tokens);
  for (const BlockKey& k : c.keys) {
    uint64_t seed;
    std::memcpy(&seed, k.bytes.data(), sizeof(seed));
    c.blocks.push_back(BlockBytes(seed, size));
  }
  return c;
}

PutResult PutAll(Client& client, const Chain& c) {
  std::vector<std::span<const uint8_t>> spans(c.blocks.begin(), c.blocks.end());
  auto r = client.PutChain(c.keys, spans);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return {};
  for (const Status& st : r->errors) EXPECT_TRUE(st.ok()) << st.ToString();
  return *r;
}

// Gets every block of `c` and compares with the reference bytes; returns the tiers served from.
std::vector<Tier> ExpectIdentical(Client& client, const Chain& c) {
  std::vector<std::vector<uint8_t>> out(c.blocks.size());
  std::vector<MutableBuffer> bufs(c.blocks.size());
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].assign(c.blocks[i].size() + 64, 0xEE);
    bufs[i] = {out[i].data(), out[i].size()};
  }
  auto r = client.Get(c.keys, bufs);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  std::vector<Tier> tiers;
  if (!r.ok()) return tiers;
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_TRUE((*r)[i].status.ok()) << "block " << i << ": " << (*r)[i].status.ToString();
    EXPECT_EQ((*r)[i].size, c.blocks[i].size()) << "block " << i;
    EXPECT_TRUE(std::equal(c.blocks[i].begin(), c.blocks[i].end(), out[i].begin()))
        << "block " << i << " differs from what was put";
    tiers.push_back((*r)[i].tier);
  }
  return tiers;
}

TEST(DaemonTest, PutLookupGetRoundTripIsByteIdentical) {
  DaemonProcess d;
  ASSERT_OK(d.Start());
  auto client = d.Connect();
  // Sizes that are not multiples of any page: 1 byte blocks up to ~700 KiB.
  for (size_t size : {size_t{1}, size_t{4095}, size_t{4097}, size_t{65536}, size_t{700001}}) {
    Chain c = MakeChain(Tokens(size, 10 * kTokensPerBlock + 3), size);
    ASSERT_EQ(c.keys.size(), 10u);
    auto miss = client->Lookup(c.keys);
    ASSERT_TRUE(miss.ok());
    EXPECT_EQ(miss->hit_blocks, 0u);
    PutResult p = PutAll(*client, c);
    EXPECT_EQ(p.stored, 10u);
    auto hit = client->Lookup(c.keys);
    ASSERT_TRUE(hit.ok());
    EXPECT_EQ(hit->hit_blocks, 10u);
    for (Tier t : hit->tiers) EXPECT_EQ(t, Tier::kHost);
    ExpectIdentical(*client, c);
  }
}

TEST(DaemonTest, LookupReturnsLongestCachedPrefix) {
  DaemonProcess d;
  ASSERT_OK(d.Start());
  auto client = d.Connect();
  Chain c = MakeChain(Tokens(7, 8 * kTokensPerBlock), 1000);
  Chain first_five;
  first_five.keys.assign(c.keys.begin(), c.keys.begin() + 5);
  first_five.blocks.assign(c.blocks.begin(), c.blocks.begin() + 5);
  PutAll(*client, first_five);
  auto r = client->Lookup(c.keys);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->hit_blocks, 5u);
  // A get of the whole chain serves the prefix and reports misses for the rest.
  std::vector<std::vector<uint8_t>> out(8, std::vector<uint8_t>(1000));
  std::vector<MutableBuffer> bufs;
  for (auto& o : out) bufs.push_back({o.data(), o.size()});
  auto g = client->Get(c.keys, bufs);
  ASSERT_TRUE(g.ok());
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ((*g)[i].status.ok(), i < 5) << i;
    if (i >= 5) {
      EXPECT_TRUE((*g)[i].status.IsNotFound());
    }
  }
}

TEST(DaemonTest, SharedSystemPromptIsStoredOnce) {
  DaemonProcess d;
  ASSERT_OK(d.Start());
  auto client = d.Connect();
  const std::vector<int32_t> system_prompt = Tokens(1, 4 * kTokensPerBlock);
  for (int i = 0; i < 100; ++i) {
    std::vector<int32_t> tokens = system_prompt;
    const std::vector<int32_t> user = Tokens(1000 + i, 2 * kTokensPerBlock);
    tokens.insert(tokens.end(), user.begin(), user.end());
    Chain c = MakeChain(tokens, 4096);
    PutResult p = PutAll(*client, c);
    EXPECT_EQ(p.stored + p.already_present, 6u);
    if (i > 0) {
      EXPECT_EQ(p.already_present, 4u) << "the shared prefix was sent again";
    }
  }
  auto s = client->Stats();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->puts_offered, 600u);
  EXPECT_EQ(s->puts_committed, 4u + 200u);
  EXPECT_EQ(s->puts_deduplicated, 99u * 4u);
  EXPECT_NEAR(s->dedup_ratio, 600.0 / 204.0, 1e-9);
  EXPECT_EQ(s->tiers[0].blocks, 204u);
}

TEST(DaemonTest, HostOverflowDemotesToDiskAndServesItBack) {
  // 8 MiB host, 1 MiB segments; 40 x 512 KiB = 20 MiB of blocks.
  DaemonProcess d({"--host_capacity=8MiB"});
  ASSERT_OK(d.Start());
  auto client = d.Connect();
  Chain c = MakeChain(Tokens(3, 40 * kTokensPerBlock), 512 * 1024);
  PutResult p = PutAll(*client, c);
  EXPECT_EQ(p.stored, 40u);
  auto s = client->Stats();
  ASSERT_TRUE(s.ok());
  EXPECT_GT(s->tiers[1].blocks, 0u) << "nothing was demoted to disk";
  EXPECT_LE(s->tiers[0].used_bytes, 8u << 20);
  // Tail first: the chain's first block is still in host while later ones went to disk.
  auto l = client->Lookup(c.keys, /*prefetch=*/false);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->hit_blocks, 40u);
  // Every block comes back byte-identical, promoted from disk where needed.
  std::vector<Tier> tiers;
  for (size_t start = 0; start < 40; start += 8) {
    Chain part;
    part.keys.assign(c.keys.begin() + start, c.keys.begin() + start + 8);
    part.blocks.assign(c.blocks.begin() + start, c.blocks.begin() + start + 8);
    auto t = ExpectIdentical(*client, part);
    tiers.insert(tiers.end(), t.begin(), t.end());
  }
  EXPECT_TRUE(std::count(tiers.begin(), tiers.end(), Tier::kDisk) > 0)
      << "no block was served from disk";
  auto s2 = client->Stats();
  ASSERT_TRUE(s2.ok());
  EXPECT_GT(s2->tiers[0].promotions, 0u);
  EXPECT_EQ(s2->checksum_failures, 0u);
}

TEST(DaemonTest, SessionSurvivesGracefulRestart) {
  DaemonProcess d;
  ASSERT_OK(d.Start());
  Chain c = MakeChain(Tokens(11, 12 * kTokensPerBlock), 100000);
  {
    auto client = d.Connect();
    PutAll(*client, c);
    Session s;
    s.session_id = "chat-42";
    s.keys = c.keys;
    s.token_count = 12 * kTokensPerBlock + 5;
    s.metadata = {{"model", "test"}, {"user", "alice"}};
    ASSERT_TRUE(client->SaveSession(s).ok());
  }
  EXPECT_OK(d.Stop());
  ASSERT_OK(d.Start());
  auto client = d.Connect();
  auto loaded = client->LoadSession("chat-42");
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->session.keys, c.keys);
  EXPECT_EQ(loaded->session.token_count, 12u * kTokensPerBlock + 5);
  EXPECT_EQ(loaded->session.metadata.at("user"), "alice");
  EXPECT_EQ(loaded->cached_blocks, 12u);
  ExpectIdentical(*client, c);
  auto list = client->ListSessions();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].session_id, "chat-42");
}

// The session count is exact, after re-saves, deletes and a restart alike; and what records
// take on disk is counted in the disk tier's use, at start too.
TEST(DaemonTest, SessionCountAndTheirDiskUseAreExactAcrossARestart) {
  DaemonProcess d;
  ASSERT_OK(d.Start());
  auto used = [](Client& c) {
    Result<DaemonStats> st = c.Stats();
    EXPECT_TRUE(st.ok()) << st.status().ToString();
    uint64_t disk = 0;
    for (const TierStats& t : st->tiers) {
      if (t.name == "disk") disk = t.used_bytes;
    }
    return std::make_pair(st->sessions, disk);
  };
  std::pair<uint64_t, uint64_t> before;
  {
    auto client = d.Connect();
    const uint64_t empty_disk = used(*client).second;
    for (int round = 0; round < 5; ++round) {
      for (const char* id : {"a", "b", "c"}) {
        Session s;
        s.session_id = id;
        s.metadata = {{"tokens", std::string(64 << 10, static_cast<char>('a' + round))}};
        ASSERT_OK(client->SaveSession(s));
      }
    }
    ASSERT_OK(client->DeleteSession("b"));
    before = used(*client);
    EXPECT_EQ(before.first, 2u);
    EXPECT_GE(before.second, empty_disk + (128u << 10)) << "two records of 64 KiB";
  }
  EXPECT_OK(d.Stop());
  ASSERT_OK(d.Start());
  auto client = d.Connect();
  EXPECT_EQ(used(*client), before);
}

// More sessions than the daemon answers in one page (1,000): ListSessions asks page after page,
// so `kvpool sessions ls` and Python's list_sessions() see every one.
TEST(DaemonTest, ListingSessionsPastOnePageFindsEveryOne) {
  DaemonProcess d;
  ASSERT_OK(d.Start());
  auto client = d.Connect();
  constexpr int kSessions = 1003;
  for (int i = 0; i < kSessions; ++i) {
    Session s;
    s.session_id = "chat-" + std::to_string(10000 + i);
    ASSERT_OK(client->SaveSession(s));
  }
  auto all = client->ListSessions();
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  ASSERT_EQ(all->size(), static_cast<size_t>(kSessions));
  for (int i = 0; i < kSessions; ++i) {
    EXPECT_EQ((*all)[i].session_id, "chat-" + std::to_string(10000 + i));
  }
  auto some = client->ListSessions("chat-1", 5);
  ASSERT_TRUE(some.ok());
  EXPECT_EQ(some->size(), 5u);
}

// A session id or metadata that is not UTF-8 (C callers can pass any bytes) is refused with a
// message that says so, and harms nothing else.
TEST(DaemonTest, ASessionIdThatIsNotUtf8IsRefusedSayingSo) {
  DaemonProcess d;
  ASSERT_OK(d.Start());
  auto client = d.Connect();
  Session s;
  s.session_id = "chat-\xff\xfe";
  Status st = client->SaveSession(s);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("UTF-8"), std::string::npos) << st.ToString();
  s.session_id = "chat-ok";
  s.metadata = {{"user", "\xc3\x28"}};
  EXPECT_EQ(client->SaveSession(s).code(), StatusCode::kInvalidArgument);
  s.metadata = {{"user", "d\xc3\xa9j\xc3\xa0"}};  // déjà
  ASSERT_OK(client->SaveSession(s));
  auto loaded = client->LoadSession("chat-ok");
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->session.metadata.at("user"), "d\xc3\xa9j\xc3\xa0");
}

TEST(DaemonTest, SavedSessionSurvivesKill9) {
  DaemonProcess d;
  ASSERT_OK(d.Start());
  Chain saved = MakeChain(Tokens(21, 6 * kTokensPerBlock), 30000);
  Chain unsaved = MakeChain(Tokens(22, 6 * kTokensPerBlock), 30000);
  {
    auto client = d.Connect();
    PutAll(*client, saved);
    PutAll(*client, unsaved);
    Session s;
    s.session_id = "resume-me";
    s.keys = saved.keys;
    s.token_count = 96;
    ASSERT_TRUE(client->SaveSession(s).ok());
  }
  d.Kill();
  ASSERT_OK(d.Start());
  auto client = d.Connect();
  auto loaded = client->LoadSession("resume-me");
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->session.keys, saved.keys);
  auto tiers = ExpectIdentical(*client, saved);
  // Host-only blocks that no session pinned may be gone after kill -9; never wrong bytes.
  std::vector<std::vector<uint8_t>> out(unsaved.keys.size(), std::vector<uint8_t>(30000));
  std::vector<MutableBuffer> bufs;
  for (auto& o : out) bufs.push_back({o.data(), o.size()});
  auto g = client->Get(unsaved.keys, bufs);
  ASSERT_TRUE(g.ok());
  for (size_t i = 0; i < out.size(); ++i) {
    if ((*g)[i].status.ok()) {
      EXPECT_EQ(out[i], unsaved.blocks[i]);
    }
  }
}

TEST(DaemonTest, NamespacesCannotSeeEachOther) {
  DaemonProcess d;
  ASSERT_OK(d.Start());
  auto a = d.Connect("tenant-a");
  auto b = d.Connect("tenant-b");
  // Same keys in both namespaces (a client bug or an attack: the daemon must still separate).
  Chain c = MakeChain(Tokens(5, 4 * kTokensPerBlock), 2048);
  PutAll(*a, c);
  auto lb = b->Lookup(c.keys);
  ASSERT_TRUE(lb.ok());
  EXPECT_EQ(lb->hit_blocks, 0u);
  std::vector<uint8_t> buf(2048);
  std::vector<MutableBuffer> bufs(1, {buf.data(), buf.size()});
  auto g = b->Get(std::span(c.keys).first(1), bufs);
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE((*g)[0].status.IsNotFound());
  Session s;
  s.session_id = "private";
  s.keys = c.keys;
  ASSERT_TRUE(a->SaveSession(s).ok());
  EXPECT_TRUE(b->LoadSession("private").status().IsNotFound());
  EXPECT_TRUE(b->DeleteSession("private").IsNotFound());
  auto lb_sessions = b->ListSessions();
  ASSERT_TRUE(lb_sessions.ok());
  EXPECT_TRUE(lb_sessions->empty());
  // b stores its own different bytes under the same keys; a still reads its own.
  Chain other = c;
  for (auto& blk : other.blocks) blk.assign(blk.size(), 0x42);
  PutAll(*b, other);
  ExpectIdentical(*a, c);
  ExpectIdentical(*b, other);
}

TEST(DaemonTest, ConcurrentClientsNeverSeeWrongBytes) {
  DaemonProcess d({"--host_capacity=16MiB"});
  ASSERT_OK(d.Start());
  // 64 shared chains of 4 blocks; 8 clients put, get and look up at random.
  std::vector<Chain> chains;
  for (int i = 0; i < 64; ++i) {
    chains.push_back(MakeChain(Tokens(500 + i, 4 * kTokensPerBlock), 16384 + 4096 * (i % 7)));
  }
  std::atomic<uint64_t> mismatches{0}, gets_ok{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      auto client = d.Connect();
      if (!client) {
        errors++;
        return;
      }
      std::mt19937 rng(t);
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(3);
      std::vector<uint8_t> buf(64 * 1024);
      while (std::chrono::steady_clock::now() < end) {
        const Chain& c = chains[rng() % chains.size()];
        switch (rng() % 3) {
          case 0: {
            std::vector<std::span<const uint8_t>> spans(c.blocks.begin(), c.blocks.end());
            auto r = client->PutChain(c.keys, spans);
            if (!r.ok()) errors++;
            break;
          }
          case 1: {
            const size_t i = rng() % c.keys.size();
            std::vector<MutableBuffer> bufs(1, {buf.data(), buf.size()});
            auto r = client->Get(std::span(c.keys).subspan(i, 1), bufs);
            if (!r.ok()) {
              errors++;
            } else if ((*r)[0].status.ok()) {
              gets_ok++;
              if ((*r)[0].size != c.blocks[i].size() ||
                  !std::equal(c.blocks[i].begin(), c.blocks[i].end(), buf.begin())) {
                mismatches++;
              }
            }
            break;
          }
          default: {
            auto r = client->Lookup(c.keys);
            if (!r.ok()) errors++;
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0u);
  EXPECT_EQ(errors.load(), 0u);
  EXPECT_GT(gets_ok.load(), 100u);
  auto admin = d.Connect();
  const DaemonStats s = WaitForStats(*admin, [](const DaemonStats& s) {
    return s.leases_active == 0 && s.reservations_active == 0;
  });
  EXPECT_EQ(s.leases_active, 0u);
  EXPECT_EQ(s.reservations_active, 0u);
}

TEST(DaemonTest, ClientSeesErrorNotHangWhenDaemonDiesAndReconnectsAfterRestart) {
  DaemonProcess d;
  ASSERT_OK(d.Start());
  ClientOptions o = d.Options();
  o.timeout = std::chrono::milliseconds(2000);
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok());
  Chain chain = MakeChain(Tokens(9, 2 * kTokensPerBlock), 1000);
  PutAll(**c, chain);
  d.Kill();
  const auto start = std::chrono::steady_clock::now();
  auto r = (*c)->Lookup(chain.keys);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  ASSERT_OK(d.Start());
  auto again = (*c)->Lookup(chain.keys);  // reconnects by itself
  EXPECT_TRUE(again.ok()) << again.status().ToString();
}

TEST(DaemonTest, OversizedBlockIsRefusedWithAClearError) {
  DaemonProcess d;  // 1 MiB segments: the largest block is 1 MiB
  ASSERT_OK(d.Start());
  auto client = d.Connect();
  EXPECT_EQ(client->server().max_block_bytes, 1u << 20);
  std::vector<uint8_t> big((1u << 20) + 1, 7);
  PutBlock b;
  b.key = MakeChain(Tokens(1, 16), 1).keys[0];
  b.data = big.data();
  b.size = big.size();
  auto r = client->Put(std::span(&b, 1));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->stored, 0u);
  EXPECT_EQ(r->errors[0].code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r->errors[0].message().find("exceeds"), std::string::npos) << r->errors[0].message();
}

TEST(DaemonTest, APutWhoseBytesDoNotMatchTheChecksumGivenIsRefused) {
  // A copy from another store (a replica) comes with the checksum it was stored under: bytes
  // damaged at the source are refused, not stored under a fresh hash (issue 12, hole 3).
  DaemonProcess d;
  ASSERT_OK(d.Start());
  auto client = d.Connect();
  const auto keys = MakeChain(Tokens(2, 32), 2).keys;
  std::vector<uint8_t> good = BlockBytes(1, 5000), damaged = good;
  damaged[123] ^= 0x40;
  PutBlock b[2];
  b[0] = {keys[0], damaged.data(), damaged.size(), {}, BlockChecksum(good.data(), good.size())};
  b[1] = {keys[1], good.data(), good.size(), keys[0], BlockChecksum(good.data(), good.size())};
  auto r = client->Put(std::span(b, 2));
  ASSERT_OK(r);
  EXPECT_EQ(r->errors[0].code(), StatusCode::kCorruption) << r->errors[0].ToString();
  EXPECT_OK(r->errors[1]);
  EXPECT_EQ(r->stored, 1u);
  auto got = client->GetBlocks(keys);
  ASSERT_OK(got);
  EXPECT_TRUE((*got)[0].status.IsNotFound()) << "the damaged copy was not stored";
  ASSERT_OK((*got)[1].status);
  EXPECT_EQ((*got)[1].bytes, good);
}

TEST(DaemonTest, WhereAnswersForEachKeyOnItsOwn) {
  DaemonProcess d;
  ASSERT_OK(d.Start());
  auto client = d.Connect();
  const auto c = MakeChain(Tokens(3, 48), 3);
  std::vector<std::vector<uint8_t>> bytes = {BlockBytes(1, 4000), BlockBytes(2, 4000)};
  std::vector<std::span<const uint8_t>> spans(bytes.begin(), bytes.end());
  ASSERT_OK(client->PutChain(std::span(c.keys).first(2), spans));
  const BlockKey second = c.keys[1];
  ASSERT_OK(client->Evict(Tier::kHost, {&second, 1}));  // on disk only now
  // A missing key in the middle does not hide the one after it (Lookup would stop there).
  const std::vector<BlockKey> asked = {c.keys[0], c.keys[2], c.keys[1]};
  auto where = client->Where(asked);
  ASSERT_OK(where);
  EXPECT_EQ(*where, (std::vector<Tier>{Tier::kHost, Tier::kNone, Tier::kDisk}));
  auto again = client->Where(asked);
  ASSERT_OK(again);
  EXPECT_EQ((*again)[2], Tier::kDisk) << "asking moves nothing";
}

TEST(DaemonTest, SessionSaveRequiresCachedBlocks) {
  DaemonProcess d;
  ASSERT_OK(d.Start());
  auto client = d.Connect();
  Chain c = MakeChain(Tokens(77, 3 * kTokensPerBlock), 100);
  Session s;
  s.session_id = "early";
  s.keys = c.keys;
  Status st = client->SaveSession(s);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  EXPECT_TRUE(client->LoadSession("early").status().IsNotFound());
}

TEST(DaemonTest, SessionDeleteUnpinsAndDiskFullDropsOnlyUnpinned) {
  // Disk 4 MiB, host 2 MiB: pinned session blocks must survive pressure; others may go.
  DaemonProcess d({"--host_capacity=2MiB", "--disk_capacity=4MiB"});
  ASSERT_OK(d.Start());
  auto client = d.Connect();
  Chain pinned = MakeChain(Tokens(31, 4 * kTokensPerBlock), 256 * 1024);  // 1 MiB
  PutAll(*client, pinned);
  Session s;
  s.session_id = "keep";
  s.keys = pinned.keys;
  ASSERT_TRUE(client->SaveSession(s).ok());
  for (int i = 0; i < 6; ++i) {
    Chain filler = MakeChain(Tokens(100 + i, 4 * kTokensPerBlock), 256 * 1024);
    auto r = client->PutChain(filler.keys, std::vector<std::span<const uint8_t>>(
                                               filler.blocks.begin(), filler.blocks.end()));
    ASSERT_TRUE(r.ok());
  }
  ExpectIdentical(*client, pinned);
  auto st = client->Stats();
  ASSERT_TRUE(st.ok());
  EXPECT_LE(st->tiers[1].used_bytes, 4u << 20);
  EXPECT_GT(st->tiers[1].evictions, 0u) << "disk never filled: the test proves nothing";
  ASSERT_TRUE(client->DeleteSession("keep").ok());
  EXPECT_TRUE(client->LoadSession("keep").status().IsNotFound());
}

TEST(DaemonTest, StatsAndEvictWork) {
  DaemonProcess d;
  ASSERT_OK(d.Start());
  auto client = d.Connect();
  Chain c = MakeChain(Tokens(41, 5 * kTokensPerBlock), 5000);
  PutAll(*client, c);
  auto e = client->Evict(Tier::kHost);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->evicted, 5u);
  auto l = client->Lookup(c.keys, /*prefetch=*/false);
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->hit_blocks, 5u);
  for (Tier t : l->tiers) EXPECT_EQ(t, Tier::kDisk);
  ExpectIdentical(*client, c);
  auto drop = client->Evict(Tier::kDisk);
  ASSERT_TRUE(drop.ok());
  EXPECT_EQ(drop->evicted, 5u);
  auto gone = client->Lookup(c.keys);
  ASSERT_TRUE(gone.ok());
  EXPECT_EQ(gone->hit_blocks, 0u);
}

}  // namespace
}  // namespace kvpool::testing

namespace kvpool::testing {
namespace {

// The "tcp://HOST:PORT" or "http://HOST:PORT" the daemon printed at start.
TEST(DaemonTest, ServesOverTcpWhenAsked) {
  DaemonProcess d({"--listen=tcp://127.0.0.1:0"});
  ASSERT_OK(d.Start());
  const std::string address = d.PrintedAddress("tcp://");
  ASSERT_FALSE(address.empty()) << d.log();
  ClientOptions o = d.Options();
  o.address = address;
  o.data_path = DataPath::kAuto;  // no shared memory over TCP
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Chain chain = MakeChain(Tokens(61, 3 * kTokensPerBlock), 300000);
  PutAll(**c, chain);
  ExpectIdentical(**c, chain);
}

// Client::GetWith: each block lands where its callback says once its size is known, with the
// checksum it was verified against; a block given no buffer is skipped and its bytes discarded,
// and the blocks after it still arrive. Over the socket and through shared memory.
TEST(DaemonTest, GetWithPutsEachBlockWhereItsCallbackSays) {
  DaemonProcess d;
  ASSERT_OK(d.Start());
  Chain chain = MakeChain(Tokens(62, 4 * kTokensPerBlock), 0);
  for (size_t i = 0; i < chain.blocks.size(); ++i) chain.blocks[i] = BlockBytes(90 + i, 70000 + i);
  for (DataPath path : {DataPath::kSocket, DataPath::kSharedMemory}) {
    ClientOptions o = d.Options();
    o.data_path = path;
    auto c = Client::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    PutAll(**c, chain);
    std::vector<BlockKey> keys = chain.keys;
    keys.push_back(MakeChain(Tokens(63, kTokensPerBlock), 1).keys[0]);  // never put
    std::vector<std::vector<uint8_t>> out(keys.size());
    std::vector<uint64_t> sizes(keys.size(), 0);
    auto got = (*c)->GetWith(keys, [&](size_t i, uint64_t size) -> MutableBuffer {
      sizes[i] = size;
      if (i == 1) return {};  // skipped
      out[i].assign(size, 0xEE);
      return {out[i].data(), out[i].size()};
    });
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    for (size_t i = 0; i < chain.blocks.size(); ++i) {
      EXPECT_EQ(sizes[i], chain.blocks[i].size()) << i;
      if (i == 1) {
        EXPECT_EQ((*got)[i].status.code(), StatusCode::kInvalidArgument) << i;
        continue;
      }
      ASSERT_TRUE((*got)[i].status.ok()) << i << ": " << (*got)[i].status.ToString();
      EXPECT_EQ(out[i], chain.blocks[i]) << i;
      EXPECT_EQ((*got)[i].checksum, BlockChecksum(chain.blocks[i].data(), chain.blocks[i].size()));
    }
    EXPECT_EQ(sizes.back(), 0u) << "a miss has no size to ask a buffer for";
    EXPECT_TRUE((*got).back().status.IsNotFound());
  }
}

// --host_huge_pages: the host arena asks for transparent huge pages, which it gets where the
// kernel gives them to shared memory (and not on a machine that does not); blocks are served the
// same either way, and the banner says how much of the arena has them.
TEST(DaemonTest, AHostArenaAskedOnHugePagesServesBlocksEitherWay) {
  DaemonProcess refused({"--host_huge_pages"});  // the tests' 1 MiB segments
  EXPECT_FALSE(refused.Start().ok());
  EXPECT_NE(refused.log().find("multiple of 2 MiB"), std::string::npos) << refused.LogTail();
  DaemonProcess d({"--host_huge_pages", "--host_segment_size=2MiB"});
  ASSERT_OK(d.Start());
  // Start() returns once the socket answers; the banner is printed a moment later.
  for (int i = 0; i < 500 && d.Banner().find("host tier") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_NE(d.Banner().find("of it on huge pages"), std::string::npos) << d.Banner();
  auto client = d.Connect();
  for (size_t size : {size_t{1}, size_t{4097}, size_t{700001}, size_t{2} << 20}) {
    Chain c = MakeChain(Tokens(size, 3 * kTokensPerBlock), size);
    PutResult p = PutAll(*client, c);
    EXPECT_EQ(p.stored, 3u);
    ExpectIdentical(*client, c);
  }
}

TEST(DaemonTest, ExposesPrometheusMetrics) {
  DaemonProcess d({"--metrics_listen=127.0.0.1:0"});
  ASSERT_OK(d.Start());
  auto client = d.Connect();
  Chain chain = MakeChain(Tokens(62, 2 * kTokensPerBlock), 1000);
  PutAll(*client, chain);
  ExpectIdentical(*client, chain);
  const std::string body = d.ScrapeMetrics();
  ASSERT_FALSE(body.empty()) << d.log();
  EXPECT_NE(body.find("# TYPE kvpool_hits_total counter"), std::string::npos) << body;
  EXPECT_NE(body.find("kvpool_hits_total{tier=\"host\"} 2"), std::string::npos) << body;
  EXPECT_NE(body.find("kvpool_put_blocks_committed_total 2"), std::string::npos) << body;
  EXPECT_NE(body.find("kvpool_request_duration_seconds_bucket{op=\"get\",le=\"+Inf\"}"),
            std::string::npos);
  // Per namespace: the one host segment (1 MiB in tests) namespace "test" holds.
  EXPECT_NE(body.find("kvpool_namespace_bytes{namespace=\"test\",tier=\"host\"} 1048576\n"),
            std::string::npos)
      << body;
  // No segment has emptied yet.
  EXPECT_NE(body.find("# TYPE kvpool_host_free_segments gauge"), std::string::npos) << body;
  EXPECT_NE(body.find("kvpool_host_vacant_segments 0\n"), std::string::npos) << body;
}

}  // namespace
}  // namespace kvpool::testing
