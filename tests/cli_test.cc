// The kvpool command line against a real kvpoold: each command's output and exit status.

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/support/daemon_process.h"
#include "tests/support/status_matchers.h"

namespace kvpool::testing {
namespace {

struct CliRun {
  int status = -1;
  std::string out;
};

CliRun Cli(const std::string& args) {
  CliRun r;
  const std::string cmd = std::string(KVPOOL_CLI_PATH) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

TEST(CliTest, CommandsAgainstALiveDaemon) {
  DaemonProcess d;
  ASSERT_OK(d.Start());
  const std::string sock = " --socket=" + d.socket_path();
  // Put a chain through the client, as a worker would.
  const std::vector<int32_t> tokens = Tokens(4, 16 * 6 + 3);
  ChainHasher hasher("tenant-a", kTestLayout, 16);
  const std::vector<BlockKey> keys = hasher.Hash(tokens);
  auto c = d.Connect("tenant-a");
  std::vector<std::vector<uint8_t>> blocks;
  for (size_t i = 0; i < 4; ++i) blocks.push_back(BlockBytes(i, 1000));
  std::vector<std::span<const uint8_t>> spans(blocks.begin(), blocks.end());
  ASSERT_TRUE(c->PutChain(std::span(keys).first(4), spans).ok());
  Session s;
  s.session_id = "conv-1";
  s.keys.assign(keys.begin(), keys.begin() + 4);
  s.token_count = 64;
  ASSERT_TRUE(c->SaveSession(s).ok());

  CliRun status = Cli("status" + sock);
  EXPECT_EQ(status.status, 0) << status.out;
  EXPECT_NE(status.out.find("host:"), std::string::npos) << status.out;

  CliRun stats = Cli("stats --json" + sock);
  ASSERT_EQ(stats.status, 0) << stats.out;
  auto j = nlohmann::json::parse(stats.out);
  EXPECT_EQ(j["puts_committed"], 4);
  EXPECT_EQ(j["tiers"][0]["name"], "host");
  CliRun text = Cli("stats" + sock);
  ASSERT_EQ(text.status, 0) << text.out;
  EXPECT_NE(text.out.find("puts: blocks offered"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("index rebuilt at start from 0 disk blocks"), std::string::npos)
      << text.out;

  TempDir dir;
  const std::string tokens_file = dir.path() + "/tokens.txt";
  {
    std::ofstream f(tokens_file);
    for (int32_t t : tokens) f << t << " ";
  }
  CliRun lookup = Cli("lookup --tokens-file=" + tokens_file + " --namespace tenant-a --layout='" +
                      kTestLayout + "'" + sock);
  EXPECT_EQ(lookup.status, 0) << lookup.out;
  EXPECT_NE(lookup.out.find("cached prefix: 4 of 6 blocks, 64 of 99 tokens"), std::string::npos)
      << lookup.out;
  EXPECT_NE(lookup.out.find("host"), std::string::npos);
  // Another namespace sees nothing.
  CliRun other = Cli("lookup --tokens-file=" + tokens_file +
                     " --namespace=tenant-b --secret=tenant-a "
                     "--layout='" +
                     std::string(kTestLayout) + "'" + sock);
  EXPECT_NE(other.out.find("cached prefix: 0 of 6"), std::string::npos) << other.out;

  CliRun ls = Cli("sessions ls --namespace=tenant-a" + sock);
  EXPECT_EQ(ls.status, 0);
  EXPECT_NE(ls.out.find("conv-1"), std::string::npos) << ls.out;
  CliRun show = Cli("sessions show conv-1 --namespace=tenant-a --json" + sock);
  ASSERT_EQ(show.status, 0) << show.out;
  auto sj = nlohmann::json::parse(show.out);
  EXPECT_EQ(sj["keys"].size(), 4u);
  EXPECT_EQ(sj["keys"][0], keys[0].ToHex());
  CliRun rm = Cli("sessions rm conv-1 --namespace=tenant-a" + sock);
  EXPECT_EQ(rm.status, 0) << rm.out;
  CliRun gone = Cli("sessions show conv-1 --namespace=tenant-a" + sock);
  EXPECT_EQ(gone.status, 1);
  EXPECT_NE(gone.out.find("NotFound"), std::string::npos) << gone.out;

  EXPECT_EQ(Cli("frobnicate" + sock).status, 2);
  CliRun down = Cli("status --socket=" + dir.path() + "/nothing.sock");
  EXPECT_EQ(down.status, 1);
  EXPECT_NE(down.out.find("cannot reach kvpoold"), std::string::npos) << down.out;
}

// Looking at a namespace's policies does not create it: a hello would register the name for
// good, counted against --max_namespaces (the CLI asks through the default namespace).
TEST(CliTest, PoliciesShowCreatesNoNamespace) {
  DaemonProcess d(std::vector<std::string>{"--max_namespaces=3"});
  ASSERT_OK(d.Start());
  const std::string sock = " --socket=" + d.socket_path();
  for (const char* typo : {"typo-1", "typo-2", "typo-3", "typo-4"}) {
    CliRun shown = Cli(std::string("policies show --json --namespace=") + typo + sock);
    EXPECT_EQ(shown.status, 0) << shown.out;
    EXPECT_NE(shown.out.find(std::string(R"("namespace": ")") + typo), std::string::npos)
        << shown.out;
  }
  CliRun real = Cli("status --namespace=real" + sock);
  EXPECT_EQ(real.status, 0) << real.out;
}

}  // namespace
}  // namespace kvpool::testing
