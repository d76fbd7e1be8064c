#include "client.h"

#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <kvpool/client.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "buffers.h"
#include "errors.h"
#include "kernels/block_layout.h"
#include "keys.h"
#include "transport/address.h"

namespace kvpool::py {
namespace {

nb::object TierOrNone(Tier tier) {
  if (tier == Tier::kNone) return nb::none();
  return nb::str(TierName(tier));
}

struct PyLookupResult {
  uint32_t hit_blocks = 0;
  std::vector<std::string> tiers;
};

struct PyGetResult {
  bool ok = false;
  size_t size = 0;
  Tier tier = Tier::kNone;
  int lossy_encoding = 0;
  std::string code;
  std::string message;
};

struct PyPutResult {
  uint32_t stored = 0;
  uint32_t already_present = 0;
  uint32_t in_progress = 0;
  nb::list errors;
  bool all_ok() const {
    for (nb::handle e : errors) {
      if (!e.is_none()) return false;
    }
    return true;
  }
};

struct PySession {
  std::string session_id;
  nb::list keys;
  uint64_t token_count = 0;
  std::map<std::string, std::string> metadata;
  int64_t created_unix_ms = 0;
  int64_t updated_unix_ms = 0;
  uint64_t total_bytes = 0;
  uint32_t cached_blocks = 0;
};

DataPath ParseDataPath(const std::string& s) {
  if (s == "auto") return DataPath::kAuto;
  if (s == "socket") return DataPath::kSocket;
  if (s == "shm") return DataPath::kSharedMemory;
  if (s == "ucx") return DataPath::kUcx;
  RaiseInvalid("data_path must be 'auto', 'socket', 'shm' or 'ucx', not '" + s + "'");
}

std::chrono::milliseconds Millis(double seconds, const char* what) {
  if (!(seconds > 0) || !std::isfinite(seconds)) {
    RaiseInvalid(std::string(what) + " must be a positive number of seconds");
  }
  return std::chrono::milliseconds(std::max<int64_t>(1, std::llround(seconds * 1000)));
}

nb::dict TierStatsDict(const TierStats& t) {
  nb::dict d;
  d["name"] = t.name;
  d["capacity_bytes"] = t.capacity_bytes;
  d["used_bytes"] = t.used_bytes;
  d["blocks"] = t.blocks;
  d["allocated_bytes"] = t.allocated_bytes;
  d["fragmentation"] = t.fragmentation;
  d["hits"] = t.hits;
  d["promotions"] = t.promotions;
  d["demotions"] = t.demotions;
  d["evictions"] = t.evictions;
  d["moves"] = t.moves;
  d["renewals"] = t.renewals;
  d["renewals_from_standby"] = t.renewals_from_standby;
  d["standby_ready"] = t.standby_ready;
  d["peer_hits"] = t.peer_hits;
  return d;
}

// The same fields, names and order as `kvpool stats --json` (client/stats_json.cc).
nb::dict StatsDict(const DaemonStats& s) {
  nb::dict d;
  d["node_id"] = s.node_id;
  d["version"] = s.version;
  d["uptime_s"] = s.uptime_s;
  nb::list tiers;
  for (const TierStats& t : s.tiers) tiers.append(TierStatsDict(t));
  d["tiers"] = tiers;
  d["index_entries"] = s.index_entries;
  d["index_bytes"] = s.index_bytes;
  d["rocksdb_memory_bytes"] = s.rocksdb_memory_bytes;
  d["index_rebuild_blocks"] = s.index_rebuild_blocks;
  d["index_rebuild_seconds"] = s.index_rebuild_seconds;
  d["sessions"] = s.sessions;
  d["connections"] = s.connections;
  d["lookups"] = s.lookups;
  d["lookup_blocks"] = s.lookup_blocks;
  d["lookup_hit_blocks"] = s.lookup_hit_blocks;
  d["gets"] = s.gets;
  d["get_blocks_served"] = s.get_blocks_served;
  d["get_misses"] = s.get_misses;
  d["puts_offered"] = s.puts_offered;
  d["puts_deduplicated"] = s.puts_deduplicated;
  d["puts_committed"] = s.puts_committed;
  d["bytes_in"] = s.bytes_in;
  d["bytes_out"] = s.bytes_out;
  d["prefetches_issued"] = s.prefetches_issued;
  d["prefetches_useful"] = s.prefetches_useful;
  d["checksum_failures"] = s.checksum_failures;
  d["leases_active"] = s.leases_active;
  d["reservations_active"] = s.reservations_active;
  d["dedup_ratio"] = s.dedup_ratio;
  d["namespace_only"] = s.namespace_only;
  d["cluster_state"] = s.cluster_state;
  d["cluster_members"] = s.cluster_members;
  d["cluster_reason"] = s.cluster_reason;
  return d;
}

// Where a buffer's memory is, for the client.
Memory MemoryOf(const Buffer& b) {
  return b.device() == Buffer::Device::kCuda ? Memory::kCuda : Memory::kHost;
}

// The cudaStream_t for copies into or out of `buffers`: `stream` as given (an int, or an object
// with a `cuda_stream` attribute such as torch.cuda.Stream); None: torch's current stream of
// the first CUDA buffer's device when torch is loaded, else the legacy default stream.
void* CudaStream(nb::handle stream, const std::vector<Buffer>& buffers) {
  if (!stream.is_none()) {
    if (nb::hasattr(stream, "cuda_stream")) stream = stream.attr("cuda_stream");
    return reinterpret_cast<void*>(nb::cast<uintptr_t>(stream));
  }
  for (const Buffer& b : buffers) {
    if (b.device() != Buffer::Device::kCuda) continue;
    nb::module_ sys = nb::module_::import_("sys");
    if (!nb::cast<bool>(sys.attr("modules").attr("__contains__")("torch"))) return nullptr;
    nb::object current =
        nb::module_::import_("torch").attr("cuda").attr("current_stream")(b.device_id());
    return reinterpret_cast<void*>(nb::cast<uintptr_t>(current.attr("cuda_stream")));
  }
  return nullptr;
}

class PyClient {
 public:
  PyClient(std::optional<std::string> address, const std::string& ns, double timeout,
           std::optional<double> connect_timeout, const std::string& data_path,
           const std::string& client_name, std::optional<std::string> cluster_secret,
           bool auto_reconnect, std::optional<std::string> credential, bool admin,
           std::optional<std::string> tls_ca, std::optional<std::string> tls_cert,
           std::optional<std::string> tls_key, int busy_poll_us) {
    options_.address = address.value_or("");
    options_.namespace_name = ns;
    options_.timeout = Millis(timeout, "timeout");
    if (connect_timeout) options_.connect_timeout = Millis(*connect_timeout, "connect_timeout");
    options_.data_path = ParseDataPath(data_path);
    options_.client_name = client_name;
    options_.cluster_secret = cluster_secret.value_or("");
    options_.auto_reconnect = auto_reconnect;
    options_.credential = credential.value_or("");
    options_.admin = admin;
    options_.tls_ca_file = tls_ca.value_or("");
    options_.tls_cert_file = tls_cert.value_or("");
    options_.tls_key_file = tls_key.value_or("");
    if (busy_poll_us < 0) Raise(Status::InvalidArgument("busy_poll_us must be >= 0"));
    options_.busy_poll = std::chrono::microseconds(busy_poll_us);
    Connect();
  }

