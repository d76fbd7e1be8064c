// The namespaces file against a real kvpoold: compositions applied at start, replaced on SIGHUP
// without losing a block, an invalid file on SIGHUP logged and ignored, an invalid file at start
// refused with every error line.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include <kvpool/kernels.h>

#include "kernels/block_layout.h"
#include "kernels/dtype.h"
#include "kernels/quantize.h"
#include "tests/support/daemon_process.h"
#include "tests/support/status_matchers.h"
#include "tests/support/temp_dir.h"
#include "tiers/test_kv_blocks.h"

namespace kvpool::testing {
namespace {

constexpr uint32_t kTokensPerBlock = 16;

struct Chain {
  std::vector<BlockKey> keys;
  std::vector<std::vector<uint8_t>> blocks;
};

Chain MakeChain(uint64_t seed, size_t n_blocks, size_t size) {
  ChainHasher hasher("secret", kTestLayout, kTokensPerBlock);
  Chain c;
  c.keys = hasher.Hash(Tokens(seed, n_blocks * kTokensPerBlock));
  for (size_t i = 0; i < c.keys.size(); ++i) c.blocks.push_back(BlockBytes(seed * 1000 + i, size));
  return c;
}

void Put(Client& client, const Chain& c) {
  std::vector<std::span<const uint8_t>> spans(c.blocks.begin(), c.blocks.end());
  auto r = client.PutChain(c.keys, spans);
  ASSERT_OK(r);
  for (const Status& st : r->errors) EXPECT_OK(st);
}

// Every block of `c` is cached and reads back byte-identical.
void ExpectAllServed(Client& client, const Chain& c) {
  auto hit = client.Lookup(c.keys, /*prefetch=*/false);
  ASSERT_OK(hit);
  EXPECT_EQ(hit->hit_blocks, c.keys.size());
  std::vector<std::vector<uint8_t>> out(c.blocks.size());
  std::vector<MutableBuffer> bufs(c.blocks.size());
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].assign(c.blocks[i].size(), 0xEE);
    bufs[i] = {out[i].data(), out[i].size()};
  }
  auto r = client.Get(c.keys, bufs);
  ASSERT_OK(r);
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_TRUE((*r)[i].status.ok()) << "block " << i << ": " << (*r)[i].status.ToString();
    EXPECT_EQ(out[i], c.blocks[i]) << "block " << i << " differs from what was put";
  }
}

void WriteFile(const std::string& path, const std::string& text) {
  // Written beside and renamed, as an editor or a config manager would: never half a file.
  {
    std::ofstream out(path + ".tmp");
    out << text;
  }
  ASSERT_EQ(std::rename((path + ".tmp").c_str(), path.c_str()), 0) << std::strerror(errno);
}

// Waits until `done` holds, polling every 20 ms, for at most 10 s.
bool WaitFor(const std::function<bool()>& done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return done();
}

const PolicyInfo* Find(const PoliciesView& v, const std::string& ns) {
  for (const PolicyInfo& p : v.namespaces) {
    if (p.namespace_name == ns) return &p;
  }
  return nullptr;
}

std::string Row(const PolicyInfo& p) {
  return p.eviction + " " + p.write + " " + p.admission + " " + p.read_ahead + " " + p.source;
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

class NamespacesReloadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok()) << dir_.status().ToString();
    path_ = dir_.Join("namespaces.yaml");
  }

  TempDir dir_{"kvpool-namespaces"};
  std::string path_;
};

