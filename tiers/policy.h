#pragma once
// Placement strategies, composed per namespace and registered by name.
//
// A namespace's configuration names one strategy of each kind; a new strategy is added by
// registering a factory, without touching the tier manager. Kinds so far:
//   write policy  when a committed block is written to disk:
//                   "write-back"      on demotion only (default)
//                   "write-through"   at commit, before the put returns
//                   "write-through-after-2" (any N) once the block has been hit N times
// Eviction order is LRU, tail first (daemon/block_index.h); it is not yet pluggable.
//
// Thread safety: strategies are immutable after creation; the registry is safe to use from
// any thread.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

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

using WritePolicyFactory =
    std::function<Result<std::unique_ptr<WritePolicy>>(std::string_view name)>;

// Registers a factory for names starting with `prefix` (exact match when `prefix` does not end
// in '-'). Later registrations win.
void RegisterWritePolicy(std::string prefix, WritePolicyFactory factory);
// InvalidArgument listing the known names when none matches.
Result<std::shared_ptr<const WritePolicy>> CreateWritePolicy(std::string_view name);

// A namespace's composed strategies.
struct NamespacePolicy {
  std::shared_ptr<const WritePolicy> write;
};

// The default composition: write-back.
NamespacePolicy DefaultNamespacePolicy();

}  // namespace kvpool::tiers
