// kvpool-bench: put, get and lookup through kvpoold, on each data path (socket, shm, ucx), beside
// a Redis peer storing the same blocks, every figure beside the machine's own limit (single-thread
// memcpy of the same block size) and a bare Unix-socketpair get, measured in the same run. See
// docs/BENCHMARKS.md for what the figures mean and the recorded results, and `kvpool-bench
// --help` for the flags.
//
// A run: start a kvpoold on a temp dir (or use --socket; with the ucx path it also listens on
// TCP loopback) and a redis-server on a loopback port (or use --redis), put a 1,000-block chain
// for the lookups, then for each block size measure memcpy and the socketpair, and for each
// system/path and concurrency a put phase (fresh keys) and a get phase (of what was put, a sample
// checked byte for byte), then drop those blocks; then the lookups, the mixed-size fragmentation
// probe, and stop the servers. Any wrong byte, miss or error ends the run with exit status 1.

#include <gflags/gflags.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "bench/bench_daemon.h"
#include "bench/bench_target.h"
#include "bench/block_data.h"
#include "bench/disk_bench.h"
#include "bench/kvpool_target.h"
#include "bench/pinning.h"
#include "bench/redis_target.h"
#include "bench/runner.h"
#include "bench/scale_bench.h"
#include "bench/ucx_perftest.h"
#include "bench/workers.h"
#include "common/units.h"

DEFINE_bool(json, false, "Print one JSON object per result line (and nothing else) on stdout.");
DEFINE_string(block_sizes, "64KiB,256KiB,1MiB,4MiB", "Block sizes to measure, comma separated.");
DEFINE_string(concurrency, "1,4", "Bench threads (each with its own connection), comma separated.");
DEFINE_string(paths, "socket,shm,ucx",
              "kvpool data paths to measure: socket (block bytes inside the control frames), "
              "shm (the client copies to and from the daemon's shared-memory arena) and ucx "
              "(UCX tagged messages over UCX's tcp transport on the loopback device; the control "
              "connection is TCP to 127.0.0.1).");
DEFINE_string(systems, "kvpool,redis",
              "Systems to measure: kvpool (on each of --paths; required: it also serves the "
              "lookups and the fragmentation probe) and redis (SET/GET of the same blocks "
              "through hiredis over loopback TCP, path \"tcp\").");
DEFINE_string(concurrent_paths, "shm,ucx",
              "Paths (or \"redis\") measured at every --concurrency value; the others only at "
              "the first. The default leaves out socket and redis at x4 to keep a run near 2 "
              "minutes on 2 cores.");
DEFINE_string(redis, "",
              "Use the Redis at this loopback HOST:PORT instead of starting one (its keys are "
              "the bench's own block keys + \"kv_bytes\"; it must not evict).");
DEFINE_string(redis_server, "redis-server", "redis-server to start (without --redis).");
DEFINE_string(redis_paths, "tcp,tcp1",
              "How the Redis peer is driven: tcp (a call's 16 commands pipelined) and tcp1 (one "
              "command per round trip). Each kvpool put and get is set beside the faster of "
              "those measured (ratio_to_redis_best).");
DEFINE_string(ucx_address, "",
              "With --socket and the ucx path: the daemon's TCP control address, "
              "tcp://127.x.x.x:PORT (loopback only).");
DEFINE_double(seconds, 2.0,
              "Length of each timed phase (put, get, lookup; memcpy runs min(this, 1 s)). A put "
              "phase also ends when its working set is stored. 0: no time limit (use --ops).");
DEFINE_uint64(ops, 0,
              "Calls per phase over all threads; 0: no limit. With --ops and no --seconds, phases "
              "run until the count.");
DEFINE_uint32(batch, 16, "Blocks per put or get call; the latency figures are per call.");
DEFINE_string(working_set, "1GiB",
              "Bytes of fresh blocks one put phase may store (split over the threads); the get "
              "phase reads them back.");
DEFINE_string(socket, "",
              "Use the kvpoold at this address (Unix socket path or tcp://HOST:PORT) instead of "
              "starting one. Its host tier must hold the working set.");
DEFINE_string(kvpoold, "",
              "kvpoold to start. Default: <dir of kvpool-bench>/../daemon/kvpoold, "
              "then <dir of kvpool-bench>/kvpoold.");
DEFINE_string(kvpoold_flags, "",
              "More flags for the started kvpoold, separated by spaces (e.g. --host_huge_pages).");
DEFINE_string(host_capacity, "",
              "Host tier of the started kvpoold. Default: 1.5 x (largest case's working set + "
              "lookup chain), in whole 64 MiB segments.");
DEFINE_string(namespace_name, "kvpool-bench", "Namespace (tenant) the bench acts for.");
DEFINE_bool(pin, false,
            "Pin the started daemon to --daemon_cpus and each bench thread to one of "
            "--bench_cpus. Every figure reports the pinning used.");
DEFINE_uint32(busy_poll_us, 0,
              "Busy-poll window of every kvpool connection (ClientOptions::busy_poll) and of the "
              "started daemon's I/O threads (--io_busy_poll_us): each side spins this long for "
              "the other before it sleeps. 0: both sleep at once.");
DEFINE_bool(fresh_connections, false,
            "Connect each kvpool bench thread anew for every phase, instead of keeping its "
            "connection (and its mappings of the host segments) from phase to phase as an "
            "engine's worker does.");
DEFINE_string(daemon_cpus, "",
              "With --pin: CPUs of the daemon. Default: first half of the "
              "allowed CPUs.");
DEFINE_string(bench_cpus, "", "With --pin: CPUs of the bench threads. Default: the other half.");
DEFINE_uint32(chain_blocks, 1000, "Blocks in the chain each lookup call asks for.");
DEFINE_string(lookup_block_bytes, "64KiB",
              "Block size of the lookup chain (a lookup moves no block bytes; this only sizes "
              "what must be cached).");
DEFINE_uint32(verify_every, 16, "Check every Nth get call byte for byte (and always the first).");
DEFINE_bool(warm_up, true,
            "Before each case's timed put, put the case's working set once untimed and drop it: "
            "what is measured is then a warm store, as in a long-running engine (for kvpool: "
            "host segments its connections have mapped already), not its first touches.");
DEFINE_bool(mixed, true,
            "After the cases, the fragmentation probe: fill the host tier with mixed block sizes, "
            "free a random half, refill (timed), and report the arena's fragmentation.");
DEFINE_double(mixed_fill, 0,
              "Fraction of host capacity the fragmentation probe fills. 0 (default): with the "
              "bench's own kvpoold, all but half a segment (so no segment stays free and free "
              "space is only the holes); with --socket, 0.85 (below kvpoold's default "
              "--host_high_watermark of 0.90).");

DEFINE_bool(scale, false,
            "Instead of the cases above: how cost grows with the cache (bench/scale_bench.h): "
            "the blocks, connections and namespaces curves, each on a kvpoold of its own.");
DEFINE_string(scale_blocks, "10000,100000,1000000",
              "--scale: index sizes of the blocks curve, ascending (empty: no blocks curve).");
DEFINE_string(scale_block_bytes, "4KiB", "--scale: bytes of every block.");
DEFINE_uint32(scale_chain_blocks, 64, "--scale: blocks per chain (a lookup asks a whole chain).");
DEFINE_string(scale_clients, "1,4,16,64,256",
              "--scale: connection counts of the connections curve (on the largest cache).");
