#pragma once
// BlockLayout: what the bytes of one kvpool block payload mean, and how big they are.
//
// A block holds the K and V of `tokens` consecutive tokens for every layer of one model shard.
// Its raw (decoded) payload is one contiguous array of `dtype` floats (fp16, bf16 or fp32):
//
//   raw:  [layer][kv][token][kv_head][head_dim]        kv = 0 for K, 1 for V
//
// An encoded block is the data section followed, at a 16-byte aligned offset, by its scales (the
// bytes between are zero):
//
//   int8      data int8  [layer][kv][token][kv_head][head_dim]
//             scales f32 [layer][kv][token][kv_head]                 one per token and head
//   fp8_e4m3  data e4m3  [layer][kv][token][kv_head][head_dim]
//             scales f32 [layer][kv][kv_head]                        one per head over the block
//   int4_g32, data u8    [layer][kv][token][kv_head][head_dim / 2]   element 2i in the low nibble,
//   int4_g64                                                          2i+1 in the high nibble
//             params f16 [layer][kv][token][kv_head][head_dim / G][2] {scale, zero} per group of
//                                                                     G = 32 or 64 elements
//
// Decoding: int8 x = q * scale; fp8 x = float(q) * scale; int4 x = q * scale + zero (q in 0..15).
// The encoding is part of the layout and so of the block key: two encodings never share a block.
// All multi-byte values are little endian (the only byte order kvpool runs on).
//
// Thread safety: plain values and pure functions. C++17-clean (included by .cu files).

#include <cstddef>
#include <cstdint>

#include "common/status.h"
#include "kernels/dtype.h"

namespace kvpool {
namespace kernels {

// Stable values: part of the layout fingerprint and of the C API.
enum class Encoding : uint8_t {
  kRaw = 0,
  kInt8 = 1,     // symmetric, one f32 scale per (layer, kv, token, head)
  kFp8E4M3 = 2,  // one f32 scale per (layer, kv, head) over the block's tokens
  kInt4G32 = 3,  // asymmetric, f16 scale and zero per 32 consecutive head_dim elements
  kInt4G64 = 4,  // same with groups of 64
};

const char* EncodingName(Encoding encoding);

struct BlockLayout {
  int num_layers = 0;    // layers of this model shard. Default: 0 (must be set)
  int num_kv_heads = 0;  // K/V heads of this shard. Default: 0 (must be set)
  int head_dim = 0;      // elements per head; even, and a multiple of G for int4. Default: 0
  int tokens = 0;        // tokens per block. Default: 0 (must be set)
  DType dtype = DType::kFloat16;       // element type of the raw payload. Default: fp16
  Encoding encoding = Encoding::kRaw;  // how the block's bytes are encoded. Default: raw
};

// Limits that keep every size below 2^62 and every per-dimension index in int32.
constexpr int kMaxLayers = 1024;
constexpr int kMaxKvHeads = 1024;
constexpr int kMaxHeadDim = 1024;
constexpr int kMaxTokensPerBlock = 1 << 20;

// InvalidArgument when a dimension is out of range or head_dim does not fit the encoding.
Status ValidateBlockLayout(const BlockLayout& layout);

// Elements in one (layer, kv) plane: tokens * kv_heads * head_dim.
inline size_t PlaneElements(const BlockLayout& l) {
  return static_cast<size_t>(l.tokens) * l.num_kv_heads * l.head_dim;
}
// Elements of a whole block: layers * 2 * plane.
inline size_t BlockElements(const BlockLayout& l) {
  return static_cast<size_t>(l.num_layers) * 2 * PlaneElements(l);
}
// Bytes of the raw (decoded) payload.
inline size_t RawBytes(const BlockLayout& l) { return BlockElements(l) * DTypeSize(l.dtype); }

// Group size of an int4 encoding (32 or 64), 0 for the others.
inline int Int4GroupSize(Encoding e) {
  return e == Encoding::kInt4G32 ? 32 : (e == Encoding::kInt4G64 ? 64 : 0);
}

inline size_t AlignUp16(size_t n) { return (n + 15) & ~static_cast<size_t>(15); }

// Bytes of the data section of an encoded block (raw: the whole payload).
size_t EncodedDataBytes(const BlockLayout& layout);
// Bytes of the scale section (0 for raw).
size_t EncodedScaleBytes(const BlockLayout& layout);
// Offset of the scale section: AlignUp16(EncodedDataBytes).
inline size_t EncodedScaleOffset(const BlockLayout& l) { return AlignUp16(EncodedDataBytes(l)); }
// Total bytes of a block in `layout.encoding`: what the client reserves per block.
inline size_t EncodedBytes(const BlockLayout& l) {
  return EncodedScaleBytes(l) == 0 ? EncodedDataBytes(l)
                                   : EncodedScaleOffset(l) + EncodedScaleBytes(l);
}

// Where a kernel runs. Pointer *arrays* (lists of buffers) are always host arrays; the buffers
// they point to, and every data pointer, live where the kernel runs (device memory for kCuda).
enum class Device : uint8_t { kCpu = 0, kCuda = 1 };

struct ExecContext {
  Device device = Device::kCpu;  // Default: CPU
  void* stream = nullptr;        // cudaStream_t for kCuda; work is enqueued, not waited. Default: 0
};

}  // namespace kernels
}  // namespace kvpool
