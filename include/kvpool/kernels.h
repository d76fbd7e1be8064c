#pragma once
// kvpool's KV kernels for inference engines: paged gather/scatter between an engine's paged KV
// cache and kvpool block payloads, block quantization (int8, fp8 e4m3, int4), and KV-cache
// compression selection (StreamingLLM, H2O, SnapKV, PyramidKV) with its compaction gather.
//
// A worker typically: gathers a sequence's pages into raw payloads, optionally quantizes them
// (the encoding is part of the block's layout and key) and puts them; after a get it
// dequantizes and scatters back into its pages. Before caching a long prompt it may compress:
// keep counts -> scores -> select -> compact, then store the compacted K/V.
//
// Every function runs on the CPU (device KVPOOL_DEVICE_CPU, always available) or on a CUDA
// device (KVPOOL_DEVICE_CUDA: all data pointers are device pointers, work is enqueued on
// `stream` and not waited for; returns KVPOOL_KERNEL_UNIMPLEMENTED in builds without CUDA).
// Pointer *arrays* (per-layer tensors, per-block payloads) are always host arrays.
// The exact byte layouts are those of the internal headers kernels/block_layout.h (payloads and
// encodings), kernels/paged_copy.h (engine caches) and kernels/compress.h (q, kv, scores,
// indices, compacted output); docs/KERNELS.md restates them.
//
// C functions return 0 on success or a kvpool::StatusCode value; kvpool_kernel_last_error()
// gives the calling thread's last error message. The C++ wrappers at the bottom return
// kvpool::Status.
//
// Thread safety: no shared state; concurrent calls on disjoint outputs are safe.

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { KVPOOL_DTYPE_FLOAT16 = 0, KVPOOL_DTYPE_BFLOAT16 = 1, KVPOOL_DTYPE_FLOAT32 = 2 };
enum {
  KVPOOL_ENCODING_RAW = 0,
  KVPOOL_ENCODING_INT8 = 1,     /* f32 scale per (layer, kv, token, head) */
  KVPOOL_ENCODING_FP8_E4M3 = 2, /* f32 scale per (layer, kv, head) */
  KVPOOL_ENCODING_INT4_G32 = 3, /* f16 scale + zero per 32 elements */
  KVPOOL_ENCODING_INT4_G64 = 4, /* f16 scale + zero per 64 elements */
};
enum {
  KVPOOL_PAGED_SEPARATE = 0,       /* per layer: K and V [num_blocks, block_size, heads, dim] */
  KVPOOL_PAGED_KV_FIRST = 1,       /* per layer: [2, num_blocks, block_size, heads, dim] */
  KVPOOL_PAGED_KV_INTERLEAVED = 2, /* per layer: [num_blocks, 2, block_size, heads, dim] */
};
enum { KVPOOL_DEVICE_CPU = 0, KVPOOL_DEVICE_CUDA = 1 };
enum {
  KVPOOL_COMPRESS_STREAMINGLLM = 0,
  KVPOOL_COMPRESS_H2O = 1,
  KVPOOL_COMPRESS_SNAPKV = 2,
  KVPOOL_COMPRESS_PYRAMIDKV = 3,
};
enum { KVPOOL_POOLING_AVG = 0, KVPOOL_POOLING_MAX = 1 };
/* Return codes: 0 and the kvpool::StatusCode values used here. */
enum {
  KVPOOL_KERNEL_OK = 0,
  KVPOOL_KERNEL_INVALID_ARGUMENT = 2,
  KVPOOL_KERNEL_RESOURCE_EXHAUSTED = 4,
  KVPOOL_KERNEL_UNAVAILABLE = 6,
  KVPOOL_KERNEL_INTERNAL = 11,
  KVPOOL_KERNEL_UNIMPLEMENTED = 12,
};

/* What a block payload holds: raw layout [layer][k|v][token][kv_head][head_dim]. */
typedef struct kvpool_block_layout {
  int32_t num_layers;
  int32_t num_kv_heads;
  int32_t head_dim;
  int32_t tokens;   /* tokens per block */
  int32_t dtype;    /* KVPOOL_DTYPE_* */
  int32_t encoding; /* KVPOOL_ENCODING_* */
} kvpool_block_layout;