DEFINE_string(scale_namespaces, "1,16,128,1024",
              "--scale: tenant counts of the namespaces curve, ascending (empty: none).");

DEFINE_bool(disk, false,
            "Instead of the cases above: the disk tier's get beside fio randread of the same "
            "bytes at the same depth (bench/disk_bench.h), on a kvpoold of its own.");
DEFINE_string(disk_working_set, "2GiB", "--disk: bytes put, read back once from disk.");
DEFINE_string(disk_block_bytes, "1MiB", "--disk: bytes of every block and of every fio read.");
DEFINE_int32(disk_readers, 4, "--disk: reader threads (and promotion threads, and fio jobs).");
DEFINE_uint32(disk_blocks_per_call, 1,
              "--disk: blocks each get asks for (a chain's worth, as an engine loads a prefix); "
              "the latency figures are per call. fio still reads one block a call.");

namespace kvpool::bench {
namespace {

struct Config {
  std::vector<uint64_t> block_sizes;
  std::vector<int> concurrency;
  std::vector<DataPath> paths;
  bool redis = false;
  std::set<std::string> concurrent;  // paths (or "redis") measured at every concurrency
  PhaseLimits limits;
  PhaseLimits memcpy_limits;
  size_t batch = 16;
  uint64_t working_set = 0;
  uint64_t lookup_block_bytes = 0;
  std::string run_secret;
  PinPlan pin;
  bool own_daemon = true;
};

// The segment size the bench gives its own kvpoold (also kvpoold's default).
constexpr uint64_t kSegmentBytes = 64ull << 20;

void Progress(const std::string& line) {
  std::fprintf(stderr, "[kvpool-bench] %s\n", line.c_str());
}

// "a,b,,c" -> {"a", "b", "c"}.
std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    if (comma > pos) out.push_back(text.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return out;
}

std::string SizeName(uint64_t bytes) {
  if (bytes % (1ull << 20) == 0) return std::to_string(bytes >> 20) + "MiB";
  if (bytes % (1ull << 10) == 0) return std::to_string(bytes >> 10) + "KiB";
  return std::to_string(bytes) + "B";
}

Result<Config> ParseConfig() {
  Config c;
  size_t pos = 0;
  const std::string& bs = FLAGS_block_sizes;
  while (pos <= bs.size()) {
    size_t comma = bs.find(',', pos);
    if (comma == std::string::npos) comma = bs.size();
    KVPOOL_ASSIGN_OR_RETURN(uint64_t b, ParseBytes(bs.substr(pos, comma - pos)));
    if (b < 4096 || b > (64ull << 20)) {
      return Status::InvalidArgument("--block_sizes: " + std::to_string(b) +
                                     " is outside 4KiB..64MiB");
    }
    c.block_sizes.push_back(b);
    pos = comma + 1;
  }
  KVPOOL_ASSIGN_OR_RETURN(std::vector<int> conc, ParseCpuList(FLAGS_concurrency));  // "1,4"
  for (int n : conc) {
    if (n < 1 || n > 256) return Status::InvalidArgument("--concurrency must be 1..256");
    c.concurrency.push_back(n);
  }
  pos = 0;
  const std::string& ps = FLAGS_paths;
  while (pos <= ps.size()) {
    size_t comma = ps.find(',', pos);
    if (comma == std::string::npos) comma = ps.size();
    KVPOOL_ASSIGN_OR_RETURN(DataPath p, KvpoolSystem::ParsePath(ps.substr(pos, comma - pos)));
    if (std::find(c.paths.begin(), c.paths.end(), p) == c.paths.end()) c.paths.push_back(p);
    pos = comma + 1;
  }
  bool kvpool = false;
  for (const std::string& s : SplitList(FLAGS_systems)) {
    if (s == "kvpool") {
      kvpool = true;
    } else if (s == "redis") {
      c.redis = true;
    } else {
      return Status::InvalidArgument("--systems: unknown system '" + s + "' (kvpool or redis)");
    }
  }
  if (!kvpool) {
    return Status::InvalidArgument(
        "--systems must include kvpool (it serves the lookups and the fragmentation probe)");
  }
  for (const std::string& p : SplitList(FLAGS_concurrent_paths)) c.concurrent.insert(p);
  if (FLAGS_batch < 1 || FLAGS_batch > 4096) {
    return Status::InvalidArgument("--batch must be 1..4096");
  }
  c.batch = FLAGS_batch;
  if (FLAGS_seconds < 0) return Status::InvalidArgument("--seconds must be >= 0");
  const bool seconds_default = gflags::GetCommandLineFlagInfoOrDie("seconds").is_default;
  c.limits.seconds = FLAGS_ops > 0 && seconds_default ? 0 : FLAGS_seconds;
  c.limits.max_ops = FLAGS_ops;
  if (c.limits.seconds == 0 && c.limits.max_ops == 0) {
    return Status::InvalidArgument("--seconds=0 needs --ops");
  }
  c.memcpy_limits = c.limits;
  if (c.memcpy_limits.seconds > 1) c.memcpy_limits.seconds = 1;
  KVPOOL_ASSIGN_OR_RETURN(c.working_set, ParseBytes(FLAGS_working_set));
  KVPOOL_ASSIGN_OR_RETURN(c.lookup_block_bytes, ParseBytes(FLAGS_lookup_block_bytes));
  if (c.lookup_block_bytes < 4096 || c.lookup_block_bytes > (64ull << 20)) {
    return Status::InvalidArgument("--lookup_block_bytes must be 4KiB..64MiB");
  }
  if (FLAGS_chain_blocks < 1) return Status::InvalidArgument("--chain_blocks must be >= 1");
  if (FLAGS_mixed_fill < 0 || FLAGS_mixed_fill >= 1) {
    return Status::InvalidArgument("--mixed_fill must be in [0, 1)");
  }
  c.run_secret = RandomSecret();
  return c;
}

// Fresh blocks one thread of a put phase may store: its share of the working set, in whole
// batches, at least one batch.
size_t BlocksPerThread(const Config& c, uint64_t block_bytes, int threads) {
  const uint64_t blocks = c.working_set / block_bytes / static_cast<uint64_t>(threads);
  return std::max<size_t>(c.batch, blocks / c.batch * c.batch);
}

uint64_t NeededHostBytes(const Config& c) {
  uint64_t largest = 0;
  for (uint64_t b : c.block_sizes) {
    for (int n : c.concurrency) {
      largest = std::max<uint64_t>(largest, BlocksPerThread(c, b, n) * b * n);
    }
  }
  return largest + static_cast<uint64_t>(FLAGS_chain_blocks) * c.lookup_block_bytes;
}

class Bench {
 public:
  // `systems`: one per (system, path) measured, in the order measured; the first kvpool one
  // also puts the lookup chain and runs the fragmentation probe.
  Bench(Config config, std::vector<std::unique_ptr<BenchSystem>> systems)
      : c_(std::move(config)), systems_(std::move(systems)), system_(FirstKvpool(systems_)) {}

  Status RunAll();
  const std::vector<Figure>& figures() const { return figures_; }

