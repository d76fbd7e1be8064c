// UcxEngine: see ucx_engine.h.
//
// UCX operation choice, by measurement (commands, all figures and conditions in docs/UCX.md):
//   ucx_perftest, 1 MiB, loopback, server `taskset -c 0 ucx_perftest -p P`, client
//   `taskset -c 1 ucx_perftest 127.0.0.1 -p P -t T -s 1048576 -n 500 -w 50 -f`, UCX 1.13.1 on a
//   loaded 2-core VM (load 4.6-6), overall MB/s over 4 runs:
//     UCX_TLS=tcp: tag_bw 165-1600, ucp_am_bw 200-960, ucp_get 180-300, ucp_put_bw 110-180
//     UCX_TLS=shm: tag_bw 1840-5780, ucp_am_bw 415-6950, ucp_get 17700-20300, ucp_put_bw 9500-28800
//   This engine (ucx_engine_test Throughput, tcp/lo, 1 MiB, 8 in flight): 0.45-1.78 GB/s, at or
//   above ucx_perftest tag_bw run in the same minutes.
// Hence tagged messages for block bodies: over tcp (the cross-node transport here) UCX emulates
// RMA and get/put are 2-10x slower than two-sided messages, and tagged matches active messages
// while giving per-block matching, the unexpected queue, truthful lengths and cancellable
// receives for free. RMA get wins on shm, but same-node clients use the memfd path instead of
// UCX, and posix/sysv are refused under error mode PEER unless UCX_{POSIX,SYSV}_ERROR_HANDLING=y.
// On rc/dc (native RMA) a get would be expected to win; unmeasured here (no such device), so not
// implemented: bulk_op() is kTagged.
#include "transport/ucx_engine.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/threads.h"
#include "glog/logging.h"

namespace kvpool::transport {

Status UcsStatusToStatus(int ucs_status, std::string_view context) {
  auto st = static_cast<ucs_status_t>(ucs_status);
  if (st == UCS_OK || st == UCS_INPROGRESS) return Status::OK();
  std::string msg = std::string(context) + ": " + ucs_status_string(st);
  switch (st) {
    case UCS_ERR_CANCELED:
      return Status::Aborted(std::move(msg));
    case UCS_ERR_TIMED_OUT:
      return Status::DeadlineExceeded(std::move(msg));
    case UCS_ERR_MESSAGE_TRUNCATED:
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_NO_RESOURCE:
    case UCS_ERR_EXCEEDS_LIMIT:
    case UCS_ERR_OUT_OF_RANGE:
      return Status::ResourceExhausted(std::move(msg));
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
      return Status::InvalidArgument(std::move(msg));
    case UCS_ERR_UNSUPPORTED:
      return Status::Unimplemented(std::move(msg));
    case UCS_ERR_IO_ERROR:
      return Status::IoError(std::move(msg));
    case UCS_ERR_NO_DEVICE:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_BUSY:
    case UCS_ERR_SHMEM_SEGMENT:
      return Status::Unavailable(std::move(msg));
    default:
      return Status::Internal(std::move(msg));
  }
}

const char* BulkOpName(UcxEngine::BulkOp op) {
  switch (op) {
    case UcxEngine::BulkOp::kTagged:
      return "tagged";
    case UcxEngine::BulkOp::kActiveMessage:
      return "active-message";
    case UcxEngine::BulkOp::kRmaGet:
      return "rma-get";
  }
  return "?";
}

namespace {

constexpr uint64_t kFullTagMask = ~uint64_t{0};

// Runs `print(stream)` into a string (ucp_*_print_info write to a FILE*).
template <typename Fn>
std::string PrintToString(Fn print) {
  char* buf = nullptr;
  size_t size = 0;
  FILE* f = open_memstream(&buf, &size);
  if (f == nullptr) return "";
  print(f);
  fclose(f);
  std::string out(buf, size);
  free(buf);
  return out;
}

// "tcp/lo" tokens from ucp_*_print_info: its resource lines read
// "#   ... lane[0]:  2:tcp/lo.0 md[1] ..." (endpoints) or "#  ... tcp/lo ..." (workers); we
// keep every distinct "<tl>/<device>" token whose tl is a known UCT transport.
std::string ExtractTransports(const std::string& info) {
  static const char* kTls[] = {"tcp",       "posix",    "sysv",     "cma",
                               "knem",      "xpmem",    "self",     "rc_verbs",
                               "rc_mlx5",   "dc_mlx5",  "ud_verbs", "ud_mlx5",
                               "cuda_copy", "cuda_ipc", "gdr_copy", "rocm_copy"};
  std::vector<std::string> found;
  std::istringstream in(info);
  std::string word;
  while (in >> word) {
    size_t colon = word.find(':');
    if (colon != std::string::npos) word = word.substr(colon + 1);
    size_t slash = word.find('/');
    if (slash == std::string::npos || slash == 0) continue;
    std::string tl = word.substr(0, slash);
    bool known = false;
    for (const char* t : kTls) known = known || tl == t;
    if (!known) continue;
    std::string dev = word.substr(slash + 1);
    while (!dev.empty() && (dev.back() == ',' || dev.back() == ')')) dev.pop_back();
    // Lanes print "tcp/lo.0" style suffixes on some versions; drop a trailing ".<digits>".
    size_t dot = dev.rfind('.');
    if (dot != std::string::npos && dot + 1 < dev.size() &&
        dev.find_first_not_of("0123456789", dot + 1) == std::string::npos) {
      dev.resize(dot);
    }
    std::string token = tl + "/" + dev;
    bool dup = false;
    for (const auto& f : found) dup = dup || f == token;
    if (!dup) found.push_back(token);
  }
  std::string out;
  for (const auto& f : found) out += (out.empty() ? "" : " ") + f;
  return out;
}

}  // namespace

namespace {
// `addr`'s IP address as text; an IPv4-mapped IPv6 address in IPv4 form. Empty if neither.
std::string IpOf(const sockaddr* addr) {
  char text[INET6_ADDRSTRLEN] = {};
  if (addr->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(addr)->sin_addr, text, sizeof(text));
    return text;
  }
  if (addr->sa_family != AF_INET6) return "";
  const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr;
  if (IN6_IS_ADDR_V4MAPPED(&a)) {
    inet_ntop(AF_INET, &a.s6_addr[12], text, sizeof(text));
  } else {
    inet_ntop(AF_INET6, &a, text, sizeof(text));
  }
  return text;
}
}  // namespace

class UcxEngine::Impl {
 public:
  explicit Impl(const UcxOptions& options) : options_(options) {}
  ~Impl();

