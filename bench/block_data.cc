#include "bench/block_data.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

namespace kvpool::bench {

void AlignedBuffer::Free::operator()(uint8_t* p) const { std::free(p); }

AlignedBuffer::AlignedBuffer(size_t bytes) {
  const size_t rounded = (bytes + kStampPage - 1) / kStampPage * kStampPage;
  void* p = std::aligned_alloc(kStampPage, rounded == 0 ? kStampPage : rounded);
  if (p == nullptr) {
    std::fprintf(stderr, "kvpool-bench: cannot allocate %zu bytes\n", bytes);
    std::abort();
  }
  std::memset(p, 0, rounded);  // fault every page in now, not in a timed phase
  data_.reset(static_cast<uint8_t*>(p));
  size_ = bytes;
}

PatternSet::PatternSet(size_t block_bytes, size_t slots, uint64_t seed)
    : block_bytes_(block_bytes), slots_(slots), bytes_(block_bytes * slots) {
  // splitmix64: fast, and no two slots or offsets repeat each other.
  uint64_t x = seed;
  uint8_t* p = bytes_.data();
  const size_t n = block_bytes * slots;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t z = SplitMix64(x);
    x += kSplitMixGamma;
    std::memcpy(p + i, &z, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<uint8_t>(i * 131 + 7);
}

namespace {

// Stamp of page `page` of the block with `key`: key bytes 0..7, then the page index.
void MakeStamp(const BlockKey& key, uint64_t page, uint8_t out[kStampBytes]) {
  std::memcpy(out, key.bytes.data(), 8);
  std::memcpy(out + 8, &page, 8);
}

}  // namespace

void StampBlock(const BlockKey& key, uint8_t* block, size_t size) {
  uint8_t stamp[kStampBytes];
  for (size_t off = 0, page = 0; off < size; off += kStampPage, ++page) {
    MakeStamp(key, page, stamp);
    std::memcpy(block + off, stamp, std::min(kStampBytes, size - off));
  }
}

Status VerifyBlock(const BlockKey& key, const uint8_t* got, size_t got_size, const uint8_t* pattern,
                   size_t expected_size) {
  if (got_size != expected_size) {
    return Status::Corruption("block " + key.ShortHex() + " came back with " +
                              std::to_string(got_size) + " bytes, not " +
                              std::to_string(expected_size));
  }
  auto mismatch = [&](size_t off, const char* what) {
    return Status::Corruption("block " + key.ShortHex() + " differs from what was stored at " +
                              what + " of offset " + std::to_string(off) + " (of " +
                              std::to_string(expected_size) + " bytes)");
  };
  for (size_t off = 0, page = 0; off < expected_size; off += kStampPage, ++page) {
    const size_t end = std::min(expected_size, off + kStampPage);
    const size_t body = std::min(end, off + kStampBytes);
    uint8_t stamp[kStampBytes];
    MakeStamp(key, page, stamp);
    if (std::memcmp(got + off, stamp, body - off) != 0) return mismatch(off, "the page stamp");
    if (std::memcmp(got + body, pattern + body, end - body) != 0) {
      return mismatch(body, "the page body");
    }
  }
  return Status::OK();
}

std::vector<BlockKey> MakeKeys(const std::string& run_secret, const std::string& stream,
                               size_t count) {
  // One token per block: key i chains from key i-1, so each key costs one SHA-256 and all are
  // distinct. The layout string carries the stream name.
  ChainHasher hasher(run_secret, "kvpool-bench;stream=" + stream, 1);
  std::vector<int32_t> tokens(count);
  for (size_t i = 0; i < count; ++i) tokens[i] = static_cast<int32_t>(i);
  return hasher.Hash(tokens);
}

std::string RandomSecret() {
  std::random_device rd;
  std::string out;
  static const char kHex[] = "0123456789abcdef";
  for (int i = 0; i < 8; ++i) {
    const uint32_t v = rd();
    for (int b = 0; b < 4; ++b) out.push_back(kHex[(v >> (b * 4)) & 15]);
  }
  return out;
}

}  // namespace kvpool::bench
