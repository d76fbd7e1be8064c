#pragma once
// kvpool C++ client: talks to the kvpoold on this node (Unix socket) or another (tcp://).
//
// A Client is one connection acting for one namespace. Every call has a deadline
// (ClientOptions::timeout); a dead or restarted daemon gives Unavailable or DeadlineExceeded,
// never a hang, and the next call reconnects by itself (auto_reconnect). Batches are the normal
// case: a call may carry thousands of keys; the client splits it to fit the daemon's limits.
//
// Typical use (see README.md):
//   kvpool::ChainHasher hasher(secret, layout, 16);
//   auto keys = hasher.Hash(tokens);
//   auto client = kvpool::Client::Connect({.namespace_name = "tenant-a"});
//   auto hit = (*client)->Lookup(keys);            // longest cached prefix
//   (*client)->Get(first hit->hit_blocks keys, buffers);
//   (*client)->Put(the missing blocks);
//   (*client)->SaveSession({.session_id = "chat-42", .keys = keys, ...});
//
// Thread safety: a Client is not thread-safe; use one per thread (connections are cheap).

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <kvpool/block_key.h>
#include <kvpool/kernels.h>
#include <kvpool/status.h>
#include <kvpool/tier.h>

namespace kvpool {

// How block bytes travel between the client and the daemon.
enum class DataPath : uint8_t {
  kAuto = 0,          // shared memory on a local Unix socket, UCX over tcp://, else the socket
                      // (tls:// included: its blocks stay inside the TLS connection)
  kSocket = 1,        // inside the control frames
  kSharedMemory = 2,  // shared memory; Connect fails when the daemon does not grant it
  kUcx = 3,           // UCX (cross-node; tcp:// addresses); Connect fails when not granted
};

struct ClientOptions {
  // Unix socket path, "unix://PATH", "tcp://HOST:PORT" or "tls://HOST:PORT" (a daemon whose
  // TCP listener speaks TLS, see the tls_ options). Default (empty): $KVPOOL_SOCKET, else
  // /run/kvpool/kvpool.sock for root, /tmp/kvpool-<uid>/kvpool.sock otherwise.
  std::string address;
  // The tenant this client acts for. Default: "default".
  std::string namespace_name = "default";
  // Shown in the daemon's logs. Default: empty.
  std::string client_name;
  // Deadline of every call, connecting included. Default: 10 s.
  std::chrono::milliseconds timeout{10000};
  // Deadline of connecting and saying hello, when it should differ from `timeout` (e.g. short
  // calls but a UCX handshake that may take longer). Default (0): `timeout`.
  std::chrono::milliseconds connect_timeout{0};
  // Spin up to this long for each answer before sleeping for it (the daemon's counterpart is
  // --io_busy_poll_us). A thread that does not sleep is not woken: on a virtual machine that
  // wake-up is most of a short round trip. Burns the calling thread's CPU while it waits; for
  // engines with a core to spare on latency-bound calls (lookups, borrows). Default 0: sleep.
  std::chrono::microseconds busy_poll{0};
  // Reconnect on the next call after the connection broke. Default: true.
  bool auto_reconnect = true;
  // Default: kAuto.
  DataPath data_path = DataPath::kAuto;
  // The credential proved at hello when the daemon asks (it challenges; the secret itself never
  // travels): the namespace's, as the operator's namespaces file gives it, or the admin's with
  // `admin`. A client on the Unix socket whose user the namespace admits needs none. Default:
  // none.
  std::string credential;
  // Ask for admin rights (daemon-wide stats, the cluster view, every namespace's policies);
  // the hello fails unless the daemon grants them. Default: false (a daemon whose namespaces
  // file has no admin section grants them to every client anyway; ServerInfo::admin says).
  bool admin = false;
  // The cluster secret, for TCP connections to a daemon in cluster mode (peers, and clients of
  // namespaces without a credential of their own); proved when `credential` is empty. Default:
  // none.
  std::string cluster_secret;
  // UCX transports and network devices for the UCX path ("" = UCX's choice / $UCX_TLS,
  // $UCX_NET_DEVICES). Default: "".
  std::string ucx_transports;
  std::string ucx_net_devices;
  // TLS for tls:// addresses, PEM files. The daemon's certificate must chain to `tls_ca_file`
  // (default: the system's trust store) and name the host dialled; `tls_cert_file` and
  // `tls_key_file` are this client's certificate, for a daemon that requires one (its
  // --tls_ca). Over tls://, DataPath::kAuto moves blocks on the TLS connection, not over UCX
  // (which is not encrypted). Default: none.
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
};

// One GPU's share of the daemon's gpu tier.
struct GpuTierInfo {
  int device = 0;  // the daemon's CUDA ordinal for it (the client's may differ)
  uint64_t segment_bytes = 0;
  uint64_t capacity_bytes = 0;
  std::string uuid;  // the GPU's UUID, 16 bytes: how the client matches its own devices
};

struct ServerInfo {
  std::string node_id;
  std::string daemon_version;
  uint64_t max_block_bytes = 0;
  uint64_t max_payload_bytes = 0;
  uint32_t max_batch_keys = 0;
  bool shared_memory = false;  // blocks move through shared memory on this connection
  // A block borrowed in place (Client::Borrow) stays leased at most this long. 0 on a
  // connection without shared memory (nothing is leased there).
  std::chrono::milliseconds lease_timeout{0};
  bool ucx = false;  // blocks move over UCX on this connection
  // Why not, where the client asked for UCX and it was not set up (e.g. "UCX endpoint to
  // 10.0.0.5:41000: ... unreachable"), where a kAuto client leaves UCX alone for 30 s after
  // such a failure, or where the endpoint was lost in a transfer (the rest of that call goes on
  // the socket; the next call reconnects, with auto_reconnect); empty otherwise.
  std::string ucx_refused;
  bool admin = false;  // the connection has admin rights
  // The daemon's gpu tiers, on a shared-memory connection: a block there is copied device to
  // device into a Memory::kCuda buffer of the same device (see Prefetch).
  std::vector<GpuTierInfo> gpu_tiers;
};

struct PrefetchOptions {
  // >= 0: also copy the blocks into the daemon's gpu tier on this CUDA device (this process's
  // ordinal, as torch names it; matched to the daemon's by UUID), those only on disk read up to
  // host first, for reads into device memory there; Prefetch returns once they are placed.
  // Default: -1 (toward host only).
  int gpu_device = -1;
};

struct PrefetchResult {
  uint32_t scheduled = 0;   // promotions toward host started
  uint32_t gpu_placed = 0;  // blocks copied into the gpu tier
};

struct LookupResult {
  uint32_t hit_blocks = 0;  // length of the longest cached prefix
  std::vector<Tier> tiers;  // fastest tier of each hit block
};

// Where caller memory is.
enum class Memory : uint8_t {
  kHost = 0,  // host memory of any kind (pageable, pinned, mapped)
  kCuda = 1,  // CUDA device memory (cudaMalloc'd, e.g. a torch CUDA tensor's storage)
};

// Caller memory a block is read into.
struct MutableBuffer {
  void* data = nullptr;
  size_t capacity = 0;
  // kCuda: `data` is device memory. A block in the same-node shared-memory arena is copied
  // there by one host-to-device cudaMemcpyAsync from the pinned mapping, on
  // GetOptions::cuda_stream; a block that comes another way (socket, UCX, decoded) passes
  // through a host buffer first.
  Memory memory = Memory::kHost;
};

struct GetResult {
  Status status;    // OK; NotFound for a miss; InvalidArgument if the buffer was too small
  size_t size = 0;  // bytes written into the buffer
  Tier tier = Tier::kNone;
  // With status OK into host memory: the xxh3-64 of the bytes (common/checksum.h), which the
  // client checked them against on arrival. 0 where not known (device buffers).
  uint64_t checksum = 0;
  // Non-zero: the bytes were decoded from a copy the daemon stored in this encoding on demotion
  // (KVPOOL_ENCODING_* of <kvpool/kernels.h>; the namespace accepted lossy copies): close to,
  // not exactly, what was put. 0: exactly what was put.
  int lossy_encoding = 0;
  // Non-zero only with GetOptions{.accept_encoded = true, .decode = false}: the bytes are the
  // daemon's stored copy in this KVPOOL_ENCODING_*, and `layout` decodes them
  // (kvpool_kernel_dequantize, on the CPU or the GPU) into the block's dtype.
  int encoding = 0;
  kvpool_block_layout layout{};
  // The block's parent in its chain, as its put named it: only where the daemon answers a peer
  // daemon (a cluster member's fetch, which links the block under it) and holds the parent too;
  // zero otherwise.
  BlockKey parent;
};

// A block read into memory the library allocated.
struct FetchedBlock {
  Status status;  // OK; NotFound for a miss
  std::vector<uint8_t> bytes;
  Tier tier = Tier::kNone;
  int lossy_encoding = 0;  // as GetResult::lossy_encoding
  int encoding = 0;        // as GetResult::encoding
  kvpool_block_layout layout{};
};

// How a get treats the blocks a namespace stores encoded on disk (its encoding on demotion).
struct GetOptions {
  // The daemon may send such a block, when it is only on disk, as stored: a half to a quarter of
  // the bytes, and no promotion into host memory. Blocks in memory always come as put.
  bool accept_encoded = false;
  // With accept_encoded: decode those here (the kernels' CPU twin) so the caller sees the block
  // in its dtype as always; false: hand the caller the encoded bytes and their layout
  // (GetResult::encoding) to decode where it likes, e.g. on the GPU after the copy.
  bool decode = true;
  // The cudaStream_t the copies into Memory::kCuda buffers are queued on (nullptr: the legacy
  // default stream of the buffers' device). They run after the work queued there before the
  // call, and Get returns once they are done. A stream of another device than the buffers' is
  // refused (InvalidArgument) where the driver can tell (CUDA 12.8 and later).
  void* cuda_stream = nullptr;
};

struct PutBlock {
  BlockKey key;
  const void* data = nullptr;
  size_t size = 0;
  BlockKey parent;  // previous key of the chain; zero for the first block
  // The block's checksum (xxh3-64) when the caller already knows it, e.g. a copy taken from
  // another store: the daemon then checks the bytes it receives against it, so damage at the
  // source or on the way is refused (Corruption) instead of stored under a fresh hash.
  std::optional<uint64_t> checksum;
  // kCuda: `data` is device memory. On the same-node shared-memory path the block is copied
  // straight into its reserved slot of the host arena by one device-to-host cudaMemcpyAsync on
  // PutOptions::cuda_stream; other paths copy it to a host buffer first.
  Memory memory = Memory::kHost;
};

struct PutOptions {
  // The cudaStream_t the copies out of Memory::kCuda blocks are queued on (nullptr: the legacy
  // default stream of the blocks' device): after the work queued there before the call, e.g.
  // the kernel that wrote the block. Put returns once they are done. A stream of another device
  // is refused as in GetOptions::cuda_stream.
  void* cuda_stream = nullptr;
  // >= 0: the blocks stored are also kept in the daemon's gpu tier on this CUDA device (this
  // process's ordinal), where there is room there: a later get into device memory on that GPU
  // then copies device to device. With Memory::kCuda blocks (and none with a `checksum` given)
  // they are copied device to device straight into slots of that tier, on `cuda_stream`, and the
  // daemon makes their host copies behind the put; otherwise they go into host and are placed
  // there in the background after the put returns. Shared-memory path only; InvalidArgument,
  // before anything is sent, when the daemon runs no gpu tier on it. Default: -1 (host only).
  int gpu_device = -1;
};

// In a namespace that writes to disk on commit (write-through), a block counted stored or
// already_present is on disk when Put returns.
struct PutResult {
  uint32_t stored = 0;           // blocks whose bytes were sent and committed
  uint32_t already_present = 0;  // cached already: nothing was sent
  // Being written right now by another client (or by this client's own earlier, broken
  // connection, whose reservation ends when the daemon notices): nothing was sent, and a get
  // may miss until that writer commits. Put asks for these once more before it returns, and in
  // a write-through namespace kvpoold then waits for that writer (up to 2 s, or half the
  // client's timeout when less); what is still in progress after that is counted here, and is
  // not known to be on disk.
  uint32_t in_progress = 0;
  std::vector<Status> errors;  // one per block: OK, or why that block was not stored
  bool all_ok() const;
};

// A get whose copies into device memory may still be running on the caller's stream
// (Client::GetAsync). Work the caller queues on that stream after GetAsync runs after them; the
// host thread goes on. The leased sources (and the bounce buffers of blocks that came as bytes)
// stay held until Wait, which also checks the copies:
// only then does a block count as read, and a block Wait reports as failed must be treated as
// not loaded (e.g. recomputed), even if a kernel on the stream already read its buffer.
//
// Thread safety: as its Client (Wait ends the leases over the client's connection). Wait and
// the destructor are safe after the Client is gone.
class PendingGet {
 public:
  PendingGet();
  ~PendingGet();  // waits, when Wait was not called: the copies may not outlive their leases
  PendingGet(PendingGet&&) noexcept;
  PendingGet& operator=(PendingGet&&) noexcept;

