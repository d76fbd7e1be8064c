#include "bench/redis_target.h"

#include "bench/runner.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "bench/runner.h"
#include "tests/support/loopback.h"

namespace kvpool::bench {
namespace {

// A hiredis context's error as a Status, with the file and line that saw it.
#define KVPOOL_REDIS_ERROR(ctx, what)                                                            \
  ::kvpool::Status::Unavailable(std::string(what) + ": " +                                       \
                                ((ctx) == nullptr ? std::string("no context") : (ctx)->errstr) + \
                                " (" + __FILE__ + ":" + std::to_string(__LINE__) + ")")

struct ContextDeleter {
  void operator()(redisContext* c) const { redisFree(c); }
};
using ContextPtr = std::unique_ptr<redisContext, ContextDeleter>;

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

Result<ContextPtr> Connect(const std::string& host, int port, std::chrono::seconds timeout) {
  const timeval tv{static_cast<time_t>(timeout.count()), 0};
  ContextPtr c(redisConnectWithTimeout(host.c_str(), port, tv));
  if (c == nullptr || c->err) {
    return KVPOOL_REDIS_ERROR(c.get(),
                              "connecting to Redis at " + host + ":" + std::to_string(port));
  }
  // A 16 x 64 MiB pipeline through a loaded 2-core machine can take seconds; a hang must end.
  if (redisSetTimeout(c.get(), timeval{60, 0}) != REDIS_OK) {
    return KVPOOL_REDIS_ERROR(c.get(), "redisSetTimeout");
  }
  // hiredis frees its read buffer whenever it is empty and over 16 KiB (maxbuf), so every large
  // reply would grow it afresh; 0 keeps it (hiredis's documented knob; in Redis's favour).
  c->reader->maxbuf = 0;
  return c;
}

Result<ReplyPtr> NextReply(redisContext* c, const char* what) {
  void* r = nullptr;
  if (redisGetReply(c, &r) != REDIS_OK || r == nullptr) return KVPOOL_REDIS_ERROR(c, what);
  ReplyPtr reply(static_cast<redisReply*>(r));
  if (reply->type == REDIS_REPLY_ERROR) {
    return Status::Internal(std::string(what) + ": Redis answered " +
                            std::string(reply->str, reply->len));
  }
  return reply;
}

Result<ReplyPtr> Command(redisContext* c, const char* command) {
  if (redisAppendCommand(c, command) != REDIS_OK) return KVPOOL_REDIS_ERROR(c, command);
  return NextReply(c, command);
}

bool IsLoopback(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr a{};
  return inet_pton(AF_INET, host.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

class RedisTarget : public BenchTarget {
 public:
  // Pipelined: a call's commands are all sent before their replies are read; else one command
  // per round trip.
  RedisTarget(ContextPtr c, bool pipelined) : c_(std::move(c)), pipelined_(pipelined) {}

  // BenchTarget
  Status Put(std::span<const BenchBlock> blocks) override {
    for (size_t start = 0; start < blocks.size(); start += Window(blocks.size())) {
      const auto part =
          blocks.subspan(start, std::min(Window(blocks.size()), blocks.size() - start));
      for (const BenchBlock& b : part) {
        const std::string key = RedisKey(b.key);
        if (redisAppendCommand(c_.get(), "SET %b %b", key.data(), key.size(), b.data, b.size) !=
            REDIS_OK) {
          return KVPOOL_REDIS_ERROR(c_.get(), "SET of " + b.key.ShortHex());
        }
      }
      for (const BenchBlock& b : part) {
        KVPOOL_ASSIGN_OR_RETURN(ReplyPtr r, NextReply(c_.get(), "SET reply"));
        if (r->type != REDIS_REPLY_STATUS || std::string_view(r->str, r->len) != "OK") {
          return Status::Internal("SET of " + b.key.ShortHex() + " was not answered OK");
        }
      }
    }
    return Status::OK();
  }

  Status Get(std::span<const BlockKey> keys, std::span<const MutableBuffer> buffers,
             std::span<size_t> sizes) override {
    for (size_t start = 0; start < keys.size(); start += Window(keys.size())) {
      const size_t n = std::min(Window(keys.size()), keys.size() - start);
      KVPOOL_RETURN_IF_ERROR(
          GetSome(keys.subspan(start, n), buffers.subspan(start, n), sizes.subspan(start, n)));
    }
    return Status::OK();
  }

  Result<uint32_t> Lookup(std::span<const BlockKey>) override {
    return Status::Unimplemented("Redis has no chain lookup");
  }

 private:
  size_t Window(size_t batch) const { return pipelined_ ? std::max<size_t>(batch, 1) : 1; }

  // GETs of `keys` sent together, then their replies read in order.
  Status GetSome(std::span<const BlockKey> keys, std::span<const MutableBuffer> buffers,
                 std::span<size_t> sizes) {
    for (const BlockKey& k : keys) {
      const std::string key = RedisKey(k);
      if (redisAppendCommand(c_.get(), "GET %b", key.data(), key.size()) != REDIS_OK) {
        return KVPOOL_REDIS_ERROR(c_.get(), "GET of " + k.ShortHex());
      }
    }
    // Every reply is read even after a bad one, so the connection stays in step.
    Status first = Status::OK();
    for (size_t i = 0; i < keys.size(); ++i) {
      KVPOOL_ASSIGN_OR_RETURN(ReplyPtr r, NextReply(c_.get(), "GET reply"));
      if (!first.ok()) continue;
      if (r->type == REDIS_REPLY_NIL) {
        first = Status::NotFound("GET of " + keys[i].ShortHex() + ": no such key");
      } else if (r->type != REDIS_REPLY_STRING) {
        first = Status::Internal("GET of " + keys[i].ShortHex() + ": not a string reply");
      } else if (r->len > buffers[i].capacity) {
        first = Status::InvalidArgument("GET of " + keys[i].ShortHex() + ": " +
                                        std::to_string(r->len) + " bytes do not fit the buffer");
      } else {
        std::memcpy(buffers[i].data, r->str, r->len);
        sizes[i] = r->len;
      }
    }
    return first;
  }

  ContextPtr c_;
  const bool pipelined_;
};

}  // namespace

std::string RedisKey(const BlockKey& key) { return key.ToHex() + "kv_bytes"; }

// ---------------------------------------------------------------------------------------------
// RedisServer

Result<std::unique_ptr<RedisServer>> RedisServer::Start(const RedisServerOptions& o) {
  std::string binary = o.binary;
  if (binary.find('/') == std::string::npos) {
    // Look it up on PATH here, so that a missing server is NotFound and not a failed exec.
    const std::string found = FindOnPath(binary);
    if (found.empty()) {
      return Status::NotFound(binary + " not found on PATH (Debian: apt-get install redis-server)");
    }
    binary = found;
  } else if (access(binary.c_str(), X_OK) != 0) {
    return Status::NotFound(binary + " is not executable");
  }

  Status last = Status::Unavailable("not started");
  // The free port may be taken between our probe and redis's bind: try a few.
  for (int attempt = 0; attempt < 3; ++attempt) {
    testing::TempDir dir("kvpool-bench-redis");
    if (!dir.ok()) return dir.status();
    const std::string tmpl = dir.path();
    const int port = testing::FreeLoopbackPort();
    if (port == 0) return Status::Unavailable("no free loopback port for redis-server");
    std::vector<std::string> args = {
        binary,         "--port",    std::to_string(port),
        "--bind",       "127.0.0.1", "--protected-mode",
        "yes",          "--save",    "",
        "--appendonly", "no",        "--dir",
        tmpl,           "--logfile", tmpl + "/redis.log",
        "--daemonize",  "no",        "--maxmemory-policy",
        "noeviction",
    };
    if (o.maxmemory_bytes > 0) {
      args.push_back("--maxmemory");
      args.push_back(std::to_string(o.maxmemory_bytes));
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
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
      const int devnull = open("/dev/null", O_WRONLY);
      if (devnull >= 0) {
        dup2(devnull, STDOUT_FILENO);
        close(devnull);
      }
      if (!o.cpus.empty() && sched_setaffinity(0, sizeof(set), &set) != 0) _exit(126);
      execv(argv[0], argv.data());
      _exit(127);
    }
    std::unique_ptr<RedisServer> s(new RedisServer(pid, std::move(dir), port));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    bool exited = false;
    while (std::chrono::steady_clock::now() < deadline) {
      int wstatus = 0;
      if (waitpid(pid, &wstatus, WNOHANG) == pid) {
        s->pid_ = -1;
        exited = true;
        last = Status::Unavailable("redis-server exited during startup (status " +
                                   std::to_string(wstatus) + "); its log:\n" + s->LogTail());
        break;
      }
      Result<ContextPtr> c = Connect(s->host_, port, std::chrono::seconds(1));
      if (c.ok()) {
        Result<ReplyPtr> pong = Command(c->get(), "PING");
        if (pong.ok()) {
          s->description_ =
              "redis-server on 127.0.0.1:" + std::to_string(port) + " (" +
              (o.maxmemory_bytes ? "maxmemory " + std::to_string(o.maxmemory_bytes >> 20) + " MiB, "
                                 : std::string()) +
              "noeviction, no persistence)";
          return s;
        }
        last = pong.status();
      } else {
        last = c.status();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!exited) {
      return Status::Unavailable("redis-server did not answer PING within 10 s (" +
                                 last.ToString() + "); its log:\n" + s->LogTail());
    }
  }
  return last;
}

std::string RedisServer::LogTail() const {
  std::ifstream in(dir_.Join("redis.log"));
  std::ostringstream s;
  s << in.rdbuf();
  const std::string t = s.str();
  return t.size() <= 4000 ? t : t.substr(t.size() - 4000);
}

Status RedisServer::Stop() {
  Status st = Status::OK();
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    int wstatus = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    pid_t r = 0;
    while ((r = waitpid(pid_, &wstatus, WNOHANG)) == 0 &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (r == 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &wstatus, 0);
      st = Status::Internal("redis-server did not stop within 10 s of SIGTERM; killed it");
    }
    pid_ = -1;
  }
  dir_.Remove();
  return st;
}

RedisServer::~RedisServer() { (void)Stop(); }

// ---------------------------------------------------------------------------------------------
// RedisSystem

Status RedisSystem::ParseAddress(const std::string& address, std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return Status::InvalidArgument("--redis: expected HOST:PORT, got '" + address + "'");
  }
  *host = address.substr(0, colon);
  if (host->size() > 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  char* end = nullptr;
  const long p = std::strtol(address.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || p < 1 || p > 65535) {
    return Status::InvalidArgument("--redis: bad port in '" + address + "'");
  }
  *port = static_cast<int>(p);
  if (!IsLoopback(*host)) {
    return Status::InvalidArgument("--redis: " + *host +
                                   " is not a loopback address; the bench measures loopback only");
  }
  return Status::OK();
}

Result<std::unique_ptr<RedisSystem>> RedisSystem::Create(std::string host, int port,
                                                         bool pipelined) {
  if (!IsLoopback(host)) {
    return Status::InvalidArgument(host + " is not a loopback address");
  }
  std::unique_ptr<RedisSystem> s(new RedisSystem(std::move(host), port, pipelined));
  KVPOOL_ASSIGN_OR_RETURN(ContextPtr c, Connect(s->host_, s->port_, std::chrono::seconds(10)));
  KVPOOL_ASSIGN_OR_RETURN(ReplyPtr info, Command(c.get(), "INFO server"));
  if (info->type == REDIS_REPLY_STRING) {
    std::istringstream in(std::string(info->str, info->len));
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("redis_version:", 0) == 0) {
        s->version_ = "Redis " + line.substr(14);
        while (!s->version_.empty() && (s->version_.back() == '\r' || s->version_.back() == '\n'))
          s->version_.pop_back();
      }
    }
  }
  return s;
}

Result<std::unique_ptr<BenchTarget>> RedisSystem::NewTarget(int /*thread_index*/) {
  KVPOOL_ASSIGN_OR_RETURN(ContextPtr c, Connect(host_, port_, std::chrono::seconds(10)));
  return std::unique_ptr<BenchTarget>(new RedisTarget(std::move(c), pipelined_));
}

Status RedisSystem::Drop(std::span<const BlockKey> keys) {
  KVPOOL_ASSIGN_OR_RETURN(ContextPtr c, Connect(host_, port_, std::chrono::seconds(10)));
  constexpr size_t kStep = 1024;
  for (size_t start = 0; start < keys.size(); start += kStep) {
    const size_t n = std::min(kStep, keys.size() - start);
    for (size_t i = 0; i < n; ++i) {
      const std::string key = RedisKey(keys[start + i]);
      if (redisAppendCommand(c.get(), "DEL %b", key.data(), key.size()) != REDIS_OK) {
        return KVPOOL_REDIS_ERROR(c.get(), "DEL");
      }
    }
    for (size_t i = 0; i < n; ++i) {
      KVPOOL_RETURN_IF_ERROR(NextReply(c.get(), "DEL reply").status());
    }
  }
  return Status::OK();
}

}  // namespace kvpool::bench
