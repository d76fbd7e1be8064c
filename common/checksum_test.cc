// CopyWithChecksum against an independent reference (memcpy, then libxxhash's one-shot XXH3 of
// the copy): the same bytes and the same checksum for every length around its chunk and stripe
// block sizes, in both its forms, and every alignment of source and destination within a cache
// line (it copies in short pieces when the destination is a few bytes past the source modulo
// 4 KiB).

#include "common/checksum.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <random>
#include <vector>

#include "common/checksum_fused.h"

namespace kvpool {
namespace {

TEST(CopyWithChecksumTest, MatchesMemcpyAndXxh3ForEveryAlignmentAndLength) {
  std::mt19937_64 rng(42);
  std::vector<uint8_t> src(300 * 1024 + 128);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  std::vector<uint8_t> dst(src.size() + 128);
  // Around XXH3's mid-size limit (240: longer inputs take the one-pass form where the CPU has
  // AVX2), its 1 KiB blocks of stripes, and the 64 KiB chunks of the other form.
  const size_t lengths[] = {0,    1,    15,    63,    64,    65,    240,        241,
                            255,  256,  1023,  1024,  1025,  1087,  1088,       1089,
                            4095, 4096, 65535, 65536, 65537, 70000, 131072 + 7, 300 * 1024};
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

// The one-pass form on its own (CopyWithChecksum takes it only where the CPU has AVX2), with
// plain and with non-temporal stores, at every length from its least to a few blocks of stripes
// past 4 KiB, against libxxhash.
TEST(CopyWithChecksumTest, TheOnePassFormMatchesXxh3AtEveryLength) {
  if (!internal::CanCopyWithChecksumFused()) {
    GTEST_SKIP() << "this CPU has no AVX2";
  }
  std::mt19937_64 rng(7);
  std::vector<uint8_t> src(8192 + 64);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  std::vector<uint8_t> dst(src.size() + 64);
  constexpr size_t kAlignedBytes = 8192 + 128;
  alignas(64) static uint8_t aligned[kAlignedBytes];
  for (size_t length = internal::kFusedMinBytes; length <= 8192; ++length) {
    const size_t src_off = length % 7;
    const size_t dst_off = length % 13;
    for (bool stream : {false, true}) {
      // Non-temporal stores need an aligned destination.
      uint8_t* const d = stream ? aligned + dst_off / 32 * 32 : dst.data() + dst_off;
      std::fill(dst.begin(), dst.end(), 0xee);
      std::fill(aligned, aligned + kAlignedBytes, 0xee);
      const uint64_t got = internal::CopyWithChecksumFused(d, src.data() + src_off, length, stream);
      ASSERT_EQ(got, XXH3_64bits(src.data() + src_off, length)) << length << " " << stream;
      ASSERT_EQ(std::memcmp(d, src.data() + src_off, length), 0) << length << " " << stream;
      ASSERT_EQ(d[length], 0xee) << length << " " << stream;
      if (!stream && dst_off > 0) {
        ASSERT_EQ(d[-1], 0xee) << length;
      }
    }
  }
}

}  // namespace
}  // namespace kvpool
