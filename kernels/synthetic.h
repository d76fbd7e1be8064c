#pragma once
// Synthetic attention inputs for the compression tests, the needle heatmap and the GPU check.
//
// Per layer and KV head there is a "topic" direction u and a "needle" direction v. Haystack keys
// are N(0, 1) with a graded share of u on a fraction of tokens (relevant tokens); the needle key
// carries a strong v. Prefix queries look for the topic with random strength; the last `window`
// queries (the question) and the probe query (the next decode step) look for the topic and,
// strongly, for the needle: the question attends mostly to the needle token, as in the
// needle-in-a-haystack test. Values are N(0, 1).
//
// Thread safety: pure functions.

#include <cstdint>
#include <vector>

#include "kernels/compress.h"

namespace kvpool {
namespace kernels {
namespace testutil {

struct SyntheticSpec {
  AttentionShape shape;
  int window = 32;                  // question tokens at the end (that look for the needle)
  int needle_pos = -1;              // needle position, -1 for none
  float needle_logit = 10;          // typical logit of a question query on the needle
  float relevant_fraction = 0.05f;  // haystack tokens sharing the topic
  float topic_logit = 4;            // largest logit of a question query on a relevant token
  // When set, relevant tokens thin out with depth (layer l of L gets 2(L-l)/(L+1) times the
  // fraction): the "pyramidal funnelling" of attention that PyramidKV's budgets assume.
  bool funnel = false;
  uint64_t seed = 1;
};

// Buffers are vectors of 16-bit words holding elements of shape.dtype (two words per fp32).
struct SyntheticAttention {
  AttentionShape shape;
  std::vector<uint16_t> q;      // [layer][seq_len][q_head][head_dim]: every position's query
  std::vector<uint16_t> kv;     // [layer][2][seq_len][kv_head][head_dim]
  std::vector<uint16_t> probe;  // [layer][q_head][head_dim]: the next decode step's query
};

SyntheticAttention MakeSynthetic(const SyntheticSpec& spec);

// The last `n` queries of every layer, as ComputeScores wants them: [layer][n][q_head][head_dim].
std::vector<uint16_t> LastQueries(const SyntheticAttention& a, int n);

// Attention output of the probe queries, f32 [layer][q_head][head_dim]. With keep_counts and
// compacted (CompactKv's output) it attends only to the kept tokens; else to all of a.kv.
std::vector<float> ProbeOutput(const SyntheticAttention& a, const std::vector<int>* keep_counts,
                               const std::vector<uint16_t>* compacted);

// Runs the CPU pipeline (scores, selection) and returns the indices; `keep` receives the counts.
Result<std::vector<int32_t>> SelectCpu(const SyntheticAttention& a, const CompressParams& params,
                                       std::vector<int>* keep);

// Fraction of (layer, kv_head) pairs whose kept indices include `pos`.
double RetainedFraction(const AttentionShape& shape, const std::vector<int>& keep,
                        const std::vector<int32_t>& indices, int pos);

}  // namespace testutil
}  // namespace kernels
}  // namespace kvpool
