// kvpool-rebuild: how fast the daemon rebuilds its block index from RocksDB at start
// (TierManager::Recover), for N disk blocks, without a daemon or a client in the way.
//
// Writes N blocks through the real disk tier (DiskTier::Write: a body record and a meta record
// each, in chains of --chain_blocks with parent links, --block_bytes of pattern bytes), flushes
// and (unless --compact=false) compacts RocksDB so every reopen reads the same files, then reopens
// the stack --reopens times and reports what Recover reports (blocks, seconds, and its split into
// reading the records and indexing) beside the reopen's wall time and resident memory. With --dir
// the database is kept there and reused by a later run of the same --blocks (a 10^7-block fill
// takes minutes); without it a temp dir is used and removed. Each reopen runs in a fresh child
// process, so one reopen's memory cannot hide the next one's. Every recovered count is checked
// against what was written. Figures: docs/BENCHMARKS.md, "How cost grows".

#include <gflags/gflags.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <rocksdb/db.h>

#include "bench/block_data.h"
#include "common/checksum.h"
#include "tiers/disk_tier.h"
#include "tiers/host_tier.h"
#include "tiers/rocks_store.h"
#include "tiers/tier_manager.h"

DEFINE_uint64(blocks, 1000000, "Disk blocks to rebuild the index of.");
DEFINE_uint64(chain_blocks, 64, "Blocks per chain (each links to its parent).");
DEFINE_uint64(block_bytes, 64, "Bytes per block body (the rebuild reads none of them).");
DEFINE_uint32(namespaces, 1, "Namespaces the chains are dealt over.");
DEFINE_int32(reopens, 3, "Reopens to time, each in a fresh process.");
DEFINE_bool(compact, true,
            "Compact RocksDB after the fill (false: reopen the files as the writes left them, "
            "level 0 and all, as a daemon restarted after heavy writes finds them).");
DEFINE_string(dir, "", "Keep the database here and reuse it (empty: a temp dir, removed).");
DEFINE_bool(json, false, "One JSON object per reopen instead of a table row.");

namespace {

using kvpool::BlockKey;
using kvpool::Status;
using kvpool::bench::SplitMix64;
namespace tiers = kvpool::tiers;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "kvpool-rebuild: %s\n", what.c_str());
  std::exit(1);
}

BlockKey KeyOf(uint64_t i) {
  BlockKey k;
  for (int w = 0; w < 4; ++w) {
    const uint64_t v = SplitMix64(i * 4 + static_cast<uint64_t>(w) + 1);
    std::memcpy(k.bytes.data() + w * 8, &v, 8);
  }
  return k;
}

std::unique_ptr<tiers::RocksStore> OpenStore(const std::string& dir) {
  tiers::RocksStoreOptions ro;
  ro.path = dir + "/rocksdb";
  kvpool::Result<std::unique_ptr<tiers::RocksStore>> store = tiers::RocksStore::Open(ro);
  if (!store.ok()) Fail("opening RocksDB: " + store.status().ToString());
  return std::move(*store);
}

// Writes the blocks, then flushes and compacts so the reopens all read the same files.
void Fill(const std::string& dir) {
  std::unique_ptr<tiers::RocksStore> store = OpenStore(dir);
  tiers::DiskTier disk(*store);
  std::vector<uint8_t> body(FLAGS_block_bytes);
  for (size_t i = 0; i < body.size(); ++i) body[i] = static_cast<uint8_t>(SplitMix64(i));
  const uint64_t checksum = kvpool::BlockChecksum(body.data(), body.size());
  constexpr uint64_t kBatch = 1024;
  std::vector<tiers::DiskWrite> batch;
  const auto t0 = std::chrono::steady_clock::now();
  for (uint64_t i = 0; i < FLAGS_blocks; ++i) {
    tiers::DiskWrite w;
    const uint64_t chain = i / FLAGS_chain_blocks;
    w.ns = static_cast<kvpool::NamespaceId>(1 + chain % FLAGS_namespaces);
    w.key = KeyOf(i);
    w.meta.size = body.size();
    w.meta.checksum = checksum;
    if (i % FLAGS_chain_blocks != 0) w.meta.parent = KeyOf(i - 1);
    w.data = body.data();
    batch.push_back(w);
    if (batch.size() == kBatch || i + 1 == FLAGS_blocks) {
      Status st = disk.Write(batch, /*sync=*/false);
      if (!st.ok()) Fail("writing blocks: " + st.ToString());
      batch.clear();
    }
  }
  Status st = store->Flush();
  if (!st.ok()) Fail("flush: " + st.ToString());
  if (FLAGS_compact) {
    rocksdb::CompactRangeOptions co;
    co.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
    rocksdb::Status rs = store->db()->CompactRange(co, store->block_meta(), nullptr, nullptr);
    if (!rs.ok()) Fail("compacting the meta records: " + rs.ToString());
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "kvpool-rebuild: wrote %llu blocks in %.1f s\n",
               static_cast<unsigned long long>(FLAGS_blocks), s);
  std::ofstream(dir + "/kvpool-rebuild.blocks")
      << FLAGS_blocks << " " << FLAGS_chain_blocks << " " << FLAGS_namespaces << " "
      << (FLAGS_compact ? 1 : 0) << "\n";
}

