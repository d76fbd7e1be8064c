#pragma once
// Element types of KV tensors and exact host conversions between them.
//
// kvpool stores K and V as 16-bit floats (fp16 or bf16) and encodes them as int8, fp8 e4m3 or
// int4. The CPU twins of the kernels convert with the helpers below; they round to nearest even
// exactly as CUDA's __float2half_rn, __float2bfloat16_rn and
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) do, so CPU and GPU agree bit for bit where
// both compute the same float. The helpers are branch-light so loops over them vectorize.
//
// Thread safety: pure functions. C++17-clean: included by .cu files (host code only).

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace kvpool {
namespace kernels {

// Element type of a K/V tensor. Stable values: they are part of a block's layout fingerprint.
enum class DType : uint8_t {
  kFloat16 = 0,   // IEEE binary16
  kBFloat16 = 1,  // bfloat16
};

inline constexpr size_t DTypeSize(DType) { return 2; }
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

// binary16 -> float, exact (subnormals, inf and NaN included).
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t nonsign = h & 0x7fffu;
  // Re-biasing by multiplying with 2^112 handles normals and subnormals alike.
  float mag = BitsToFloat(nonsign << 13) * 0x1.0p112f;
  if (nonsign >= 0x7c00u) mag = BitsToFloat(0x7f800000u | (nonsign << 13));  // inf, NaN
  return BitsToFloat(FloatBits(mag) | sign);
}

// float -> binary16, round to nearest even; overflow gives inf, NaN stays NaN.
inline uint16_t FloatToHalf(float f) {
  const uint32_t x = FloatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7fffffffu;
  uint32_t h;
  if (a > 0x7f800000u) {
    h = 0x7e00u;  // NaN
  } else if (a >= 0x477ff000u) {
    h = 0x7c00u;                  // >= 65520 rounds to inf
  } else if (a >= 0x38800000u) {  // normal half: >= 2^-14
    const uint32_t base = a - 0x38000000u;
    const uint32_t q = base >> 13;
    const uint32_t rem = base & 0x1fffu;
    h = q + ((rem > 0x1000u) | ((rem == 0x1000u) & q));
  } else if (a > 0x33000000u) {  // subnormal half: (2^-25, 2^-14)
    const uint32_t e = a >> 23;
    const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e;  // 14..24
    const uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    h = q + ((rem > half) | ((rem == half) & q));
  } else {
    h = 0;  // <= 2^-25 rounds to zero (the tie at 2^-25 goes to even zero)
  }
  return static_cast<uint16_t>(sign | h);
}

inline float Bf16ToFloat(uint16_t b) { return BitsToFloat(static_cast<uint32_t>(b) << 16); }

// float -> bfloat16, round to nearest even; NaN stays a quiet NaN.
inline uint16_t FloatToBf16(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

inline float LoadElement(const uint16_t* p, size_t i, DType dtype) {
  return dtype == DType::kFloat16 ? HalfToFloat(p[i]) : Bf16ToFloat(p[i]);
}
inline uint16_t FromFloat(float f, DType dtype) {
  return dtype == DType::kFloat16 ? FloatToHalf(f) : FloatToBf16(f);
}

// fp8 e4m3 (OCP "E4M3FN", NVIDIA __nv_fp8_e4m3): bias 7, no infinities, 0x7f/0xff are NaN,
// largest finite 448, smallest subnormal 2^-9.
constexpr float kFp8E4M3Max = 448.0f;

// float -> e4m3 with round to nearest even and saturation to +-448 (satfinite); NaN -> 0x7f|sign.
inline uint8_t FloatToFp8E4M3(float f) {
  const uint32_t x = FloatBits(f);
  const uint8_t sign = static_cast<uint8_t>((x >> 24) & 0x80u);
  const uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);
  uint32_t code;
  if (a >= 0x43e00000u) {  // >= 448 (and inf): saturate
    code = 0x7eu;
  } else if (a >= 0x3c800000u) {          // normal e4m3: >= 2^-6
    const uint32_t e = (a >> 23) - 120u;  // rebias 127 -> 7
    const uint32_t mant = a & 0x7fffffu;
    const uint32_t q = (e << 3) | (mant >> 20);
    const uint32_t rem = mant & 0xfffffu;
    code = q + ((rem > 0x80000u) | ((rem == 0x80000u) & q));
    if (code > 0x7eu) code = 0x7eu;
  } else {  // subnormal: multiples of 2^-9, round to nearest even
    const float scaled = BitsToFloat(a) * 512.0f;  // exact
    code = static_cast<uint32_t>((scaled + 8388608.0f) - 8388608.0f);
  }
  return static_cast<uint8_t>(sign | code);
}

// e4m3 -> float, exact.
inline float Fp8E4M3ToFloat(uint8_t c) {
  const uint32_t exp = (c >> 3) & 0xfu;
  const uint32_t man = c & 0x7u;
  float mag;
  if (exp == 0xfu && man == 0x7u) {
    mag = BitsToFloat(0x7fc00000u);
  } else if (exp == 0) {
    mag = static_cast<float>(man) * 0x1.0p-9f;
  } else {
    mag = BitsToFloat(((exp + 120u) << 23) | (man << 20));
  }
  return (c & 0x80u) ? -mag : mag;
}

// Rounds to the nearest integer, ties to even, for |x| < 2^22 (the range every caller clamps to).
// Same result as CUDA's rintf / __float2int_rn.
inline float RoundHalfEven(float x) {
  const float magic = 12582912.0f;  // 1.5 * 2^23
  return (x + magic) - magic;
}

}  // namespace kernels
}  // namespace kvpool
