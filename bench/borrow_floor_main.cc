// kvpool-borrow-floor: where the time of a same-node in-place read (Client::Borrow, issue 13's
// "per 16 blocks" figure) goes. A kvpoold of its own and one shared-memory client, both busy
// polling and pinned to different CPUs, time calls that add one thing at a time:
//   lookup of 1 key        one round trip and the least a request does;
//   lookup of 16 keys      plus finding 16 keys;
//   borrow 1 + release     plus a lease, its slot in the answer, the view and the release;
//   borrow 16 + release    the figure itself;
//   get 16                 the same blocks copied into the caller's buffers (and hashed).
// beside a 64-byte round trip over a socketpair between the same two CPUs, the machine's floor
// (kvpool-pingpong). Each row is the median (and p90, p99) of --calls calls after as many
// untimed ones. Nothing here asserts a time. Figures in docs/BENCHMARKS.md.

#include <gflags/gflags.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <kvpool/client.h>

#include "bench/bench_daemon.h"
#include "bench/pinning.h"
#include "common/units.h"

DEFINE_string(kvpoold, "", "kvpoold binary (default: the build tree's).");
DEFINE_uint32(calls, 20000, "Timed calls per row.");
DEFINE_string(block_size, "4KiB", "Bytes per block.");
DEFINE_uint32(busy_poll_us, 50, "Busy-poll window of the client and of kvpoold's I/O threads.");
DEFINE_int32(daemon_cpu, 0, "CPU of kvpoold (and of the socketpair's answering thread).");
DEFINE_int32(bench_cpu, 1, "CPU of the client (and of the socketpair's asking thread).");

