#pragma once
// The seam between kvpool-bench's shared runner and the systems it measures.
//
// A BenchSystem is one (system, path) pair under test: kvpool on its socket, shm and ucx paths
// (bench/kvpool_target.h) and Redis (bench/redis_target.h). It hands out one BenchTarget per bench
// thread (each with its own connection, as a real worker would have) and answers a few
// housekeeping calls between cases. Adding a path or a peer is one more pair of classes
// implementing these two interfaces; timing, percentiles, verification, JSON and the table stay
// in the runner (bench/runner.h) and bench_main.cc.
//
// Every call moves or looks up a whole batch: that is how inference engines call a KV cache, and
// it is the unit the runner times (one sample per call).
//
// Thread safety: a BenchTarget is used by one thread at a time. BenchSystem's methods are called
// from the main thread only, while no target of it is in a timed phase.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include <kvpool/block_key.h>
#include <kvpool/client.h>
#include <kvpool/status.h>

namespace kvpool::bench {

// One block to store. `parent` is the previous key of its chain; zero for none.
struct BenchBlock {
  BlockKey key;
  const void* data = nullptr;
  size_t size = 0;
  BlockKey parent;
};

// What the fast tier looks like now, for the fragmentation figures. Fields a system does not
// know stay at their defaults (`known` false when it knows none).
struct ArenaStats {
  bool known = false;
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;       // payload bytes of the blocks held
  uint64_t allocated_bytes = 0;  // bytes handed out (rounded up to the allocator's pages)
  uint64_t blocks = 0;
  double fragmentation = 0;  // the system's own definition (kvpool: tiers/host_tier.h)
  uint64_t demotions = 0;    // cumulative, to tell whether a phase spilled to a slower tier
  uint64_t evictions = 0;
};

class BenchTarget {
 public:
  virtual ~BenchTarget() = default;

  // Stores every block. The bench only offers fresh keys, so a block the system reports as
  // already present is an error too (it means two keys collided or a run leaked into another).
  virtual Status Put(std::span<const BenchBlock> blocks) = 0;
  // Reads keys[i] into buffers[i] and sets sizes[i] to the bytes read. A miss or any per-block
  // error is an error: the bench only asks for blocks it stored.
  virtual Status Get(std::span<const BlockKey> keys, std::span<const MutableBuffer> buffers,
                     std::span<size_t> sizes) = 0;
  // Length of the longest cached prefix of `chain`.
  virtual Result<uint32_t> Lookup(std::span<const BlockKey> chain) = 0;

  // Lends keys[i] in place (no copy) until ReleaseBorrowed: views[i] is set to its bytes where
  // the system keeps them. With `verify`, the system checks each block's checksum before lending
  // it. Unimplemented where the system cannot lend in place (BenchSystem::lends_in_place).
  virtual Status Borrow(std::span<const BlockKey> keys, bool verify,
                        std::span<std::span<const uint8_t>> views) {
    return Status::Unimplemented("no in-place reads");
  }
  virtual Status ReleaseBorrowed() { return Status::OK(); }
  // Returns once what this target sent without waiting for an answer (ReleaseBorrowed's end of
  // the leases) has taken effect, so another connection's next call sees it. Default: such
  // sends are synchronous already.
  virtual Status Settle() { return Status::OK(); }

  // Blocks served by Get from below the system's fastest tier since this target was made
  // (kvpool: from disk rather than host). The bench sizes the fast tier so this stays 0.
  virtual uint64_t slow_tier_hits() const { return 0; }
};

class BenchSystem {
 public:
  virtual ~BenchSystem() = default;

  // JSON "system" and "path" of every figure measured through this object.
  virtual std::string system() const = 0;
  virtual std::string path() const = 0;

  // A new connection for one bench thread.
  virtual Result<std::unique_ptr<BenchTarget>> NewTarget(int thread_index) = 0;
  // Removes these blocks so the next case starts from an empty fast tier. Keys the system no
  // longer holds are not an error.
  virtual Status Drop(std::span<const BlockKey> keys) = 0;
  // The fast tier's occupancy and fragmentation now (for a shared daemon: all its tenants).
  virtual Result<ArenaStats> Arena() = 0;
  // Whether its targets lend blocks in place (BenchTarget::Borrow).
  virtual bool lends_in_place() const { return false; }
};

}  // namespace kvpool::bench
