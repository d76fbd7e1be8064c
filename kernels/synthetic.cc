#include "kernels/synthetic.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace kvpool {
namespace kernels {
namespace testutil {
namespace {

std::vector<float> UnitVector(std::mt19937_64& rng, int dim) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(dim);
  double n2 = 0;
  for (auto& x : v) {
    x = normal(rng);
    n2 += x * x;
  }
  for (auto& x : v) x = static_cast<float>(x / std::sqrt(n2));
  return v;
}

// 16-bit words that hold n elements of dtype (the buffers are vectors of uint16_t words).
size_t Words(size_t n, DType dtype) { return n * (DTypeSize(dtype) / 2); }

}  // namespace

SyntheticAttention MakeSynthetic(const SyntheticSpec& spec) {
  const AttentionShape& s = spec.shape;
  SyntheticAttention a;
  a.shape = s;
  const int n = s.seq_len, dim = s.head_dim, hk = s.num_kv_heads, hq = s.num_q_heads;
  const int group = hq / hk;
  const float sd = std::sqrt(static_cast<float>(dim));
  a.q.resize(Words(static_cast<size_t>(s.num_layers) * n * hq * dim, s.dtype));
  a.kv.resize(Words(static_cast<size_t>(s.num_layers) * 2 * n * hk * dim, s.dtype));
  a.probe.resize(Words(static_cast<size_t>(s.num_layers) * hq * dim, s.dtype));
  std::mt19937_64 rng(spec.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  // Logit of q = a*u (+ b*v) on k = c*u (+ e*v) is a*c*|u|^2 / sqrt(d) (+ b*e / sqrt(d)).
  const float needle_key = 1.5f * sd;
  const float needle_query = spec.needle_logit * sd / needle_key;
  const float topic_key = sd;
  const float topic_query = spec.topic_logit * sd / topic_key;
  std::vector<float> relevance(n);
  for (int l = 0; l < s.num_layers; ++l) {
    std::vector<std::vector<float>> u(hk), v(hk);
    for (int h = 0; h < hk; ++h) {
      u[h] = UnitVector(rng, dim);
      v[h] = UnitVector(rng, dim);
    }
    const float fraction =
        spec.funnel ? spec.relevant_fraction * 2.0f * (s.num_layers - l) / (s.num_layers + 1)
                    : spec.relevant_fraction;
    for (int t = 0; t < n; ++t) relevance[t] = uni(rng) < fraction ? uni(rng) : 0.0f;
    for (int kv = 0; kv < 2; ++kv) {
      for (int t = 0; t < n; ++t) {
        for (int h = 0; h < hk; ++h) {
          const size_t row = (((static_cast<size_t>(l) * 2 + kv) * n + t) * hk + h) * dim;
          for (int d = 0; d < dim; ++d) {
            float x = normal(rng);
            if (kv == 0) {
              x += relevance[t] * topic_key * u[h][d];
              if (t == spec.needle_pos) x = 0.5f * x + needle_key * v[h][d];
            }
            StoreElement(a.kv.data(), row + d, x, s.dtype);
          }
        }
      }
    }
    // row: element offset in buf.
    auto write_query = [&](std::vector<uint16_t>& buf, size_t row, int h, float topic,
                           float needle) {
      const int kvh = h / group;
      for (int d = 0; d < dim; ++d) {
        const float x = 0.3f * normal(rng) + topic * u[kvh][d] + needle * v[kvh][d];
        StoreElement(buf.data(), row + d, x, s.dtype);
      }
    };
    const bool has_needle = spec.needle_pos >= 0 && spec.needle_pos < n;
    for (int t = 0; t < n; ++t) {
      const bool question = t >= n - spec.window;
      for (int h = 0; h < hq; ++h) {
        const size_t row = ((static_cast<size_t>(l) * n + t) * hq + h) * dim;
        if (question) {
          write_query(a.q, row, h, topic_query * (0.5f + 0.5f * uni(rng)),
                      has_needle ? needle_query * (0.8f + 0.4f * uni(rng)) : 0.0f);
        } else {
          write_query(a.q, row, h, topic_query * uni(rng), 0.0f);
        }
      }
    }
    for (int h = 0; h < hq; ++h) {
      write_query(a.probe, (static_cast<size_t>(l) * hq + h) * dim, h, topic_query * 0.75f,
                  has_needle ? needle_query : 0.0f);
    }
  }
  return a;
}

std::vector<uint16_t> LastQueries(const SyntheticAttention& a, int count) {
  const AttentionShape& s = a.shape;
  const size_t row = Words(static_cast<size_t>(s.num_q_heads) * s.head_dim, s.dtype);
  std::vector<uint16_t> out(static_cast<size_t>(s.num_layers) * count * row);
  for (int l = 0; l < s.num_layers; ++l) {
    const uint16_t* src =
        a.q.data() + (static_cast<size_t>(l) * s.seq_len + s.seq_len - count) * row;
    std::copy(src, src + count * row, out.data() + static_cast<size_t>(l) * count * row);
  }
  return out;
}

std::vector<float> ProbeOutput(const SyntheticAttention& a, const std::vector<int>* keep_counts,
                               const std::vector<uint16_t>* compacted) {
  const AttentionShape& s = a.shape;
  const int dim = s.head_dim, hk = s.num_kv_heads, hq = s.num_q_heads, group = hq / hk;
  const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(dim));
  std::vector<float> out(static_cast<size_t>(s.num_layers) * hq * dim, 0.0f);
  size_t layer_off = 0;  // element offset of the layer in the K/V buffer used
  const uint16_t* kv = compacted ? compacted->data() : a.kv.data();
  for (int l = 0; l < s.num_layers; ++l) {
    const int n = keep_counts ? (*keep_counts)[l] : s.seq_len;
    // Element offsets: base of the layer's K/V, q of the head.
    const size_t base = compacted ? layer_off : static_cast<size_t>(l) * 2 * s.seq_len * hk * dim;
    layer_off += static_cast<size_t>(2) * n * hk * dim;
    for (int h = 0; h < hq; ++h) {
      const int kvh = h / group;
      const size_t q = (static_cast<size_t>(l) * hq + h) * dim;
      std::vector<double> w(n);
      double m = -INFINITY;
      for (int j = 0; j < n; ++j) {
        const size_t k = base + (static_cast<size_t>(j) * hk + kvh) * dim;
        double dot = 0;
        for (int d = 0; d < dim; ++d) {
          dot += static_cast<double>(LoadElement(a.probe.data(), q + d, s.dtype)) *
                 LoadElement(kv, k + d, s.dtype);
        }
        w[j] = dot * inv_sqrt_d;
        m = std::max(m, w[j]);
      }
      double sum = 0;
      for (auto& x : w) sum += (x = std::exp(x - m));
      float* o = out.data() + (static_cast<size_t>(l) * hq + h) * dim;
      for (int j = 0; j < n; ++j) {
        const size_t v = base + ((static_cast<size_t>(n) + j) * hk + kvh) * dim;
        for (int d = 0; d < dim; ++d)
          o[d] += static_cast<float>(w[j] / sum * LoadElement(kv, v + d, s.dtype));
      }
    }
  }
  return out;
}

Result<std::vector<int32_t>> SelectCpu(const SyntheticAttention& a, const CompressParams& params,
                                       std::vector<int>* keep) {
  KVPOOL_ASSIGN_OR_RETURN(*keep, KeepCounts(params, a.shape));
  std::vector<float> scores;
  if (NeedsScores(params, a.shape)) {
    const int nq = QueryTokens(params, a.shape);
    const std::vector<uint16_t> q = LastQueries(a, nq);
    scores.resize(static_cast<size_t>(a.shape.num_layers) * a.shape.num_kv_heads *
                  ScoredTokens(params, a.shape));
    KVPOOL_RETURN_IF_ERROR(ComputeScoresCpu(params, a.shape, q.data(), a.kv.data(), scores.data()));
  }
  std::vector<int32_t> indices(TotalKept(*keep) * a.shape.num_kv_heads);
  KVPOOL_RETURN_IF_ERROR(SelectTokensCpu(params, a.shape, scores.data(), indices.data()));
  return indices;
}

double RetainedFraction(const AttentionShape& s, const std::vector<int>& keep,
                        const std::vector<int32_t>& indices, int pos) {
  size_t off = 0;
  int hits = 0;
  for (int l = 0; l < s.num_layers; ++l) {
    for (int h = 0; h < s.num_kv_heads; ++h) {
      const int32_t* b = indices.data() + off;
      hits += std::binary_search(b, b + keep[l], pos) ? 1 : 0;
      off += keep[l];
    }
  }
  return static_cast<double>(hits) / (s.num_layers * s.num_kv_heads);
}

}  // namespace testutil
}  // namespace kernels
}  // namespace kvpool
