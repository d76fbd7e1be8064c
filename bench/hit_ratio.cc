// kvpool-hit-ratio: the host tier's block hit ratio under each eviction order on a multi-tenant
// chat trace (bench/chat_trace.h), beside Belady's optimal on the same trace and capacity as the
// limit, cachebench style. Results and the command: docs/BENCHMARKS.md, "Eviction orders: hit
// ratio on a chat trace".
//
// Each (capacity, order) replays the whole trace through a real TierManager: a HostTier of
// exactly `capacity` blocks (4 KiB blocks, one per 4 KiB segment, so no namespace's free pages
// strand and the capacity in blocks is exact) over a DiskTier on a fresh temp RocksDB, with the
// order as the default policy's eviction order, disk admission "none" (an evicted block leaves
// the cache: this measures the host tier alone) and no read-ahead; the flusher's watermark is
// 1.0, so eviction happens only when a put needs room, in the request's thread, and the replay
// is deterministic. Per request, as an engine: Lookup the chain, Acquire and Release the cached
// prefix, Reserve / fill / Commit the missing tail. Hit ratio = cached-prefix blocks / requested
// blocks.
//
// Belady (MIN with bypass: on a miss, the block whose next use is farthest, the new one
// included, is the one not kept) runs offline on the same block sequence and capacity. It is the
// optimum for equal-size blocks over every policy, so no order may beat it: a run where one
// does, or where any ratio leaves [0, 1], or where a get or put fails, exits with status 1.
// Belady ignores kvpool's tail-first rule (it may evict any block), which can only help it; on
// chain traces it evicts tail first anyway (a parent is always next used just before its child),
// which the run counts (`belady_interior_evictions`). Beside it, an offline plain LRU over blocks
// with no tail-first rule (prefix hits only) shows what the rule is worth.

#include <gflags/gflags.h>
#include <glog/logging.h>
#include <stdlib.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <list>
#include <memory>
#include <queue>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/container/flat_hash_map.h"
#include "bench/chat_trace.h"
#include "common/checksum.h"
#include "tiers/disk_tier.h"
#include "tiers/host_tier.h"
#include "tiers/policy.h"
#include "tiers/rocks_store.h"
#include "tiers/tier_manager.h"

DEFINE_uint64(seed, 1, "Seed of the trace.");
DEFINE_uint32(tenants, 4, "Tenants (namespaces).");
DEFINE_uint32(conversations, 64, "Conversation slots per tenant.");
DEFINE_uint32(system_prompts, 3, "System prompts per tenant.");
DEFINE_uint32(requests, 8000, "Requests in the trace.");
DEFINE_double(zipf, 0.8, "Zipf exponent of conversation popularity.");
DEFINE_double(mean_rounds, 6, "Mean rounds per conversation.");
DEFINE_double(think, 32, "Mean think time between a conversation's rounds, in requests.");
DEFINE_double(one_off, 0.1, "Share of requests that are one-off documents.");
DEFINE_uint32(one_off_min_blocks, 8, "Shortest one-off document, in blocks after its prompt.");
DEFINE_uint32(one_off_max_blocks, 32, "Longest one-off document, in blocks after its prompt.");
DEFINE_string(capacities, "0.02,0.05,0.1", "Host capacities, as fractions of the working set.");
DEFINE_string(orders, "lru,s3fifo,lfu", "Eviction orders to replay, comma separated.");
DEFINE_bool(json, false, "One JSON object per line (the trace, then each result), nothing else.");