 private:
  Status PutChain();
  Status RunMemcpy(uint64_t block_bytes, const AlignedBuffer& ring);
  Status RunSocketpair(uint64_t block_bytes, const AlignedBuffer& ring);
  // ucx_perftest's tag bandwidth for this message size (the ucx path's limit); a missing binary
  // is a line on stderr, not a failure.
  Status RunUcxPerftestBaseline(uint64_t block_bytes);
  // The baseline figure of `system` for this block size (0 when not measured).
  double Baseline(const std::string& system, uint64_t block_bytes) const;
  void AddBaselines(Figure& f) const;
  Status RunCase(BenchSystem& sys, uint64_t block_bytes, int threads, const PatternSet& pattern,
                 int case_index);
  Status WarmUp(BenchSystem& sys, uint64_t block_bytes, int threads, const PatternSet& pattern,
                int case_index);
  std::vector<std::unique_ptr<PhaseWorker>> PutWorkers(BenchSystem& sys, uint64_t block_bytes,
                                                       int threads, const PatternSet& pattern,
                                                       const std::string& stream,
                                                       std::vector<PutWorker*>* puts);
  Status RunBorrows(BenchSystem& sys, uint64_t block_bytes, int threads, const PatternSet& pattern,
                    const std::vector<StoredBlock>& stored, const std::vector<size_t>& starts);
  Status RunLookups(BenchSystem& sys, int threads);
  Status RunMixed();
  // Whether `sys` is measured at `threads` (every --concurrency value, or only the first).
  bool Measured(const BenchSystem& sys, int threads) const;
  // Adds the arena's state of `sys` now to `f` (and returns it, for deltas).
  Result<ArenaStats> AddArena(BenchSystem& sys, Figure& f);
  Figure NewFigure(const BenchSystem& sys, const std::string& op, uint64_t block_bytes,
                   int threads) const;
  void Emit(Figure f);

  const Config c_;
  const std::vector<std::unique_ptr<BenchSystem>> systems_;
  BenchSystem& system_;  // the first kvpool system

  static BenchSystem& FirstKvpool(const std::vector<std::unique_ptr<BenchSystem>>& systems) {
    for (const auto& s : systems) {
      if (s->system() == "kvpool") return *s;
    }
    return *systems.front();
  }
  std::vector<BlockKey> chain_;
  std::vector<StoredBlock> chain_blocks_;
  std::vector<Figure> figures_;
};

Figure Bench::NewFigure(const BenchSystem& sys, const std::string& op, uint64_t block_bytes,
                        int threads) const {
  Figure f;
  f.system = sys.system();
  f.path = sys.path();
  f.op = op;
  f.block_bytes = block_bytes;
  f.concurrency = threads;
  f.extra["batch"] = c_.batch;
  f.extra["latency"] = "per call";
  f.extra["pin"] = c_.pin.description;
  f.extra["busy_poll_us"] = FLAGS_busy_poll_us;
  f.extra["fresh_connections"] = FLAGS_fresh_connections;
  f.extra["warm_up"] = FLAGS_warm_up;
  f.extra["run"] = c_.run_secret.substr(0, 8);
  return f;
}

// The 1-minute load average: on a shared machine, the context every figure needs.
double LoadAverage() {
  double l = -1;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &l) != 1) l = -1;
    std::fclose(f);
  }
  return l;
}

void Bench::Emit(Figure f) {
  f.extra["loadavg_1m"] = LoadAverage();
  char line[256];
  std::snprintf(line, sizeof(line),
                "%s %s %s %s x%d: %.3f GB/s, %.1f ops/s, p50 %.1f us, p99 %.1f us",
                f.system.c_str(), f.path.c_str(), f.op.c_str(),
                f.block_bytes == 0 ? "mixed" : SizeName(f.block_bytes).c_str(), f.concurrency,
                f.gbps, f.ops_per_s, f.p50_us, f.p99_us);
  Progress(line);
  if (FLAGS_json) {
    std::cout << f.ToJson().dump() << std::endl;
  }
  figures_.push_back(std::move(f));
}

bool Bench::Measured(const BenchSystem& sys, int threads) const {
  return threads == c_.concurrency.front() || c_.concurrent.count(sys.path()) != 0 ||
         c_.concurrent.count(sys.system()) != 0;
}

Result<ArenaStats> Bench::AddArena(BenchSystem& sys, Figure& f) {
  KVPOOL_ASSIGN_OR_RETURN(ArenaStats a, sys.Arena());
  if (a.known) {
    f.extra["host_fragmentation"] = a.fragmentation;
    f.extra["host_capacity_bytes"] = a.capacity_bytes;
    f.extra["host_allocated_bytes"] = a.allocated_bytes;
    f.extra["host_blocks"] = a.blocks;
  }
  return a;
}

Status Bench::PutChain() {
  chain_ = MakeKeys(c_.run_secret, "lookup-chain", FLAGS_chain_blocks);
  PatternSet pattern(c_.lookup_block_bytes, c_.batch, 0xc4a1);
  KVPOOL_ASSIGN_OR_RETURN(std::unique_ptr<BenchTarget> t, system_.NewTarget(0));
  const size_t b = c_.lookup_block_bytes;
  AlignedBuffer buffers(c_.batch * b);
  std::vector<BenchBlock> blocks;
  for (size_t start = 0; start < chain_.size(); start += c_.batch) {
    blocks.clear();
    for (size_t j = 0; j < c_.batch && start + j < chain_.size(); ++j) {
      uint8_t* buf = buffers.data() + j * b;
      std::memcpy(buf, pattern.slot(j), b);
      StampBlock(chain_[start + j], buf, b);
      blocks.push_back(
          {chain_[start + j], buf, b, start + j == 0 ? BlockKey{} : chain_[start + j - 1]});
      chain_blocks_.push_back(
          {chain_[start + j], static_cast<uint32_t>(j), static_cast<uint32_t>(b)});
    }
    KVPOOL_RETURN_IF_ERROR(t->Put(blocks).WithContext("putting the lookup chain"));
  }
  KVPOOL_RETURN_IF_ERROR(VerifyStored(*t, pattern, c_.batch, chain_blocks_));
  KVPOOL_ASSIGN_OR_RETURN(uint32_t hits, t->Lookup(chain_));
  if (hits != chain_.size()) {
    return Status::Internal("the lookup chain was stored but a lookup finds " +
                            std::to_string(hits) + " of its " + std::to_string(chain_.size()) +
                            " blocks");
  }
  return Status::OK();
}

Status Bench::RunMemcpy(uint64_t block_bytes, const AlignedBuffer& ring) {
  std::vector<std::unique_ptr<PhaseWorker>> w;
  w.push_back(std::make_unique<MemcpyWorker>(ring, block_bytes, c_.batch));
  std::vector<int> cpus;
  if (c_.pin.enabled) cpus = {c_.pin.bench_cpus[0]};
  KVPOOL_ASSIGN_OR_RETURN(PhaseStats s, RunPhase(w, cpus, c_.memcpy_limits));
  Figure f = NewFigure(system_, "copy", block_bytes, 1);
  f.system = "memcpy";
  f.path = "memory";
  f.SetFrom(s);
  f.extra["source"] = "ring of " + SizeName(ring.size()) + " (colder than the caches)";
  Emit(std::move(f));
  return Status::OK();
}