  void Connect() {
    Result<std::unique_ptr<Client>> c = Status::Internal("unset");
    {
      nb::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mu_);
      client_.reset();
      c = Client::Connect(options_);
      if (c.ok()) client_ = std::move(c).value();
    }
    if (!c.ok()) {
      const std::string where =
          options_.address.empty() ? transport::DefaultSocketPath() : options_.address;
      Raise(c.status().WithContext("cannot reach kvpoold at " + where));
    }
  }

  // Runs fn(client) with the GIL released and this Client's mutex held.
  template <typename Fn>
  auto Call(Fn&& fn) {
    using R = decltype(fn(std::declval<Client&>()));
    std::optional<R> r;
    bool closed = false;
    {
      nb::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(mu_);
      if (client_) {
        r.emplace(fn(*client_));
      } else {
        closed = true;
      }
    }
    if (closed) Raise(Status::FailedPrecondition("the client is closed"));
    return std::move(*r);
  }

  // Runs fn() with the GIL released and this Client's mutex held, open or closed.
  template <typename Fn>
  auto Locked(Fn&& fn) {
    nb::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(mu_);
    return fn();
  }

  nb::dict Server() {
    // Copied under the lock without the GIL; the dict is built after (building it may run the
    // garbage collector, whose finalizers, e.g. a Borrowed's, take this lock too).
    std::optional<ServerInfo> info;
    ClientOptions options;
    Locked([&] {
      if (client_) {
        info = client_->server();
        options = client_->options();
      }
      return 0;
    });
    if (!info) Raise(Status::FailedPrecondition("the client is closed"));
    const ServerInfo& s = *info;
    nb::dict d;
    d["node_id"] = s.node_id;
    d["daemon_version"] = s.daemon_version;
    d["max_block_bytes"] = s.max_block_bytes;
    d["max_payload_bytes"] = s.max_payload_bytes;
    d["max_batch_keys"] = s.max_batch_keys;
    d["shared_memory"] = s.shared_memory;
    d["ucx"] = s.ucx;
    d["ucx_refused"] = s.ucx_refused;  // why not, where UCX was asked for
    d["admin"] = s.admin;
    d["address"] = options.address;
    d["namespace"] = options.namespace_name;
    return d;
  }

  PyLookupResult Lookup(nb::handle keys_obj, bool prefetch) {
    std::vector<BlockKey> keys = ToKeys(keys_obj, "keys");
    LookupResult r = Unwrap(Call([&](Client& c) { return c.Lookup(keys, prefetch); }));
    PyLookupResult out;
    out.hit_blocks = r.hit_blocks;
    for (Tier t : r.tiers) out.tiers.push_back(TierName(t));
    return out;
  }

  // get_into's arguments as the client takes them; `buffers` keeps the exporters' views.
  struct GetArgs {
    std::vector<BlockKey> keys;
    std::vector<Buffer> buffers;
    std::vector<MutableBuffer> mb;
    GetOptions options;
  };
  static GetArgs ParseGet(nb::handle keys_obj, nb::handle buffers_obj, nb::handle stream_obj) {
    GetArgs a;
    a.keys = ToKeys(keys_obj, "keys");
    a.buffers = AcquireAll(buffers_obj, /*writable=*/true, /*allow_cuda=*/true, "buffers");
    if (a.buffers.size() != a.keys.size()) {
      RaiseInvalid("get_into: " + std::to_string(a.keys.size()) + " keys but " +
                   std::to_string(a.buffers.size()) + " buffers");
    }
    a.mb.resize(a.buffers.size());
    for (size_t i = 0; i < a.buffers.size(); ++i) {
      a.mb[i] = {a.buffers[i].data(), a.buffers[i].nbytes(), MemoryOf(a.buffers[i])};
    }
    a.options.cuda_stream = CudaStream(stream_obj, a.buffers);
    return a;
  }

