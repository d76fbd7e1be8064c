#include "bench/disk_bench.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <kvpool/client.h>

#include "bench/bench_daemon.h"
#include "bench/block_data.h"
#include "common/units.h"
#include "tests/support/process_stats.h"

namespace kvpool::bench {
namespace {

// The host tier: one segment, so that the bulk lives on disk, or room for every reader's call
// twice over (blocks read up from disk land there before they are served; without room a get
// reads them straight from disk, one after another).
uint64_t HostBytes(const DiskBenchConfig& c) {
  constexpr uint64_t kSegment = 64ull << 20;
  const uint64_t calls =
      2ull * static_cast<uint64_t>(c.readers) * c.blocks_per_call * c.block_bytes;
  return std::max(kSegment, (calls + kSegment - 1) / kSegment * kSegment);
}
constexpr size_t kPutBatch = 16;
constexpr size_t kPatternSlots = 16;

void Progress(const std::string& line) {
  std::fprintf(stderr, "[kvpool-bench --disk] %s\n", line.c_str());
}

// Syncs every regular file under `dir` and drops it from the page cache (what fio's `invalidate`
// does to its file), so the next read of it comes from the device. Returns the files dropped.
Result<uint64_t> DropFromPageCache(const std::string& dir) {
  uint64_t files = 0;
  std::error_code ec;
  // Non-throwing steps: RocksDB may remove a file while this walks.
  for (std::filesystem::recursive_directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::filesystem::directory_entry& entry = *it;
    std::error_code type_ec;
    if (!entry.is_regular_file(type_ec)) continue;
    const int fd = ::open(entry.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;  // removed meanwhile
    int err = ::fdatasync(fd) != 0 ? errno : 0;
    if (err == 0) err = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);  // returns its error
    if (err != 0) {
      ::close(fd);
      return Status::FromErrno(err, "dropping " + entry.path().string() + " from the page cache");
    }
    ::close(fd);
    ++files;
  }
  if (ec) return Status::IoError("listing " + dir + ": " + ec.message());
  return files;
}

ClientOptions ReaderOptions(const std::string& socket) {
  ClientOptions o;
  o.address = socket;
  o.namespace_name = "disk-bench";
  o.client_name = "kvpool-bench-disk";
  o.data_path = DataPath::kSharedMemory;
  o.timeout = std::chrono::milliseconds(60000);
  return o;
}

// Puts `blocks`, kPutBatch a call, each the pattern slot it names with its key's stamps.
Status Fill(Client& client, const std::vector<StoredBlock>& blocks, const PatternSet& patterns) {
  const uint64_t size = patterns.block_bytes();
  AlignedBuffer bytes(size * kPutBatch);
  std::vector<PutBlock> batch;
  for (size_t i = 0; i < blocks.size(); i += kPutBatch) {
    batch.clear();
    for (size_t j = i; j < std::min(blocks.size(), i + kPutBatch); ++j) {
      uint8_t* b = bytes.data() + (j - i) * size;
      std::memcpy(b, patterns.slot(blocks[j].slot), size);
      StampBlock(blocks[j].key, b, size);
      PutBlock& p = batch.emplace_back();
      p.key = blocks[j].key;
      p.data = b;
      p.size = size;
    }
    KVPOOL_ASSIGN_OR_RETURN(PutResult r, client.Put(batch));
    for (const Status& st : r.errors) {
      if (!st.ok()) return st.WithContext("put of block " + std::to_string(i));
    }
    if (r.stored != batch.size()) {
      return Status::Internal("a put of fresh blocks stored " + std::to_string(r.stored) + " of " +
                              std::to_string(batch.size()));
    }
  }
  return Status::OK();
}

// Gets its share of the blocks, `per_call` a call, in the order given, each checked byte for
// byte.
class DiskReader : public PhaseWorker {
 public:
  DiskReader(std::string socket, const std::vector<StoredBlock>& blocks, std::vector<size_t> order,
             uint32_t per_call, const PatternSet& patterns)
      : socket_(std::move(socket)),
        blocks_(blocks),
        order_(std::move(order)),
        per_call_(per_call),
        patterns_(patterns) {}

