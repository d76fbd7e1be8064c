#include "bench/scale_bench.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <kvpool/client.h>

#include "bench/bench_daemon.h"
#include "bench/block_data.h"
#include "common/units.h"
#include "tests/support/process_stats.h"

namespace kvpool::bench {
namespace {

using testing::ProcessSample;
using testing::SampleProcess;
using testing::WaitUntilQuiet;

constexpr uint64_t kSegmentBytes = 64ull << 20;

void Progress(const std::string& line) {
  std::fprintf(stderr, "[kvpool-bench --scale] %s\n", line.c_str());
}

// The blocks of the run: chain `chain` of tenant `tenant`, every key and byte a pure function of
// (seed, tenant, chain, position), so nothing is kept to verify a read.
class ChainData {
 public:
  ChainData(uint64_t seed, uint64_t block_bytes, uint32_t chain_blocks)
      : seed_(seed), block_bytes_(block_bytes), chain_blocks_(chain_blocks) {}

  uint64_t block_bytes() const { return block_bytes_; }
  uint32_t chain_blocks() const { return chain_blocks_; }

  void Keys(uint32_t tenant, uint64_t chain, std::vector<BlockKey>& out) const {
    out.resize(chain_blocks_);
    const uint64_t base = SplitMix64(seed_ ^ SplitMix64((uint64_t{tenant} << 40) ^ chain));
    for (uint32_t p = 0; p < chain_blocks_; ++p) {
      for (int w = 0; w < 4; ++w) {
        const uint64_t v = SplitMix64(base + uint64_t{p} * 4 + static_cast<uint64_t>(w));
        std::memcpy(out[p].bytes.data() + w * 8, &v, 8);
      }
    }
  }

  // The bytes of the block whose key is `key`.
  void Fill(const BlockKey& key, uint8_t* out) const {
    uint64_t base = 0;
    std::memcpy(&base, key.bytes.data(), 8);
    for (uint64_t i = 0; i < block_bytes_ / 8; ++i) {
      const uint64_t v = SplitMix64(base + i);
      std::memcpy(out + i * 8, &v, 8);
    }
    for (uint64_t i = block_bytes_ / 8 * 8; i < block_bytes_; ++i) out[i] = key.bytes[i % 32];
  }

  bool Matches(const BlockKey& key, const uint8_t* data, size_t size,
               std::vector<uint8_t>& scratch) const {
    if (size != block_bytes_) return false;
    scratch.resize(block_bytes_);
    Fill(key, scratch.data());
    return std::memcmp(scratch.data(), data, size) == 0;
  }

 private:
  const uint64_t seed_;
  const uint64_t block_bytes_;
  const uint32_t chain_blocks_;
};

std::string TenantName(uint32_t tenant) {
  char name[32];
  std::snprintf(name, sizeof(name), "scale-%04u", tenant);
  return name;
}

Result<std::unique_ptr<Client>> ConnectTenant(const std::string& socket, uint32_t tenant,
                                              bool admin) {
  ClientOptions o;
  o.address = socket;
  o.namespace_name = TenantName(tenant);
  o.client_name = "kvpool-bench-scale";
  o.data_path = DataPath::kSharedMemory;
  o.timeout = std::chrono::milliseconds(60000);
  o.admin = admin;
  return Client::Connect(o);
}

// Puts chains [from, to) of `tenant`, one chain per call; every block must be fresh.
Status FillChains(Client& client, const ChainData& data, uint32_t tenant, uint64_t from,
                  uint64_t to) {
  std::vector<BlockKey> keys;
  AlignedBuffer bytes(data.block_bytes() * data.chain_blocks());
  std::vector<PutBlock> blocks(data.chain_blocks());
  for (uint64_t chain = from; chain < to; ++chain) {
    data.Keys(tenant, chain, keys);
    for (uint32_t p = 0; p < data.chain_blocks(); ++p) {
      uint8_t* b = bytes.data() + p * data.block_bytes();
      data.Fill(keys[p], b);
      blocks[p].key = keys[p];
      blocks[p].data = b;
      blocks[p].size = data.block_bytes();
      blocks[p].parent = p > 0 ? keys[p - 1] : BlockKey{};
    }
    KVPOOL_ASSIGN_OR_RETURN(PutResult r, client.Put(blocks));
    for (const Status& st : r.errors) {
      if (!st.ok()) return st.WithContext("put of chain " + std::to_string(chain));
    }
    if (r.stored != data.chain_blocks()) {
      return Status::Internal("a put of a fresh chain stored " + std::to_string(r.stored) + " of " +
                              std::to_string(data.chain_blocks()) + " blocks");
    }
  }
  return Status::OK();
}

// Looks up whole chains, or gets `get_batch` blocks of one, of a random tenant of [0, tenants)
// and a random chain of [0, chains) per call, over a connection per tenant (opened in Prepare).
// Every lookup must find the whole chain; every get's bytes are checked, outside the sample.
class ScaleWorker : public PhaseWorker {
 public:
  enum class Op { kLookup, kGet };

