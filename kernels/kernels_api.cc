// The engine-facing C API of include/kvpool/kernels.h over the kernels/ functions.

#include <kvpool/kernels.h>

#include <string>
#include <vector>

#include "kernels/block_layout.h"
#include "kernels/compress.h"
#include "kernels/paged_copy.h"
#include "kernels/quantize.h"

namespace kvpool {
namespace kernels {
namespace {

thread_local std::string g_last_error;

int Report(const Status& st) {
  if (st.ok()) {
    g_last_error.clear();
    return KVPOOL_KERNEL_OK;
  }
  g_last_error = st.ToString();
  return static_cast<int>(st.code());
}

int NullArg(const char* what) {
  return Report(Status::InvalidArgument(std::string(what) + " is null"));
}

// Enum values are checked later by the Validate* functions; these casts keep them as given.
BlockLayout ToLayout(const kvpool_block_layout& l) {
  BlockLayout o;
  o.num_layers = l.num_layers;
  o.num_kv_heads = l.num_kv_heads;
  o.head_dim = l.head_dim;
  o.tokens = l.tokens;
  o.dtype = static_cast<DType>(l.dtype);
  o.encoding = static_cast<Encoding>(l.encoding);
  return o;
}

PagedKvCache ToCache(const kvpool_paged_cache& c) {
  PagedKvCache o;
  o.layout = static_cast<PagedLayout>(c.layout);
  o.dtype = static_cast<DType>(c.dtype);
  o.num_layers = c.num_layers;
  o.num_blocks = c.num_blocks;
  o.block_size = c.block_size;
  o.num_kv_heads = c.num_kv_heads;
  o.head_dim = c.head_dim;
  o.k_layers = c.k_layers;
  o.v_layers = c.v_layers;
  return o;
}

CompressParams ToParams(const kvpool_compress_params& p) {
  CompressParams o;
  o.method = static_cast<CompressMethod>(p.method);
  o.window_size = p.window_size;
  o.max_capacity_prompt = p.max_capacity_prompt;
  o.kernel_size = p.kernel_size;
  o.pooling = static_cast<Pooling>(p.pooling);
  o.sink_size = p.sink_size;
  o.beta = p.beta;
  return o;
}

AttentionShape ToShape(const kvpool_attention_shape& s) {
  AttentionShape o;
  o.num_layers = s.num_layers;
  o.seq_len = s.seq_len;
  o.num_q_heads = s.num_q_heads;
  o.num_kv_heads = s.num_kv_heads;
  o.head_dim = s.head_dim;
  o.dtype = static_cast<DType>(s.dtype);
  return o;
}

Result<ExecContext> ToExec(const kvpool_exec* e) {
  ExecContext o;
  if (e == nullptr) return o;  // CPU
  if (e->device != KVPOOL_DEVICE_CPU && e->device != KVPOOL_DEVICE_CUDA) {
    return Status::InvalidArgument("unknown device " + std::to_string(e->device));
  }
  o.device = static_cast<Device>(e->device);
  o.stream = e->stream;
  return o;
}

}  // namespace
}  // namespace kernels
}  // namespace kvpool

using namespace kvpool::kernels;  // NOLINT: this file only adapts the C API

