#include "tests/daemon_process.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

namespace kvpool::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/kvpool-test-XXXXXX";
  char* made = mkdtemp(tmpl.data());
  if (made == nullptr) {
    ADD_FAILURE() << "mkdtemp failed";
    return;
  }
  path_ = made;
}

TempDir::~TempDir() {
  std::error_code ec;
  if (!path_.empty()) std::filesystem::remove_all(path_, ec);
}

DaemonProcess::DaemonProcess(std::vector<std::string> extra_flags)
    : extra_(std::move(extra_flags)) {
  // UCX (daemon and test clients alike) stays on loopback TCP: tests never use another address.
  setenv("UCX_TLS", "tcp", /*overwrite=*/0);
  setenv("UCX_NET_DEVICES", "lo", /*overwrite=*/0);
  data_dir_ = dir_.path() + "/data";
  socket_ = dir_.path() + "/kvpool.sock";
  log_path_ = dir_.path() + "/kvpoold.log";
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) Kill();
}

void DaemonProcess::Start() {
  ASSERT_LE(pid_, 0) << "already running";
  std::vector<std::string> args = {
      KVPOOL_KVPOOLD_PATH,     "--data_dir=" + data_dir_,  "--socket=" + socket_,
      "--host_capacity=64MiB", "--host_segment_size=1MiB", "--disk_capacity=1GiB",
      "--lock_memory=false",   "--io_threads=2",           "--worker_threads=8"};
  for (const std::string& f : extra_) args.push_back(f);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0) << "fork failed";
  if (pid == 0) {
    const int fd = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  pid_ = pid;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      FAIL() << "kvpoold exited at start (status " << status << "):\n" << log();
    }
    ClientOptions o = Options("probe");
    o.timeout = std::chrono::milliseconds(500);
    auto c = Client::Connect(o);
    if (c.ok()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  FAIL() << "kvpoold did not answer within 20 s:\n" << log();
}

int DaemonProcess::Stop() {
  if (pid_ <= 0) return -1;
  kill(pid_, SIGTERM);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return status;
}

void DaemonProcess::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
}

std::string DaemonProcess::log() const {
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ClientOptions DaemonProcess::Options(const std::string& ns) const {
  ClientOptions o;
  o.address = socket_;
  o.namespace_name = ns;
  o.client_name = "test";
  o.timeout = std::chrono::milliseconds(10000);
  // CTest runs the same tests once per data path (tests/CMakeLists.txt).
  if (const char* path = std::getenv("KVPOOL_TEST_DATA_PATH")) {
    if (std::string(path) == "socket") o.data_path = DataPath::kSocket;
    if (std::string(path) == "shm") o.data_path = DataPath::kSharedMemory;
  }
  return o;
}

std::unique_ptr<Client> DaemonProcess::Connect(const std::string& ns) const {
  auto c = Client::Connect(Options(ns));
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(*c) : nullptr;
}

DaemonStats WaitForStats(Client& client, const std::function<bool(const DaemonStats&)>& done,
                         std::chrono::milliseconds timeout) {
  DaemonStats last;
  const auto end = std::chrono::steady_clock::now() + timeout;
  do {
    auto s = client.Stats();
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) return last;
    last = *s;
    if (done(last)) return last;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  } while (std::chrono::steady_clock::now() < end);
  return last;
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
