// kvpool-segment-handoff: what a namespace waits for when it takes a host segment another
// namespace emptied (tiers/segment_pages.h). Namespace 1 fills every segment of a HostTier with
// one block and, one at a time, empties a segment; after an idle gap (longer than the tier's
// spare_after) namespace 2 allocates a segment-sized block, timed; or at once, as an eviction
// to make room does, namespace 1 takes it back, timed (no renewal at all). Without spare
// segments namespace 2's allocation renews the vacant segment itself (a fresh memfd populated
// and locked, the old one released); with spare segments the tier's thread has renewed it
// during the gap; with a standby segment the renewal moves memory the thread made ahead over the
// segment (and the old memfd is released by the thread). Figures in docs/BENCHMARKS.md.

#include <gflags/gflags.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/units.h"
#include "tiers/host_tier.h"

DEFINE_string(segment_size, "64MiB", "Host segment size.");
DEFINE_uint32(segments, 8, "Segments in the arena (and handoffs measured).");
DEFINE_uint32(gap_ms, 1200, "Idle time between emptying a segment and the next allocation.");
DEFINE_uint32(spare_after_ms, 1000,
              "HostTierOptions::spare_after: how long a segment stays vacant before the tier's "
              "thread may renew it (kvpoold: 1 s).");
DEFINE_bool(lock_memory, true, "mlock the arena, as kvpoold does by default.");

namespace {

using kvpool::tiers::HostSlot;
using kvpool::tiers::HostTier;
using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

void Report(const char* what, std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  std::printf("%-44s n=%zu  p50 %9.3f ms  max %9.3f ms\n", what, ms.size(), ms[ms.size() / 2],
              ms.back());
}

// One run: `spares` clean segments and `standby` segments' memory kept by the tier's thread.
int Run(uint64_t segment_bytes, uint32_t spares, uint32_t standby) {
  kvpool::tiers::HostTierOptions o;
  o.capacity_bytes = segment_bytes * FLAGS_segments;
  o.segment_bytes = segment_bytes;
  o.lock_memory = FLAGS_lock_memory;
  o.spare_segments = spares;
  o.spare_after = std::chrono::milliseconds(FLAGS_spare_after_ms);
  o.standby_segments = standby;
  kvpool::Result<std::unique_ptr<HostTier>> made = HostTier::Create(o);
  if (!made.ok()) {
    std::fprintf(stderr, "%s\n", made.status().ToString().c_str());
    return 1;
  }
  HostTier& tier = **made;
  std::vector<HostSlot> ns1;
  for (uint32_t i = 0; i < FLAGS_segments; ++i) ns1.push_back(*tier.Allocate(1, segment_bytes));
  std::vector<double> handoff;
  std::vector<double> take_back;
  std::vector<HostSlot> ns2;
  for (uint32_t i = 0; i < FLAGS_segments; ++i) {
    tier.Free(ns1[i]);
    if (i % 2 == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(FLAGS_gap_ms));
      const auto t0 = Clock::now();
      kvpool::Result<HostSlot> s = tier.Allocate(2, segment_bytes);
      handoff.push_back(Ms(Clock::now() - t0));
      if (!s.ok()) {
        std::fprintf(stderr, "%s\n", s.status().ToString().c_str());
        return 1;
      }
      ns2.push_back(*s);
    } else {
      const auto t0 = Clock::now();
      kvpool::Result<HostSlot> s = tier.Allocate(1, segment_bytes);
      take_back.push_back(Ms(Clock::now() - t0));
      if (!s.ok()) return 1;
      ns1[i] = *s;
    }
  }
  const kvpool::tiers::HostTierStats st = tier.GetStats();
  std::printf(
      "spare_segments=%u (after %u ms vacant), standby_segments=%u, %s segments, gap %u ms, mlock "
      "%s; renewals %llu, from standby %llu\n",
      spares, FLAGS_spare_after_ms, standby, kvpool::FormatBytes(segment_bytes).c_str(),
      FLAGS_gap_ms, st.locked ? "yes" : "no", static_cast<unsigned long long>(st.renewals),
      static_cast<unsigned long long>(st.renewals_from_standby));
  Report("  another namespace takes an emptied segment", handoff);
  Report("  its namespace takes it back", take_back);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  kvpool::Result<uint64_t> seg = kvpool::ParseBytes(FLAGS_segment_size);
  if (!seg.ok()) {
    std::fprintf(stderr, "--segment_size: %s\n", seg.status().ToString().c_str());
    return 2;
  }
  const std::pair<uint32_t, uint32_t> runs[] = {{0, 0}, {2, 0}, {0, 1}};
  for (auto [spares, standby] : runs) {
    if (Run(*seg, spares, standby) != 0) return 1;
  }
  return 0;
}
