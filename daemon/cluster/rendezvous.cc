#include "daemon/cluster/rendezvous.h"

#include <xxhash.h>

#include <algorithm>
#include <utility>

namespace kvpool::daemon::cluster {
namespace {

uint64_t NodeSeed(std::string_view node) { return XXH3_64bits(node.data(), node.size()); }

uint64_t KeyWeight(const BlockKey& key, uint64_t seed) {
  return XXH3_64bits_withSeed(key.bytes.data(), key.bytes.size(), seed);
}

}  // namespace

Ring::Ring(std::vector<NodeId> members) {
  std::sort(members.begin(), members.end());
  members.erase(std::unique(members.begin(), members.end()), members.end());
  nodes_.reserve(members.size());
  for (auto& id : members) {
    const uint64_t seed = NodeSeed(id);
    nodes_.push_back(Node{std::move(id), seed});
  }
}

std::vector<NodeId> Ring::members() const {
  std::vector<NodeId> out;
  out.reserve(nodes_.size());
  for (const auto& n : nodes_) out.push_back(n.id);
  return out;
}

uint64_t Ring::Weight(const BlockKey& key, std::string_view node) {
  return KeyWeight(key, NodeSeed(node));
}

std::vector<NodeId> Ring::Homes(const BlockKey& key, size_t n) const {
  n = std::min(n, nodes_.size());
  std::vector<std::pair<uint64_t, size_t>> weighted;  // (weight, index into nodes_)
  weighted.reserve(nodes_.size());
  for (size_t i = 0; i < nodes_.size(); ++i)
    weighted.emplace_back(KeyWeight(key, nodes_[i].seed), i);
  // Higher weight first; on a tie the smaller id, i.e. the smaller index (nodes_ is sorted).
  const auto before = [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  std::partial_sort(weighted.begin(), weighted.begin() + static_cast<ptrdiff_t>(n), weighted.end(),
                    before);
  std::vector<NodeId> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) out.push_back(nodes_[weighted[i].second].id);
  return out;
}

std::vector<NodeId> Ring::Order(const BlockKey& key) const { return Homes(key, nodes_.size()); }

const NodeId& Ring::Home(const BlockKey& key) const {
  if (nodes_.empty())
    AbortWithStatus(Status::Internal("Ring::Home on an empty ring"), __FILE__, __LINE__);
  size_t best = 0;
  uint64_t best_weight = KeyWeight(key, nodes_[0].seed);
  for (size_t i = 1; i < nodes_.size(); ++i) {
    const uint64_t w = KeyWeight(key, nodes_[i].seed);
    if (w > best_weight) {  // strictly greater: on a tie the earlier (smaller) id stays
      best = i;
      best_weight = w;
    }
  }
  return nodes_[best].id;
}

std::vector<NodeId> Order(const BlockKey& key, const std::vector<NodeId>& members) {
  return Ring(members).Order(key);
}

std::vector<NodeId> Homes(const BlockKey& key, const std::vector<NodeId>& members, size_t n) {
  return Ring(members).Homes(key, n);
}

}  // namespace kvpool::daemon::cluster