TEST_F(NamespacesReloadTest, SighupAppliesTheNewCompositionAndKeepsEveryBlock) {
  WriteFile(path_,
            "default: {read_ahead: chain-4}\n"
            "namespaces:\n"
            "  tenant-a: {eviction: lru, admission: all}\n"
            "  gone: {eviction: lfu}\n");
  DaemonProcess d({"--namespaces_file=" + path_, "--write_policy=write-through-after-5",
                   "--namespace_policy=flagged=write-through"});
  ASSERT_OK(d.Start());
  auto client = d.Connect("tenant-a");
  ASSERT_NE(client, nullptr);

  auto v = client->Policies();
  ASSERT_OK(v);
  EXPECT_EQ(Row(v->default_policy), "lru write-through-after-5 all chain-4 " + path_);
  ASSERT_EQ(v->namespaces.size(), 3u);
  EXPECT_EQ(v->namespaces[0].namespace_name, "flagged");
  EXPECT_EQ(Row(v->namespaces[0]), "lru write-through all chain-4 flags");
  EXPECT_EQ(v->namespaces[1].namespace_name, "gone");
  EXPECT_EQ(Row(v->namespaces[1]), "lfu write-through-after-5 all chain-4 " + path_);
  EXPECT_EQ(v->namespaces[2].namespace_name, "tenant-a");
  EXPECT_EQ(Row(v->namespaces[2]), "lru write-through-after-5 all chain-4 " + path_);

  // One chain moved down to disk, one in host: both must survive the change of order.
  Chain on_disk = MakeChain(1, 16, 100000);
  Chain in_host = MakeChain(2, 24, 70001);
  Put(*client, on_disk);
  auto evicted = client->Evict(Tier::kHost, on_disk.keys);
  ASSERT_OK(evicted);
  EXPECT_EQ(evicted->evicted, on_disk.keys.size());
  Put(*client, in_host);
  ExpectAllServed(*client, on_disk);
  ExpectAllServed(*client, in_host);

  WriteFile(path_,
            "# tenant-a: S3-FIFO, and disk only for blocks hit twice; 'gone' is gone\n"
            "namespaces:\n"
            "  tenant-a: {eviction: s3fifo, admission: after-2-hits}\n");
  ASSERT_EQ(kill(d.pid(), SIGHUP), 0);
  ASSERT_TRUE(WaitFor([&] {
    auto now = client->Policies("tenant-a");
    return now.ok() && now->namespaces.size() == 1 && now->namespaces[0].eviction == "s3fifo";
  })) << d.LogTail();

  v = client->Policies();
  ASSERT_OK(v);
  // No default section any more: back to the flags' write policy and the built-in read-ahead.
  EXPECT_EQ(Row(v->default_policy), "lru write-through-after-5 all chain-2 flags");
  ASSERT_EQ(v->namespaces.size(), 2u) << "'gone' left the file, so it runs the default";
  EXPECT_EQ(Row(*Find(*v, "tenant-a")),
            "s3fifo write-through-after-5 after-2-hits chain-2 " + path_);
  EXPECT_EQ(Row(*Find(*v, "flagged")), "lru write-through all chain-2 flags");
  auto gone = client->Policies("gone");
  ASSERT_OK(gone);
  ASSERT_EQ(gone->namespaces.size(), 1u);
  EXPECT_EQ(Row(gone->namespaces[0]), "lru write-through-after-5 all chain-2 flags");

  ExpectAllServed(*client, on_disk);
  ExpectAllServed(*client, in_host);

  // The CLI shows the same.
  const std::string cli_out = dir_.Join("cli.json");
  ASSERT_EQ(std::system((std::string(KVPOOL_CLI_PATH) + " --socket=" + d.socket_path() +
                         " policies show --namespace tenant-a --json >" + cli_out)
                            .c_str()),
            0);
  std::ifstream cli(cli_out);
  std::stringstream cli_text;
  cli_text << cli.rdbuf();
  for (const std::string& field :
       std::vector<std::string>{R"("eviction": "s3fifo")", R"("admission": "after-2-hits")",
                                R"("namespace": "tenant-a")", R"("source": ")" + path_ + R"(")"}) {
    EXPECT_NE(cli_text.str().find(field), std::string::npos) << field << " in " << cli_text.str();
  }

  // The disk copies survive a restart on the same data and file (host-only blocks may not:
  // after-2-hits keeps blocks hit fewer than twice off disk at shutdown).
  ASSERT_OK(d.Stop());
  ASSERT_OK(d.Start());
  client = d.Connect("tenant-a");
  ASSERT_NE(client, nullptr);
  ExpectAllServed(*client, on_disk);
  v = client->Policies("tenant-a");
  ASSERT_OK(v);
  EXPECT_EQ(Row(v->namespaces.at(0)), "s3fifo write-through-after-5 after-2-hits chain-2 " + path_);
}

