#include "bench/ucx_perftest.h"

#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <thread>
#include <vector>

#include "bench/runner.h"
#include "tests/support/loopback.h"

namespace kvpool::bench {
namespace {

// Waits up to `timeout` for `pid`, then kills it.
void Reap(pid_t pid, std::chrono::seconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

}  // namespace

Result<UcxPerftestResult> RunUcxPerftest(uint64_t message_bytes, double seconds,
                                         const std::vector<int>& server_cpus,
                                         const std::vector<int>& client_cpus) {
  const std::string binary = FindOnPath("ucx_perftest");
  if (binary.empty()) return Status::NotFound("ucx_perftest is not on PATH (Debian: ucx-utils)");
  const uint16_t port = testing::FreeLoopbackPort();
  const uint64_t messages = std::clamp<uint64_t>(
      static_cast<uint64_t>(seconds * 2e9 / static_cast<double>(message_bytes)), 50, 1000000);
  const uint64_t warmup = std::max<uint64_t>(10, messages / 10);

  // The server: one test, then it exits. Loopback tcp only, as the bench's ucx path.
  const pid_t parent = ::getpid();
  const pid_t server = ::fork();
  if (server < 0) return Status::FromErrno(errno, "fork");
  if (server == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    cpu_set_t set;
    CPU_ZERO(&set);
    if (server_cpus.empty()) {
      for (long c = 0; c < ::sysconf(_SC_NPROCESSORS_ONLN); ++c) CPU_SET(c, &set);
    } else {
      for (int c : server_cpus) CPU_SET(c, &set);
    }
    ::sched_setaffinity(0, sizeof(set), &set);
    ::setenv("UCX_TLS", "tcp", 1);
    ::setenv("UCX_NET_DEVICES", "lo", 1);
    if (FILE* null = std::freopen("/dev/null", "w", stdout)) (void)null;
    if (FILE* null = std::freopen("/dev/null", "w", stderr)) (void)null;
    const std::string p = std::to_string(port);
    ::execl(binary.c_str(), "ucx_perftest", "-p", p.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  UcxPerftestResult r;
  r.command = "UCX_TLS=tcp UCX_NET_DEVICES=lo taskset -c " + CpuList(client_cpus) + " " + binary +
              " 127.0.0.1 -p " + std::to_string(port) + " -t tag_bw -s " +
              std::to_string(message_bytes) + " -n " + std::to_string(messages) + " -w " +
              std::to_string(warmup);
  // The server may not listen yet: a refused client is tried again (it exits at once).
  std::pair<std::string, int> run;
  for (int attempt = 0; attempt < 50; ++attempt) {
    run = CaptureCommand(r.command);
    if (run.second == 0 || run.first.find("Final:") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  Reap(server, std::chrono::seconds(10));
  // "Final:  ITERS  p50  avg  overall(usec)  MB/s-avg  MB/s-overall  msg/s-avg  msg/s-overall"
  const size_t at = run.first.find("Final:");
  if (run.second != 0 || at == std::string::npos) {
    return Status::Internal("ucx_perftest failed (exit " + std::to_string(run.second) +
                            "): " + run.first.substr(0, 2000));
  }
  std::istringstream line(run.first.substr(at + 6, run.first.find('\n', at) - at - 6));
  std::vector<double> v;
  for (double x; line >> x;) v.push_back(x);
  if (v.size() < 8 || v[5] <= 0) {
    return Status::Internal("cannot read ucx_perftest's Final line: " + run.first.substr(at, 200));
  }
  r.messages = static_cast<uint64_t>(v[0]);
  r.message_us = v[3];
  r.gbps = v[5] * 1048576.0 / 1e9;  // ucx_perftest's MB is 2^20 bytes
  return r;
}

}  // namespace kvpool::bench