  Status Init();
  void Start();
  void Stop();

  // A unit of work for the progress thread; `abort` runs instead when the engine stops first.
  struct Command {
    std::function<void()> run;
    std::function<void()> abort;
  };
  void Post(Command cmd);
  bool OnProgressThread() const { return std::this_thread::get_id() == thread_id_.load(); }

  // Progress-thread-only operations (called from commands).
  Result<UcxEndpointId> DoConnect(const std::string& address);
  Result<UcxEndpointId> DoConnectTo(const sockaddr_storage& addr, socklen_t len);
  Result<uint16_t> DoListen(const sockaddr_storage& addr, socklen_t len, AdmitFn admit,
                            std::function<void(UcxEndpointId, const std::string&)> on_accept);
  void DoStopListening();
  void DoDisconnect(UcxEndpointId id);
  void DoSend(UcxOpId id, UcxEndpointId ep, uint64_t tag, const void* data, size_t len,
              std::function<void(Status)> done);
  void DoReceive(UcxOpId id, uint64_t tag, void* data, size_t capacity,
                 std::function<void(Status, size_t)> done, UcxEndpointId from);
  void DoSendStream(UcxOpId id, UcxEndpointId ep, const void* data, size_t len,
                    std::function<void(Status)> done);
  void DoReceiveStream(UcxOpId id, UcxEndpointId ep, void* data, size_t len,
                       std::function<void(Status, size_t)> done);
  void DoCancel(UcxOpId id);
  // Cancels op `id` at `deadline` unless it finished.
  void AddDeadline(UcxOpId id, std::chrono::steady_clock::time_point deadline) {
    deadlines_.emplace(deadline, id);
  }
  // After ucp_*_nbx returned `req` for op `id`: records the request, or completes the op.
  void Posted(UcxOpId id, void* req, const char* what);
  Result<std::string> DoEndpointTransports(UcxEndpointId id);

  UcxOpId NextOpId() { return next_op_id_.fetch_add(1, std::memory_order_relaxed); }
  // EndpointFailed: any thread.
  bool Failed(UcxEndpointId id) const {
    absl::MutexLock lock(&failed_mu_);
    return failed_ids_.count(id) != 0;
  }

  const UcxOptions options_;
  std::string address_;
  uint64_t client_id_ = 0;  // random, never 0: sent with each ConnectTo's connection request
  std::string transports_;

 private:
  struct Op {
    Impl* impl = nullptr;
    UcxOpId id = 0;
    UcxEndpointId ep = 0;  // sends: their endpoint; receives: `from` (UCX matches worker-wide)
    bool is_send = false;
    bool orphaned = false;  // Shutdown gave up on it; it reports after the worker is destroyed
    void* request = nullptr;
    std::function<void(Status)> send_done;
    std::function<void(Status, size_t)> recv_done;
  };
  struct Endpoint {
    Impl* impl = nullptr;
    UcxEndpointId id = 0;
    ucp_ep_h ep = nullptr;
    Status failed;  // non-OK once UCX reported an error or we force-closed it
  };

  static void SendCallback(void* request, ucs_status_t status, void* user_data);
  static void ReceiveCallback(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                              void* user_data);
  static void StreamReceiveCallback(void* request, ucs_status_t status, size_t length,
                                    void* user_data);
  // A send op `id` on `ep`, registered, with `param` set up to report to it.
  void RegisterSend(UcxOpId id, UcxEndpointId ep, std::function<void(Status)> done,
                    ucp_request_param_t* param);
  // Looks up `ep` for a new operation: its Endpoint, or null after reporting why to `fail`.
  Endpoint* UsableEndpoint(UcxEndpointId ep, const std::function<void(Status)>& fail);
  static void ErrorCallback(void* arg, ucp_ep_h ep, ucs_status_t status);
  static void ConnectionRequest(ucp_conn_request_h request, void* arg);

  // Creates an endpoint from `params` (the target already set) with error mode PEER and our
  // error handler, and registers it.
  Result<UcxEndpointId> CreateEndpoint(ucp_ep_params_t& params, const char* what);

  void Complete(Op* op, Status st, size_t len);
  void ForceClose(Endpoint& e, Status why);
  // Cancels the receives that name `ep` as their sender (ReceiveTagged's `from`).
  void CancelReceivesFrom(UcxEndpointId ep);
  // Cancels (as DoCancel) the operations whose deadline has passed; returns how long until the
  // next one is due (capped at `cap`).
  std::chrono::milliseconds ExpireDeadlines(std::chrono::milliseconds cap);
  void ProgressLoop();
  void Shutdown();
  bool RunQueued();  // true if anything ran
  void ReapCloses();
  // Records `id` for EndpointFailed.
  void MarkFailed(UcxEndpointId id);

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  // The listener and its callbacks; progress thread only.
  ucp_listener_h listener_ = nullptr;
  AdmitFn admit_;
  std::function<void(UcxEndpointId, const std::string&)> on_accept_;
  int ucp_efd_ = -1;
  int wake_fd_ = -1;
  int epoll_fd_ = -1;
  std::thread thread_;
  std::atomic<std::thread::id> thread_id_{};  // written once before any command runs
  std::atomic<UcxOpId> next_op_id_{1};        // relaxed: only uniqueness matters
  UcxEndpointId next_ep_id_ = 1;              // progress thread only

  absl::Mutex mu_;
  std::deque<Command> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Endpoints that failed and are not yet disconnected (EndpointFailed); written on the
  // progress thread, read from any.
  mutable absl::Mutex failed_mu_;
  std::unordered_set<UcxEndpointId> failed_ids_ ABSL_GUARDED_BY(failed_mu_);

  // Progress thread only.
  std::unordered_map<UcxOpId, Op*> ops_;
  std::unordered_map<UcxEndpointId, std::unique_ptr<Endpoint>> eps_;
  std::vector<void*> closing_;             // ucp_ep_close_nbx requests still in flight
  std::vector<UcxEndpointId> failed_eps_;  // reported by ErrorCallback, to be force-closed
  // Sends given a deadline; entries of operations that finished first are dropped when due.
  std::multimap<std::chrono::steady_clock::time_point, UcxOpId> deadlines_;
  // Cancelled receives with a sender, due to have it force-closed unless they ended first.
  std::multimap<std::chrono::steady_clock::time_point, UcxOpId> cancelled_receives_;
};

