#include "bench/runner.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <latch>
#include <map>
#include <sstream>
#include <thread>

#include "bench/pinning.h"
#include "common/units.h"

namespace kvpool::bench {

const char* StopReasonName(StopReason r) {
  switch (r) {
    case StopReason::kTime:
      return "time";
    case StopReason::kOps:
      return "ops";
    case StopReason::kData:
      return "data";
  }
  return "unknown";
}

bool PhaseClock::Continue() {
  if (out_of_data_) return false;
  if (Clock::now() >= deadline_) return false;
  // Relaxed: a ticket counter; nothing else is published through it.
  if (max_ops_ > 0 && ops_claimed_->fetch_add(1, std::memory_order_relaxed) >= max_ops_) {
    hit_ops_ = true;
    return false;
  }
  return true;
}

void PhaseClock::Record(Clock::duration latency, uint64_t bytes) {
  latencies_us_.push_back(std::chrono::duration<double, std::micro>(latency).count());
  bytes_ += bytes;
}

struct PhaseClockAccess {
  static void Arm(PhaseClock& c, Clock::time_point deadline, uint64_t max_ops,
                  std::atomic<uint64_t>* claimed) {
    c.deadline_ = deadline;
    c.max_ops_ = max_ops;
    c.ops_claimed_ = claimed;
    c.latencies_us_.reserve(1 << 16);  // no reallocation between most calls
  }
  static void Finish(PhaseClock& c) { c.finished_ = Clock::now(); }
  static Clock::time_point finished(const PhaseClock& c) { return c.finished_; }
  static bool out_of_data(const PhaseClock& c) { return c.out_of_data_; }
  static bool hit_ops(const PhaseClock& c) { return c.hit_ops_; }
  static uint64_t bytes(const PhaseClock& c) { return c.bytes_; }
  static std::vector<double>& latencies(PhaseClock& c) { return c.latencies_us_; }
};

Result<PhaseStats> RunPhase(std::vector<std::unique_ptr<PhaseWorker>>& workers,
                            const std::vector<int>& cpus, const PhaseLimits& limits) {
  const size_t n = workers.size();
  std::vector<PhaseClock> clocks(n);
  std::vector<Status> prepare_status(n, Status::OK());
  std::vector<Status> run_status(n, Status::OK());
  std::atomic<uint64_t> claimed{0};
  std::atomic<bool> abort{false};  // a Prepare failed: skip the timed part
  std::latch ready(static_cast<std::ptrdiff_t>(n));
  std::latch go(1);
  Clock::time_point start;

  std::vector<std::thread> threads;
  threads.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      const std::string name = "kvpool-bench-" + std::to_string(i);
      pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
      Status st = cpus.empty() ? Status::OK() : PinThisThread({cpus[i % cpus.size()]});
      if (st.ok()) st = workers[i]->Prepare();
      prepare_status[i] = st;
      ready.count_down();
      go.wait();
      // Acquire: pairs with the release store below, so `start` and the armed clock are seen.
      if (abort.load(std::memory_order_acquire) || !st.ok()) return;
      run_status[i] = workers[i]->Run(clocks[i]);
      PhaseClockAccess::Finish(clocks[i]);
    });
  }
  ready.wait();
  bool prepared = true;
  for (const Status& st : prepare_status) prepared = prepared && st.ok();
  start = Clock::now();
  const Clock::time_point deadline =
      limits.seconds > 0 ? start + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(limits.seconds))
                         : Clock::time_point::max();
  for (PhaseClock& c : clocks) PhaseClockAccess::Arm(c, deadline, limits.max_ops, &claimed);
  abort.store(!prepared, std::memory_order_release);
  go.count_down();
  for (std::thread& t : threads) t.join();

  for (const Status& st : prepare_status) KVPOOL_RETURN_IF_ERROR(st);
  for (const Status& st : run_status) KVPOOL_RETURN_IF_ERROR(st);

  PhaseStats s;
  Clock::time_point end = start;
  bool data = false;
  bool ops = false;
  for (PhaseClock& c : clocks) {
    end = std::max(end, PhaseClockAccess::finished(c));
    data = data || PhaseClockAccess::out_of_data(c);
    ops = ops || PhaseClockAccess::hit_ops(c);
    s.bytes += PhaseClockAccess::bytes(c);
    std::vector<double>& l = PhaseClockAccess::latencies(c);
    s.latencies_us.insert(s.latencies_us.end(), l.begin(), l.end());
  }
  s.ops = s.latencies_us.size();
  s.seconds = std::chrono::duration<double>(end - start).count();
  s.stop = data ? StopReason::kData : ops ? StopReason::kOps : StopReason::kTime;
  std::sort(s.latencies_us.begin(), s.latencies_us.end());
  return s;
}

double Percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double rank = std::ceil(q * static_cast<double>(sorted.size()));
  const size_t i = static_cast<size_t>(std::clamp(rank, 1.0, static_cast<double>(sorted.size())));
  return sorted[i - 1];
}

