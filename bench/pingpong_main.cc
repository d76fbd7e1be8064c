// kvpool-pingpong: the round trip's floor on this machine. Two threads, pinned to different CPUs
// (the daemon's and the bench's under kvpool-bench --pin), send 64 bytes back and forth over a
// Unix socketpair, either sleeping in read() for each answer or spinning on a non-blocking
// recv(). The gap between the two is what waking a sleeping thread costs (on a VM, a halted
// vCPU); kvpool's busy polling (ClientOptions::busy_poll, --io_busy_poll_us) spends a core to
// avoid it. docs/BENCHMARKS.md, "The round trip itself".

#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include <gflags/gflags.h>

DEFINE_int32(round_trips, 20000, "Round trips per mode.");
DEFINE_int32(server_cpu, 0, "CPU of the answering thread.");
DEFINE_int32(client_cpu, 1, "CPU of the asking thread.");

namespace {

void Pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  (void)sched_setaffinity(0, sizeof(set), &set);
}

// Reads up to n bytes: spinning on MSG_DONTWAIT, or sleeping in read().
ssize_t Receive(int fd, char* buf, size_t n, bool spin) {
  if (!spin) return ::read(fd, buf, n);
  for (;;) {
    const ssize_t got = ::recv(fd, buf, n, MSG_DONTWAIT);
    if (got >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) return got;
  }
}

void Run(bool spin) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
    std::perror("socketpair");
    std::exit(1);
  }
  std::thread server([&] {
    Pin(FLAGS_server_cpu);
    char buf[64];
    for (;;) {
      const ssize_t n = Receive(sv[1], buf, sizeof(buf), spin);
      if (n <= 0 || ::write(sv[1], buf, static_cast<size_t>(n)) != n) return;
    }
  });
  Pin(FLAGS_client_cpu);
  std::vector<double> us;
  us.reserve(static_cast<size_t>(FLAGS_round_trips));
  char buf[64] = {};
  for (int i = 0; i < FLAGS_round_trips; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (::write(sv[0], buf, sizeof(buf)) != sizeof(buf)) break;
    for (size_t got = 0; got < sizeof(buf);) {
      const ssize_t n = Receive(sv[0], buf + got, sizeof(buf) - got, spin);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  ::close(sv[0]);
  server.join();
  ::close(sv[1]);
  std::sort(us.begin(), us.end());
  if (us.empty()) return;
  std::printf("%-9s %8zu round trips  p50 %7.1f us  p99 %7.1f us\n", spin ? "spinning" : "sleeping",
              us.size(), us[us.size() / 2], us[us.size() * 99 / 100]);
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("kvpool-pingpong [--round_trips=N] [--server_cpu=0] [--client_cpu=1]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  Run(/*spin=*/false);
  Run(/*spin=*/true);
  return 0;
}