std::chrono::milliseconds UcxEngine::Impl::ExpireDeadlines(std::chrono::milliseconds cap) {
  const auto now = std::chrono::steady_clock::now();
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    const UcxOpId id = deadlines_.begin()->second;
    deadlines_.erase(deadlines_.begin());
    if (ops_.count(id) != 0) DoCancel(id);
  }
  while (!cancelled_receives_.empty() && cancelled_receives_.begin()->first <= now) {
    const UcxOpId id = cancelled_receives_.begin()->second;
    cancelled_receives_.erase(cancelled_receives_.begin());
    auto op = ops_.find(id);
    if (op == ops_.end()) continue;  // it ended within the grace
    auto e = eps_.find(op->second->ep);
    if (e == eps_.end()) continue;
    // UCX 1.13 withdraws a receive under way only with its sender's endpoint.
    LOG(WARNING) << "UCX receive " << id << " still under way " << options_.cancel_grace.count()
                 << " ms after its cancel: closing its sender's endpoint " << op->second->ep;
    ForceClose(*e->second, Status::Aborted("UCX endpoint " + std::to_string(op->second->ep) +
                                           " closed to end a cancelled receive"));
  }
  auto next = cap;
  for (const auto* due : {&deadlines_, &cancelled_receives_}) {
    if (due->empty()) continue;
    next = std::min(
        next, std::chrono::duration_cast<std::chrono::milliseconds>(due->begin()->first - now) +
                  std::chrono::milliseconds(1));
  }
  return next;
}

Status UcxEngine::Impl::Init() {
  ucp_config_t* config = nullptr;
  KVPOOL_RETURN_IF_ERROR(
      KVPOOL_UCS_STATUS(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read"));
  auto modify = [&](const char* name, const std::string& value) -> Status {
    if (value.empty()) return Status::OK();
    return KVPOOL_UCS_STATUS(ucp_config_modify(config, name, value.c_str()),
                             std::string("ucp_config_modify ") + name + "=" + value);
  };
  Status st = modify("TLS", options_.transports);
  if (st.ok()) st = modify("NET_DEVICES", options_.net_devices);
  if (st.ok() && !options_.tcp_port_range.empty() && std::getenv("UCX_TCP_PORT_RANGE") == nullptr) {
    // UCX only warns about a range it cannot parse (and uses any port): check it here.
    unsigned low = 0, high = 0;
    char end = 0;
    if (std::sscanf(options_.tcp_port_range.c_str(), "%u-%u%c", &low, &high, &end) != 2 ||
        low == 0 || low > high || high > 65535) {
      st = Status::InvalidArgument("UCX tcp port range '" + options_.tcp_port_range +
                                   "' is not LOW-HIGH with 0 < LOW <= HIGH <= 65535");
    } else {
      st = modify("PORT_RANGE", options_.tcp_port_range);
    }
  }
  if (st.ok() && options_.keepalive_interval.count() > 0) {
    st = modify("KEEPALIVE_INTERVAL", std::to_string(options_.keepalive_interval.count()) + "ms");
  }
  // UCT settings go by their names without the transport's prefix (ucp_config_modify keeps
  // them for the transports that have them); "TCP_TX_SEG_SIZE" would be accepted and ignored.
  if (st.ok() && options_.tcp_receive_segment_bytes > 0 &&
      std::getenv("UCX_TCP_TX_SEG_SIZE") == nullptr &&
      std::getenv("UCX_TCP_RX_SEG_SIZE") == nullptr) {
    st = modify("RX_SEG_SIZE", std::to_string(options_.tcp_receive_segment_bytes));
  }
  if (st.ok()) {
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    params.features = UCP_FEATURE_TAG | UCP_FEATURE_STREAM | UCP_FEATURE_WAKEUP;
    params.mt_workers_shared = 0;
    st = KVPOOL_UCS_STATUS(ucp_init(&params, config, &context_), "ucp_init");
  }
  ucp_config_release(config);
  KVPOOL_RETURN_IF_ERROR(st);

  // The client id a listener sees in this worker's connection requests: random (a CSPRNG's),
  // so nobody else can send requests under it (UcxEngine::client_id).
  while (client_id_ == 0) {
    // 8 bytes come whole once the kernel's pool is ready; until then a signal can cut the wait.
    const ssize_t got = getrandom(&client_id_, sizeof(client_id_), 0);
    if (got < 0 && errno == EINTR) continue;
    if (got != sizeof(client_id_)) {
      client_id_ = 0;
      return Status::Unavailable(std::string("getrandom for the UCX client id: ") +
                                 std::strerror(errno));
    }
  }
  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_CLIENT_ID;
  wparams.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the progress thread touches UCX
  wparams.client_id = client_id_;
  st = KVPOOL_UCS_STATUS(ucp_worker_create(context_, &wparams, &worker_), "ucp_worker_create");
  if (!st.ok()) return Status::Unavailable(st.message());

  ucp_address_t* addr = nullptr;
  size_t addr_len = 0;
  KVPOOL_RETURN_IF_ERROR(KVPOOL_UCS_STATUS(ucp_worker_get_address(worker_, &addr, &addr_len),
                                           "ucp_worker_get_address"));
  address_.assign(reinterpret_cast<const char*>(addr), addr_len);
  ucp_worker_release_address(worker_, addr);

  transports_ =
      ExtractTransports(PrintToString([&](FILE* f) { ucp_context_print_info(context_, f); }));

  KVPOOL_RETURN_IF_ERROR(
      KVPOOL_UCS_STATUS(ucp_worker_get_efd(worker_, &ucp_efd_), "ucp_worker_get_efd"));
  KVPOOL_RETURN_IF_ERRNO(wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC), wake_fd_ < 0,
                         "eventfd");
  KVPOOL_RETURN_IF_ERRNO(epoll_fd_ = epoll_create1(EPOLL_CLOEXEC), epoll_fd_ < 0, "epoll_create1");
  for (int fd : {ucp_efd_, wake_fd_}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    int rc;
    KVPOOL_RETURN_IF_ERRNO(rc = epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev), rc < 0, "epoll_ctl");
  }
  return Status::OK();
}

void UcxEngine::Impl::Start() {
  thread_ = StartThread(ThreadRole::kUcxProgress, options_.thread_index, [this] {
    thread_id_.store(std::this_thread::get_id());
    ProgressLoop();
  });
  // Make OnProgressThread() exact from the first public call on.
  while (thread_id_.load() == std::thread::id()) std::this_thread::yield();
}

void UcxEngine::Impl::Stop() {
  if (!thread_.joinable()) return;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  thread_.join();
}

UcxEngine::Impl::~Impl() {
  Stop();
  // Only reached without a thread if Init failed part-way.
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

void UcxEngine::Impl::Post(Command cmd) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      queue_.push_back(std::move(cmd));
      cmd.abort = nullptr;
    }
  }
  if (cmd.abort) {  // the engine is stopping: nothing will run it
    cmd.abort();
    return;
  }
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

