#pragma once
// A kvpoold that kvpool-bench starts for itself: on a fresh temp directory and Unix socket,
// with the host tier sized for the run, optionally pinned to some CPUs. Stop() (or the
// destructor) sends SIGTERM, waits, and removes the directory. The child also gets SIGTERM if
// the bench dies first (PR_SET_PDEATHSIG), so no daemon outlives a crashed run.
//
// Thread safety: use from one thread.

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <kvpool/status.h>

namespace kvpool::bench {

struct DaemonProcessOptions {
  std::string binary;                // path of kvpoold
  uint64_t host_capacity_bytes = 0;  // rounded up to whole 64 MiB segments
  std::vector<int> cpus;             // empty: not pinned
  // Also listen for control connections on TCP loopback (--listen=tcp://127.0.0.1:0), with the
  // UCX data path on the tcp transport and the loopback device only, for the ucx path.
  bool listen_tcp_loopback = false;
  std::vector<std::string> extra_flags;
  std::chrono::seconds start_timeout{60};  // mlocking a large arena takes a while
};

class DaemonProcess {
 public:
  // Starts kvpoold and waits until a client can connect. Unavailable (with the tail of the
  // daemon's log) when it exits or does not answer in time.
  static Result<std::unique_ptr<DaemonProcess>> Start(const DaemonProcessOptions& options);
  ~DaemonProcess();
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  const std::string& socket_path() const { return socket_; }
  // "tcp://127.0.0.1:PORT" from the banner with listen_tcp_loopback; empty otherwise.
  const std::string& tcp_address() const { return tcp_; }
  // The daemon's startup banner (what it printed on stdout: tiers, sizes, mlocked or not).
  std::string Banner() const;
  // SIGTERM, then wait (SIGKILL after 30 s). Internal when it did not exit with status 0.
  Status Stop();
  // The last `bytes` of the daemon's log.
  std::string LogTail(size_t bytes = 4000) const;

 private:
  DaemonProcess(pid_t pid, std::string dir) : pid_(pid), dir_(std::move(dir)) {
    socket_ = dir_ + "/kvpool.sock";
  }
  pid_t pid_ = -1;
  std::string dir_;
  std::string socket_;
  std::string tcp_;
};

}  // namespace kvpool::bench