  // Waits until the copies are done (only the calling thread waits), checks each block, ends
  // the leases, and returns one result per key, as Get does. Once: FailedPrecondition after.
  Result<std::vector<GetResult>> Wait();
  // Whether copies were left running (false: the results were final when GetAsync returned).
  bool pending() const;

 private:
  friend class Client;
  struct State;
  std::unique_ptr<State> state_;
};

// How Client::Borrow lends blocks.
struct BorrowOptions {
  // >= 0: a block with a copy in the daemon's gpu tier on this CUDA device (this process's
  // ordinal) is lent as a device pointer into that copy (BlockView::memory == kCuda); the others
  // as host pointers. Default: -1 (host pointers only).
  int gpu_device = -1;
  // Hash every view before lending it (one read of its bytes: host views on the CPU, device
  // views by their device checksum on their GPU), so a damaged copy is refused (Corruption)
  // rather than read. false: lend at once and call BorrowedBlocks::Verify after reading, which
  // also shows a lease that ran out while the caller read. Default: true.
  bool verify = true;
  // The stream device views are checked on (with `verify`, and by BorrowedBlocks::Verify): a
  // cudaStream_t of `gpu_device`. nullptr: that device's legacy default stream, which also waits
  // for the work on its other blocking streams (an engine's running forward, say) and may not be
  // used while a CUDA graph is being captured. Default: nullptr.
  void* cuda_stream = nullptr;
};

// One block lent by Client::Borrow.
struct BlockView {
  Status status;  // OK; NotFound for a miss; Corruption, ... for that block alone
  // The block's bytes, read-only: in this process's mapping of the daemon's pinned shared-memory
  // arena (host tier), in the daemon's gpu tier (memory == kCuda, on the device asked for), or,
  // for a block that could not be lent in place (read from disk, another data path), in memory
  // the BorrowedBlocks owns. Null when not lent (a miss, or an error at borrow time).
  const void* data = nullptr;
  size_t size = 0;
  Memory memory = Memory::kHost;
  Tier tier = Tier::kNone;  // where it was lent from
  uint64_t checksum = 0;    // xxh3-64 of the bytes as put
  // memory == kCuda: the gpu copy's device checksum (kvpool's chunked XXH64, which a GPU
  // computes in parallel; kernels/device_checksum.h), what Verify checks it against.
  uint64_t device_checksum = 0;
};

// Blocks lent in place by Client::Borrow. While their leases hold (ServerInfo::lease_timeout
// from the borrow, or until Release), the daemon neither moves, frees nor reuses them (only a
// writer of the same namespace could touch that memory): an engine's own kernel may read them
// where they are (e.g. kvpool_kernel_scatter_paged into its paged KV cache). The memory stays
// mapped for as long as this object lives, even after Release or a reconnect; only its contents
// are no longer guaranteed then.
//
// Thread safety: as its Client (Release talks to the daemon over the client's connection; do
// not call it while another thread uses that Client). Release and the destructor are safe after
// the Client is gone (the leases ended with its connection).
class BorrowedBlocks {
 public:
  BorrowedBlocks();
  ~BorrowedBlocks();  // Release()
  BorrowedBlocks(BorrowedBlocks&&) noexcept;
  BorrowedBlocks& operator=(BorrowedBlocks&&) noexcept;