Status Bench::RunSocketpair(uint64_t block_bytes, const AlignedBuffer& ring) {
  std::vector<std::unique_ptr<PhaseWorker>> w;
  w.push_back(std::make_unique<SocketpairWorker>(ring, block_bytes, c_.batch, c_.pin.daemon_cpus));
  std::vector<int> cpus;
  if (c_.pin.enabled) cpus = {c_.pin.bench_cpus[0]};
  KVPOOL_ASSIGN_OR_RETURN(PhaseStats s, RunPhase(w, cpus, c_.memcpy_limits));
  Figure f = NewFigure(system_, "stream", block_bytes, 1);
  f.system = "socketpair";
  f.path = "unix";
  f.SetFrom(s);
  f.extra["source"] = "ring of " + SizeName(ring.size()) + "; receiver answers one byte per call";
  Emit(std::move(f));
  return Status::OK();
}

Status Bench::RunUcxPerftestBaseline(uint64_t block_bytes) {
  Result<UcxPerftestResult> r =
      RunUcxPerftest(block_bytes, c_.memcpy_limits.seconds, c_.pin.daemon_cpus, c_.pin.bench_cpus);
  if (!r.ok() && r.status().IsNotFound()) {
    Progress("no ucx path limit in this run: " + r.status().message());
    return Status::OK();
  }
  KVPOOL_RETURN_IF_ERROR(r.status());
  Figure f = NewFigure(system_, "tag_bw", block_bytes, 1);
  f.system = "ucx_perftest";
  f.path = "tcp";
  // Put on the bench's footing: a "call" is a batch's worth of messages.
  const double call_us = r->message_us * static_cast<double>(c_.batch);
  f.gbps = r->gbps;
  f.ops_per_s = call_us > 0 ? 1e6 / call_us : 0;
  f.p50_us = call_us;
  f.p99_us = call_us;
  f.extra["latency"] = "mean of a batch's worth of messages (ucx_perftest reports no tail)";
  f.extra["messages"] = r->messages;
  f.extra["source"] = r->command;
  Emit(std::move(f));
  return Status::OK();
}

double Bench::Baseline(const std::string& system, uint64_t block_bytes) const {
  for (const Figure& f : figures_) {
    if (f.system == system && f.block_bytes == block_bytes) return f.gbps;
  }
  return 0;
}

void Bench::AddBaselines(Figure& f) const {
  const double mem = Baseline("memcpy", f.block_bytes);
  const double sock = Baseline("socketpair", f.block_bytes);
  if (mem > 0) {
    f.extra["memcpy_gbps"] = mem;
    f.extra["ratio_to_memcpy"] = f.gbps / mem;
  }
  if (sock > 0) {
    f.extra["socketpair_gbps"] = sock;
    f.extra["ratio_to_socketpair"] = f.gbps / sock;
  }
  const double ucx = Baseline("ucx_perftest", f.block_bytes);
  if (ucx > 0 && f.path == "ucx") {
    f.extra["ucx_perftest_gbps"] = ucx;
    f.extra["ratio_to_ucx_perftest"] = f.gbps / ucx;
  }
  // Redis at its best for the same operation, block size and concurrency: the faster of its
  // paths (pipelined or one command per round trip), named.
  if (f.system != "kvpool") return;
  const Figure* best = nullptr;
  for (const Figure& r : figures_) {
    if (r.system == "redis" && r.op == f.op && r.block_bytes == f.block_bytes &&
        r.concurrency == f.concurrency && (best == nullptr || r.gbps > best->gbps)) {
      best = &r;
    }
  }
  if (best != nullptr && best->gbps > 0) {
    f.extra["redis_best_gbps"] = best->gbps;
    f.extra["redis_best_path"] = best->path;
    f.extra["ratio_to_redis_best"] = f.gbps / best->gbps;
  }
}

Status Bench::RunCase(BenchSystem& sys, uint64_t block_bytes, int threads,
                      const PatternSet& pattern, int case_index) {
  const std::string tag = sys.system() + " " + sys.path() + " " + SizeName(block_bytes) + " x" +
                          std::to_string(threads);
  if (FLAGS_warm_up) {
    KVPOOL_RETURN_IF_ERROR(
        WarmUp(sys, block_bytes, threads, pattern, case_index).WithContext("warm-up of " + tag));
  }
  KVPOOL_ASSIGN_OR_RETURN(ArenaStats before, sys.Arena());

  // Put: fresh keys only.
  std::vector<PutWorker*> puts;
  std::vector<std::unique_ptr<PhaseWorker>> workers =
      PutWorkers(sys, block_bytes, threads, pattern, "case-" + std::to_string(case_index), &puts);
  Result<PhaseStats> put_stats = RunPhase(workers, c_.pin.bench_cpus, c_.limits);
  std::vector<StoredBlock> stored;
  std::vector<size_t> starts;
  for (PutWorker* p : puts) {
    starts.push_back(stored.size());
    std::vector<StoredBlock> s = p->Stored();
    stored.insert(stored.end(), s.begin(), s.end());
  }
  std::vector<BlockKey> keys;
  for (const StoredBlock& b : stored) keys.push_back(b.key);
  if (!put_stats.ok()) {
    (void)sys.Drop(keys);
    return put_stats.status().WithContext("put " + tag);
  }
  Figure put = NewFigure(sys, "put", block_bytes, threads);
  put.SetFrom(*put_stats);
  KVPOOL_ASSIGN_OR_RETURN(ArenaStats after_put, AddArena(sys, put));
  const bool spilled =
      after_put.demotions != before.demotions || after_put.evictions != before.evictions;
  if (after_put.known) put.extra["spilled_to_disk"] = spilled;
  if (spilled)
    Progress("warning: put " + tag + " demoted or evicted host blocks; size the host tier up");
  AddBaselines(put);
  Emit(std::move(put));

  // Get: what this case stored, each thread from its own part of it.
  workers.clear();
  std::vector<GetWorker*> gets;
  for (int i = 0; i < threads; ++i) {
    auto w = std::make_unique<GetWorker>(sys, i, pattern, c_.batch, stored, starts[i],
                                         FLAGS_verify_every);
    gets.push_back(w.get());
    workers.push_back(std::move(w));
  }
  Result<PhaseStats> get_stats = RunPhase(workers, c_.pin.bench_cpus, c_.limits);
  if (!get_stats.ok()) {
    (void)sys.Drop(keys);
    return get_stats.status().WithContext("get " + tag);
  }
  Figure get = NewFigure(sys, "get", block_bytes, threads);
  get.SetFrom(*get_stats);
  uint64_t verified_calls = 0;
  uint64_t verified_blocks = 0;
  uint64_t slow = 0;
  for (GetWorker* g : gets) {
    verified_calls += g->verified_calls();
    verified_blocks += g->verified_blocks();
    slow += g->slow_tier_hits();
  }
  get.extra["verified_calls"] = verified_calls;
  get.extra["verified_blocks"] = verified_blocks;
  get.extra["distinct_blocks"] = stored.size();
  get.extra["slow_tier_hits"] = slow;
  if (slow > 0) Progress("warning: get " + tag + " was served partly from disk");
  KVPOOL_RETURN_IF_ERROR(AddArena(sys, get).status());
  AddBaselines(get);
  Emit(std::move(get));
  if (sys.lends_in_place()) {
    const Status st = RunBorrows(sys, block_bytes, threads, pattern, stored, starts);
    if (!st.ok()) {
      (void)sys.Drop(keys);
      return st.WithContext("borrow " + tag);
    }
  }
  return sys.Drop(keys).WithContext("dropping the blocks of " + tag);
}

