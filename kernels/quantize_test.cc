// Block quantization CPU twin: byte-exact against a naive per-element reference, round-trip
// error bounds per element and per block, sizes, and bad input.

#include "kernels/quantize.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <tuple>
#include <vector>

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
    std::vector<uint16_t> raw(BlockElements(l));
    testutil::FillRealistic(raw.data(), raw.size(), dim, dtype, 17 + dim);
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
  std::vector<uint16_t> raw(BlockElements(l)), back(BlockElements(l), 0xffff);
  testutil::FillNormal(raw.data(), raw.size(), dtype, 5, 2.0f);
  std::vector<uint8_t> enc_buf(EncodedBytes(l));
  const void* in = raw.data();
  void* mid = enc_buf.data();
  ASSERT_TRUE(QuantizeBlocksCpu(l, &in, &mid, 1).ok());
  const void* cmid = enc_buf.data();
  void* out = back.data();
  ASSERT_TRUE(DequantizeBlocksCpu(l, &cmid, &out, 1).ok());
  ASSERT_EQ(testutil::CountNaN(back.data(), back.size(), dtype), 0u);
  const float out_ulp = dtype == DType::kFloat16 ? 0x1.0p-11f : 0x1.0p-8f;
  const size_t so = EncodedScaleOffset(l);
  for (size_t i = 0; i < raw.size(); ++i) {
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
    std::vector<uint16_t> raw(BlockElements(l)), back(BlockElements(l));
    if (c.realistic) {
      testutil::FillRealistic(raw.data(), raw.size(), l.head_dim, dtype, 77);
    } else {
      testutil::FillNormal(raw.data(), raw.size(), dtype, 77);
    }
    std::vector<uint8_t> enc_buf(EncodedBytes(l));
    const void* in = raw.data();
    void* mid = enc_buf.data();
    ASSERT_TRUE(QuantizeBlocksCpu(l, &in, &mid, 1).ok());
    const void* cmid = enc_buf.data();
    void* out = back.data();
    ASSERT_TRUE(DequantizeBlocksCpu(l, &cmid, &out, 1).ok());
    const double err = testutil::RelativeError(back.data(), raw.data(), raw.size(), dtype);
    std::printf("[quantize] %-9s %-5s %-9s rel_err %.5f  bits/elem %.2f\n", EncodingName(enc),
                DTypeName(dtype), c.name, err, 8.0 * EncodedBytes(l) / BlockElements(l));
    EXPECT_LT(err, c.bound) << EncodingName(enc) << " " << c.name;
    EXPECT_GT(err, 0.0);
  }
}

TEST_P(QuantizeTest, ZeroBlockStaysZeroAndBatchesAreIndependent) {
  const auto [enc, dtype] = GetParam();
  const BlockLayout l = Layout(enc, dtype);
  std::vector<uint16_t> zero(BlockElements(l), 0), rnd(BlockElements(l));
  testutil::FillNormal(rnd.data(), rnd.size(), dtype, 9);
  std::vector<uint8_t> e0(EncodedBytes(l)), e1(EncodedBytes(l)), e_single(EncodedBytes(l));
  const void* ins[2] = {zero.data(), rnd.data()};
  void* outs[2] = {e0.data(), e1.data()};
  ASSERT_TRUE(QuantizeBlocksCpu(l, ins, outs, 2).ok());
  const void* in1 = rnd.data();
  void* out1 = e_single.data();
  ASSERT_TRUE(QuantizeBlocksCpu(l, &in1, &out1, 1).ok());
  EXPECT_EQ(e1, e_single);
  std::vector<uint16_t> back(BlockElements(l), 0x7777);
  const void* ce0 = e0.data();
  void* b = back.data();
  ASSERT_TRUE(DequantizeBlocksCpu(l, &ce0, &b, 1).ok());
  for (uint16_t x : back) ASSERT_EQ(LoadElement(&x, 0, dtype), 0.0f);
}

INSTANTIATE_TEST_SUITE_P(Encodings, QuantizeTest,
                         ::testing::Combine(::testing::Values(Encoding::kInt8, Encoding::kFp8E4M3,
                                                              Encoding::kInt4G32,
                                                              Encoding::kInt4G64),
                                            ::testing::Values(DType::kFloat16, DType::kBFloat16)),
                         [](const auto& info) {
                           return std::string(EncodingName(std::get<0>(info.param))) + "_" +
                                  DTypeName(std::get<1>(info.param));
                         });

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
  l.dtype = DType::kFloat16;
  l.num_layers = 0;
  EXPECT_EQ(DequantizeBlocksCpu(l, &in, &out, 1).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kernels
}  // namespace kvpool