TEST_F(NamespacesReloadTest, InvalidFileOnSighupIsLoggedAndTheRunningOneStays) {
  WriteFile(path_, "namespaces:\n  tenant-a: {eviction: s3fifo, admission: after-2-hits}\n");
  DaemonProcess d(std::vector<std::string>{"--namespaces_file=" + path_});
  ASSERT_OK(d.Start());
  auto client = d.Connect("tenant-a");
  ASSERT_NE(client, nullptr);
  Chain c = MakeChain(3, 12, 50000);
  Put(*client, c);

  WriteFile(path_,
            "namespaces:\n"
            "  tenant-a: {eviction: arc, admission: after-2-hits}\n"
            "  tenant-b: {disk_capacity: 1GiB}\n");
  ASSERT_EQ(kill(d.pid(), SIGHUP), 0);
  ASSERT_TRUE(WaitFor([&] { return d.log().find("not reloaded") != std::string::npos; }))
      << d.LogTail();
  const std::string log = d.log();
  EXPECT_NE(log.find(path_ + ":2: namespace 'tenant-a': unknown eviction order 'arc' (known: lru, "
                             "s3fifo, lfu)"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find(path_ + ":3: namespace 'tenant-b': 'disk_capacity' is not supported"),
            std::string::npos)
      << log;

  auto v = client->Policies();
  ASSERT_OK(v);
  ASSERT_EQ(v->namespaces.size(), 1u);
  EXPECT_EQ(Row(v->namespaces[0]), "s3fifo write-back after-2-hits chain-2 " + path_);
  ExpectAllServed(*client, c);

  // A broken YAML document, then a good file again: the second SIGHUP applies it.
  WriteFile(path_, "namespaces:\n  tenant-a: {eviction: lfu\n");
  ASSERT_EQ(kill(d.pid(), SIGHUP), 0);
  ASSERT_TRUE(WaitFor([&] { return Count(d.log(), "not reloaded") == 2; })) << d.LogTail();
  EXPECT_NE(d.log().find("YAML syntax error"), std::string::npos) << d.LogTail();
  WriteFile(path_, "namespaces:\n  tenant-a: {eviction: lfu}\n");
  ASSERT_EQ(kill(d.pid(), SIGHUP), 0);
  ASSERT_TRUE(WaitFor([&] {
    auto now = client->Policies("tenant-a");
    return now.ok() && now->namespaces.at(0).eviction == "lfu";
  })) << d.LogTail();
  ExpectAllServed(*client, c);
}

// Namespaces clients name into existence are bounded (--max_namespaces); a tenant the operator
// declares later is not held to that bound: made-up names cannot keep it out.
TEST_F(NamespacesReloadTest, NamesClientsMadeUpNeverKeepADeclaredTenantOut) {
  WriteFile(path_, "namespaces:\n  tenant-a: {}\n");
  DaemonProcess d({"--namespaces_file=" + path_, "--max_namespaces=3"});
  ASSERT_OK(d.Start());
  auto a = d.Connect("tenant-a");
  ASSERT_NE(a, nullptr);
  // Undeclared names, under `access: open`, until the bound refuses the next one.
  size_t made_up = 0;
  for (int i = 0; i < 5; ++i) {
    ClientOptions o = d.Options("made-up-" + std::to_string(i));
    o.auto_reconnect = false;
    auto c = Client::Connect(o);
    if (!c.ok()) {
      EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted) << c.status().ToString();
      break;
    }
    ++made_up;
  }
  EXPECT_LT(made_up, 5u) << "no bound on names clients make up";

  WriteFile(path_, "namespaces:\n  tenant-a: {}\n  tenant-b: {eviction: lfu}\n");
  ASSERT_EQ(kill(d.pid(), SIGHUP), 0);
  ASSERT_TRUE(WaitFor([&] {
    auto v = a->Policies("tenant-b");
    return v.ok() && !v->namespaces.empty() && v->namespaces[0].eviction == "lfu";
  })) << d.LogTail();
  auto b = d.Connect("tenant-b");
  ASSERT_NE(b, nullptr) << d.LogTail();
  Chain c = MakeChain(9, 3, 20000);
  Put(*b, c);
  ExpectAllServed(*b, c);
}

// Runs kvpoold to its end (it must not start) and returns its exit status and output.
std::pair<int, std::string> RunKvpoold(const TempDir& dir, const std::string& flags) {
  const std::string out = dir.Join("kvpoold.out");
  const std::string cmd = "timeout 60 " + DefaultKvpooldPath() + " --data_dir=" + dir.Join("data") +
                          " --socket=" + dir.Join("kvpool.sock") +
                          " --lock_memory=false --host_capacity=64MiB --host_segment_size=1MiB "
                          "--disk_capacity=1GiB --ucx=false " +
                          flags + " >" + out + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream in(out);
  std::stringstream text;
  text << in.rdbuf();
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, text.str()};
}