// One PutWorker per thread storing its share of the working set under keys of stream
// `stream`-thread-i (so no two phases share keys); `puts` gets each.
std::vector<std::unique_ptr<PhaseWorker>> Bench::PutWorkers(BenchSystem& sys, uint64_t block_bytes,
                                                            int threads, const PatternSet& pattern,
                                                            const std::string& stream,
                                                            std::vector<PutWorker*>* puts) {
  std::vector<std::unique_ptr<PhaseWorker>> workers;
  const size_t per_thread = BlocksPerThread(c_, block_bytes, threads);
  for (int i = 0; i < threads; ++i) {
    auto w = std::make_unique<PutWorker>(sys, i, pattern, c_.batch, c_.run_secret,
                                         stream + "-thread-" + std::to_string(i), per_thread);
    puts->push_back(w.get());
    workers.push_back(std::move(w));
  }
  return workers;
}

// The case's working set put once, untimed, under keys of its own, then dropped.
Status Bench::WarmUp(BenchSystem& sys, uint64_t block_bytes, int threads, const PatternSet& pattern,
                     int case_index) {
  std::vector<PutWorker*> puts;
  std::vector<std::unique_ptr<PhaseWorker>> workers = PutWorkers(
      sys, block_bytes, threads, pattern, "warm-up-" + std::to_string(case_index), &puts);
  const PhaseLimits until_stored{/*seconds=*/300, /*max_ops=*/0};
  const Status st = RunPhase(workers, c_.pin.bench_cpus, until_stored).status();
  std::vector<BlockKey> keys;
  for (PutWorker* p : puts) {
    for (const StoredBlock& b : p->Stored()) keys.push_back(b.key);
  }
  const Status dropped = sys.Drop(keys);
  KVPOOL_RETURN_IF_ERROR(st);
  return dropped;
}

// The in-place read: a batch lent and released, no byte copied; beside the time memcpy takes
// for the same batch (what a get must at least spend), measured earlier in this run.
Status Bench::RunBorrows(BenchSystem& sys, uint64_t block_bytes, int threads,
                         const PatternSet& pattern, const std::vector<StoredBlock>& stored,
                         const std::vector<size_t>& starts) {
  for (const bool verify : {false, true}) {
    std::vector<std::unique_ptr<PhaseWorker>> workers;
    std::vector<BorrowWorker*> borrows;
    for (int i = 0; i < threads; ++i) {
      auto w = std::make_unique<BorrowWorker>(sys, i, pattern, c_.batch, stored, starts[i],
                                              FLAGS_verify_every, verify);
      borrows.push_back(w.get());
      workers.push_back(std::move(w));
    }
    KVPOOL_ASSIGN_OR_RETURN(PhaseStats s, RunPhase(workers, c_.pin.bench_cpus, c_.limits));
    Figure f = NewFigure(sys, verify ? "borrow+verify" : "borrow", block_bytes, threads);
    f.SetFrom(s);
    uint64_t verified = 0;
    for (BorrowWorker* b : borrows) verified += b->verified_blocks();
    f.extra["verified_blocks"] = verified;
    f.gbps = 0;  // nothing is copied: the figure is the time per batch
    f.extra["bytes"] = "lent in place, not copied";
    const double mem = Baseline("memcpy", block_bytes);
    if (mem > 0) {
      const double memcpy_batch_us =
          static_cast<double>(c_.batch * block_bytes) / (mem * 1e9) * 1e6;
      f.extra["memcpy_batch_us"] = memcpy_batch_us;
      f.extra["p50_to_memcpy_batch"] = f.p50_us / memcpy_batch_us;
    }
    if (!verify) f.extra["target_p50_us"] = 10;
    Emit(std::move(f));
  }
  return Status::OK();
}

Status Bench::RunLookups(BenchSystem& sys, int threads) {
  std::vector<std::unique_ptr<PhaseWorker>> workers;
  for (int i = 0; i < threads; ++i) {
    workers.push_back(std::make_unique<LookupWorker>(sys, i, chain_));
  }
  KVPOOL_ASSIGN_OR_RETURN(PhaseStats s, RunPhase(workers, c_.pin.bench_cpus, c_.limits));
  Figure f = NewFigure(sys, "lookup", c_.lookup_block_bytes, threads);
  f.SetFrom(s);
  f.gbps = 0;  // a lookup moves keys, not block bytes
  f.extra["chain_blocks"] = chain_.size();
  f.extra["keys_per_s"] = f.ops_per_s * static_cast<double>(chain_.size());
  f.extra["target_p99_us"] = 200;
  KVPOOL_RETURN_IF_ERROR(AddArena(sys, f).status());
  Emit(std::move(f));
  return Status::OK();
}

Status Bench::RunMixed() {
  KVPOOL_ASSIGN_OR_RETURN(ArenaStats a0, system_.Arena());
  if (!a0.known) {
    Progress("mixed-size probe skipped: the system reports no arena statistics");
    return Status::OK();
  }
  // Fill so that no segment is left free: only then is free space the holes between blocks.
  uint64_t target = static_cast<uint64_t>((FLAGS_mixed_fill > 0 ? FLAGS_mixed_fill : 0.85) *
                                          static_cast<double>(a0.capacity_bytes));
  if (FLAGS_mixed_fill == 0 && c_.own_daemon && a0.capacity_bytes > kSegmentBytes) {
    target = a0.capacity_bytes - kSegmentBytes / 2;
  }
  if (a0.allocated_bytes >= target) {
    Progress("mixed-size probe skipped: the host tier is already " +
             std::to_string(a0.allocated_bytes) + " bytes full");
    return Status::OK();
  }
  // Sizes: each block size and its 8-bit and 4-bit encodings' sizes (1/2, 1/4), at least 4 KiB.
  std::set<size_t> size_set;
  for (uint64_t b : c_.block_sizes) {
    for (uint64_t d : {1, 2, 4}) {
      if (b / d >= 4096) size_set.insert(b / d);
    }
  }
  const std::vector<size_t> sizes(size_set.begin(), size_set.end());
  PatternSet pattern(sizes.back(), c_.batch, 0x3173d);
  const PhaseLimits fill_limits{/*seconds=*/300, /*max_ops=*/0};
  const uint64_t seed = std::hash<std::string>()(c_.run_secret);

  // 1. Fill.
  std::vector<std::unique_ptr<PhaseWorker>> w;
  w.push_back(std::make_unique<MixedPutWorker>(system_, pattern, c_.batch, sizes,
                                               target - a0.allocated_bytes, c_.run_secret,
                                               "mixed-fill", seed));
  std::vector<int> cpus;
  if (c_.pin.enabled) cpus = {c_.pin.bench_cpus[0]};
  KVPOOL_RETURN_IF_ERROR(RunPhase(w, cpus, fill_limits).status().WithContext("mixed fill"));
  std::vector<StoredBlock> live = static_cast<MixedPutWorker&>(*w[0]).stored();

  // 2. Free a random half.
  std::mt19937_64 rng(seed ^ 0x5eed);
  std::shuffle(live.begin(), live.end(), rng);
  const size_t keep = live.size() / 2;
  std::vector<BlockKey> drop;
  for (size_t i = keep; i < live.size(); ++i) drop.push_back(live[i].key);
  live.resize(keep);
  KVPOOL_RETURN_IF_ERROR(system_.Drop(drop).WithContext("freeing half of the mixed blocks"));
  KVPOOL_ASSIGN_OR_RETURN(ArenaStats a1, system_.Arena());

  // 3. Refill to the same level, timed.
  w.clear();
  w.push_back(std::make_unique<MixedPutWorker>(
      system_, pattern, c_.batch, sizes,
      target > a1.allocated_bytes ? target - a1.allocated_bytes : 0, c_.run_secret, "mixed-refill",
      seed + 1));
  KVPOOL_ASSIGN_OR_RETURN(PhaseStats s, RunPhase(w, cpus, fill_limits));
  const std::vector<StoredBlock>& refill = static_cast<MixedPutWorker&>(*w[0]).stored();
  live.insert(live.end(), refill.begin(), refill.end());

  Figure f = NewFigure(system_, "put", 0, 1);
  f.SetFrom(s);
  std::vector<uint64_t> size_list(sizes.begin(), sizes.end());
  f.extra["workload"] = "mixed";
  f.extra["block_sizes"] = size_list;
  f.extra["fill_target_bytes"] = target;
  f.extra["host_fragmentation_after_frees"] = a1.fragmentation;
  KVPOOL_ASSIGN_OR_RETURN(ArenaStats a2, AddArena(system_, f));
  // Compared with a1, not a0: freeing half counted as evictions. A refill block that finds no
  // run long enough makes the daemon evict (demote) host blocks: fragmentation's real cost.
  f.extra["refill_demotions"] = a2.demotions - a1.demotions;
  f.extra["refill_evictions"] = a2.evictions - a1.evictions;
  f.extra["spilled_to_disk"] = a2.demotions != a1.demotions || a2.evictions != a1.evictions;

  // 4. Everything left must read back exactly (a sample of 256 blocks).
  std::shuffle(live.begin(), live.end(), rng);
  std::vector<StoredBlock> sample(live.begin(), live.begin() + std::min<size_t>(256, live.size()));
  KVPOOL_ASSIGN_OR_RETURN(std::unique_ptr<BenchTarget> t, system_.NewTarget(0));
  KVPOOL_RETURN_IF_ERROR(
      VerifyStored(*t, pattern, c_.batch, sample).WithContext("reading back the mixed blocks"));
  f.extra["verified_blocks"] = sample.size();
  Emit(std::move(f));

  std::vector<BlockKey> all;
  for (const StoredBlock& b : live) all.push_back(b.key);
  return system_.Drop(all).WithContext("dropping the mixed blocks");
}

