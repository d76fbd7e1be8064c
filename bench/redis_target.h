#pragma once
// Redis as kvpool-bench's peer (system "redis", path "tcp"): the same blocks SET and GET through
// hiredis over loopback TCP, the way LMCache's Redis backend stores KV chunks (one plain SET /
// GET of a chunk's bytes per key; LMCache also keeps a small "<key>metadata" key per chunk,
// which costs it one more round trip a get and is left out here, in Redis's favour).
//
// One redisContext per bench thread, in one of two modes, both measured so the bench can set
// kvpool beside Redis at its best for each figure (pipelining large values can make Redis
// slower, not faster): path "tcp", a call's blocks (the bench's batch of 16) pipelined (every
// SET or GET appended, binary-safe %b, then the replies read in order), and path "tcp1", one
// command per round trip. A GET copies the reply into the caller's buffer (hiredis hands back
// its own string), as any Redis client must. Redis has no chain lookup, so Lookup is
// Unimplemented and the bench skips it.
//
// RedisServer starts a redis-server of the bench's own on a free 127.0.0.1 port, with no
// persistence, protected mode and noeviction (a store that runs out fails the run instead of
// dropping blocks silently); it is stopped (SIGTERM, then SIGKILL) when destroyed, and gets
// SIGTERM if the bench dies first.
//
// Thread safety: see bench/bench_target.h (one target per thread); RedisServer from one thread.

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "bench/bench_target.h"
#include "tests/support/temp_dir.h"

namespace kvpool::bench {

struct RedisServerOptions {
  std::string binary = "redis-server";
  uint64_t maxmemory_bytes = 0;  // 0: Redis's default (no limit)
  std::vector<int> cpus;         // empty: not pinned
};

class RedisServer {
 public:
  // Starts redis-server and waits until it answers PING. NotFound without the binary,
  // Unavailable (with the tail of its log) when it exits or does not answer within 10 s.
  static Result<std::unique_ptr<RedisServer>> Start(const RedisServerOptions& options);
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  const std::string& host() const { return host_; }
  int port() const { return port_; }
  // "Redis 7.0.15 on 127.0.0.1:PORT (maxmemory ..., no persistence)".
  const std::string& description() const { return description_; }
  // SIGTERM, wait (SIGKILL after 10 s), remove the temp directory.
  Status Stop();

 private:
  RedisServer(pid_t pid, testing::TempDir dir, int port)
      : pid_(pid), dir_(std::move(dir)), port_(port) {}
  std::string LogTail() const;

  pid_t pid_ = -1;
  testing::TempDir dir_;
  std::string host_ = "127.0.0.1";
  int port_ = 0;
  std::string description_;
};

class RedisSystem : public BenchSystem {
 public:
  // `host` must be a loopback address (127.0.0.0/8, localhost or ::1): the bench measures
  // loopback only and never sends its blocks to another machine.
  static Result<std::unique_ptr<RedisSystem>> Create(std::string host, int port,
                                                     bool pipelined = true);
  // "HOST:PORT" -> host, port; InvalidArgument when malformed or not loopback.
  static Status ParseAddress(const std::string& address, std::string* host, int* port);

  // BenchSystem
  std::string system() const override { return "redis"; }
  // "tcp": pipelined; "tcp1": one command per round trip.
  std::string path() const override { return pipelined_ ? "tcp" : "tcp1"; }
  Result<std::unique_ptr<BenchTarget>> NewTarget(int thread_index) override;
  // DEL of every key, pipelined.
  Status Drop(std::span<const BlockKey> keys) override;
  // Redis has no host arena: `known` false.
  Result<ArenaStats> Arena() override { return ArenaStats{}; }

  // Redis's own name and version (INFO server), for the output.
  const std::string& version() const { return version_; }

 private:
  RedisSystem(std::string host, int port, bool pipelined)
      : host_(std::move(host)), port_(port), pipelined_(pipelined) {}
  const std::string host_;
  const int port_;
  const bool pipelined_;
  std::string version_;
};

// The Redis key a block is stored under (what LMCache's "<key>kv_bytes" is to it).
std::string RedisKey(const BlockKey& key);

}  // namespace kvpool::bench