TEST_F(NamespacesReloadTest, AnEncodedNamespaceServesTheDecodedBlockAndSaysItIsLossy) {
  WriteFile(path_,
            "namespaces:\n"
            "  small-model:\n"
            "    encoding: int8\n"
            "    lossy: true\n"
            "    layout: {layers: 2, kv_heads: 2, head_dim: 64, tokens: 16, dtype: fp16}\n");
  DaemonProcess d(std::vector<std::string>{"--namespaces_file=" + path_});
  ASSERT_OK(d.Start());
  auto client = d.Connect("small-model");
  ASSERT_NE(client, nullptr);
  auto v = client->Policies("small-model");
  ASSERT_OK(v);
  ASSERT_EQ(v->namespaces.size(), 1u);
  EXPECT_EQ(v->namespaces[0].encoding, "int8 (2x2x64, 16 tokens, fp16)");

  // One block of the layout (16 KiB of fp16 KV) and one of another size.
  const kernels::BlockLayout layout = tiers::SmallLayout();
  Chain c = MakeChain(5, 2, kernels::RawBytes(layout));
  c.blocks[1].resize(5000);
  for (size_t i = 0; i < c.blocks[0].size(); i += 2) {
    const uint16_t h = kernels::FloatToHalf(static_cast<float>((i * 37) % 200) / 50.0f - 2.0f);
    std::memcpy(c.blocks[0].data() + i, &h, 2);
  }
  Put(*client, c);
  auto evicted = client->Evict(Tier::kHost, c.keys);
  ASSERT_OK(evicted);
  EXPECT_EQ(evicted->evicted, 2u);

  // What kvpool must serve: the kernels' own int8 round trip of the block.
  kernels::BlockLayout encoded = layout;
  encoded.encoding = kernels::Encoding::kInt8;
  std::vector<uint8_t> mid(kernels::EncodedBytes(encoded));
  std::vector<uint8_t> want(c.blocks[0].size());
  const void* in = c.blocks[0].data();
  void* out = mid.data();
  ASSERT_OK(kernels::QuantizeBlocksCpu(encoded, &in, &out, 1));
  const void* cmid = mid.data();
  void* back = want.data();
  ASSERT_OK(kernels::DequantizeBlocksCpu(encoded, &cmid, &back, 1));
  ASSERT_NE(want, c.blocks[0]) << "test bug: int8 should not be exact on these values";

  // A client that accepts encodings gets the stored bytes (and their layout) when it asks not to
  // decode, and the same decoded block as the daemon's when it decodes; the block stays on disk.
  auto as_stored = client->GetBlocks(c.keys, GetOptions{.accept_encoded = true, .decode = false});
  ASSERT_OK(as_stored);
  ASSERT_OK((*as_stored)[0].status);
  EXPECT_EQ((*as_stored)[0].encoding, KVPOOL_ENCODING_INT8);
  EXPECT_EQ((*as_stored)[0].layout.encoding, KVPOOL_ENCODING_INT8);
  EXPECT_EQ((*as_stored)[0].layout.head_dim, 64);
  EXPECT_EQ((*as_stored)[0].bytes, mid);
  ASSERT_OK((*as_stored)[1].status);
  EXPECT_EQ((*as_stored)[1].encoding, 0) << "another size is stored raw";
  EXPECT_EQ((*as_stored)[1].bytes, c.blocks[1]);
  auto decoded_here = client->GetBlocks(c.keys, GetOptions{.accept_encoded = true});
  ASSERT_OK(decoded_here);
  ASSERT_OK((*decoded_here)[0].status);
  EXPECT_EQ((*decoded_here)[0].encoding, 0);
  EXPECT_EQ((*decoded_here)[0].lossy_encoding, KVPOOL_ENCODING_INT8);
  EXPECT_EQ((*decoded_here)[0].bytes, want);
  // Into the caller's buffer: too small for the decoded block is an error for that block only.
  std::vector<uint8_t> small(mid.size()), full(want.size());
  std::vector<MutableBuffer> bufs = {{small.data(), small.size()}, {full.data(), full.size()}};
  const BlockKey first = c.keys[0];
  auto too_small = client->Get({&first, 1}, {bufs.data(), 1}, GetOptions{.accept_encoded = true});
  ASSERT_OK(too_small);
  EXPECT_EQ((*too_small)[0].status.code(), StatusCode::kInvalidArgument);
  auto into = client->Get({&first, 1}, {bufs.data() + 1, 1}, GetOptions{.accept_encoded = true});
  ASSERT_OK(into);
  ASSERT_OK((*into)[0].status);
  EXPECT_EQ((*into)[0].size, want.size());
  EXPECT_EQ(full, want);
  auto where = client->Lookup(c.keys, /*prefetch=*/false);
  ASSERT_OK(where);
  EXPECT_EQ(where->tiers[0], Tier::kDisk) << "read as stored, not promoted";

  auto got = client->GetBlocks(c.keys);
  ASSERT_OK(got);
  ASSERT_OK((*got)[0].status);
  EXPECT_EQ((*got)[0].lossy_encoding, KVPOOL_ENCODING_INT8);
  EXPECT_EQ((*got)[0].bytes, want);
  ASSERT_OK((*got)[1].status);
  EXPECT_EQ((*got)[1].lossy_encoding, 0) << "another size stays raw";
  EXPECT_EQ((*got)[1].bytes, c.blocks[1]);
  ASSERT_OK(d.Stop());
}

