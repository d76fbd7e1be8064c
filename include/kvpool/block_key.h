#pragma once
// Block keys: the 32-byte content address of a KV-cache block.
//
// key_i = SHA-256(key_{i-1} || SHA-256(namespace secret) || SHA-256(layout string) ||
//                 tokens of block i as little-endian int32), key_{-1} = 32 zero bytes
// (or the last key of a parent chain being extended). The exact construction and its
// known-answer vectors are in the project's spec/block-keys.md; every language binding
// must reproduce them byte for byte. Only full blocks get keys.
//
// Thread safety: pure functions and plain values.

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <kvpool/status.h>

namespace kvpool {

struct BlockKey {
  static constexpr size_t kSize = 32;
  std::array<uint8_t, kSize> bytes{};

  // Lower-case hex, 64 characters.
  std::string ToHex() const;
  // First 8 bytes in hex: enough to tell keys apart in logs.
  std::string ShortHex() const;
  // Parses 64 hex characters; InvalidArgument otherwise.
  static Result<BlockKey> FromHex(std::string_view hex);
  // Builds a key from 32 raw bytes; InvalidArgument if `raw` has another length.
  static Result<BlockKey> FromBytes(std::string_view raw);
  std::string_view AsStringView() const {
    return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
  }
  bool IsZero() const;

  // Four word compares, inline (g++ 12 makes std::array's == a call to memcmp: one per key a
  // lookup finds).
  friend bool operator==(const BlockKey& a, const BlockKey& b) {
    uint64_t x[4], y[4];
    static_assert(sizeof(x) == kSize);
    std::memcpy(x, a.bytes.data(), kSize);
    std::memcpy(y, b.bytes.data(), kSize);
    return ((x[0] ^ y[0]) | (x[1] ^ y[1]) | (x[2] ^ y[2]) | (x[3] ^ y[3])) == 0;
  }
  friend bool operator!=(const BlockKey& a, const BlockKey& b) { return !(a == b); }
  friend bool operator<(const BlockKey& a, const BlockKey& b) { return a.bytes < b.bytes; }
  // abseil's hash (absl::Hash, absl::HashOf, its hash maps): all 32 bytes, as four words mixed
  // into abseil's seeded state, for keys that clients may choose. (Hashed as a std::string_view
  // they would go through std::hash in Debian's abseil: an unseeded murmur whose collisions
  // anyone can compute.)
  template <typename H>
  friend H AbslHashValue(H h, const BlockKey& k) {
    uint64_t w[4];
    static_assert(sizeof(w) == kSize);
    std::memcpy(w, k.bytes.data(), sizeof(w));
    return H::combine(std::move(h), w[0], w[1], w[2], w[3]);
  }
};

// SHA-256 of the namespace secret (the salt mixed into every key of that namespace).
BlockKey NamespaceSalt(std::string_view namespace_secret);
// SHA-256 of the canonical layout string.
BlockKey LayoutFingerprint(std::string_view layout);

// Hashes token chains for one (namespace secret, layout) pair; keeps the salt and the
// fingerprint so hashing a chain costs one SHA-256 per block.
class ChainHasher {
 public:
  ChainHasher(std::string_view namespace_secret, std::string_view layout,
              uint32_t tokens_per_block);

  uint32_t tokens_per_block() const { return tokens_per_block_; }
  const BlockKey& salt() const { return salt_; }
  const BlockKey& layout_fingerprint() const { return layout_fp_; }

  // Keys of the full blocks of `tokens`, continuing from `parent` (zero key for a new chain).
  // A tail of fewer than tokens_per_block tokens gets no key.
  std::vector<BlockKey> Hash(std::span<const int32_t> tokens, const BlockKey& parent = {}) const;

 private:
  BlockKey salt_;
  BlockKey layout_fp_;
  uint32_t tokens_per_block_;
};

// Canonical layout string builder: `model=...;dtype=...;layers=...;kv_heads=...;head_dim=...;
// tokens_per_block=...;tp_rank=...;tp_size=...;encoding=...`, fixed fields first.
struct LayoutSpec {
  std::string model;
  std::string dtype = "bf16";
  uint32_t layers = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t tokens_per_block = 16;
  uint32_t tp_rank = 0;
  uint32_t tp_size = 1;
  std::string encoding = "raw";
  std::string ToCanonicalString() const;
};

// A key's first 8 bytes: uniform for keys made by ChainHasher (SHA-256), and nothing more. For
// keys that someone else may choose (a daemon's), use absl::Hash<BlockKey> instead.
struct BlockKeyHash {
  size_t operator()(const BlockKey& k) const {
    size_t h;
    static_assert(sizeof(h) <= BlockKey::kSize);
    __builtin_memcpy(&h, k.bytes.data(), sizeof(h));  // keys are SHA-256 output: uniform
    return h;
  }
};

}  // namespace kvpool
