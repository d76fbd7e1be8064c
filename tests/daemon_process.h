#pragma once
// DaemonProcess: a real kvpoold child process on a temp dir and socket, for cross-process
// tests. Start() waits until the socket answers; Stop() sends SIGTERM and waits; Kill() is
// kill -9. The data dir survives Stop/Kill so a test can restart on the same state, and is
// removed by the destructor.
//
// Thread safety: one test thread.

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <kvpool/client.h>

namespace kvpool::testing {

// A fresh directory under $TMPDIR (or /tmp), removed recursively by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

class DaemonProcess {
 public:
  // `extra_flags` are appended to the defaults (--data-dir, --socket, --host-capacity=64MiB,
  // --host-segment-size=1MiB, --disk-capacity=1GiB, --lock-memory=false, --metrics-listen off).
  explicit DaemonProcess(std::vector<std::string> extra_flags = {});
  ~DaemonProcess();

  // Starts kvpoold and waits (up to 20 s) until a client can say hello. Aborts the test on
  // failure with the daemon's log.
  void Start();
  // SIGTERM and wait; returns the exit status.
  int Stop();
  // SIGKILL and wait.
  void Kill();
  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }

  const std::string& socket_path() const { return socket_; }
  const std::string& data_dir() const { return data_dir_; }
  std::string log() const;  // the daemon's stderr so far

  ClientOptions Options(const std::string& ns = "test") const;
  std::unique_ptr<Client> Connect(const std::string& ns = "test") const;

  void set_flags(std::vector<std::string> extra) { extra_ = std::move(extra); }

 private:
  TempDir dir_;
  std::string data_dir_;
  std::string socket_;
  std::string log_path_;
  std::vector<std::string> extra_;
  pid_t pid_ = -1;
};

// Stats of `client`'s daemon once `done(stats)` holds, or the last ones after `timeout`. For
// state that settles asynchronously (leases end when a fire-and-forget RELEASE, a closed
// connection or a finished UCX send is processed).
DaemonStats WaitForStats(Client& client, const std::function<bool(const DaemonStats&)>& done,
                         std::chrono::milliseconds timeout = std::chrono::seconds(5));

// Deterministic bytes for a block: `size` bytes from a PRNG seeded by `seed`.
std::vector<uint8_t> BlockBytes(uint64_t seed, size_t size);

// A token sequence of `n` tokens from `seed`.
std::vector<int32_t> Tokens(uint64_t seed, size_t n);

inline constexpr const char* kTestLayout =
    "model=test;dtype=bf16;layers=2;kv_heads=2;head_dim=64;tokens_per_block=16;tp_rank=0;"
    "tp_size=1;encoding=raw";

}  // namespace kvpool::testing
