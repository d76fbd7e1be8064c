#pragma once
// kvpool-bench --scale: how kvpoold's costs grow with what it holds (docs/BENCHMARKS.md, "How
// cost grows").
//
// Three curves, each on a kvpoold of its own that this bench starts (write-through, so every
// block is on disk and the bulk of a large cache lives there, as in production):
//
//   blocks:      the index grown to each of `blocks` (chains of `chain_blocks` blocks of
//                `block_bytes`, one namespace). At each size: the fill rate, the index rebuilt
//                by a restart (blocks and seconds as the daemon itself reports them, and the
//                restart's wall time), then lookups of whole random chains and gets of 16
//                blocks of a random chain (each verified byte for byte), each with p50, p99,
//                ops/s and the daemon's CPU time per call, and the daemon's resident memory and
//                index bytes.
//   connections: on the largest cache, `clients` connections each looking up random chains
//                back to back (closed loop), at each count.
//   namespaces:  `namespaces` tenants, each holding one chain of its own; lookups and gets by
//                one thread over a connection per tenant, a random tenant per call.
//
// Lookups ask without prefetch, so a lookup's figure is the index's cost alone. Any miss, wrong
// byte or error ends the run with an error. Nothing here asserts a time.
//
// Thread safety: RunScale is called from one thread (the one the daemons live as long as).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench/pinning.h"
#include "bench/runner.h"

namespace kvpool::bench {

struct ScaleConfig {
  std::string kvpoold;                    // the daemon binary
  std::vector<uint64_t> blocks;           // index sizes of the blocks curve, ascending
  uint64_t block_bytes = 4096;            // bytes of every block
  uint32_t chain_blocks = 64;             // blocks per chain; a lookup asks for a whole chain
  uint32_t get_batch = 16;                // blocks per get call (a window of one chain)
  std::vector<int> clients;               // connection counts of the connections curve
  std::vector<int> namespaces;            // tenant counts of the namespaces curve, ascending
  double seconds = 2;                     // per measured phase
  uint64_t host_capacity = 256ull << 20;  // the blocks curve's host tier
  PinPlan pin;
};

// Runs the curves, handing each figure to `emit` as it is made. Figures: system "kvpool", path
// "shm", op "fill" / "rebuild" / "lookup" / "get", and extra["curve"] ("blocks", "connections",
// "namespaces") with the x value ("indexed_blocks", "connections", "namespaces") and the
// daemon's figures ("daemon_cpu_us_per_op", "daemon_rss_bytes", "index_bytes", ...).
Status RunScale(const ScaleConfig& config, const std::function<void(Figure)>& emit);

// The table printed after a --scale run (one row per figure, by curve).
std::string FormatScaleTable(const std::vector<Figure>& figures);

}  // namespace kvpool::bench
