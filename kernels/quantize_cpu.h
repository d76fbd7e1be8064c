#pragma once
// Internals of the CPU quantize twin, for quantize.cc and its test only (not part of the kernels'
// API): the portable scalar reference, and the x86-64 AVX2 + F16C paths that QuantizeBlocksCpu
// uses for fp8 e4m3 and int4 when the CPU has them.
//
// The scalar reference is the definition: it computes the f32 operations documented in
// quantize.h in the same order as the CUDA kernels. The AVX2 paths compute the same operations on
// 8 lanes and must give the same bytes for every input (NaN and infinity included), which
// kernels_quantize_test checks against the reference.
//
// Thread safety: pure functions; concurrent calls on disjoint outputs are safe.

#include <cstddef>
#include <cstdint>

#include "common/status.h"
#include "kernels/block_layout.h"

namespace kvpool {
namespace kernels {

// QuantizeBlocksCpu / DequantizeBlocksCpu without the AVX2 paths: same arguments and results.
Status QuantizeBlocksCpuScalar(const BlockLayout& layout, const void* const* raw,
                               void* const* encoded, int num_blocks);
Status DequantizeBlocksCpuScalar(const BlockLayout& layout, const void* const* encoded,
                                 void* const* raw, int num_blocks);

namespace avx2 {

// True when this CPU runs the functions below (AVX2 and F16C); checked once. Always false off
// x86-64 GCC/Clang builds, where the functions below must not be called.
bool Supported();

// One (layer, kv) plane of fp8 e4m3: src and dst hold tokens * heads * dim elements, scales
// receives the plane's `heads` scales. Same results as the scalar twin.
void QuantizeFp8Plane(DType dtype, const uint16_t* src, uint8_t* dst, float* scales, int tokens,
                      int heads, int dim);

// `groups` consecutive int4 groups of `group` (32 or 64) elements: codes into out (group / 2
// bytes each), {scale, zero} f16 bits into params (2 per group).
void QuantizeInt4Groups(DType dtype, int group, const uint16_t* in, uint8_t* out, uint16_t* params,
                        size_t groups);

// Element-wise conversions as dtype.h's FloatToFp8E4M3 / FloatToHalf; exposed for the tests.
void FloatToFp8E4M3Array(const float* in, uint8_t* out, size_t n);
void FloatToHalfArray(const float* in, uint16_t* out, size_t n);

}  // namespace avx2
}  // namespace kernels
}  // namespace kvpool