Status Bench::RunAll() {
  Progress("putting the " + std::to_string(FLAGS_chain_blocks) + "-block lookup chain");
  KVPOOL_RETURN_IF_ERROR(PutChain());
  uint64_t largest = *std::max_element(c_.block_sizes.begin(), c_.block_sizes.end());
  // The memcpy source: larger than any cache, and than one batch twice over.
  AlignedBuffer ring(std::max<uint64_t>(256ull << 20, 2 * c_.batch * largest));
  {
    PatternSet fill(ring.size() / 64, 1, 0x9a11);  // any non-zero bytes will do
    for (size_t i = 0; i < 64; ++i) {
      std::memcpy(ring.data() + i * fill.block_bytes(), fill.slot(0), fill.block_bytes());
    }
  }
  int case_index = 0;
  for (uint64_t b : c_.block_sizes) {
    KVPOOL_RETURN_IF_ERROR(RunMemcpy(b, ring));
    KVPOOL_RETURN_IF_ERROR(RunSocketpair(b, ring).WithContext("socketpair baseline"));
    if (std::any_of(systems_.begin(), systems_.end(),
                    [](const std::unique_ptr<BenchSystem>& s) { return s->path() == "ucx"; })) {
      KVPOOL_RETURN_IF_ERROR(RunUcxPerftestBaseline(b).WithContext("ucx_perftest baseline"));
    }
    PatternSet pattern(b, c_.batch, 0xb10c + b);
    for (const std::unique_ptr<BenchSystem>& sys : systems_) {
      for (int n : c_.concurrency) {
        if (!Measured(*sys, n)) continue;
        KVPOOL_RETURN_IF_ERROR(RunCase(*sys, b, n, pattern, case_index++));
      }
    }
  }
  const bool socket_measured =
      std::any_of(systems_.begin(), systems_.end(),
                  [](const std::unique_ptr<BenchSystem>& s) { return s->path() == "socket"; });
  for (const std::unique_ptr<BenchSystem>& sys : systems_) {
    // Redis has no chain lookup; a lookup on an shm connection is the socket path's control
    // exchange again (no block bytes move), so it is measured once, as socket.
    if (sys->system() != "kvpool" || (sys->path() == "shm" && socket_measured)) continue;
    for (int n : c_.concurrency) {
      KVPOOL_RETURN_IF_ERROR(RunLookups(*sys, n).WithContext(sys->path() + " lookup"));
    }
  }
  if (FLAGS_mixed) KVPOOL_RETURN_IF_ERROR(RunMixed());
  return system_.Drop(chain_).WithContext("dropping the lookup chain");
}

std::string Now() {
  const std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S %Z", std::localtime(&t));
  return buf;
}

Result<std::vector<uint64_t>> ParseCounts(const std::string& flag, const std::string& text) {
  std::vector<uint64_t> out;
  for (const std::string& item : SplitList(text)) {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(item.c_str(), &end, 10);
    if (end == item.c_str() || *end != '\0' || v == 0) {
      return Status::InvalidArgument("--" + flag + ": '" + item + "' is not a positive count");
    }
    out.push_back(v);
  }
  return out;
}

