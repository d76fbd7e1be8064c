// A kvpoold with an eviction order of its own: "largest-first" gives up the largest candidate
// blocks first (oldest first among blocks of one size class), so that many small blocks (short
// prompts' tails, small models' blocks) stay cached under pressure from a few big ones.
//
// A strategy is a class implementing its kind's interface, here tiers::EvictionOrder
// (tiers/eviction_order.h), registered by name before the daemon starts; the namespaces file then
// names it like a built-in one:
//
//   namespaces:
//     mixed-sizes: {eviction: largest-first}
//
//   $ kvpool-custom-eviction --namespaces_file=namespaces.yaml [kvpoold's flags]
//
// The order only ranks the candidates the block index gives it, so tail-first eviction along a
// chain, leases and session pins hold for it as for every order. It keeps its candidates in the
// entries' own per-tier list links (tiers::CandidateList): no allocation per block.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "daemon/daemon_main.h"
#include "tiers/eviction_order.h"

namespace {

using kvpool::tiers::CandidateList;
using kvpool::tiers::EntryId;
using kvpool::tiers::EvictionContext;
using kvpool::tiers::EvictionOrder;
using kvpool::tiers::kNoEntry;
using kvpool::tiers::VictimFilter;

class LargestFirstOrder final : public EvictionOrder {
 public:
  explicit LargestFirstOrder(const EvictionContext& c) : index_(*c.index), tier_(c.tier) {}

  std::string name() const override { return "largest-first"; }

  void Add(EntryId id, bool /*after_child*/) override {
    const uint32_t size_class = SizeClass(index_.at(id).size);
    classes_.try_emplace(size_class, index_, tier_).first->second.PushBack(id);
  }
  void Remove(EntryId id) override {
    // A candidate's size does not change, so its class is found again from it.
    auto it = classes_.find(SizeClass(index_.at(id).size));
    it->second.Remove(id);
    if (it->second.empty()) classes_.erase(it);
  }
  void Use(EntryId) override {}  // recency does not matter to this order

  void Victims(uint64_t bytes, const VictimFilter& evictable, std::vector<EntryId>* out) override {
    uint64_t gathered = 0;
    for (auto it = classes_.rbegin(); it != classes_.rend() && gathered < bytes; ++it) {
      for (EntryId id = it->second.front(); id != kNoEntry && gathered < bytes;
           id = it->second.Next(id)) {
        if (!evictable(id)) continue;
        out->push_back(id);
        gathered += index_.at(id).size;
      }
    }
  }

 private:
  // Power-of-two size classes: 4 KiB, 8 KiB, ... (floor of log2 of the size).
  static uint32_t SizeClass(uint64_t size) {
    uint32_t c = 0;
    while (size >>= 1) ++c;
    return c;
  }

  kvpool::tiers::BlockIndex& index_;
  const kvpool::Tier tier_;
  std::map<uint32_t, CandidateList> classes_;  // by size class; each front: oldest
};

}  // namespace

int main(int argc, char** argv) {
  kvpool::tiers::EvictionOrderRegistry().Register(
      "largest-first",
      [](std::string_view,
         const EvictionContext& c) -> kvpool::Result<std::unique_ptr<EvictionOrder>> {
        return std::unique_ptr<EvictionOrder>(new LargestFirstOrder(c));
      });
  return kvpool::daemon::DaemonMain(argc, argv);
}
