// Runs the README's client example (examples/quickstart.cc) against a real daemon, twice: the
// second run finds every block cached. Runs examples/custom_eviction.cc, a daemon with an eviction
// order of its own, chosen by name in a namespaces file.

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <vector>

#include "tests/support/daemon_process.h"
#include "tests/support/status_matchers.h"
#include "tests/support/temp_dir.h"

namespace kvpool::testing {
namespace {

std::string RunExample(const std::string& socket, int* status) {
  const std::string cmd = std::string(KVPOOL_QUICKSTART_PATH) + " " + socket + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[1024];
  size_t n;
  while (p != nullptr && (n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int st = p ? pclose(p) : -1;
  *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

TEST(ExampleTest, QuickstartRunsAgainstADaemon) {
  DaemonProcess d;
  ASSERT_OK(d.Start());
  int status = -1;
  std::string out = RunExample(d.socket_path(), &status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("cached prefix: 0 of 8 blocks"), std::string::npos) << out;
  EXPECT_NE(out.find("stored 8 blocks, 0 were already cached"), std::string::npos) << out;
  EXPECT_NE(out.find("fetched 8 blocks, byte-identical"), std::string::npos) << out;
  out = RunExample(d.socket_path(), &status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("cached prefix: 8 of 8 blocks"), std::string::npos) << out;
  EXPECT_NE(out.find("stored 0 blocks, 8 were already cached"), std::string::npos) << out;
  EXPECT_NE(out.find("session chat-42: 8 blocks, 8 cached"), std::string::npos) << out;
}

BlockKey RandomKey(std::mt19937_64& rng) {
  BlockKey k;
  for (auto& b : k.bytes) b = static_cast<uint8_t>(rng());
  return k;
}

TEST(ExampleTest, ACustomEvictionOrderIsNamedInTheNamespacesFile) {
  TempDir dir("kvpool-custom-eviction");
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  const std::string file = dir.Join("namespaces.yaml");
  std::ofstream(file) << "namespaces:\n"
                         "  mixed: {eviction: largest-first, admission: none, read_ahead: none}\n";
  DaemonProcessOptions o;
  o.binary = KVPOOL_CUSTOM_EVICTION_PATH;
  o.flags = {"--namespaces_file=" + file, "--host_capacity=8MiB", "--host_segment_size=1MiB",
             "--disk_capacity=64MiB",     "--lock_memory=false",  "--io_threads=2",
             "--worker_threads=8"};
  DaemonProcess d(o);
  ASSERT_OK(d.Start());
  auto client = d.Connect("mixed");
  ASSERT_NE(client, nullptr);
  auto v = client->Policies("mixed");
  ASSERT_OK(v);
  ASSERT_EQ(v->namespaces.size(), 1u);
  EXPECT_EQ(v->namespaces[0].eviction, "largest-first");

  // 16 small blocks first (the oldest), then 10 MiB of large ones into an 8 MiB host tier whose
  // disk takes nothing: LRU would drop the small ones first, largest-first keeps them.
  std::mt19937_64 rng(7);
  std::vector<BlockKey> small, large;
  const std::vector<uint8_t> small_bytes(16 << 10, 0x5a), large_bytes(512 << 10, 0xa5);
  for (int i = 0; i < 16; ++i) {
    small.push_back(RandomKey(rng));
    PutBlock b{small.back(), small_bytes.data(), small_bytes.size(), {}, {}};
    ASSERT_OK(client->Put({&b, 1}));
  }
  for (int i = 0; i < 20; ++i) {
    large.push_back(RandomKey(rng));
    PutBlock b{large.back(), large_bytes.data(), large_bytes.size(), {}, {}};
    ASSERT_OK(client->Put({&b, 1}));
  }
  int large_cached = 0;
  for (const BlockKey& k : large) {
    auto l = client->Lookup({&k, 1}, false);
    ASSERT_OK(l);
    large_cached += static_cast<int>(l->hit_blocks);
  }
  EXPECT_LT(large_cached, 20) << "no pressure: the test proves nothing";
  for (const BlockKey& k : small) {
    auto l = client->Lookup({&k, 1}, false);
    ASSERT_OK(l);
    EXPECT_EQ(l->hit_blocks, 1u) << "a small block was evicted before the large ones";
  }
  ASSERT_OK(d.Stop());
}

}  // namespace
}  // namespace kvpool::testing