extern "C" {

const char* kvpool_kernel_last_error(void) { return g_last_error.c_str(); }

size_t kvpool_kernel_raw_bytes(const kvpool_block_layout* layout) {
  if (layout == nullptr) return 0;
  const BlockLayout l = ToLayout(*layout);
  return ValidateBlockLayout(l).ok() ? RawBytes(l) : 0;
}

size_t kvpool_kernel_encoded_bytes(const kvpool_block_layout* layout) {
  if (layout == nullptr) return 0;
  const BlockLayout l = ToLayout(*layout);
  return ValidateBlockLayout(l).ok() ? EncodedBytes(l) : 0;
}

int kvpool_kernel_gather_paged(const kvpool_exec* exec, const kvpool_paged_cache* cache,
                               const kvpool_block_layout* layout, const int32_t* block_table,
                               int32_t block_table_len, int64_t first_token, int32_t num_payloads,
                               void* const* payloads) {
  if (cache == nullptr || layout == nullptr) return NullArg("cache or layout");
  auto ctx = ToExec(exec);
  if (!ctx.ok()) return Report(ctx.status());
  const PagedSpan span{block_table, block_table_len, first_token, num_payloads};
  return Report(GatherPaged(*ctx, ToCache(*cache), ToLayout(*layout), span, payloads));
}

int kvpool_kernel_scatter_paged(const kvpool_exec* exec, const kvpool_paged_cache* cache,
                                const kvpool_block_layout* layout, const int32_t* block_table,
                                int32_t block_table_len, int64_t first_token, int32_t num_payloads,
                                const void* const* payloads) {
  if (cache == nullptr || layout == nullptr) return NullArg("cache or layout");
  auto ctx = ToExec(exec);
  if (!ctx.ok()) return Report(ctx.status());
  const PagedSpan span{block_table, block_table_len, first_token, num_payloads};
  return Report(ScatterPaged(*ctx, ToCache(*cache), ToLayout(*layout), span, payloads));
}

int kvpool_kernel_quantize(const kvpool_exec* exec, const kvpool_block_layout* layout,
                           const void* const* raw, void* const* encoded, int32_t num_blocks) {
  if (layout == nullptr) return NullArg("layout");
  auto ctx = ToExec(exec);
  if (!ctx.ok()) return Report(ctx.status());
  return Report(QuantizeBlocks(*ctx, ToLayout(*layout), raw, encoded, num_blocks));
}

int kvpool_kernel_dequantize(const kvpool_exec* exec, const kvpool_block_layout* layout,
                             const void* const* encoded, void* const* raw, int32_t num_blocks) {
  if (layout == nullptr) return NullArg("layout");
  auto ctx = ToExec(exec);
  if (!ctx.ok()) return Report(ctx.status());
  return Report(DequantizeBlocks(*ctx, ToLayout(*layout), encoded, raw, num_blocks));
}

void kvpool_kernel_compress_params_default(kvpool_compress_params* params) {
  if (params == nullptr) return;
  const CompressParams d;
  params->method = static_cast<int32_t>(d.method);
  params->window_size = d.window_size;
  params->max_capacity_prompt = d.max_capacity_prompt;
  params->kernel_size = d.kernel_size;
  params->pooling = static_cast<int32_t>(d.pooling);
  params->sink_size = d.sink_size;
  params->beta = d.beta;
}

int kvpool_kernel_compress_sizes(const kvpool_compress_params* params,
                                 const kvpool_attention_shape* shape, int32_t* keep_counts,
                                 int64_t* total_kept, int32_t* query_tokens,
                                 int32_t* scored_tokens) {
  if (params == nullptr || shape == nullptr) return NullArg("params or shape");
  const CompressParams p = ToParams(*params);
  const AttentionShape s = ToShape(*shape);
  auto keep = KeepCounts(p, s);
  if (!keep.ok()) return Report(keep.status());
  if (keep_counts != nullptr) {
    for (size_t i = 0; i < keep->size(); ++i) keep_counts[i] = (*keep)[i];
  }
  if (total_kept != nullptr) *total_kept = TotalKept(*keep);
  if (query_tokens != nullptr) *query_tokens = QueryTokens(p, s);
  if (scored_tokens != nullptr) *scored_tokens = ScoredTokens(p, s);
  return Report(kvpool::Status::OK());
}

int kvpool_kernel_compute_scores(const kvpool_exec* exec, const kvpool_compress_params* params,
                                 const kvpool_attention_shape* shape, const void* q, const void* kv,
                                 float* scores) {
  if (params == nullptr || shape == nullptr) return NullArg("params or shape");
  auto ctx = ToExec(exec);
  if (!ctx.ok()) return Report(ctx.status());
  return Report(ComputeScores(*ctx, ToParams(*params), ToShape(*shape), q, kv, scores));
}

int kvpool_kernel_select_tokens(const kvpool_exec* exec, const kvpool_compress_params* params,
                                const kvpool_attention_shape* shape, const float* scores,
                                int32_t* indices) {
  if (params == nullptr || shape == nullptr) return NullArg("params or shape");
  auto ctx = ToExec(exec);
  if (!ctx.ok()) return Report(ctx.status());
  return Report(SelectTokens(*ctx, ToParams(*params), ToShape(*shape), scores, indices));
}

int kvpool_kernel_compact_kv(const kvpool_exec* exec, const kvpool_attention_shape* shape,
                             const int32_t* keep_counts, const int32_t* indices, const void* kv,
                             void* kv_out) {
  if (shape == nullptr) return NullArg("shape");
  auto ctx = ToExec(exec);
  if (!ctx.ok()) return Report(ctx.status());
  static_assert(sizeof(int) == sizeof(int32_t), "keep counts are int32");
  return Report(CompactKv(*ctx, ToShape(*shape), reinterpret_cast<const int*>(keep_counts), indices,
                          kv, kv_out));
}

}  // extern "C"
