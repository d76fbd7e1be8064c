#pragma once
// Paged gather/scatter between an engine's paged KV cache and kvpool block payloads.
//
// The engine keeps, per layer, K and V pages of `block_size` tokens addressed through a block
// table (vLLM's PagedAttention layout). These functions copy the tokens of one sequence, for all
// layers in one call (one launch per 128 payloads on the GPU), into or out of raw kvpool payloads
// (`[layer][kv][token][kv_head][head_dim]`, see block_layout.h). Payload i holds the sequence's
// tokens [first_token + i * T, first_token + (i + 1) * T), T = payload_layout.tokens; T need not
// equal the engine's block_size and first_token need not be page aligned.
//
// Copies are exact (bytes). Each function comes as a CPU twin and a CUDA version with the same
// arguments; the CUDA one enqueues on `stream` and returns without waiting. Without CUDA built,
// the Cuda functions return Unimplemented.
//
// Thread safety: no shared state; concurrent calls on disjoint outputs are safe.
// C++17-clean (included by .cu files).

#include <cstdint>

#include "common/status.h"
#include "kernels/block_layout.h"

namespace kvpool {
namespace kernels {

// Shape of an engine layer's KV memory.
enum class PagedLayout : uint8_t {
  // Two tensors per layer, K and V, each [num_blocks, block_size, kv_heads, head_dim]
  // (vLLM's per-layer key_cache / value_cache).
  kSeparate = 0,
  // One tensor per layer [2, num_blocks, block_size, kv_heads, head_dim] (vLLM v1 FlashAttention).
  kKvFirst = 1,
  // One tensor per layer [num_blocks, 2, block_size, kv_heads, head_dim] (FlashInfer "NHD").
  kKvInterleaved = 2,
};

struct PagedKvCache {
  PagedLayout layout = PagedLayout::kSeparate;  // Default: separate K and V tensors
  DType dtype = DType::kFloat16;                // Default: fp16
  int num_layers = 0;                           // Default: 0 (must be set)
  int num_blocks = 0;                           // pages per layer tensor. Default: 0 (must be set)
  int block_size = 0;                           // tokens per page. Default: 0 (must be set)
  int num_kv_heads = 0;                         // Default: 0 (must be set)
  int head_dim = 0;                             // Default: 0 (must be set)
  // Host arrays of num_layers base pointers (device pointers for CUDA). kSeparate: K tensors in
  // k_layers, V tensors in v_layers. kKvFirst / kKvInterleaved: the one tensor in k_layers;
  // v_layers is unused (may be null).
  void* const* k_layers = nullptr;
  void* const* v_layers = nullptr;
};

// What one gather or scatter moves: `num_payloads` payloads of `payload_layout.tokens` tokens of
// the sequence whose pages are `block_table[0..block_table_len)` (engine page ids in token order;
// device memory for CUDA), starting at the sequence's token `first_token`.
struct PagedSpan {
  // A scatter's table names each page at most once: on a GPU, a page named twice gets the bytes
  // of whichever payload lands last (undefined), where the CPU twin writes them in order.
  const int32_t* block_table = nullptr;
  int block_table_len = 0;
  int64_t first_token = 0;
  int num_payloads = 0;
};

// InvalidArgument when the cache and payload layouts disagree (layers, heads, head_dim, dtype,
// encoding not raw), a pointer is null, or the span runs past the block table. The CPU twin also
// checks every page id lies in [0, num_blocks); the CUDA version cannot without a sync and skips
// (leaves unwritten) the tokens of an out-of-range page.
Status ValidatePagedCopy(const PagedKvCache& cache, const BlockLayout& payload_layout,
                         const PagedSpan& span);

// Engine pages -> payloads. `payloads` is a host array of num_payloads pointers, each to
// RawBytes(payload_layout) bytes.
Status GatherPagedCpu(const PagedKvCache& cache, const BlockLayout& payload_layout,
                      const PagedSpan& span, void* const* payloads);
Status GatherPagedCuda(const PagedKvCache& cache, const BlockLayout& payload_layout,
                       const PagedSpan& span, void* const* payloads, void* stream);

// Payloads -> engine pages (the inverse of GatherPaged).
Status ScatterPagedCpu(const PagedKvCache& cache, const BlockLayout& payload_layout,
                       const PagedSpan& span, const void* const* payloads);
Status ScatterPagedCuda(const PagedKvCache& cache, const BlockLayout& payload_layout,
                        const PagedSpan& span, const void* const* payloads, void* stream);

// Dispatch on ctx.device.
Status GatherPaged(const ExecContext& ctx, const PagedKvCache& cache,
                   const BlockLayout& payload_layout, const PagedSpan& span, void* const* payloads);
Status ScatterPaged(const ExecContext& ctx, const PagedKvCache& cache,
                    const BlockLayout& payload_layout, const PagedSpan& span,
                    const void* const* payloads);

}  // namespace kernels
}  // namespace kvpool
