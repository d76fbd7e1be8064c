#pragma once
// MetaScan: the read of a block store's meta records at start (TierManager::Recover), one reader
// thread per key range, handing the records over in batches as they are read so the caller
// builds the index while the readers go on. With one range it still overlaps reading with
// indexing on two threads.
//
// Thread safety: Next, finished_at, status and bad are for the one consuming thread.

#include <chrono>
#include <deque>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <kvpool/block_key.h>

#include "absl/synchronization/mutex.h"
#include "common/namespace_id.h"
#include "common/status.h"
#include "tiers/tier.h"

namespace kvpool::tiers {

// One meta record as read.
struct LoadedMeta {
  NamespaceId ns = 0;
  BlockKey key;
  DiskBlockMeta meta;
};
using MetaBatch = std::vector<LoadedMeta>;

// Readers Recover starts at most (more ranges than this gain nothing: indexing is one thread).
inline constexpr int kMaxRecoverReaders = 8;

// The CPUs this process may run on (its affinity), at least 1.
int UsableCpus();

class MetaScan {
 public:
  // Starts a reader per range, handing records on in batches of `batch_records`. `store` must
  // outlive the scan.
  MetaScan(const BlockStore& store, std::vector<MetaRange> ranges,
           size_t batch_records = kBatchRecords);
  ~MetaScan();  // joins the readers (after they finish their ranges, dropping what is unread)
  MetaScan(const MetaScan&) = delete;
  MetaScan& operator=(const MetaScan&) = delete;

  // The next batch of records (up to kBatchRecords), waiting for one; nullopt once every range
  // is read.
  std::optional<MetaBatch> Next();

  // After Next returned nullopt: when the last reader finished, the first reader's error (the
  // records handed over are then incomplete), and the raw keys of undecodable records.
  std::chrono::steady_clock::time_point finished_at() const { return finished_at_; }
  Status status() const { return status_; }
  const std::vector<std::string>& bad() const { return bad_; }
  int readers() const { return static_cast<int>(threads_.size()); }

  static constexpr size_t kBatchRecords = 1 << 16;
  // Batches waiting for Next, per reader, before that reader waits: the records in memory at
  // once stay a few batches (~8 MiB each), not the whole family, when reading outruns indexing.
  static constexpr size_t kReadyPerReader = 2;

 private:
  void Read(const BlockStore& store, const MetaRange& range, size_t batch_records);
  void Hand(MetaBatch batch);

  absl::Mutex mu_;
  std::deque<MetaBatch> ready_ ABSL_GUARDED_BY(mu_);
  const size_t max_ready_;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;  // the destructor runs: readers drop their batches
  Status status_;  // written under mu_ by the readers; read by the consumer once they are done
  std::vector<std::string> bad_;
  std::chrono::steady_clock::time_point finished_at_;
  std::vector<std::thread> threads_;
};

}  // namespace kvpool::tiers
