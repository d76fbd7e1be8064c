#pragma once
// Element types of KV tensors and exact host conversions between them.
//
// kvpool stores K and V as 16-bit floats (fp16 or bf16) or as fp32 (the dtype of small test
// models and of some engines' CPU paths) and encodes them as int8, fp8 e4m3 or int4. The CPU twins
// of the kernels convert with the helpers below; they round to nearest even exactly as CUDA's
// __float2half_rn, __float2bfloat16_rn and
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) do, so CPU and GPU agree bit for bit where
// both compute the same float. The helpers are branch-light so loops over them vectorize.
//
// Thread safety: pure functions. C++17-clean: included by .cu files (host code only, but for
// FiniteInverse, which both sides share).

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/host_device.h"

namespace kvpool {
namespace kernels {

// Element type of a K/V tensor. Stable values: they are part of a block's layout fingerprint.
enum class DType : uint8_t {
  kFloat16 = 0,   // IEEE binary16
  kBFloat16 = 1,  // bfloat16
  kFloat32 = 2,   // IEEE binary32
};

inline constexpr size_t DTypeSize(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

// Storage of one element of `D` in memory: the bits of a 16-bit float, or an fp32.
template <DType D>
struct ElemOf {
  using type = uint16_t;
};
template <>
struct ElemOf<DType::kFloat32> {
  using type = float;
};
template <DType D>
using Elem = typename ElemOf<D>::type;

inline constexpr bool IsKnownDType(DType dtype) {
  return dtype == DType::kFloat16 || dtype == DType::kBFloat16 || dtype == DType::kFloat32;
}
const char* DTypeName(DType dtype);

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// c ? a : b without a branch (a mask), so loops stay vectorizable.
inline uint32_t SelectBits(bool c, uint32_t a, uint32_t b) {
  const uint32_t m = 0u - static_cast<uint32_t>(c);
  return (a & m) | (b & ~m);
}

// binary16 -> float, exact (subnormals, inf and NaN included).
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t nonsign = h & 0x7fffu;
  // Re-biasing by multiplying with 2^112 handles normals and subnormals alike; selects are on
  // integers so loops over this vectorize.
  uint32_t mag = FloatBits(BitsToFloat(nonsign << 13) * 0x1.0p112f);
  mag = SelectBits(nonsign >= 0x7c00u, 0x7f800000u | (nonsign << 13), mag);  // inf, NaN
  return BitsToFloat(mag | sign);
}

// float -> binary16, round to nearest even; overflow gives inf, NaN stays NaN.
// Branch-free: adding 2^(e + 13) (e = the value's exponent, clamped to half's range) makes the
// f32 addition round at exactly half's precision; the rounded value then converts exactly.
inline uint16_t FloatToHalf(float f) {
  const uint32_t x = FloatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7fffffffu;
  uint32_t e = a & 0x7f800000u;
  e = SelectBits(e < 0x38800000u, 0x38800000u, e);  // >= 2^-14: subnormals share its step
  e = SelectBits(e > 0x47000000u, 0x47000000u, e);  // <= 2^15: larger rounds to inf below
  const float magic = BitsToFloat(e + (13u << 23));
  const float r = (BitsToFloat(a) + magic) - magic;  // a rounded to half precision (or inf)
  const uint32_t rb = FloatBits(r);
  const uint32_t normal = (rb - 0x38000000u) >> 13;
  // r * 2^24 is exact; r is zeroed first where unused so the conversion never overflows.
  const float rs = BitsToFloat(SelectBits(rb < 0x38800000u, rb, 0u));
  const uint32_t subnormal = static_cast<uint32_t>(static_cast<int32_t>(rs * 16777216.0f));
  uint32_t h = SelectBits(rb >= 0x38800000u, normal, subnormal);
  h = SelectBits(h > 0x7c00u, 0x7c00u, h);      // overflow (and inf) -> inf
  h = SelectBits(a > 0x7f800000u, 0x7e00u, h);  // NaN
  return static_cast<uint16_t>(sign | h);
}

inline float Bf16ToFloat(uint16_t b) { return BitsToFloat(static_cast<uint32_t>(b) << 16); }

// float -> bfloat16, round to nearest even; NaN stays a quiet NaN.
inline uint16_t FloatToBf16(float f) {
  const uint32_t x = FloatBits(f);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const uint32_t nan = (x >> 16) | 0x0040u;
  return static_cast<uint16_t>(SelectBits((x & 0x7fffffffu) > 0x7f800000u, nan, rounded));
}

// Element i of a buffer of `dtype` elements, as float (exact).
inline float LoadElement(const void* p, size_t i, DType dtype) {
  if (dtype == DType::kFloat32) return static_cast<const float*>(p)[i];
  const uint16_t b = static_cast<const uint16_t*>(p)[i];
  return dtype == DType::kFloat16 ? HalfToFloat(b) : Bf16ToFloat(b);
}
// f rounded to a 16-bit `dtype` (fp16 or bf16, round to nearest even).
inline uint16_t FromFloat(float f, DType dtype) {
  return dtype == DType::kFloat16 ? FloatToHalf(f) : FloatToBf16(f);
}
// Element i of a buffer of `dtype` elements := f rounded to dtype (fp32: f itself).
inline void StoreElement(void* p, size_t i, float f, DType dtype) {
  if (dtype == DType::kFloat32) {
    static_cast<float*>(p)[i] = f;
  } else {
    static_cast<uint16_t*>(p)[i] = FromFloat(f, dtype);
  }
}

// fp8 e4m3 (OCP "E4M3FN", NVIDIA __nv_fp8_e4m3): bias 7, no infinities, 0x7f/0xff are NaN,
// largest finite 448, smallest subnormal 2^-9.
constexpr float kFp8E4M3Max = 448.0f;

// float -> e4m3 with round to nearest even and saturation to +-448 (satfinite); NaN -> 0x7f|sign.
// Branch-free, same f32 rounding trick as FloatToHalf with 3 mantissa bits.
inline uint8_t FloatToFp8E4M3(float f) {
  const uint32_t x = FloatBits(f);
  const uint32_t sign = (x >> 24) & 0x80u;
  const uint32_t a = x & 0x7fffffffu;
  uint32_t e = a & 0x7f800000u;
  e = SelectBits(e < 0x3c800000u, 0x3c800000u, e);  // >= 2^-6: subnormals share its step 2^-9
  e = SelectBits(e > 0x43800000u, 0x43800000u, e);  // <= 2^8
  const float magic = BitsToFloat(e + (20u << 23));
  const float r0 = (BitsToFloat(a) + magic) - magic;  // a rounded to e4m3 precision
  uint32_t rb = FloatBits(r0);
  rb = SelectBits(rb > 0x43e00000u, 0x43e00000u, rb);  // satfinite: > 448 (inf too) -> 448
  const uint32_t normal = (rb - (120u << 23)) >> 20;
  // r * 2^9 is exact for subnormal codes; r is zeroed where unused so it stays small.
  const float rs = BitsToFloat(SelectBits(rb < 0x3c800000u, rb, 0u));
  const uint32_t subnormal = static_cast<uint32_t>(static_cast<int32_t>(rs * 512.0f));
  uint32_t code = SelectBits(rb >= 0x3c800000u, normal, subnormal);
  code = SelectBits(a > 0x7f800000u, 0x7fu, code);  // NaN
  return static_cast<uint8_t>(sign | code);
}

// e4m3 -> float, exact. Branch-free.
inline float Fp8E4M3ToFloat(uint8_t c) {
  const uint32_t mag = c & 0x7fu;
  const uint32_t normal = (mag << 20) + (120u << 23);
  const uint32_t subnormal =
      FloatBits(static_cast<float>(static_cast<int32_t>(mag & 0x7u)) * 0x1.0p-9f);
  uint32_t v = SelectBits((mag & 0x78u) != 0, normal, subnormal);
  v = SelectBits(mag == 0x7fu, 0x7fc00000u, v);
  return BitsToFloat(v | (static_cast<uint32_t>(c & 0x80u) << 24));
}

// Rounds to the nearest integer, ties to even, for |x| < 2^22 (the range every caller clamps to).
// Same result as CUDA's rintf / __float2int_rn.
inline float RoundHalfEven(float x) {
  const float magic = 12582912.0f;  // 1.5 * 2^23
  return (x + magic) - magic;
}

// The quantizers' 1 / scale, or 0 where there is none or it is not finite (a scale so small that
// its inverse overflows: every element then quantizes to 0). One definition for the CPU twins and
// the CUDA kernels.
KVPOOL_HOST_DEVICE float FiniteInverse(float scale) {
  const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
  return inv <= 3.402823466e38f ? inv : 0.0f;
}

}  // namespace kernels
}  // namespace kvpool