  ScaleWorker(Op op, const ChainData& data, std::string socket, uint32_t tenants, uint64_t chains,
              uint32_t get_batch, uint64_t seed)
      : op_(op),
        data_(data),
        socket_(std::move(socket)),
        tenants_(tenants),
        chains_(chains),
        get_batch_(std::min(get_batch, data.chain_blocks())),
        rng_(seed) {}

  Status Prepare() override {
    for (uint32_t t = 0; t < tenants_; ++t) {
      KVPOOL_ASSIGN_OR_RETURN(std::unique_ptr<Client> c, ConnectTenant(socket_, t, false));
      clients_.push_back(std::move(c));
    }
    if (op_ == Op::kGet) {
      buffers_ = AlignedBuffer(data_.block_bytes() * get_batch_);
      for (uint32_t i = 0; i < get_batch_; ++i) {
        views_.push_back({buffers_.data() + i * data_.block_bytes(), data_.block_bytes()});
      }
    }
    return Status::OK();
  }

  Status Run(PhaseClock& clock) override {
    while (clock.Continue()) {
      const uint32_t tenant = static_cast<uint32_t>(rng_() % tenants_);
      const uint64_t chain = rng_() % chains_;
      data_.Keys(tenant, chain, keys_);
      Client& client = *clients_[tenant];
      if (op_ == Op::kLookup) {
        const auto t0 = Clock::now();
        KVPOOL_ASSIGN_OR_RETURN(LookupResult r, client.Lookup(keys_, /*prefetch=*/false));
        clock.Record(Clock::now() - t0, 0);
        if (r.hit_blocks != keys_.size()) {
          return Status::Internal("a lookup of a stored chain found " +
                                  std::to_string(r.hit_blocks) + " of " +
                                  std::to_string(keys_.size()) + " blocks");
        }
        continue;
      }
      const size_t start = rng_() % (keys_.size() - get_batch_ + 1);
      const std::span<const BlockKey> batch(keys_.data() + start, get_batch_);
      const auto t0 = Clock::now();
      KVPOOL_ASSIGN_OR_RETURN(std::vector<GetResult> r, client.Get(batch, views_));
      clock.Record(Clock::now() - t0, data_.block_bytes() * get_batch_);
      for (size_t i = 0; i < r.size(); ++i) {
        if (!r[i].status.ok()) return r[i].status.WithContext("get of " + batch[i].ShortHex());
        if (!data_.Matches(batch[i], static_cast<const uint8_t*>(views_[i].data), r[i].size,
                           scratch_)) {
          return Status::Internal("get of " + batch[i].ShortHex() + " returned wrong bytes");
        }
        if (r[i].tier == Tier::kDisk) ++from_disk_;
        ++blocks_;
      }
    }
    return Status::OK();
  }

  uint64_t from_disk() const { return from_disk_; }
  uint64_t blocks() const { return blocks_; }