  // One view per key borrowed, in order.
  std::span<const BlockView> views() const;
  size_t size() const { return views().size(); }
  const BlockView& operator[](size_t i) const { return views()[i]; }
  // When the leases end by themselves (steady clock).
  std::chrono::steady_clock::time_point lease_deadline() const;

  // Hashes each OK view again, host views against their checksum on the CPU and device views
  // against their device checksum on their GPU; the first that changed (its lease ended before
  // this call, and the slot was reused) gives Corruption and its view's status turns Corruption.
  Status Verify();
  // Ends the leases now (RELEASE messages, no round trip; nothing to end on a connection that
  // has since closed). Idempotent. A GPU read of the views that is still queued (a kernel, an
  // asynchronous copy out of a pinned host view) must be finished first (synchronize its
  // stream): once released, the daemon may reuse the slots.
  Status Release();

 private:
  friend class Client;
  struct State;
  std::unique_ptr<State> state_;
};

struct Session {
  std::string session_id;  // 1-256 bytes of UTF-8 text (as the metadata's keys and values)
  std::vector<BlockKey> keys;
  uint64_t token_count = 0;
  std::map<std::string, std::string> metadata;
  int64_t created_unix_ms = 0;  // set by the daemon
  int64_t updated_unix_ms = 0;  // set by the daemon
  uint64_t total_bytes = 0;     // set by the daemon
  // Set by the daemon: which save this is (newer saves have larger (version, origin); in cluster
  // mode the newest wins on every node) and the node that took it.
  uint64_t version = 0;
  std::string origin;
  // A deletion's record, only seen with LoadSessionOptions::include_deleted (peer daemons).
  bool deleted = false;
};

struct SaveSessionOptions {
  // For peer daemons: `session` is another daemon's copy, stored with its version, origin and
  // `deleted` when newer than this daemon's, ignored otherwise. Refused from other clients.
  bool replica = false;
};

struct LoadSessionOptions {
  // Promote the chain toward host. Default: true.
  bool prefetch = true;
  // >= 0 (with prefetch): also place the chain's blocks in the daemon's gpu tier on this CUDA
  // device (this process's ordinal), in the background after the load returns. InvalidArgument
  // when the daemon runs no gpu tier on it. Default: -1.
  int gpu_device = -1;
  // For peer daemons: answer this daemon's own record, a deletion's too (Session::deleted),
  // instead of NotFound. Default: false.
  bool include_deleted = false;
};

struct LoadedSession {
  Session session;
  uint32_t cached_blocks = 0;  // chain blocks cached now
};

struct SessionSummary {
  std::string session_id;
  uint32_t blocks = 0;
  uint64_t token_count = 0;
  int64_t updated_unix_ms = 0;
  uint64_t total_bytes = 0;
};

struct TierStats {
  std::string name;
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t blocks = 0;
  uint64_t allocated_bytes = 0;
  double fragmentation = 0;
  uint64_t hits = 0;
  uint64_t promotions = 0;
  uint64_t demotions = 0;
  uint64_t evictions = 0;
  // Copies moved within this tier (host: to another segment of their namespace, so that one
  // empties for a namespace that needed a segment; nothing is evicted for those).
  uint64_t moves = 0;
  // Segments given fresh memory to change namespace (host and gpu tiers), and of those, how many
  // took memory made ahead (host: kvpoold --host_standby_segments).
  uint64_t renewals = 0;
  uint64_t renewals_from_standby = 0;
  uint64_t standby_ready = 0;  // host: standby segments made and not yet taken
  // gpu: of its hits, those served to a reader on another GPU (peer to peer).
  uint64_t peer_hits = 0;
};

struct DaemonStats {
  std::string node_id;
  std::string version;
  uint64_t uptime_s = 0;
  std::vector<TierStats> tiers;
  uint64_t index_entries = 0;
  uint64_t index_bytes = 0;
  uint64_t rocksdb_memory_bytes = 0;  // RocksDB's memtables, block cache and table readers
  uint64_t index_rebuild_blocks = 0;  // the index rebuilt at start from disk: blocks...
  double index_rebuild_seconds = 0;   // ... and the time it took
  uint64_t sessions = 0;
  uint64_t connections = 0;
  uint64_t lookups = 0;
  uint64_t lookup_blocks = 0;
  uint64_t lookup_hit_blocks = 0;
  uint64_t gets = 0;
  uint64_t get_blocks_served = 0;
  uint64_t get_misses = 0;
  uint64_t puts_offered = 0;
  uint64_t puts_deduplicated = 0;
  uint64_t puts_committed = 0;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  uint64_t prefetches_issued = 0;
  uint64_t prefetches_useful = 0;
  uint64_t checksum_failures = 0;
  uint64_t leases_active = 0;
  uint64_t reservations_active = 0;
  double dedup_ratio = 0;
  // Without admin rights: only the client's namespace (tiers' used bytes, sessions); the
  // daemon-wide counts are zero.
  bool namespace_only = false;
  std::string cluster_state;  // standalone, joining, joined, degraded
  uint32_t cluster_members = 0;
  std::string cluster_reason;  // why degraded or still joining
};

struct ClusterMember {
  std::string node_id;
  std::string control_address;
  std::string state;  // alive, stale (the daemon cannot reach etcd), degraded (that daemon)
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
  bool self = false;  // the daemon this client talks to
  int64_t started_unix_ms = 0;
};

struct ClusterView {
  std::string state;  // standalone, joining, joined, degraded
  std::string reason;
  std::vector<ClusterMember> members;
};

// One node's answer to Locate.
struct NodeLocation {
  std::string node_id;
  std::string control_address;  // empty for a standalone daemon
  bool self = false;            // the daemon this client talks to
  Status status;                // OK, or why the node did not answer (hit_blocks is 0 then)
  uint32_t hit_blocks = 0;      // leading blocks of the chain the node holds
  std::vector<Tier> tiers;      // fastest tier of each of them on that node
};

struct EvictResult {
  uint64_t evicted = 0;
  uint64_t skipped = 0;
};

// The strategies one namespace runs with, by the names the namespaces file uses (README,
// "Namespaces and their strategies").
struct PolicyInfo {
  std::string namespace_name;     // empty for the default composition
  std::string eviction;           // "lru", "s3fifo", "lfu" (or a registered custom order)
  std::string write;              // "write-back", "write-through", "write-through-after-N"
  std::string admission;          // "all", "after-N-hits", "none"
  std::string read_ahead;         // "chain-N", "none"
  std::string encoding;           // on demotion: "raw", or e.g. "int8 (32x8x128, 16 tokens, bf16)"
  std::string source;             // "default", "flags", or the namespaces file's path
  uint64_t host_quota_bytes = 0;  // host segments it may hold, in bytes; 0: no quota
  uint64_t disk_quota_bytes = 0;  // bytes it may store on disk; 0: no quota
  uint64_t gpu_quota_bytes = 0;   // gpu segments it may hold on each GPU, in bytes; 0: no quota
};

struct PoliciesView {
  PolicyInfo default_policy;  // for every namespace without its own
  std::vector<PolicyInfo> namespaces;
};

class Client {
 public:
  // Connects and says hello. Unavailable when no daemon listens, PermissionDenied or
  // InvalidArgument when the namespace is refused.
  static Result<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Longest cached prefix of `chain`. With `prefetch`, the daemon starts promoting the hits that
  // sit on disk toward host at once.
  Result<LookupResult> Lookup(std::span<const BlockKey> chain, bool prefetch = true);
  // Where each key is cached on this daemon, each on its own (no prefix rule): Tier::kNone when
  // it is not. Moves nothing and asks no other node.
  Result<std::vector<Tier>> Where(std::span<const BlockKey> keys);