bool UcxEngine::Impl::RunQueued() {
  std::deque<Command> batch;
  {
    absl::MutexLock lock(&mu_);
    batch.swap(queue_);
  }
  for (auto& cmd : batch) cmd.run();
  return !batch.empty();
}

void UcxEngine::Impl::ProgressLoop() {
  using Clock = std::chrono::steady_clock;
  auto last_work = Clock::now();
  epoll_event events[2];
  while (true) {
    bool stopping;
    {
      absl::MutexLock lock(&mu_);
      stopping = stopping_;
    }
    if (stopping) break;
    bool worked = RunQueued();
    while (ucp_worker_progress(worker_) != 0) worked = true;
    ReapCloses();
    const std::chrono::milliseconds next_deadline = ExpireDeadlines(std::chrono::milliseconds(100));
    auto now = Clock::now();
    if (worked) {
      last_work = now;
      continue;
    }
    if (now - last_work < options_.spin_before_sleep) continue;
    ucs_status_t st = ucp_worker_arm(worker_);
    if (st == UCS_ERR_BUSY) continue;  // events pending: progress again
    // A 100 ms cap keeps the loop alive should a transport miss a wake-up; a send's deadline
    // may come sooner.
    int n = epoll_wait(epoll_fd_, events, 2, static_cast<int>(next_deadline.count()));
    for (int i = 0; i < n; ++i) {
      if (events[i].data.fd == wake_fd_) {
        uint64_t v;
        (void)!read(wake_fd_, &v, sizeof(v));
      }
    }
    last_work = Clock::now();  // spin a little after every wake-up
  }
  Shutdown();
}

void UcxEngine::Impl::Shutdown() {
  // Commands that never ran: report them aborted.
  std::deque<Command> left;
  {
    absl::MutexLock lock(&mu_);
    left.swap(queue_);
  }
  for (auto& cmd : left) cmd.abort();
  DoStopListening();

  // Cancel receives; force-close endpoints, which completes their sends with CANCELED.
  std::vector<UcxOpId> ids;
  for (auto& [id, op] : ops_) ids.push_back(id);
  for (UcxOpId id : ids) {
    auto it = ops_.find(id);
    if (it != ops_.end() && !it->second->is_send) ucp_request_cancel(worker_, it->second->request);
  }
  for (auto& [id, e] : eps_) ForceClose(*e, Status::Aborted("UCX engine shut down"));

  auto give_up = std::chrono::steady_clock::now() + options_.shutdown_grace;
  while ((!ops_.empty() || !closing_.empty()) && std::chrono::steady_clock::now() < give_up) {
    ucp_worker_progress(worker_);
    ReapCloses();
  }
  if (!ops_.empty() || !closing_.empty()) {
    LOG(WARNING) << "UCX engine: " << ops_.size() << " operations and " << closing_.size()
                 << " endpoint closes did not finish within " << options_.shutdown_grace.count()
                 << " ms of shutdown; destroying the worker under them";
  }
  for (void* req : closing_) ucp_request_free(req);
  closing_.clear();
  // Operations that UCX did not complete: destroy the worker first (nothing writes into their
  // buffers after that), then report them.
  std::vector<Op*> stuck;
  for (auto& [id, op] : ops_) stuck.push_back(op);
  ops_.clear();
  for (Op* op : stuck) {
    op->orphaned = true;
    ucp_request_free(op->request);
    op->request = nullptr;
  }
  ucp_worker_destroy(worker_);
  worker_ = nullptr;
  ucp_cleanup(context_);
  context_ = nullptr;
  for (Op* op : stuck) {
    Status st = Status::Aborted("UCX engine shut down");
    if (op->is_send)
      op->send_done(st);
    else
      op->recv_done(st, 0);
    delete op;
  }
  eps_.clear();
}

void UcxEngine::Impl::ReapCloses() {
  std::vector<UcxEndpointId> failed;
  failed.swap(failed_eps_);
  for (UcxEndpointId id : failed) {
    auto it = eps_.find(id);
    if (it != eps_.end()) ForceClose(*it->second, it->second->failed);
  }
  for (size_t i = 0; i < closing_.size();) {
    if (ucp_request_check_status(closing_[i]) != UCS_INPROGRESS) {
      ucp_request_free(closing_[i]);
      closing_[i] = closing_.back();
      closing_.pop_back();
    } else {
      ++i;
    }
  }
}

void UcxEngine::Impl::ErrorCallback(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* e = static_cast<Endpoint*>(arg);
  Status why = KVPOOL_UCS_STATUS(status, "UCX endpoint " + std::to_string(e->id) + " failed");
  if (why.code() != StatusCode::kUnavailable && why.code() != StatusCode::kAborted) {
    why = Status::Unavailable(why.message());
  }
  LOG(WARNING) << why.ToString();
  // UCX fails the endpoint's outstanding requests; the endpoint must still be closed (force) to
  // be released, which the progress loop does outside this callback.
  if (e->failed.ok()) e->failed = std::move(why);
  e->impl->failed_eps_.push_back(e->id);
  e->impl->MarkFailed(e->id);
}

void UcxEngine::Impl::MarkFailed(UcxEndpointId id) {
  absl::MutexLock lock(&failed_mu_);
  failed_ids_.insert(id);
}

void UcxEngine::Impl::ForceClose(Endpoint& e, Status why) {
  if (e.ep == nullptr) return;
  if (e.failed.ok()) e.failed = std::move(why);
  MarkFailed(e.id);
  ucp_ep_h ep = e.ep;
  e.ep = nullptr;
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  void* req = ucp_ep_close_nbx(ep, &param);
  if (UCS_PTR_IS_PTR(req)) closing_.push_back(req);
  CancelReceivesFrom(e.id);
}

void UcxEngine::Impl::CancelReceivesFrom(UcxEndpointId ep) {
  // Receives that wait for this endpoint's messages: none can come now. (One already under way
  // ended with the close.)
  std::vector<UcxOpId> waiting;
  for (const auto& [id, op] : ops_) {
    if (!op->is_send && op->ep == ep && op->request != nullptr) waiting.push_back(id);
  }
  for (UcxOpId id : waiting) {
    auto it = ops_.find(id);  // an earlier cancel may have completed it
    if (it != ops_.end() && it->second->request != nullptr) {
      ucp_request_cancel(worker_, it->second->request);
    }
  }
}

