#pragma once
// What /proc says of a running process: the CPU time of all its threads and of kvpoold's serving
// threads (kvp-io-*, kvp-req-*: common/threads.h), and its resident memory. The benches that
// start their own kvpoold (kvpool-bench --scale, --disk) and the soak test read it.
//
// Thread safety: pure functions of /proc.

#include <sys/types.h>

#include <chrono>
#include <cstdint>

namespace kvpool::testing {

struct ProcessSample {
  double cpu_seconds = 0;          // user + system, all threads
  double serving_cpu_seconds = 0;  // user + system, the threads named kvp-io-* and kvp-req-*
  uint64_t rss_bytes = 0;          // VmRSS
};

// Zeros for what could not be read (the process has gone).
ProcessSample SampleProcess(pid_t pid);

// Waits until `pid` is quiet (under a tenth of a CPU over half a second: RocksDB done compacting
// what a fill wrote, a restart's first flushes over), at most `limit`. Returns the seconds waited.
double WaitUntilQuiet(pid_t pid, std::chrono::seconds limit);

}  // namespace kvpool::testing
