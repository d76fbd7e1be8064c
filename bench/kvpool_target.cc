#include "bench/kvpool_target.h"

#include <chrono>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace kvpool::bench {
namespace {

ClientOptions Options(const std::string& address, const std::string& ns, int thread_index,
                      DataPath path, std::chrono::microseconds busy_poll) {
  ClientOptions o;
  o.busy_poll = busy_poll;
  o.data_path = path;
  o.address = address;
  o.namespace_name = ns;
  o.client_name = "kvpool-bench-" + std::to_string(thread_index);
  // A 64 MiB batch through a loaded 2-core machine can take seconds; a hang must still end.
  o.timeout = std::chrono::milliseconds(60000);
  if (path == DataPath::kUcx) {
    // Loopback TCP only (docs/BENCHMARKS.md): the daemon listens on 127.0.0.1 with the same.
    o.ucx_transports = "tcp";
    o.ucx_net_devices = "lo";
  }
  return o;
}

}  // namespace

class KvpoolTarget : public BenchTarget {
 public:
  KvpoolTarget(KvpoolSystem& system, int thread_index, std::unique_ptr<Client> client)
      : system_(system), thread_index_(thread_index), client_(std::move(client)) {}
  ~KvpoolTarget() override {
    (void)borrowed_.Release();
    system_.Keep(thread_index_, std::move(client_));
  }

  // BenchTarget
  Status Put(std::span<const BenchBlock> blocks) override {
    puts_.resize(blocks.size());
    for (size_t i = 0; i < blocks.size(); ++i) {
      puts_[i].key = blocks[i].key;
      puts_[i].data = blocks[i].data;
      puts_[i].size = blocks[i].size;
      puts_[i].parent = blocks[i].parent;
    }
    KVPOOL_ASSIGN_OR_RETURN(PutResult r, client_->Put(puts_));
    for (size_t i = 0; i < r.errors.size(); ++i) {
      if (!r.errors[i].ok()) {
        return r.errors[i].WithContext("put of block " + blocks[i].key.ShortHex());
      }
    }
    if (r.already_present != 0 || r.stored != blocks.size()) {
      return Status::Internal("put of " + std::to_string(blocks.size()) + " fresh blocks stored " +
                              std::to_string(r.stored) + " and found " +
                              std::to_string(r.already_present) + " already present");
    }
    return Status::OK();
  }

  Status Get(std::span<const BlockKey> keys, std::span<const MutableBuffer> buffers,
             std::span<size_t> sizes) override {
    KVPOOL_ASSIGN_OR_RETURN(std::vector<GetResult> r, client_->Get(keys, buffers));
    if (r.size() != keys.size()) return Status::Internal("Get answered the wrong number of blocks");
    for (size_t i = 0; i < r.size(); ++i) {
      if (!r[i].status.ok()) return r[i].status.WithContext("get of " + keys[i].ShortHex());
      sizes[i] = r[i].size;
      if (r[i].tier != Tier::kHost) ++slow_hits_;
    }
    return Status::OK();
  }

  Result<uint32_t> Lookup(std::span<const BlockKey> chain) override {
    KVPOOL_ASSIGN_OR_RETURN(LookupResult r, client_->Lookup(chain));
    return r.hit_blocks;
  }

  Status Borrow(std::span<const BlockKey> keys, bool verify,
                std::span<std::span<const uint8_t>> views) override {
    KVPOOL_ASSIGN_OR_RETURN(borrowed_, client_->Borrow(keys, {.verify = verify}));
    for (size_t i = 0; i < keys.size(); ++i) {
      const BlockView& v = borrowed_[i];
      if (!v.status.ok()) return v.status.WithContext("borrow of " + keys[i].ShortHex());
      if (v.tier != Tier::kHost) ++slow_hits_;
      views[i] = {static_cast<const uint8_t*>(v.data), v.size};
    }
    return Status::OK();
  }

  Status ReleaseBorrowed() override { return borrowed_.Release(); }
  // RELEASE is one-way, and kvpoold handles a connection's messages in order: a round trip on
  // this connection after it returns once the leases have ended.
  Status Settle() override { return client_->Stats().status(); }

  uint64_t slow_tier_hits() const override { return slow_hits_; }

 private:
  KvpoolSystem& system_;
  const int thread_index_;
  std::unique_ptr<Client> client_;
  BorrowedBlocks borrowed_;     // the last Borrow's, until ReleaseBorrowed
  std::vector<PutBlock> puts_;  // reused so a put allocates nothing per call
  uint64_t slow_hits_ = 0;
};