Result<UcxEndpointId> UcxEngine::Impl::CreateEndpoint(ucp_ep_params_t& params, const char* what) {
  auto e = std::make_unique<Endpoint>();
  e->impl = this;
  e->id = next_ep_id_++;
  params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &ErrorCallback;
  params.err_handler.arg = e.get();
  ucp_ep_h ep = nullptr;
  Status st = KVPOOL_UCS_STATUS(ucp_ep_create(worker_, &params, &ep), what);
  if (!st.ok()) {
    if (st.code() == StatusCode::kInternal) return Status::InvalidArgument(st.message());
    return st;
  }
  e->ep = ep;
  UcxEndpointId id = e->id;
  eps_.emplace(id, std::move(e));
  return id;
}

Result<UcxEndpointId> UcxEngine::Impl::DoConnect(const std::string& address) {
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
  params.address = reinterpret_cast<const ucp_address_t*>(address.data());
  return CreateEndpoint(params, "ucp_ep_create");
}

Result<UcxEndpointId> UcxEngine::Impl::DoConnectTo(const sockaddr_storage& addr, socklen_t len) {
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_FLAGS;
  params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER | UCP_EP_PARAMS_FLAGS_SEND_CLIENT_ID;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
  params.sockaddr.addrlen = len;
  return CreateEndpoint(params, "ucp_ep_create (to a listener)");
}

void UcxEngine::Impl::ConnectionRequest(ucp_conn_request_h request, void* arg) {
  auto* impl = static_cast<Impl*>(arg);
  ucp_conn_request_attr_t attr{};
  attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
  std::string peer_ip;
  if (ucp_conn_request_query(request, &attr) == UCS_OK) {
    peer_ip = IpOf(reinterpret_cast<const sockaddr*>(&attr.client_address));
  }
  // Read only when `admit` asks: UCX parses the request's own data for it (see Listen).
  const ClientIdOf client_id = [request] {
    ucp_conn_request_attr_t id{};
    id.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ID;
    return ucp_conn_request_query(request, &id) == UCS_OK ? id.client_id : uint64_t{0};
  };
  if (impl->listener_ == nullptr || peer_ip.empty() || !impl->admit_(peer_ip, client_id)) {
    VLOG(1) << "UCX: connection request from " << (peer_ip.empty() ? "?" : peer_ip) << " refused";
    if (impl->listener_ != nullptr) ucp_listener_reject(impl->listener_, request);
    return;
  }
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
  params.conn_request = request;
  Result<UcxEndpointId> ep = impl->CreateEndpoint(params, "ucp_ep_create (accepting)");
  if (!ep.ok()) {
    // UCX has consumed the request either way.
    LOG(WARNING) << "UCX: a connection to the listener was not accepted: "
                 << ep.status().ToString();
    return;
  }
  impl->on_accept_(*ep, peer_ip);
}

Result<uint16_t> UcxEngine::Impl::DoListen(
    const sockaddr_storage& addr, socklen_t len, AdmitFn admit,
    std::function<void(UcxEndpointId, const std::string&)> on_accept) {
  if (listener_ != nullptr) return Status::FailedPrecondition("this UCX engine already listens");
  admit_ = std::move(admit);
  on_accept_ = std::move(on_accept);
  ucp_listener_params_t params{};
  params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
  params.sockaddr.addrlen = len;
  params.conn_handler.cb = &ConnectionRequest;
  params.conn_handler.arg = this;
  Status st =
      KVPOOL_UCS_STATUS(ucp_listener_create(worker_, &params, &listener_), "ucp_listener_create");
  if (!st.ok()) {
    listener_ = nullptr;
    return Status::Unavailable(st.message());
  }
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  st = KVPOOL_UCS_STATUS(ucp_listener_query(listener_, &attr), "ucp_listener_query");
  if (!st.ok()) {
    DoStopListening();  // a port nobody would be told of must not stay open
    return st;
  }
  const auto* sa = reinterpret_cast<const sockaddr*>(&attr.sockaddr);
  if (sa->sa_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(sa)->sin_port);
  return ntohs(reinterpret_cast<const sockaddr_in6*>(sa)->sin6_port);
}

void UcxEngine::Impl::DoStopListening() {
  if (listener_ != nullptr) ucp_listener_destroy(listener_);
  listener_ = nullptr;
  admit_ = nullptr;
  on_accept_ = nullptr;  // (and what they hold)
}

void UcxEngine::Impl::DoDisconnect(UcxEndpointId id) {
  auto it = eps_.find(id);
  if (it == eps_.end()) return;
  Endpoint& e = *it->second;
  // A receive still naming it (one under way from a stopped peer) ends only with a forced close.
  bool receiving = false;
  for (const auto& [op_id, op] : ops_) receiving |= !op->is_send && op->ep == id;
  if (e.ep != nullptr) {
    ucp_request_param_t param{};
    if (!e.failed.ok() || receiving) {
      param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    }
    void* req = ucp_ep_close_nbx(e.ep, &param);
    if (UCS_PTR_IS_PTR(req)) closing_.push_back(req);
    e.ep = nullptr;
  }
  if (e.failed.ok()) e.failed = Status::Aborted("UCX endpoint " + std::to_string(id) + " closed");
  CancelReceivesFrom(id);
  // The error callback's arg is this Endpoint; UCX does not call it after close, so it may go.
  eps_.erase(it);
  absl::MutexLock lock(&failed_mu_);
  failed_ids_.erase(id);
}

void UcxEngine::Impl::SendCallback(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<Op*>(user_data);
  ucp_request_free(request);
  op->request = nullptr;
  op->impl->Complete(op, KVPOOL_UCS_STATUS(status, "UCX tagged send"), 0);
}

void UcxEngine::Impl::ReceiveCallback(void* request, ucs_status_t status,
                                      const ucp_tag_recv_info_t* info, void* user_data) {
  auto* op = static_cast<Op*>(user_data);
  size_t len = (status == UCS_OK && info != nullptr) ? info->length : 0;
  ucp_request_free(request);
  op->request = nullptr;
  Status st = KVPOOL_UCS_STATUS(status, "UCX tagged receive");
  if (status == UCS_ERR_MESSAGE_TRUNCATED) {
    st = Status::ResourceExhausted(st.message() + " (message longer than the buffer)");
  }
  op->impl->Complete(op, std::move(st), len);
}