/* An engine's paged KV cache. k_layers / v_layers: host arrays of num_layers tensor base
   pointers; v_layers is unused (may be NULL) for the combined layouts. */
typedef struct kvpool_paged_cache {
  int32_t layout; /* KVPOOL_PAGED_* */
  int32_t dtype;
  int32_t num_layers;
  int32_t num_blocks;
  int32_t block_size;
  int32_t num_kv_heads;
  int32_t head_dim;
  void* const* k_layers;
  void* const* v_layers;
} kvpool_paged_cache;

typedef struct kvpool_exec {
  int32_t device; /* KVPOOL_DEVICE_* */
  void* stream;   /* cudaStream_t for CUDA, NULL = default stream */
} kvpool_exec;

typedef struct kvpool_compress_params {
  int32_t method;              /* KVPOOL_COMPRESS_*. Default: SnapKV */
  int32_t window_size;         /* Default: 32 */
  int32_t max_capacity_prompt; /* tokens kept per layer and head, window included. Default: 2048 */
  int32_t kernel_size;         /* odd. Default: 5 */
  int32_t pooling;             /* KVPOOL_POOLING_*. Default: avg */
  int32_t sink_size;           /* StreamingLLM. Default: 4 */
  int32_t beta;                /* PyramidKV. Default: 20 */
} kvpool_compress_params;

typedef struct kvpool_attention_shape {
  int32_t num_layers;
  int32_t seq_len;
  int32_t num_q_heads;
  int32_t num_kv_heads;
  int32_t head_dim;
  int32_t dtype;
} kvpool_attention_shape;

/* The calling thread's last error message ("" after a success). */
const char* kvpool_kernel_last_error(void);

/* Bytes of a raw payload / of a block in layout->encoding; 0 when the layout is invalid. */
size_t kvpool_kernel_raw_bytes(const kvpool_block_layout* layout);
size_t kvpool_kernel_encoded_bytes(const kvpool_block_layout* layout);

/* Engine pages -> num_payloads raw payloads of layout->tokens tokens each, starting at the
   sequence's token first_token; block_table holds the sequence's engine page ids. */
int kvpool_kernel_gather_paged(const kvpool_exec* exec, const kvpool_paged_cache* cache,
                               const kvpool_block_layout* layout, const int32_t* block_table,
                               int32_t block_table_len, int64_t first_token, int32_t num_payloads,
                               void* const* payloads);
/* Raw payloads -> engine pages. */
int kvpool_kernel_scatter_paged(const kvpool_exec* exec, const kvpool_paged_cache* cache,
                                const kvpool_block_layout* layout, const int32_t* block_table,
                                int32_t block_table_len, int64_t first_token, int32_t num_payloads,
                                const void* const* payloads);

/* raw[i] -> encoded[i] in layout->encoding, and back. */
int kvpool_kernel_quantize(const kvpool_exec* exec, const kvpool_block_layout* layout,
                           const void* const* raw, void* const* encoded, int32_t num_blocks);
int kvpool_kernel_dequantize(const kvpool_exec* exec, const kvpool_block_layout* layout,
                             const void* const* encoded, void* const* raw, int32_t num_blocks);

void kvpool_kernel_compress_params_default(kvpool_compress_params* params);
/* keep_counts (num_layers entries): tokens kept per head in each layer; total_kept: their sum.
   query_tokens: queries compute_scores reads (the prompt's last ones); scored_tokens: prefix
   positions scored per (layer, kv_head). Any output may be NULL. */
int kvpool_kernel_compress_sizes(const kvpool_compress_params* params,
                                 const kvpool_attention_shape* shape, int32_t* keep_counts,
                                 int64_t* total_kept, int32_t* query_tokens,
                                 int32_t* scored_tokens);
/* q [layer][query_tokens][q_head][dim], kv [layer][2][seq][kv_head][dim] -> scores f32
   [layer][kv_head][scored_tokens]. A no-op for StreamingLLM and short prompts. */
int kvpool_kernel_compute_scores(const kvpool_exec* exec, const kvpool_compress_params* params,
                                 const kvpool_attention_shape* shape, const void* q, const void* kv,
                                 float* scores);
