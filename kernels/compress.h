#pragma once
// KV-cache compression selection (the KVCache-Factory family) and the compaction gather.
//
// Given a prompt's K/V (and, for the attention-based methods, some of its queries), each method
// chooses per layer and per KV head which token positions to keep; CompactKv then gathers the
// kept tokens into a smaller K/V buffer. Methods, with the seed's parameter names:
//   StreamingLLM  the first `sink_size` tokens plus the most recent
//                 `max_capacity_prompt - sink_size` (its window). No scores.
//   H2O           heavy hitters: top `max_capacity_prompt - window_size` prefix tokens by attention
//                 accumulated over *all* queries (causal), plus the last `window_size` tokens.
//   SnapKV        attention of the last `window_size` queries onto the prefix, summed over those
//                 queries, pooled along the sequence (`pooling`, `kernel_size`, zero/-inf padded
//                 as torch's avg_pool1d / max_pool1d with padding kernel_size / 2), top
//                 `max_capacity_prompt - window_size` per head, plus the window.
//   PyramidKV     SnapKV inside each layer with a per-layer budget that falls linearly with depth
//                 (the seed's schedule with `beta`), the budgets summing to about
//                 num_layers * max_capacity_prompt.
// A prompt shorter than max_capacity_prompt is kept whole, as in the seed.
//
// Scores are computed in f32 (the seed casts probabilities to the model dtype; f32 avoids the
// ties that creates). With grouped-query attention a KV head's score is the mean over its query
// heads. Top-k order is (score descending, position ascending): ties go to the lower position, so
// the CPU twin and the CUDA version select identical sets from identical scores. Indices are
// returned ascending (position order).
//
// Buffers (element type `dtype` unless said otherwise):
//   q        [layer][QueryTokens][q_head][head_dim]   the *last* QueryTokens queries of the prompt
//   kv       [layer][2][seq_len][kv_head][head_dim]   K then V (the raw payload layout)
//   scores   f32 [layer][kv_head][ScoredTokens]
//   indices  i32, layer l at offset kv_heads * (keep[0] + ... + keep[l-1]): [kv_head][keep[l]]
//   kv_out   layer l at element offset 2 * kv_heads * head_dim * (keep[0] + ... + keep[l-1]):
//            [2][keep[l]][kv_head][head_dim]; position j of head h holds token indices[l][h][j]
//
// Thread safety: no shared state; concurrent calls on disjoint outputs are safe.
// C++17-clean (included by .cu files).

#include <cstdint>
#include <cstring>
#include <vector>

#include "common/status.h"
#include "kernels/block_layout.h"

namespace kvpool {
namespace kernels {

// Stable values: part of the C API.
enum class CompressMethod : uint8_t {
  kStreamingLlm = 0,
  kH2O = 1,
  kSnapKv = 2,
  kPyramidKv = 3,
};
enum class Pooling : uint8_t { kAvgPool = 0, kMaxPool = 1 };

const char* CompressMethodName(CompressMethod method);

struct CompressParams {
  CompressMethod method = CompressMethod::kSnapKv;  // Default: SnapKV
  // Observation window (SnapKV, PyramidKV) or recent tokens (H2O) kept whole. Default: 32
  int window_size = 32;
  // Tokens kept per layer and head, window included (PyramidKV: the mean over layers).
  // Must exceed window_size (and sink_size for StreamingLLM). Default: 2048
  int max_capacity_prompt = 2048;
  int kernel_size = 5;                  // pooling width, odd. Default: 5 (the seed's)
  Pooling pooling = Pooling::kAvgPool;  // Default: avgpool (the seed's)
  int sink_size = 4;                    // StreamingLLM's attention sinks. Default: 4
  int beta = 20;  // PyramidKV: the last layer keeps (max_capacity_prompt - window_size) / beta.
                  // Default: 20 (the seed's)
};

struct AttentionShape {
  int num_layers = 0;             // Default: 0 (must be set)
  int seq_len = 0;                // prompt tokens. Default: 0 (must be set)
  int num_q_heads = 0;            // a multiple of num_kv_heads. Default: 0 (must be set)
  int num_kv_heads = 0;           // Default: 0 (must be set)
  int head_dim = 0;               // Default: 0 (must be set)
  DType dtype = DType::kFloat16;  // of q and kv: fp16, bf16 or fp32. Default: fp16
};

// InvalidArgument for out-of-range parameters or shapes.
Status ValidateCompress(const CompressParams& params, const AttentionShape& shape);

// Queries the method reads: window_size (SnapKV, PyramidKV), seq_len (H2O), 0 (StreamingLLM).
int QueryTokens(const CompressParams& params, const AttentionShape& shape);
// Prefix positions that get a score: seq_len - window_size (0 for StreamingLLM or a short prompt).
int ScoredTokens(const CompressParams& params, const AttentionShape& shape);
// True when the method needs ComputeScores (not StreamingLLM, and the prompt is long enough).
bool NeedsScores(const CompressParams& params, const AttentionShape& shape);

// Tokens kept per head in each layer (num_layers entries).
Result<std::vector<int>> KeepCounts(const CompressParams& params, const AttentionShape& shape);
// Sum of keep counts: indices has num_kv_heads * TotalKept entries.
int64_t TotalKept(const std::vector<int>& keep_counts);

// Scores of the prefix positions (see the buffer table). Unused by StreamingLLM.
Status ComputeScoresCpu(const CompressParams& params, const AttentionShape& shape, const void* q,
                        const void* kv, float* scores);
Status ComputeScoresCuda(const CompressParams& params, const AttentionShape& shape, const void* q,
                         const void* kv, float* scores, void* stream);

// Kept positions per layer and head. `scores` may be null when !NeedsScores.
Status SelectTokensCpu(const CompressParams& params, const AttentionShape& shape,
                       const float* scores, int32_t* indices);
Status SelectTokensCuda(const CompressParams& params, const AttentionShape& shape,
                        const float* scores, int32_t* indices, void* stream);

// Gathers the kept tokens. `keep_counts` is a host array of num_layers counts (as KeepCounts
// returns); the CPU twin checks every index lies in [0, seq_len) (InvalidArgument otherwise and
// nothing written), the CUDA version leaves an out-of-range index's row unwritten.
Status CompactKvCpu(const AttentionShape& shape, const int* keep_counts, const int32_t* indices,
                    const void* kv, void* kv_out);
Status CompactKvCuda(const AttentionShape& shape, const int* keep_counts, const int32_t* indices,
                     const void* kv, void* kv_out, void* stream);

// Dispatch on ctx.device.
Status ComputeScores(const ExecContext& ctx, const CompressParams& params,
                     const AttentionShape& shape, const void* q, const void* kv, float* scores);
Status SelectTokens(const ExecContext& ctx, const CompressParams& params,
                    const AttentionShape& shape, const float* scores, int32_t* indices);
Status CompactKv(const ExecContext& ctx, const AttentionShape& shape, const int* keep_counts,
                 const int32_t* indices, const void* kv, void* kv_out);

// Total order used for top-k on both CPU and GPU: larger key = larger score; NaN ranks lowest.
inline uint32_t ScoreOrderKey(float score) {
  uint32_t u;
  std::memcpy(&u, &score, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0;  // NaN
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

}  // namespace kernels
}  // namespace kvpool