TEST_F(NamespacesReloadTest, InvalidFileAtStartStopsTheDaemonWithEveryErrorLine) {
  WriteFile(path_,
            "default: {write: write-through}\n"
            "namespaces:\n"
            "  tenant-a: {eviction: arc}\n"
            "  'bad name': {}\n"
            "  scratch: {admission: none}\n"
            "  other: {evict: lru}\n");
  auto [rc, out] = RunKvpoold(dir_, "--namespaces_file=" + path_);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(rc, 124) << "kvpoold started instead of refusing: " << out;
  for (const std::string& line :
       {path_ + ":3: namespace 'tenant-a': unknown eviction order 'arc' (known: lru, s3fifo, lfu)",
        path_ + ":4: namespace name 'bad name' may only hold letters, digits and . _ - :",
        path_ + ":6: namespace 'other': unknown key 'evict' (known: eviction, write, admission, "
                "read_ahead, encoding, layout, lossy, host_quota, disk_quota, gpu_quota, "
                "credential_file, unix_users, unix_groups)",
        path_ + ":5: namespace 'scratch': write policy 'write-through' writes blocks to disk "
                "that admission 'none' does not take"}) {
    EXPECT_NE(out.find("\n" + line + "\n"), std::string::npos) << line << "\nnot in:\n" << out;
  }
  EXPECT_NE(out.find("invalid namespaces file " + path_ + " (4 errors)"), std::string::npos) << out;
}

TEST_F(NamespacesReloadTest, AnExplicitFileMustExist) {
  auto [rc, out] = RunKvpoold(dir_, "--namespaces_file=" + dir_.Join("missing.yaml"));
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("missing.yaml: no such namespaces file"), std::string::npos) << out;
}

TEST_F(NamespacesReloadTest, AHostQuotaKeepsATenantToItsShareAndOthersKeepTheirs) {
  // 64 MiB of 1 MiB host segments (the test daemon's); tenant-b may hold two of them.
  WriteFile(path_,
            "namespaces:\n  tenant-b: {host_quota: 2MiB, disk_quota: 1GiB, gpu_quota: 4MiB}\n");
  DaemonProcess d(std::vector<std::string>{"--namespaces_file=" + path_});
  ASSERT_OK(d.Start());
  auto a = d.Connect("tenant-a");
  auto b = d.Connect("tenant-b");
  ASSERT_TRUE(a != nullptr && b != nullptr);
  auto v = b->Policies("tenant-b");
  ASSERT_OK(v);
  ASSERT_EQ(v->namespaces.size(), 1u);
  EXPECT_EQ(v->namespaces[0].host_quota_bytes, 2u << 20);
  EXPECT_EQ(v->namespaces[0].disk_quota_bytes, 1u << 30);
  EXPECT_EQ(v->namespaces[0].gpu_quota_bytes, 4u << 20);

  std::vector<Chain> mine, theirs;
  for (uint64_t i = 0; i < 3; ++i) {
    theirs.push_back(MakeChain(100 + i, 4, 256 << 10));
    Put(*a, theirs.back());
  }
  for (uint64_t i = 0; i < 4; ++i) {  // 4 MiB through a 2 MiB quota
    mine.push_back(MakeChain(200 + i, 4, 256 << 10));
    Put(*b, mine.back());
  }
  size_t mine_on_disk = 0;
  for (const Chain& c : mine) {
    auto l = b->Lookup(c.keys, /*prefetch=*/false);
    ASSERT_OK(l);
    for (Tier t : l->tiers) mine_on_disk += t == Tier::kDisk;
  }
  EXPECT_GE(mine_on_disk, 8u) << "tenant-b holds at most 2 MiB of host";
  for (const Chain& c : theirs) {
    auto l = a->Lookup(c.keys, /*prefetch=*/false);
    ASSERT_OK(l);
    EXPECT_EQ(l->tiers, std::vector<Tier>(4, Tier::kHost)) << "tenant-a's blocks were not touched";
  }
  for (const Chain& c : theirs) ExpectAllServed(*a, c);
  for (const Chain& c : mine) ExpectAllServed(*b, c);
}

}  // namespace
}  // namespace kvpool::testing