  static std::vector<PyGetResult> ToPy(const std::vector<GetResult>& r) {
    std::vector<PyGetResult> out(r.size());
    for (size_t i = 0; i < r.size(); ++i) {
      out[i].ok = r[i].status.ok();
      out[i].size = r[i].status.ok() ? r[i].size : 0;
      out[i].tier = r[i].tier;
      out[i].lossy_encoding = r[i].lossy_encoding;
      out[i].code = StatusCodeName(r[i].status.code());
      out[i].message = r[i].status.message();
    }
    return out;
  }

  std::vector<PyGetResult> GetInto(nb::handle keys_obj, nb::handle buffers_obj,
                                   nb::handle stream_obj) {
    GetArgs a = ParseGet(keys_obj, buffers_obj, stream_obj);
    return ToPy(Unwrap(Call([&](Client& c) { return c.Get(a.keys, a.mb, a.options); })));
  }

  nb::list Get(nb::handle keys_obj) {
    std::vector<BlockKey> keys = ToKeys(keys_obj, "keys");
    std::vector<FetchedBlock> r = Unwrap(Call([&](Client& c) { return c.GetBlocks(keys); }));
    nb::list out;
    for (const FetchedBlock& b : r) {
      if (b.status.ok()) {
        out.append(nb::bytes(b.bytes.data(), b.bytes.size()));
      } else {
        out.append(nb::none());
      }
    }
    return out;
  }

  PyPutResult Put(nb::handle keys_obj, nb::handle blocks_obj, nb::handle parent_obj,
                  nb::handle stream_obj, std::optional<int> gpu_device) {
    std::vector<BlockKey> keys = ToKeys(keys_obj, "keys");
    const BlockKey parent = ToParent(parent_obj);
    std::vector<Buffer> blocks =
        AcquireAll(blocks_obj, /*writable=*/false, /*allow_cuda=*/true, "blocks");
    if (blocks.size() != keys.size()) {
      RaiseInvalid("put: " + std::to_string(keys.size()) + " keys but " +
                   std::to_string(blocks.size()) + " blocks");
    }
    std::vector<PutBlock> puts(blocks.size());
    for (size_t i = 0; i < blocks.size(); ++i) {
      puts[i].key = keys[i];
      puts[i].data = blocks[i].data();
      puts[i].size = blocks[i].nbytes();
      puts[i].parent = i == 0 ? parent : keys[i - 1];
      puts[i].memory = MemoryOf(blocks[i]);
    }
    PutOptions options;
    options.cuda_stream = CudaStream(stream_obj, blocks);
    options.gpu_device = gpu_device.value_or(-1);
    PutResult r = Unwrap(Call([&](Client& c) { return c.Put(puts, options); }));
    PyPutResult out;
    out.stored = r.stored;
    out.already_present = r.already_present;
    out.in_progress = r.in_progress;
    for (const Status& st : r.errors) {
      if (st.ok()) {
        out.errors.append(nb::none());
      } else {
        out.errors.append(ErrorObject(st));
      }
    }
    return out;
  }

  std::optional<int> GpuTier(int device) {
    Result<int> r = Call([&](Client& c) { return c.GpuTierOf(device); });
    if (!r.ok() && r.status().code() == StatusCode::kInvalidArgument) return std::nullopt;
    return Unwrap(std::move(r));
  }

  uint32_t Prefetch(nb::handle keys_obj, std::optional<int> gpu_device) {
    std::vector<BlockKey> keys = ToKeys(keys_obj, "keys");
    PrefetchOptions options;
    if (gpu_device) options.gpu_device = *gpu_device;
    PrefetchResult r = Unwrap(Call([&](Client& c) { return c.Prefetch(keys, options); }));
    return gpu_device ? r.gpu_placed : r.scheduled;
  }

  void SaveSession(const std::string& id, nb::handle keys_obj, uint64_t token_count,
                   std::optional<std::map<std::string, std::string>> metadata) {
    Session s;
    s.session_id = id;
    s.keys = ToKeys(keys_obj, "keys");
    s.token_count = token_count;
    if (metadata) s.metadata = *metadata;
    Check(Call([&](Client& c) { return c.SaveSession(s); }));
  }

  PySession LoadSession(const std::string& id, bool prefetch, std::optional<int> gpu_device) {
    const LoadSessionOptions options{.prefetch = prefetch, .gpu_device = gpu_device.value_or(-1)};
    LoadedSession l = Unwrap(Call([&](Client& c) { return c.LoadSession(id, options); }));
    PySession out;
    out.session_id = l.session.session_id;
    for (const BlockKey& k : l.session.keys) out.keys.append(KeyBytes(k));
    out.token_count = l.session.token_count;
    out.metadata = l.session.metadata;
    out.created_unix_ms = l.session.created_unix_ms;
    out.updated_unix_ms = l.session.updated_unix_ms;
    out.total_bytes = l.session.total_bytes;
    out.cached_blocks = l.cached_blocks;
    return out;
  }

  void DeleteSession(const std::string& id) {
    Check(Call([&](Client& c) { return c.DeleteSession(id); }));
  }

  std::vector<SessionSummary> ListSessions(const std::string& prefix, uint32_t limit) {
    return Unwrap(Call([&](Client& c) { return c.ListSessions(prefix, limit); }));
  }

  nb::dict Stats() {
    return StatsDict(Unwrap(Call([](Client& c) { return c.Stats(); })));
  }

