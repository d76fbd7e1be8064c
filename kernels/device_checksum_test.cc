// The device checksum (kernels/device_checksum.h): its XXH64, shared by the CPU twin and the CUDA
// kernel, equals libxxhash's XXH64 (the independent reference) on every length class, unaligned
// starts and several seeds; the checksum is the composition its header defines, built here from
// libxxhash alone; and it tells apart what it must (one flipped byte anywhere, a chunk moved).

#include <gtest/gtest.h>
#include <xxhash.h>

#include <random>
#include <vector>

#include "kernels/device_checksum.h"
#include "kernels/xxh64_inline.h"

namespace kvpool::kernels {
namespace {

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// dsum as device_checksum.h defines it, from libxxhash.
uint64_t ReferenceDsum(const uint8_t* p, size_t n) {
  std::vector<uint64_t> c;
  for (size_t off = 0; off < n; off += kDeviceChecksumChunkBytes) {
    c.push_back(XXH64(p + off, std::min(kDeviceChecksumChunkBytes, n - off), 0));
  }
  return XXH64(c.data(), c.size() * sizeof(uint64_t), n);
}

TEST(DeviceChecksumTest, Xxh64MatchesLibxxhashOnEveryLengthClass) {
  const std::vector<uint8_t> buf = RandomBytes(5000, 1);
  for (uint64_t seed : {0ull, 1ull, 0x9E3779B97F4A7C15ull, ~0ull}) {
    for (size_t offset : {0, 1, 3, 7}) {
      for (size_t len = 0; len <= 300; ++len) {
        ASSERT_EQ(xxh64::Hash(buf.data() + offset, len, seed),
                  XXH64(buf.data() + offset, len, seed))
            << "len " << len << " offset " << offset << " seed " << seed;
      }
      for (size_t len :
           {size_t{1023}, size_t{1024}, size_t{4095}, size_t{4096}, size_t{4097}, 4999 - offset}) {
        ASSERT_EQ(xxh64::Hash(buf.data() + offset, len, seed),
                  XXH64(buf.data() + offset, len, seed))
            << "len " << len;
      }
    }
  }
}

TEST(DeviceChecksumTest, IsTheChunkedCompositionOfXxh64) {
  const std::vector<uint8_t> buf = RandomBytes(3 << 20, 2);
  for (size_t n : {size_t{0}, size_t{1}, size_t{31}, size_t{4095}, size_t{4096}, size_t{4097},
                   size_t{12288}, size_t{100000}, size_t{1} << 20, (size_t{3} << 20) - 5}) {
    EXPECT_EQ(DeviceChecksumCpu(buf.data(), n), ReferenceDsum(buf.data(), n)) << n;
  }
  // Not the block's own checksum, nor a plain XXH64 of the bytes.
  EXPECT_NE(DeviceChecksumCpu(buf.data(), 8192), XXH64(buf.data(), 8192, 0));
}

TEST(DeviceChecksumTest, ChangesWithAnyByteAndWithChunkOrder) {
  std::vector<uint8_t> buf = RandomBytes(64 << 10, 3);
  const uint64_t base = DeviceChecksumCpu(buf.data(), buf.size());
  for (size_t at : {size_t{0}, size_t{4095}, size_t{4096}, size_t{40000}, buf.size() - 1}) {
    buf[at] ^= 0x01;
    EXPECT_NE(DeviceChecksumCpu(buf.data(), buf.size()), base) << at;
    buf[at] ^= 0x01;
  }
  // Two chunks swapped: same chunk values, other order.
  std::vector<uint8_t> swapped = buf;
  std::swap_ranges(swapped.begin(), swapped.begin() + 4096, swapped.begin() + 4096);
  EXPECT_NE(DeviceChecksumCpu(swapped.data(), swapped.size()), base);
  // The length is in it: a zero byte appended changes it.
  buf.push_back(0);
  EXPECT_NE(DeviceChecksumCpu(buf.data(), buf.size()), base);
}

}  // namespace
}  // namespace kvpool::kernels
