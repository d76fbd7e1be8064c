#pragma once
// kvpool through its control socket: the C++ client (include/kvpool/client.h) talking to a
// kvpoold over a Unix socket (or tcp://). Payloads cross the socket: a put copies the bytes into
// the kernel and the daemon copies them out into its host arena; a get does the same the other
// way. Two copies per byte, so the socket path is bounded by about half of memcpy bandwidth.
//
// Thread safety: see bench/bench_target.h (one KvpoolSocketTarget per thread).

#include <memory>
#include <string>

#include "bench/bench_target.h"

namespace kvpool::bench {

class KvpoolSocketSystem : public BenchSystem {
 public:
  // `address` as in ClientOptions::address; `namespace_name` is the tenant the bench acts for.
  KvpoolSocketSystem(std::string address, std::string namespace_name);

  // BenchSystem
  std::string system() const override { return "kvpool"; }
  std::string path() const override { return "socket"; }
  Result<std::unique_ptr<BenchTarget>> NewTarget(int thread_index) override;
  Status Drop(std::span<const BlockKey> keys) override;
  Result<ArenaStats> Arena() override;

 private:
  Status EnsureAdmin();

  const std::string address_;
  const std::string namespace_name_;
  std::unique_ptr<Client> admin_;  // for Drop and Arena; main thread only
};

}  // namespace kvpool::bench
