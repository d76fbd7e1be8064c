#include "tests/support/daemon_process.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <thread>

namespace kvpool::testing {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

uint64_t FileSize(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

std::vector<std::string> TestFlags(std::vector<std::string> extra) {
  std::vector<std::string> flags = {"--host_capacity=64MiB", "--host_segment_size=1MiB",
                                    "--disk_capacity=1GiB",  "--lock_memory=false",
                                    "--io_threads=2",        "--worker_threads=8"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return flags;
}

DaemonProcessOptions TestOptions(std::vector<std::string> extra) {
  // UCX (daemon and test clients alike) stays on loopback TCP: tests never use another address.
  ::setenv("UCX_TLS", "tcp", /*overwrite=*/0);
  ::setenv("UCX_NET_DEVICES", "lo", /*overwrite=*/0);
  DaemonProcessOptions o;
  o.flags = TestFlags(std::move(extra));
  o.start_timeout = std::chrono::seconds(20);
  o.dir_prefix = "kvpool-test";
  return o;
}

}  // namespace

std::string DefaultKvpooldPath() {
  const char* env = std::getenv("KVPOOL_KVPOOLD");
  if (env != nullptr && *env != '\0') return env;
#ifdef KVPOOL_KVPOOLD_PATH
  return KVPOOL_KVPOOLD_PATH;
#else
  return "kvpoold";
#endif
}

DaemonProcess::DaemonProcess(std::vector<std::string> extra_flags)
    : DaemonProcess(TestOptions(std::move(extra_flags))) {}

DaemonProcess::DaemonProcess(DaemonProcessOptions options)
    : options_(std::move(options)), dir_(options_.dir_prefix) {
  if (options_.binary.empty()) options_.binary = DefaultKvpooldPath();
  data_dir_ = dir_.Join("data");
  socket_ = dir_.Join("kvpool.sock");
  log_path_ = dir_.Join("kvpoold.log");
}

DaemonProcess::~DaemonProcess() { Kill(); }  // then dir_ removes the data

Result<std::unique_ptr<DaemonProcess>> DaemonProcess::Launch(DaemonProcessOptions options) {
  auto d = std::make_unique<DaemonProcess>(std::move(options));
  KVPOOL_RETURN_IF_ERROR(d->Start());
  return d;
}

Status DaemonProcess::Start() {
  if (pid_ > 0) return Status::FailedPrecondition("kvpoold is already running");
  if (!dir_.ok()) return dir_.status();
  const DaemonProcessOptions& o = options_;
  if (::access(o.binary.c_str(), X_OK) != 0) {
    return Status::NotFound("kvpoold not found at '" + o.binary + "'");
  }
  std::vector<std::string> args = {o.binary, "--data_dir=" + data_dir_, "--socket=" + socket_};
  if (o.listen_tcp_loopback) {
    args.insert(args.end(),
                {"--listen=tcp://127.0.0.1:0", "--ucx_transports=tcp", "--ucx_net_devices=lo"});
  }
  args.insert(args.end(), o.flags.begin(), o.flags.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : o.cpus) CPU_SET(c, &set);
  log_offset_ = FileSize(log_path_);
  tcp_.clear();
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return Status::FromErrno(errno, "fork");
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    const int fd = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      ::dup2(fd, STDOUT_FILENO);
      ::dup2(fd, STDERR_FILENO);
      ::close(fd);
    }
    if (!o.cpus.empty() && ::sched_setaffinity(0, sizeof(set), &set) != 0) ::_exit(126);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  pid_ = pid;

  const auto deadline = std::chrono::steady_clock::now() + o.start_timeout;
  Status last = Status::Unavailable("not tried");
  while (std::chrono::steady_clock::now() < deadline) {
    int wstatus = 0;
    if (::waitpid(pid_, &wstatus, WNOHANG) == pid_) {
      pid_ = -1;
      return Status::Unavailable("kvpoold exited during startup (wait status " +
                                 std::to_string(wstatus) + "); its log:\n" + LogTail());
    }
    if (::access(socket_.c_str(), F_OK) == 0) {
      ClientOptions co;
      co.address = socket_;
      co.timeout = std::chrono::milliseconds(2000);
      co.client_name = "kvpool-probe";
      co.data_path = DataPath::kSocket;
      auto c = Client::Connect(co);
      // A refusal is an answer too (a daemon whose namespaces file declares who may connect).
      if (c.ok() || c.status().code() == StatusCode::kPermissionDenied) {
        if (!o.listen_tcp_loopback) return Status::OK();
        // The banner's first line: "kvpoold ID listening on unix:PATH and tcp://HOST:PORT"
        // (tls:// with a --tls_cert).
        const std::string b = Banner();
        size_t at = b.find(" and tcp://");
        if (at == std::string::npos) at = b.find(" and tls://");
        if (at != std::string::npos) {
          const size_t end = b.find_first_of(" \n", at + 5);
          tcp_ = b.substr(at + 5, end == std::string::npos ? std::string::npos : end - at - 5);
          if (tcp_.rfind("tcp://127.", 0) != 0 && tcp_.rfind("tls://127.", 0) != 0) {
            return Status::Internal("kvpoold's TCP listener is on " + tcp_ + ", not on loopback");
          }
          return Status::OK();
        }
        last = Status::Unavailable("no tcp:// address in the banner yet");
      } else {
        last = c.status();
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return Status::Unavailable("kvpoold did not answer within " +
                             std::to_string(o.start_timeout.count()) + " ms (" + last.ToString() +
                             "); its log:\n" + LogTail());
}

Status DaemonProcess::Stop(std::chrono::seconds timeout) {
  if (pid_ <= 0) return Status::OK();
  ::kill(pid_, SIGTERM);
  int wstatus = 0;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  pid_t r = 0;
  while ((r = ::waitpid(pid_, &wstatus, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  Status st;
  if (r == 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &wstatus, 0);
    st = Status::Internal("kvpoold did not stop within " + std::to_string(timeout.count()) +
                          " s of SIGTERM; killed it. Its log:\n" + LogTail());
  } else if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
    st = Status::Internal("kvpoold stopped with wait status " + std::to_string(wstatus) +
                          "; its log:\n" + LogTail());
  }
  pid_ = -1;
  return st;
}

void DaemonProcess::Kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
}

std::string DaemonProcess::log() const { return ReadFile(log_path_); }

std::string DaemonProcess::PrintedAddress(const std::string& scheme,
                                          std::chrono::milliseconds wait) const {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    // In the latest start's output, and only once the rest of its line is there too.
    const std::string all = log();
    const std::string s = log_offset_ <= all.size() ? all.substr(log_offset_) : all;
    const size_t at = s.find(scheme);
    const size_t end =
        at == std::string::npos ? std::string::npos : s.find_first_of(" \n/", at + scheme.size());
    if (end != std::string::npos) return s.substr(at, end - at);
    if (std::chrono::steady_clock::now() >= deadline) return "";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string DaemonProcess::ScrapeMetrics() const {
  const std::string url = PrintedAddress("http://");
  if (url.empty()) {
    std::fprintf(stderr, "no http:// address in kvpoold's log (--metrics_listen?)\n");
    return "";
  }
  // Python's urllib: no HTTP client library in the tests for one GET.
  const std::string cmd =
      "python3 -c \"import urllib.request,sys; "
      "sys.stdout.write(urllib.request.urlopen('" +
      url + "/metrics', timeout=5).read().decode())\"";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return "";
  std::string body;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) body.append(buf, n);
  pclose(p);
  return body;
}

std::string DaemonProcess::LogTail(size_t bytes) const {
  const std::string s = log();
  return s.size() <= bytes ? s : s.substr(s.size() - bytes);
}

std::string DaemonProcess::Banner() const {
  const std::string all = log();
  std::istringstream in(log_offset_ <= all.size() ? all.substr(log_offset_) : all);
  std::string out;
  std::string line;
  bool in_banner = false;
  while (std::getline(in, line)) {
    if (line.rfind("kvpoold ", 0) == 0) {
      in_banner = true;
    } else if (in_banner && line.rfind("  ", 0) != 0) {
      break;
    }
    if (in_banner) out += line + "\n";
  }
  return out;
}

ClientOptions DaemonProcess::Options(const std::string& ns) const {
  ClientOptions o;
  o.address = socket_;
  o.namespace_name = ns;
  o.client_name = "test";
  o.timeout = std::chrono::milliseconds(10000);
  if (const char* path = std::getenv("KVPOOL_TEST_DATA_PATH")) {
    if (std::string(path) == "socket") o.data_path = DataPath::kSocket;
    if (std::string(path) == "shm") o.data_path = DataPath::kSharedMemory;
  }
  return o;
}

std::unique_ptr<Client> DaemonProcess::Connect(const std::string& ns) const {
  auto c = Client::Connect(Options(ns));
  if (!c.ok()) {
    std::cerr << "connecting to kvpoold at " << socket_ << " (namespace " << ns
              << "): " << c.status().ToString() << "\n";
    return nullptr;
  }
  return std::move(*c);
}

DaemonStats WaitForStats(Client& client, const std::function<bool(const DaemonStats&)>& done,
                         std::chrono::milliseconds timeout) {
  DaemonStats last;
  const auto end = std::chrono::steady_clock::now() + timeout;
  do {
    auto s = client.Stats();
    if (!s.ok()) {
      std::cerr << "WaitForStats: " << s.status().ToString() << "\n";
      return last;
    }
    last = *s;
    if (done(last)) return last;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  } while (std::chrono::steady_clock::now() < end);
  return last;
}

uint64_t SeedOf(const BlockKey& key) {
  uint64_t seed;
  std::memcpy(&seed, key.bytes.data(), sizeof(seed));
  return seed;
}

uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : fallback;
}

std::vector<uint8_t> BlockBytes(uint64_t seed, size_t size) {
  std::vector<uint8_t> out(size);
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 1);
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    const uint64_t v = rng();
    std::memcpy(out.data() + i, &v, 8);
  }
  for (; i < size; ++i) out[i] = static_cast<uint8_t>(rng());
  return out;
}

std::vector<int32_t> Tokens(uint64_t seed, size_t n) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % 128000);
  return t;
}

}  // namespace kvpool::testing