 private:
  const Op op_;
  const ChainData& data_;
  const std::string socket_;
  const uint32_t tenants_;
  const uint64_t chains_;
  const uint32_t get_batch_;
  std::mt19937_64 rng_;
  std::vector<std::unique_ptr<Client>> clients_;
  std::vector<BlockKey> keys_;
  AlignedBuffer buffers_;
  std::vector<MutableBuffer> views_;
  std::vector<uint8_t> scratch_;
  uint64_t from_disk_ = 0;
  uint64_t blocks_ = 0;
};

class ScaleRun {
 public:
  ScaleRun(const ScaleConfig& c, const std::function<void(Figure)>& emit)
      : c_(c),
        emit_(emit),
        data_(std::random_device{}() | (uint64_t{std::random_device{}()} << 32), c.block_bytes,
              c.chain_blocks) {}

  Status BlocksAndConnections();
  Status Namespaces();

 private:
  Result<std::unique_ptr<DaemonProcess>> Launch(uint64_t host_capacity, uint64_t disk_bytes,
                                                std::vector<std::string> flags);
  // A figure of `curve` at `x` (its x key is `x_name`).
  Figure NewFigure(const std::string& op, const std::string& curve, const std::string& x_name,
                   uint64_t x) const;
  // Runs `threads` ScaleWorkers for c_.seconds and emits their figure with the daemon's CPU time
  // per call, resident memory and index size.
  Status Measure(ScaleWorker::Op op, Figure f, DaemonProcess& daemon, int threads, uint32_t tenants,
                 uint64_t chains);
  Status AddDaemonFigures(DaemonProcess& daemon, Figure& f);

