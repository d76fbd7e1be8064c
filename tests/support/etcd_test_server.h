#pragma once
// EtcdTestServer: a real single-node etcd for tests, on free loopback ports, with its data in a
// fresh temp dir. Kill() SIGKILLs it (as a crash would); Restart() starts it again on the same
// data dir and ports. The destructor kills it and removes the dir. The child dies with the test
// process (PR_SET_PDEATHSIG), so a crashed test leaves no etcd behind.
//
// The binary is $KVPOOL_ETCD, else /usr/bin/etcd (Debian's etcd-server). Listens on 127.0.0.1
// only.
//
// Thread safety: one thread.
// Ownership: owns the child process and its temp dir.

#include <sys/types.h>

#include <memory>
#include <string>

#include "common/status.h"
#include "tests/support/loopback.h"  // FreeLoopbackPort, which its users also call
#include "tests/support/temp_dir.h"

namespace kvpool::testing {

class EtcdTestServer {
 public:
  // NotFound when there is no etcd binary; Unavailable (with the reason and its log) when it
  // does not come up.
  static Result<std::unique_ptr<EtcdTestServer>> Start();
  ~EtcdTestServer();

  // "etcd://127.0.0.1:PORT"
  std::string endpoint() const;
  uint16_t client_port() const { return client_port_; }
  // SIGKILL and reap.
  void Kill();
  // Starts again on the same ports, on the same data dir or (wipe) an empty one; waits until
  // it answers.
  Status Restart(bool wipe = false);
  // The binary tests run, for skip messages.
  static std::string BinaryPath();

 private:
  EtcdTestServer() = default;
  Status Launch();

  TempDir dir_{"kvpool-etcd"};
  uint16_t client_port_ = 0;
  uint16_t peer_port_ = 0;
  pid_t pid_ = -1;
  int launches_ = 0;
};

}  // namespace kvpool::testing
