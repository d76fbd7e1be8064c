#pragma once
// Placement strategies, composed per namespace and registered by name (the factory of DESIGN.md
// section 3). A namespace's configuration names one strategy of each kind; a new strategy is
// added by registering a factory with the kind's registry, without touching the tier manager.
//
//   eviction order  which candidate a full tier gives up first: "lru" (default), "s3fifo",
//                   "lfu" (tiers/eviction_order.h). Always tail first.
//   write policy    when a committed block is written to disk:
//                     "write-back"             on demotion only (default)
//                     "write-through"          at commit, before the put returns
//                     "write-through-after-N"  once the block has been hit N times
//   admission       which blocks disk takes (SSD wear; namespaces that must never touch disk):
//                     "all" (default), "after-N-hits" (a block hit fewer than N times is
//                     dropped from host instead of demoted), "none"
//   read-ahead      on a get of a chain's block, how many following blocks of the same chain
//                     start moving toward host: "none", "chain-N" (default "chain-2")
//   encoding        the form blocks take on disk: "raw" (default) or, for a namespace that
//                     declares its block layout and accepts lossy copies, "int8", "fp8-e4m3",
//                     "int4-g32", "int4-g64" (tiers/demotion_encoding.h)
//
// Thread safety: strategies are immutable after creation; the registries are safe to use from
// any thread.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"
#include "tiers/demotion_encoding.h"
#include "tiers/strategy_registry.h"

namespace kvpool::tiers {

class WritePolicy {
 public:
  virtual ~WritePolicy() = default;
  virtual std::string name() const = 0;
  // Whether the block must be on disk before a commit returns.
  virtual bool WriteOnCommit() const = 0;
  // Whether a block only in host should be written to disk now that it has `hits` hits.
  virtual bool WriteAfterHits(uint32_t hits) const = 0;
};

class AdmissionPolicy {
 public:
  virtual ~AdmissionPolicy() = default;
  virtual std::string name() const = 0;
  // Whether disk takes a block that has been hit `hits` times (on demotion, write-through, a
  // session save).
  virtual bool Admit(uint32_t hits) const = 0;
  // Whether disk takes anything at all.
  virtual bool AdmitsAny() const = 0;
};

class ReadAheadPolicy {
 public:
  virtual ~ReadAheadPolicy() = default;
  virtual std::string name() const = 0;
  // Blocks after a read block along its chain to start promoting.
  virtual uint32_t depth() const = 0;
};

StrategyRegistry<WritePolicy>& WritePolicyRegistry();
StrategyRegistry<AdmissionPolicy>& AdmissionRegistry();
StrategyRegistry<ReadAheadPolicy>& ReadAheadRegistry();

// Shorthands: the registry's Create, shared.
Result<std::shared_ptr<const WritePolicy>> CreateWritePolicy(std::string_view name);
Result<std::shared_ptr<const AdmissionPolicy>> CreateAdmission(std::string_view name);
Result<std::shared_ptr<const ReadAheadPolicy>> CreateReadAhead(std::string_view name);

// A namespace's composed strategies.
struct NamespacePolicy {
  std::shared_ptr<const WritePolicy> write;
  std::shared_ptr<const AdmissionPolicy> admission;
  std::shared_ptr<const ReadAheadPolicy> read_ahead;
  // The eviction order's name (tiers/eviction_order.h); the tier manager instantiates it per
  // tier. Empty: the default pool's order.
  std::string eviction;
  // Encoding on demotion (tiers/demotion_encoding.h). Null: raw, the bytes as put.
  std::shared_ptr<const DemotionEncoding> encoding;
  // Quotas (0: none), per namespace only. Host: the bytes of host segments the namespace may
  // hold (rounded up to whole segments), so holding a few pages of many segments counts in full.
  // Disk: the bytes it stores there (encoded bytes for encoded blocks). Over quota, a namespace
  // gives up its own coldest blocks, never another's; what it cannot (leased, pinned) makes its
  // own writes fail with ResourceExhausted.
  uint64_t host_quota_bytes = 0;
  uint64_t disk_quota_bytes = 0;
  // Gpu: as host, on each GPU's tier separately.
  uint64_t gpu_quota_bytes = 0;
};

// The default composition: lru, write-back, all, chain-2.
NamespacePolicy DefaultNamespacePolicy();

// Composes a policy from names (empty: the default of that kind), checking each and the
// combination (write-through needs a disk that admits blocks). InvalidArgument naming the kind.
Result<NamespacePolicy> ComposePolicy(std::string_view eviction, std::string_view write,
                                      std::string_view admission, std::string_view read_ahead);

// "eviction=lru write=write-back admission=all read-ahead=chain-2 encoding=raw".
std::string DescribePolicy(const NamespacePolicy& policy);

}  // namespace kvpool::tiers