void UcxEngine::Impl::Complete(Op* op, Status st, size_t len) {
  if (!op->orphaned) ops_.erase(op->id);
  if (!st.ok() && !op->is_send && op->ep != 0) {
    // A receive whose sender's endpoint failed or was closed: that is why (Unavailable for a
    // peer gone, Aborted for our own close).
    auto it = eps_.find(op->ep);
    if (it != eps_.end() && !it->second->failed.ok()) {
      const Status& why = it->second->failed;
      st = Status(why.code(), st.message() + " (" + why.message() + ")");
    }
  }
  if (!st.ok() && st.code() != StatusCode::kAborted) {
    // A send whose endpoint failed: report the endpoint's reason (peer gone) as Unavailable.
    if (op->is_send) {
      auto it = eps_.find(op->ep);
      if (it != eps_.end() && !it->second->failed.ok()) {
        st = Status::Unavailable(st.message() + " (" + it->second->failed.message() + ")");
      }
    }
    if (st.code() == StatusCode::kInternal) st = Status::Unavailable(st.message());
  }
  if (op->orphaned) return;  // reported by Shutdown after the worker is gone
  if (op->is_send) {
    op->send_done(std::move(st));
  } else {
    size_t received = st.ok() ? len : 0;
    op->recv_done(std::move(st), received);
  }
  delete op;
}

void UcxEngine::Impl::RegisterSend(UcxOpId id, UcxEndpointId ep, std::function<void(Status)> done,
                                   ucp_request_param_t* param) {
  auto* op = new Op;
  op->impl = this;
  op->id = id;
  op->ep = ep;
  op->is_send = true;
  op->send_done = std::move(done);
  param->op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param->cb.send = &SendCallback;
  param->user_data = op;
  // Registered before posting: UCX may complete the request inside the call.
  ops_.emplace(id, op);
}

UcxEngine::Impl::Endpoint* UcxEngine::Impl::UsableEndpoint(
    UcxEndpointId ep, const std::function<void(Status)>& fail) {
  auto it = eps_.find(ep);
  if (it == eps_.end()) {
    fail(Status::NotFound("UCX endpoint " + std::to_string(ep) + " is not connected"));
    return nullptr;
  }
  if (it->second->ep == nullptr) {
    fail(Status::Unavailable("UCX endpoint " + std::to_string(ep) +
                             " failed: " + it->second->failed.message()));
    return nullptr;
  }
  return it->second.get();
}

void UcxEngine::Impl::DoSendStream(UcxOpId id, UcxEndpointId ep, const void* data, size_t len,
                                   std::function<void(Status)> done) {
  Endpoint* e = UsableEndpoint(ep, done);
  if (e == nullptr) return;
  ucp_request_param_t param{};
  RegisterSend(id, ep, std::move(done), &param);
  void* req = ucp_stream_send_nbx(e->ep, data, len, &param);
  Posted(id, req, "ucp_stream_send_nbx");
}

void UcxEngine::Impl::StreamReceiveCallback(void* request, ucs_status_t status, size_t length,
                                            void* user_data) {
  auto* op = static_cast<Op*>(user_data);
  ucp_request_free(request);
  op->request = nullptr;
  op->impl->Complete(op, KVPOOL_UCS_STATUS(status, "UCX stream receive"),
                     status == UCS_OK ? length : 0);
}

void UcxEngine::Impl::DoReceiveStream(UcxOpId id, UcxEndpointId ep, void* data, size_t len,
                                      std::function<void(Status, size_t)> done) {
  Endpoint* e = UsableEndpoint(ep, [&done](Status st) { done(std::move(st), 0); });
  if (e == nullptr) return;
  auto* op = new Op;
  op->impl = this;
  op->id = id;
  op->ep = ep;  // as a tagged receive's `from`: its failure or close ends this receive
  op->recv_done = std::move(done);
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_STREAM_RECV_FLAG_WAITALL;
  param.cb.recv_stream = &StreamReceiveCallback;
  param.user_data = op;
  ops_.emplace(id, op);
  size_t received = 0;
  void* req = ucp_stream_recv_nbx(e->ep, data, len, &received, &param);
  if (req == nullptr) {
    // Bytes already there: UCX 1.13 copies them and returns at once, without the callback
    // (it ignores UCP_OP_ATTR_FLAG_NO_IMM_CMPL for streams), the length in `received`.
    auto it = ops_.find(id);
    if (it != ops_.end()) Complete(it->second, Status::OK(), received);
    return;
  }
  Posted(id, req, "ucp_stream_recv_nbx");
}

void UcxEngine::Impl::DoSend(UcxOpId id, UcxEndpointId ep, uint64_t tag, const void* data,
                             size_t len, std::function<void(Status)> done) {
  Endpoint* e = UsableEndpoint(ep, done);
  if (e == nullptr) return;
  ucp_request_param_t param{};
  RegisterSend(id, ep, std::move(done), &param);
  void* req = ucp_tag_send_nbx(e->ep, data, len, tag, &param);
  Posted(id, req, "ucp_tag_send_nbx");
}

void UcxEngine::Impl::Posted(UcxOpId id, void* req, const char* what) {
  auto it = ops_.find(id);
  if (it == ops_.end()) return;  // its callback already ran
  Op* op = it->second;
  if (UCS_PTR_IS_PTR(req)) {
    op->request = req;
    return;
  }
  // Completed at once (NULL: e.g. an eager send) or refused.
  Status st = req == nullptr ? Status::OK() : KVPOOL_UCS_STATUS(UCS_PTR_STATUS(req), what);
  Complete(op, std::move(st), 0);
}

void UcxEngine::Impl::DoReceive(UcxOpId id, uint64_t tag, void* data, size_t capacity,
                                std::function<void(Status, size_t)> done, UcxEndpointId from) {
  if (from != 0) {
    // Nothing can come from an endpoint that is gone.
    auto e = eps_.find(from);
    if (e == eps_.end()) {
      done(Status::NotFound("UCX endpoint " + std::to_string(from) + " is not connected"), 0);
      return;
    }
    if (e->second->ep == nullptr) {
      const Status& why = e->second->failed;
      done(Status(why.code(), "UCX endpoint " + std::to_string(from) + ": " + why.message()), 0);
      return;
    }
  }
  auto* op = new Op;
  op->impl = this;
  op->id = id;
  op->ep = from;
  op->recv_done = std::move(done);
  ucp_request_param_t param{};
  // NO_IMM_CMPL: a message already in the unexpected queue completes through the callback too,
  // so the received length has one path.
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  param.cb.recv = &ReceiveCallback;
  param.user_data = op;
  ops_.emplace(id, op);
  void* req = ucp_tag_recv_nbx(worker_, data, capacity, tag, kFullTagMask, &param);
  Posted(id, req, "ucp_tag_recv_nbx");
}

