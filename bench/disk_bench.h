#pragma once
// kvpool-bench --disk: the disk tier's get beside fio reading the same bytes from the same file
// system at the same depth (docs/BENCHMARKS.md, "The disk tier beside fio").
//
// kvpoold (started here, write-through, a one-segment host tier, `readers` promotion threads) is
// filled with `working_set` bytes of independent blocks (no parents, so no read-ahead reads
// more than is asked), and waits until RocksDB is quiet. Every file under its data directory is
// then dropped from the page cache (fdatasync + POSIX_FADV_DONTNEED, as fio's `invalidate`
// does), and `readers` threads, each over its own connection, get the blocks that the fill left
// on disk alone, in a random order, one block per call, each exactly once; every block is
// compared byte for byte with what was put. A get of a disk block is the whole path: the
// daemon's promotion (RocksDB read, checksum, copy into the host arena) and the client's copy out
// of shared memory.
//
// The peer: fio `randread` of a file of the same size in the same directory, `readers` jobs of
// one synchronous read at a time (psync, iodepth 1) over disjoint parts of the file, each part
// read once, block-sized reads, cold (invalidate=1), both buffered (as RocksDB reads) and
// O_DIRECT; the ratio is to the faster. Skipped with a line saying so when fio is not on PATH.
//
// Thread safety: RunDiskBench is called from one thread.

#include <cstdint>
#include <functional>
#include <string>

#include "bench/pinning.h"
#include "bench/runner.h"

namespace kvpool::bench {

struct DiskBenchConfig {
  std::string kvpoold;                // the daemon binary
  uint64_t block_bytes = 1ull << 20;  // bytes of every block and of every fio read
  uint64_t working_set = 2ull << 30;  // bytes put, and the size of fio's file
  int readers = 4;                    // kvpool reader threads, promotion threads and fio jobs
  uint32_t blocks_per_call = 1;       // blocks each kvpool get asks for (fio reads one a call)
  PinPlan pin;                        // the daemon on daemon_cpus; readers and fio on bench_cpus
};

// Emits, at `block_bytes` and concurrency `readers`: system "kvpool" path "disk" op "get" (with
// extra blocks_from_disk, blocks, cold, ratio_to_fio), and system "fio" path "buffered" and
// "direct" op "randread" (with extra command). NotFound-free: a missing fio is a line on stderr.
Status RunDiskBench(const DiskBenchConfig& config, const std::function<void(Figure)>& emit);

}  // namespace kvpool::bench
