// AVX2 + F16C paths of the CPU quantize twin (see quantize_cpu.h): fp8 e4m3 and int4 quantize.
//
// Budget: >= 0.5x single-thread memcpy of the raw bytes (kvpool-kernel-bench-cpu). The scalar
// twin's per-element conversions vectorize poorly (fp8: the float rounding trick plus selects;
// int4: a per-group min/max and two f16 conversions per group), which left them at 0.16-0.30x.
//
// Exactness, lane by lane against the scalar reference in quantize.cc / dtype.h:
//   * 16-bit loads: bf16 is a shift; fp16 uses vcvtph2ps, exact except that it quiets a signaling
//     NaN. Every loaded value goes straight into a multiply or subtract, which quiets it anyway,
//     and the codes depend only on whether a value is NaN and on its sign.
//   * fp8: |v| clamped to 464 first (saturation), then integer round to nearest even at 3 mantissa
//     bits for |v| >= 2^-6, RNE to a multiple of 2^-9 (vcvtps2dq under the default rounding mode)
//     below; both equal the scalar add-and-subtract-a-magic-constant rounding. NaN -> 0x7f.
//   * float -> f16: vcvtps2ph with RNE equals FloatToHalf for every non-NaN float; NaN is
//     rewritten to FloatToHalf's 0x7e00 | sign.
//   * min/max use the operand order that gives std::min / std::max's result for NaN.
//   * int4 group min/max: a signed 16-bit key (the magnitude, negated when the sign bit is set,
//     so -0 == +0) orders values exactly as the scalar OrderKey16.
// The translation unit is built with -ffp-contract=off and no FMA target, so nothing is fused.

#include "kernels/quantize_cpu.h"

#include <algorithm>
#include <cstring>

#include "kernels/dtype.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KVPOOL_QUANTIZE_AVX2 1
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace kvpool {
namespace kernels {
namespace avx2 {

#if KVPOOL_QUANTIZE_AVX2

#define KVPOOL_AVX2 __attribute__((target("avx2,f16c")))

bool Supported() {
  static const bool supported = [] {
    __builtin_cpu_init();
    // F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does not know "f16c".
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
    return __builtin_cpu_supports("avx2") && f16c;
  }();
  return supported;
}

namespace {

constexpr float kHalfMax = 65504.0f;

// 16 elements at p as two f32 vectors. The lane order is the loader's own: Pack16 undoes it.
template <DType D>
KVPOOL_AVX2 inline void Load16(const uint16_t* p, __m256* a, __m256* b) {
  if (D == DType::kBFloat16) {
    // Unpacking within 128-bit lanes gives elements {0-3, 8-11} and {4-7, 12-15}; packus
    // (also within lanes) puts them back in order.
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i zero = _mm256_setzero_si256();
    *a = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v));
    *b = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v));
  } else {
    *a = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    *b = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
  }
}

// Two int32 vectors from Load16's lanes -> 16 uint16 in element order (unsigned saturation).
template <DType D>
KVPOOL_AVX2 inline __m256i Pack16(__m256i a, __m256i b) {
  const __m256i p = _mm256_packus_epi32(a, b);
  // fp16 lanes were in natural order: packus interleaves their 64-bit quarters.
  return D == DType::kBFloat16 ? p : _mm256_permute4x64_epi64(p, 0xd8);
}

// dtype.h's FloatToFp8E4M3 on 8 lanes; codes in the low byte of each int32 lane.
KVPOOL_AVX2 inline __m256i Fp8Codes(__m256 v) {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(x, 24), _mm256_set1_epi32(0x80));
  // |v| clamped to 464 (which rounds to 448, as does everything in (448, 464]; all above
  // saturates to 448 too). min_ps returns its second operand for NaN, so NaN stays NaN.
  const __m256 abs = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)));
  const __m256i a = _mm256_castps_si256(_mm256_min_ps(_mm256_set1_ps(464.0f), abs));
  // |v| >= 2^-6: round to nearest even at 3 mantissa bits, rebias the exponent (7 - 127).
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(a, 20), _mm256_set1_epi32(1));
  const __m256i r =
      _mm256_add_epi32(_mm256_add_epi32(a, _mm256_set1_epi32(0x7ffff - (120 << 23))), odd);
  const __m256i normal = _mm256_srli_epi32(r, 20);  // NaN: > 0x7f
  // |v| < 2^-6: multiples of 2^-9, rounded to nearest even (a * 512 is exact).
  const __m256i subnormal =
      _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(512.0f)));
  // (A float compare: GCC turns the integer one into min + equal.) NaN compares false: normal.
  const __m256 is_sub =
      _mm256_cmp_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(0x1.0p-6f), _CMP_LT_OQ);
  __m256i code = _mm256_castps_si256(
      _mm256_blendv_ps(_mm256_castsi256_ps(normal), _mm256_castsi256_ps(subnormal), is_sub));
  code = _mm256_min_epu32(code, _mm256_set1_epi32(0x7f));  // NaN -> 0x7f; finite codes <= 0x7e
  return _mm256_or_si256(code, sign);
}

// dtype.h's FloatToHalf on 8 lanes.
KVPOOL_AVX2 inline __m128i HalfBits(__m256 v) {
  const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m128i is_nan =
      _mm_cmpgt_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7fff)), _mm_set1_epi16(0x7c00));
  const __m128i nan = _mm_or_si128(_mm_and_si128(h, _mm_set1_epi16(static_cast<int16_t>(0x8000))),
                                   _mm_set1_epi16(0x7e00));
  return _mm_blendv_epi8(h, nan, is_nan);
}

// Largest |x| bits of n 16-bit floats (scalar AbsMaxBits).
KVPOOL_AVX2 inline uint16_t AbsMaxBits(const uint16_t* p, int n) {
  __m256i m = _mm256_setzero_si256();
  const __m256i mask = _mm256_set1_epi16(0x7fff);
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i));
    m = _mm256_max_epu16(m, _mm256_and_si256(v, mask));
  }
  __m128i m8 = _mm_max_epu16(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  // max = ~min(~x): phminposuw finds the minimum of 8 uint16.
  m8 = _mm_minpos_epu16(_mm_xor_si128(m8, _mm_set1_epi16(-1)));
  uint16_t r = static_cast<uint16_t>(~_mm_cvtsi128_si32(m8));
  for (; i < n; ++i) {
    const uint16_t a = p[i] & 0x7fffu;
    r = a > r ? a : r;
  }
  return r;
}

template <DType D>
KVPOOL_AVX2 void Fp8Row(const uint16_t* src, uint8_t* dst, int n, float inv) {
  const __m256 s = _mm256_set1_ps(inv);
  int d = 0;
  for (; d + 32 <= n; d += 32) {
    __m256 a0, b0, a1, b1;
    Load16<D>(src + d, &a0, &b0);
    Load16<D>(src + d + 16, &a1, &b1);
    const __m256i p0 = Pack16<D>(Fp8Codes(_mm256_mul_ps(a0, s)), Fp8Codes(_mm256_mul_ps(b0, s)));
    const __m256i p1 = Pack16<D>(Fp8Codes(_mm256_mul_ps(a1, s)), Fp8Codes(_mm256_mul_ps(b1, s)));
    const __m256i bytes = _mm256_permute4x64_epi64(_mm256_packus_epi16(p0, p1), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + d), bytes);
  }
  for (; d < n; ++d) dst[d] = FloatToFp8E4M3(LoadElement(src, d, D) * inv);
}

template <DType D>
KVPOOL_AVX2 void QuantizeFp8PlaneT(const uint16_t* src, uint8_t* dst, float* scales, int tokens,
                                   int heads, int dim) {
  constexpr int kHeadsOnStack = 64;
  uint16_t amax_stack[kHeadsOnStack];
  float inv_stack[kHeadsOnStack];
  // Planes with more heads than fit on the stack go in chunks of heads (same per-head results).
  for (int h0 = 0; h0 < heads; h0 += kHeadsOnStack) {
    const int nh = std::min(kHeadsOnStack, heads - h0);
    for (int h = 0; h < nh; ++h) amax_stack[h] = 0;
    for (int t = 0; t < tokens; ++t) {
      for (int h = 0; h < nh; ++h) {
        const uint16_t m = AbsMaxBits(src + (static_cast<size_t>(t) * heads + h0 + h) * dim, dim);
        amax_stack[h] = m > amax_stack[h] ? m : amax_stack[h];
      }
    }
    for (int h = 0; h < nh; ++h) {
      const float scale = LoadElement(&amax_stack[h], 0, D) / kFp8E4M3Max;
      scales[h0 + h] = scale;
      inv_stack[h] = FiniteInverse(scale);
    }
    for (int t = 0; t < tokens; ++t) {
      for (int h = 0; h < nh; ++h) {
        const size_t off = (static_cast<size_t>(t) * heads + h0 + h) * dim;
        Fp8Row<D>(src + off, dst + off, dim, inv_stack[h]);
      }
    }
  }
}

// Signed order key of 16 16-bit floats: magnitude, negated when the sign bit is set (-0 -> 0).
KVPOOL_AVX2 inline __m256i OrderKeys(__m256i b) {
  const __m256i m = _mm256_srai_epi16(b, 15);
  const __m256i mag = _mm256_and_si256(b, _mm256_set1_epi16(0x7fff));
  return _mm256_sub_epi16(_mm256_xor_si256(mag, m), m);
}

// OrderKeys' inverse on 8 lanes: |k| with the sign of k.
KVPOOL_AVX2 inline __m128i KeyBits(__m128i k) {
  return _mm_or_si128(_mm_abs_epi16(k),
                      _mm_and_si128(k, _mm_set1_epi16(static_cast<int16_t>(0x8000))));
}

// 32 elements -> 16 bytes of nibbles: q = clamp(rne((x - z) * inv), 0, 15).
template <DType D>
KVPOOL_AVX2 inline void Int4Codes32(const uint16_t* src, __m256 z, __m256 inv, uint8_t* dst) {
  const __m256 magic = _mm256_set1_ps(12582912.0f);
  __m256 x[4];
  Load16<D>(src, &x[0], &x[1]);
  Load16<D>(src + 16, &x[2], &x[3]);
  __m256i q[4];
  for (int i = 0; i < 4; ++i) {
    // Clamped to [0, 15] before rounding, as the scalar twin and the GPU do: max_ps returns its
    // second operand for NaN, so NaN gives 0.
    __m256 v = _mm256_mul_ps(_mm256_sub_ps(x[i], z), inv);
    v = _mm256_min_ps(_mm256_max_ps(v, _mm256_setzero_ps()), _mm256_set1_ps(15.0f));
    q[i] = _mm256_cvttps_epi32(_mm256_sub_ps(_mm256_add_ps(v, magic), magic));
  }
  // The codes are 0-15 already; packus and the min keep them there.
  const __m256i fifteen = _mm256_set1_epi16(15);
  const __m256i p0 = _mm256_min_epu16(Pack16<D>(q[0], q[1]), fifteen);  // elements 0-15
  const __m256i p1 = _mm256_min_epu16(Pack16<D>(q[2], q[3]), fifteen);  // elements 16-31
  // Bytes, per 128-bit lane: {0-7, 16-23} and {8-15, 24-31}.
  const __m256i b = _mm256_packus_epi16(p0, p1);
  // Each 16-bit pair (even | odd << 8) -> even | odd << 4.
  const __m256i w =
      _mm256_and_si256(_mm256_or_si256(b, _mm256_srli_epi16(b, 4)), _mm256_set1_epi16(0xff));
  // Nibble bytes, per lane: {pairs of 0-7, 16-23} x2 and {8-15, 24-31} x2, 4 bytes each.
  const __m256i n = _mm256_packus_epi16(w, w);
  const __m256i ordered = _mm256_permutevar8x32_epi32(n, _mm256_setr_epi32(0, 4, 1, 5, 0, 0, 0, 0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm256_castsi256_si128(ordered));
}

template <DType D, int G>
KVPOOL_AVX2 void QuantizeInt4GroupsT(const uint16_t* in, uint8_t* out, uint16_t* params,
                                     size_t groups) {
  // Eight groups at a time: their min/max, then their parameters on 8 lanes, then their codes.
  for (size_t g0 = 0; g0 < groups; g0 += 8) {
    const int n = static_cast<int>(std::min<size_t>(8, groups - g0));
    alignas(16) int16_t kmin[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    alignas(16) int16_t kmax[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int i = 0; i < n; ++i) {
      const uint16_t* src = in + (g0 + i) * G;
      __m256i lo = OrderKeys(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
      __m256i hi = lo;
      for (int j = 16; j < G; j += 16) {
        const __m256i k = OrderKeys(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + j)));
        lo = _mm256_min_epi16(lo, k);
        hi = _mm256_max_epi16(hi, k);
      }
      __m128i lo8 = _mm_min_epi16(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1));
      __m128i hi8 = _mm_max_epi16(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1));
      // Signed -> unsigned order is xor 0x8000; max = ~min(~x) (the xor with 0x7fff does both).
      lo8 = _mm_minpos_epu16(_mm_xor_si128(lo8, _mm_set1_epi16(static_cast<int16_t>(0x8000))));
      hi8 = _mm_minpos_epu16(_mm_xor_si128(hi8, _mm_set1_epi16(0x7fff)));
      kmin[i] = static_cast<int16_t>(_mm_cvtsi128_si32(lo8) ^ 0x8000);
      kmax[i] = static_cast<int16_t>(_mm_cvtsi128_si32(hi8) ^ 0x7fff);
    }
    const __m128i mn_bits = KeyBits(_mm_load_si128(reinterpret_cast<const __m128i*>(kmin)));
    const __m128i mx_bits = KeyBits(_mm_load_si128(reinterpret_cast<const __m128i*>(kmax)));
    __m256 mn, mx;
    if (D == DType::kBFloat16) {
      mn = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(mn_bits), 16));
      mx = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(mx_bits), 16));
    } else {
      mn = _mm256_cvtph_ps(mn_bits);
      mx = _mm256_cvtph_ps(mx_bits);
    }
    // s = f16(min((mx - mn) / 15, 65504)), z = f16(min(max(mn, -65504), 65504)) with std::min /
    // std::max's NaN behaviour: _mm256_min_ps(a, b) is a < b ? a : b.
    const __m256 hmax = _mm256_set1_ps(kHalfMax);
    const __m256 range = _mm256_div_ps(_mm256_sub_ps(mx, mn), _mm256_set1_ps(15.0f));
    const __m128i s_bits = HalfBits(_mm256_min_ps(hmax, range));
    const __m128i z_bits =
        HalfBits(_mm256_min_ps(hmax, _mm256_max_ps(_mm256_set1_ps(-kHalfMax), mn)));
    const __m256 s = _mm256_cvtph_ps(s_bits);
    alignas(32) float z[8], inv[8];
    _mm256_store_ps(z, _mm256_cvtph_ps(z_bits));
    _mm256_store_ps(inv, _mm256_and_ps(_mm256_cmp_ps(s, _mm256_setzero_ps(), _CMP_GT_OQ),
                                       _mm256_div_ps(_mm256_set1_ps(1.0f), s)));
    alignas(16) uint16_t sz[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(sz), _mm_unpacklo_epi16(s_bits, z_bits));
    _mm_store_si128(reinterpret_cast<__m128i*>(sz + 8), _mm_unpackhi_epi16(s_bits, z_bits));
    std::memcpy(params + 2 * g0, sz, sizeof(uint16_t) * 2 * n);
    for (int i = 0; i < n; ++i) {
      const __m256 zi = _mm256_set1_ps(z[i]), ii = _mm256_set1_ps(inv[i]);
      for (int j = 0; j < G; j += 32) {
        Int4Codes32<D>(in + (g0 + i) * G + j, zi, ii, out + (g0 + i) * (G / 2) + j / 2);
      }
    }
  }
}

}  // namespace

void QuantizeFp8Plane(DType dtype, const uint16_t* src, uint8_t* dst, float* scales, int tokens,
                      int heads, int dim) {
  if (dtype == DType::kFloat16) {
    QuantizeFp8PlaneT<DType::kFloat16>(src, dst, scales, tokens, heads, dim);
  } else {
    QuantizeFp8PlaneT<DType::kBFloat16>(src, dst, scales, tokens, heads, dim);
  }
}

void QuantizeInt4Groups(DType dtype, int group, const uint16_t* in, uint8_t* out, uint16_t* params,
                        size_t groups) {
  if (dtype == DType::kFloat16) {
    if (group == 32) return QuantizeInt4GroupsT<DType::kFloat16, 32>(in, out, params, groups);
    return QuantizeInt4GroupsT<DType::kFloat16, 64>(in, out, params, groups);
  }
  if (group == 32) return QuantizeInt4GroupsT<DType::kBFloat16, 32>(in, out, params, groups);
  return QuantizeInt4GroupsT<DType::kBFloat16, 64>(in, out, params, groups);
}

KVPOOL_AVX2 void FloatToFp8E4M3Array(const float* in, uint8_t* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    alignas(32) int32_t c[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(c), Fp8Codes(_mm256_loadu_ps(in + i)));
    for (int j = 0; j < 8; ++j) out[i + j] = static_cast<uint8_t>(c[j]);
  }
  for (; i < n; ++i) out[i] = FloatToFp8E4M3(in[i]);
}

KVPOOL_AVX2 void FloatToHalfArray(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), HalfBits(_mm256_loadu_ps(in + i)));
  }
  for (; i < n; ++i) out[i] = FloatToHalf(in[i]);
}

#else  // !KVPOOL_QUANTIZE_AVX2

bool Supported() { return false; }
void QuantizeFp8Plane(DType, const uint16_t*, uint8_t*, float*, int, int, int) {}
void QuantizeInt4Groups(DType, int, const uint16_t*, uint8_t*, uint16_t*, size_t) {}
void FloatToFp8E4M3Array(const float*, uint8_t*, size_t) {}
void FloatToHalfArray(const float*, uint16_t*, size_t) {}

#endif  // KVPOOL_QUANTIZE_AVX2

}  // namespace avx2
}  // namespace kernels
}  // namespace kvpool
