#pragma once
// DaemonProcess: a real kvpoold child process on a fresh temp dir and Unix socket, for the
// cross-process tests in tests/ and for the benchmarks in bench/ that start their own daemon.
//
// Start() waits until a client can say hello (and, with listen_tcp_loopback, until the banner
// names the TCP address); Stop() sends SIGTERM and waits; Kill() is kill -9. The data dir
// survives Stop and Kill, so a test can restart on the same state; the destructor kills a
// running daemon and removes the dir. The child gets SIGKILL when the thread that started it
// ends (PR_SET_PDEATHSIG), so no daemon outlives a crashed test or bench: start it from a thread
// that lives as long as the daemon should (the test's or the bench's main thread).
//
// No gtest here (bench links it): errors come back as Status, and tests turn them into failures
// (tests/support/status_matchers.h).
//
// Thread safety: one thread drives the process; Options() and the accessors may be called from
// any thread while it runs.
// Ownership: owns the child process and the temp dir.

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <kvpool/client.h>

#include "common/status.h"
#include "tests/support/temp_dir.h"

namespace kvpool::testing {

struct DaemonProcessOptions {
  // Declared, so that DaemonProcess d({"--flag"}) means the test constructor's flags, not these
  // options built from a braced list.
  DaemonProcessOptions() = default;

  // The kvpoold binary. Default: the one this build tree built (DefaultKvpooldPath()).
  std::string binary;
  // Flags after --data_dir and --socket, which point into the temp dir. A later flag wins over
  // an earlier one of the same name. Default: none (kvpoold's own defaults).
  std::vector<std::string> flags;
  // Also listen for control connections on TCP loopback (--listen=tcp://127.0.0.1:0), with the
  // UCX data path on the tcp transport and the loopback device only; Start() then waits for the
  // TCP address in the banner (tcp_address()). Default: false.
  bool listen_tcp_loopback = false;
  // CPUs the daemon is pinned to. Default: empty (not pinned).
  std::vector<int> cpus;
  // How long Start() waits for the daemon to answer (mlocking a large arena takes a while).
  // Default: 60 s.
  std::chrono::milliseconds start_timeout{60000};
  // The temp dir's name prefix. Default: "kvpool-daemon".
  std::string dir_prefix = "kvpool-daemon";
};

class DaemonProcess {
 public:
  // For tests: the build tree's kvpoold with small test defaults (--host_capacity=64MiB,
  // --host_segment_size=1MiB, --disk_capacity=1GiB, --lock_memory=false, --io_threads=2,
  // --worker_threads=8), then `extra_flags`. UCX (daemon and test clients alike) stays on
  // loopback TCP.
  explicit DaemonProcess(std::vector<std::string> extra_flags = {});
  explicit DaemonProcess(DaemonProcessOptions options);
  ~DaemonProcess();
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  // Constructs and starts one (kvpool-bench's use).
  static Result<std::unique_ptr<DaemonProcess>> Launch(DaemonProcessOptions options);

  // Starts kvpoold and waits until a client can say hello. NotFound without the binary;
  // FailedPrecondition when already running; Unavailable, with the daemon's log, when it exits
  // or does not answer within start_timeout.
  [[nodiscard]] Status Start();
  // SIGTERM, then wait (SIGKILL after `timeout`). Internal, with the log, when it did not exit
  // with status 0 or had to be killed. OK when not running.
  [[nodiscard]] Status Stop(std::chrono::seconds timeout = std::chrono::seconds(30));
  // SIGKILL and wait.
  void Kill();
  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }

  const std::string& socket_path() const { return socket_; }
  const std::string& data_dir() const { return data_dir_; }
  // "tcp://127.0.0.1:PORT" with listen_tcp_loopback, once started ("tls://..." when its flags
  // give a --tls_cert); empty otherwise.
  const std::string& tcp_address() const { return tcp_; }
  // The daemon's stdout and stderr so far, over all its starts.
  std::string log() const;
  // The first address the latest start's log names with `scheme` ("tcp://", "http://"), up to
  // the next space, newline or path, waiting up to `wait` for it to be printed (a listener may log
  // its address after the Unix socket Start() waits for answers). Empty if none came in time.
  std::string PrintedAddress(const std::string& scheme,
                             std::chrono::milliseconds wait = std::chrono::seconds(10)) const;
  // The last `bytes` of log().
  std::string LogTail(size_t bytes = 4000) const;
  // The Prometheus text its /metrics serves (its flags must give --metrics_listen); empty, after
  // printing why to stderr, when there is none.
  std::string ScrapeMetrics() const;
  // The startup banner of the latest start (tiers, sizes, mlocked or not).
  std::string Banner() const;

  // Client options for this daemon: namespace `ns`, a 10 s timeout, and the data path
  // $KVPOOL_TEST_DATA_PATH names ("socket" or "shm"; CTest runs some suites once per path).
  ClientOptions Options(const std::string& ns = "test") const;
  // A connected client, or null after printing why to stderr (tests assert it is not null).
  std::unique_ptr<Client> Connect(const std::string& ns = "test") const;

  // Replaces the flags after --data_dir and --socket for the next Start().
  void set_flags(std::vector<std::string> flags) { options_.flags = std::move(flags); }

 private:
  DaemonProcessOptions options_;
  TempDir dir_;
  std::string data_dir_;
  std::string socket_;
  std::string log_path_;
  std::string tcp_;
  size_t log_offset_ = 0;  // where the latest start's output begins in the log
  pid_t pid_ = -1;
};

// The kvpoold of this build tree (set by tests/support/CMakeLists.txt), or $KVPOOL_KVPOOLD when
// set.
std::string DefaultKvpooldPath();

// Stats of `client`'s daemon once `done(stats)` holds, or the last ones after `timeout` (an error
// from Stats is printed to stderr and ends the wait). For state that settles asynchronously
// (leases end when a fire-and-forget RELEASE, a closed connection or a finished UCX send is
// processed).
DaemonStats WaitForStats(Client& client, const std::function<bool(const DaemonStats&)>& done,
                         std::chrono::milliseconds timeout = std::chrono::seconds(5));

// Deterministic bytes for a block: `size` bytes from a PRNG seeded by `seed`.
std::vector<uint8_t> BlockBytes(uint64_t seed, size_t size);
// The seed of a block whose bytes follow from its key alone (its first 8 bytes), so any reader
// can check any block: BlockBytes(SeedOf(key), size).
uint64_t SeedOf(const BlockKey& key);

// A test's size knob from the environment (e.g. KVPOOL_CRASH_CYCLES): `fallback` when unset.
uint64_t EnvOr(const char* name, uint64_t fallback);

// A token sequence of `n` tokens from `seed`.
std::vector<int32_t> Tokens(uint64_t seed, size_t n);

inline constexpr const char* kTestLayout =
    "model=test;dtype=bf16;layers=2;kv_heads=2;head_dim=64;tokens_per_block=16;tp_rank=0;"
    "tp_size=1;encoding=raw";

}  // namespace kvpool::testing