KvpoolSystem::KvpoolSystem(std::string address, std::string namespace_name, DataPath data_path,
                           std::chrono::microseconds busy_poll, bool fresh_connections)
    : address_(std::move(address)),
      namespace_name_(std::move(namespace_name)),
      data_path_(data_path),
      busy_poll_(busy_poll),
      fresh_connections_(fresh_connections) {}

KvpoolSystem::~KvpoolSystem() = default;

void KvpoolSystem::Keep(int thread_index, std::unique_ptr<Client> client) {
  if (fresh_connections_ || client == nullptr) return;
  std::lock_guard<std::mutex> lock(idle_mu_);
  idle_[thread_index] = std::move(client);
}

Result<DataPath> KvpoolSystem::ParsePath(const std::string& name) {
  if (name == "socket") return DataPath::kSocket;
  if (name == "shm") return DataPath::kSharedMemory;
  if (name == "ucx") return DataPath::kUcx;
  return Status::InvalidArgument("unknown kvpool path '" + name + "' (socket, shm or ucx)");
}

std::string KvpoolSystem::path() const {
  switch (data_path_) {
    case DataPath::kSharedMemory:
      return "shm";
    case DataPath::kUcx:
      return "ucx";
    default:
      return "socket";
  }
}

Result<std::unique_ptr<BenchTarget>> KvpoolSystem::NewTarget(int thread_index) {
  {
    std::lock_guard<std::mutex> lock(idle_mu_);
    auto kept = idle_.find(thread_index);
    if (kept != idle_.end()) {
      std::unique_ptr<Client> c = std::move(kept->second);
      idle_.erase(kept);
      return std::unique_ptr<BenchTarget>(new KvpoolTarget(*this, thread_index, std::move(c)));
    }
  }
  KVPOOL_ASSIGN_OR_RETURN(
      std::unique_ptr<Client> c,
      Client::Connect(Options(address_, namespace_name_, thread_index, data_path_, busy_poll_)));
  const bool shm = c->server().shared_memory;
  const bool ucx = c->server().ucx;
  if (shm != (data_path_ == DataPath::kSharedMemory)) {
    return Status::FailedPrecondition("asked for the " + path() + " path but the connection " +
                                      (shm ? "uses" : "does not use") + " shared memory");
  }
  if (ucx != (data_path_ == DataPath::kUcx)) {
    return Status::FailedPrecondition("asked for the " + path() + " path but the connection " +
                                      (ucx ? "uses" : "does not use") + " UCX");
  }
  return std::unique_ptr<BenchTarget>(new KvpoolTarget(*this, thread_index, std::move(c)));
}

Status KvpoolSystem::EnsureAdmin() {
  if (admin_ != nullptr) return Status::OK();
  // Control only: evictions and statistics move no block bytes.
  KVPOOL_ASSIGN_OR_RETURN(admin_, Client::Connect(Options(address_, namespace_name_, -1,
                                                          DataPath::kSocket, busy_poll_)));
  return Status::OK();
}

Status KvpoolSystem::Drop(std::span<const BlockKey> keys) {
  KVPOOL_RETURN_IF_ERROR(EnsureAdmin());
  // The daemon takes at most max_batch_keys keys per request.
  const size_t step = std::max<uint32_t>(1, admin_->server().max_batch_keys);
  for (size_t start = 0; start < keys.size(); start += step) {
    const size_t n = std::min(step, keys.size() - start);
    // A socket read's leases end once its answer is written, which the client may see before
    // kvpoold's write completion runs: blocks skipped as leased are asked again, for up to 1 s.
    EvictResult r;
    for (int attempt = 0; attempt < 50; ++attempt) {
      if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      KVPOOL_ASSIGN_OR_RETURN(r, admin_->Evict(Tier::kDisk, keys.subspan(start, n)));
      if (r.skipped == 0) break;
    }
    if (r.skipped != 0) {
      return Status::Internal("the daemon skipped " + std::to_string(r.skipped) +
                              " blocks of the bench's eviction for 1 s (leased or with cached "
                              "children)");
    }
  }
  return Status::OK();
}

Result<ArenaStats> KvpoolSystem::Arena() {
  KVPOOL_RETURN_IF_ERROR(EnsureAdmin());
  KVPOOL_ASSIGN_OR_RETURN(DaemonStats s, admin_->Stats());
  ArenaStats a;
  for (const TierStats& t : s.tiers) {
    if (t.name != "host") continue;
    a.known = true;
    a.capacity_bytes = t.capacity_bytes;
    a.used_bytes = t.used_bytes;
    a.allocated_bytes = t.allocated_bytes;
    a.blocks = t.blocks;
    a.fragmentation = t.fragmentation;
    a.demotions = t.demotions;
    a.evictions = t.evictions;
  }
  return a;
}

}  // namespace kvpool::bench
