#include "tests/support/process_stats.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

namespace kvpool::testing {
namespace {

// The command name and CPU seconds of a /proc .../stat file; false when it cannot be read.
bool ReadStat(const std::string& path, std::string* comm, double* cpu_seconds) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return false;
  char buf[1024];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  // "pid (comm) state ...": the name may hold spaces; utime and stime are fields 14 and 15.
  const char* open = std::strchr(buf, '(');
  const char* close = std::strrchr(buf, ')');
  if (open == nullptr || close == nullptr || close < open) return false;
  comm->assign(open + 1, close);
  unsigned long long utime = 0;
  unsigned long long stime = 0;
  if (std::sscanf(close + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime,
                  &stime) != 2) {
    return false;
  }
  *cpu_seconds = static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
  return true;
}

}  // namespace

ProcessSample SampleProcess(pid_t pid) {
  ProcessSample s;
  const std::string dir = "/proc/" + std::to_string(pid);
  std::string comm;
  (void)ReadStat(dir + "/stat", &comm, &s.cpu_seconds);
  std::error_code ec;
  // Non-throwing steps: threads come and go while this walks.
  for (std::filesystem::directory_iterator it(dir + "/task", ec), end; !ec && it != end;
       it.increment(ec)) {
    double cpu = 0;
    if (ReadStat(it->path().string() + "/stat", &comm, &cpu) &&
        (comm.rfind("kvp-io", 0) == 0 || comm.rfind("kvp-req", 0) == 0)) {
      s.serving_cpu_seconds += cpu;
    }
  }
  if (FILE* f = std::fopen((dir + "/status").c_str(), "r")) {
    char line[256];
    while (std::fgets(line, sizeof(line), f) != nullptr) {
      unsigned long long kib = 0;
      if (std::sscanf(line, "VmRSS: %llu kB", &kib) == 1) s.rss_bytes = kib * 1024;
    }
    std::fclose(f);
  }
  return s;
}

double WaitUntilQuiet(pid_t pid, std::chrono::seconds limit) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  double last = SampleProcess(pid).cpu_seconds;
  while (Clock::now() - start < limit) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const double now = SampleProcess(pid).cpu_seconds;
    if (now - last < 0.05) break;
    last = now;
  }
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace kvpool::testing
