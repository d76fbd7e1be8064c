// Exactness of the host fp16 / bf16 / fp8 conversions against independent references:
// GCC's _Float16 (software IEEE conversion) for fp16, and nearest-value searches in double for
// bf16 and fp8 e4m3.

#include "kernels/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace kvpool {
namespace kernels {
namespace {

uint16_t RefHalf(float f) {
  _Float16 h = static_cast<_Float16>(f);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}

// Nearest bf16 by comparing the two truncation candidates in double; ties to even.
uint16_t RefBf16(float f) {
  const uint32_t x = FloatBits(f);
  const uint16_t lo = static_cast<uint16_t>(x >> 16);
  const uint16_t hi = static_cast<uint16_t>(lo + 1);
  const double dl = std::fabs(static_cast<double>(Bf16ToFloat(lo)) - f);
  const double dh = std::fabs(static_cast<double>(Bf16ToFloat(hi)) - f);
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1) ? hi : lo;
}

// Nearest finite e4m3 by brute force over all codes, ties to the even code, saturating.
uint8_t RefFp8(float f) {
  if (std::isnan(f)) return std::signbit(f) ? 0xff : 0x7f;
  const double v = std::min(std::max(static_cast<double>(f), -448.0), 448.0);
  int best = -1;
  double best_d = INFINITY;
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;  // NaN codes
    const double cv = Fp8E4M3ToFloat(static_cast<uint8_t>(c));
    if (cv == 0.0 && (c & 0x80) != (std::signbit(f) ? 0x80 : 0)) continue;  // keep zero's sign
    const double d = std::fabs(cv - v);
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best = c;
      best_d = d;
    }
  }
  return static_cast<uint8_t>(best);
}

TEST(DTypeTest, HalfToFloatIsExactForEveryCode) {
  for (uint32_t b = 0; b < 65536; ++b) {
    _Float16 h;
    const uint16_t bits = static_cast<uint16_t>(b);
    std::memcpy(&h, &bits, 2);
    const float ref = static_cast<float>(h);
    const float got = HalfToFloat(bits);
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(got)) << b;
    } else {
      EXPECT_EQ(FloatBits(ref), FloatBits(got)) << b;
      EXPECT_EQ(FloatToHalf(got), bits) << b;  // round trip
    }
  }
}

TEST(DTypeTest, FloatToHalfRoundsToNearestEven) {
  std::mt19937 rng(7);
  std::vector<float> values = {0.0f,       -0.0f,      65504.0f,     65519.99f,
                               65520.0f,   1e9f,       -1e9f,        INFINITY,
                               -INFINITY,  0x1.0p-24f, 0x1.0p-25f,   0x1.8p-25f,
                               0x1.0p-26f, 0x1.0p-14f, 0x1.ffcp-15f, 1.00048828125f};
  for (int i = 0; i < 200000; ++i) {
    values.push_back(BitsToFloat(rng()));  // any exponent
  }
  std::uniform_real_distribution<float> uni(-70000.0f, 70000.0f);
  for (int i = 0; i < 200000; ++i) values.push_back(uni(rng));
  for (uint32_t b = 0; b < 65536; b += 3) {  // exact midpoints between halves
    const float a = HalfToFloat(static_cast<uint16_t>(b));
    const float c = HalfToFloat(static_cast<uint16_t>(b + 1));
    if (std::isfinite(a) && std::isfinite(c)) values.push_back((a + c) * 0.5f);
  }
  for (float f : values) {
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f))));
      continue;
    }
    ASSERT_EQ(FloatToHalf(f), RefHalf(f)) << f;
  }
}

TEST(DTypeTest, FloatToBf16RoundsToNearestEven) {
  std::mt19937 rng(11);
  for (int i = 0; i < 400000; ++i) {
    const float f = BitsToFloat(rng());
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(f))));
      continue;
    }
    if (!std::isfinite(
            static_cast<double>(Bf16ToFloat(static_cast<uint16_t>((FloatBits(f) >> 16) + 1))))) {
      continue;  // the candidate above is inf: covered by the overflow case below
    }
    ASSERT_EQ(FloatToBf16(f), RefBf16(f)) << f;
  }
  EXPECT_EQ(FloatToBf16(INFINITY), 0x7f80);
  EXPECT_EQ(FloatToBf16(3.4028235e38f), 0x7f80);     // rounds up past the largest bf16
  EXPECT_EQ(FloatToBf16(1.0f + 0x1.0p-8f), 0x3f80);  // tie to even
  EXPECT_EQ(FloatToBf16(1.0f + 0x1.8p-7f), 0x3f82);  // tie to even, upward
}

TEST(DTypeTest, Fp8E4M3MatchesSatfiniteNearestEven) {
  for (int c = 0; c < 256; ++c) {
    const float v = Fp8E4M3ToFloat(static_cast<uint8_t>(c));
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(v));
    } else {
      EXPECT_EQ(FloatToFp8E4M3(v), c) << c;
    }
  }
  EXPECT_EQ(Fp8E4M3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(Fp8E4M3ToFloat(0x01), 0x1.0p-9f);
  EXPECT_EQ(FloatToFp8E4M3(1e6f), 0x7e);
  EXPECT_EQ(FloatToFp8E4M3(-INFINITY), 0xfe);
  EXPECT_EQ(FloatToFp8E4M3(NAN) & 0x7f, 0x7f);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> uni(-500.0f, 500.0f);
  std::uniform_real_distribution<float> small(-0.03f, 0.03f);
  for (int i = 0; i < 100000; ++i) {
    const float a = uni(rng), b = small(rng);
    ASSERT_EQ(FloatToFp8E4M3(a), RefFp8(a)) << a;
    ASSERT_EQ(FloatToFp8E4M3(b), RefFp8(b)) << b;
  }
  for (int c = 0; c < 0x7e; ++c) {  // midpoints
    const float m = 0.5f * (Fp8E4M3ToFloat(static_cast<uint8_t>(c)) +
                            Fp8E4M3ToFloat(static_cast<uint8_t>(c + 1)));
    ASSERT_EQ(FloatToFp8E4M3(m), RefFp8(m)) << m;
  }
}

TEST(DTypeTest, RoundHalfEven) {
  EXPECT_EQ(RoundHalfEven(0.5f), 0.0f);
  EXPECT_EQ(RoundHalfEven(1.5f), 2.0f);
  EXPECT_EQ(RoundHalfEven(2.5f), 2.0f);
  EXPECT_EQ(RoundHalfEven(-2.5f), -2.0f);
  EXPECT_EQ(RoundHalfEven(-126.6f), -127.0f);
  EXPECT_EQ(RoundHalfEven(14.49f), 14.0f);
}

}  // namespace
}  // namespace kernels
}  // namespace kvpool
