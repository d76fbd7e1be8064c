// Runs the README's client example (examples/quickstart.cc) against a real daemon, twice: the
// second run finds every block cached.

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>

#include "tests/support/daemon_process.h"
#include "tests/support/status_matchers.h"

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

}  // namespace
}  // namespace kvpool::testing
