#include "tests/support/etcd_test_server.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "daemon/cluster/etcd_client.h"

namespace kvpool::testing {

using daemon::cluster::EtcdClient;
using daemon::cluster::EtcdOptions;

namespace {

// The end of etcd's log, for a failure message (the temp dir goes with the server).
std::string LogTail(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  if (text.size() > 1500) text = "..." + text.substr(text.size() - 1500);
  return text;
}

}  // namespace

std::string EtcdTestServer::BinaryPath() {
  const char* env = ::getenv("KVPOOL_ETCD");
  return env != nullptr && *env != '\0' ? env : "/usr/bin/etcd";
}

Result<std::unique_ptr<EtcdTestServer>> EtcdTestServer::Start() {
  const std::string binary = BinaryPath();
  if (::access(binary.c_str(), X_OK) != 0) {
    return Status::NotFound("no etcd binary at " + binary +
                            " (apt-get install etcd-server, or set KVPOOL_ETCD)");
  }
  std::unique_ptr<EtcdTestServer> server(new EtcdTestServer());
  if (!server->dir_.ok()) return server->dir_.status();
  server->client_port_ = FreeLoopbackPort();
  server->peer_port_ = FreeLoopbackPort();
  if (server->client_port_ == 0 || server->peer_port_ == 0) {
    return Status::Unavailable("no free loopback port");
  }
  KVPOOL_RETURN_IF_ERROR(server->Launch());
  return server;
}

EtcdTestServer::~EtcdTestServer() { Kill(); }  // then dir_ removes the data

std::string EtcdTestServer::endpoint() const {
  return "etcd://127.0.0.1:" + std::to_string(client_port_);
}

void EtcdTestServer::Kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
}

Status EtcdTestServer::Restart(bool wipe) {
  Kill();
  if (wipe) {
    std::error_code ec;
    std::filesystem::remove_all(dir_.Join("data"), ec);
    if (ec) return Status::IoError("wiping etcd data: " + ec.message());
  }
  return Launch();
}

Status EtcdTestServer::Launch() {
  const std::string client = "http://127.0.0.1:" + std::to_string(client_port_);
  const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
  const std::string log = dir_.Join("etcd-" + std::to_string(launches_++) + ".log");
  std::vector<std::string> args = {BinaryPath(),
                                   "--name=kvpool-test",
                                   "--data-dir=" + dir_.Join("data"),
                                   "--listen-client-urls=" + client,
                                   "--advertise-client-urls=" + client,
                                   "--listen-peer-urls=" + peer,
                                   "--initial-advertise-peer-urls=" + peer,
                                   "--initial-cluster=kvpool-test=" + peer,
                                   "--initial-cluster-state=new"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return Status::FromErrno(errno, "fork etcd");
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::close(fd);
    }
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  pid_ = pid;
  // Ready when a read through the gateway succeeds.
  EtcdOptions options;
  options.request_timeout = std::chrono::milliseconds(300);
  auto probe = EtcdClient::Create(endpoint(), options);
  if (!probe.ok()) return probe.status();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  Status last;
  while (std::chrono::steady_clock::now() < deadline) {
    auto r = (*probe)->Get("/kvpool-test-probe");
    if (r.ok()) return Status::OK();
    last = r.status();
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return Status::Unavailable("etcd exited at start (status " + std::to_string(status) +
                                 "); its log:\n" + LogTail(log));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return Status::Unavailable("etcd did not answer within 15 s (" + last.ToString() +
                             "); its log:\n" + LogTail(log));
}

}  // namespace kvpool::testing
