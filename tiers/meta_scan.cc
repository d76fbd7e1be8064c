#include "tiers/meta_scan.h"

#include <sched.h>

#include <algorithm>
#include <utility>

namespace kvpool::tiers {

int UsableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(CPU_COUNT(&set), 1);
}

MetaScan::MetaScan(const BlockStore& store, std::vector<MetaRange> ranges, size_t batch_records)
    : max_ready_(std::max<size_t>(1, ranges.size()) * kReadyPerReader) {
  {
    absl::MutexLock lock(&mu_);
    running_ = static_cast<int>(ranges.size());
  }
  threads_.reserve(ranges.size());
  for (MetaRange& r : ranges) {
    threads_.emplace_back([this, &store, batch_records, range = std::move(r)] {
      Read(store, range, std::max<size_t>(1, batch_records));
    });
  }
  if (ranges.empty()) finished_at_ = std::chrono::steady_clock::now();
}

MetaScan::~MetaScan() {
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    ready_.clear();
  }
  for (std::thread& t : threads_) t.join();
}

void MetaScan::Read(const BlockStore& store, const MetaRange& range, size_t batch_records) {
  MetaBatch batch;
  batch.reserve(batch_records);
  std::vector<std::string> bad;
  Status st = store.ForEachMeta(
      range,
      [&](NamespaceId ns, const BlockKey& key, const DiskBlockMeta& meta) {
        batch.push_back(LoadedMeta{ns, key, meta});
        if (batch.size() == batch_records) {
          Hand(std::move(batch));
          batch = MetaBatch();
          batch.reserve(batch_records);
        }
      },
      [&](std::string_view raw) { bad.emplace_back(raw); });
  if (!batch.empty()) Hand(std::move(batch));
  absl::MutexLock lock(&mu_);
  if (status_.ok() && !st.ok()) status_ = std::move(st);
  for (std::string& raw : bad) bad_.push_back(std::move(raw));
  if (--running_ == 0) finished_at_ = std::chrono::steady_clock::now();
}

void MetaScan::Hand(MetaBatch batch) {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](MetaScan* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
        return s->closing_ || s->ready_.size() < s->max_ready_;
      },
      this));
  if (!closing_) ready_.push_back(std::move(batch));
}

std::optional<MetaBatch> MetaScan::Next() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](MetaScan* s)
           ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) { return !s->ready_.empty() || s->running_ == 0; },
      this));
  if (ready_.empty()) return std::nullopt;
  MetaBatch batch = std::move(ready_.front());
  ready_.pop_front();
  return batch;
}

}  // namespace kvpool::tiers
