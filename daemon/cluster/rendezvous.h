#pragma once
// Rendezvous (highest-random-weight) hashing: orders the live members of the cluster for each
// block key. The first member of a key's order is its home node; the first `replicas + 1` are
// the nodes that keep a copy. Every process that sees the same member set computes the same
// order for the same key, with no coordination: that is how a lookup on node C finds the block
// node A computed.
//
// Weight of node n for key k: XXH3-64 of the key's 32 bytes with seed XXH3-64(node id); ties
// (probability 2^-64) are broken by the smaller node id. Why xxh3 and not SHA-256: block keys
// are already SHA-256 outputs, uniformly spread and unpredictable without the tokens, so the
// placement hash needs dispersion, not collision resistance; xxh3 gives that at ~20 ns per
// (key, node) pair against ~300 ns for SHA-256, and a lookup orders up to 4096 keys over every
// member. Its output is frozen since xxHash 0.8.0 (known-answer test in rendezvous_test.cc), so
// daemons of different builds agree. A tenant who chooses its tokens can aim keys at one node
// with any public hash; per-namespace quotas bound what that costs.
//
// Removing a member moves only the keys whose home it was (each to its next member in the
// key's order); adding one takes over only the keys it now wins. Nothing else moves.
//
// Thread safety: Ring is immutable after construction and may be shared between threads;
// the free functions are pure.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <kvpool/block_key.h>

namespace kvpool::daemon::cluster {

using NodeId = std::string;

// The member set, with each node's seed computed once. Duplicate ids are kept once.
class Ring {
 public:
  Ring() = default;
  explicit Ring(std::vector<NodeId> members);

  bool empty() const { return nodes_.empty(); }
  size_t size() const { return nodes_.size(); }
  // The members, sorted by id.
  std::vector<NodeId> members() const;

  // Every member, highest weight for `key` first.
  std::vector<NodeId> Order(const BlockKey& key) const;
  // The first min(n, size()) members of Order(key): the nodes that keep copies of the block.
  std::vector<NodeId> Homes(const BlockKey& key, size_t n) const;
  // The key's home node (Order(key)[0]). The ring must not be empty.
  const NodeId& Home(const BlockKey& key) const;

  // The weight of `node` for `key` (exposed for tests and tools).
  static uint64_t Weight(const BlockKey& key, std::string_view node);

 private:
  struct Node {
    NodeId id;
    uint64_t seed;
  };
  std::vector<Node> nodes_;  // sorted by id
};

// One-shot forms of Ring::Order and Ring::Homes (build a Ring to order many keys).
std::vector<NodeId> Order(const BlockKey& key, const std::vector<NodeId>& members);
std::vector<NodeId> Homes(const BlockKey& key, const std::vector<NodeId>& members, size_t n);

}  // namespace kvpool::daemon::cluster
