#pragma once
// Quantize / dequantize kvpool blocks: raw fp16/bf16/fp32 payloads <-> int8, fp8 e4m3 or int4.
//
// The byte layout of each encoding is defined in block_layout.h; EncodedBytes() sizes a block.
// Arithmetic (both CPU twin and CUDA, in f32, no fused multiply-add):
//   int8:  scale = amax / 127 per (layer, kv, token, head); q = clamp(rne(x * (1 / scale)), +-127)
//   fp8:   scale = amax / 448 per (layer, kv, head);        q = e4m3_satfinite(x * (1 / scale))
//   int4:  per group of G: s = f16((max - min) / 15), z = f16(min), both clamped to +-65504;
//          q = clamp(rne((x - z) * (1 / s)), 0, 15)
// A zero scale encodes zeros. Dequantization multiplies back (int4: q * s + z) and rounds to the
// output dtype to nearest even. CPU and GPU compute the same f32 operations in the same order, so
// their codes, scales and outputs are expected to be bit identical (the device check allows a
// 1e-6 relative difference so a libm/intrinsic corner does not fail a correct kernel).
// fp32 input is encoded the same way (same scales and codes, same byte layout): only the load of
// x differs. Inputs with NaN or infinity give unspecified codes (never a crash).
//
// Thread safety: no shared state; concurrent calls on disjoint outputs are safe.
// C++17-clean (included by .cu files).

#include "common/status.h"
#include "kernels/block_layout.h"

namespace kvpool {
namespace kernels {

// InvalidArgument for a bad layout, a raw encoding, or null pointers.
Status ValidateQuantize(const BlockLayout& layout, const void* const* in, void* const* out,
                        int num_blocks);

// raw[i] (RawBytes(layout)) -> encoded[i] (EncodedBytes(layout)) for i < num_blocks, in
// layout.encoding. Both are host arrays of pointers (to device memory for CUDA).
Status QuantizeBlocksCpu(const BlockLayout& layout, const void* const* raw, void* const* encoded,
                         int num_blocks);
Status QuantizeBlocksCuda(const BlockLayout& layout, const void* const* raw, void* const* encoded,
                          int num_blocks, void* stream);

// encoded[i] -> raw[i] in layout.dtype.
Status DequantizeBlocksCpu(const BlockLayout& layout, const void* const* encoded, void* const* raw,
                           int num_blocks);
Status DequantizeBlocksCuda(const BlockLayout& layout, const void* const* encoded, void* const* raw,
                            int num_blocks, void* stream);

// Dispatch on ctx.device.
Status QuantizeBlocks(const ExecContext& ctx, const BlockLayout& layout, const void* const* raw,
                      void* const* encoded, int num_blocks);
Status DequantizeBlocks(const ExecContext& ctx, const BlockLayout& layout,
                        const void* const* encoded, void* const* raw, int num_blocks);

}  // namespace kernels
}  // namespace kvpool
