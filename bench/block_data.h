#pragma once
// The bytes and keys kvpool-bench stores, and how it checks what comes back.
//
// Every block is a pattern slot (random bytes, fixed per run) with a stamp at the start of each
// 4 KiB page: the first 8 bytes of the block's key and the page's index (cut short in a last
// page of fewer than 16 bytes). A block read back is
// compared byte for byte with the pattern plus its own stamps, so a wrong block, a block from
// another run, a page from the wrong offset, a short read and a flipped bit all fail.
//
// Keys are real block keys (kvpool::ChainHasher over a per-run random secret), so every run
// uses fresh keys and two runs against one daemon never share a block.
//
// Thread safety: PatternSet and AlignedBuffer are read-only after construction (any thread may
// read); the free functions are pure.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <kvpool/block_key.h>
#include <kvpool/status.h>

namespace kvpool::bench {

// splitmix64: a fast, well-mixed 64-bit function of `x`, for keys and bytes that are pure
// functions of an index. Successive outputs of the generator are SplitMix64(seed + k *
// kSplitMixGamma).
inline constexpr uint64_t kSplitMixGamma = 0x9e3779b97f4a7c15ull;
inline uint64_t SplitMix64(uint64_t x) {
  x += kSplitMixGamma;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline constexpr size_t kStampPage = 4096;
inline constexpr size_t kStampBytes = 16;

// Page-aligned, pre-faulted memory (so no timed phase pays for first touch).
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // Aborts when the memory cannot be had: the bench cannot measure anything without it.
  explicit AlignedBuffer(size_t bytes);
  uint8_t* data() { return data_.get(); }
  const uint8_t* data() const { return data_.get(); }
  size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<uint8_t, Free> data_;
  size_t size_ = 0;
};

// `slots` read-only blocks of `block_bytes` random bytes each.
class PatternSet {
 public:
  PatternSet(size_t block_bytes, size_t slots, uint64_t seed);
  const uint8_t* slot(size_t i) const { return bytes_.data() + (i % slots_) * block_bytes_; }
  size_t block_bytes() const { return block_bytes_; }
  size_t slots() const { return slots_; }

 private:
  size_t block_bytes_;
  size_t slots_;
  AlignedBuffer bytes_;
};

// A stored block: its key and which pattern slot its body came from.
struct StoredBlock {
  BlockKey key;
  uint32_t slot = 0;
  uint32_t size = 0;
};

// Writes key's stamps into `block` (whose other bytes are a pattern slot's).
void StampBlock(const BlockKey& key, uint8_t* block, size_t size);
// OK when `got` (got_size bytes) is `pattern` (expected_size bytes) with key's stamps;
// Corruption naming the first differing offset otherwise.
Status VerifyBlock(const BlockKey& key, const uint8_t* got, size_t got_size, const uint8_t* pattern,
                   size_t expected_size);

// `count` fresh keys for stream `stream` of this run (distinct streams never share a key).
std::vector<BlockKey> MakeKeys(const std::string& run_secret, const std::string& stream,
                               size_t count);
// 32 hex characters from the OS's random source: the run's secret.
std::string RandomSecret();

}  // namespace kvpool::bench
