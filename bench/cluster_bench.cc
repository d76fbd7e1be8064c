// kvpool-cluster-bench: a remote hit against a local one. Starts a real etcd (loopback ports, temp
// dir) and two kvpoold in one cluster (node-a, node-c; --replicas=0, so a block put through A
// stays on A), puts a chain through A, then through C:
//   get remote   GetBlocks(chain) on C: C misses locally, fetches every block from A (one
//                batched GET per round to A, over UCX on tcp loopback, 500 ms per request),
//                stores them in its host tier, and serves them to the bench;
//   get local    the same call again: C's own host tier;
//   lookup local Lookup(chain) on C (index only);
//   lookup remote the chain is evicted from C, Lookup(chain) on C fetches it from A again (no
//                bytes to the bench);
//   peer get     GetBlocks(chain) straight from A over UCX (tcp://, UCX tcp on lo), as a peer's
//                batched request is, but with a long deadline: how long one batched peer GET
//                of N blocks takes, to size the daemon's peer deadline against.
// Each run uses a fresh chain (keys from ChainHasher over random tokens); between runs both
// daemons drop it. Every byte read is checked (bench/block_data.h); any wrong byte, miss or
// error makes the exit status 1, after the figures and the misses are printed.
//
// The bench's own connections to C and A go over their Unix sockets with shared memory (C, A)
// except the peer-get one (UCX); the daemons talk to each other over UCX's tcp transport on the
// loopback device. Results and the command: docs/BENCHMARKS.md, "Cluster: remote hit vs local".
//
// Cleanup: every process and temp dir is owned by an RAII object (daemons get SIGTERM, etcd
// SIGKILL, dirs removed) on every return path; the children also die with the bench
// (PR_SET_PDEATHSIG) if it is killed.

#include <gflags/gflags.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <kvpool/block_key.h>
#include <kvpool/client.h>
#include <nlohmann/json.hpp>

#include "bench/bench_daemon.h"
#include "bench/block_data.h"
#include "common/units.h"
#include "tests/support/etcd_test_server.h"
#include "tests/support/temp_dir.h"

DEFINE_uint32(blocks, 1000, "Blocks in the chain.");
DEFINE_string(block_size, "1MiB", "Bytes per block.");
DEFINE_uint32(repeats, 3, "Runs, each with a fresh chain.");
DEFINE_bool(json, false, "Print one JSON object per run and one summary (and nothing else).");
DEFINE_string(kvpoold, "",
              "kvpoold to start. Default: <dir of this binary>/../daemon/kvpoold, then "
              "<dir of this binary>/kvpoold.");
DEFINE_string(host_capacity, "",
              "Host tier of each daemon. Default: 2 x the chain + 256 MiB (one chain at a "
              "time is cached; the bench drops it between runs).");
DEFINE_uint32(peer_get_timeout_ms, 120000,
              "Deadline of the bench's peer-get connection (bench -> node-a over UCX). 500 is "
              "the daemons' own peer deadline: whether it cuts a batched GET of the whole chain.");
DEFINE_int32(daemon_vlog, 1,
             "--v for the daemons: at 1, C logs each failed peer fetch (\"fetch from node-a: "
             "...\"), which the bench reports.");

namespace kvpool::bench {
namespace {

using Clock = std::chrono::steady_clock;
using testing::EtcdTestServer;

constexpr const char* kLayout =
    "model=kvpool-cluster-bench;dtype=bf16;layers=1;kv_heads=1;head_dim=64;tokens_per_block=16;"
    "tp_rank=0;tp_size=1;encoding=raw";
constexpr uint32_t kTokensPerBlock = 16;
constexpr const char* kNamespace = "bench";
constexpr size_t kPatternSlots = 16;
constexpr size_t kPutBatch = 64;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

// A temp dir holding the cluster secret (0600); removed with the object.
class SecretDir {
 public:
  // Path of the secret file; empty when it could not be written.
  std::string Write(const std::string& secret) {
    if (!dir_.ok()) return "";
    const std::string path = dir_.Join("secret");
    {
      std::ofstream out(path);
      out << secret << "\n";
      if (!out) return "";
    }
    if (chmod(path.c_str(), 0600) != 0) return "";
    return path;
  }

