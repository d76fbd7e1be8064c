// kvpool-newcomer: what a namespace's first put costs the others when every host segment is
// held (tiers/tier_manager.h, AllocateHostLocked). A kvpoold of its own (production watermarks:
// the flusher keeps 10-20 % of the arena free, in pages scattered over the segments) is filled
// by tenant 0 with chains of 16 blocks, which are then read in a random order, so that recency
// is spread over every segment. Then, one at a time, `--newcomers` tenants each put one chain
// (timed) and each time the host tier's demotions and evictions are counted: the blocks the
// newcomer's segment cost. The floor is one segment's worth of blocks; the tier's whole content
// is the worst. Meanwhile tenant 0 looks up one of its chains in a loop: its slowest lookup is
// the newcomer's cost to everyone else. Nothing here asserts a time. Figures in docs/BENCHMARKS.md.

#include <gflags/gflags.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <kvpool/client.h>

#include "bench/bench_daemon.h"
#include "common/units.h"

DEFINE_string(kvpoold, "", "kvpoold binary (default: the build tree's).");
DEFINE_string(host_capacity, "1GiB", "Host tier size (whole 64 MiB segments).");
DEFINE_string(segment_size, "64MiB", "Host segment size.");
DEFINE_string(block_size, "64KiB", "Bytes per block.");
DEFINE_uint32(newcomers, 5, "Tenants that arrive one after another, each putting one chain.");

namespace kvpool {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kChain = 16;  // blocks per chain

BlockKey KeyOf(uint32_t tenant, uint64_t n) {
  BlockKey k;
  std::mt19937_64 rng((uint64_t{tenant} << 40) ^ (n * 0x9E3779B97F4A7C15ull) ^ 0x5eed);
  for (auto& b : k.bytes) b = static_cast<uint8_t>(rng());
  return k;
}

Result<std::unique_ptr<Client>> Tenant(const std::string& socket, uint32_t tenant) {
  ClientOptions o;
  o.address = socket;
  o.namespace_name = "newcomer-" + std::to_string(tenant);
  o.client_name = "kvpool-newcomer";
  o.data_path = DataPath::kSharedMemory;
  o.timeout = std::chrono::milliseconds(60000);
  o.admin = true;
  return Client::Connect(o);
}

// Puts chain `chain` of `tenant` (kChain blocks of `block` bytes, each byte from its key).
Status PutChain(Client& c, uint32_t tenant, uint64_t chain, uint64_t block) {
  std::vector<std::vector<uint8_t>> bytes(kChain, std::vector<uint8_t>(block));
  std::vector<PutBlock> blocks(kChain);
  for (uint32_t i = 0; i < kChain; ++i) {
    const BlockKey key = KeyOf(tenant, chain * kChain + i);
    for (uint64_t b = 0; b < block; ++b) bytes[i][b] = static_cast<uint8_t>(key.bytes[b % 32] + b);
    blocks[i].key = key;
    blocks[i].data = bytes[i].data();
    blocks[i].size = block;
    if (i > 0) blocks[i].parent = blocks[i - 1].key;
  }
  KVPOOL_ASSIGN_OR_RETURN(PutResult r, c.Put(blocks));
  for (const Status& st : r.errors) KVPOOL_RETURN_IF_ERROR(st);
  return Status::OK();
}

struct HostFigures {
  uint64_t out = 0;      // demotions + evictions: blocks that left host
  uint64_t demoted = 0;  // of which written to disk first
  uint64_t moved = 0;    // moved to another segment of their namespace (still in host)
  uint64_t blocks = 0;
};

Result<HostFigures> Host(Client& admin) {
  KVPOOL_ASSIGN_OR_RETURN(DaemonStats s, admin.Stats());
  for (const TierStats& t : s.tiers) {
    if (t.name == "host") {
      return HostFigures{t.demotions + t.evictions, t.demotions, t.moves, t.blocks};
    }
  }
  return Status::Internal("no host tier in the daemon's stats");
}

// The host figures once the flusher has stopped moving blocks (two readings 0.5 s apart agree).
Result<HostFigures> Settled(Client& admin) {
  KVPOOL_ASSIGN_OR_RETURN(HostFigures last, Host(admin));
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    KVPOOL_ASSIGN_OR_RETURN(HostFigures now, Host(admin));
    if (now.out == last.out && now.moved == last.moved && now.blocks == last.blocks) return now;
    last = now;
  }
}