void UcxEngine::Impl::DoCancel(UcxOpId id) {
  auto it = ops_.find(id);
  if (it == ops_.end()) return;
  Op* op = it->second;
  bool is_send = op->is_send;
  UcxEndpointId ep = op->ep;
  ucp_request_cancel(worker_, op->request);  // may complete (and delete) op right here
  if (ops_.count(id) == 0) return;
  if (!is_send) {
    // Already receiving: it ends with its bytes, or by its sender's force-close after the grace.
    if (ep != 0)
      cancelled_receives_.emplace(std::chrono::steady_clock::now() + options_.cancel_grace, id);
    return;
  }
  // The send is still in flight (UCX 1.13 does not withdraw sends): close its endpoint, which
  // completes every send on it with CANCELED.
  auto e = eps_.find(ep);
  if (e != eps_.end()) {
    ForceClose(*e->second,
               Status::Aborted("UCX endpoint " + std::to_string(ep) + " closed to cancel a send"));
  }
}

Result<std::string> UcxEngine::Impl::DoEndpointTransports(UcxEndpointId id) {
  auto it = eps_.find(id);
  if (it == eps_.end()) return Status::NotFound("UCX endpoint " + std::to_string(id));
  if (it->second->ep == nullptr) {
    return Status::Unavailable("UCX endpoint failed: " + it->second->failed.message());
  }
  ucp_ep_h ep = it->second->ep;
  return ExtractTransports(PrintToString([&](FILE* f) { ucp_ep_print_info(ep, f); }));
}

// ---------------------------------------------------------------------------------------------

UcxEngine::UcxEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
UcxEngine::~UcxEngine() = default;  // Impl's destructor stops and joins

Result<std::unique_ptr<UcxEngine>> UcxEngine::Create(const UcxOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  KVPOOL_RETURN_IF_ERROR(impl->Init());
  impl->Start();
  return std::unique_ptr<UcxEngine>(new UcxEngine(std::move(impl)));
}

const std::string& UcxEngine::WorkerAddress() const { return impl_->address_; }

uint64_t UcxEngine::client_id() const { return impl_->client_id_; }
const std::string& UcxEngine::transports_in_use() const { return impl_->transports_; }

namespace {
// Runs `fn` on the progress thread (inline if already there) and waits for its result.
template <typename T, typename Fn>
Result<T> RunOnProgressThread(UcxEngine::Impl& impl, Fn fn) {
  if (impl.OnProgressThread()) return fn();
  struct State {
    absl::Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    std::optional<Result<T>> result ABSL_GUARDED_BY(mu);
  };
  auto state = std::make_shared<State>();
  auto finish = [state](Result<T> r) {
    absl::MutexLock lock(&state->mu);
    state->result.emplace(std::move(r));
    state->done = true;
  };
  impl.Post({[finish, fn] { finish(fn()); },
             [finish] { finish(Status::Aborted("UCX engine shut down")); }});
  absl::MutexLock lock(&state->mu);
  state->mu.Await(absl::Condition(&state->done));
  return std::move(*state->result);
}
}  // namespace

Result<UcxEndpointId> UcxEngine::Connect(std::string_view peer_worker_address) {
  if (peer_worker_address.empty()) return Status::InvalidArgument("empty UCX worker address");
  std::string address(peer_worker_address);
  Impl* impl = impl_.get();
  return RunOnProgressThread<UcxEndpointId>(*impl,
                                            [impl, address] { return impl->DoConnect(address); });
}

namespace {
// `host`:`port` as a socket address (the first getaddrinfo gives).
Status ResolveSocketAddress(std::string_view host, uint16_t port, bool passive,
                            sockaddr_storage* out, socklen_t* len) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* found = nullptr;
  const std::string name(host);
  const std::string service = std::to_string(port);
  int rc = getaddrinfo(name.c_str(), service.c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    if (found != nullptr) freeaddrinfo(found);
    return Status::InvalidArgument("cannot resolve \"" + name + "\" for UCX: " + gai_strerror(rc));
  }
  std::memcpy(out, found->ai_addr, found->ai_addrlen);
  *len = found->ai_addrlen;
  freeaddrinfo(found);
  return Status::OK();
}
}  // namespace

Result<uint16_t> UcxEngine::Listen(
    std::string_view ip, uint16_t port, AdmitFn admit,
    std::function<void(UcxEndpointId, const std::string&)> on_accept) {
  sockaddr_storage addr{};
  socklen_t len = 0;
  KVPOOL_RETURN_IF_ERROR(ResolveSocketAddress(ip, port, /*passive=*/true, &addr, &len));
  Impl* impl = impl_.get();
  return RunOnProgressThread<uint16_t>(*impl, [impl, addr, len, admit, on_accept] {
    return impl->DoListen(addr, len, admit, on_accept);
  });
}

void UcxEngine::StopListening() {
  Impl* impl = impl_.get();
  (void)RunOnProgressThread<bool>(*impl, [impl]() -> Result<bool> {
    impl->DoStopListening();
    return true;
  });
}

Result<UcxEndpointId> UcxEngine::ConnectTo(std::string_view host, uint16_t port) {
  sockaddr_storage addr{};
  socklen_t len = 0;
  KVPOOL_RETURN_IF_ERROR(ResolveSocketAddress(host, port, /*passive=*/false, &addr, &len));
  Impl* impl = impl_.get();
  return RunOnProgressThread<UcxEndpointId>(
      *impl, [impl, addr, len] { return impl->DoConnectTo(addr, len); });
}

bool UcxEngine::EndpointFailed(UcxEndpointId ep) const { return impl_->Failed(ep); }

void UcxEngine::Disconnect(UcxEndpointId ep) {
  Impl* impl = impl_.get();
  impl->Post({[impl, ep] { impl->DoDisconnect(ep); }, [] {}});
}

UcxOpId UcxEngine::SendTagged(UcxEndpointId ep, uint64_t tag, const void* data, size_t len,
                              std::function<void(Status)> done,
                              std::chrono::steady_clock::time_point deadline) {
  Impl* impl = impl_.get();
  UcxOpId id = impl->NextOpId();
  // Shared so that whichever of run/abort happens gets the callback.
  auto cb = std::make_shared<std::function<void(Status)>>(std::move(done));
  impl->Post({[impl, id, ep, tag, data, len, cb, deadline] {
                impl->DoSend(id, ep, tag, data, len, std::move(*cb));
                if (deadline != std::chrono::steady_clock::time_point::max()) {
                  impl->AddDeadline(id, deadline);
                }
              },
              [cb] { (*cb)(Status::Aborted("UCX engine shut down")); }});
  return id;
}