  nb::dict Cluster() {
    ClusterView v = Unwrap(Call([](Client& c) { return c.Cluster(); }));
    nb::dict d;
    d["state"] = v.state;
    d["reason"] = v.reason;
    nb::list members;
    for (const ClusterMember& m : v.members) {
      nb::dict md;
      md["node_id"] = m.node_id;
      md["control_address"] = m.control_address;
      md["state"] = m.state;
      md["capacity_bytes"] = m.capacity_bytes;
      md["used_bytes"] = m.used_bytes;
      md["self"] = m.self;
      md["started_unix_ms"] = m.started_unix_ms;
      members.append(md);
    }
    d["members"] = members;
    return d;
  }

  nb::list Locate(nb::handle keys_obj) {
    std::vector<BlockKey> keys = ToKeys(keys_obj, "keys");
    std::vector<NodeLocation> nodes = Unwrap(Call([&](Client& c) { return c.Locate(keys); }));
    nb::list out;
    for (const NodeLocation& n : nodes) {
      nb::dict d;
      d["node_id"] = n.node_id;
      d["control_address"] = n.control_address;
      d["self"] = n.self;
      d["error"] = n.status.ok() ? nb::none() : ErrorObject(n.status);
      d["hit_blocks"] = n.hit_blocks;
      nb::list tiers;
      for (Tier t : n.tiers) tiers.append(TierName(t));
      d["tiers"] = tiers;
      out.append(d);
    }
    return out;
  }

  nb::dict Evict(const std::string& tier_name, nb::handle keys_obj) {
    Tier tier;
    if (tier_name == "gpu") {
      tier = Tier::kGpu;
    } else if (tier_name == "host") {
      tier = Tier::kHost;
    } else if (tier_name == "disk") {
      tier = Tier::kDisk;
    } else {
      RaiseInvalid("evict: tier must be 'gpu', 'host' or 'disk', not '" + tier_name + "'");
    }
    std::vector<BlockKey> keys;
    if (!keys_obj.is_none()) keys = ToKeys(keys_obj, "keys");
    EvictResult r = Unwrap(Call([&](Client& c) { return c.Evict(tier, keys); }));
    nb::dict d;
    d["evicted"] = r.evicted;
    d["skipped"] = r.skipped;
    return d;
  }

  void Reconnect() {
    bool have = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      have = client_ != nullptr;
    }
    if (!have) {
      Connect();
      return;
    }
    Check(Call([](Client& c) { return c.Reconnect(); }));
  }

  void Close() {
    nb::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(mu_);
    client_.reset();
  }

  bool closed() {
    std::lock_guard<std::mutex> lock(mu_);
    return client_ == nullptr;
  }

  const ClientOptions& options() const { return options_; }

 private:
  ClientOptions options_;
  std::mutex mu_;
  std::unique_ptr<Client> client_;  // GUARDED_BY(mu_); null once closed
};

std::string Quote(const std::string& s) { return "'" + s + "'"; }

// Client.get_into_async's result: the queued copies, the buffers they write (kept exported
// until waited for) and the results. Waiting takes the owning Client's lock (the leases end over
// its connection).
class PyPendingGet {
 public:
  PyPendingGet(nb::object client, PendingGet pending, std::vector<Buffer> buffers)
      : client_(std::move(client)), pending_(std::move(pending)), buffers_(std::move(buffers)) {}
  ~PyPendingGet() {
    if (!waited_) Finish().status().IgnoreError();  // the copies must end before the buffers go
  }

  std::vector<PyGetResult> Wait() {
    if (waited_) Raise(Status::FailedPrecondition("wait() was called already"));
    return PyClient::ToPy(Unwrap(Finish()));
  }
  bool pending() const { return !waited_ && pending_.pending(); }

 private:
  Result<std::vector<GetResult>> Finish() {
    waited_ = true;
    PyClient& c = nb::cast<PyClient&>(client_);
    return c.Locked([&] { return pending_.Wait(); });
  }

  nb::object client_;
  PendingGet pending_;
  std::vector<Buffer> buffers_;
  bool waited_ = false;
};

nb::object GetIntoAsync(nb::handle client, nb::handle keys_obj, nb::handle buffers_obj,
                        nb::handle stream_obj) {
  PyClient& c = nb::cast<PyClient&>(client);
  PyClient::GetArgs a = PyClient::ParseGet(keys_obj, buffers_obj, stream_obj);
  PendingGet pending =
      Unwrap(c.Call([&](Client& cl) { return cl.GetAsync(a.keys, a.mb, a.options); }));
  return nb::cast(new PyPendingGet(nb::borrow(client), std::move(pending), std::move(a.buffers)),
                  nb::rv_policy::take_ownership);
}

// Client.borrow's result: the views and the leases behind them. Releasing takes the owning
// Client's lock (it talks over that connection); the memory stays valid while this object (or
// an array made from one of its views) lives.
class PyBorrowed {
 public:
  PyBorrowed(nb::object client, BorrowedBlocks blocks)
      : client_(std::move(client)), blocks_(std::move(blocks)) {}
  ~PyBorrowed() {
    PyClient& c = nb::cast<PyClient&>(client_);
    // Destroyed with the GIL held: Locked releases it while waiting for the client's lock.
    c.Locked([&] { return blocks_.Release(); }).IgnoreError();
  }

  size_t size() const { return blocks_.size(); }
  const BlockView& view(size_t i) const {
    if (i >= blocks_.size()) throw nb::index_error();
    return blocks_[i];
  }
  bool released() const { return released_; }