  // Reads blocks into the caller's buffers (one per key). The call fails only when the daemon
  // cannot be reached; per-block misses and errors are in the results. Every block's checksum is
  // verified on receipt; a block that fails is reported as Corruption, never returned.
  // Buffers may be device memory (MutableBuffer::memory); InvalidArgument, before anything is
  // asked of the daemon, when one that says so is not, and Unavailable without CUDA.
  Result<std::vector<GetResult>> Get(std::span<const BlockKey> keys,
                                     std::span<const MutableBuffer> buffers,
                                     const GetOptions& options = {});

  // Lends blocks in place, without copying them: for each key a view of the daemon's own copy
  // (shared-memory path) under a lease, for a kernel of the caller's to read. Blocks that cannot
  // be lent in place (only on disk, or any block on the socket and UCX paths) are read into
  // memory the result owns, so every hit has a view. The call fails only when the daemon cannot
  // be reached; per-block misses and errors are in the views. InvalidArgument when
  // options.gpu_device is not a CUDA device of this process; Unavailable without CUDA.
  Result<BorrowedBlocks> Borrow(std::span<const BlockKey> keys, const BorrowOptions& options = {});

  // As Get, but returns once the copies into device buffers are queued on options.cuda_stream:
  // from the shared-memory arena, or from the client's pinned bounce buffers for blocks that
  // came as bytes (socket, UCX, decoded here), which are held until Wait. See PendingGet. Get is
  // GetAsync then Wait.
  Result<PendingGet> GetAsync(std::span<const BlockKey> keys,
                              std::span<const MutableBuffer> buffers,
                              const GetOptions& options = {});

