#include "bench/pinning.h"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <charconv>

namespace kvpool::bench {

Result<std::vector<int>> ParseCpuList(std::string_view text) {
  std::vector<int> out;
  auto bad = [&] { return Status::InvalidArgument("bad CPU list '" + std::string(text) + "'"); };
  auto number = [&](std::string_view s, int* v) {
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
    return ec == std::errc() && p == s.data() + s.size() && *v >= 0 && *v < CPU_SETSIZE;
  };
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string_view::npos) comma = text.size();
    const std::string_view item = text.substr(pos, comma - pos);
    const size_t dash = item.find('-');
    int lo = 0;
    int hi = 0;
    if (dash == std::string_view::npos) {
      if (!number(item, &lo)) return bad();
      hi = lo;
    } else if (!number(item.substr(0, dash), &lo) || !number(item.substr(dash + 1), &hi) ||
               hi < lo) {
      return bad();
    }
    for (int c = lo; c <= hi; ++c) out.push_back(c);
    pos = comma + 1;
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string FormatCpuList(const std::vector<int>& cpus) {
  std::string s;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!s.empty()) s += ",";
    s += std::to_string(cpus[i]);
    if (j > i) s += "-" + std::to_string(cpus[j]);
    i = j + 1;
  }
  return s;
}

std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) out.push_back(c);
  }
  return out;
}

Status PinThisThread(const std::vector<int>& cpus) {
  if (cpus.empty()) return Status::OK();
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  // pid 0 with sched_setaffinity means the calling thread.
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    return Status::FromErrno(errno, "sched_setaffinity(" + FormatCpuList(cpus) + ")");
  }
  return Status::OK();
}

Result<PinPlan> MakePinPlan(bool enabled, std::string_view daemon_cpus, std::string_view bench_cpus,
                            bool own_daemon) {
  PinPlan plan;
  if (!enabled) {
    plan.description = "none";
    return plan;
  }
  plan.enabled = true;
  const std::vector<int> allowed = AllowedCpus();
  if (allowed.empty()) return Status::Internal("sched_getaffinity returned no CPU");
  const size_t half = std::max<size_t>(1, allowed.size() / 2);
  if (!daemon_cpus.empty()) {
    KVPOOL_ASSIGN_OR_RETURN(plan.daemon_cpus, ParseCpuList(daemon_cpus));
  } else {
    plan.daemon_cpus.assign(allowed.begin(), allowed.begin() + half);
  }
  if (!bench_cpus.empty()) {
    KVPOOL_ASSIGN_OR_RETURN(plan.bench_cpus, ParseCpuList(bench_cpus));
  } else if (allowed.size() == 1) {
    plan.bench_cpus = allowed;
  } else {
    plan.bench_cpus.assign(allowed.begin() + half, allowed.end());
  }
  for (const std::vector<int>* list : {&plan.daemon_cpus, &plan.bench_cpus}) {
    for (int c : *list) {
      if (std::find(allowed.begin(), allowed.end(), c) == allowed.end()) {
        return Status::InvalidArgument("CPU " + std::to_string(c) +
                                       " is not in this process's affinity mask (" +
                                       FormatCpuList(allowed) + ")");
      }
    }
  }
  if (!own_daemon) plan.daemon_cpus.clear();
  plan.description = std::string("daemon=") +
                     (own_daemon ? FormatCpuList(plan.daemon_cpus) : "external(not pinned)") +
                     " bench=" + FormatCpuList(plan.bench_cpus) +
                     " (each bench thread on one cpu, round robin)";
  return plan;
}

}  // namespace kvpool::bench
