// CopyWithChecksum against an independent reference (memcpy, then libxxhash's one-shot XXH3 of
// the copy): the same bytes and the same checksum for every length around its chunk size and
// every alignment of source and destination within a cache line (it copies in short pieces when
// the destination is a few bytes past the source modulo 4 KiB).

#include "common/checksum.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <random>
#include <vector>

namespace kvpool {
namespace {

TEST(CopyWithChecksumTest, MatchesMemcpyAndXxh3ForEveryAlignmentAndLength) {
  std::mt19937_64 rng(42);
  std::vector<uint8_t> src(300 * 1024 + 128);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  std::vector<uint8_t> dst(src.size() + 128);
  const size_t lengths[] = {0,    1,     15,    63,    64,         65,        4095,
                            4096, 65535, 65536, 65537, 131072 + 7, 300 * 1024};
  for (size_t length : lengths) {
    for (size_t src_off : {0, 1, 16, 48}) {
      for (size_t dst_off : {0, 3, 16, 32, 63, 80}) {
        std::fill(dst.begin(), dst.end(), 0xee);
        const uint64_t got = CopyWithChecksum(dst.data() + dst_off, src.data() + src_off, length);
        ASSERT_EQ(std::memcmp(dst.data() + dst_off, src.data() + src_off, length), 0)
            << length << " " << src_off << " " << dst_off;
        EXPECT_EQ(got, XXH3_64bits(src.data() + src_off, length))
            << length << " " << src_off << " " << dst_off;
        // Nothing outside the destination range is touched.
        for (size_t i = 0; i < dst_off; ++i) ASSERT_EQ(dst[i], 0xee);
        for (size_t i = dst_off + length; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xee);
      }
    }
  }
}

}  // namespace
}  // namespace kvpool
