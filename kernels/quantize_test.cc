// Block quantization CPU twin: byte-exact against a naive per-element reference, round-trip
// error bounds per element and per block, sizes, and bad input; the AVX2 paths bit for bit against
// the scalar reference (conversions on edge-case floats, blocks on random and edge-case data).

#include "kernels/quantize.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "kernels/quantize_cpu.h"
#include "kernels/test_util.h"

namespace kvpool {
namespace kernels {
namespace {

BlockLayout Layout(Encoding enc, DType dtype, int layers = 2, int heads = 3, int dim = 64,
                   int tokens = 5) {
  BlockLayout l;
  l.num_layers = layers;
  l.num_kv_heads = heads;
  l.head_dim = dim;
  l.tokens = tokens;
  l.dtype = dtype;
  l.encoding = enc;
  return l;
}

float At(const std::vector<uint16_t>& raw, const BlockLayout& l, int layer, int kv, int t, int h,
         int d) {
  const size_t i =
      ((((static_cast<size_t>(layer) * 2 + kv) * l.tokens + t) * l.num_kv_heads + h) * l.head_dim) +
      d;
  return LoadElement(raw.data(), i, l.dtype);
}

// The encoding written out element by element from the definitions in block_layout.h.
std::vector<uint8_t> NaiveEncode(const BlockLayout& l, const std::vector<uint16_t>& raw) {
  std::vector<uint8_t> out(EncodedBytes(l), 0);
  const size_t so = EncodedScaleOffset(l);
  for (int layer = 0; layer < l.num_layers; ++layer)
    for (int kv = 0; kv < 2; ++kv) {
      const size_t plane = static_cast<size_t>(layer) * 2 + kv;
      if (l.encoding == Encoding::kFp8E4M3) {
        for (int h = 0; h < l.num_kv_heads; ++h) {
          float amax = 0;
          for (int t = 0; t < l.tokens; ++t)
            for (int d = 0; d < l.head_dim; ++d)
              amax = std::max(amax, std::fabs(At(raw, l, layer, kv, t, h, d)));
          const float scale = amax / 448.0f;
          std::memcpy(&out[so + (plane * l.num_kv_heads + h) * 4], &scale, 4);
          for (int t = 0; t < l.tokens; ++t)
            for (int d = 0; d < l.head_dim; ++d) {
              const size_t i = ((plane * l.tokens + t) * l.num_kv_heads + h) * l.head_dim + d;
              out[i] = FloatToFp8E4M3(At(raw, l, layer, kv, t, h, d) *
                                      (scale > 0 ? 1.0f / scale : 0.0f));
            }
        }
        continue;
      }
      for (int t = 0; t < l.tokens; ++t)
        for (int h = 0; h < l.num_kv_heads; ++h) {
          const size_t row = (plane * l.tokens + t) * l.num_kv_heads + h;
          if (l.encoding == Encoding::kInt8) {
            float amax = 0;
            for (int d = 0; d < l.head_dim; ++d)
              amax = std::max(amax, std::fabs(At(raw, l, layer, kv, t, h, d)));
            const float scale = amax / 127.0f;
            std::memcpy(&out[so + row * 4], &scale, 4);
            for (int d = 0; d < l.head_dim; ++d) {
              const float v = At(raw, l, layer, kv, t, h, d) * (scale > 0 ? 1.0f / scale : 0.0f);
              out[row * l.head_dim + d] = static_cast<uint8_t>(
                  static_cast<int8_t>(std::nearbyint(std::clamp(v, -127.0f, 127.0f))));
            }
          } else {
            const int g = Int4GroupSize(l.encoding);
            for (int g0 = 0; g0 < l.head_dim; g0 += g) {
              float mn = INFINITY, mx = -INFINITY;
              for (int d = g0; d < g0 + g; ++d) {
                mn = std::min(mn, At(raw, l, layer, kv, t, h, d));
                mx = std::max(mx, At(raw, l, layer, kv, t, h, d));
              }
              const uint16_t sb = FloatToHalf((mx - mn) / 15.0f), zb = FloatToHalf(mn);
              const float s = HalfToFloat(sb), z = HalfToFloat(zb);
              const size_t group = (row * l.head_dim + g0) / g;
              std::memcpy(&out[so + group * 4], &sb, 2);
              std::memcpy(&out[so + group * 4 + 2], &zb, 2);
              for (int d = g0; d < g0 + g; ++d) {
                const float v = (At(raw, l, layer, kv, t, h, d) - z) * (s > 0 ? 1.0f / s : 0.0f);
                const int q = static_cast<int>(std::nearbyint(std::clamp(v, 0.0f, 15.0f)));
                const size_t e = row * l.head_dim + d;
                out[e / 2] |= static_cast<uint8_t>(q << ((e & 1) * 4));
              }
            }
          }
        }
    }
  return out;
}

using Param = std::tuple<Encoding, DType>;
class QuantizeTest : public ::testing::TestWithParam<Param> {};

TEST_P(QuantizeTest, MatchesNaiveReferenceBytes) {
  const auto [enc, dtype] = GetParam();
  for (int dim : {64, 128}) {
    const BlockLayout l = Layout(enc, dtype, 2, 3, dim, 7);
    std::vector<uint16_t> raw = testutil::Buffer(BlockElements(l), dtype);
    testutil::FillRealistic(raw.data(), BlockElements(l), dim, dtype, 17 + dim);
    std::vector<uint8_t> enc_buf(EncodedBytes(l), 0xa5);
    const void* in = raw.data();
    void* out = enc_buf.data();
    ASSERT_TRUE(QuantizeBlocksCpu(l, &in, &out, 1).ok());
    const std::vector<uint8_t> want = NaiveEncode(l, raw);
    ASSERT_EQ(enc_buf.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      if (i >= EncodedDataBytes(l) && i < EncodedScaleOffset(l)) continue;  // padding
      ASSERT_EQ(enc_buf[i], want[i]) << "byte " << i << " of " << want.size();
    }
  }
}

TEST_P(QuantizeTest, RoundTripErrorIsBoundedPerElement) {
  const auto [enc, dtype] = GetParam();
  const BlockLayout l = Layout(enc, dtype, 2, 4, 128, 16);
  const size_t n = BlockElements(l);
  std::vector<uint16_t> raw = testutil::Buffer(n, dtype), back = testutil::Buffer(n, dtype, 0xffff);
  testutil::FillNormal(raw.data(), n, dtype, 5, 2.0f);
  std::vector<uint8_t> enc_buf(EncodedBytes(l));
  const void* in = raw.data();
  void* mid = enc_buf.data();
  ASSERT_TRUE(QuantizeBlocksCpu(l, &in, &mid, 1).ok());
  const void* cmid = enc_buf.data();
  void* out = back.data();
  ASSERT_TRUE(DequantizeBlocksCpu(l, &cmid, &out, 1).ok());
  ASSERT_EQ(testutil::CountNaN(back.data(), n, dtype), 0u);
  const float out_ulp = dtype == DType::kFloat16    ? 0x1.0p-11f
                        : dtype == DType::kBFloat16 ? 0x1.0p-8f
                                                    : 0x1.0p-24f;
  const size_t so = EncodedScaleOffset(l);
  for (size_t i = 0; i < n; ++i) {
    const float x = LoadElement(raw.data(), i, dtype), y = LoadElement(back.data(), i, dtype);
    float bound = 0;
    const size_t row = i / l.head_dim;
    switch (enc) {
      case Encoding::kInt8: {
        float s;
        std::memcpy(&s, &enc_buf[so + row * 4], 4);
        bound = 0.5f * s;
        break;
      }
      case Encoding::kFp8E4M3: {
        // 3 mantissa bits: half a step is 2^-4 relative; below 2^-6 * scale the step is fixed.
        const size_t plane = i / PlaneElements(l);
        const int h = static_cast<int>(row % l.num_kv_heads);
        float s;
        std::memcpy(&s, &enc_buf[so + (plane * l.num_kv_heads + h) * 4], 4);
        bound = std::fabs(x) * 0x1.0p-4f + s * 0x1.0p-10f;
        break;
      }
      default: {
        const size_t group = i / Int4GroupSize(enc);
        uint16_t sb;
        std::memcpy(&sb, &enc_buf[so + group * 4], 2);
        bound = 0.5f * HalfToFloat(sb) + 0x1.0p-10f * 8.0f;  // + the zero point's f16 rounding
        break;
      }
    }
    ASSERT_LE(std::fabs(y - x), bound * 1.0001f + std::fabs(x) * out_ulp + 1e-7f)
        << EncodingName(enc) << " element " << i << " x=" << x << " y=" << y;
  }
}

TEST_P(QuantizeTest, RelativeErrorOnRandomAndRealisticData) {
  const auto [enc, dtype] = GetParam();
  const BlockLayout l = Layout(enc, dtype, 4, 8, 128, 16);
  struct Case {
    const char* name;
    bool realistic;
    double bound;
  };
  // Bounds: about twice the expected error (uniform rounding noise of half a step).
  double gauss_bound = enc == Encoding::kInt8 ? 0.012 : enc == Encoding::kFp8E4M3 ? 0.045 : 0.15;
  double real_bound = enc == Encoding::kInt8      ? 0.03
                      : enc == Encoding::kFp8E4M3 ? 0.045
                      : enc == Encoding::kInt4G32 ? 0.17
                                                  : 0.24;
  for (const Case& c : {Case{"gaussian", false, gauss_bound}, Case{"outliers", true, real_bound}}) {
    const size_t n = BlockElements(l);
    std::vector<uint16_t> raw = testutil::Buffer(n, dtype), back = testutil::Buffer(n, dtype);
    if (c.realistic) {
      testutil::FillRealistic(raw.data(), n, l.head_dim, dtype, 77);
    } else {
      testutil::FillNormal(raw.data(), n, dtype, 77);
    }
    std::vector<uint8_t> enc_buf(EncodedBytes(l));
    const void* in = raw.data();
    void* mid = enc_buf.data();
    ASSERT_TRUE(QuantizeBlocksCpu(l, &in, &mid, 1).ok());
    const void* cmid = enc_buf.data();
    void* out = back.data();
    ASSERT_TRUE(DequantizeBlocksCpu(l, &cmid, &out, 1).ok());
    const double err = testutil::RelativeError(back.data(), raw.data(), n, dtype);
    std::printf("[quantize] %-9s %-5s %-9s rel_err %.5f  bits/elem %.2f\n", EncodingName(enc),
                DTypeName(dtype), c.name, err, 8.0 * EncodedBytes(l) / BlockElements(l));
    EXPECT_LT(err, c.bound) << EncodingName(enc) << " " << c.name;
    EXPECT_GT(err, 0.0);
  }
}

TEST_P(QuantizeTest, ZeroBlockStaysZeroAndBatchesAreIndependent) {
  const auto [enc, dtype] = GetParam();
  const BlockLayout l = Layout(enc, dtype);
  const size_t n = BlockElements(l);
  std::vector<uint16_t> zero = testutil::Buffer(n, dtype), rnd = testutil::Buffer(n, dtype);
  testutil::FillNormal(rnd.data(), n, dtype, 9);
  std::vector<uint8_t> e0(EncodedBytes(l)), e1(EncodedBytes(l)), e_single(EncodedBytes(l));
  const void* ins[2] = {zero.data(), rnd.data()};
  void* outs[2] = {e0.data(), e1.data()};
  ASSERT_TRUE(QuantizeBlocksCpu(l, ins, outs, 2).ok());
  const void* in1 = rnd.data();
  void* out1 = e_single.data();
  ASSERT_TRUE(QuantizeBlocksCpu(l, &in1, &out1, 1).ok());
  EXPECT_EQ(e1, e_single);
  std::vector<uint16_t> back = testutil::Buffer(n, dtype, 0x7777);
  const void* ce0 = e0.data();
  void* b = back.data();
  ASSERT_TRUE(DequantizeBlocksCpu(l, &ce0, &b, 1).ok());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(LoadElement(back.data(), i, dtype), 0.0f);
}

INSTANTIATE_TEST_SUITE_P(
    Encodings, QuantizeTest,
    ::testing::Combine(::testing::Values(Encoding::kInt8, Encoding::kFp8E4M3, Encoding::kInt4G32,
                                         Encoding::kInt4G64),
                       ::testing::Values(DType::kFloat16, DType::kBFloat16, DType::kFloat32)),
    [](const auto& info) {
      return std::string(EncodingName(std::get<0>(info.param))) + "_" +
             DTypeName(std::get<1>(info.param));
    });

// fp32 input holding values exact in a 16-bit dtype encodes to the same bytes as that dtype (only
// the load differs), and its fp32 dequantization rounded to the 16-bit dtype is the 16-bit one.
TEST(QuantizeFp32Test, SameBytesAsTheSixteenBitTwinOnItsValues) {
  int compared = 0;
  for (Encoding enc :
       {Encoding::kInt8, Encoding::kFp8E4M3, Encoding::kInt4G32, Encoding::kInt4G64}) {
    for (DType narrow : {DType::kFloat16, DType::kBFloat16}) {
      for (bool realistic : {false, true}) {
        const BlockLayout l16 = Layout(enc, narrow, 2, 3, 128, 7);
        BlockLayout l32 = l16;
        l32.dtype = DType::kFloat32;
        const size_t n = BlockElements(l16);
        std::vector<uint16_t> raw16 = testutil::Buffer(n, narrow);
        if (realistic) {
          testutil::FillRealistic(raw16.data(), n, 128, narrow, 300 + compared);
        } else {
          testutil::FillNormal(raw16.data(), n, narrow, 300 + compared, 3.0f);
        }
        const std::vector<uint16_t> raw32 =
            testutil::Convert(raw16.data(), n, narrow, DType::kFloat32);
        std::vector<uint8_t> e16(EncodedBytes(l16), 0xa5), e32(EncodedBytes(l32), 0xa5);
        ASSERT_EQ(e16.size(), e32.size());  // the encodings do not depend on the raw dtype
        const void* in16 = raw16.data();
        const void* in32 = raw32.data();
        void* out16 = e16.data();
        void* out32 = e32.data();
        ASSERT_TRUE(QuantizeBlocksCpuScalar(l16, &in16, &out16, 1).ok());
        ASSERT_TRUE(QuantizeBlocksCpu(l32, &in32, &out32, 1).ok());
        ASSERT_EQ(e16, e32) << EncodingName(enc) << " " << DTypeName(narrow);
        std::vector<uint16_t> back16 = testutil::Buffer(n, narrow, 0xffff);
        std::vector<uint16_t> back32 = testutil::Buffer(n, DType::kFloat32, 0xffff);
        const void* enc_in = e16.data();
        void* b16 = back16.data();
        void* b32 = back32.data();
        ASSERT_TRUE(DequantizeBlocksCpu(l16, &enc_in, &b16, 1).ok());
        ASSERT_TRUE(DequantizeBlocksCpu(l32, &enc_in, &b32, 1).ok());
        const std::vector<uint16_t> rounded =
            testutil::Convert(back32.data(), n, DType::kFloat32, narrow);
        ASSERT_EQ(rounded, back16) << EncodingName(enc) << " " << DTypeName(narrow);
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, 16);
}

TEST(QuantizeSizeTest, EncodedSizes) {
  // Llama-3-8B shard: 32 layers, 8 kv heads, head_dim 128, 16 tokens: 2 MiB raw.
  BlockLayout l = Layout(Encoding::kRaw, DType::kBFloat16, 32, 8, 128, 16);
  EXPECT_EQ(RawBytes(l), 2u << 20);
  EXPECT_EQ(EncodedBytes(l), 2u << 20);
  l.encoding = Encoding::kInt8;
  EXPECT_EQ(EncodedBytes(l), (1u << 20) + 32 * 2 * 16 * 8 * 4);
  l.encoding = Encoding::kFp8E4M3;
  EXPECT_EQ(EncodedBytes(l), (1u << 20) + 32 * 2 * 8 * 4);
  l.encoding = Encoding::kInt4G32;
  EXPECT_EQ(EncodedBytes(l), (512u << 10) + (1u << 20) / 32 * 4);
  l.encoding = Encoding::kInt4G64;
  EXPECT_EQ(EncodedBytes(l), (512u << 10) + (1u << 20) / 64 * 4);
  // The scale section starts 16-byte aligned even when the data section does not end so.
  BlockLayout odd = Layout(Encoding::kInt8, DType::kFloat16, 1, 1, 6, 1);
  EXPECT_EQ(EncodedDataBytes(odd), 12u);
  EXPECT_EQ(EncodedScaleOffset(odd), 16u);
  EXPECT_EQ(EncodedBytes(odd), 16u + 2 * 4);
  // fp32 raw payloads are twice as large; encoded blocks are the same size.
  BlockLayout f32 = Layout(Encoding::kRaw, DType::kFloat32, 32, 8, 128, 16);
  EXPECT_EQ(RawBytes(f32), 4u << 20);
  EXPECT_EQ(EncodedBytes(f32), 4u << 20);
  f32.encoding = Encoding::kInt8;
  l.encoding = Encoding::kInt8;
  EXPECT_EQ(EncodedBytes(f32), EncodedBytes(l));
}

TEST(QuantizeValidationTest, RejectsBadInput) {
  BlockLayout l = Layout(Encoding::kInt4G64, DType::kFloat16, 1, 1, 32, 1);  // 32 % 64 != 0
  std::vector<uint16_t> raw(64);
  std::vector<uint8_t> enc(1024);
  const void* in = raw.data();
  void* out = enc.data();
  EXPECT_EQ(QuantizeBlocksCpu(l, &in, &out, 1).code(), StatusCode::kInvalidArgument);
  l.encoding = Encoding::kRaw;
  EXPECT_EQ(QuantizeBlocksCpu(l, &in, &out, 1).code(), StatusCode::kInvalidArgument);
  l.encoding = Encoding::kInt8;
  void* null_out = nullptr;
  EXPECT_EQ(QuantizeBlocksCpu(l, &in, &null_out, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(QuantizeBlocksCpu(l, &in, &out, -1).code(), StatusCode::kInvalidArgument);
  l.encoding = static_cast<Encoding>(9);
  EXPECT_EQ(QuantizeBlocksCpu(l, &in, &out, 1).code(), StatusCode::kInvalidArgument);
  l.encoding = Encoding::kInt8;
  l.dtype = static_cast<DType>(7);
  EXPECT_EQ(QuantizeBlocksCpu(l, &in, &out, 1).code(), StatusCode::kInvalidArgument);
  l.dtype = static_cast<DType>(3);  // the first value past fp32
  EXPECT_EQ(DequantizeBlocksCpu(l, &in, &out, 1).code(), StatusCode::kInvalidArgument);
  l.dtype = DType::kFloat16;
  l.num_layers = 0;
  EXPECT_EQ(DequantizeBlocksCpu(l, &in, &out, 1).code(), StatusCode::kInvalidArgument);
}

// --- AVX2 paths against the scalar reference, bit for bit ---
// (All 2^32 floats were also checked through both conversions once, with no mismatch; too slow
// for a unit test.)

// Floats where e4m3 and f16 rounding is decided: every code's value and the midpoints between
// neighbours, each +-0..3 ulp, both signs; the subnormal/normal and saturation boundaries; f32
// subnormals, zeros, infinities and NaNs; plus a stride through all 2^32 bit patterns.
std::vector<float> EdgeFloats() {
  std::vector<uint32_t> bits;
  auto around = [&](float f) {
    const uint32_t u = FloatBits(f);
    for (int d = -3; d <= 3; ++d) {
      bits.push_back(u + d);
      bits.push_back((u + d) ^ 0x80000000u);
    }
  };
  for (int c = 0; c < 0x7f; ++c) {  // every finite e4m3 code and the midpoint above it
    const float v = Fp8E4M3ToFloat(static_cast<uint8_t>(c));
    around(v);
    if (c < 0x7e) around(0.5f * (v + Fp8E4M3ToFloat(static_cast<uint8_t>(c + 1))));
  }
  for (uint32_t h = 0; h < 0x7c00; h += 1) {  // every finite f16 value and the midpoint above
    const float v = HalfToFloat(static_cast<uint16_t>(h));
    around(v);
    around(0.5f * (v + HalfToFloat(static_cast<uint16_t>(h + 1))));
  }
  for (float f :
       {448.0f, 464.0f, 480.0f, 512.0f, 65504.0f, 65520.0f, 0x1.0p-6f, 0x1.0p-9f, 0x1.0p-10f,
        0x1.0p-14f, 0x1.0p-24f, 0x1.0p-25f, 0x1.0p-126f, 0x1.0p-149f, 3.4e38f}) {
    around(f);
  }
  for (uint32_t u : {0x00000000u, 0x00000001u, 0x007fffffu, 0x7f800000u, 0x7f800001u, 0x7fbfffffu,
                     0x7fc00000u, 0x7fffffffu}) {
    bits.push_back(u);
    bits.push_back(u ^ 0x80000000u);
  }
  for (uint64_t u = 0; u < (1ull << 32); u += 4093) bits.push_back(static_cast<uint32_t>(u));
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = BitsToFloat(bits[i]);
  return out;
}

TEST(QuantizeAvx2Test, ConversionsMatchScalar) {
  if (!avx2::Supported()) GTEST_SKIP() << "no AVX2 + F16C on this CPU";
  const std::vector<float> f = EdgeFloats();
  std::vector<uint8_t> fp8(f.size());
  std::vector<uint16_t> half(f.size());
  avx2::FloatToFp8E4M3Array(f.data(), fp8.data(), f.size());
  avx2::FloatToHalfArray(f.data(), half.data(), f.size());
  for (size_t i = 0; i < f.size(); ++i) {
    ASSERT_EQ(fp8[i], FloatToFp8E4M3(f[i])) << std::hex << "float bits 0x" << FloatBits(f[i]);
    ASSERT_EQ(half[i], FloatToHalf(f[i])) << std::hex << "float bits 0x" << FloatBits(f[i]);
  }
}

// Block data that reaches every branch of the encoders.
enum class Data {
  kNormal,       // Gaussian
  kRealistic,    // outlier channels
  kAnyBits,      // uniform 16-bit patterns: NaN, infinities, subnormals, -0, huge bf16
  kSpecials,     // Gaussian with sprinkled NaN / +-inf / -0 / subnormals / max values
  kSubnormals,   // only subnormals and zeros of the dtype
  kHuge,         // bf16: up to 3e38 (int4 zero clamp, saturation); fp16: up to 65504
  kTies,         // multiples of 0.5 in [-8, 8] and e4m3 midpoints: rounding ties
  kConstantRuns  // runs of one value (zero scale), including runs of +0 and -0 mixed
};

void FillBlock(Data kind, DType dtype, int head_dim, std::vector<uint16_t>* raw, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const size_t n = raw->size();
  uint16_t* p = raw->data();
  auto from = [&](float f) { return FromFloat(f, dtype); };
  const uint16_t inf = dtype == DType::kFloat16 ? 0x7c00 : 0x7f80;
  const uint16_t max = dtype == DType::kFloat16 ? 0x7bff : 0x7f7f;
  switch (kind) {
    case Data::kNormal:
      return testutil::FillNormal(p, n, dtype, seed);
    case Data::kRealistic:
      return testutil::FillRealistic(p, n, head_dim, dtype, seed);
    case Data::kAnyBits:
      for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint16_t>(rng());
      return;
    case Data::kSpecials: {
      testutil::FillNormal(p, n, dtype, seed);
      const uint16_t specials[] = {static_cast<uint16_t>(inf + 1),  // NaN (signaling in fp16)
                                   static_cast<uint16_t>(inf | 0x200),
                                   inf,
                                   static_cast<uint16_t>(inf | 0x8000),
                                   0x8000,
                                   0x0001,
                                   0x8001,
                                   max,
                                   static_cast<uint16_t>(max | 0x8000)};
      for (size_t i = 0; i < n; ++i) {
        if (rng() % 97 == 0) p[i] = specials[rng() % (sizeof(specials) / sizeof(specials[0]))];
      }
      return;
    }
    case Data::kSubnormals: {
      const uint16_t mant = dtype == DType::kFloat16 ? 0x3ff : 0x7f;
      for (size_t i = 0; i < n; ++i) {
        p[i] = static_cast<uint16_t>((rng() & mant) | ((rng() & 1) << 15));
      }
      return;
    }
    case Data::kHuge: {
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      const float big = dtype == DType::kFloat16 ? 65504.0f : 3.0e38f;
      for (size_t i = 0; i < n; ++i) p[i] = from(u(rng) * big);
      return;
    }
    case Data::kTies: {
      for (size_t i = 0; i < n; ++i) {
        if (rng() % 2) {
          p[i] = from(0.5f * static_cast<float>(static_cast<int>(rng() % 33) - 16));
        } else {  // midpoint between neighbouring e4m3 values (exact in fp16; bf16 rounds some)
          const int c = static_cast<int>(rng() % 0x7e);
          const float v = 0.5f * (Fp8E4M3ToFloat(static_cast<uint8_t>(c)) +
                                  Fp8E4M3ToFloat(static_cast<uint8_t>(c + 1)));
          p[i] = from(rng() % 2 ? v : -v);
        }
      }
      // One exact 448 (and 8) per row so the scales come out as exact powers of two.
      for (size_t i = 0; i < n; i += head_dim) p[i] = from(i % (2 * head_dim) ? 448.0f : 8.0f);
      return;
    }
    case Data::kConstantRuns: {
      const uint16_t values[] = {0x0000, 0x8000, from(1.5f), from(-3.0f), inf, 0x0001};
      for (size_t i = 0; i < n; i += 32) {
        const uint16_t v = values[rng() % (sizeof(values) / sizeof(values[0]))];
        for (size_t j = i; j < std::min(n, i + 32); ++j) {
          p[j] = (v & 0x7fff) == 0 ? static_cast<uint16_t>((rng() & 1) << 15) : v;
        }
      }
      return;
    }
  }
}

TEST(QuantizeAvx2Test, BlocksMatchScalarReferenceBitForBit) {
  if (!avx2::Supported()) GTEST_SKIP() << "no AVX2 + F16C on this CPU";
  struct Shape {
    int layers, heads, dim, tokens;
  };
  // head_dim 128 and 64 (full vectors), 96 and 40 / 6 (vector tails for fp8; 96 also for int4
  // g32), group counts not a multiple of the 8 groups done at once, more heads than the fp8 path
  // keeps on its stack.
  const Shape shapes[] = {{2, 3, 128, 7}, {1, 1, 64, 1}, {2, 5, 96, 3},
                          {1, 2, 40, 3},  {1, 1, 6, 2},  {1, 70, 64, 2}};
  const Data kinds[] = {Data::kNormal,     Data::kRealistic, Data::kAnyBits, Data::kSpecials,
                        Data::kSubnormals, Data::kHuge,      Data::kTies,    Data::kConstantRuns};
  int compared = 0;
  for (Encoding enc :
       {Encoding::kInt8, Encoding::kFp8E4M3, Encoding::kInt4G32, Encoding::kInt4G64}) {
    for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      for (const Shape& sh : shapes) {
        const BlockLayout l = Layout(enc, dtype, sh.layers, sh.heads, sh.dim, sh.tokens);
        if (!ValidateBlockLayout(l).ok()) continue;  // head_dim not a multiple of the group
        for (Data kind : kinds) {
          std::vector<uint16_t> raw(BlockElements(l));
          FillBlock(kind, dtype, sh.dim, &raw, 1000 + compared);
          std::vector<uint8_t> fast(EncodedBytes(l), 0xa5), ref(EncodedBytes(l), 0xa5);
          const void* in = raw.data();
          void* out = fast.data();
          ASSERT_TRUE(QuantizeBlocksCpu(l, &in, &out, 1).ok());
          out = ref.data();
          ASSERT_TRUE(QuantizeBlocksCpuScalar(l, &in, &out, 1).ok());
          for (size_t i = 0; i < ref.size(); ++i) {
            ASSERT_EQ(fast[i], ref[i])
                << EncodingName(enc) << " " << DTypeName(dtype) << " dim " << sh.dim << " heads "
                << sh.heads << " data kind " << static_cast<int>(kind) << ": byte " << i << " of "
                << ref.size() << " (data section " << EncodedDataBytes(l) << ")";
          }
          ++compared;
        }
      }
    }
  }
  EXPECT_GT(compared, 150);
}

// What the CUDA kernels do at the edges, which the twin must do too (kvpool-kernel-check compares
// them byte for byte on a GPU): the padding before the scale section is zero, whatever the
// buffer held; a value whose code lies beyond int's range clamps like any other (the kernels
// clamp in float, then round); a scale whose inverse overflows quantizes everything to 0.
TEST(QuantizeEdgeTest, PaddingBeyondIntRangeAndTinyScalesAsTheGpuComputesThem) {
  // fp8 with a 216-byte data section: 8 bytes of padding before the scales.
  const BlockLayout fp8 = Layout(Encoding::kFp8E4M3, DType::kFloat16, 2, 3, 6, 3);
  ASSERT_EQ(EncodedDataBytes(fp8), 216u);
  ASSERT_EQ(EncodedScaleOffset(fp8), 224u);
  std::vector<uint16_t> raw(BlockElements(fp8));
  for (size_t i = 0; i < raw.size(); ++i) raw[i] = FloatToHalf(0.25f * static_cast<float>(i % 9));
  for (bool scalar : {false, true}) {
    std::vector<uint8_t> enc(EncodedBytes(fp8), 0xa5);
    const void* in = raw.data();
    void* out = enc.data();
    ASSERT_TRUE((scalar ? QuantizeBlocksCpuScalar : QuantizeBlocksCpu)(fp8, &in, &out, 1).ok());
    for (size_t b = 216; b < 224; ++b) EXPECT_EQ(enc[b], 0) << "padding byte " << b;
  }

  // int4 over bf16 values near 1e15: scale and zero saturate at f16's max, so (x - z) / s is
  // ~1.5e10 for every element, beyond int's range: each code clamps to 15.
  const BlockLayout int4 = Layout(Encoding::kInt4G32, DType::kBFloat16, 1, 1, 32, 1);
  std::vector<uint16_t> huge(BlockElements(int4));
  for (size_t i = 0; i < huge.size(); ++i) {
    huge[i] = FloatToBf16(i % 2 ? 1.01e15f : 1e15f);
  }
  for (bool scalar : {false, true}) {
    std::vector<uint8_t> enc(EncodedBytes(int4), 0);
    const void* in = huge.data();
    void* out = enc.data();
    ASSERT_TRUE((scalar ? QuantizeBlocksCpuScalar : QuantizeBlocksCpu)(int4, &in, &out, 1).ok());
    for (size_t b = 0; b < EncodedDataBytes(int4); ++b) {
      EXPECT_EQ(enc[b], 0xff) << (scalar ? "scalar" : "dispatched") << ", byte " << b;
    }
  }

  // int8 over fp32 values so small that 1 / (amax / 127) overflows: every code is 0 (with an
  // infinite inverse, positive values would give 127 and zeros NaN).
  const BlockLayout int8 = Layout(Encoding::kInt8, DType::kFloat32, 1, 1, 32, 1);
  std::vector<float> tiny(BlockElements(int8));
  for (size_t i = 0; i < tiny.size(); ++i) tiny[i] = i % 3 == 0 ? 0.0f : 2e-38f;
  std::vector<uint8_t> enc(EncodedBytes(int8), 0xa5);
  const void* in = tiny.data();
  void* out = enc.data();
  ASSERT_TRUE(QuantizeBlocksCpu(int8, &in, &out, 1).ok());
  for (size_t b = 0; b < EncodedDataBytes(int8); ++b) EXPECT_EQ(enc[b], 0) << "code " << b;
}

}  // namespace
}  // namespace kernels
}  // namespace kvpool
