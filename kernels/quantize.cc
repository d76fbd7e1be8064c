// CPU twin of block quantization, plus validation and device dispatch.
//
// Budget: quantize reads RawBytes and writes about half (int8, fp8) or a third (int4) of it; the
// target is >= 0.5x single-thread memcpy of the raw bytes (bench: kvpool-kernel-bench-cpu).
// Inner loops are written over one row of head_dim elements with no data-dependent branches so
// the compiler vectorizes them; the translation unit is built with -ffp-contract=off so no
// multiply-add is fused (the CUDA side is built with --fmad=false to match).

#include "kernels/quantize.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace kvpool {
namespace kernels {
namespace {

template <DType D>
inline float Load(const uint16_t* p, size_t i) {
  return D == DType::kFloat16 ? HalfToFloat(p[i]) : Bf16ToFloat(p[i]);
}
template <DType D>
inline uint16_t Store(float f) {
  return D == DType::kFloat16 ? FloatToHalf(f) : FloatToBf16(f);
}

// e4m3 -> float for all 256 codes.
struct Fp8Table {
  float v[256];
  Fp8Table() {
    for (int c = 0; c < 256; ++c) v[c] = Fp8E4M3ToFloat(static_cast<uint8_t>(c));
  }
};
const Fp8Table& Fp8Lut() {
  static const Fp8Table table;
  return table;
}

constexpr float kHalfMax = 65504.0f;

template <DType D>
void QuantizeInt8(const BlockLayout& l, const uint16_t* in, uint8_t* out) {
  const int dim = l.head_dim;
  const size_t rows = static_cast<size_t>(l.num_layers) * 2 * l.tokens * l.num_kv_heads;
  auto* q = reinterpret_cast<int8_t*>(out);
  auto* scales = reinterpret_cast<float*>(out + EncodedScaleOffset(l));
  std::vector<float> x(dim);
  for (size_t r = 0; r < rows; ++r) {
    const uint16_t* src = in + r * dim;
    float amax = 0.0f;
    for (int d = 0; d < dim; ++d) {
      x[d] = Load<D>(src, d);
      amax = std::max(amax, std::fabs(x[d]));
    }
    const float scale = amax / 127.0f;
    const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
    int8_t* dst = q + r * dim;
    for (int d = 0; d < dim; ++d) {
      const float v = std::min(std::max(x[d] * inv, -127.0f), 127.0f);
      dst[d] = static_cast<int8_t>(RoundHalfEven(v));
    }
    scales[r] = scale;
  }
}

template <DType D>
void DequantizeInt8(const BlockLayout& l, const uint8_t* in, uint16_t* out) {
  const int dim = l.head_dim;
  const size_t rows = static_cast<size_t>(l.num_layers) * 2 * l.tokens * l.num_kv_heads;
  const auto* q = reinterpret_cast<const int8_t*>(in);
  const auto* scales = reinterpret_cast<const float*>(in + EncodedScaleOffset(l));
  for (size_t r = 0; r < rows; ++r) {
    const float scale = scales[r];
    const int8_t* src = q + r * dim;
    uint16_t* dst = out + r * dim;
    for (int d = 0; d < dim; ++d) dst[d] = Store<D>(static_cast<float>(src[d]) * scale);
  }
}

template <DType D>
void QuantizeFp8(const BlockLayout& l, const uint16_t* in, uint8_t* out) {
  const int dim = l.head_dim;
  const int heads = l.num_kv_heads;
  const size_t planes = static_cast<size_t>(l.num_layers) * 2;
  const size_t plane_elems = PlaneElements(l);
  auto* scales = reinterpret_cast<float*>(out + EncodedScaleOffset(l));
  std::vector<float> amax(heads), inv(heads);
  for (size_t p = 0; p < planes; ++p) {
    const uint16_t* src = in + p * plane_elems;
    uint8_t* dst = out + p * plane_elems;
    std::fill(amax.begin(), amax.end(), 0.0f);
    for (int t = 0; t < l.tokens; ++t) {
      for (int h = 0; h < heads; ++h) {
        const uint16_t* row = src + (static_cast<size_t>(t) * heads + h) * dim;
        float m = amax[h];
        for (int d = 0; d < dim; ++d) m = std::max(m, std::fabs(Load<D>(row, d)));
        amax[h] = m;
      }
    }
    for (int h = 0; h < heads; ++h) {
      const float scale = amax[h] / kFp8E4M3Max;
      scales[p * heads + h] = scale;
      inv[h] = scale > 0.0f ? 1.0f / scale : 0.0f;
    }
    for (int t = 0; t < l.tokens; ++t) {
      for (int h = 0; h < heads; ++h) {
        const size_t off = (static_cast<size_t>(t) * heads + h) * dim;
        const float s = inv[h];
        for (int d = 0; d < dim; ++d) dst[off + d] = FloatToFp8E4M3(Load<D>(src + off, d) * s);
      }
    }
  }
}

template <DType D>
void DequantizeFp8(const BlockLayout& l, const uint8_t* in, uint16_t* out) {
  const int dim = l.head_dim;
  const int heads = l.num_kv_heads;
  const size_t planes = static_cast<size_t>(l.num_layers) * 2;
  const size_t plane_elems = PlaneElements(l);
  const auto* scales = reinterpret_cast<const float*>(in + EncodedScaleOffset(l));
  const float* lut = Fp8Lut().v;
  for (size_t p = 0; p < planes; ++p) {
    for (int t = 0; t < l.tokens; ++t) {
      for (int h = 0; h < heads; ++h) {
        const size_t off = p * plane_elems + (static_cast<size_t>(t) * heads + h) * dim;
        const float s = scales[p * heads + h];
        for (int d = 0; d < dim; ++d) out[off + d] = Store<D>(lut[in[off + d]] * s);
      }
    }
  }
}

template <DType D>
void QuantizeInt4(const BlockLayout& l, const uint16_t* in, uint8_t* out) {
  const int g = Int4GroupSize(l.encoding);
  const size_t groups = BlockElements(l) / g;
  auto* params = reinterpret_cast<uint16_t*>(out + EncodedScaleOffset(l));
  float x[64];
  uint8_t q[64];
  for (size_t gi = 0; gi < groups; ++gi) {
    const uint16_t* src = in + gi * g;
    float mn = INFINITY, mx = -INFINITY;
    for (int d = 0; d < g; ++d) {
      x[d] = Load<D>(src, d);
      mn = std::min(mn, x[d]);
      mx = std::max(mx, x[d]);
    }
    const uint16_t s_bits = FloatToHalf(std::min((mx - mn) / 15.0f, kHalfMax));
    const uint16_t z_bits = FloatToHalf(std::min(std::max(mn, -kHalfMax), kHalfMax));
    const float s = HalfToFloat(s_bits);
    const float z = HalfToFloat(z_bits);
    const float inv = s > 0.0f ? 1.0f / s : 0.0f;
    for (int d = 0; d < g; ++d) {
      const float v = std::min(std::max((x[d] - z) * inv, 0.0f), 15.0f);
      q[d] = static_cast<uint8_t>(RoundHalfEven(v));
    }
    uint8_t* dst = out + gi * (g / 2);
    for (int d = 0; d < g / 2; ++d) dst[d] = static_cast<uint8_t>(q[2 * d] | (q[2 * d + 1] << 4));
    params[2 * gi] = s_bits;
    params[2 * gi + 1] = z_bits;
  }
}

template <DType D>
void DequantizeInt4(const BlockLayout& l, const uint8_t* in, uint16_t* out) {
  const int g = Int4GroupSize(l.encoding);
  const size_t groups = BlockElements(l) / g;
  const auto* params = reinterpret_cast<const uint16_t*>(in + EncodedScaleOffset(l));
  for (size_t gi = 0; gi < groups; ++gi) {
    const float s = HalfToFloat(params[2 * gi]);
    const float z = HalfToFloat(params[2 * gi + 1]);
    const uint8_t* src = in + gi * (g / 2);
    uint16_t* dst = out + gi * g;
    for (int d = 0; d < g / 2; ++d) {
      const uint8_t b = src[d];
      dst[2 * d] = Store<D>(static_cast<float>(b & 0xf) * s + z);
      dst[2 * d + 1] = Store<D>(static_cast<float>(b >> 4) * s + z);
    }
  }
}

template <DType D>
void QuantizeOne(const BlockLayout& l, const void* raw, void* enc) {
  const auto* in = static_cast<const uint16_t*>(raw);
  auto* out = static_cast<uint8_t*>(enc);
  switch (l.encoding) {
    case Encoding::kInt8:
      return QuantizeInt8<D>(l, in, out);
    case Encoding::kFp8E4M3:
      return QuantizeFp8<D>(l, in, out);
    case Encoding::kInt4G32:
    case Encoding::kInt4G64:
      return QuantizeInt4<D>(l, in, out);
    case Encoding::kRaw:
      return;
  }
}

template <DType D>
void DequantizeOne(const BlockLayout& l, const void* enc, void* raw) {
  const auto* in = static_cast<const uint8_t*>(enc);
  auto* out = static_cast<uint16_t*>(raw);
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
  KVPOOL_RETURN_IF_ERROR(ValidateQuantize(layout, raw, encoded, num_blocks));
  for (int i = 0; i < num_blocks; ++i) {
    if (layout.dtype == DType::kFloat16) {
      QuantizeOne<DType::kFloat16>(layout, raw[i], encoded[i]);
    } else {
      QuantizeOne<DType::kBFloat16>(layout, raw[i], encoded[i]);
    }
  }
  return Status::OK();
}

Status DequantizeBlocksCpu(const BlockLayout& layout, const void* const* encoded, void* const* raw,
                           int num_blocks) {
  KVPOOL_RETURN_IF_ERROR(ValidateQuantize(layout, encoded, raw, num_blocks));
  for (int i = 0; i < num_blocks; ++i) {
    if (layout.dtype == DType::kFloat16) {
      DequantizeOne<DType::kFloat16>(layout, encoded[i], raw[i]);
    } else {
      DequantizeOne<DType::kBFloat16>(layout, encoded[i], raw[i]);
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