bool Filled(const std::string& dir) {
  std::ifstream in(dir + "/kvpool-rebuild.blocks");
  uint64_t blocks = 0;
  uint64_t chain = 0;
  uint32_t namespaces = 0;
  bool compacted = false;
  return static_cast<bool>(in >> blocks >> chain >> namespaces >> compacted) &&
         blocks == FLAGS_blocks && chain == FLAGS_chain_blocks && namespaces == FLAGS_namespaces &&
         compacted == FLAGS_compact;
}

uint64_t PeakResidentBytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;
}

// One reopen, in the calling (child) process.
void Reopen(const std::string& dir, int round) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<tiers::RocksStore> store = OpenStore(dir);
  tiers::DiskTier disk(*store);
  tiers::HostTierOptions ho;
  ho.capacity_bytes = 8ull << 20;
  ho.segment_bytes = 1ull << 20;
  ho.lock_memory = false;
  kvpool::Result<std::unique_ptr<tiers::HostTier>> host = tiers::HostTier::Create(ho);
  if (!host.ok()) Fail("host tier: " + host.status().ToString());
  tiers::TierManagerOptions mo;
  mo.flush_on_shutdown = false;
  kvpool::Result<tiers::TierStack> stack = tiers::TierStack::Create({host->get(), &disk});
  if (!stack.ok()) Fail("tier stack: " + stack.status().ToString());
  tiers::TierManager manager(mo, std::move(*stack));
  const auto t1 = std::chrono::steady_clock::now();
  Status st = manager.Recover();
  if (!st.ok()) Fail("recover: " + st.ToString());
  const auto t2 = std::chrono::steady_clock::now();
  const tiers::TierManagerStats s = manager.GetStats();
  if (s.index_rebuild_blocks != FLAGS_blocks || s.index_entries != FLAGS_blocks) {
    Fail("recovered " + std::to_string(s.index_rebuild_blocks) + " blocks (" +
         std::to_string(s.index_entries) + " index entries) of " + std::to_string(FLAGS_blocks));
  }
  const double open_s = std::chrono::duration<double>(t1 - t0).count();
  const double recover_s = std::chrono::duration<double>(t2 - t1).count();
  const double per_s = static_cast<double>(FLAGS_blocks) / s.index_rebuild_seconds;
  if (FLAGS_json) {
    std::printf(
        "{\"blocks\": %llu, \"round\": %d, \"open_seconds\": %.3f, \"recover_seconds\": %.3f, "
        "\"rebuild_seconds\": %.3f, \"blocks_per_second\": %.0f, \"index_bytes\": %llu, "
        "\"peak_rss_bytes\": %llu}\n",
        static_cast<unsigned long long>(FLAGS_blocks), round, open_s, recover_s,
        s.index_rebuild_seconds, per_s, static_cast<unsigned long long>(s.index_bytes),
        static_cast<unsigned long long>(PeakResidentBytes()));
  } else {
    std::printf("%12llu %6d %10.3f %12.3f %12.3f %14.0f %14.1f\n",
                static_cast<unsigned long long>(FLAGS_blocks), round, open_s, recover_s,
                s.index_rebuild_seconds, per_s, PeakResidentBytes() / 1048576.0);
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "kvpool-rebuild [--blocks=N] [--chain_blocks=64] [--reopens=3] [--dir=D] [--json]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (FLAGS_blocks == 0 || FLAGS_blocks >= tiers::kNoEntry || FLAGS_chain_blocks == 0 ||
      FLAGS_namespaces == 0 || FLAGS_block_bytes == 0) {
    Fail("--blocks, --chain_blocks, --namespaces and --block_bytes must be positive");
  }
  std::string dir = FLAGS_dir;
  const bool temp = dir.empty();
  if (temp) {
    char tmpl[] = "/tmp/kvpool-rebuild.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) Fail(std::string("mkdtemp: ") + std::strerror(errno));
    dir = tmpl;
  } else if (!Filled(dir)) {
    std::error_code ec;
    std::filesystem::remove_all(dir + "/rocksdb", ec);
    std::filesystem::create_directories(dir, ec);
  }
  if (temp || !Filled(dir)) Fill(dir);
  if (!FLAGS_json) {
    std::printf("%12s %6s %10s %12s %12s %14s %14s\n", "blocks", "round", "open s", "recover s",
                "rebuild s", "blocks/s", "peak RSS MiB");
  }
  int failed = 0;
  for (int round = 0; round < FLAGS_reopens; ++round) {
    std::fflush(stdout);
    const pid_t pid = fork();
    if (pid < 0) Fail("fork failed");
    if (pid == 0) {
      Reopen(dir, round);
      std::_Exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
  }
  if (temp) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  return failed;
}
