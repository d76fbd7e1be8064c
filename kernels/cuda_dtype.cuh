#pragma once
// Device-side element loads and stores for the CUDA kernels: the GPU counterparts of
// kernels/dtype.h, rounding to nearest even like the CPU twins.
//
// Thread safety: device functions without state.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/dtype.h"

namespace kvpool {
namespace kernels {
namespace cuda {

template <DType D>
__device__ __forceinline__ float LoadF(const Elem<D>* p, size_t i) {
  if constexpr (D == DType::kFloat32) {
    return p[i];
  } else if constexpr (D == DType::kFloat16) {
    return __half2float(__ushort_as_half(p[i]));
  } else {
    return __bfloat162float(__ushort_as_bfloat16(p[i]));
  }
}

template <DType D>
__device__ __forceinline__ Elem<D> StoreF(float f) {
  if constexpr (D == DType::kFloat32) {
    return f;
  } else if constexpr (D == DType::kFloat16) {
    return __half_as_ushort(__float2half_rn(f));
  } else {
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
  }
}

__device__ __forceinline__ uint8_t FloatToE4M3(float f) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3));
}

__device__ __forceinline__ float E4M3ToFloat(uint8_t c) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(c), __NV_E4M3);
  return __half2float(__half(h));
}

__device__ __forceinline__ float HalfBitsToFloat(uint16_t b) {
  return __half2float(__ushort_as_half(b));
}
__device__ __forceinline__ uint16_t FloatToHalfBits(float f) {
  return __half_as_ushort(__float2half_rn(f));
}

// Warp-wide reductions (all 32 lanes take part).
__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

inline unsigned int CeilDiv(size_t a, size_t b) {
  return static_cast<unsigned int>((a + b - 1) / b);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace kvpool