 private:
  testing::TempDir dir_{"kvpool-cluster-bench"};
};

// "0-99,412,700-999"
std::string Ranges(const std::vector<size_t>& v) {
  std::string out;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(v[i]);
    if (j > i) out += "-" + std::to_string(v[j]);
    i = j + 1;
  }
  return out;
}

// What one timed GetBlocks returned.
struct GetCheck {
  double seconds = 0;
  Status call;                  // the call itself
  std::vector<size_t> missing;  // NotFound
  std::vector<size_t> failed;   // other per-block errors
  std::vector<size_t> wrong;    // bytes differ
  std::string first_error;      // of failed or wrong
  size_t tier_counts[5] = {};   // by Tier
  bool ok() const { return call.ok() && missing.empty() && failed.empty() && wrong.empty(); }
};

GetCheck TimedGet(Client& c, const std::vector<BlockKey>& keys, const PatternSet& patterns) {
  GetCheck r;
  const auto t0 = Clock::now();
  Result<std::vector<FetchedBlock>> got = c.GetBlocks(keys);
  r.seconds = Seconds(Clock::now() - t0);
  if (!got.ok()) {
    r.call = got.status();
    return r;
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    const FetchedBlock& b = (*got)[i];
    if (b.status.IsNotFound()) {
      r.missing.push_back(i);
      continue;
    }
    if (!b.status.ok()) {
      if (r.first_error.empty()) r.first_error = std::to_string(i) + ": " + b.status.ToString();
      r.failed.push_back(i);
      continue;
    }
    ++r.tier_counts[static_cast<int>(b.tier) % 5];
    Status v = VerifyBlock(keys[i], b.bytes.data(), b.bytes.size(), patterns.slot(i),
                           patterns.block_bytes());
    if (!v.ok()) {
      if (r.first_error.empty()) r.first_error = std::to_string(i) + ": " + v.ToString();
      r.wrong.push_back(i);
    }
  }
  return r;
}

nlohmann::json GetJson(const GetCheck& g, uint64_t bytes) {
  nlohmann::json j;
  j["seconds"] = g.seconds;
  j["gb_per_s"] = g.seconds > 0 ? bytes / g.seconds / 1e9 : 0;
  j["call_status"] = g.call.ToString();
  j["missing"] = Ranges(g.missing);
  j["missing_count"] = g.missing.size();
  j["failed"] = Ranges(g.failed);
  j["wrong"] = Ranges(g.wrong);
  if (!g.first_error.empty()) j["first_error"] = g.first_error;
  nlohmann::json tiers;
  for (int t = 0; t < 5; ++t) {
    if (g.tier_counts[t] > 0) tiers[TierName(static_cast<Tier>(t))] = g.tier_counts[t];
  }
  j["tiers"] = tiers;
  return j;
}

struct LookupCheck {
  double seconds = 0;
  Status call;
  uint32_t hit_blocks = 0;
};

LookupCheck TimedLookup(Client& c, const std::vector<BlockKey>& keys) {
  LookupCheck r;
  const auto t0 = Clock::now();
  Result<LookupResult> l = c.Lookup(keys, /*prefetch=*/false);
  r.seconds = Seconds(Clock::now() - t0);
  if (!l.ok())
    r.call = l.status();
  else
    r.hit_blocks = l->hit_blocks;
  return r;
}

// New lines of a daemon's log that say a peer fetch failed ("fetch from", "peer ").
std::vector<std::string> PeerFailures(const DaemonProcess& d, size_t* seen) {
  std::istringstream in(d.LogTail(1 << 20));
  std::vector<std::string> all;
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("fetch from ") != std::string::npos ||
        line.find("] peer ") != std::string::npos) {
      all.push_back(line);
    }
  }
  std::vector<std::string> fresh(all.begin() + std::min(*seen, all.size()), all.end());
  *seen = all.size();
  return fresh;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