  // As Get, into buffers the library allocates to each block's size.
  Result<std::vector<FetchedBlock>> GetBlocks(std::span<const BlockKey> keys,
                                              const GetOptions& options = {});

  // As Get, but block i goes where `buffer_for(i, size)` says once its size is known: host
  // memory of at least `size` bytes, or {nullptr, 0} to skip the block (its result is then
  // InvalidArgument and its bytes are discarded). Called on the calling thread before any byte
  // of that block is written; it may be asked again for the same block (a call on a connection
  // that had died idle is retried once, ClientOptions::auto_reconnect) and must then give the
  // same buffer. Once this returns nothing writes into the buffers any more. Only a result with
  // status OK says its buffer holds the block. Blocks come as put (encoded copies are decoded by
  // the daemon). For a caller that places blocks itself, e.g. a daemon fetching from a peer
  // straight into its host tier.
  using BufferFor = std::function<MutableBuffer(size_t index, uint64_t size)>;
  Result<std::vector<GetResult>> GetWith(std::span<const BlockKey> keys,
                                         const BufferFor& buffer_for);

  // Stores blocks, put-if-absent: a block already cached costs no payload transfer.
  Result<PutResult> Put(std::span<const PutBlock> blocks, const PutOptions& options = {});
  // Convenience for a chain: keys[i]'s bytes are blocks[i]; parents follow the chain order
  // (the first block's parent is `parent`).
  Result<PutResult> PutChain(std::span<const BlockKey> keys,
                             std::span<const std::span<const uint8_t>> blocks,
                             const BlockKey& parent = {});