Status Run() {
  KVPOOL_ASSIGN_OR_RETURN(const uint64_t host, ParseBytes(FLAGS_host_capacity));
  KVPOOL_ASSIGN_OR_RETURN(const uint64_t segment, ParseBytes(FLAGS_segment_size));
  KVPOOL_ASSIGN_OR_RETURN(const uint64_t block, ParseBytes(FLAGS_block_size));
  KVPOOL_ASSIGN_OR_RETURN(std::unique_ptr<bench::DaemonProcess> daemon,
                          bench::DaemonProcess::Launch(bench::BenchDaemonOptions(
                              bench::FindKvpoold(FLAGS_kvpoold), host,
                              {"--host_segment_size=" + FLAGS_segment_size,
                               "--disk_capacity=" + std::to_string(4 * host >> 20) + "MiB",
                               "--host_high_watermark=0.90", "--host_low_watermark=0.80",
                               "--vmodule=tier_manager_space=1"})));
  KVPOOL_ASSIGN_OR_RETURN(std::unique_ptr<Client> first, Tenant(daemon->socket_path(), 0));
  // Tenant 0 puts as many chains as the arena holds (the flusher demotes the coldest as it
  // goes), then reads them back in a random order.
  const uint64_t chains = host / (block * kChain);
  for (uint64_t c = 0; c < chains; ++c) KVPOOL_RETURN_IF_ERROR(PutChain(*first, 0, c, block));
  std::vector<uint64_t> order(chains * kChain);
  for (uint64_t i = 0; i < order.size(); ++i) order[i] = i;
  std::mt19937 rng(1);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<uint8_t> out(block);
  for (uint64_t n : order) {
    const BlockKey key = KeyOf(0, n);
    MutableBuffer buf{out.data(), out.size()};
    KVPOOL_ASSIGN_OR_RETURN(std::vector<GetResult> got, first->Get({&key, 1}, {&buf, 1}));
    (void)got;  // a block the flusher demoted is read from disk (and promoted); a miss is fine
  }
  KVPOOL_ASSIGN_OR_RETURN(HostFigures settled, Settled(*first));
  std::printf("host %s in %s segments, %s blocks; tenant 0: %llu blocks in host after reads\n",
              FormatBytes(host).c_str(), FormatBytes(segment).c_str(), FormatBytes(block).c_str(),
              static_cast<unsigned long long>(settled.blocks));
  std::printf("floor (one segment's blocks): %llu; the tier's blocks: %llu\n",
              static_cast<unsigned long long>(segment / block),
              static_cast<unsigned long long>(settled.blocks));
  // Tenant 0 looks up one of its chains over and over on a connection of its own while each
  // newcomer puts: its slowest lookup is what the newcomer's segment cost everyone else.
  KVPOOL_ASSIGN_OR_RETURN(std::unique_ptr<Client> prober, Tenant(daemon->socket_path(), 0));
  std::vector<BlockKey> probe(kChain);
  for (uint32_t i = 0; i < kChain; ++i) probe[i] = KeyOf(0, i);
  for (uint32_t t = 1; t <= FLAGS_newcomers; ++t) {
    KVPOOL_ASSIGN_OR_RETURN(std::unique_ptr<Client> c, Tenant(daemon->socket_path(), t));
    KVPOOL_ASSIGN_OR_RETURN(HostFigures before, Settled(*first));
    std::atomic<bool> stop{false};
    double slowest_ms = 0;
    uint64_t lookups = 0;
    std::thread probing([&] {
      while (!stop.load()) {
        const auto l0 = Clock::now();
        if (!prober->Lookup(probe, /*prefetch=*/false).ok()) return;
        slowest_ms = std::max(slowest_ms,
                              std::chrono::duration<double, std::milli>(Clock::now() - l0).count());
        ++lookups;
      }
    });
    const auto t0 = Clock::now();
    const Status put = PutChain(*c, t, 0, block);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    stop = true;
    probing.join();
    KVPOOL_RETURN_IF_ERROR(put);
    KVPOOL_ASSIGN_OR_RETURN(HostFigures after, Host(*first));
    std::printf(
        "newcomer %u: put of %u blocks %.1f ms; host blocks out %llu (written first %llu), moved "
        "within host %llu; host blocks %llu; tenant 0's slowest of %llu lookups meanwhile %.1f "
        "ms\n",
        t, kChain, ms, static_cast<unsigned long long>(after.out - before.out),
        static_cast<unsigned long long>(after.demoted - before.demoted),
        static_cast<unsigned long long>(after.moved - before.moved),
        static_cast<unsigned long long>(after.blocks), static_cast<unsigned long long>(lookups),
        slowest_ms);
  }
  // The daemon's own account of each segment it emptied by moving blocks (VLOG(1)).
  const std::string log = daemon->log();
  for (size_t at = log.find("emptied for namespace"); at != std::string::npos;
       at = log.find("emptied for namespace", at + 1)) {
    const size_t begin = log.rfind("host segment", at);
    const size_t end = log.find('\n', at);
    std::printf("kvpoold: %s\n", log.substr(begin, end - begin).c_str());
  }
  return daemon->Stop(std::chrono::seconds(120));
}

}  // namespace
}  // namespace kvpool

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  const kvpool::Status st = kvpool::Run();
  if (!st.ok()) {
    std::fprintf(stderr, "kvpool-newcomer: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