// What every single-purpose mode (--scale, --disk) shares once its flags are parsed into
// `parsed` and `pin`: a bad flag exits 2 with the reason; the bench thread is pinned; `banner`
// prints unless --json; `run` measures, handing each figure to the emitter, which adds the load
// average and prints it as one JSON line under --json, else passes it to `show`; a failed run
// exits 1.
using Emitter = std::function<void(Figure)>;
int RunMode(const Status& parsed, const PinPlan& pin, const std::function<void()>& banner,
            const std::function<Status(const Emitter&)>& run,
            const std::function<void(const Figure&)>& show) {
  if (!parsed.ok()) {
    std::fprintf(stderr, "kvpool-bench: %s\n", parsed.ToString().c_str());
    return 2;
  }
  if (pin.enabled) (void)PinThisThread(pin.bench_cpus);
  if (!FLAGS_json) {
    banner();
    std::fflush(stdout);
  }
  const Status st = run([&](Figure f) {
    f.extra["loadavg_1m"] = LoadAverage();
    if (FLAGS_json) {
      std::printf("%s\n", f.ToJson().dump().c_str());
    } else {
      show(f);
    }
    std::fflush(stdout);
  });
  if (!st.ok()) {
    std::fprintf(stderr, "kvpool-bench: FAILED: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}

// kvpool-bench --scale (bench/scale_bench.h).
int ScaleMain(const std::string& command) {
  ScaleConfig c;
  c.kvpoold = FindKvpoold(FLAGS_kvpoold);
  c.chain_blocks = FLAGS_scale_chain_blocks;
  c.seconds = FLAGS_seconds;
  const Status parsed = [&]() -> Status {
    KVPOOL_ASSIGN_OR_RETURN(c.blocks, ParseCounts("scale_blocks", FLAGS_scale_blocks));
    KVPOOL_ASSIGN_OR_RETURN(c.block_bytes, ParseBytes(FLAGS_scale_block_bytes));
    KVPOOL_ASSIGN_OR_RETURN(std::vector<uint64_t> clients,
                            ParseCounts("scale_clients", FLAGS_scale_clients));
    KVPOOL_ASSIGN_OR_RETURN(std::vector<uint64_t> tenants,
                            ParseCounts("scale_namespaces", FLAGS_scale_namespaces));
    for (uint64_t n : clients) {
      if (n > 1024) return Status::InvalidArgument("--scale_clients: at most 1024");
      c.clients.push_back(static_cast<int>(n));
    }
    for (uint64_t n : tenants) {
      if (n > 4096) return Status::InvalidArgument("--scale_namespaces: at most 4096");
      c.namespaces.push_back(static_cast<int>(n));
    }
    if (c.seconds <= 0) return Status::InvalidArgument("--scale needs --seconds > 0");
    if (!FLAGS_host_capacity.empty()) {
      KVPOOL_ASSIGN_OR_RETURN(c.host_capacity, ParseBytes(FLAGS_host_capacity));
    }
    KVPOOL_ASSIGN_OR_RETURN(c.pin, MakePinPlan(FLAGS_pin, FLAGS_daemon_cpus, FLAGS_bench_cpus,
                                               /*own_daemon=*/true));
    return Status::OK();
  }();
  std::vector<Figure> figures;  // the table after the run (not under --json)
  return RunMode(
      parsed, c.pin,
      [&] {
        std::printf(
            "kvpool-bench --scale  %s\n  command: %s\n  pinning: %s\n  load average (1 min): "
            "%.2f\n  blocks of %s in chains of %u; lookups of a whole chain (no prefetch), "
            "gets of %u blocks of one chain; write-through\n",
            Now().c_str(), command.c_str(), c.pin.description.c_str(), LoadAverage(),
            FormatBytes(c.block_bytes).c_str(), c.chain_blocks, c.get_batch);
      },
      [&](const Emitter& emit) {
        const Status st = RunScale(c, emit);
        if (!FLAGS_json) std::printf("\n%s", FormatScaleTable(figures).c_str());
        return st;
      },
      [&](const Figure& f) { figures.push_back(f); });
}

// kvpool-bench --disk (bench/disk_bench.h).
int DiskMain(const std::string& command) {
  DiskBenchConfig c;
  c.kvpoold = FindKvpoold(FLAGS_kvpoold);
  c.readers = FLAGS_disk_readers;
  c.blocks_per_call = FLAGS_disk_blocks_per_call;
  const Status parsed = [&]() -> Status {
    KVPOOL_ASSIGN_OR_RETURN(c.working_set, ParseBytes(FLAGS_disk_working_set));
    KVPOOL_ASSIGN_OR_RETURN(c.block_bytes, ParseBytes(FLAGS_disk_block_bytes));
    if (c.block_bytes == 0 || c.block_bytes % 4096 != 0) {
      return Status::InvalidArgument("--disk_block_bytes: a positive multiple of 4 KiB (O_DIRECT)");
    }
    if (c.readers < 1 || c.readers > 64) {
      return Status::InvalidArgument("--disk_readers: 1 to 64");
    }
    if (c.blocks_per_call < 1 || c.blocks_per_call > 4096) {
      return Status::InvalidArgument("--disk_blocks_per_call: 1 to 4096");
    }
    KVPOOL_ASSIGN_OR_RETURN(c.pin, MakePinPlan(FLAGS_pin, FLAGS_daemon_cpus, FLAGS_bench_cpus,
                                               /*own_daemon=*/true));
    return Status::OK();
  }();
  return RunMode(
      parsed, c.pin,
      [&] {
        std::printf(
            "kvpool-bench --disk  %s\n  command: %s\n  pinning: %s\n  load average (1 min): "
            "%.2f\n  %s of %s blocks, each read once from disk, %d readers of one block a "
            "call\n\n",
            Now().c_str(), command.c_str(), c.pin.description.c_str(), LoadAverage(),
            FormatBytes(c.working_set).c_str(), FormatBytes(c.block_bytes).c_str(), c.readers);
        std::printf("%-8s %-9s %-9s %9s %10s %10s %10s %8s\n", "system", "path", "op", "GB/s",
                    "ops/s", "p50 us", "p99 us", "ratio");
      },
      [&](const Emitter& emit) { return RunDiskBench(c, emit); },
      [](const Figure& f) {
        const double ratio = f.extra.value("ratio_to_fio", 0.0);
        std::printf("%-8s %-9s %-9s %9.2f %10.0f %10.0f %10.0f %8s\n", f.system.c_str(),
                    f.path.c_str(), f.op.c_str(), f.gbps, f.ops_per_s, f.p50_us, f.p99_us,
                    ratio > 0 ? std::to_string(ratio).substr(0, 4).c_str() : "");
      });
}

int Main(const std::string& command) {
  if (FLAGS_scale) return ScaleMain(command);
  if (FLAGS_disk) return DiskMain(command);
  Result<Config> config = ParseConfig();
  if (!config.ok()) {
    std::fprintf(stderr, "kvpool-bench: %s\n", config.status().ToString().c_str());
    return 2;
  }
  const bool own_daemon = FLAGS_socket.empty();
  config->own_daemon = own_daemon;
  Result<PinPlan> pin = MakePinPlan(FLAGS_pin, FLAGS_daemon_cpus, FLAGS_bench_cpus, own_daemon);
  if (!pin.ok()) {
    std::fprintf(stderr, "kvpool-bench: %s\n", pin.status().ToString().c_str());
    return 2;
  }
  config->pin = *pin;

  const bool ucx =
      std::find(config->paths.begin(), config->paths.end(), DataPath::kUcx) != config->paths.end();
  std::unique_ptr<DaemonProcess> daemon;
  std::string address = FLAGS_socket;
  std::string ucx_address = FLAGS_ucx_address;
  std::string banner;
  if (!own_daemon && ucx) {
    if (ucx_address.rfind("tcp://127.", 0) != 0) {
      std::fprintf(
          stderr,
          "kvpool-bench: the ucx path with --socket needs --ucx_address=tcp://127.x.x.x:PORT "
          "(loopback only)\n");
      return 2;
    }
  }
  if (own_daemon) {
    uint64_t host_capacity = 0;
    if (!FLAGS_host_capacity.empty()) {
      Result<uint64_t> cap = ParseBytes(FLAGS_host_capacity);
      if (!cap.ok()) {
        std::fprintf(stderr, "kvpool-bench: --host_capacity: %s\n",
                     cap.status().ToString().c_str());
        return 2;
      }
      host_capacity = *cap;
    } else {
      host_capacity = NeededHostBytes(*config) * 3 / 2;
    }
    // Demote only past 99.5%: no case comes near (the tier is 1.5x the largest working set), and
    // the fragmentation probe may fill every segment without the flusher moving blocks away.
    std::vector<std::string> flags = {"--host_high_watermark=0.995", "--host_low_watermark=0.99",
                                      "--io_busy_poll_us=" + std::to_string(FLAGS_busy_poll_us)};
    const std::vector<std::string> more =
        absl::StrSplit(FLAGS_kvpoold_flags, ' ', absl::SkipEmpty());
    flags.insert(flags.end(), more.begin(), more.end());
    DaemonProcessOptions o =
        BenchDaemonOptions(FindKvpoold(FLAGS_kvpoold), host_capacity, std::move(flags));
    o.listen_tcp_loopback = ucx;
    o.cpus = config->pin.daemon_cpus;
    Progress("starting " + o.binary + " with a " + FormatBytes(host_capacity) + " host tier");
    Result<std::unique_ptr<DaemonProcess>> d = DaemonProcess::Launch(std::move(o));
    if (!d.ok()) {
      std::fprintf(stderr, "kvpool-bench: %s\n", d.status().ToString().c_str());
      return 1;
    }
    daemon = std::move(*d);
    address = daemon->socket_path();
    ucx_address = daemon->tcp_address();
    banner = daemon->Banner();
  }

  std::unique_ptr<RedisServer> redis_server;
  std::vector<std::unique_ptr<RedisSystem>> redis;  // one per --redis_paths
  std::string redis_line;
  if (config->redis) {
    std::string host;
    int port = 0;
    if (!FLAGS_redis.empty()) {
      Status st = RedisSystem::ParseAddress(FLAGS_redis, &host, &port);
      if (!st.ok()) {
        std::fprintf(stderr, "kvpool-bench: %s\n", st.ToString().c_str());
        return 2;
      }
      redis_line = "external at " + FLAGS_redis;
    } else {
      RedisServerOptions ro;
      ro.binary = FLAGS_redis_server;
      // Redis rounds a 1 MiB value up to jemalloc's 1.25 MiB size class: twice the largest
      // working set leaves room; noeviction makes running out an error, not a silent miss.
      ro.maxmemory_bytes = 2 * NeededHostBytes(*config) + (256ull << 20);
      ro.cpus = config->pin.daemon_cpus;
      Progress("starting " + ro.binary);
      Result<std::unique_ptr<RedisServer>> r = RedisServer::Start(ro);
      if (!r.ok()) {
        std::fprintf(stderr, "kvpool-bench: %s (or pass --systems=kvpool)\n",
                     r.status().ToString().c_str());
        return 1;
      }
      redis_server = std::move(*r);
      if (config->pin.enabled) {
        config->pin.description += "; redis-server=" + FormatCpuList(ro.cpus);
      }
      host = redis_server->host();
      port = redis_server->port();
      redis_line = redis_server->description();
    }
    for (const std::string& path : SplitList(FLAGS_redis_paths)) {
      if (path != "tcp" && path != "tcp1") {
        std::fprintf(stderr, "kvpool-bench: --redis_paths: unknown path '%s' (tcp or tcp1)\n",
                     path.c_str());
        return 2;
      }
      Result<std::unique_ptr<RedisSystem>> r =
          RedisSystem::Create(host, port, /*pipelined=*/path == "tcp");
      if (!r.ok()) {
        std::fprintf(stderr, "kvpool-bench: %s\n", r.status().ToString().c_str());
        return 1;
      }
      redis.push_back(std::move(*r));
    }
    if (!redis.empty()) redis_line = redis.front()->version() + ", " + redis_line;
  }
  if (config->pin.enabled) (void)PinThisThread(config->pin.bench_cpus);

  if (!FLAGS_json) {
    std::printf("kvpool-bench  %s\n  command: %s\n  pinning: %s\n  load average (1 min): %.2f\n",
                Now().c_str(), command.c_str(), config->pin.description.c_str(), LoadAverage());
    std::printf("  batch: %zu blocks per call; latency per call; GB/s = 1e9 B/s of wall time\n",
                config->batch);
    std::printf("  daemon: %s",
                own_daemon ? banner.c_str() : ("external at " + address + "\n").c_str());
    if (ucx) std::printf("  ucx path: %s, UCX_TLS=tcp, UCX_NET_DEVICES=lo\n", ucx_address.c_str());
    if (!redis.empty()) {
      std::printf(
          "  redis: %s; hiredis, one connection per thread; paths %s (tcp: a call's "
          "commands pipelined, tcp1: one per round trip)\n",
          redis_line.c_str(), FLAGS_redis_paths.c_str());
    }
    std::fflush(stdout);
  }

  // Redis first, so each kvpool figure is set beside Redis's best as it is emitted.
  std::vector<std::unique_ptr<BenchSystem>> systems;
  for (auto& r : redis) systems.push_back(std::move(r));
  for (DataPath p : config->paths) {
    systems.push_back(std::make_unique<KvpoolSystem>(
        p == DataPath::kUcx ? ucx_address : address, FLAGS_namespace_name, p,
        std::chrono::microseconds(FLAGS_busy_poll_us), FLAGS_fresh_connections));
  }
  Bench bench(*config, std::move(systems));
  Status st = bench.RunAll();
  if (daemon != nullptr) {
    Status stop = daemon->Stop();
    if (!stop.ok()) Progress("warning: " + stop.ToString());
  }
  if (redis_server != nullptr) {
    Status stop = redis_server->Stop();
    if (!stop.ok()) Progress("warning: " + stop.ToString());
  }
  if (!FLAGS_json) {
    std::printf("\n%s", FormatTable(bench.figures()).c_str());
    std::printf(
        "\nratio = GB/s / single-thread memcpy GB/s of the same block size; "
        "sock = GB/s / socketpair GB/s (the bare Unix socket, one round trip per "
        "call, same block size); frag = host arena fragmentation after the phase; redis best = "
        "GB/s / the faster Redis path's GB/s for the same op, block size and concurrency, and "
        "that path (tcp: pipelined, tcp1: one command per round trip); ucx lim = a ucx path's "
        "GB/s / ucx_perftest's tag bandwidth for the same message size (tcp on lo).\n");
    for (const Figure& f : bench.figures()) {
      if (!f.extra.contains("workload") || !f.extra.contains("host_fragmentation")) continue;
      std::printf(
          "host arena after the mixed-size probe (%s of %s allocated, %llu blocks): "
          "fragmentation %.3f after freeing a random half, %.3f after refilling; the "
          "refill made the daemon demote %llu and evict %llu host blocks\n",
          FormatBytes(f.extra["host_allocated_bytes"].get<uint64_t>()).c_str(),
          FormatBytes(f.extra["host_capacity_bytes"].get<uint64_t>()).c_str(),
          static_cast<unsigned long long>(f.extra["host_blocks"].get<uint64_t>()),
          f.extra["host_fragmentation_after_frees"].get<double>(),
          f.extra["host_fragmentation"].get<double>(),
          static_cast<unsigned long long>(f.extra["refill_demotions"].get<uint64_t>()),
          static_cast<unsigned long long>(f.extra["refill_evictions"].get<uint64_t>()));
    }
  }
  if (!st.ok()) {
    std::fprintf(stderr, "kvpool-bench: FAILED: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace kvpool::bench

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "kvpool-bench [flags]: put, get and lookup through kvpoold beside memcpy of the same "
      "bytes. See docs/BENCHMARKS.md.");
  gflags::SetVersionString("0.1.0");
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (argc > 1) {
    std::fprintf(stderr, "kvpool-bench: unexpected argument '%s'\n", argv[1]);
    return 2;
  }
  return kvpool::bench::Main(command);
}
