#include "tiers/tier.h"

#include "common/tier_names.h"
#include "tiers/gpu_tier.h"

namespace kvpool::tiers {

Result<TierStack> TierStack::Create(std::vector<StorageTier*> tiers) {
  TierStack stack;
  for (size_t i = 0; i < tiers.size(); ++i) {
    StorageTier* t = tiers[i];
    if (t == nullptr)
      return Status::InvalidArgument("tier stack: tier " + std::to_string(i) + " is null");
    const bool another_gpu = i > 0 && t->id() == Tier::kGpu && tiers[i - 1]->id() == Tier::kGpu;
    if (i > 0 && !another_gpu &&
        static_cast<int>(t->id()) <= static_cast<int>(tiers[i - 1]->id())) {
      return Status::InvalidArgument(std::string("tier stack: ") + TierNameOf(t->id()) + " after " +
                                     TierNameOf(tiers[i - 1]->id()) +
                                     "; tiers go fastest first, each once");
    }
    switch (t->id()) {
      case Tier::kHost:
        stack.host_ = dynamic_cast<MemoryTier*>(t);
        if (stack.host_ == nullptr) {
          return Status::InvalidArgument("tier stack: the host tier must be a memory tier");
        }
        break;
      case Tier::kDisk:
        stack.disk_ = dynamic_cast<BlockStore*>(t);
        if (stack.disk_ == nullptr) {
          return Status::InvalidArgument("tier stack: the disk tier must be a block store");
        }
        break;
      case Tier::kGpu: {
        GpuTier* gpu = dynamic_cast<GpuTier*>(t);
        if (gpu == nullptr)
          return Status::InvalidArgument("tier stack: a gpu tier must be a GpuTier");
        for (const GpuTier* other : stack.gpus_) {
          if (other->device() == gpu->device()) {
            return Status::InvalidArgument("tier stack: two gpu tiers on device " +
                                           std::to_string(gpu->device()));
          }
        }
        stack.gpus_.push_back(gpu);
        break;
      }
      case Tier::kRemote:
        return Status::Unimplemented(std::string("tier stack: the ") + TierNameOf(t->id()) +
                                     " tier is not part of the tier manager yet");
      case Tier::kNone:
        return Status::InvalidArgument("tier stack: a tier without a place");
    }
  }
  if (stack.host_ == nullptr || stack.disk_ == nullptr) {
    return Status::InvalidArgument("tier stack: needs a host memory tier and a disk block store");
  }
  stack.tiers_ = std::move(tiers);
  return stack;
}

}  // namespace kvpool::tiers