Result<std::unique_ptr<Client>> ConnectTo(
    const std::string& address, DataPath path,
    std::chrono::milliseconds timeout = std::chrono::milliseconds(120000),
    const std::string& cluster_secret = "") {
  ClientOptions o;
  o.cluster_secret = cluster_secret;  // TCP connections to a daemon in cluster mode need it
  o.address = address;
  o.namespace_name = kNamespace;
  o.client_name = "kvpool-cluster-bench";
  o.data_path = path;
  // Long enough for a 1,000 x 1 MiB remote hit on a loaded machine; the figures are the point.
  o.timeout = timeout;
  o.connect_timeout = std::chrono::milliseconds(120000);
  o.ucx_transports = "tcp";
  o.ucx_net_devices = "lo";
  return Client::Connect(o);
}

// Waits until `c` sees `n` alive members; the last view's summary when it does not.
Status WaitMembers(Client& c, size_t n, std::chrono::seconds limit) {
  const auto end = Clock::now() + limit;
  std::string last = "no answer";
  while (Clock::now() < end) {
    Result<ClusterView> v = c.Cluster();
    if (v.ok()) {
      size_t alive = 0;
      for (const ClusterMember& m : v->members) alive += m.state == "alive";
      if (alive == n && v->state == "joined") return Status::OK();
      last = v->state + ", " + std::to_string(alive) + " alive (" + v->reason + ")";
    } else {
      last = v.status().ToString();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return Status::Unavailable("cluster view never had " + std::to_string(n) +
                             " alive members: " + last);
}

int Fail(const std::string& what, const Status& st, const DaemonProcess* a = nullptr,
         const DaemonProcess* c = nullptr) {
  std::cerr << "kvpool-cluster-bench: " << what << ": " << st.ToString() << "\n";
  if (a != nullptr) std::cerr << "--- node-a log tail ---\n" << a->LogTail() << "\n";
  if (c != nullptr) std::cerr << "--- node-c log tail ---\n" << c->LogTail() << "\n";
  return 1;
}

int Run() {
  Result<uint64_t> block_bytes = ParseBytes(FLAGS_block_size);
  if (!block_bytes.ok() || *block_bytes < kStampBytes) {
    std::cerr << "--block_size: " << FLAGS_block_size << " is not a size of at least 16 B\n";
    return 2;
  }
  if (FLAGS_blocks == 0 || FLAGS_repeats == 0) {
    std::cerr << "--blocks and --repeats must be positive\n";
    return 2;
  }
  const uint64_t chain_bytes = static_cast<uint64_t>(FLAGS_blocks) * *block_bytes;
  uint64_t host = 2 * chain_bytes + (256ull << 20);
  if (!FLAGS_host_capacity.empty()) {
    Result<uint64_t> h = ParseBytes(FLAGS_host_capacity);
    if (!h.ok()) return Fail("--host_capacity", h.status());
    host = *h;
  }
  const std::string load_before = LoadAverage();
  char date[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S %Z", std::localtime(&now));

  auto etcd = EtcdTestServer::Start();
  if (!etcd.ok()) return Fail("etcd (" + EtcdTestServer::BinaryPath() + ")", etcd.status());
  SecretDir secret_dir;
  const std::string cluster_secret = RandomSecret();
  const std::string secret_file = secret_dir.Write(cluster_secret);
  if (secret_file.empty()) return Fail("secret file", Status::Internal("could not write it"));

  auto start = [&](const std::string& id) {
    DaemonProcessOptions o =
        BenchDaemonOptions(FindKvpoold(FLAGS_kvpoold), host,
                           {"--cluster=" + (*etcd)->endpoint(), "--cluster_name=bench",
                            "--node_id=" + id, "--cluster_secret_file=" + secret_file,
                            "--replicas=0", "--v=" + std::to_string(FLAGS_daemon_vlog)});
    o.listen_tcp_loopback = true;  // --listen=tcp://127.0.0.1:0 --ucx_transports=tcp, lo
    return DaemonProcess::Launch(std::move(o));
  };
  auto a = start("node-a");
  if (!a.ok()) return Fail("starting node-a", a.status());
  auto c = start("node-c");
  if (!c.ok()) return Fail("starting node-c", c.status(), a->get());
  DaemonProcess& da = **a;
  DaemonProcess& dc = **c;

  auto ca = ConnectTo(da.socket_path(), DataPath::kSharedMemory);
  if (!ca.ok()) return Fail("connecting to node-a", ca.status(), &da, &dc);
  auto cc = ConnectTo(dc.socket_path(), DataPath::kSharedMemory);
  if (!cc.ok()) return Fail("connecting to node-c", cc.status(), &da, &dc);
  for (Client* cl : {ca->get(), cc->get()}) {
    Status st = WaitMembers(*cl, 2, std::chrono::seconds(20));
    if (!st.ok()) return Fail("waiting for both members", st, &da, &dc);
  }
  // The peer-get connection: to A over TCP with UCX, as C's own pooled peer connection is.
  const auto connect0 = Clock::now();
  auto cu = ConnectTo(da.tcp_address(), DataPath::kUcx,
                      std::chrono::milliseconds(FLAGS_peer_get_timeout_ms), cluster_secret);
  const double ucx_connect_s = Seconds(Clock::now() - connect0);
  if (!cu.ok()) return Fail("connecting to node-a over UCX", cu.status(), &da, &dc);

  PatternSet patterns(*block_bytes, std::min<size_t>(kPatternSlots, FLAGS_blocks),
                      std::random_device{}());
  std::mt19937 rng(std::random_device{}());
  const std::string run_secret = RandomSecret();
  ChainHasher hasher(run_secret, kLayout, kTokensPerBlock);

  if (!FLAGS_json) {
    std::printf(
        "kvpool-cluster-bench: %u blocks x %s = %s per chain, %u runs; %s; load average %s\n"
        "  bench -> node-c and -> node-a: Unix socket, shared memory; node-c -> node-a (peer "
        "fetch): UCX tcp on lo, 500 ms per request; peer get: bench -> node-a over UCX tcp on "
        "lo, deadline %u ms (connected in %.3f s)\n",
        FLAGS_blocks, FormatBytes(*block_bytes).c_str(), FormatBytes(chain_bytes).c_str(),
        FLAGS_repeats, date, load_before.c_str(), FLAGS_peer_get_timeout_ms, ucx_connect_s);
    std::printf("%4s %18s %18s %9s %9s %18s %7s %6s %s\n", "run", "get remote", "get local",
                "lookup rem", "lookup loc", "peer get", "ratio", "missed", "notes");
  }

  bool all_ok = true;
  size_t failures_seen = 0;
  std::vector<double> remote_s, local_s, lremote_s, llocal_s, peer_s;
  nlohmann::json runs = nlohmann::json::array();
  for (uint32_t run = 0; run < FLAGS_repeats; ++run) {
    std::vector<int32_t> tokens(static_cast<size_t>(FLAGS_blocks) * kTokensPerBlock);
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 150000);
    const std::vector<BlockKey> keys = hasher.Hash(tokens);

    // Put through A, kPutBatch blocks at a time (not timed).
    std::vector<uint8_t> buf(kPutBatch * *block_bytes);
    for (size_t s = 0; s < keys.size(); s += kPutBatch) {
      const size_t n = std::min(kPutBatch, keys.size() - s);
      std::vector<std::span<const uint8_t>> spans;
      for (size_t k = 0; k < n; ++k) {
        uint8_t* b = buf.data() + k * *block_bytes;
        std::memcpy(b, patterns.slot(s + k), *block_bytes);
        StampBlock(keys[s + k], b, *block_bytes);
        spans.emplace_back(b, *block_bytes);
      }
      auto put = (*ca)->PutChain(std::span<const BlockKey>(keys).subspan(s, n), spans,
                                 s > 0 ? keys[s - 1] : BlockKey{});
      if (!put.ok()) return Fail("put through node-a", put.status(), &da, &dc);
      if (!put->all_ok() || put->stored != n) {
        return Fail(
            "put through node-a",
            Status::Internal("stored " + std::to_string(put->stored) + " of " + std::to_string(n)),
            &da, &dc);
      }
    }

    const GetCheck remote = TimedGet(**cc, keys, patterns);
    const std::vector<std::string> fetch_failures = PeerFailures(dc, &failures_seen);
    const GetCheck local = TimedGet(**cc, keys, patterns);
    const LookupCheck llocal = TimedLookup(**cc, keys);
    // Drop the chain from C only; a lookup on C then fetches it from A again.
    auto ev = (*cc)->Evict(Tier::kDisk, keys);
    if (!ev.ok()) return Fail("evicting the chain from node-c", ev.status(), &da, &dc);
    const LookupCheck lremote = TimedLookup(**cc, keys);
    const std::vector<std::string> lookup_failures = PeerFailures(dc, &failures_seen);
    const GetCheck peer = TimedGet(**cu, keys, patterns);
    // Both drop the chain, so the next run's fits and is again only on A.
    auto ea = (*ca)->Evict(Tier::kDisk, keys);
    auto ec = (*cc)->Evict(Tier::kDisk, keys);
    if (!ea.ok() || !ec.ok()) {
      return Fail("evicting the chain", ea.ok() ? ec.status() : ea.status(), &da, &dc);
    }

    const bool ok = remote.ok() && local.ok() && peer.ok() && llocal.call.ok() &&
                    lremote.call.ok() && llocal.hit_blocks == keys.size() &&
                    lremote.hit_blocks == keys.size() && ev->evicted == keys.size();
    all_ok = all_ok && ok;
    remote_s.push_back(remote.seconds);
    local_s.push_back(local.seconds);
    lremote_s.push_back(lremote.seconds);
    llocal_s.push_back(llocal.seconds);
    peer_s.push_back(peer.seconds);

    nlohmann::json j;
    j["run"] = run;
    j["blocks"] = FLAGS_blocks;
    j["block_bytes"] = *block_bytes;
    j["get_remote"] = GetJson(remote, chain_bytes);
    j["get_local"] = GetJson(local, chain_bytes);
    j["peer_get"] = GetJson(peer, chain_bytes);
    j["lookup_local"] = {{"seconds", llocal.seconds},
                         {"hit_blocks", llocal.hit_blocks},
                         {"call_status", llocal.call.ToString()}};
    j["lookup_remote"] = {{"seconds", lremote.seconds},
                          {"hit_blocks", lremote.hit_blocks},
                          {"call_status", lremote.call.ToString()},
                          {"evicted_from_c_before", ev->evicted}};
    j["ratio_remote_local"] = local.seconds > 0 ? remote.seconds / local.seconds : 0;
    j["peer_fetch_failures_get"] = fetch_failures;
    j["peer_fetch_failures_lookup"] = lookup_failures;
    j["ok"] = ok;
    runs.push_back(j);

    if (FLAGS_json) {
      std::cout << j.dump() << std::endl;
    } else {
      std::string notes;
      if (!remote.call.ok()) notes += " get remote: " + remote.call.ToString() + ";";
      if (!remote.missing.empty()) notes += " remote missed " + Ranges(remote.missing) + ";";
      if (!local.missing.empty()) notes += " local missed " + Ranges(local.missing) + ";";
      if (!remote.first_error.empty()) notes += " remote: " + remote.first_error + ";";
      if (!local.first_error.empty()) notes += " local: " + local.first_error + ";";
      if (!peer.ok())
        notes += " peer get: " + peer.call.ToString() + " " + peer.first_error + " missed " +
                 Ranges(peer.missing) + ";";
      if (lremote.hit_blocks != keys.size())
        notes += " lookup remote hit " + std::to_string(lremote.hit_blocks) + ";";
      for (const std::string& f : fetch_failures) notes += " C log: " + f + ";";
      for (const std::string& f : lookup_failures) notes += " C log (lookup): " + f + ";";
      auto cell = [&](double s) {
        char b[32];
        std::snprintf(b, sizeof b, "%.3fs %4.2fGB/s", s, s > 0 ? chain_bytes / s / 1e9 : 0.0);
        return std::string(b);
      };
      std::printf("%4u %18s %18s %8.3fs %8.4fs %18s %6.1fx %6zu %s\n", run,
                  cell(remote.seconds).c_str(), cell(local.seconds).c_str(), lremote.seconds,
                  llocal.seconds, cell(peer.seconds).c_str(),
                  local.seconds > 0 ? remote.seconds / local.seconds : 0.0,
                  remote.missing.size() + remote.failed.size(), notes.c_str());
    }
  }

  const std::string load_after = LoadAverage();
  nlohmann::json summary;
  summary["summary"] = true;
  summary["date"] = date;
  summary["blocks"] = FLAGS_blocks;
  summary["block_bytes"] = *block_bytes;
  summary["repeats"] = FLAGS_repeats;
  summary["median_get_remote_s"] = Median(remote_s);
  summary["median_get_local_s"] = Median(local_s);
  summary["median_lookup_remote_s"] = Median(lremote_s);
  summary["median_lookup_local_s"] = Median(llocal_s);
  summary["median_peer_get_s"] = Median(peer_s);
  summary["median_ratio_remote_local"] =
      Median(local_s) > 0 ? Median(remote_s) / Median(local_s) : 0;
  summary["bench_to_daemon_path"] = "unix socket + shared memory";
  summary["daemon_to_daemon_path"] = "UCX tcp on lo (500 ms per peer request)";
  summary["ucx_connect_s"] = ucx_connect_s;
  summary["peer_get_timeout_ms"] = FLAGS_peer_get_timeout_ms;
  summary["load_average_before"] = load_before;
  summary["load_average_after"] = load_after;
  summary["ok"] = all_ok;
  if (FLAGS_json) {
    std::cout << summary.dump() << std::endl;
  } else {
    const double gb = chain_bytes / 1e9;
    std::printf(
        "median: get remote %.3f s (%.2f GB/s), get local %.3f s (%.2f GB/s), ratio %.1fx; "
        "lookup remote %.3f s, local %.4f s; peer get %.3f s (%.2f GB/s); load average after "
        "%s; %s\n",
        Median(remote_s), gb / Median(remote_s), Median(local_s), gb / Median(local_s),
        Median(local_s) > 0 ? Median(remote_s) / Median(local_s) : 0.0, Median(lremote_s),
        Median(llocal_s), Median(peer_s), gb / Median(peer_s), load_after.c_str(),
        all_ok ? "every byte checked, no miss" : "FAILED: misses or errors above");
  }
  // Connections first, so no client sees its daemon go away under it.
  cu->reset();
  cc->reset();
  ca->reset();
  Status sa = da.Stop();
  Status sc = dc.Stop();
  if (!sa.ok() || !sc.ok()) {
    std::cerr << "kvpool-cluster-bench: a daemon did not stop cleanly: "
              << (sa.ok() ? sc : sa).ToString() << "\n";
    return 1;
  }
  return all_ok ? 0 : 1;
}

}  // namespace
}  // namespace kvpool::bench

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "kvpool-cluster-bench [flags]: a remote hit (node C serving a chain only node A holds, "
      "fetched over UCX) against a local one (C's own host tier). Starts etcd and two kvpoold "
      "on loopback. See docs/BENCHMARKS.md.");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  return kvpool::bench::Run();
}