  const ScaleConfig& c_;
  const std::function<void(Figure)>& emit_;
  const ChainData data_;
  std::unique_ptr<Client> admin_;
};

Result<std::unique_ptr<DaemonProcess>> ScaleRun::Launch(uint64_t host_capacity, uint64_t disk_bytes,
                                                        std::vector<std::string> flags) {
  flags.insert(flags.begin(),
               {"--write_policy=write-through", "--lock_memory=false",
                "--disk_capacity=" +
                    std::to_string(std::max<uint64_t>(disk_bytes, 1ull << 30) >> 20) + "MiB"});
  DaemonProcessOptions o = BenchDaemonOptions(c_.kvpoold, host_capacity, std::move(flags));
  o.cpus = c_.pin.daemon_cpus;
  o.dir_prefix = "kvpool-bench-scale";
  o.start_timeout = std::chrono::minutes(10);  // rebuilding 10^7 blocks takes a while
  return DaemonProcess::Launch(std::move(o));
}

Figure ScaleRun::NewFigure(const std::string& op, const std::string& curve,
                           const std::string& x_name, uint64_t x) const {
  Figure f;
  f.system = "kvpool";
  f.path = "shm";
  f.op = op;
  f.block_bytes = c_.block_bytes;
  f.extra["curve"] = curve;
  f.extra["x"] = x_name;
  f.extra[x_name] = x;
  f.extra["chain_blocks"] = c_.chain_blocks;
  f.extra["pin"] = c_.pin.description;
  return f;
}

Status ScaleRun::AddDaemonFigures(DaemonProcess& daemon, Figure& f) {
  KVPOOL_ASSIGN_OR_RETURN(DaemonStats s, admin_->Stats());
  f.extra["daemon_rss_bytes"] = SampleProcess(daemon.pid()).rss_bytes;
  f.extra["index_entries"] = s.index_entries;
  f.extra["index_bytes"] = s.index_bytes;
  f.extra["index_bytes_per_block"] =
      s.index_entries > 0 ? static_cast<double>(s.index_bytes) / s.index_entries : 0.0;
  f.extra["rocksdb_memory_bytes"] = s.rocksdb_memory_bytes;
  return Status::OK();
}

Status ScaleRun::Measure(ScaleWorker::Op op, Figure f, DaemonProcess& daemon, int threads,
                         uint32_t tenants, uint64_t chains) {
  std::vector<std::unique_ptr<PhaseWorker>> workers;
  std::vector<ScaleWorker*> scale_workers;
  std::mt19937_64 seeds(std::random_device{}());
  for (int i = 0; i < threads; ++i) {
    auto w = std::make_unique<ScaleWorker>(op, data_, daemon.socket_path(), tenants, chains,
                                           c_.get_batch, seeds());
    scale_workers.push_back(w.get());
    workers.push_back(std::move(w));
  }
  PhaseLimits limits;
  limits.seconds = c_.seconds;
  f.extra["settle_seconds"] = WaitUntilQuiet(daemon.pid(), std::chrono::seconds(300));
  const ProcessSample before = SampleProcess(daemon.pid());
  KVPOOL_ASSIGN_OR_RETURN(PhaseStats stats, RunPhase(workers, c_.pin.bench_cpus, limits));
  const ProcessSample after = SampleProcess(daemon.pid());
  f.concurrency = threads;
  f.SetFrom(stats);
  f.extra["daemon_cpu_us_per_op"] =
      stats.ops > 0 ? (after.cpu_seconds - before.cpu_seconds) * 1e6 / stats.ops : 0.0;
  f.extra["serving_cpu_us_per_op"] =
      stats.ops > 0 ? (after.serving_cpu_seconds - before.serving_cpu_seconds) * 1e6 / stats.ops
                    : 0.0;
  if (op == ScaleWorker::Op::kGet) {
    uint64_t disk = 0;
    uint64_t blocks = 0;
    for (const ScaleWorker* w : scale_workers) {
      disk += w->from_disk();
      blocks += w->blocks();
    }
    f.extra["get_batch"] = c_.get_batch;
    f.extra["from_disk_share"] = blocks > 0 ? static_cast<double>(disk) / blocks : 0.0;
  }
  KVPOOL_RETURN_IF_ERROR(AddDaemonFigures(daemon, f));
  emit_(std::move(f));
  return Status::OK();
}

Status ScaleRun::BlocksAndConnections() {
  const uint64_t largest = c_.blocks.back();
  KVPOOL_ASSIGN_OR_RETURN(
      std::unique_ptr<DaemonProcess> daemon,
      Launch(c_.host_capacity, largest * c_.block_bytes * 2, {"--host_segment_size=64MiB"}));
  KVPOOL_ASSIGN_OR_RETURN(admin_, ConnectTenant(daemon->socket_path(), 0, /*admin=*/true));
  uint64_t chains = 0;
  for (uint64_t target : c_.blocks) {
    const uint64_t want = std::max<uint64_t>(1, target / c_.chain_blocks);
    Progress("blocks curve: filling to " + std::to_string(want * c_.chain_blocks) + " blocks");
    const auto t0 = Clock::now();
    const ProcessSample before = SampleProcess(daemon->pid());
    KVPOOL_RETURN_IF_ERROR(FillChains(*admin_, data_, 0, chains, want));
    const double fill_s = std::chrono::duration<double>(Clock::now() - t0).count();
    const ProcessSample after = SampleProcess(daemon->pid());
    const uint64_t added = (want - chains) * c_.chain_blocks;
    chains = want;
    const uint64_t indexed = chains * c_.chain_blocks;
    Figure fill = NewFigure("fill", "blocks", "indexed_blocks", indexed);
    fill.ops_per_s = fill_s > 0 ? added / fill_s : 0;  // blocks per second
    fill.gbps = fill_s > 0 ? added * c_.block_bytes / fill_s / 1e9 : 0;
    fill.extra["blocks_added"] = added;
    fill.extra["seconds"] = fill_s;
    fill.extra["ops"] = "blocks";
    fill.extra["daemon_cpu_us_per_op"] =
        added > 0 ? (after.cpu_seconds - before.cpu_seconds) * 1e6 / added : 0.0;
    KVPOOL_RETURN_IF_ERROR(AddDaemonFigures(*daemon, fill));
    // RocksDB compacting what the fill wrote would compete with the rebuild on a pinned daemon.
    fill.extra["settle_seconds"] = WaitUntilQuiet(daemon->pid(), std::chrono::seconds(300));
    emit_(std::move(fill));

    // The index rebuilt from disk: a restart on the same data (write-through: all of it).
    admin_.reset();
    KVPOOL_RETURN_IF_ERROR(daemon->Stop(std::chrono::seconds(600)));
    const auto r0 = Clock::now();
    KVPOOL_RETURN_IF_ERROR(daemon->Start());
    const double restart_s = std::chrono::duration<double>(Clock::now() - r0).count();
    KVPOOL_ASSIGN_OR_RETURN(admin_, ConnectTenant(daemon->socket_path(), 0, /*admin=*/true));
    KVPOOL_ASSIGN_OR_RETURN(DaemonStats s, admin_->Stats());
    if (s.index_rebuild_blocks != indexed) {
      return Status::Internal("the restarted daemon rebuilt its index with " +
                              std::to_string(s.index_rebuild_blocks) + " blocks; " +
                              std::to_string(indexed) + " were put write-through");
    }
    Figure rebuild = NewFigure("rebuild", "blocks", "indexed_blocks", indexed);
    rebuild.ops_per_s =
        s.index_rebuild_seconds > 0 ? s.index_rebuild_blocks / s.index_rebuild_seconds : 0;
    rebuild.extra["ops"] = "blocks";
    rebuild.extra["index_rebuild_seconds"] = s.index_rebuild_seconds;
    rebuild.extra["restart_wall_seconds"] = restart_s;
    // The daemon's own account of the rebuild: reading the records against building the index.
    const std::string log = daemon->LogTail(16384);
    if (const size_t at = log.rfind("recovered "); at != std::string::npos) {
      rebuild.extra["rebuild_log"] = log.substr(at, log.find('\n', at) - at);
    }
    KVPOOL_RETURN_IF_ERROR(AddDaemonFigures(*daemon, rebuild));
    emit_(std::move(rebuild));

    KVPOOL_RETURN_IF_ERROR(Measure(ScaleWorker::Op::kLookup,
                                   NewFigure("lookup", "blocks", "indexed_blocks", indexed),
                                   *daemon, 1, 1, chains));
    KVPOOL_RETURN_IF_ERROR(Measure(ScaleWorker::Op::kGet,
                                   NewFigure("get", "blocks", "indexed_blocks", indexed), *daemon,
                                   1, 1, chains));
  }
  for (int n : c_.clients) {
    Progress("connections curve: " + std::to_string(n) + " clients");
    KVPOOL_RETURN_IF_ERROR(Measure(ScaleWorker::Op::kLookup,
                                   NewFigure("lookup", "connections", "connections", n), *daemon, n,
                                   1, chains));
  }
  admin_.reset();
  return daemon->Stop(std::chrono::seconds(600));
}

Status ScaleRun::Namespaces() {
  const uint32_t largest = static_cast<uint32_t>(c_.namespaces.back());
  // Every tenant owns at least one host segment: 1 MiB ones, one per tenant and some spare.
  const uint64_t segment = 1ull << 20;
  const uint64_t per_tenant = c_.block_bytes * c_.chain_blocks;
  const uint64_t segments_each = (per_tenant + segment - 1) / segment;
  const uint64_t host = std::max<uint64_t>(kSegmentBytes, (largest + 2) * segments_each * segment);
  KVPOOL_ASSIGN_OR_RETURN(
      std::unique_ptr<DaemonProcess> daemon,
      Launch(host, uint64_t{largest} * per_tenant * 2,
             {"--host_segment_size=1MiB", "--max_namespaces=" + std::to_string(largest + 16),
              "--max_connections_per_peer=" + std::to_string(2 * largest + 64),
              "--max_connections=" + std::to_string(2 * largest + 128)}));
  // BenchDaemonOptions sizes the tier in 64 MiB steps; with 1 MiB segments that is only more.
  KVPOOL_ASSIGN_OR_RETURN(admin_, ConnectTenant(daemon->socket_path(), 0, /*admin=*/true));
  uint32_t tenants = 0;
  for (int target : c_.namespaces) {
    Progress("namespaces curve: " + std::to_string(target) + " tenants");
    for (; tenants < static_cast<uint32_t>(target); ++tenants) {
      KVPOOL_ASSIGN_OR_RETURN(std::unique_ptr<Client> c,
                              ConnectTenant(daemon->socket_path(), tenants, false));
      KVPOOL_RETURN_IF_ERROR(FillChains(*c, data_, tenants, 0, 1));
    }
    KVPOOL_RETURN_IF_ERROR(Measure(ScaleWorker::Op::kLookup,
                                   NewFigure("lookup", "namespaces", "namespaces", tenants),
                                   *daemon, 1, tenants, 1));
    KVPOOL_RETURN_IF_ERROR(Measure(ScaleWorker::Op::kGet,
                                   NewFigure("get", "namespaces", "namespaces", tenants), *daemon,
                                   1, tenants, 1));
  }
  admin_.reset();
  return daemon->Stop(std::chrono::seconds(600));
}

// Room for a connection per tenant and per client thread, in this process and the daemon.
void RaiseDescriptorLimit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &r);
  }
}