namespace kvpool {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kBlocks = 16;

struct Row {
  double p50 = 0, p90 = 0, p99 = 0;
};

// `fn` timed FLAGS_calls times after FLAGS_calls untimed calls; false from `fn` stops it.
Result<Row> Time(const std::function<bool()>& fn) {
  std::vector<double> us;
  us.reserve(FLAGS_calls);
  for (uint32_t r = 0; r < 2 * FLAGS_calls; ++r) {
    const Clock::time_point t0 = Clock::now();
    if (!fn()) return Status::Internal("a call failed");
    if (r >= FLAGS_calls) {
      us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
  }
  std::sort(us.begin(), us.end());
  return Row{us[us.size() / 2], us[us.size() * 9 / 10], us[us.size() * 99 / 100]};
}

// A 64-byte round trip over a socketpair, the answering thread on the daemon's CPU; both spin.
Result<Row> SocketpairRoundTrip() {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return Status::FromErrno(errno, "socketpair");
  const uint32_t total = 2 * FLAGS_calls;
  std::thread echo([&] {
    bench::PinThisThread({FLAGS_daemon_cpu}).IgnoreError();
    char buf[64];
    for (uint32_t i = 0; i < total; ++i) {
      size_t got = 0;
      while (got < sizeof(buf)) {
        const ssize_t n = recv(sv[1], buf + got, sizeof(buf) - got, MSG_DONTWAIT);
        if (n > 0) got += static_cast<size_t>(n);
        if (n == 0) return;
      }
      if (send(sv[1], buf, sizeof(buf), 0) != sizeof(buf)) return;
    }
  });
  char buf[64] = {};
  Result<Row> row = Time([&] {
    if (send(sv[0], buf, sizeof(buf), 0) != sizeof(buf)) return false;
    size_t got = 0;
    while (got < sizeof(buf)) {
      const ssize_t n = recv(sv[0], buf + got, sizeof(buf) - got, MSG_DONTWAIT);
      if (n > 0) got += static_cast<size_t>(n);
      if (n == 0) return false;
    }
    return true;
  });
  close(sv[0]);  // ends the echo thread if it waits
  echo.join();
  close(sv[1]);
  return row;
}

Status Run() {
  KVPOOL_ASSIGN_OR_RETURN(const uint64_t block, ParseBytes(FLAGS_block_size));
  if (FLAGS_calls == 0 || block == 0) return Status::InvalidArgument("--calls, --block_size > 0");
  bench::DaemonProcessOptions d = bench::BenchDaemonOptions(
      bench::FindKvpoold(FLAGS_kvpoold), 64ull << 20,
      {"--io_busy_poll_us=" + std::to_string(FLAGS_busy_poll_us), "--ucx=false"});
  d.cpus = {FLAGS_daemon_cpu};
  d.dir_prefix = "kvpool-borrow-floor";
  KVPOOL_ASSIGN_OR_RETURN(std::unique_ptr<bench::DaemonProcess> daemon,
                          bench::DaemonProcess::Launch(d));
  KVPOOL_RETURN_IF_ERROR(bench::PinThisThread({FLAGS_bench_cpu}));
  ClientOptions o;
  o.address = daemon->socket_path();
  o.client_name = "kvpool-borrow-floor";
  o.data_path = DataPath::kSharedMemory;
  o.busy_poll = std::chrono::microseconds(FLAGS_busy_poll_us);
  KVPOOL_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Connect(o));

  std::vector<BlockKey> keys(kBlocks);
  std::vector<std::vector<uint8_t>> bytes(kBlocks, std::vector<uint8_t>(block));
  std::vector<PutBlock> blocks;
  for (size_t i = 0; i < kBlocks; ++i) {
    const uint64_t n = 0x666c6f6f72000000ull + i;
    std::memcpy(keys[i].bytes.data(), &n, sizeof(n));
    for (size_t b = 0; b < block; ++b) bytes[i][b] = static_cast<uint8_t>(n * 31 + b);
    blocks.push_back({keys[i], bytes[i].data(), block, i ? keys[i - 1] : BlockKey{}, {}});
  }
  KVPOOL_ASSIGN_OR_RETURN(PutResult put, client->Put(blocks));
  if (!put.all_ok()) return Status::Internal("the put of the 16 blocks failed");
  std::vector<uint8_t> out(kBlocks * block);
  std::vector<MutableBuffer> buffers;
  for (size_t i = 0; i < kBlocks; ++i) buffers.push_back({out.data() + i * block, block});
  const std::span<const BlockKey> all(keys);
  auto lookup = [&](size_t n) {
    return [&client, all, n] {
      Result<LookupResult> r = client->Lookup(all.first(n), /*prefetch=*/false);
      return r.ok() && r->hit_blocks == n;
    };
  };
  auto borrow = [&](size_t n) {
    return [&client, all, n] {
      Result<BorrowedBlocks> b = client->Borrow(all.first(n), {.verify = false});
      if (!b.ok()) return false;
      for (size_t i = 0; i < n; ++i) {
        if (!(*b)[i].status.ok()) return false;
      }
      return b->Release().ok();
    };
  };
  auto get = [&] {
    Result<std::vector<GetResult>> r = client->Get(keys, buffers);
    if (!r.ok()) return false;
    for (const GetResult& g : *r) {
      if (!g.status.ok()) return false;
    }
    return true;
  };
  const std::vector<std::pair<std::string, std::function<bool()>>> rows = {
      {"lookup of 1 key", lookup(1)},
      {"lookup of 16 keys", lookup(kBlocks)},
      {"borrow 1 + release", borrow(1)},
      {"borrow 16 + release", borrow(kBlocks)},
      {"get 16", get},
  };
  std::printf(
      "kvpool-borrow-floor: %s blocks, busy polling %u us, kvpoold on cpu %d, client on "
      "cpu %d, %u calls a row\n",
      FLAGS_block_size.c_str(), FLAGS_busy_poll_us, FLAGS_daemon_cpu, FLAGS_bench_cpu, FLAGS_calls);
  std::printf("| call | p50 us | p90 us | p99 us |\n| --- | --- | --- | --- |\n");
  for (const auto& [name, fn] : rows) {
    KVPOOL_ASSIGN_OR_RETURN(const Row r, Time(fn));
    std::printf("| %s | %.2f | %.2f | %.2f |\n", name.c_str(), r.p50, r.p90, r.p99);
  }
  client.reset();
  KVPOOL_RETURN_IF_ERROR(daemon->Stop());
  KVPOOL_ASSIGN_OR_RETURN(const Row floor, SocketpairRoundTrip());
  std::printf("| socketpair round trip, 64 bytes, both spinning | %.2f | %.2f | %.2f |\n",
              floor.p50, floor.p90, floor.p99);
  return Status::OK();
}

}  // namespace
}  // namespace kvpool

int main(int argc, char** argv) {
  gflags::SetUsageMessage("kvpool-borrow-floor: where an in-place read's time goes.");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  const kvpool::Status st = kvpool::Run();
  if (!st.ok()) {
    std::fprintf(stderr, "kvpool-borrow-floor: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