UcxOpId UcxEngine::ReceiveTagged(uint64_t tag, void* data, size_t capacity,
                                 std::function<void(Status, size_t)> done, UcxEndpointId from) {
  Impl* impl = impl_.get();
  UcxOpId id = impl->NextOpId();
  auto cb = std::make_shared<std::function<void(Status, size_t)>>(std::move(done));
  impl->Post({[impl, id, tag, data, capacity, cb, from] {
                impl->DoReceive(id, tag, data, capacity, std::move(*cb), from);
              },
              [cb] { (*cb)(Status::Aborted("UCX engine shut down"), 0); }});
  return id;
}

UcxOpId UcxEngine::SendStream(UcxEndpointId ep, const void* data, size_t len,
                              std::function<void(Status)> done) {
  Impl* impl = impl_.get();
  UcxOpId id = impl->NextOpId();
  auto cb = std::make_shared<std::function<void(Status)>>(std::move(done));
  impl->Post(
      {[impl, id, ep, data, len, cb] { impl->DoSendStream(id, ep, data, len, std::move(*cb)); },
       [cb] { (*cb)(Status::Aborted("UCX engine shut down")); }});
  return id;
}

void UcxEngine::Cancel(UcxOpId op) {
  Impl* impl = impl_.get();
  impl->Post({[impl, op] { impl->DoCancel(op); }, [] {}});
}

namespace {
struct SyncWait {
  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  Status status ABSL_GUARDED_BY(mu);
  size_t received ABSL_GUARDED_BY(mu) = 0;
};

// A receive's `done` that records its result in `w`.
std::function<void(Status, size_t)> RecordReceive(std::shared_ptr<SyncWait> w) {
  return [w](Status st, size_t n) {
    absl::MutexLock lock(&w->mu);
    w->status = std::move(st);
    w->received = n;
    w->done = true;
  };
}

// What a sync receive returns once `w` is done: the length; DeadlineExceeded ("`what` did not
// complete by its deadline") when the deadline's cancel ended it; else its error.
Result<size_t> ReceiveResult(SyncWait& w, bool expired, const std::string& what) {
  absl::MutexLock lock(&w.mu);
  if (w.status.ok()) return w.received;
  if (expired && w.status.code() == StatusCode::kAborted) {
    return Status::DeadlineExceeded(what + " did not complete by its deadline");
  }
  return w.status;
}

// Waits for `w` until `deadline`; then cancels `op` and waits until UCX let go of the buffer.
// Returns true if the deadline passed before completion.
bool WaitOrCancel(UcxEngine& engine, UcxOpId op, SyncWait& w,
                  std::chrono::steady_clock::time_point deadline) {
  absl::MutexLock lock(&w.mu);
  auto left = deadline - std::chrono::steady_clock::now();
  if (left > std::chrono::steady_clock::duration::zero() &&
      w.mu.AwaitWithTimeout(absl::Condition(&w.done), absl::FromChrono(left))) {
    return false;
  }
  if (w.done) return false;
  w.mu.Unlock();
  engine.Cancel(op);
  w.mu.Lock();
  // A receive already matched and streaming cannot be withdrawn: it ends when its bytes arrive,
  // UCX declares the sender dead (error handling PEER + keepalive), or the engine force-closes
  // the sender's endpoint (a receive with `from`, UcxOptions::cancel_grace after the cancel).
  // Its buffer is the caller's, so we must wait for that.
  int waited_s = 0;
  while (!w.mu.AwaitWithTimeout(absl::Condition(&w.done), absl::Seconds(5))) {
    waited_s += 5;
    LOG(WARNING) << "UCX operation " << op << " still releasing its buffer " << waited_s
                 << " s after its deadline";
  }
  return true;
}
}  // namespace

Status UcxEngine::SendTaggedSync(UcxEndpointId ep, uint64_t tag, const void* data, size_t len,
                                 std::chrono::steady_clock::time_point deadline) {
  if (impl_->OnProgressThread()) {
    return Status::FailedPrecondition("UcxEngine::SendTaggedSync on the UCX progress thread");
  }
  auto w = std::make_shared<SyncWait>();
  UcxOpId op = SendTagged(ep, tag, data, len, [w](Status st) {
    absl::MutexLock lock(&w->mu);
    w->status = std::move(st);
    w->done = true;
  });
  bool expired = WaitOrCancel(*this, op, *w, deadline);
  absl::MutexLock lock(&w->mu);
  if (expired && (w->status.code() == StatusCode::kAborted || w->status.ok())) {
    if (w->status.ok()) return Status::OK();  // finished while being cancelled
    return Status::DeadlineExceeded("UCX tagged send of " + std::to_string(len) +
                                    " bytes did not complete by its deadline");
  }
  return w->status;
}

Result<size_t> UcxEngine::ReceiveTaggedSync(uint64_t tag, void* data, size_t capacity,
                                            std::chrono::steady_clock::time_point deadline,
                                            UcxEndpointId from) {
  if (impl_->OnProgressThread()) {
    return Status::FailedPrecondition("UcxEngine::ReceiveTaggedSync on the UCX progress thread");
  }
  auto w = std::make_shared<SyncWait>();
  const UcxOpId op = ReceiveTagged(tag, data, capacity, RecordReceive(w), from);
  const bool expired = WaitOrCancel(*this, op, *w, deadline);
  return ReceiveResult(*w, expired, "UCX tagged receive (tag " + std::to_string(tag) + ")");
}

Result<size_t> UcxEngine::ReceiveStreamSync(UcxEndpointId ep, void* data, size_t len,
                                            std::chrono::steady_clock::time_point deadline) {
  if (impl_->OnProgressThread()) {
    return Status::FailedPrecondition("UcxEngine::ReceiveStreamSync on the UCX progress thread");
  }
  auto w = std::make_shared<SyncWait>();
  Impl* impl = impl_.get();
  const UcxOpId op = impl->NextOpId();
  auto done = RecordReceive(w);
  impl->Post({[impl, op, ep, data, len, done] { impl->DoReceiveStream(op, ep, data, len, done); },
              [done] { done(Status::Aborted("UCX engine shut down"), 0); }});
  // Past the deadline the cancel does nothing to a stream receive; the close of `ep` a grace
  // later ends it (DoCancel).
  const bool expired = WaitOrCancel(*this, op, *w, deadline);
  return ReceiveResult(*w, expired, "UCX stream receive of " + std::to_string(len) + " bytes");
}

Result<std::string> UcxEngine::EndpointTransports(UcxEndpointId ep) {
  Impl* impl = impl_.get();
  return RunOnProgressThread<std::string>(*impl,
                                          [impl, ep] { return impl->DoEndpointTransports(ep); });
}

UcxEngine::BulkOp UcxEngine::bulk_op() const { return BulkOp::kTagged; }

}  // namespace kvpool::transport