std::string Mib(const nlohmann::json& j, const char* key) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.0f", j.contains(key) ? j[key].get<double>() / (1 << 20) : 0.0);
  return buf;
}

}  // namespace

Status RunScale(const ScaleConfig& config, const std::function<void(Figure)>& emit) {
  if (config.blocks.empty() && config.namespaces.empty()) {
    return Status::InvalidArgument("--scale needs --scale_blocks or --scale_namespaces");
  }
  if (config.chain_blocks < 1 || config.block_bytes < 1) {
    return Status::InvalidArgument("--scale_chain_blocks and --scale_block_bytes must be >= 1");
  }
  if (!std::is_sorted(config.blocks.begin(), config.blocks.end()) ||
      !std::is_sorted(config.namespaces.begin(), config.namespaces.end())) {
    return Status::InvalidArgument("--scale_blocks and --scale_namespaces must be ascending");
  }
  RaiseDescriptorLimit();
  ScaleRun run(config, emit);
  if (!config.blocks.empty()) KVPOOL_RETURN_IF_ERROR(run.BlocksAndConnections());
  if (!config.namespaces.empty()) KVPOOL_RETURN_IF_ERROR(run.Namespaces());
  return Status::OK();
}

std::string FormatScaleTable(const std::vector<Figure>& figures) {
  std::string out =
      "curve        x          op       ops/s (fill, rebuild: blocks/s)  p50 us    p99 us  "
      "daemon us/op  serving us/op  rss MiB  index B/block  note\n";
  for (const Figure& f : figures) {
    const nlohmann::json& e = f.extra;
    if (!e.contains("curve")) continue;
    const std::string x_name = e["x"].get<std::string>();
    std::string note;
    if (f.op == "rebuild") {
      char buf[96];
      std::snprintf(buf, sizeof(buf), "rebuild %.3f s, restart %.3f s",
                    e["index_rebuild_seconds"].get<double>(),
                    e["restart_wall_seconds"].get<double>());
      note = buf;
    } else if (f.op == "get") {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%.0f%% from disk", 100 * e["from_disk_share"].get<double>());
      note = buf;
    }
    char line[320];
    std::snprintf(
        line, sizeof(line), "%-12s %-10llu %-8s %12.0f %22.1f %9.1f %13.1f %14.1f %8s %14.1f  %s\n",
        e["curve"].get<std::string>().c_str(),
        static_cast<unsigned long long>(e[x_name].get<uint64_t>()), f.op.c_str(), f.ops_per_s,
        f.p50_us, f.p99_us,
        e.contains("daemon_cpu_us_per_op") ? e["daemon_cpu_us_per_op"].get<double>() : 0.0,
        e.contains("serving_cpu_us_per_op") ? e["serving_cpu_us_per_op"].get<double>() : 0.0,
        Mib(e, "daemon_rss_bytes").c_str(),
        e.contains("index_bytes_per_block") ? e["index_bytes_per_block"].get<double>() : 0.0,
        note.c_str());
    out += line;
  }
  return out;
}

}  // namespace kvpool::bench