void Figure::SetFrom(const PhaseStats& s) {
  gbps = s.seconds > 0 ? static_cast<double>(s.bytes) / s.seconds / 1e9 : 0;
  ops_per_s = s.seconds > 0 ? static_cast<double>(s.ops) / s.seconds : 0;
  p50_us = Percentile(s.latencies_us, 0.50);
  p99_us = Percentile(s.latencies_us, 0.99);
  extra["calls"] = s.ops;
  extra["bytes"] = s.bytes;
  extra["seconds"] = s.seconds;
  extra["max_us"] = s.latencies_us.empty() ? 0.0 : s.latencies_us.back();
  extra["stop"] = StopReasonName(s.stop);
}

nlohmann::json Figure::ToJson() const {
  nlohmann::json j = extra;
  j["system"] = system;
  j["path"] = path;
  j["op"] = op;
  j["block_bytes"] = block_bytes;
  j["concurrency"] = concurrency;
  // Three significant decimals are more than these figures can carry.
  auto round = [](double v, double scale) { return std::round(v * scale) / scale; };
  j["gbps"] = round(gbps, 1000);
  j["ops_per_s"] = round(ops_per_s, 10);
  j["p50_us"] = round(p50_us, 10);
  j["p99_us"] = round(p99_us, 10);
  return j;
}

namespace {

std::string Fmt(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

std::string SizeName(uint64_t bytes) {
  if (bytes == 0) return "mixed";
  if (bytes % (1ull << 20) == 0) return std::to_string(bytes >> 20) + "MiB";
  if (bytes % (1ull << 10) == 0) return std::to_string(bytes >> 10) + "KiB";
  return std::to_string(bytes) + "B";
}

}  // namespace

std::string FormatTable(const std::vector<Figure>& figures) {
  std::map<uint64_t, double> memcpy_gbps;
  std::map<uint64_t, double> socket_gbps;
  for (const Figure& f : figures) {
    if (f.system == "memcpy") memcpy_gbps[f.block_bytes] = f.gbps;
    if (f.system == "socketpair") socket_gbps[f.block_bytes] = f.gbps;
  }
  char line[512];
  std::string out;
  std::snprintf(line, sizeof(line),
                "%-12s %-6s %-6s %4s %10s %8s %9s %9s %9s %7s %6s %6s %6s %11s %7s\n", "system",
                "path", "op", "conc", "block", "GB/s", "ops/s", "p50 us", "p99 us", "memcpy",
                "ratio", "sock", "frag", "redis best", "ucx lim");
  out += line;
  for (const Figure& f : figures) {
    std::string mem = "-";
    std::string ratio = "-";
    std::string sock = "-";
    const bool compared = (f.system == "kvpool" || f.system == "redis") && f.op != "lookup";
    auto it = memcpy_gbps.find(f.block_bytes);
    if (compared && it != memcpy_gbps.end() && it->second > 0) {
      mem = Fmt("%.2f", it->second);
      ratio = Fmt("%.3f", f.gbps / it->second);
    }
    auto st = socket_gbps.find(f.block_bytes);
    if (compared && st != socket_gbps.end() && st->second > 0) {
      sock = Fmt("%.3f", f.gbps / st->second);
    }
    std::string block = SizeName(f.block_bytes);
    if (f.op == "lookup" && f.extra.contains("chain_blocks")) {
      block = std::to_string(f.extra["chain_blocks"].get<uint64_t>()) + "x" + block;
    }
    const std::string frag = f.extra.contains("host_fragmentation")
                                 ? Fmt("%.3f", f.extra["host_fragmentation"].get<double>())
                                 : "-";
    // kvpool's GB/s over Redis's best path's for the same figure, and which path that was.
    const std::string redis = f.extra.contains("ratio_to_redis_best")
                                  ? Fmt("%.2fx", f.extra["ratio_to_redis_best"].get<double>()) +
                                        " " + f.extra["redis_best_path"].get<std::string>()
                                  : "-";
    const std::string ucx = f.extra.contains("ratio_to_ucx_perftest")
                                ? Fmt("%.3f", f.extra["ratio_to_ucx_perftest"].get<double>())
                                : "-";
    std::snprintf(
        line, sizeof(line), "%-12s %-6s %-6s %4d %10s %8s %9s %9s %9s %7s %6s %6s %6s %11s %7s\n",
        f.system.c_str(), f.path.c_str(), f.op.c_str(), f.concurrency, block.c_str(),
        f.op == "lookup" ? "-" : Fmt("%.3f", f.gbps).c_str(), Fmt("%.1f", f.ops_per_s).c_str(),
        Fmt("%.1f", f.p50_us).c_str(), Fmt("%.1f", f.p99_us).c_str(), mem.c_str(), ratio.c_str(),
        sock.c_str(), frag.c_str(), redis.c_str(), ucx.c_str());
    out += line;
  }
  return out;
}

std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

std::pair<std::string, int> CaptureCommand(const std::string& command) {
  std::string out;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return {"popen failed", -1};
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  return {out, ::pclose(p)};
}

std::string CpuList(const std::vector<int>& cpus) {
  std::string out;
  if (cpus.empty()) {
    const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
    return n > 1 ? "0-" + std::to_string(n - 1) : "0";
  }
  for (int c : cpus) out += (out.empty() ? "" : ",") + std::to_string(c);
  return out;
}

}  // namespace kvpool::bench
