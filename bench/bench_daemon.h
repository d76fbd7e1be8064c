#pragma once
// The kvpoold that kvpool-bench and kvpool-cluster-bench start for themselves: the shared child
// process helper (tests/support/daemon_process.h) with the benches' flags, a host tier sized for
// the run in whole 64 MiB segments, and nothing kept at exit.
//
// Thread safety: pure functions.

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/support/daemon_process.h"

namespace kvpool::bench {

using testing::DaemonProcess;
using testing::DaemonProcessOptions;

// Options for a bench daemon at `binary` whose host tier holds `host_capacity_bytes` (rounded up
// to whole 64 MiB segments); `extra_flags` follow (a later flag wins).
// The kvpoold a bench starts: `given` (its --kvpoold flag) when set, else the build tree's
// (<this binary's dir>/../daemon/kvpoold), else one beside this binary.
inline std::string FindKvpoold(const std::string& given) {
  if (!given.empty()) return given;
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "kvpoold";
  const std::filesystem::path dir = self.parent_path();
  for (const std::filesystem::path& p : {dir / ".." / "daemon" / "kvpoold", dir / "kvpoold"}) {
    if (std::filesystem::exists(p, ec)) return std::filesystem::weakly_canonical(p, ec).string();
  }
  return (dir / ".." / "daemon" / "kvpoold").string();
}

inline DaemonProcessOptions BenchDaemonOptions(const std::string& binary,
                                               uint64_t host_capacity_bytes,
                                               std::vector<std::string> extra_flags = {}) {
  constexpr uint64_t kSegment = 64ull << 20;
  const uint64_t segments = std::max<uint64_t>(1, (host_capacity_bytes + kSegment - 1) / kSegment);
  DaemonProcessOptions o;
  o.binary = binary;
  o.dir_prefix = "kvpool-bench";
  o.flags = {
      "--host_capacity=" + std::to_string(segments * 64) + "MiB",
      "--host_segment_size=64MiB",
      // The disk tier only has to exist: the host tier is sized so nothing is demoted.
      "--disk_capacity=1GiB",
      // Nothing here is worth keeping; writing the arena to RocksDB at exit would only be slow.
      "--flush_on_shutdown=false",
  };
  o.flags.insert(o.flags.end(), extra_flags.begin(), extra_flags.end());
  return o;
}

}  // namespace kvpool::bench