/* scores -> indices (num_kv_heads * total_kept int32, per layer [kv_head][keep], ascending). */
int kvpool_kernel_select_tokens(const kvpool_exec* exec, const kvpool_compress_params* params,
                                const kvpool_attention_shape* shape, const float* scores,
                                int32_t* indices);
/* kv -> kv_out, per layer [2][keep][kv_head][head_dim]; keep_counts is a host array. */
int kvpool_kernel_compact_kv(const kvpool_exec* exec, const kvpool_attention_shape* shape,
                             const int32_t* keep_counts, const int32_t* indices, const void* kv,
                             void* kv_out);

#ifdef __cplusplus
}  // extern "C"

#include <kvpool/status.h>

#include <string>
#include <vector>

namespace kvpool {

// Status from a kvpool_kernel_* return code, with the thread's last error message.
inline Status KernelStatus(int code) {
  if (code == KVPOOL_KERNEL_OK) return Status::OK();
  return Status(static_cast<StatusCode>(code), kvpool_kernel_last_error());
}

inline Status GatherPagedKv(const kvpool_exec& exec, const kvpool_paged_cache& cache,
                            const kvpool_block_layout& layout, const int32_t* block_table,
                            int32_t block_table_len, int64_t first_token, int32_t num_payloads,
                            void* const* payloads) {
  return KernelStatus(kvpool_kernel_gather_paged(
      &exec, &cache, &layout, block_table, block_table_len, first_token, num_payloads, payloads));
}
inline Status ScatterPagedKv(const kvpool_exec& exec, const kvpool_paged_cache& cache,
                             const kvpool_block_layout& layout, const int32_t* block_table,
                             int32_t block_table_len, int64_t first_token, int32_t num_payloads,
                             const void* const* payloads) {
  return KernelStatus(kvpool_kernel_scatter_paged(
      &exec, &cache, &layout, block_table, block_table_len, first_token, num_payloads, payloads));
}
inline Status QuantizeKvBlocks(const kvpool_exec& exec, const kvpool_block_layout& layout,
                               const void* const* raw, void* const* encoded, int32_t n) {
  return KernelStatus(kvpool_kernel_quantize(&exec, &layout, raw, encoded, n));
}
inline Status DequantizeKvBlocks(const kvpool_exec& exec, const kvpool_block_layout& layout,
                                 const void* const* encoded, void* const* raw, int32_t n) {
  return KernelStatus(kvpool_kernel_dequantize(&exec, &layout, encoded, raw, n));
}
inline kvpool_compress_params DefaultCompressParams() {
  kvpool_compress_params p;
  kvpool_kernel_compress_params_default(&p);
  return p;
}
// Keep counts per layer (see kvpool_kernel_compress_sizes).
inline Result<std::vector<int32_t>> CompressKeepCounts(const kvpool_compress_params& params,
                                                       const kvpool_attention_shape& shape) {
  std::vector<int32_t> keep(shape.num_layers > 0 ? shape.num_layers : 0);
  const int rc =
      kvpool_kernel_compress_sizes(&params, &shape, keep.data(), nullptr, nullptr, nullptr);
  if (rc != KVPOOL_KERNEL_OK) return KernelStatus(rc);
  return keep;
}
inline Status ComputeCompressionScores(const kvpool_exec& exec,
                                       const kvpool_compress_params& params,
                                       const kvpool_attention_shape& shape, const void* q,
                                       const void* kv, float* scores) {
  return KernelStatus(kvpool_kernel_compute_scores(&exec, &params, &shape, q, kv, scores));
}
inline Status SelectKeptTokens(const kvpool_exec& exec, const kvpool_compress_params& params,
                               const kvpool_attention_shape& shape, const float* scores,
                               int32_t* indices) {
  return KernelStatus(kvpool_kernel_select_tokens(&exec, &params, &shape, scores, indices));
}
inline Status CompactKvTokens(const kvpool_exec& exec, const kvpool_attention_shape& shape,
                              const int32_t* keep_counts, const int32_t* indices, const void* kv,
                              void* kv_out) {
  return KernelStatus(kvpool_kernel_compact_kv(&exec, &shape, keep_counts, indices, kv, kv_out));
}

}  // namespace kvpool
#endif  // __cplusplus