  void Release() {
    PyClient& c = nb::cast<PyClient&>(client_);
    released_ = true;
    Check(c.Locked([&] { return blocks_.Release(); }));
  }

  // With the GIL held: the views' statuses change, and other threads may read them.
  void Verify() { Check(blocks_.Verify()); }

  double LeaseSecondsLeft() const {
    const auto left = blocks_.lease_deadline() - std::chrono::steady_clock::now();
    return std::chrono::duration<double>(left).count();
  }

 private:
  nb::object client_;  // the PyClient, kept alive while blocks are borrowed from it
  BorrowedBlocks blocks_;
  bool released_ = false;
};

// One of a PyBorrowed's views; keeps its PyBorrowed alive.
struct PyBlockView {
  nb::object owner;  // the PyBorrowed
  size_t index = 0;

  const BlockView& view() const { return nb::cast<const PyBorrowed&>(owner).view(index); }
  const BlockView& Ok() const {
    const BlockView& v = view();
    if (!v.status.ok()) Raise(v.status);
    return v;
  }
};

nb::object BorrowResult(nb::handle client, nb::handle keys_obj, std::optional<int> gpu_device,
                        bool verify) {
  PyClient& c = nb::cast<PyClient&>(client);
  std::vector<BlockKey> keys = ToKeys(keys_obj, "keys");
  BorrowOptions options;
  options.gpu_device = gpu_device.value_or(-1);
  options.verify = verify;
  BorrowedBlocks blocks = Unwrap(c.Call([&](Client& cl) { return cl.Borrow(keys, options); }));
  return nb::cast(new PyBorrowed(nb::borrow(client), std::move(blocks)),
                  nb::rv_policy::take_ownership);
}

}  // namespace

