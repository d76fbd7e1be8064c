#pragma once
// kvpool through its C++ client (include/kvpool/client.h), on one explicit data path:
//
//   socket: block bytes travel inside the control frames over the Unix socket. A put copies
//           them into the kernel and the daemon copies them out into its host arena; a get the
//           same the other way: two copies of every byte, plus the xxh3 checksum passes.
//   shm:    the client copies straight between its buffers and the daemon's shared-memory
//           arena (reserve/commit for puts, slot + lease for gets); only control frames cross
//           the socket. One copy of every byte, plus the checksum passes.
//   ucx:    the client connects to the daemon's TCP listener (tcp://127.0.0.1:PORT) and block
//           bytes travel as UCX tagged messages over UCX's tcp transport on the loopback device
//           (ucx_transports "tcp", ucx_net_devices "lo"), straight from and into the caller's
//           buffers and the daemon's arena; control frames use the TCP connection.
//
// Every connection is checked to be on the path it is labelled with (ServerInfo), so a figure
// can never be reported under the wrong path when the client's automatic choice changes.
//
// A bench thread keeps its connection from phase to phase, as an engine's worker keeps one client
// for its life (unless `fresh_connections`): a client maps each host segment once, ~4 ms per
// 64 MiB on the VM of docs/BENCHMARKS.md, and a fresh client per phase would pay that again in
// every put phase, which stores only the working set and so is mostly first touches.
//
// Thread safety: see bench/bench_target.h (one target per thread).

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "bench/bench_target.h"

namespace kvpool::bench {

class KvpoolSystem : public BenchSystem {
 public:
  // `address` as in ClientOptions::address (tcp://127.0.0.1:PORT for kUcx); `namespace_name` is
  // the tenant the bench acts for; `data_path` kSocket, kSharedMemory or kUcx.
  // `busy_poll`: ClientOptions::busy_poll of every connection. `fresh_connections`: connect anew
  // for every phase instead of keeping each thread's connection.
  KvpoolSystem(std::string address, std::string namespace_name, DataPath data_path,
               std::chrono::microseconds busy_poll = std::chrono::microseconds(0),
               bool fresh_connections = false);
  ~KvpoolSystem() override;

  // "socket", "shm" or "ucx" (InvalidArgument otherwise).
  static Result<DataPath> ParsePath(const std::string& name);

  // BenchSystem
  std::string system() const override { return "kvpool"; }
  std::string path() const override;
  Result<std::unique_ptr<BenchTarget>> NewTarget(int thread_index) override;
  Status Drop(std::span<const BlockKey> keys) override;
  Result<ArenaStats> Arena() override;
  bool lends_in_place() const override { return data_path_ == DataPath::kSharedMemory; }

 private:
  friend class KvpoolTarget;

  Status EnsureAdmin();
  // A thread's connection back from its target, for its next phase.
  void Keep(int thread_index, std::unique_ptr<Client> client);

  const std::string address_;
  const std::string namespace_name_;
  const DataPath data_path_;
  const std::chrono::microseconds busy_poll_;
  const bool fresh_connections_;
  std::unique_ptr<Client> admin_;  // for Drop and Arena; main thread only
  std::mutex idle_mu_;
  std::map<int, std::unique_ptr<Client>> idle_;  // by thread index, between phases
};

}  // namespace kvpool::bench
