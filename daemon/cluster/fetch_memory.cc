#include "daemon/cluster/fetch_memory.h"

#include <algorithm>
#include <vector>

namespace kvpool::daemon::cluster {

FetchMemory::FetchMemory(FetchMemoryOptions options)
    : options_(options), clock_(options.clock != nullptr ? *options.clock : RealClock()) {}

bool FetchMemory::Skip(const std::string& peer) {
  absl::MutexLock lock(&mu_);
  auto it = failed_until_.find(peer);
  if (it == failed_until_.end()) return false;
  if (clock_.Now() >= it->second) {
    failed_until_.erase(it);  // its backoff is over: try it again
    return false;
  }
  ++stats_.peers_skipped;
  return true;
}

void FetchMemory::Failed(const std::string& peer) {
  absl::MutexLock lock(&mu_);
  failed_until_[peer] = clock_.Now() + options_.backoff;
}

void FetchMemory::Answered(const std::string& peer) {
  absl::MutexLock lock(&mu_);
  failed_until_.erase(peer);
}

bool FetchMemory::KnownAbsent(NamespaceId ns, const BlockKey& key) {
  absl::MutexLock lock(&mu_);
  auto it = absent_until_.find(NamespacedKey{ns, key});
  if (it == absent_until_.end()) return false;
  if (clock_.Now() >= it->second) {
    absent_until_.erase(it);
    return false;
  }
  ++stats_.absent_hits;
  return true;
}

void FetchMemory::Absent(NamespaceId ns, const BlockKey& key) {
  absl::MutexLock lock(&mu_);
  const Clock::TimePoint now = clock_.Now();
  if (absent_until_.size() >= options_.max_absent) {
    // Expired entries first, then the half that ends soonest.
    absl::erase_if(absent_until_, [&](const auto& kv) { return kv.second <= now; });
    if (absent_until_.size() >= options_.max_absent) {
      std::vector<Clock::TimePoint> ends;
      ends.reserve(absent_until_.size());
      for (const auto& [k, until] : absent_until_) ends.push_back(until);
      auto mid = ends.begin() + static_cast<std::ptrdiff_t>(ends.size() / 2);
      std::nth_element(ends.begin(), mid, ends.end());
      const Clock::TimePoint cut = *mid;
      absl::erase_if(absent_until_, [&](const auto& kv) { return kv.second <= cut; });
    }
  }
  absent_until_[NamespacedKey{ns, key}] = now + options_.absent_ttl;
}

FetchMemory::Stats FetchMemory::GetStats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace kvpool::daemon::cluster