void RegisterClient(nb::module_& m) {
  m.def("default_socket_path", &transport::DefaultSocketPath,
        "The socket a Client with no address connects to: $KVPOOL_SOCKET, else the daemon's "
        "default (/run/kvpool/kvpool.sock for root, /tmp/kvpool-<uid>/kvpool.sock otherwise).");

  nb::class_<PyLookupResult>(m, "LookupResult", "Longest cached prefix of a chain.")
      .def_ro("hit_blocks", &PyLookupResult::hit_blocks, "Length of the cached prefix, in blocks.")
      .def_ro("tiers", &PyLookupResult::tiers,
              "Fastest tier of each hit block: 'gpu', 'host', 'disk' or 'remote'.")
      .def("__repr__", [](const PyLookupResult& r) {
        return "LookupResult(hit_blocks=" + std::to_string(r.hit_blocks) + ")";
      });

  nb::class_<PyGetResult>(m, "GetResult", "Outcome of reading one block into a buffer.")
      .def_ro("ok", &PyGetResult::ok)
      .def_ro("size", &PyGetResult::size, "Bytes written (0 unless ok).")
      .def_prop_ro(
          "tier", [](const PyGetResult& r) { return TierOrNone(r.tier); },
          "Where the block was served from, None for a miss.")
      .def_prop_ro(
          "lossy",
          [](const PyGetResult& r) -> nb::object {
            if (r.lossy_encoding == 0) return nb::none();
            return nb::str(kernels::EncodingName(static_cast<kernels::Encoding>(r.lossy_encoding)));
          },
          "None when the bytes are exactly what was put; else the encoding ('int8', 'fp8_e4m3', "
          "'int4_g32', 'int4_g64') the namespace stored the block in on disk, which it was "
          "decoded from: close to, not exactly, what was put.")
      .def_ro("code", &PyGetResult::code,
              "'OK', 'NotFound' (a miss), 'Corruption', 'InvalidArgument' (buffer too small), ...")
      .def_ro("message", &PyGetResult::message)
      .def("__bool__", [](const PyGetResult& r) { return r.ok; })
      .def("__repr__", [](const PyGetResult& r) {
        return r.ok ? "GetResult(ok, size=" + std::to_string(r.size) +
                          ", tier=" + Quote(TierName(r.tier)) + ")"
                    : "GetResult(" + r.code + ": " + r.message + ")";
      });

  nb::class_<PyPutResult>(m, "PutResult", "Outcome of a put.")
      .def_ro("stored", &PyPutResult::stored, "Blocks whose bytes were sent and committed.")
      .def_ro("already_present", &PyPutResult::already_present,
              "Blocks cached already: nothing was sent.")
      .def_ro("in_progress", &PyPutResult::in_progress,
              "Blocks another writer is storing right now: nothing was sent; a get may miss until "
              "it commits.")
      .def_ro("errors", &PyPutResult::errors,
              "One per block: None, or the kvpool.Error saying why it was not stored.")
      .def("all_ok", &PyPutResult::all_ok, "True when no block has an error.")
      .def("__repr__", [](const PyPutResult& r) {
        return "PutResult(stored=" + std::to_string(r.stored) +
               ", already_present=" + std::to_string(r.already_present) +
               ", in_progress=" + std::to_string(r.in_progress) + ")";
      });

  nb::class_<PySession>(m, "Session", "A persisted, named chain: a resumable conversation.")
      .def_ro("session_id", &PySession::session_id)
      .def_ro("keys", &PySession::keys, "The chain's block keys, in order.")
      .def_ro("token_count", &PySession::token_count)
      .def_ro("metadata", &PySession::metadata)
      .def_ro("created_unix_ms", &PySession::created_unix_ms)
      .def_ro("updated_unix_ms", &PySession::updated_unix_ms)
      .def_ro("total_bytes", &PySession::total_bytes)
      .def_ro("cached_blocks", &PySession::cached_blocks, "Chain blocks cached when loaded.")
      .def("__repr__", [](const PySession& s) {
        return "Session(" + Quote(s.session_id) + ", blocks=" + std::to_string(nb::len(s.keys)) +
               ", token_count=" + std::to_string(s.token_count) + ")";
      });

  nb::class_<SessionSummary>(m, "SessionSummary", "One entry of list_sessions.")
      .def_ro("session_id", &SessionSummary::session_id)
      .def_ro("blocks", &SessionSummary::blocks)
      .def_ro("token_count", &SessionSummary::token_count)
      .def_ro("updated_unix_ms", &SessionSummary::updated_unix_ms)
      .def_ro("total_bytes", &SessionSummary::total_bytes)
      .def("__repr__", [](const SessionSummary& s) {
        return "SessionSummary(" + Quote(s.session_id) + ", blocks=" + std::to_string(s.blocks) +
               ")";
      });

  nb::class_<PyPendingGet>(m, "PendingGet",
                           "A get_into_async whose copies may still run on the CUDA stream.")
      .def("wait", &PyPendingGet::Wait,
           "Waits for the copies, checks them, ends the leases; one GetResult per key. Once.")
      .def_prop_ro("pending", &PyPendingGet::pending,
                   "True while copies were left running and wait() was not called.");

  nb::class_<PyBlockView>(m, "BlockView", "One block lent by Client.borrow.")
      .def_prop_ro(
          "ok", [](const PyBlockView& v) { return v.view().status.ok(); }, "True for a hit.")
      .def_prop_ro(
          "code", [](const PyBlockView& v) { return StatusCodeName(v.view().status.code()); },
          "'OK', 'NotFound' (a miss), 'Corruption', ...")
      .def_prop_ro("message", [](const PyBlockView& v) { return v.view().status.message(); })
      .def_prop_ro(
          "size", [](const PyBlockView& v) { return v.view().status.ok() ? v.view().size : 0; },
          "Bytes of the block (0 unless ok).")
      .def_prop_ro(
          "tier", [](const PyBlockView& v) { return TierOrNone(v.view().tier); },
          "Where it was lent from: 'gpu', 'host', 'disk' or 'remote'; None for a miss.")
      .def_prop_ro(
          "device",
          [](const PyBlockView& v) {
            return v.view().memory == Memory::kCuda ? std::string("cuda") : std::string("cpu");
          },
          "'cpu' (host memory) or 'cuda' (the daemon's gpu tier, on the device borrowed for).")
      .def_prop_ro(
          "checksum", [](const PyBlockView& v) { return v.view().checksum; },
          "xxh3-64 of the block as put.")
      .def_prop_ro(
          "device_checksum", [](const PyBlockView& v) { return v.view().device_checksum; },
          "For device views: the gpu copy's device checksum (kvpool's chunked XXH64), what "
          "verify() checks on the GPU; 0 for host views.")
      .def_prop_ro(
          "data_ptr", [](const PyBlockView& v) { return reinterpret_cast<uintptr_t>(v.Ok().data); },
          "The address of the bytes (host or device); raises the block's error unless ok.")
      .def(
          "numpy",
          [](const PyBlockView& v) {
            const BlockView& b = v.Ok();
            if (b.memory != Memory::kHost) {
              RaiseInvalid(
                  "numpy(): this view is in CUDA device memory; use "
                  "__cuda_array_interface__ (torch.as_tensor(view, device='cuda'))");
            }
            const size_t shape[1] = {b.size};
            return nb::ndarray<nb::numpy, const uint8_t, nb::ndim<1>>(const_cast<void*>(b.data), 1,
                                                                      shape, v.owner);
          },
          "A read-only uint8 numpy array over the host bytes, no copy (it keeps the Borrowed's "
          "memory alive; the contents are guaranteed only until release()).")
      .def_prop_ro(
          "__cuda_array_interface__",
          [](const PyBlockView& v) {
            const BlockView& b = v.Ok();
            if (b.memory != Memory::kCuda) {
              throw nb::attribute_error("a host view has no __cuda_array_interface__");
            }
            nb::dict d;
            d["shape"] = nb::make_tuple(b.size);
            d["typestr"] = "|u1";
            // Read-only flag False: torch.as_tensor refuses an array that says it is read-only
            // ("the read only flag is not supported"). The bytes must still not be written: they
            // are the daemon's gpu copy, which other readers on that GPU copy (and check by its
            // device checksum).
            d["data"] = nb::make_tuple(reinterpret_cast<uintptr_t>(b.data), false);
            d["version"] = 3;
            d["strides"] = nb::none();
            d["stream"] = nb::none();  // the copy that placed it finished before it was lent
            return d;
          },
          "For device views: the bytes as a CUDA array (torch.as_tensor, cupy). Do not write them: "
          "they are the daemon's gpu copy, read by every reader on that GPU.")
      .def("__repr__", [](const PyBlockView& v) {
        const BlockView& b = v.view();
        if (!b.status.ok()) {
          return "BlockView(" + std::string(StatusCodeName(b.status.code())) + ")";
        }
        return "BlockView(size=" + std::to_string(b.size) + ", tier=" + Quote(TierName(b.tier)) +
               (b.memory == Memory::kCuda ? ", cuda" : "") + ")";
      });

  nb::class_<PyBorrowed>(m, "Borrowed",
                         "Blocks lent by Client.borrow, one BlockView per key. While the leases "
                         "hold (lease_seconds_left, or until release()) the daemon neither moves "
                         "nor reuses them.")
      .def("__len__", &PyBorrowed::size)
      .def("__getitem__",
           [](nb::handle self, int64_t i) {
             const int64_t n = static_cast<int64_t>(nb::cast<const PyBorrowed&>(self).size());
             if (i < 0) i += n;
             if (i < 0 || i >= n) throw nb::index_error();
             return PyBlockView{nb::borrow(self), static_cast<size_t>(i)};
           })
      .def_prop_ro("released", &PyBorrowed::released)
      .def_prop_ro("lease_seconds_left", &PyBorrowed::LeaseSecondsLeft,
                   "Seconds until the leases end by themselves (negative: they have).")
      .def("verify", &PyBorrowed::Verify,
           "Hashes the views again (host views on the CPU, device views by their device checksum "
           "on their GPU); raises Corruption when one changed (its lease ran out before it was "
           "read).")
      .def("release", &PyBorrowed::Release,
           "Ends the leases now (also done on leaving the with block, and when collected).")
      .def("__enter__", [](nb::handle self) { return self; })
      .def("__exit__", [](PyBorrowed& b, nb::args) { b.Release(); })
      .def("__repr__", [](const PyBorrowed& b) {
        return "Borrowed(" + std::to_string(b.size()) + " blocks" +
               (b.released() ? ", released" : "") + ")";
      });

  nb::class_<PyClient>(m, "Client",
                       "A connection to kvpoold acting for one namespace.\n\n"
                       "Every call has the deadline `timeout` (seconds); a dead or restarted "
                       "daemon raises Unavailable or DeadlineExceeded, never hangs, and with "
                       "auto_reconnect the next call connects again. The GIL is released while a "
                       "call waits. Calls on one Client from several threads are serialized; use "
                       "one Client per thread for parallel traffic.")
      .def(nb::init<std::optional<std::string>, const std::string&, double, std::optional<double>,
                    const std::string&, const std::string&, std::optional<std::string>, bool,
                    std::optional<std::string>, bool, std::optional<std::string>,
                    std::optional<std::string>, std::optional<std::string>, int>(),
           nb::arg("address") = nb::none(), nb::arg("namespace") = "default", nb::kw_only(),
           nb::arg("timeout") = 10.0, nb::arg("connect_timeout") = nb::none(),
           nb::arg("data_path") = "auto", nb::arg("client_name") = "",
           nb::arg("cluster_secret") = nb::none(), nb::arg("auto_reconnect") = true,
           nb::arg("credential") = nb::none(), nb::arg("admin") = false,
           nb::arg("tls_ca") = nb::none(), nb::arg("tls_cert") = nb::none(),
           nb::arg("tls_key") = nb::none(), nb::arg("busy_poll_us") = 0,
           "Connects and says hello. address: a Unix socket path, 'unix://PATH', "
           "'tcp://HOST:PORT' or 'tls://HOST:PORT' (None: $KVPOOL_SOCKET or the default "
           "socket). data_path: 'auto' (shared memory on a local socket, UCX over tcp://, the "
           "TLS connection itself over tls://), 'socket', 'shm' or 'ucx'. tls_ca: PEM CA file "
           "the daemon's certificate must chain to (None: the system's); tls_cert, tls_key: "
           "this client's certificate for a daemon that requires one. "
           "busy_poll_us: spin up to this long for each answer before sleeping (0: sleep at "
           "once); burns this thread's CPU while it waits, for latency-bound calls (lookups, "
           "borrows) on a machine with a core to spare; pair it with kvpoold "
           "--io_busy_poll_us. "
           "credential: the namespace's secret (or the admin's, with admin=True) when the "
           "daemon's namespaces file gives it one; proved at hello, never sent. Raises "
           "Unavailable (no daemon), PermissionDenied / InvalidArgument (namespace refused), "
           "DeadlineExceeded.")
      .def_prop_ro("server", &PyClient::Server,
                   "What the daemon said at hello: node_id, daemon_version, max_block_bytes, "
                   "max_payload_bytes, max_batch_keys, shared_memory, ucx; plus address and "
                   "namespace.")
      .def_prop_ro("closed", &PyClient::closed)
      .def("gpu_tier", &PyClient::GpuTier, nb::arg("device"),
           "The daemon's gpu tier on this process's CUDA device `device` (torch's ordinal, "
           "matched by UUID): its device number, or None when the daemon runs none there or "
           "this client cannot map it (no shared memory, or mapping it failed). An engine "
           "passes gpu_device=device to put only where this is not None. Raises Unavailable "
           "when the daemon runs gpu tiers and this process has no CUDA.")
      .def("lookup", &PyClient::Lookup, nb::arg("keys"), nb::arg("prefetch") = true,
           "Longest cached prefix of the chain `keys`. With prefetch, hits on disk start moving "
           "to host at once.")
      .def("get_into", &PyClient::GetInto, nb::arg("keys"), nb::arg("buffers"),
           nb::arg("stream") = nb::none(),
           "Reads block i into buffers[i] (writable, C-contiguous: numpy array, torch tensor on "
           "the CPU or a CUDA device, bytearray, memoryview), without an intermediate copy. A "
           "CUDA buffer gets its block by one host-to-device copy from the daemon's shared "
           "memory, on `stream` (a torch.cuda.Stream, a cudaStream_t as int, or None: torch's "
           "current stream of that device), done when the call returns. Returns one GetResult "
           "per key; raises only when the daemon cannot be reached.")
      .def("get_into_async", &GetIntoAsync, nb::arg("keys"), nb::arg("buffers"),
           nb::arg("stream") = nb::none(),
           "As get_into, but returns a PendingGet once the copies into CUDA tensors are queued on "
           "`stream` (from the shared-memory arena, or from pinned bounce buffers for blocks that "
           "came as bytes): work queued on that stream afterwards runs after them, while Python "
           "goes on (e.g. the next layer's load). wait() checks them, ends the leases and returns "
           "the GetResults; only then does a block count as loaded (treat one it reports failed "
           "as not loaded).")
      .def("get", &PyClient::Get, nb::arg("keys"),
           "Each block as new bytes; None for a miss (or a block that failed its checksum).")
      .def("put", &PyClient::Put, nb::arg("keys"), nb::arg("blocks"),
           nb::arg("parent") = nb::none(), nb::arg("stream") = nb::none(),
           nb::arg("gpu_device") = nb::none(),
           "Put-if-absent of a chain: blocks[i] (any buffer, read-only ones included, or a CUDA "
           "tensor, taken without a copy) holds keys[i]'s bytes; parents follow chain order, "
           "the first block's is `parent`. A CUDA block is copied device-to-host straight into "
           "the daemon's shared memory on `stream` (as in get_into). With gpu_device, the daemon "
           "also keeps the stored blocks in its gpu tier on that CUDA device: CUDA blocks are "
           "copied device to device straight into it where it has room (the daemon makes their "
           "host copies itself), others placed there in the background (get_into of CUDA tensors "
           "there then copies device to device); InvalidArgument when it runs none there. "
           "Per-block errors are in PutResult.errors.")
      .def("borrow", &BorrowResult, nb::arg("keys"), nb::kw_only(),
           nb::arg("gpu_device") = nb::none(), nb::arg("verify") = true,
           "Lends the blocks in place, without copying them: a Borrowed of one BlockView per "
           "key, each the daemon's own copy in its shared memory (or, with gpu_device, in its "
           "gpu tier on that CUDA device) under a lease, for your own kernel to read (e.g. "
           "kvpool.kernels.scatter_paged into a paged KV cache). Use it as a context manager, or "
           "call release(). Blocks that cannot be lent in place (only on disk; any block on the "
           "socket or UCX path) come as bytes the Borrowed owns. verify: hash each host view "
           "first (False: lend at once, call Borrowed.verify() after reading). Raises only when "
           "the daemon cannot be reached; misses and per-block errors are in the views.")
      .def("prefetch", &PyClient::Prefetch, nb::arg("keys"), nb::arg("gpu_device") = nb::none(),
           "Hint: promote these toward host; returns how many promotions started. With "
           "gpu_device, also copy them into the daemon's gpu tier on that CUDA device (those "
           "only on disk read up first; get_into of CUDA tensors there then copies device to "
           "device); returns how many were placed there, once they are. InvalidArgument when the "
           "daemon has no gpu tier on that device.")
      .def("save_session", &PyClient::SaveSession, nb::arg("session_id"), nb::arg("keys"),
           nb::arg("token_count"), nb::arg("metadata") = nb::none(),
           "Persists a session and pins its chain on disk. FailedPrecondition when a chain "
           "block is not cached (put it first).")
      .def("load_session", &PyClient::LoadSession, nb::arg("session_id"),
           nb::arg("prefetch") = true, nb::arg("gpu_device") = nb::none(),
           "The session (NotFound when there is none; in cluster mode Unavailable when it is "
           "not found but a home of it did not answer). With prefetch, its chain is promoted; "
           "with gpu_device too, placed in the daemon's gpu tier on that CUDA device in the "
           "background.")
      .def("delete_session", &PyClient::DeleteSession, nb::arg("session_id"),
           "Deletes a session and unpins its blocks (NotFound when there is none; in cluster "
           "mode, where a home of it did not answer, the deletion is recorded anyway).")
      .def("list_sessions", &PyClient::ListSessions, nb::arg("prefix") = "", nb::arg("limit") = 0,
           "The namespace's sessions whose ids start with prefix (limit 0: all).")
      .def("stats", &PyClient::Stats,
           "The daemon's statistics as a dict, the fields of `kvpool stats --json` ('tiers' a "
           "list of dicts).")
      .def("cluster", &PyClient::Cluster,
           "The cluster as the daemon sees it: state, reason, members (list of dicts).")
      .def("locate", &PyClient::Locate, nb::arg("keys"),
           "For a request router: how many leading blocks of the chain each node holds, this "
           "daemon first, then (cluster mode) every other member, asked in one round within the "
           "peer deadline; nothing is promoted or fetched. A list of dicts: node_id, "
           "control_address, self, error (None, or the Error of a node that did not answer), "
           "hit_blocks, tiers (one per hit block).")
      .def("evict", &PyClient::Evict, nb::arg("tier") = "host", nb::arg("keys") = nb::none(),
           "Evict the namespace's blocks (all when keys is None) from 'gpu' (the gpu "
           "tier's copies only), 'host' (demoted to disk) or 'disk' (dropped). Returns "
           "{'evicted': n, 'skipped': n}.")
      .def("reconnect", &PyClient::Reconnect,
           "Drops the connection and connects again (also after close()).")
      .def("close", &PyClient::Close,
           "Closes the connection; later calls raise "
           "FailedPrecondition until reconnect().")
      .def("__enter__", [](nb::handle self) { return self; })
      .def("__exit__", [](PyClient& c, nb::args) { c.Close(); })
      .def("__repr__", [](PyClient& c) {
        return "Client(" + Quote(c.options().address) +
               ", namespace=" + Quote(c.options().namespace_name) + (c.closed() ? ", closed" : "") +
               ")";
      });
}

}  // namespace kvpool::py
