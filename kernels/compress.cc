// CPU twin (the source of truth) of compression selection and compaction, plus validation,
// budgets and device dispatch.
//
// Budget: ComputeScores is compute bound (2 * layers * q_heads * queries * keys * head_dim flops:
// SnapKV's window keeps it linear in seq_len, H2O is quadratic); SelectTokens is O(n) per head
// (nth_element); CompactKv is a row gather at memcpy speed.

#include "kernels/compress.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

namespace kvpool {
namespace kernels {
namespace {

bool UsesWindow(CompressMethod m) { return m != CompressMethod::kStreamingLlm; }

template <DType D>
inline float Load(const Elem<D>* p, size_t i) {
  if constexpr (D == DType::kFloat32) {
    return p[i];
  } else {
    return D == DType::kFloat16 ? HalfToFloat(p[i]) : Bf16ToFloat(p[i]);
  }
}

template <DType D>
void ScoresForLayer(const CompressParams& params, const AttentionShape& s, const Elem<D>* q,
                    const Elem<D>* kv, float* scores, std::vector<float>& kf,
                    std::vector<float>& raw, std::vector<float>& logits) {
  const int n = s.seq_len, dim = s.head_dim, hk = s.num_kv_heads, hq = s.num_q_heads;
  const int group = hq / hk;
  const int nq = QueryTokens(params, s);
  const int scored = ScoredTokens(params, s);
  const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(dim));
  // K of this layer as f32, [token][kv_head][dim].
  kf.resize(static_cast<size_t>(n) * hk * dim);
  for (size_t i = 0; i < kf.size(); ++i) kf[i] = Load<D>(kv, i);
  raw.assign(static_cast<size_t>(hk) * scored, 0.0f);
  logits.resize(n);
  std::vector<float> qv(dim);
  for (int h = 0; h < hq; ++h) {
    const int kvh = h / group;
    float* acc = raw.data() + static_cast<size_t>(kvh) * scored;
    for (int i = 0; i < nq; ++i) {
      const int t = n - nq + i;  // the query's position: it sees keys 0..t
      for (int d = 0; d < dim; ++d) qv[d] = Load<D>(q, (static_cast<size_t>(i) * hq + h) * dim + d);
      float m = -INFINITY;
      for (int j = 0; j <= t; ++j) {
        const float* k = kf.data() + (static_cast<size_t>(j) * hk + kvh) * dim;
        float dot = 0.0f;
        for (int d = 0; d < dim; ++d) dot += qv[d] * k[d];
        logits[j] = dot * inv_sqrt_d;
        m = std::max(m, logits[j]);
      }
      float sum = 0.0f;
      for (int j = 0; j <= t; ++j) {
        logits[j] = std::exp(logits[j] - m);
        sum += logits[j];
      }
      const float inv_sum = 1.0f / sum;
      const int upto = std::min(t + 1, scored);
      for (int j = 0; j < upto; ++j) acc[j] += logits[j] * inv_sum;
    }
  }
  const float inv_group = 1.0f / static_cast<float>(group);
  const bool pool =
      params.method == CompressMethod::kSnapKv || params.method == CompressMethod::kPyramidKv;
  const int half = params.kernel_size / 2;
  for (int h = 0; h < hk; ++h) {
    const float* r = raw.data() + static_cast<size_t>(h) * scored;
    float* out = scores + static_cast<size_t>(h) * scored;
    for (int j = 0; j < scored; ++j) {
      if (!pool || params.kernel_size == 1) {
        out[j] = r[j] * inv_group;
        continue;
      }
      const int lo = std::max(0, j - half), hi = std::min(scored - 1, j + half);
      if (params.pooling == Pooling::kAvgPool) {
        float sum = 0.0f;
        for (int x = lo; x <= hi; ++x) sum += r[x];
        // avg_pool1d counts the zero padding: divide by kernel_size everywhere.
        out[j] = sum * inv_group / static_cast<float>(params.kernel_size);
      } else {
        float mx = -INFINITY;
        for (int x = lo; x <= hi; ++x) mx = std::max(mx, r[x]);
        out[j] = mx * inv_group;
      }
    }
  }
}

}  // namespace

const char* CompressMethodName(CompressMethod method) {
  switch (method) {
    case CompressMethod::kStreamingLlm:
      return "streamingllm";
    case CompressMethod::kH2O:
      return "h2o";
    case CompressMethod::kSnapKv:
      return "snapkv";
    case CompressMethod::kPyramidKv:
      return "pyramidkv";
  }
  return "unknown";
}

Status ValidateCompress(const CompressParams& p, const AttentionShape& s) {
  if (s.num_layers < 1 || s.num_layers > kMaxLayers || s.seq_len < 1 || s.seq_len > (1 << 24) ||
      s.num_kv_heads < 1 || s.num_kv_heads > kMaxKvHeads || s.num_q_heads < s.num_kv_heads ||
      s.num_q_heads % s.num_kv_heads != 0 || s.head_dim < 1 || s.head_dim > kMaxHeadDim) {
    return Status::InvalidArgument(
        "attention shape out of range: layers=" + std::to_string(s.num_layers) +
        " seq_len=" + std::to_string(s.seq_len) + " q_heads=" + std::to_string(s.num_q_heads) +
        " kv_heads=" + std::to_string(s.num_kv_heads) + " head_dim=" + std::to_string(s.head_dim));
  }
  if (!IsKnownDType(s.dtype)) {
    return Status::InvalidArgument("unknown dtype");
  }
  switch (p.method) {
    case CompressMethod::kStreamingLlm:
      if (p.sink_size < 0 || p.max_capacity_prompt <= p.sink_size) {
        return Status::InvalidArgument("StreamingLLM needs 0 <= sink_size < max_capacity_prompt");
      }
      break;
    case CompressMethod::kH2O:
    case CompressMethod::kSnapKv:
    case CompressMethod::kPyramidKv:
      if (p.window_size < 1 || p.max_capacity_prompt <= p.window_size) {
        return Status::InvalidArgument("needs 1 <= window_size < max_capacity_prompt (got " +
                                       std::to_string(p.window_size) + ", " +
                                       std::to_string(p.max_capacity_prompt) + ")");
      }
      if (p.kernel_size < 1 || p.kernel_size % 2 == 0 || p.kernel_size > 1023) {
        return Status::InvalidArgument("kernel_size must be odd and in [1, 1023]");
      }
      if (p.pooling != Pooling::kAvgPool && p.pooling != Pooling::kMaxPool) {
        return Status::InvalidArgument("unknown pooling");
      }
      if (p.method == CompressMethod::kPyramidKv && p.beta < 1) {
        return Status::InvalidArgument("beta must be >= 1");
      }
      break;
    default:
      return Status::InvalidArgument("unknown compression method");
  }
  return Status::OK();
}

bool NeedsScores(const CompressParams& p, const AttentionShape& s) {
  return UsesWindow(p.method) && s.seq_len >= p.max_capacity_prompt;
}

int QueryTokens(const CompressParams& p, const AttentionShape& s) {
  if (!NeedsScores(p, s)) return 0;
  return p.method == CompressMethod::kH2O ? s.seq_len : p.window_size;
}

int ScoredTokens(const CompressParams& p, const AttentionShape& s) {
  if (!NeedsScores(p, s)) return 0;
  return s.seq_len - p.window_size;
}

Result<std::vector<int>> KeepCounts(const CompressParams& p, const AttentionShape& s) {
  KVPOOL_RETURN_IF_ERROR(ValidateCompress(p, s));
  std::vector<int> keep(s.num_layers, s.seq_len);
  if (s.seq_len < p.max_capacity_prompt) return keep;
  if (p.method != CompressMethod::kPyramidKv) {
    std::fill(keep.begin(), keep.end(), p.max_capacity_prompt);
    return keep;
  }
  // The seed's pyramid (PyramidKVCluster.update_kv), in prefix tokens.
  const int64_t c = p.max_capacity_prompt - p.window_size;
  const int64_t prefix = s.seq_len - p.window_size;
  int64_t min_num = c / p.beta;
  int64_t max_num = 2 * c - min_num;
  if (max_num >= prefix) {
    max_num = prefix;
    min_num = 2 * c - max_num;
  }
  const int64_t steps = s.num_layers > 1 ? (max_num - min_num) / (s.num_layers - 1) : 0;
  for (int l = 0; l < s.num_layers; ++l) {
    int64_t budget = s.num_layers > 1 ? max_num - l * steps : c;
    budget = std::min(std::max<int64_t>(budget, 0), prefix);
    keep[l] = static_cast<int>(budget + p.window_size);
  }
  return keep;
}

int64_t TotalKept(const std::vector<int>& keep_counts) {
  return std::accumulate(keep_counts.begin(), keep_counts.end(), int64_t{0});
}

Status ComputeScoresCpu(const CompressParams& params, const AttentionShape& s, const void* q,
                        const void* kv, float* scores) {
  KVPOOL_RETURN_IF_ERROR(ValidateCompress(params, s));
  if (!NeedsScores(params, s)) return Status::OK();
  if (q == nullptr || kv == nullptr || scores == nullptr) {
    return Status::InvalidArgument("ComputeScores: null buffer");
  }
  const int nq = QueryTokens(params, s);
  const int scored = ScoredTokens(params, s);
  const size_t q_layer = static_cast<size_t>(nq) * s.num_q_heads * s.head_dim;
  const size_t kv_layer = static_cast<size_t>(2) * s.seq_len * s.num_kv_heads * s.head_dim;
  std::vector<float> kf, raw, logits;
  for (int l = 0; l < s.num_layers; ++l) {
    float* sl = scores + static_cast<size_t>(l) * s.num_kv_heads * scored;
    switch (s.dtype) {
      case DType::kFloat16:
      case DType::kBFloat16: {
        const auto* ql = static_cast<const uint16_t*>(q) + l * q_layer;
        const auto* kl = static_cast<const uint16_t*>(kv) + l * kv_layer;
        if (s.dtype == DType::kFloat16) {
          ScoresForLayer<DType::kFloat16>(params, s, ql, kl, sl, kf, raw, logits);
        } else {
          ScoresForLayer<DType::kBFloat16>(params, s, ql, kl, sl, kf, raw, logits);
        }
        break;
      }
      case DType::kFloat32:
        ScoresForLayer<DType::kFloat32>(params, s, static_cast<const float*>(q) + l * q_layer,
                                        static_cast<const float*>(kv) + l * kv_layer, sl, kf, raw,
                                        logits);
        break;
    }
  }
  return Status::OK();
}

Status SelectTokensCpu(const CompressParams& params, const AttentionShape& s, const float* scores,
                       int32_t* indices) {
  KVPOOL_ASSIGN_OR_RETURN(std::vector<int> keep, KeepCounts(params, s));
  if (indices == nullptr) return Status::InvalidArgument("SelectTokens: null indices");
  const bool scored_method = NeedsScores(params, s);
  if (scored_method && scores == nullptr) {
    return Status::InvalidArgument("SelectTokens: null scores");
  }
  const int n = s.seq_len;
  const int scored = ScoredTokens(params, s);
  std::vector<int32_t> order(scored);
  std::vector<uint32_t> keys(scored);
  int32_t* out = indices;
  for (int l = 0; l < s.num_layers; ++l) {
    const int k = keep[l];
    for (int h = 0; h < s.num_kv_heads; ++h, out += k) {
      if (k >= n) {
        std::iota(out, out + n, 0);
        continue;
      }
      if (params.method == CompressMethod::kStreamingLlm) {
        std::iota(out, out + params.sink_size, 0);
        std::iota(out + params.sink_size, out + k, n - (k - params.sink_size));
        continue;
      }
      const float* sc = scores + (static_cast<size_t>(l) * s.num_kv_heads + h) * scored;
      const int budget = k - params.window_size;
      for (int j = 0; j < scored; ++j) keys[j] = ScoreOrderKey(sc[j]);
      std::iota(order.begin(), order.end(), 0);
      auto before = [&](int32_t a, int32_t b) {
        return keys[a] != keys[b] ? keys[a] > keys[b] : a < b;
      };
      if (budget > 0 && budget < scored) {
        std::nth_element(order.begin(), order.begin() + (budget - 1), order.end(), before);
      }
      std::copy(order.begin(), order.begin() + budget, out);
      std::sort(out, out + budget);
      std::iota(out + budget, out + k, scored);  // the window
    }
  }
  return Status::OK();
}

Status CompactKvCpu(const AttentionShape& s, const int* keep_counts, const int32_t* indices,
                    const void* kv, void* kv_out) {
  if (s.num_layers < 1 || s.num_layers > kMaxLayers || s.seq_len < 1 || s.num_kv_heads < 1 ||
      s.num_kv_heads > kMaxKvHeads || s.head_dim < 1 || s.head_dim > kMaxHeadDim) {
    return Status::InvalidArgument("CompactKv: shape out of range");
  }
  if (!IsKnownDType(s.dtype)) return Status::InvalidArgument("CompactKv: unknown dtype");
  if (keep_counts == nullptr || indices == nullptr || kv == nullptr || kv_out == nullptr) {
    return Status::InvalidArgument("CompactKv: null buffer");
  }
  int64_t total = 0;
  for (int l = 0; l < s.num_layers; ++l) {
    if (keep_counts[l] < 0 || keep_counts[l] > s.seq_len) {
      return Status::InvalidArgument("CompactKv: keep count out of range in layer " +
                                     std::to_string(l));
    }
    total += keep_counts[l];
  }
  for (int64_t i = 0; i < total * s.num_kv_heads; ++i) {
    if (indices[i] < 0 || indices[i] >= s.seq_len) {
      return Status::InvalidArgument("CompactKv: index " + std::to_string(indices[i]) +
                                     " outside [0, " + std::to_string(s.seq_len) + ")");
    }
  }
  const size_t row = static_cast<size_t>(s.head_dim) * DTypeSize(s.dtype);
  const size_t token_bytes = row * s.num_kv_heads;
  const auto* in = static_cast<const uint8_t*>(kv);
  auto* out = static_cast<uint8_t*>(kv_out);
  const int32_t* idx = indices;
  for (int l = 0; l < s.num_layers; ++l) {
    const int k = keep_counts[l];
    const uint8_t* layer_in = in + static_cast<size_t>(l) * 2 * s.seq_len * token_bytes;
    for (int kv_i = 0; kv_i < 2; ++kv_i) {
      const uint8_t* plane = layer_in + static_cast<size_t>(kv_i) * s.seq_len * token_bytes;
      for (int j = 0; j < k; ++j) {
        for (int h = 0; h < s.num_kv_heads; ++h) {
          const int32_t t = idx[static_cast<size_t>(h) * k + j];
          std::memcpy(out, plane + t * token_bytes + h * row, row);
          out += row;
        }
      }
    }
    idx += static_cast<size_t>(k) * s.num_kv_heads;
  }
  return Status::OK();
}

Status ComputeScores(const ExecContext& ctx, const CompressParams& params,
                     const AttentionShape& shape, const void* q, const void* kv, float* scores) {
  if (ctx.device == Device::kCuda) {
    return ComputeScoresCuda(params, shape, q, kv, scores, ctx.stream);
  }
  return ComputeScoresCpu(params, shape, q, kv, scores);
}

Status SelectTokens(const ExecContext& ctx, const CompressParams& params,
                    const AttentionShape& shape, const float* scores, int32_t* indices) {
  if (ctx.device == Device::kCuda) {
    return SelectTokensCuda(params, shape, scores, indices, ctx.stream);
  }
  return SelectTokensCpu(params, shape, scores, indices);
}

Status CompactKv(const ExecContext& ctx, const AttentionShape& shape, const int* keep_counts,
                 const int32_t* indices, const void* kv, void* kv_out) {
  if (ctx.device == Device::kCuda) {
    return CompactKvCuda(shape, keep_counts, indices, kv, kv_out, ctx.stream);
  }
  return CompactKvCpu(shape, keep_counts, indices, kv, kv_out);
}

}  // namespace kernels
}  // namespace kvpool