  // Hint: promote these toward host. Returns how many promotions started.
  Result<uint32_t> Prefetch(std::span<const BlockKey> keys);
  // The same, and with options.gpu_device toward that GPU's tier of the daemon as well.
  // InvalidArgument when the daemon runs no gpu tier on that GPU; Unavailable when it runs gpu
  // tiers and this process has no CUDA.
  Result<PrefetchResult> Prefetch(std::span<const BlockKey> keys, const PrefetchOptions& options);

  // Persists a session and pins its chain on disk. FailedPrecondition when a chain block is not
  // cached (put it first).
  Status SaveSession(const Session& session);
  Status SaveSession(const Session& session, const SaveSessionOptions& options);
  // NotFound when there is no such session. In cluster mode, Unavailable instead when neither
  // the daemon nor the session's homes that answered hold it but a home did not answer (it may
  // hold the session; the message names it). With `prefetch`, its chain is promoted.
  Result<LoadedSession> LoadSession(const std::string& session_id, bool prefetch = true);
  Result<LoadedSession> LoadSession(const std::string& session_id,
                                    const LoadSessionOptions& options);
  // NotFound when there is no such session. In cluster mode, where a home of the session did not
  // answer, the deletion is recorded whether or not a copy was found (OK): the silent home's copy
  // then does not come back.
  Status DeleteSession(const std::string& session_id);
  // The namespace's sessions whose ids start with `prefix`, in id order: at most `limit`, or
  // all of them (asked a page at a time) where it is 0.
  Result<std::vector<SessionSummary>> ListSessions(const std::string& prefix = "",
                                                   uint32_t limit = 0);