  Status Prepare() override {
    KVPOOL_ASSIGN_OR_RETURN(client_, Client::Connect(ReaderOptions(socket_)));
    buffer_ = AlignedBuffer(patterns_.block_bytes() * per_call_);
    return Status::OK();
  }

  Status Run(PhaseClock& clock) override {
    std::vector<BlockKey> keys;
    std::vector<MutableBuffer> views;
    for (size_t at = 0; at < order_.size(); at += per_call_) {
      if (!clock.Continue()) return Status::OK();
      const size_t n = std::min<size_t>(per_call_, order_.size() - at);
      keys.clear();
      views.clear();
      uint64_t bytes = 0;
      for (size_t j = 0; j < n; ++j) {
        const StoredBlock& b = blocks_[order_[at + j]];
        keys.push_back(b.key);
        views.push_back({buffer_.data() + j * patterns_.block_bytes(), patterns_.block_bytes()});
        bytes += b.size;
      }
      const auto t0 = Clock::now();
      KVPOOL_ASSIGN_OR_RETURN(std::vector<GetResult> r, client_->Get(keys, views));
      clock.Record(Clock::now() - t0, bytes);
      for (size_t j = 0; j < n; ++j) {
        const StoredBlock& b = blocks_[order_[at + j]];
        if (!r[j].status.ok()) return r[j].status.WithContext("get of " + b.key.ShortHex());
        KVPOOL_RETURN_IF_ERROR(VerifyBlock(b.key, static_cast<const uint8_t*>(views[j].data),
                                           r[j].size, patterns_.slot(b.slot), b.size));
        if (r[j].tier == Tier::kDisk) ++from_disk_;
        ++read_;
      }
    }
    clock.OutOfData();
    return Status::OK();
  }

  uint64_t from_disk() const { return from_disk_; }
  uint64_t read() const { return read_; }

 private:
  const std::string socket_;
  const std::vector<StoredBlock>& blocks_;
  const std::vector<size_t> order_;
  const uint32_t per_call_;
  const PatternSet& patterns_;
  std::unique_ptr<Client> client_;
  AlignedBuffer buffer_;
  uint64_t from_disk_ = 0;
  uint64_t read_ = 0;
};

// Writes `bytes` of pattern to `path` and syncs it: the file fio reads.
Status WriteFioFile(const std::string& path, uint64_t bytes, const PatternSet& patterns) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::FromErrno(errno, "creating " + path);
  const uint64_t chunk = patterns.block_bytes();
  Status st = Status::OK();
  for (uint64_t off = 0, i = 0; off < bytes && st.ok(); off += chunk, ++i) {
    const uint64_t n = std::min(chunk, bytes - off);
    if (::pwrite(fd, patterns.slot(i), n, static_cast<off_t>(off)) != static_cast<ssize_t>(n)) {
      st = Status::FromErrno(errno, "writing " + path);
    }
  }
  if (st.ok() && ::fdatasync(fd) != 0) st = Status::FromErrno(errno, "syncing " + path);
  ::close(fd);
  return st;
}

// One fio randread run over `path` (see disk_bench.h); its figure, or why it failed.
Result<Figure> RunFio(const std::string& fio, const std::string& path, const DiskBenchConfig& c,
                      bool direct) {
  const uint64_t part =
      c.working_set / static_cast<uint64_t>(c.readers) / c.block_bytes * c.block_bytes;
  const std::string json_path = path + (direct ? ".direct.json" : ".buffered.json");
  std::string command =
      fio + " --name=kvpool-disk-peer --filename=" + path +
      " --rw=randread --bs=" + std::to_string(c.block_bytes) + " --size=" + std::to_string(part) +
      " --offset_increment=" + std::to_string(part) + " --numjobs=" + std::to_string(c.readers) +
      " --ioengine=psync --iodepth=1 --invalidate=1 --randrepeat=0" +
      " --direct=" + (direct ? "1" : "0") +
      " --group_reporting --output-format=json --output=" + json_path;
  if (c.pin.enabled) {
    command += " --cpus_allowed=" + CpuList(c.pin.bench_cpus) + " --cpus_allowed_policy=shared";
  }
  const auto [out, rc] = CaptureCommand(command);
  if (rc != 0) {
    return Status::Internal("fio failed (status " + std::to_string(rc) +
                            "): " + out.substr(0, 800));
  }
  std::ifstream in(json_path);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.contains("jobs") || j["jobs"].empty()) {
    return Status::Internal("cannot read fio's JSON in " + json_path);
  }
  const nlohmann::json& read = j["jobs"][0]["read"];
  const double runtime_s = read.value("runtime", 0.0) / 1e3;  // ms, the group's longest job
  Figure f;
  f.system = "fio";
  f.path = direct ? "direct" : "buffered";
  f.op = "randread";
  f.block_bytes = c.block_bytes;
  f.concurrency = c.readers;
  f.gbps = read.value("bw_bytes", 0.0) / 1e9;
  f.ops_per_s = read.value("iops", 0.0);
  const nlohmann::json& pct = read["clat_ns"]["percentile"];
  f.p50_us = pct.value("50.000000", 0.0) / 1e3;
  f.p99_us = pct.value("99.000000", 0.0) / 1e3;
  f.extra["calls"] = read.value("total_ios", 0);
  f.extra["seconds"] = runtime_s;
  f.extra["command"] = command;
  if (f.gbps <= 0) return Status::Internal("fio reported no bandwidth: " + json_path);
  return f;
}

}  // namespace

