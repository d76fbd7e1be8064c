#pragma once
// The timed loops of kvpool-bench: put, get and lookup against any BenchTarget, a mixed-size put
// for the fragmentation probe, and the memcpy baseline. Each is a PhaseWorker (bench/runner.h):
// Prepare (untimed, on its own thread) connects and fills its buffers; Run times one sample per
// call, around the call only (stamping and verification are outside the sample, inside wall
// time).
//
// Thread safety: each worker is used by the one thread the runner gives it; the PatternSet and
// the StoredBlock lists they read are shared read-only.

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_target.h"
#include "bench/block_data.h"
#include "bench/runner.h"

namespace kvpool::bench {

// Puts fresh blocks of `pattern.block_bytes()` bytes, `batch` per call, until the phase ends or
// its `max_blocks` keys are all stored (then it reports OutOfData).
class PutWorker : public PhaseWorker {
 public:
  PutWorker(BenchSystem& system, int index, const PatternSet& pattern, size_t batch,
            std::string run_secret, std::string stream, size_t max_blocks);
  Status Prepare() override;
  Status Run(PhaseClock& clock) override;
  // The blocks stored, in put order (valid after the phase).
  std::vector<StoredBlock> Stored() const;

 private:
  BenchSystem& system_;
  const int index_;
  const PatternSet& pattern_;
  const size_t batch_;
  const std::string run_secret_;
  const std::string stream_;
  const size_t max_blocks_;
  std::unique_ptr<BenchTarget> target_;
  std::vector<BlockKey> keys_;
  AlignedBuffer buffers_;
  size_t stored_ = 0;
};

// Gets `batch` of `blocks` per call, walking them in order from `start` (wrapping), and checks
// every `verify_every`-th call (and the first) byte for byte.
class GetWorker : public PhaseWorker {
 public:
  GetWorker(BenchSystem& system, int index, const PatternSet& pattern, size_t batch,
            const std::vector<StoredBlock>& blocks, size_t start, uint32_t verify_every);
  Status Prepare() override;
  Status Run(PhaseClock& clock) override;
  uint64_t verified_calls() const { return verified_calls_; }
  uint64_t verified_blocks() const { return verified_blocks_; }
  uint64_t slow_tier_hits() const { return target_ ? target_->slow_tier_hits() : 0; }

 private:
  BenchSystem& system_;
  const int index_;
  const PatternSet& pattern_;
  const size_t batch_;
  const std::vector<StoredBlock>& blocks_;
  const size_t start_;
  const uint32_t verify_every_;
  std::unique_ptr<BenchTarget> target_;
  AlignedBuffer buffers_;
  uint64_t verified_calls_ = 0;
  uint64_t verified_blocks_ = 0;
};

// Borrows `batch` of `blocks` per call (the shared-memory in-place read: no bytes copied) and
// releases them, walking them as GetWorker does; a sample is the borrow and the release. Every
// `verify_every`-th call (and the first) reads the lent bytes and checks them, outside the sample.
// `verify`: the client hashes each block before lending it (BorrowOptions::verify).
class BorrowWorker : public PhaseWorker {
 public:
  BorrowWorker(BenchSystem& system, int index, const PatternSet& pattern, size_t batch,
               const std::vector<StoredBlock>& blocks, size_t start, uint32_t verify_every,
               bool verify);
  Status Prepare() override;
  Status Run(PhaseClock& clock) override;
  uint64_t verified_blocks() const { return verified_blocks_; }

 private:
  BenchSystem& system_;
  const int index_;
  const PatternSet& pattern_;
  const size_t batch_;
  const std::vector<StoredBlock>& blocks_;
  const size_t start_;
  const uint32_t verify_every_;
  const bool verify_;
  std::unique_ptr<BenchTarget> target_;
  uint64_t verified_blocks_ = 0;
};

// Looks up the whole `chain` per call; every call must find all of it cached.
class LookupWorker : public PhaseWorker {
 public:
  LookupWorker(BenchSystem& system, int index, const std::vector<BlockKey>& chain);
  Status Prepare() override;
  Status Run(PhaseClock& clock) override;

 private:
  BenchSystem& system_;
  const int index_;
  const std::vector<BlockKey>& chain_;
  std::unique_ptr<BenchTarget> target_;
};

// Puts fresh blocks whose sizes are drawn from `sizes` (each at most pattern.block_bytes()),
// `batch` per call, until `budget_bytes` of page-rounded allocation is stored.
class MixedPutWorker : public PhaseWorker {
 public:
  MixedPutWorker(BenchSystem& system, const PatternSet& pattern, size_t batch,
                 std::vector<size_t> sizes, uint64_t budget_bytes, std::string run_secret,
                 std::string stream, uint64_t seed);
  Status Prepare() override;
  Status Run(PhaseClock& clock) override;
  const std::vector<StoredBlock>& stored() const { return stored_; }

 private:
  BenchSystem& system_;
  const PatternSet& pattern_;
  const size_t batch_;
  const std::vector<size_t> sizes_;
  const uint64_t budget_bytes_;
  const std::string run_secret_;
  const std::string stream_;
  std::mt19937_64 rng_;
  std::unique_ptr<BenchTarget> target_;
  std::vector<BlockKey> keys_;
  AlignedBuffer buffers_;
  std::vector<StoredBlock> stored_;
};

// The machine's limit: memcpy of `batch` blocks per call from a ring larger than the caches
// (the way a get reads a cold arena) into one reused batch of buffers.
class MemcpyWorker : public PhaseWorker {
 public:
  MemcpyWorker(const AlignedBuffer& ring, size_t block_bytes, size_t batch);
  Status Prepare() override;
  Status Run(PhaseClock& clock) override;

 private:
  const AlignedBuffer& ring_;
  const size_t block_bytes_;
  const size_t batch_;
  AlignedBuffer buffers_;
};

// The bare socket, as a reference: a get without kvpool. The timed thread sends an 8-byte request
// over a Unix socketpair; a serving thread (pinned to `receiver_cpus`, as the daemon would be)
// answers with `batch` blocks from the same cold ring in one sendmsg; the timed thread reads
// each block into its own reused buffer. One round trip per call, payload one way, blocking
// sockets, default buffer sizes.
class SocketpairWorker : public PhaseWorker {
 public:
  SocketpairWorker(const AlignedBuffer& ring, size_t block_bytes, size_t batch,
                   std::vector<int> receiver_cpus);
  ~SocketpairWorker() override;
  Status Prepare() override;
  Status Run(PhaseClock& clock) override;

 private:
  void Receive();
  void StopReceiver();

  const AlignedBuffer& ring_;
  const size_t block_bytes_;
  const size_t batch_;
  const std::vector<int> receiver_cpus_;
  int fds_[2] = {-1, -1};
  std::thread receiver_;
  AlignedBuffer receive_buffers_;
};

// Reads `blocks` back through `target` (`batch` per call) and verifies each byte for byte.
Status VerifyStored(BenchTarget& target, const PatternSet& pattern, size_t batch,
                    const std::vector<StoredBlock>& blocks);

}  // namespace kvpool::bench
