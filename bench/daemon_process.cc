#include "bench/daemon_process.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <kvpool/client.h>

namespace kvpool::bench {
namespace {

constexpr uint64_t kSegment = 64ull << 20;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

Result<std::unique_ptr<DaemonProcess>> DaemonProcess::Start(const DaemonProcessOptions& o) {
  if (access(o.binary.c_str(), X_OK) != 0) {
    return Status::NotFound("kvpoold not found at '" + o.binary + "' (pass --kvpoold PATH)");
  }
  std::string tmpl = (std::filesystem::temp_directory_path() / "kvpool-bench-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) return Status::FromErrno(errno, "mkdtemp");
  const std::string dir = tmpl;

  const uint64_t segments =
      std::max<uint64_t>(1, (o.host_capacity_bytes + kSegment - 1) / kSegment);
  std::vector<std::string> args = {
      o.binary,
      "--data_dir=" + dir + "/data",
      "--socket=" + dir + "/kvpool.sock",
      "--host_capacity=" + std::to_string(segments * 64) + "MiB",
      "--host_segment_size=64MiB",
      // The disk tier only has to exist: the host tier is sized so nothing is demoted.
      "--disk_capacity=1GiB",
      // Nothing here is worth keeping; writing the arena to RocksDB at exit would only be slow.
      "--flush_on_shutdown=false",
  };
  if (o.listen_tcp_loopback) {
    args.insert(args.end(),
                {"--listen=tcp://127.0.0.1:0", "--ucx_transports=tcp", "--ucx_net_devices=lo"});
  }
  args.insert(args.end(), o.extra_flags.begin(), o.extra_flags.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string log = dir + "/kvpoold.log";

  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : o.cpus) CPU_SET(c, &set);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return Status::FromErrno(errno, "fork");
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      close(fd);
    }
    if (!o.cpus.empty() && sched_setaffinity(0, sizeof(set), &set) != 0) _exit(126);
    execv(argv[0], argv.data());
    _exit(127);
  }
  std::unique_ptr<DaemonProcess> d(new DaemonProcess(pid, dir));

  const auto deadline = std::chrono::steady_clock::now() + o.start_timeout;
  Status last = Status::Unavailable("not tried");
  while (std::chrono::steady_clock::now() < deadline) {
    int wstatus = 0;
    if (waitpid(pid, &wstatus, WNOHANG) == pid) {
      d->pid_ = -1;
      return Status::Unavailable("kvpoold exited during startup (status " +
                                 std::to_string(wstatus) + "); its log:\n" + d->LogTail());
    }
    if (access(d->socket_.c_str(), F_OK) == 0) {
      ClientOptions co;
      co.address = d->socket_;
      co.timeout = std::chrono::milliseconds(2000);
      co.client_name = "kvpool-bench-probe";
      co.data_path = DataPath::kSocket;
      auto c = Client::Connect(co);
      if (c.ok()) {
        if (!o.listen_tcp_loopback) return d;
        // The banner's first line: "kvpoold ID listening on unix:PATH and tcp://HOST:PORT".
        const std::string b = d->Banner();
        const size_t at = b.find(" and tcp://");
        if (at != std::string::npos) {
          const size_t end = b.find_first_of(" \n", at + 5);
          d->tcp_ = b.substr(at + 5, end == std::string::npos ? std::string::npos : end - at - 5);
          if (d->tcp_.rfind("tcp://127.", 0) != 0) {
            return Status::Internal("kvpoold's TCP listener is on " + d->tcp_ +
                                    ", not on loopback; the bench measures loopback only");
          }
          return d;
        }
        last = Status::Unavailable("no tcp:// address in the banner yet");
      } else {
        last = c.status();
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return Status::Unavailable("kvpoold did not answer within " +
                             std::to_string(o.start_timeout.count()) + " s (" + last.ToString() +
                             "); its log:\n" + d->LogTail());
}

std::string DaemonProcess::Banner() const {
  std::string out;
  std::istringstream in(ReadFile(dir_ + "/kvpoold.log"));
  std::string line;
  bool in_banner = false;
  while (std::getline(in, line)) {
    if (line.rfind("kvpoold ", 0) == 0)
      in_banner = true;
    else if (in_banner && line.rfind("  ", 0) != 0)
      break;
    if (in_banner) out += line + "\n";
  }
  return out;
}

std::string DaemonProcess::LogTail(size_t bytes) const {
  const std::string s = ReadFile(dir_ + "/kvpoold.log");
  return s.size() <= bytes ? s : s.substr(s.size() - bytes);
}

Status DaemonProcess::Stop() {
  Status st = Status::OK();
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    int wstatus = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    pid_t r = 0;
    while ((r = waitpid(pid_, &wstatus, WNOHANG)) == 0 &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (r == 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &wstatus, 0);
      st = Status::Internal("kvpoold did not stop within 30 s of SIGTERM; killed it");
    } else if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
      st = Status::Internal("kvpoold stopped with wait status " + std::to_string(wstatus) +
                            "; its log:\n" + LogTail());
    }
    pid_ = -1;
  }
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    dir_.clear();
  }
  return st;
}

DaemonProcess::~DaemonProcess() { (void)Stop(); }

}  // namespace kvpool::bench
