// kvpool-index-bytes: what one cached block costs in the daemon's BlockIndex
// (tiers/block_index.h), as BlockIndex::MemoryBytes() / size() and as the process's resident
// memory growth per entry, for N entries each with a copy in --tier (disk: the bulk of a large
// cache; host: a block in memory, with its MemCopies), so each is a candidate of the daemon's
// LRU order. Also times Insert and Find. Each N runs in a fresh child process so one measurement's
// freed memory cannot hide the next one's growth. Figures recorded in docs/BENCHMARKS.md.

#include <gflags/gflags.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/block_data.h"
#include "tiers/block_index.h"
#include "tiers/eviction_pools.h"

DEFINE_string(entries, "1000000,10000000", "Index sizes to measure, comma separated.");
DEFINE_bool(json, false, "One JSON object per size instead of a table row.");
DEFINE_string(tier, "disk", "The tier each entry has its copy in: disk or host.");

namespace {

using kvpool::BlockKey;
using kvpool::Tier;
using kvpool::bench::SplitMix64;
using kvpool::tiers::BlockIndex;
using kvpool::tiers::EntryId;

// Uniform 32-byte keys (real keys are SHA-256 output), a pure function of i.
BlockKey KeyOf(uint64_t i) {
  BlockKey k;
  for (int w = 0; w < 4; ++w) {
    const uint64_t v = SplitMix64(i * 4 + static_cast<uint64_t>(w));
    std::memcpy(k.bytes.data() + w * 8, &v, 8);
  }
  return k;
}

uint64_t ResidentBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long size = 0;
  unsigned long resident = 0;
  const int n = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE)) : 0;
}

void Measure(uint64_t n, Tier tier) {
  const uint64_t rss0 = ResidentBytes();
  BlockIndex index;
  kvpool::tiers::EvictionPools pools(index);  // the daemon's LRU order, as in production
  const auto t0 = std::chrono::steady_clock::now();
  for (uint64_t i = 0; i < n; ++i) {
    const EntryId id = index.Insert(/*ns=*/1, KeyOf(i));
    index.at(id).size = 1u << 20;
    index.AddCopy(id, tier);
  }
  const auto t1 = std::chrono::steady_clock::now();
  const uint64_t finds = std::min<uint64_t>(n, 1000000);
  uint64_t found = 0;
  for (uint64_t i = 0; i < finds; ++i) {
    found += index.Find(1, KeyOf(SplitMix64(i ^ 0xf1d) % n)) != kvpool::tiers::kNoEntry;
  }
  const auto t2 = std::chrono::steady_clock::now();
  const uint64_t rss1 = ResidentBytes();
  const double mem_per =
      static_cast<double>(index.MemoryBytes()) / static_cast<double>(index.size());
  const double rss_per = static_cast<double>(rss1 - rss0) / static_cast<double>(n);
  const double insert_ns = std::chrono::duration<double, std::nano>(t1 - t0).count() / n;
  const double find_ns = std::chrono::duration<double, std::nano>(t2 - t1).count() / finds;
  if (found != finds) {
    std::fprintf(stderr, "kvpool-index-bytes: found %llu of %llu inserted keys\n",
                 static_cast<unsigned long long>(found), static_cast<unsigned long long>(finds));
    std::exit(1);
  }
  if (FLAGS_json) {
    std::printf(
        "{\"entries\": %llu, \"tier\": \"%s\", \"sizeof_entry\": %zu, \"memory_bytes\": %zu, "
        "\"memory_bytes_per_entry\": %.1f, \"rss_delta_bytes\": %llu, "
        "\"rss_bytes_per_entry\": %.1f, \"insert_ns\": %.1f, \"find_ns\": %.1f}\n",
        static_cast<unsigned long long>(n), FLAGS_tier.c_str(), sizeof(kvpool::tiers::Entry),
        index.MemoryBytes(), mem_per, static_cast<unsigned long long>(rss1 - rss0), rss_per,
        insert_ns, find_ns);
  } else {
    std::printf("%12llu %12zu %16.1f %14.1f %12.1f %10.1f\n", static_cast<unsigned long long>(n),
                sizeof(kvpool::tiers::Entry), mem_per, rss_per, insert_ns, find_ns);
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "kvpool-index-bytes [--entries=1000000,10000000] [--tier=disk|host] [--json]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (FLAGS_tier != "disk" && FLAGS_tier != "host") {
    std::fprintf(stderr, "kvpool-index-bytes: --tier is disk or host, not '%s'\n",
                 FLAGS_tier.c_str());
    return 2;
  }
  const Tier tier = FLAGS_tier == "disk" ? Tier::kDisk : Tier::kHost;
  std::vector<uint64_t> sizes;
  size_t pos = 0;
  while (pos <= FLAGS_entries.size()) {
    size_t comma = FLAGS_entries.find(',', pos);
    if (comma == std::string::npos) comma = FLAGS_entries.size();
    const std::string item = FLAGS_entries.substr(pos, comma - pos);
    char* end = nullptr;
    const unsigned long long v = std::strtoull(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v == 0 || v >= kvpool::tiers::kNoEntry) {
      std::fprintf(stderr, "kvpool-index-bytes: bad --entries item '%s'\n", item.c_str());
      return 2;
    }
    sizes.push_back(v);
    pos = comma + 1;
  }
  if (!FLAGS_json) {
    std::printf("%12s %12s %16s %14s %12s %10s\n", "entries", "sizeof(Entry)", "MemoryBytes/entry",
                "RSS/entry", "insert ns", "find ns");
  }
  for (uint64_t n : sizes) {
    std::fflush(stdout);
    const pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) {
      Measure(n, tier);
      std::_Exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return 1;
  }
  return 0;
}