  Result<DaemonStats> Stats();
  // The cluster as the daemon sees it ("standalone" without cluster mode).
  Result<ClusterView> Cluster();
  // For a request router: how many leading blocks of `chain` each node holds, this daemon
  // first, then (cluster mode) every other member, all asked in one round within the peer
  // deadline; a node that does not answer has a non-OK status. Nothing is promoted or fetched.
  Result<std::vector<NodeLocation>> Locate(std::span<const BlockKey> chain);
  // Evicts this namespace's blocks (all when `keys` is empty) from host (kHost: demote to
  // disk) or from the cache (kDisk).
  Result<EvictResult> Evict(Tier tier, std::span<const BlockKey> keys = {});
  // The strategies the daemon runs with now (they change when its namespaces file is reloaded):
  // the default composition and every namespace configured by the flags or the file, sorted by
  // name. With `namespace_name`, `namespaces` holds that namespace alone, configured or not (then
  // with the default's strategies and source). Unimplemented from a daemon too old to know.
  Result<PoliciesView> Policies(const std::string& namespace_name = "");

  // The daemon's gpu tier on this process's CUDA device `cuda_device` (torch's ordinal; matched
  // by UUID): its GpuTierInfo::device. InvalidArgument when the daemon runs none there, or when
  // this client cannot map it (no shared memory, or its import failed since the last connect);
  // Unavailable when the daemon runs gpu tiers and this process has no CUDA. For an engine
  // choosing whether to pass PutOptions::gpu_device.
  Result<int> GpuTierOf(int cuda_device);

  // Drops the connection and connects again (also done by itself with auto_reconnect).
  Status Reconnect();
  const ServerInfo& server() const;
  const ClientOptions& options() const;

  class Impl;

 private:
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvpool
