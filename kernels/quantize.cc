// CPU twin of block quantization, plus validation and device dispatch.
//
// Budget: quantize reads RawBytes and writes about half (int8, fp8) or a third (int4) of it; the
// target is >= 0.5x single-thread memcpy of the raw bytes (bench: kvpool-kernel-bench-cpu).
// Inner loops are written over one row of head_dim elements with no data-dependent branches so
// the compiler vectorizes them; the translation unit is built with -ffp-contract=off so no
// multiply-add is fused (the CUDA side is built with --fmad=false to match). This scalar code is
// the reference (QuantizeBlocksCpuScalar); fp8 and int4 quantize run the explicit AVX2 paths of
// quantize_cpu_avx2.cc instead where the CPU has AVX2 and F16C (same bytes, tested); fp32 input
// always takes the scalar loops (elements are handled as their 32-bit patterns).

#include "kernels/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/quantize_cpu.h"

namespace kvpool {
namespace kernels {
namespace {

// Hot loops get an AVX2 clone beside the baseline one (picked at load time by ifunc), so the
// same binary runs everywhere and uses 8-wide vectors where present.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define KVPOOL_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define KVPOOL_VECTOR_CLONES
#endif

// Storage of one element: the bits of a 16-bit float, or of an fp32 (integer ops on the bits
// keep the max / min loops vectorizable).
template <DType D>
struct BitsOf {
  using type = uint16_t;
};
template <>
struct BitsOf<DType::kFloat32> {
  using type = uint32_t;
};
template <DType D>
using Bits = typename BitsOf<D>::type;

template <DType D>
inline float Load(const Bits<D>* p, size_t i) {
  if constexpr (D == DType::kFloat32) {
    return BitsToFloat(p[i]);
  } else {
    return D == DType::kFloat16 ? HalfToFloat(p[i]) : Bf16ToFloat(p[i]);
  }
}
template <DType D>
inline Bits<D> Store(float f) {
  if constexpr (D == DType::kFloat32) {
    return FloatBits(f);
  } else {
    return D == DType::kFloat16 ? FloatToHalf(f) : FloatToBf16(f);
  }
}

// Largest |x| of n floats (16-bit or fp32 bits), as an integer max over the magnitude bits
// (monotonic for non-NaN values, and it vectorizes where a float max reduction would not).
template <typename E>
inline E AbsMaxBits(const E* p, int n) {
  constexpr E kMag = static_cast<E>(static_cast<E>(~E{0}) >> 1);  // (no sign extension)
  E m = 0;
  for (int i = 0; i < n; ++i) {
    const E a = p[i] & kMag;
    m = a > m ? a : m;
  }
  return m;
}

// Order-preserving key of a float's bits (-0 treated as +0), and back.
template <typename E>
inline E OrderKey(E b) {
  constexpr E kSign = static_cast<E>(E{1} << (sizeof(E) * 8 - 1));
  b = b == kSign ? 0 : b;
  return (b & kSign) ? static_cast<E>(~b) : static_cast<E>(b | kSign);
}
template <typename E>
inline E FromOrderKey(E k) {
  constexpr E kSign = static_cast<E>(E{1} << (sizeof(E) * 8 - 1));
  return (k & kSign) ? static_cast<E>(k & ~kSign) : static_cast<E>(~k);
}

constexpr float kHalfMax = 65504.0f;

template <DType D>
KVPOOL_VECTOR_CLONES void QuantizeInt8Rows(const Bits<D>* in, int8_t* q, float* scales, size_t rows,
                                           int dim) {
  for (size_t r = 0; r < rows; ++r) {
    const Bits<D>* src = in + r * dim;
    const Bits<D> mbits = AbsMaxBits(src, dim);
    const float scale = Load<D>(&mbits, 0) / 127.0f;
    const float inv = FiniteInverse(scale);
    int8_t* dst = q + r * dim;
    for (int d = 0; d < dim; ++d) {
      // Clamped before it is rounded, as the GPU does (fmaxf then fminf): NaN gives -127, and a
      // value beyond int's range never reaches the conversion.
      float v = Load<D>(src, d) * inv;
      v = v > -127.0f ? v : -127.0f;
      v = v < 127.0f ? v : 127.0f;
      dst[d] = static_cast<int8_t>(static_cast<int>(RoundHalfEven(v)));
    }
    scales[r] = scale;
  }
}

template <DType D>
void QuantizeInt8(const BlockLayout& l, const Bits<D>* in, uint8_t* out) {
  const size_t rows = static_cast<size_t>(l.num_layers) * 2 * l.tokens * l.num_kv_heads;
  QuantizeInt8Rows<D>(in, reinterpret_cast<int8_t*>(out),
                      reinterpret_cast<float*>(out + EncodedScaleOffset(l)), rows, l.head_dim);
}

template <DType D>
KVPOOL_VECTOR_CLONES void DequantizeInt8Rows(const int8_t* q, const float* scales, Bits<D>* out,
                                             size_t rows, int dim) {
  for (size_t r = 0; r < rows; ++r) {
    const float scale = scales[r];
    const int8_t* src = q + r * dim;
    Bits<D>* dst = out + r * dim;
    for (int d = 0; d < dim; ++d) dst[d] = Store<D>(static_cast<float>(src[d]) * scale);
  }
}

template <DType D>
void DequantizeInt8(const BlockLayout& l, const uint8_t* in, Bits<D>* out) {
  const size_t rows = static_cast<size_t>(l.num_layers) * 2 * l.tokens * l.num_kv_heads;
  DequantizeInt8Rows<D>(reinterpret_cast<const int8_t*>(in),
                        reinterpret_cast<const float*>(in + EncodedScaleOffset(l)), out, rows,
                        l.head_dim);
}

// One (layer, kv) plane: per-head amax over the block's tokens, then the codes.
template <DType D>
KVPOOL_VECTOR_CLONES void QuantizeFp8Plane(const Bits<D>* src, uint8_t* dst, float* scales,
                                           int tokens, int heads, int dim, Bits<D>* amax,
                                           float* inv) {
  for (int h = 0; h < heads; ++h) amax[h] = 0;
  for (int t = 0; t < tokens; ++t) {
    for (int h = 0; h < heads; ++h) {
      const Bits<D> m = AbsMaxBits(src + (static_cast<size_t>(t) * heads + h) * dim, dim);
      amax[h] = m > amax[h] ? m : amax[h];
    }
  }
  for (int h = 0; h < heads; ++h) {
    const float scale = Load<D>(&amax[h], 0) / kFp8E4M3Max;
    scales[h] = scale;
    inv[h] = FiniteInverse(scale);
  }
  for (int t = 0; t < tokens; ++t) {
    for (int h = 0; h < heads; ++h) {
      const size_t off = (static_cast<size_t>(t) * heads + h) * dim;
      const float s = inv[h];
      for (int d = 0; d < dim; ++d) dst[off + d] = FloatToFp8E4M3(Load<D>(src + off, d) * s);
    }
  }
}

template <DType D>
void QuantizeFp8(const BlockLayout& l, const Bits<D>* in, uint8_t* out) {
  const size_t planes = static_cast<size_t>(l.num_layers) * 2;
  const size_t plane_elems = PlaneElements(l);
  auto* scales = reinterpret_cast<float*>(out + EncodedScaleOffset(l));
  std::vector<Bits<D>> amax(l.num_kv_heads);
  std::vector<float> inv(l.num_kv_heads);
  for (size_t p = 0; p < planes; ++p) {
    QuantizeFp8Plane<D>(in + p * plane_elems, out + p * plane_elems, scales + p * l.num_kv_heads,
                        l.tokens, l.num_kv_heads, l.head_dim, amax.data(), inv.data());
  }
}

template <DType D>
KVPOOL_VECTOR_CLONES void DequantizeFp8Rows(const uint8_t* in, const float* scales, Bits<D>* out,
                                            size_t rows, int heads, int dim, int tokens) {
  for (size_t r = 0; r < rows; ++r) {
    // Row r is (plane, token, head): its scale is (plane, head).
    const size_t plane = r / (static_cast<size_t>(tokens) * heads);
    const float s = scales[plane * heads + r % heads];
    const uint8_t* src = in + r * dim;
    Bits<D>* dst = out + r * dim;
    for (int d = 0; d < dim; ++d) dst[d] = Store<D>(Fp8E4M3ToFloat(src[d]) * s);
  }
}

template <DType D>
void DequantizeFp8(const BlockLayout& l, const uint8_t* in, Bits<D>* out) {
  const size_t rows = static_cast<size_t>(l.num_layers) * 2 * l.tokens * l.num_kv_heads;
  DequantizeFp8Rows<D>(in, reinterpret_cast<const float*>(in + EncodedScaleOffset(l)), out, rows,
                       l.num_kv_heads, l.head_dim, l.tokens);
}

template <DType D, int G>
KVPOOL_VECTOR_CLONES void QuantizeInt4Groups(const Bits<D>* in, uint8_t* out, uint16_t* params,
                                             size_t groups) {
  for (size_t gi = 0; gi < groups; ++gi) {
    const Bits<D>* src = in + gi * G;
    Bits<D> kmin = static_cast<Bits<D>>(~Bits<D>{0}), kmax = 0;
    for (int d = 0; d < G; ++d) {
      const Bits<D> k = OrderKey(src[d]);
      kmin = k < kmin ? k : kmin;
      kmax = k > kmax ? k : kmax;
    }
    const Bits<D> mn_bits = FromOrderKey(kmin), mx_bits = FromOrderKey(kmax);
    const float mn = Load<D>(&mn_bits, 0), mx = Load<D>(&mx_bits, 0);
    const uint16_t s_bits = FloatToHalf(std::min((mx - mn) / 15.0f, kHalfMax));
    const uint16_t z_bits = FloatToHalf(std::min(std::max(mn, -kHalfMax), kHalfMax));
    const float s = HalfToFloat(s_bits);
    const float z = HalfToFloat(z_bits);
    const float inv = s > 0.0f ? 1.0f / s : 0.0f;
    uint8_t* dst = out + gi * (G / 2);
    for (int d = 0; d < G / 2; ++d) {
      // Clamped before rounding, as the GPU does: NaN gives 0, and a value beyond int's range 15.
      float v0 = (Load<D>(src, 2 * d) - z) * inv;
      float v1 = (Load<D>(src, 2 * d + 1) - z) * inv;
      v0 = v0 > 0.0f ? v0 : 0.0f;
      v1 = v1 > 0.0f ? v1 : 0.0f;
      v0 = v0 < 15.0f ? v0 : 15.0f;
      v1 = v1 < 15.0f ? v1 : 15.0f;
      dst[d] = static_cast<uint8_t>(static_cast<int>(RoundHalfEven(v0)) |
                                    (static_cast<int>(RoundHalfEven(v1)) << 4));
    }
    params[2 * gi] = s_bits;
    params[2 * gi + 1] = z_bits;
  }
}

template <DType D>
void QuantizeInt4(const BlockLayout& l, const Bits<D>* in, uint8_t* out) {
  auto* params = reinterpret_cast<uint16_t*>(out + EncodedScaleOffset(l));
  if (Int4GroupSize(l.encoding) == 32) {
    QuantizeInt4Groups<D, 32>(in, out, params, BlockElements(l) / 32);
  } else {
    QuantizeInt4Groups<D, 64>(in, out, params, BlockElements(l) / 64);
  }
}

template <DType D, int G>
KVPOOL_VECTOR_CLONES void DequantizeInt4Groups(const uint8_t* in, const uint16_t* params,
                                               Bits<D>* out, size_t groups) {
  for (size_t gi = 0; gi < groups; ++gi) {
    const float s = HalfToFloat(params[2 * gi]);
    const float z = HalfToFloat(params[2 * gi + 1]);
    const uint8_t* src = in + gi * (G / 2);
    Bits<D>* dst = out + gi * G;
    for (int d = 0; d < G / 2; ++d) {
      const uint8_t b = src[d];
      dst[2 * d] = Store<D>(static_cast<float>(static_cast<int>(b & 0xf)) * s + z);
      dst[2 * d + 1] = Store<D>(static_cast<float>(static_cast<int>(b >> 4)) * s + z);
    }
  }
}

template <DType D>
void DequantizeInt4(const BlockLayout& l, const uint8_t* in, Bits<D>* out) {
  const auto* params = reinterpret_cast<const uint16_t*>(in + EncodedScaleOffset(l));
  if (Int4GroupSize(l.encoding) == 32) {
    DequantizeInt4Groups<D, 32>(in, params, out, BlockElements(l) / 32);
  } else {
    DequantizeInt4Groups<D, 64>(in, params, out, BlockElements(l) / 64);
  }
}

void QuantizeFp8Avx2(const BlockLayout& l, const uint16_t* in, uint8_t* out) {
  const size_t planes = static_cast<size_t>(l.num_layers) * 2;
  const size_t plane_elems = PlaneElements(l);
  auto* scales = reinterpret_cast<float*>(out + EncodedScaleOffset(l));
  for (size_t p = 0; p < planes; ++p) {
    avx2::QuantizeFp8Plane(l.dtype, in + p * plane_elems, out + p * plane_elems,
                           scales + p * l.num_kv_heads, l.tokens, l.num_kv_heads, l.head_dim);
  }
}

void QuantizeInt4Avx2(const BlockLayout& l, const uint16_t* in, uint8_t* out) {
  const int g = Int4GroupSize(l.encoding);
  avx2::QuantizeInt4Groups(l.dtype, g, in, out,
                           reinterpret_cast<uint16_t*>(out + EncodedScaleOffset(l)),
                           BlockElements(l) / g);
}

// simd: use the AVX2 paths (the caller checked avx2::Supported()).
template <DType D>
void QuantizeOne(const BlockLayout& l, const void* raw, void* enc, bool simd) {
  const auto* in = static_cast<const Bits<D>*>(raw);
  auto* out = static_cast<uint8_t*>(enc);
  // The bytes between the data and the scale sections are zero, so an encoded block is a
  // function of its input alone (and carries nothing its buffer held before).
  const size_t data_bytes = EncodedDataBytes(l);
  if (l.encoding != Encoding::kRaw) {
    std::memset(out + data_bytes, 0, EncodedScaleOffset(l) - data_bytes);
  }
  // fp32 has no AVX2 path: its scalar loops (auto-vectorized) are the twin.
  switch (l.encoding) {
    case Encoding::kInt8:
      return QuantizeInt8<D>(l, in, out);
    case Encoding::kFp8E4M3:
      if constexpr (D != DType::kFloat32) {
        if (simd) return QuantizeFp8Avx2(l, in, out);
      }
      return QuantizeFp8<D>(l, in, out);
    case Encoding::kInt4G32:
    case Encoding::kInt4G64:
      if constexpr (D != DType::kFloat32) {
        if (simd) return QuantizeInt4Avx2(l, in, out);
      }
      return QuantizeInt4<D>(l, in, out);
    case Encoding::kRaw:
      return;
  }
}

Status QuantizeBlocksCpuImpl(const BlockLayout& layout, const void* const* raw,
                             void* const* encoded, int num_blocks, bool simd) {
  KVPOOL_RETURN_IF_ERROR(ValidateQuantize(layout, raw, encoded, num_blocks));
  for (int i = 0; i < num_blocks; ++i) {
    switch (layout.dtype) {
      case DType::kFloat16:
        QuantizeOne<DType::kFloat16>(layout, raw[i], encoded[i], simd);
        break;
      case DType::kBFloat16:
        QuantizeOne<DType::kBFloat16>(layout, raw[i], encoded[i], simd);
        break;
      case DType::kFloat32:
        QuantizeOne<DType::kFloat32>(layout, raw[i], encoded[i], simd);
        break;
    }
  }
  return Status::OK();
}

template <DType D>
void DequantizeOne(const BlockLayout& l, const void* enc, void* raw) {
  const auto* in = static_cast<const uint8_t*>(enc);
  auto* out = static_cast<Bits<D>*>(raw);
  switch (l.encoding) {
    case Encoding::kInt8:
      return DequantizeInt8<D>(l, in, out);
    case Encoding::kFp8E4M3:
      return DequantizeFp8<D>(l, in, out);
    case Encoding::kInt4G32:
    case Encoding::kInt4G64:
      return DequantizeInt4<D>(l, in, out);
    case Encoding::kRaw:
      return;
  }
}

}  // namespace

Status ValidateQuantize(const BlockLayout& layout, const void* const* in, void* const* out,
                        int num_blocks) {
  KVPOOL_RETURN_IF_ERROR(ValidateBlockLayout(layout));
  if (layout.encoding == Encoding::kRaw) {
    return Status::InvalidArgument("quantize needs a non-raw encoding in the layout");
  }
  if (num_blocks < 0) return Status::InvalidArgument("negative num_blocks");
  if (num_blocks == 0) return Status::OK();
  if (in == nullptr || out == nullptr) return Status::InvalidArgument("pointer array is null");
  for (int i = 0; i < num_blocks; ++i) {
    if (in[i] == nullptr || out[i] == nullptr) {
      return Status::InvalidArgument("block pointer " + std::to_string(i) + " is null");
    }
  }
  return Status::OK();
}

Status QuantizeBlocksCpu(const BlockLayout& layout, const void* const* raw, void* const* encoded,
                         int num_blocks) {
  return QuantizeBlocksCpuImpl(layout, raw, encoded, num_blocks, avx2::Supported());
}

Status QuantizeBlocksCpuScalar(const BlockLayout& layout, const void* const* raw,
                               void* const* encoded, int num_blocks) {
  return QuantizeBlocksCpuImpl(layout, raw, encoded, num_blocks, false);
}

Status DequantizeBlocksCpuScalar(const BlockLayout& layout, const void* const* encoded,
                                 void* const* raw, int num_blocks) {
  return DequantizeBlocksCpu(layout, encoded, raw, num_blocks);
}

Status DequantizeBlocksCpu(const BlockLayout& layout, const void* const* encoded, void* const* raw,
                           int num_blocks) {
  KVPOOL_RETURN_IF_ERROR(ValidateQuantize(layout, encoded, raw, num_blocks));
  for (int i = 0; i < num_blocks; ++i) {
    switch (layout.dtype) {
      case DType::kFloat16:
        DequantizeOne<DType::kFloat16>(layout, encoded[i], raw[i]);
        break;
      case DType::kBFloat16:
        DequantizeOne<DType::kBFloat16>(layout, encoded[i], raw[i]);
        break;
      case DType::kFloat32:
        DequantizeOne<DType::kFloat32>(layout, encoded[i], raw[i]);
        break;
    }
  }
  return Status::OK();
}

Status QuantizeBlocks(const ExecContext& ctx, const BlockLayout& layout, const void* const* raw,
                      void* const* encoded, int num_blocks) {
  if (ctx.device == Device::kCuda) {
    return QuantizeBlocksCuda(layout, raw, encoded, num_blocks, ctx.stream);
  }
  return QuantizeBlocksCpu(layout, raw, encoded, num_blocks);
}

Status DequantizeBlocks(const ExecContext& ctx, const BlockLayout& layout,
                        const void* const* encoded, void* const* raw, int num_blocks) {
  if (ctx.device == Device::kCuda) {
    return DequantizeBlocksCuda(layout, encoded, raw, num_blocks, ctx.stream);
  }
  return DequantizeBlocksCpu(layout, encoded, raw, num_blocks);
}

}  // namespace kernels
}  // namespace kvpool
