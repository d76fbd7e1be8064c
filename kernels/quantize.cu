// CUDA block quantization, the same f32 arithmetic as the CPU twin (quantize.cc); built with
// --fmad=false so no multiply-add is fused and codes match the twin bit for bit.
//
// Budget: memory bound; the target is >= 0.7x the device-to-device copy bandwidth of the bytes
// read plus written (measured by kvpool-kernel-check). Mapping:
//   int8   one warp per (layer, kv, token, head) row: amax by shuffles, then quantize (2nd read
//          hits L1).
//   fp8    one CTA per (block, layer, kv, head): amax over the block's tokens, then quantize.
//   int4   one thread per group of G elements.
//   dequantize: one thread per element pair (per row scale / group parameters looked up).
// One launch covers up to 128 blocks (pointer arrays travel as kernel parameters).

#include <cstdint>
#include <string>

#include "kernels/cuda_check.h"
#include "kernels/cuda_dtype.cuh"
#include "kernels/quantize.h"

namespace kvpool {
namespace kernels {
namespace {

constexpr int kBlocksPerLaunch = 128;
constexpr float kHalfMaxF = 65504.0f;

struct QuantArgs {
  const void* in[kBlocksPerLaunch];
  void* out[kBlocksPerLaunch];
  int num_blocks;
  int head_dim;
  int heads;
  int tokens;
  int planes;            // layers * 2
  int group;             // int4 group size
  int64_t elems;         // per block
  int64_t scale_offset;  // bytes, in the encoded block
};

// ---- int8 ----

template <DType D>
__global__ void QuantInt8Kernel(const QuantArgs a) {
  const int64_t rows_per_block = a.elems / a.head_dim;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= rows_per_block * a.num_blocks) return;
  const int b = static_cast<int>(warp / rows_per_block);
  const int64_t r = warp % rows_per_block;
  const Elem<D>* src = static_cast<const Elem<D>*>(a.in[b]) + r * a.head_dim;
  uint8_t* enc = static_cast<uint8_t*>(a.out[b]);
  float amax = 0.0f;
  for (int d = lane; d < a.head_dim; d += 32) amax = fmaxf(amax, fabsf(cuda::LoadF<D>(src, d)));
  amax = cuda::WarpMax(amax);
  const float scale = amax / 127.0f;
  const float inv = FiniteInverse(scale);
  int8_t* q = reinterpret_cast<int8_t*>(enc) + r * a.head_dim;
  for (int d = lane; d < a.head_dim; d += 32) {
    const float v = fminf(fmaxf(__fmul_rn(cuda::LoadF<D>(src, d), inv), -127.0f), 127.0f);
    q[d] = static_cast<int8_t>(rintf(v));
  }
  if (lane == 0) reinterpret_cast<float*>(enc + a.scale_offset)[r] = scale;
}

// ---- fp8 e4m3, one scale per (layer, kv, head) ----

template <DType D>
__global__ void QuantFp8Kernel(const QuantArgs a) {
  // blockIdx.x = (b * planes + plane) * heads + h
  const int h = blockIdx.x % a.heads;
  const int plane = (blockIdx.x / a.heads) % a.planes;
  const int b = blockIdx.x / (a.heads * a.planes);
  const int64_t plane_elems = static_cast<int64_t>(a.tokens) * a.heads * a.head_dim;
  const Elem<D>* src = static_cast<const Elem<D>*>(a.in[b]) + plane * plane_elems;
  uint8_t* enc = static_cast<uint8_t*>(a.out[b]);
  uint8_t* dst = enc + plane * plane_elems;
  const int per_head = a.tokens * a.head_dim;
  float amax = 0.0f;
  for (int i = threadIdx.x; i < per_head; i += blockDim.x) {
    const int t = i / a.head_dim, d = i % a.head_dim;
    amax = fmaxf(
        amax, fabsf(cuda::LoadF<D>(src, (static_cast<int64_t>(t) * a.heads + h) * a.head_dim + d)));
  }
  __shared__ float warp_max[32];
  amax = cuda::WarpMax(amax);
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
  if (threadIdx.x < 32) {
    float m = threadIdx.x < blockDim.x / 32 ? warp_max[threadIdx.x] : 0.0f;
    m = cuda::WarpMax(m);
    if (threadIdx.x == 0) warp_max[0] = m;
  }
  __syncthreads();
  const float scale = warp_max[0] / kFp8E4M3Max;
  const float inv = FiniteInverse(scale);
  for (int i = threadIdx.x; i < per_head; i += blockDim.x) {
    const int t = i / a.head_dim, d = i % a.head_dim;
    const int64_t off = (static_cast<int64_t>(t) * a.heads + h) * a.head_dim + d;
    dst[off] = cuda::FloatToE4M3(__fmul_rn(cuda::LoadF<D>(src, off), inv));
  }
  if (threadIdx.x == 0) {
    reinterpret_cast<float*>(enc + a.scale_offset)[plane * a.heads + h] = scale;
  }
}

// ---- int4, one thread per group ----

template <DType D>
__global__ void QuantInt4Kernel(const QuantArgs a) {
  const int64_t groups = a.elems / a.group;
  const int64_t gid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (gid >= groups * a.num_blocks) return;
  const int b = static_cast<int>(gid / groups);
  const int64_t g = gid % groups;
  const Elem<D>* src = static_cast<const Elem<D>*>(a.in[b]) + g * a.group;
  uint8_t* enc = static_cast<uint8_t*>(a.out[b]);
  float mn = INFINITY, mx = -INFINITY;
  for (int d = 0; d < a.group; ++d) {
    const float x = cuda::LoadF<D>(src, d);
    mn = fminf(mn, x);
    mx = fmaxf(mx, x);
  }
  // -0 counts as +0, as in the CPU twin's order keys (fminf(+0, -0) may give -0).
  mn = __fadd_rn(mn, 0.0f);
  mx = __fadd_rn(mx, 0.0f);
  const uint16_t s_bits =
      cuda::FloatToHalfBits(fminf(__fdiv_rn(__fsub_rn(mx, mn), 15.0f), kHalfMaxF));
  const uint16_t z_bits = cuda::FloatToHalfBits(fminf(fmaxf(mn, -kHalfMaxF), kHalfMaxF));
  const float s = cuda::HalfBitsToFloat(s_bits);
  const float z = cuda::HalfBitsToFloat(z_bits);
  const float inv = s > 0.0f ? 1.0f / s : 0.0f;
  uint8_t* dst = enc + g * (a.group / 2);
  for (int d = 0; d < a.group; d += 2) {
    const float v0 =
        fminf(fmaxf(__fmul_rn(__fsub_rn(cuda::LoadF<D>(src, d), z), inv), 0.0f), 15.0f);
    const float v1 =
        fminf(fmaxf(__fmul_rn(__fsub_rn(cuda::LoadF<D>(src, d + 1), z), inv), 0.0f), 15.0f);
    dst[d / 2] =
        static_cast<uint8_t>(static_cast<int>(rintf(v0)) | (static_cast<int>(rintf(v1)) << 4));
  }
  uint16_t* params = reinterpret_cast<uint16_t*>(enc + a.scale_offset);
  params[2 * g] = s_bits;
  params[2 * g + 1] = z_bits;
}

// The bytes between the data and the scale sections of each block: zero, as the CPU twin
// writes them. One CTA per block.
__global__ void ZeroPaddingKernel(const QuantArgs a, int64_t from, int bytes) {
  uint8_t* enc = static_cast<uint8_t*>(a.out[blockIdx.x]);
  for (int i = threadIdx.x; i < bytes; i += blockDim.x) enc[from + i] = 0;
}

// ---- dequantize: one thread per element pair ----

template <DType D, Encoding E>
__global__ void DequantKernel(const QuantArgs a) {
  const int64_t pairs = a.elems / 2;  // elems is even: 2 * layers * ...
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (tid >= pairs * a.num_blocks) return;
  const int b = static_cast<int>(tid / pairs);
  const int64_t e = (tid % pairs) * 2;
  const uint8_t* enc = static_cast<const uint8_t*>(a.in[b]);
  Elem<D>* out = static_cast<Elem<D>*>(a.out[b]);
  float x0, x1;
  if constexpr (E == Encoding::kInt8) {
    const float* scales = reinterpret_cast<const float*>(enc + a.scale_offset);
    const int8_t* q = reinterpret_cast<const int8_t*>(enc);
    x0 = __fmul_rn(static_cast<float>(q[e]), scales[e / a.head_dim]);
    x1 = __fmul_rn(static_cast<float>(q[e + 1]), scales[(e + 1) / a.head_dim]);
  } else if constexpr (E == Encoding::kFp8E4M3) {
    const float* scales = reinterpret_cast<const float*>(enc + a.scale_offset);
    const int64_t plane_elems = static_cast<int64_t>(a.tokens) * a.heads * a.head_dim;
    const int64_t s0 = (e / plane_elems) * a.heads + (e / a.head_dim) % a.heads;
    const int64_t s1 = ((e + 1) / plane_elems) * a.heads + ((e + 1) / a.head_dim) % a.heads;
    x0 = __fmul_rn(cuda::E4M3ToFloat(enc[e]), scales[s0]);
    x1 = __fmul_rn(cuda::E4M3ToFloat(enc[e + 1]), scales[s1]);
  } else {
    const uint16_t* params = reinterpret_cast<const uint16_t*>(enc + a.scale_offset);
    const int64_t g = e / a.group;  // e even and group even: both elements share the group
    const float s = cuda::HalfBitsToFloat(params[2 * g]);
    const float z = cuda::HalfBitsToFloat(params[2 * g + 1]);
    const uint8_t byte = enc[e / 2];
    x0 = __fadd_rn(__fmul_rn(static_cast<float>(byte & 0xf), s), z);
    x1 = __fadd_rn(__fmul_rn(static_cast<float>(byte >> 4), s), z);
  }
  if constexpr (D == DType::kFloat32) {
    if ((reinterpret_cast<uintptr_t>(out) & 7) == 0) {
      reinterpret_cast<float2*>(out)[e / 2] = make_float2(x0, x1);
    } else {
      out[e] = x0;
      out[e + 1] = x1;
    }
  } else {
    const uint32_t packed = static_cast<uint32_t>(cuda::StoreF<D>(x0)) |
                            (static_cast<uint32_t>(cuda::StoreF<D>(x1)) << 16);
    if ((reinterpret_cast<uintptr_t>(out) & 3) == 0) {
      reinterpret_cast<uint32_t*>(out)[e / 2] = packed;
    } else {
      out[e] = static_cast<uint16_t>(packed);
      out[e + 1] = static_cast<uint16_t>(packed >> 16);
    }
  }
}

// Threads a launch over `units` work items needs, as a grid of kThreads-thread CTAs; 0 when more
// than one grid can hold.
constexpr int kThreads = 256;
unsigned GridFor(int64_t units) {
  const int64_t grid = (units + kThreads - 1) / kThreads;
  return grid > 0x7fffffff ? 0 : static_cast<unsigned>(grid);
}

template <DType D>
Status LaunchQuant(const BlockLayout& l, const QuantArgs& a, cudaStream_t stream) {
  const int64_t units = l.encoding == Encoding::kInt8 ? a.elems / a.head_dim * a.num_blocks * 32
                        : l.encoding == Encoding::kFp8E4M3
                            ? int64_t{a.num_blocks} * a.planes * a.heads * kThreads
                            : a.elems / a.group * a.num_blocks;
  if (GridFor(units) == 0)
    return Status::InvalidArgument("quantize batch too large for one launch");
  KVPOOL_CUDA_CLEAR_STALE_ERROR();
  switch (l.encoding) {
    case Encoding::kInt8: {
      QuantInt8Kernel<D><<<GridFor(units), kThreads, 0, stream>>>(a);
      break;
    }
    case Encoding::kFp8E4M3:
      QuantFp8Kernel<D><<<a.num_blocks * a.planes * a.heads, kThreads, 0, stream>>>(a);
      break;
    case Encoding::kInt4G32:
    case Encoding::kInt4G64: {
      QuantInt4Kernel<D><<<GridFor(units), kThreads, 0, stream>>>(a);
      break;
    }
    default:
      return Status::InvalidArgument("quantize needs a non-raw encoding");
  }
  KVPOOL_CUDA_CHECK_LAUNCH();
  const int64_t data_bytes = static_cast<int64_t>(EncodedDataBytes(l));
  if (a.scale_offset > data_bytes) {
    ZeroPaddingKernel<<<a.num_blocks, 32, 0, stream>>>(
        a, data_bytes, static_cast<int>(a.scale_offset - data_bytes));
    KVPOOL_CUDA_CHECK_LAUNCH();
  }
  return Status::OK();
}

template <DType D>
Status LaunchDequant(const BlockLayout& l, const QuantArgs& a, cudaStream_t stream) {
  const unsigned grid = GridFor(a.elems / 2 * a.num_blocks);
  if (grid == 0) return Status::InvalidArgument("dequantize batch too large for one launch");
  KVPOOL_CUDA_CLEAR_STALE_ERROR();
  switch (l.encoding) {
    case Encoding::kInt8:
      DequantKernel<D, Encoding::kInt8><<<grid, kThreads, 0, stream>>>(a);
      break;
    case Encoding::kFp8E4M3:
      DequantKernel<D, Encoding::kFp8E4M3><<<grid, kThreads, 0, stream>>>(a);
      break;
    case Encoding::kInt4G32:
    case Encoding::kInt4G64:
      DequantKernel<D, Encoding::kInt4G32><<<grid, kThreads, 0, stream>>>(a);
      break;
    default:
      return Status::InvalidArgument("dequantize needs a non-raw encoding");
  }
  KVPOOL_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

template <bool kQuantize>
Status Run(const BlockLayout& l, const void* const* in, void* const* out, int num_blocks,
           cudaStream_t stream) {
  for (int b0 = 0; b0 < num_blocks; b0 += kBlocksPerLaunch) {
    QuantArgs a{};
    a.num_blocks = std::min(kBlocksPerLaunch, num_blocks - b0);
    for (int i = 0; i < a.num_blocks; ++i) {
      a.in[i] = in[b0 + i];
      a.out[i] = out[b0 + i];
    }
    a.head_dim = l.head_dim;
    a.heads = l.num_kv_heads;
    a.tokens = l.tokens;
    a.planes = l.num_layers * 2;
    a.group = Int4GroupSize(l.encoding);
    a.elems = static_cast<int64_t>(BlockElements(l));
    a.scale_offset = static_cast<int64_t>(EncodedScaleOffset(l));
    Status st;
    switch (l.dtype) {
      case DType::kFloat16:
        st = kQuantize ? LaunchQuant<DType::kFloat16>(l, a, stream)
                       : LaunchDequant<DType::kFloat16>(l, a, stream);
        break;
      case DType::kBFloat16:
        st = kQuantize ? LaunchQuant<DType::kBFloat16>(l, a, stream)
                       : LaunchDequant<DType::kBFloat16>(l, a, stream);
        break;
      case DType::kFloat32:
        st = kQuantize ? LaunchQuant<DType::kFloat32>(l, a, stream)
                       : LaunchDequant<DType::kFloat32>(l, a, stream);
        break;
    }
    KVPOOL_RETURN_IF_ERROR(st);
  }
  return Status::OK();
}

// The kernels load and store whole elements, and the scale section as floats and 16-bit words:
// a misaligned buffer would fault on the GPU and poison the context (the CPU twin copes).
Status CheckAligned(const BlockLayout& l, const void* const* raw, const void* const* encoded,
                    int num_blocks) {
  for (int i = 0; i < num_blocks; ++i) {
    if (reinterpret_cast<uintptr_t>(raw[i]) % DTypeSize(l.dtype) != 0 ||
        reinterpret_cast<uintptr_t>(encoded[i]) % 4 != 0) {
      return Status::InvalidArgument(
          "quantize on the GPU: raw blocks must be aligned to their element size and encoded "
          "blocks to 4 bytes (block " +
          std::to_string(i) + " is not)");
    }
  }
  return Status::OK();
}

}  // namespace

Status QuantizeBlocksCuda(const BlockLayout& layout, const void* const* raw, void* const* encoded,
                          int num_blocks, void* stream) {
  KVPOOL_RETURN_IF_ERROR(ValidateQuantize(layout, raw, encoded, num_blocks));
  KVPOOL_RETURN_IF_ERROR(CheckAligned(layout, raw, encoded, num_blocks));
  if (num_blocks == 0) return Status::OK();
  const ScopedDevice on(DeviceOfPointer(raw[0]));
  return Run<true>(layout, raw, encoded, num_blocks, static_cast<cudaStream_t>(stream));
}

Status DequantizeBlocksCuda(const BlockLayout& layout, const void* const* encoded, void* const* raw,
                            int num_blocks, void* stream) {
  KVPOOL_RETURN_IF_ERROR(ValidateQuantize(layout, encoded, raw, num_blocks));
  KVPOOL_RETURN_IF_ERROR(CheckAligned(layout, raw, encoded, num_blocks));
  if (num_blocks == 0) return Status::OK();
  const ScopedDevice on(DeviceOfPointer(encoded[0]));
  return Run<false>(layout, encoded, raw, num_blocks, static_cast<cudaStream_t>(stream));
}

}  // namespace kernels
}  // namespace kvpool