Status RunDiskBench(const DiskBenchConfig& c, const std::function<void(Figure)>& emit) {
  if (c.readers < 1) return Status::InvalidArgument("--disk needs at least one reader");
  const uint64_t count = c.working_set / c.block_bytes;
  if (count < static_cast<uint64_t>(c.readers)) {
    return Status::InvalidArgument("the working set holds fewer blocks than there are readers");
  }
  const uint64_t host_bytes = HostBytes(c);
  const uint64_t host_blocks = (host_bytes + c.block_bytes - 1) / c.block_bytes;
  const uint64_t disk_bytes = (count + 2 * host_blocks) * c.block_bytes * 2;
  DaemonProcessOptions o = BenchDaemonOptions(
      c.kvpoold, host_bytes,
      {"--write_policy=write-through", "--lock_memory=false",
       "--disk_capacity=" + std::to_string(std::max<uint64_t>(disk_bytes, 1ull << 30) >> 20) +
           "MiB",
       "--promotion_threads=" + std::to_string(c.readers)});
  o.cpus = c.pin.daemon_cpus;
  o.dir_prefix = "kvpool-bench-disk";
  KVPOOL_ASSIGN_OR_RETURN(std::unique_ptr<DaemonProcess> daemon,
                          DaemonProcess::Launch(std::move(o)));

  // The measured blocks, then twice the host tier's worth more, so every measured one has left
  // host and lives on disk alone (write-through: nothing is lost by eviction from host).
  const PatternSet patterns(c.block_bytes, kPatternSlots, 0x5eed);
  const std::string secret = RandomSecret();
  std::vector<StoredBlock> blocks;
  for (const BlockKey& k : MakeKeys(secret, "disk", count)) {
    blocks.push_back({k, static_cast<uint32_t>(blocks.size() % kPatternSlots),
                      static_cast<uint32_t>(c.block_bytes)});
  }
  std::vector<StoredBlock> pushers;
  for (const BlockKey& k : MakeKeys(secret, "push", 2 * host_blocks)) {
    pushers.push_back({k, static_cast<uint32_t>(pushers.size() % kPatternSlots),
                       static_cast<uint32_t>(c.block_bytes)});
  }
  {
    Progress("filling " + FormatBytes(count * c.block_bytes) + " in " + std::to_string(count) +
             " blocks");
    KVPOOL_ASSIGN_OR_RETURN(std::unique_ptr<Client> writer,
                            Client::Connect(ReaderOptions(daemon->socket_path())));
    KVPOOL_RETURN_IF_ERROR(Fill(*writer, blocks, patterns));
    KVPOOL_RETURN_IF_ERROR(Fill(*writer, pushers, patterns));
  }
  const double settle_s = testing::WaitUntilQuiet(daemon->pid(), std::chrono::seconds(300));
  KVPOOL_ASSIGN_OR_RETURN(const uint64_t dropped, DropFromPageCache(daemon->data_dir()));

  std::vector<size_t> order(count);
  for (size_t i = 0; i < count; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937_64(std::random_device{}()));
  std::vector<std::unique_ptr<PhaseWorker>> workers;
  std::vector<DiskReader*> readers;
  for (int r = 0; r < c.readers; ++r) {
    std::vector<size_t> share;
    for (size_t i = static_cast<size_t>(r); i < count; i += static_cast<size_t>(c.readers)) {
      share.push_back(order[i]);
    }
    auto w = std::make_unique<DiskReader>(daemon->socket_path(), blocks, std::move(share),
                                          c.blocks_per_call, patterns);
    readers.push_back(w.get());
    workers.push_back(std::move(w));
  }
  Progress("reading them back, " + std::to_string(c.readers) + " readers, " +
           std::to_string(c.blocks_per_call) + " blocks a call");
  const testing::ProcessSample before = testing::SampleProcess(daemon->pid());
  KVPOOL_ASSIGN_OR_RETURN(PhaseStats stats, RunPhase(workers, c.pin.bench_cpus, PhaseLimits{0, 0}));
  const testing::ProcessSample after = testing::SampleProcess(daemon->pid());
  uint64_t from_disk = 0;
  uint64_t read = 0;
  for (const DiskReader* r : readers) {
    from_disk += r->from_disk();
    read += r->read();
  }
  Figure get;
  get.system = "kvpool";
  get.path = "disk";
  get.op = "get";
  get.block_bytes = c.block_bytes;
  get.concurrency = c.readers;
  get.SetFrom(stats);
  get.extra["blocks"] = read;
  get.extra["blocks_from_disk"] = from_disk;
  get.extra["files_dropped_from_page_cache"] = dropped;
  get.extra["settle_seconds"] = settle_s;
  get.extra["daemon_cpu_us_per_block"] =
      read > 0 ? (after.cpu_seconds - before.cpu_seconds) * 1e6 / static_cast<double>(read) : 0.0;
  get.extra["promotion_threads"] = c.readers;
  get.extra["blocks_per_call"] = c.blocks_per_call;

  // fio on the same file system, beside the daemon's data directory.
  const std::string fio = FindOnPath("fio");
  std::vector<Figure> peers;
  if (fio.empty()) {
    Progress("fio is not on PATH (Debian: fio): no peer for the disk get");
  } else {
    const std::string path =
        (std::filesystem::path(daemon->data_dir()).parent_path() / "fio-peer.dat").string();
    KVPOOL_RETURN_IF_ERROR(WriteFioFile(path, count * c.block_bytes, patterns));
    for (bool direct : {false, true}) {
      Progress(std::string("fio randread, ") + (direct ? "O_DIRECT" : "buffered"));
      Result<Figure> f = RunFio(fio, path, c, direct);
      if (!f.ok()) {
        Progress("fio " + std::string(direct ? "direct" : "buffered") +
                 " skipped: " + f.status().ToString());
        continue;
      }
      peers.push_back(std::move(*f));
    }
    std::filesystem::remove(path);
  }
  double best = 0;
  for (const Figure& f : peers) best = std::max(best, f.gbps);
  if (best > 0) get.extra["ratio_to_fio"] = get.gbps / best;
  emit(std::move(get));
  for (Figure& f : peers) emit(std::move(f));
  return daemon->Stop(std::chrono::seconds(120));
}

}  // namespace kvpool::bench