namespace {

using kvpool::BlockKey;
using kvpool::Result;
using kvpool::Status;
using kvpool::bench::ChatTrace;
namespace tiers = kvpool::tiers;

constexpr uint64_t kBlockBytes = kvpool::tiers::HostTier::kPageBytes;
constexpr uint32_t kNever = UINT32_MAX;

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

[[noreturn]] void Fail(const std::string& why) {
  std::fprintf(stderr, "kvpool-hit-ratio: %s\n", why.c_str());
  std::exit(1);
}

// The trace as the block sequence a cache sees: each request's chain, first block first.
struct Sequence {
  std::vector<uint32_t> block;     // by position
  std::vector<uint32_t> next_use;  // by position: the next position of the same block, or kNever
  std::vector<uint32_t> request_start;  // by request: its first position
};

Sequence SequenceOf(const ChatTrace& trace) {
  if (trace.requested_blocks >= kNever) Fail("trace too long for 32-bit positions");
  Sequence s;
  s.block.reserve(trace.requested_blocks);
  for (const kvpool::bench::ChatRequest& r : trace.requests) {
    s.request_start.push_back(static_cast<uint32_t>(s.block.size()));
    const std::vector<uint32_t>& chain = trace.chains[r.chain];
    s.block.insert(s.block.end(), chain.begin(), chain.begin() + r.length);
  }
  s.next_use.assign(s.block.size(), kNever);
  std::vector<uint32_t> seen(trace.keys.size(), kNever);
  for (size_t t = s.block.size(); t-- > 0;) {
    s.next_use[t] = seen[s.block[t]];
    seen[s.block[t]] = static_cast<uint32_t>(t);
  }
  return s;
}

struct OfflineResult {
  uint64_t hits = 0;                // block hits
  uint64_t prefix_hits = 0;         // hits before the request's first miss
  uint64_t interior_evictions = 0;  // victims that had a cached child
};

// Belady's MIN with bypass, `capacity` equal-size blocks.
OfflineResult Belady(const ChatTrace& trace, const Sequence& s, uint64_t capacity) {
  OfflineResult out;
  const size_t n = trace.keys.size();
  std::vector<uint8_t> cached(n, 0);
  std::vector<uint32_t> next(n, kNever);  // of cached blocks
  std::vector<uint32_t> cached_children(n, 0);
  // Max-heap of (next use, block), stale entries skipped; among blocks never used again the
  // highest id (a descendant, made after its ancestors) goes first.
  std::priority_queue<std::pair<uint32_t, uint32_t>> heap;
  uint64_t size = 0;
  size_t req = 0;
  bool prefix = true;
  for (size_t t = 0; t < s.block.size(); ++t) {
    if (req < s.request_start.size() && s.request_start[req] == t) {
      ++req;
      prefix = true;
    }
    const uint32_t b = s.block[t];
    const uint32_t nu = s.next_use[t];
    if (cached[b]) {
      ++out.hits;
      out.prefix_hits += prefix;
      next[b] = nu;
      heap.emplace(nu, b);
      continue;
    }
    prefix = false;
    if (nu == kNever || capacity == 0) continue;  // bypass: nothing gains from keeping it
    if (size == capacity) {
      while (!cached[heap.top().second] || next[heap.top().second] != heap.top().first) heap.pop();
      const auto [far, victim] = heap.top();
      if (far <= nu) continue;  // every cached block is used before this one: bypass
      heap.pop();
      cached[victim] = 0;
      --size;
      out.interior_evictions += cached_children[victim] > 0;
      if (trace.parent[victim] != ChatTrace::kNoParent) --cached_children[trace.parent[victim]];
    }
    cached[b] = 1;
    next[b] = nu;
    heap.emplace(nu, b);
    ++size;
    if (trace.parent[b] != ChatTrace::kNoParent) ++cached_children[trace.parent[b]];
  }
  return out;
}

// Plain LRU over blocks, every requested block inserted or refreshed, any block evictable.
OfflineResult PlainLru(const ChatTrace& trace, const Sequence& s, uint64_t capacity) {
  OfflineResult out;
  std::list<uint32_t> lru;  // front: most recent
  std::vector<std::list<uint32_t>::iterator> where(trace.keys.size(), lru.end());
  std::vector<uint32_t> cached_children(trace.keys.size(), 0);
  size_t req = 0;
  bool prefix = true;
  for (size_t t = 0; t < s.block.size(); ++t) {
    if (req < s.request_start.size() && s.request_start[req] == t) {
      ++req;
      prefix = true;
    }
    const uint32_t b = s.block[t];
    if (where[b] != lru.end()) {
      ++out.hits;
      out.prefix_hits += prefix;
      lru.splice(lru.begin(), lru, where[b]);
      continue;
    }
    prefix = false;
    if (capacity == 0) continue;
    if (lru.size() == capacity) {
      const uint32_t victim = lru.back();
      lru.pop_back();
      where[victim] = lru.end();
      out.interior_evictions += cached_children[victim] > 0;
      if (trace.parent[victim] != ChatTrace::kNoParent) --cached_children[trace.parent[victim]];
    }
    lru.push_front(b);
    where[b] = lru.begin();
    if (trace.parent[b] != ChatTrace::kNoParent) ++cached_children[trace.parent[b]];
  }
  return out;
}

struct ReplayResult {
  uint64_t hits = 0;         // cached-prefix blocks
  uint64_t puts = 0;         // blocks reserved and committed
  uint64_t present = 0;      // tail blocks already cached (after a gap in the prefix)
  uint64_t refused = 0;      // tail blocks the host tier could not take
  uint64_t parent_lost = 0;  // requests whose put evicted the tail's parent (see Replay)
  uint64_t evictions = 0;
  uint64_t max_host_blocks = 0;
  double seconds = 0;
};

// Replays the trace through a fresh TierManager whose host tier holds `capacity` blocks.
ReplayResult Replay(const ChatTrace& trace, uint64_t capacity, const std::string& order) {
  char tmpl[] = "/tmp/kvpool-hit-ratio.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) Fail(std::string("mkdtemp: ") + std::strerror(errno));
  const std::string dir = tmpl;
  ReplayResult out;
  {
    tiers::RocksStoreOptions ro;
    ro.path = dir + "/rocksdb";
    ro.block_cache_bytes = 8ull << 20;
    Result<std::unique_ptr<tiers::RocksStore>> store = tiers::RocksStore::Open(ro);
    if (!store.ok()) Fail("opening RocksDB: " + store.status().ToString());
    tiers::DiskTier disk(**store);
    tiers::HostTierOptions ho;
    ho.capacity_bytes = capacity * kBlockBytes;
    ho.segment_bytes = kBlockBytes;
    ho.lock_memory = false;
    Result<std::unique_ptr<tiers::HostTier>> host = tiers::HostTier::Create(ho);
    if (!host.ok())
      Fail("host tier of " + std::to_string(capacity) + " blocks: " + host.status().ToString());
    tiers::TierManagerOptions mo;
    mo.host_high_watermark = 1.0;  // the flusher never evicts: only a put that needs room does
    mo.host_low_watermark = 1.0;
    mo.promotion_threads = 1;
    mo.flush_on_shutdown = false;
    Result<tiers::TierStack> stack = tiers::TierStack::Create({host->get(), &disk});
    if (!stack.ok()) Fail("tier stack: " + stack.status().ToString());
    tiers::TierManager manager(mo, std::move(*stack));
    Status st = manager.Recover();
    if (!st.ok()) Fail("recover: " + st.ToString());
    manager.Start();
    Result<tiers::NamespacePolicy> policy =
        tiers::ComposePolicy(order, "write-back", "none", "none");
    if (!policy.ok()) Fail("policy: " + policy.status().ToString());
    st = manager.SetDefaultPolicy(*policy);
    if (!st.ok()) Fail("policy: " + st.ToString());

    std::vector<uint8_t> payload(kBlockBytes);
    for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 131 + 7);
    const uint64_t checksum = kvpool::BlockChecksum(payload.data(), payload.size());
    constexpr uint64_t kOwner = 1;
    std::vector<BlockKey> keys;
    std::vector<tiers::PutRequestItem> items;
    uint64_t served = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (const kvpool::bench::ChatRequest& r : trace.requests) {
      const std::vector<uint32_t>& chain = trace.chains[r.chain];
      keys.clear();
      for (uint32_t i = 0; i < r.length; ++i) keys.push_back(trace.keys[chain[i]]);
      const tiers::LookupResult found = manager.Lookup(r.ns, keys, /*prefetch=*/false);
      const uint32_t hit = found.hit_blocks;
      out.hits += hit;
      std::vector<tiers::BlockRead> reads =
          manager.Acquire(r.ns, std::span<const BlockKey>(keys).first(hit), kOwner);
      for (tiers::BlockRead& read : reads) {
        if (!read.status.ok() || read.from != kvpool::Tier::kHost) {
          Fail("a block of the cached prefix was not read from host: " + read.status.ToString());
        }
        manager.Release(read);
      }
      items.clear();
      for (uint32_t i = hit; i < r.length; ++i) {
        tiers::PutRequestItem item;
        item.key = keys[i];
        item.size = kBlockBytes;
        item.checksum = checksum;
        if (i > 0) item.parent = keys[i - 1];
        items.push_back(item);
      }
      const std::vector<tiers::ReserveOutcome> reserved = manager.Reserve(r.ns, kOwner, items);
      // Making room for the tail can evict the cached prefix's last block (the tail's parent):
      // the tail is then committed without its parent link, cached but not reachable by lookup.
      if (hit > 0 && !items.empty() &&
          manager.CountCached(r.ns, std::span<const BlockKey>(keys).subspan(hit - 1, 1)) == 0) {
        ++out.parent_lost;
      }
      for (const tiers::ReserveOutcome& o : reserved) {
        if (o.state == tiers::ReserveState::kPresent) {
          ++out.present;
          continue;
        }
        if (o.state != tiers::ReserveState::kReserved) {
          ++out.refused;
          continue;
        }
        Result<tiers::ReservationTarget> target = manager.TargetOf(kOwner, o.reservation_id);
        if (!target.ok()) Fail("reservation target: " + target.status().ToString());
        std::memcpy(target->data, payload.data(), kBlockBytes);
        st = manager.Commit(kOwner, o.reservation_id);
        if (!st.ok()) Fail("commit: " + st.ToString());
        ++out.puts;
      }
      if (++served % 256 == 0) {  // GetStats walks the host tier: not every request
        out.max_host_blocks = std::max(out.max_host_blocks, manager.GetStats().host_blocks);
      }
    }
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const tiers::TierManagerStats stats = manager.GetStats();
    out.evictions = stats.host_counters.evictions;
    out.max_host_blocks = std::max(out.max_host_blocks, stats.host_blocks);
    if (stats.disk_blocks != 0) Fail("disk admission 'none' but disk holds blocks");
    if (out.max_host_blocks > capacity) Fail("host tier held more blocks than its capacity");
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return out;
}

double Ratio(uint64_t a, uint64_t b) { return b == 0 ? 0 : static_cast<double>(a) / b; }

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "host-tier hit ratio of each eviction order on a multi-tenant chat trace, beside Belady");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = google::GLOG_WARNING;  // not one "recovered 0 disk blocks" per replay
  google::InitGoogleLogging(argv[0]);

  kvpool::bench::ChatTraceOptions to;
  to.seed = FLAGS_seed;
  to.tenants = FLAGS_tenants;
  to.conversations_per_tenant = FLAGS_conversations;
  to.system_prompts_per_tenant = FLAGS_system_prompts;
  to.requests = FLAGS_requests;
  to.conversation_zipf = FLAGS_zipf;
  to.mean_rounds = FLAGS_mean_rounds;
  to.mean_think_requests = FLAGS_think;
  to.one_off_fraction = FLAGS_one_off;
  to.one_off_min_blocks = FLAGS_one_off_min_blocks;
  to.one_off_max_blocks = std::max(FLAGS_one_off_min_blocks, FLAGS_one_off_max_blocks);
  if (to.tenants == 0 || to.conversations_per_tenant == 0 || to.system_prompts_per_tenant == 0) {
    Fail("--tenants, --conversations and --system_prompts must be positive");
  }
  const ChatTrace trace = kvpool::bench::MakeChatTrace(to);
  const Sequence seq = SequenceOf(trace);
  const uint64_t working_set = trace.working_set_blocks();
  uint64_t one_off_requests = 0;
  for (const auto& r : trace.requests) one_off_requests += r.one_off;

  // One memfd (and one mapping) per host segment, i.e. per block of capacity.
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }

  nlohmann::json head = {{"kind", "trace"},
                         {"seed", FLAGS_seed},
                         {"tenants", FLAGS_tenants},
                         {"conversations_per_tenant", FLAGS_conversations},
                         {"system_prompts_per_tenant", FLAGS_system_prompts},
                         {"requests", trace.requests.size()},
                         {"one_off_requests", one_off_requests},
                         {"requested_blocks", trace.requested_blocks},
                         {"working_set_blocks", working_set},
                         {"block_bytes", kBlockBytes},
                         {"infinite_cache_hit_ratio",
                          Ratio(trace.requested_blocks - working_set, trace.requested_blocks)}};
  if (FLAGS_json) {
    std::printf("%s\n", head.dump().c_str());
  } else {
    std::printf(
        "trace: seed %llu, %u tenants x %u conversations, %u system prompts each; %zu requests "
        "(%llu one-off), %llu blocks requested, working set %llu blocks of %llu bytes; an "
        "infinite cache (first use of each block the only miss) hits %.4f\n",
        static_cast<unsigned long long>(FLAGS_seed), FLAGS_tenants, FLAGS_conversations,
        FLAGS_system_prompts, trace.requests.size(),
        static_cast<unsigned long long>(one_off_requests),
        static_cast<unsigned long long>(trace.requested_blocks),
        static_cast<unsigned long long>(working_set), static_cast<unsigned long long>(kBlockBytes),
        Ratio(trace.requested_blocks - working_set, trace.requested_blocks));
  }

  bool violated = false;
  for (const std::string& cap_text : Split(FLAGS_capacities)) {
    const double fraction = std::strtod(cap_text.c_str(), nullptr);
    if (!(fraction > 0 && fraction <= 1)) Fail("capacity " + cap_text + " is not in (0, 1]");
    const uint64_t capacity =
        std::max<uint64_t>(1, static_cast<uint64_t>(std::llround(fraction * working_set)));
    if (capacity + 256 > files.rlim_cur) {
      Fail("capacity of " + std::to_string(capacity) +
           " blocks needs as many host segments "
           "(memfds) and the open-file limit is " +
           std::to_string(files.rlim_cur));
    }
    const OfflineResult belady = Belady(trace, seq, capacity);
    const OfflineResult plain = PlainLru(trace, seq, capacity);
    const double belady_ratio = Ratio(belady.hits, trace.requested_blocks);
    if (belady.prefix_hits != belady.hits) {
      std::fprintf(stderr, "note: Belady hit %llu blocks after a miss in their request\n",
                   static_cast<unsigned long long>(belady.hits - belady.prefix_hits));
    }
    if (!FLAGS_json) {
      std::printf("\ncapacity %.3g of the working set = %llu blocks\n", fraction,
                  static_cast<unsigned long long>(capacity));
      std::printf("| order | hit ratio | of Belady | evictions | replay s |\n");
      std::printf("| --- | ---: | ---: | ---: | ---: |\n");
    }
    // `order` names the row in JSON, `label` in the table.
    auto row = [&](const std::string& order, const std::string& label, uint64_t hits,
                   nlohmann::json extra) {
      const double ratio = Ratio(hits, trace.requested_blocks);
      const double of_belady = Ratio(hits, belady.hits);
      if (!(ratio >= 0 && ratio <= 1) || hits > belady.hits) {
        violated = true;
        std::fprintf(stderr, "VIOLATION: %s at capacity %llu: %llu hits, Belady %llu\n",
                     order.c_str(), static_cast<unsigned long long>(capacity),
                     static_cast<unsigned long long>(hits),
                     static_cast<unsigned long long>(belady.hits));
      }
      nlohmann::json j = {{"kind", "result"},
                          {"capacity_fraction", fraction},
                          {"capacity_blocks", capacity},
                          {"order", order},
                          {"hits", hits},
                          {"requested_blocks", trace.requested_blocks},
                          {"hit_ratio", ratio},
                          {"belady_hit_ratio", belady_ratio},
                          {"fraction_of_belady", of_belady}};
      j.update(extra);
      if (FLAGS_json) {
        std::printf("%s\n", j.dump().c_str());
      } else {
        const std::string ev =
            j.contains("evictions") ? std::to_string(j["evictions"].get<uint64_t>()) : "";
        const std::string secs =
            j.contains("seconds") ? std::to_string(j["seconds"].get<double>()).substr(0, 5) : "";
        std::printf("| %s | %.4f | %.3f | %s | %s |\n", label.c_str(), ratio, of_belady, ev.c_str(),
                    secs.c_str());
      }
      std::fflush(stdout);
    };
    for (const std::string& order : Split(FLAGS_orders)) {
      const ReplayResult r = Replay(trace, capacity, order);
      row(order, order, r.hits,
          {{"source", "tier_manager"},
           {"puts", r.puts},
           {"present", r.present},
           {"refused", r.refused},
           {"parent_lost", r.parent_lost},
           {"evictions", r.evictions},
           {"max_host_blocks", r.max_host_blocks},
           {"seconds", r.seconds}});
    }
    row("plain_lru_offline", "plain LRU, no tail-first rule (offline)", plain.prefix_hits,
        {{"source", "offline"},
         {"block_hits", plain.hits},
         {"interior_evictions", plain.interior_evictions}});
    row("belady", "Belady (offline; the limit)", belady.hits,
        {{"source", "offline"}, {"belady_interior_evictions", belady.interior_evictions}});
  }
  return violated ? 1 : 0;
}
