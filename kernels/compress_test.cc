// Compression selection CPU twin: budgets against the seed's schedule, scores against a naive
// double-precision reference, top-k ties, compaction, the planted-needle test and the attention
// output error at 10/25/50% budgets.

#include "kernels/compress.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <numeric>
#include <random>

#include "kernels/synthetic.h"
#include "kernels/test_util.h"

namespace kvpool {
namespace kernels {
namespace {

AttentionShape Shape(int layers, int seq, int hq, int hk, int dim, DType dtype = DType::kBFloat16) {
  AttentionShape s;
  s.num_layers = layers;
  s.seq_len = seq;
  s.num_q_heads = hq;
  s.num_kv_heads = hk;
  s.head_dim = dim;
  s.dtype = dtype;
  return s;
}

CompressParams Params(CompressMethod m, int capacity, int window = 32) {
  CompressParams p;
  p.method = m;
  p.max_capacity_prompt = capacity;
  p.window_size = window;
  return p;
}

TEST(KeepCountsTest, PyramidFollowsTheSeedSchedule) {
  // 32 layers, capacity 2048, window 32, beta 20, 8k prompt: min_num = 2016 / 20 = 100,
  // max_num = 4032 - 100 = 3932, steps = 3832 / 31 = 123.
  CompressParams p = Params(CompressMethod::kPyramidKv, 2048);
  auto keep = KeepCounts(p, Shape(32, 8192, 32, 8, 128));
  ASSERT_TRUE(keep.ok());
  for (int l = 0; l < 32; ++l) EXPECT_EQ((*keep)[l], 3932 - l * 123 + 32) << l;
  EXPECT_TRUE(std::is_sorted(keep->rbegin(), keep->rend()));
  const double mean = static_cast<double>(TotalKept(*keep)) / 32;
  EXPECT_NEAR(mean, 2048, 2048 * 0.02);  // max_capacity_prompt is the mean (total / layers)

  // Prompt shorter than 2 * (capacity - window): the top is clamped to the prefix.
  keep = KeepCounts(p, Shape(4, 3000, 4, 4, 64));
  ASSERT_TRUE(keep.ok());
  EXPECT_EQ((*keep)[0], 3000);
  EXPECT_GE((*keep)[3], 32);
  EXPECT_NEAR(static_cast<double>(TotalKept(*keep)) / 4, 2048, 2048 * 0.02);

  // Short prompts are kept whole, by every method.
  for (auto m : {CompressMethod::kStreamingLlm, CompressMethod::kH2O, CompressMethod::kSnapKv,
                 CompressMethod::kPyramidKv}) {
    keep = KeepCounts(Params(m, 2048), Shape(3, 1000, 4, 4, 64));
    ASSERT_TRUE(keep.ok());
    EXPECT_EQ(*keep, std::vector<int>(3, 1000));
  }
  keep = KeepCounts(Params(CompressMethod::kSnapKv, 512), Shape(3, 1000, 4, 4, 64));
  EXPECT_EQ(*keep, std::vector<int>(3, 512));
}

TEST(KeepCountsTest, RejectsBadParameters) {
  const AttentionShape s = Shape(2, 100, 4, 2, 64);
  CompressParams p = Params(CompressMethod::kSnapKv, 32, 32);  // capacity must exceed window
  EXPECT_EQ(KeepCounts(p, s).status().code(), StatusCode::kInvalidArgument);
  p = Params(CompressMethod::kSnapKv, 64);
  p.kernel_size = 4;
  EXPECT_EQ(KeepCounts(p, s).status().code(), StatusCode::kInvalidArgument);
  p = Params(CompressMethod::kStreamingLlm, 4);
  p.sink_size = 4;
  EXPECT_EQ(KeepCounts(p, s).status().code(), StatusCode::kInvalidArgument);
  p = Params(static_cast<CompressMethod>(9), 64);
  EXPECT_EQ(KeepCounts(p, s).status().code(), StatusCode::kInvalidArgument);
  p = Params(CompressMethod::kH2O, 64);
  EXPECT_EQ(KeepCounts(p, Shape(2, 100, 3, 2, 64)).status().code(),
            StatusCode::kInvalidArgument);  // q heads not a multiple of kv heads
  EXPECT_EQ(KeepCounts(p, Shape(0, 100, 4, 2, 64)).status().code(), StatusCode::kInvalidArgument);
  std::vector<int32_t> idx(1000);
  EXPECT_EQ(SelectTokensCpu(p, Shape(1, 100, 2, 2, 8), nullptr, idx.data()).code(),
            StatusCode::kInvalidArgument);  // H2O needs scores
}

// Scores from the definitions, in double.
std::vector<double> NaiveScores(const CompressParams& p, const testutil::SyntheticAttention& a) {
  const AttentionShape& s = a.shape;
  const int n = s.seq_len, hq = s.num_q_heads, hk = s.num_kv_heads, dim = s.head_dim;
  const int nq = p.method == CompressMethod::kH2O ? n : p.window_size;
  const int prefix = n - p.window_size;
  std::vector<double> out(static_cast<size_t>(s.num_layers) * hk * prefix, 0.0);
  auto el = [&](const std::vector<uint16_t>& b, size_t i) {
    return double(LoadElement(b.data(), i, s.dtype));
  };
  for (int l = 0; l < s.num_layers; ++l)
    for (int h = 0; h < hq; ++h) {
      const int kvh = h / (hq / hk);
      std::vector<double> raw(prefix, 0.0);
      for (int t = n - nq; t < n; ++t) {
        std::vector<double> w(t + 1);
        for (int j = 0; j <= t; ++j) {
          double dot = 0;
          for (int d = 0; d < dim; ++d)
            dot += el(a.q, ((static_cast<size_t>(l) * n + t) * hq + h) * dim + d) *
                   el(a.kv, (((static_cast<size_t>(l) * 2) * n + j) * hk + kvh) * dim + d);
          w[j] = dot / std::sqrt(double(dim));
        }
        const double m = *std::max_element(w.begin(), w.end());
        double sum = 0;
        for (auto& x : w) sum += (x = std::exp(x - m));
        for (int j = 0; j < std::min(t + 1, prefix); ++j) raw[j] += w[j] / sum / (hq / hk);
      }
      double* o = out.data() + (static_cast<size_t>(l) * hk + kvh) * prefix;
      for (int j = 0; j < prefix; ++j) {
        if (p.method == CompressMethod::kH2O || p.kernel_size == 1) {
          o[j] += raw[j];
          continue;
        }
        double acc = p.pooling == Pooling::kAvgPool ? 0.0 : -INFINITY;
        for (int x = j - p.kernel_size / 2; x <= j + p.kernel_size / 2; ++x) {
          const double v =
              (x >= 0 && x < prefix) ? raw[x] : (p.pooling == Pooling::kAvgPool ? 0.0 : -INFINITY);
          acc = p.pooling == Pooling::kAvgPool ? acc + v / p.kernel_size : std::max(acc, v);
        }
        // Max pooling is over the group's *sum*, so accumulate per query head only for avg.
        o[j] += acc;
      }
    }
  return out;
}

TEST(ComputeScoresTest, MatchesNaiveReference) {
  struct Case {
    CompressMethod method;
    Pooling pooling;
    int kernel;
    DType dtype;
  };
  for (const Case& c : {Case{CompressMethod::kSnapKv, Pooling::kAvgPool, 5, DType::kBFloat16},
                        Case{CompressMethod::kPyramidKv, Pooling::kAvgPool, 7, DType::kFloat16},
                        Case{CompressMethod::kH2O, Pooling::kAvgPool, 5, DType::kFloat16},
                        Case{CompressMethod::kSnapKv, Pooling::kAvgPool, 1, DType::kBFloat16},
                        Case{CompressMethod::kSnapKv, Pooling::kAvgPool, 5, DType::kFloat32},
                        Case{CompressMethod::kPyramidKv, Pooling::kMaxPool, 3, DType::kFloat32},
                        Case{CompressMethod::kH2O, Pooling::kAvgPool, 5, DType::kFloat32}}) {
    testutil::SyntheticSpec spec;
    spec.shape = Shape(2, 200, 4, 4, 32, c.dtype);  // no GQA: max pooling per head is exact
    spec.window = 16;
    spec.needle_pos = 77;
    const auto a = testutil::MakeSynthetic(spec);
    CompressParams p = Params(c.method, 64, 16);
    p.pooling = c.pooling;
    p.kernel_size = c.kernel;
    const int nq = QueryTokens(p, a.shape), scored = ScoredTokens(p, a.shape);
    ASSERT_EQ(scored, 184);
    const auto q = testutil::LastQueries(a, nq);
    std::vector<float> got(static_cast<size_t>(2) * 4 * scored);
    ASSERT_TRUE(ComputeScoresCpu(p, a.shape, q.data(), a.kv.data(), got.data()).ok());
    const auto want = NaiveScores(p, a);
    std::vector<float> wantf(want.begin(), want.end());
    EXPECT_LT(testutil::RelativeError(got.data(), wantf.data(), got.size()), 1e-5)
        << CompressMethodName(c.method) << " " << DTypeName(c.dtype);
  }
  // GQA with max pooling: each KV head's score is the max-pool of the mean over its query heads.
  testutil::SyntheticSpec spec;
  spec.shape = Shape(1, 150, 4, 1, 16);
  const auto a = testutil::MakeSynthetic(spec);
  CompressParams p = Params(CompressMethod::kSnapKv, 64, 16);
  p.pooling = Pooling::kMaxPool;
  p.kernel_size = 3;
  std::vector<float> pooled(ScoredTokens(p, a.shape)), flat(ScoredTokens(p, a.shape));
  const auto q = testutil::LastQueries(a, 16);
  ASSERT_TRUE(ComputeScoresCpu(p, a.shape, q.data(), a.kv.data(), pooled.data()).ok());
  p.kernel_size = 1;
  ASSERT_TRUE(ComputeScoresCpu(p, a.shape, q.data(), a.kv.data(), flat.data()).ok());
  for (int j = 0; j < static_cast<int>(flat.size()); ++j) {
    float m = flat[j];
    if (j > 0) m = std::max(m, flat[j - 1]);
    if (j + 1 < static_cast<int>(flat.size())) m = std::max(m, flat[j + 1]);
    ASSERT_FLOAT_EQ(pooled[j], m) << j;
  }
}

TEST(SelectTokensTest, TopKWithLowerIndexWinningTies) {
  const AttentionShape s = Shape(2, 300, 2, 2, 8);
  CompressParams p = Params(CompressMethod::kSnapKv, 100, 20);
  const int scored = ScoredTokens(p, s);
  std::vector<float> scores(static_cast<size_t>(2) * 2 * scored);
  std::mt19937 rng(3);
  for (auto& x : scores) x = static_cast<float>(rng() % 16) / 16.0f;  // many ties
  std::vector<int32_t> idx(2 * 2 * 100);
  ASSERT_TRUE(SelectTokensCpu(p, s, scores.data(), idx.data()).ok());
  for (int lh = 0; lh < 4; ++lh) {
    const float* sc = scores.data() + static_cast<size_t>(lh) * scored;
    std::vector<int> order(scored);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return sc[a] > sc[b]; });
    std::vector<int> want(order.begin(), order.begin() + 80);
    std::sort(want.begin(), want.end());
    for (int j = 0; j < 20; ++j) want.push_back(scored + j);
    EXPECT_EQ(std::vector<int>(idx.begin() + lh * 100, idx.begin() + (lh + 1) * 100), want);
  }
}

TEST(SelectTokensTest, StreamingLlmKeepsSinksAndRecent) {
  const AttentionShape s = Shape(1, 50, 2, 2, 8);
  CompressParams p = Params(CompressMethod::kStreamingLlm, 10);
  p.sink_size = 3;
  std::vector<int32_t> idx(20);
  ASSERT_TRUE(SelectTokensCpu(p, s, nullptr, idx.data()).ok());
  const std::vector<int32_t> want = {0, 1, 2, 43, 44, 45, 46, 47, 48, 49};
  EXPECT_EQ(std::vector<int32_t>(idx.begin(), idx.begin() + 10), want);
  EXPECT_EQ(std::vector<int32_t>(idx.begin() + 10, idx.end()), want);
}

TEST(CompactKvTest, GathersKeptTokensPerHead) {
  const AttentionShape s = Shape(2, 40, 3, 3, 8, DType::kFloat16);
  std::vector<uint16_t> kv(static_cast<size_t>(2) * 2 * 40 * 3 * 8);
  testutil::FillNormal(kv.data(), kv.size(), s.dtype, 4);
  const std::vector<int> keep = {5, 2};
  std::vector<int32_t> idx = {0,
                              3,
                              9,
                              10,
                              39,
                              /*h1*/ 1,
                              2,
                              3,
                              4,
                              5,
                              /*h2*/ 7,
                              8,
                              20,
                              30,
                              31,
                              /*layer 1*/ 6,
                              7,
                              0,
                              39,
                              38,
                              1};
  std::vector<uint16_t> out(static_cast<size_t>(2) * 7 * 3 * 8, 0xffff);
  ASSERT_TRUE(CompactKvCpu(s, keep.data(), idx.data(), kv.data(), out.data()).ok());
  size_t o = 0, ib = 0;
  for (int l = 0; l < 2; ++l) {
    for (int kvi = 0; kvi < 2; ++kvi)
      for (int j = 0; j < keep[l]; ++j)
        for (int h = 0; h < 3; ++h)
          for (int d = 0; d < 8; ++d, ++o) {
            const int t = idx[ib + h * keep[l] + j];
            ASSERT_EQ(out[o],
                      kv[((((static_cast<size_t>(l) * 2 + kvi) * 40 + t) * 3 + h) * 8) + d]);
          }
    ib += keep[l] * 3;
  }
  idx[4] = 40;  // out of range
  EXPECT_EQ(CompactKvCpu(s, keep.data(), idx.data(), kv.data(), out.data()).code(),
            StatusCode::kInvalidArgument);
}

// fp32 q / kv holding bf16 values give the bf16 path's scores bit for bit (only the loads differ)
// and so the same kept indices; compaction of fp32 rows gathers the same tokens.
TEST(CompressFp32Test, SameScoresIndicesAndRowsAsBf16OnItsValues) {
  for (auto m : {CompressMethod::kH2O, CompressMethod::kSnapKv, CompressMethod::kPyramidKv,
                 CompressMethod::kStreamingLlm}) {
    testutil::SyntheticSpec spec;
    spec.shape = Shape(3, 300, 4, 2, 32, DType::kBFloat16);
    spec.window = 16;
    spec.needle_pos = 123;
    spec.seed = 7;
    const auto a16 = testutil::MakeSynthetic(spec);
    testutil::SyntheticAttention a32 = a16;
    a32.shape.dtype = DType::kFloat32;
    a32.q = testutil::Convert(a16.q.data(), a16.q.size(), DType::kBFloat16, DType::kFloat32);
    a32.kv = testutil::Convert(a16.kv.data(), a16.kv.size(), DType::kBFloat16, DType::kFloat32);
    const CompressParams p = Params(m, 80, 16);
    const int nq = QueryTokens(p, a16.shape), scored = ScoredTokens(p, a16.shape);
    std::vector<float> s16(static_cast<size_t>(3) * 2 * scored, -1.0f), s32(s16.size(), -2.0f);
    if (NeedsScores(p, a16.shape)) {
      const auto q16 = testutil::LastQueries(a16, nq);
      const auto q32 = testutil::LastQueries(a32, nq);
      ASSERT_EQ(q32.size(), 2 * q16.size());
      ASSERT_TRUE(ComputeScoresCpu(p, a16.shape, q16.data(), a16.kv.data(), s16.data()).ok());
      ASSERT_TRUE(ComputeScoresCpu(p, a32.shape, q32.data(), a32.kv.data(), s32.data()).ok());
      ASSERT_EQ(std::memcmp(s16.data(), s32.data(), s16.size() * sizeof(float)), 0)
          << CompressMethodName(m);
    }
    std::vector<int> keep16, keep32;
    auto i16 = testutil::SelectCpu(a16, p, &keep16);
    auto i32 = testutil::SelectCpu(a32, p, &keep32);
    ASSERT_TRUE(i16.ok() && i32.ok());
    ASSERT_EQ(keep16, keep32);
    ASSERT_EQ(*i16, *i32) << CompressMethodName(m);
    const size_t out_elems = static_cast<size_t>(TotalKept(keep16)) * 2 * 2 * 32;
    std::vector<uint16_t> o16 = testutil::Buffer(out_elems, DType::kBFloat16, 0xffff);
    std::vector<uint16_t> o32 = testutil::Buffer(out_elems, DType::kFloat32, 0xffff);
    ASSERT_TRUE(
        CompactKvCpu(a16.shape, keep16.data(), i16->data(), a16.kv.data(), o16.data()).ok());
    ASSERT_TRUE(
        CompactKvCpu(a32.shape, keep32.data(), i32->data(), a32.kv.data(), o32.data()).ok());
    EXPECT_EQ(testutil::Convert(o32.data(), out_elems, DType::kFloat32, DType::kBFloat16), o16);
  }
}

TEST(CompactKvTest, GathersFp32Rows) {
  const AttentionShape s = Shape(1, 20, 2, 2, 6, DType::kFloat32);
  std::vector<uint16_t> kv = testutil::Buffer(static_cast<size_t>(2) * 20 * 2 * 6, s.dtype);
  testutil::FillNormal(kv.data(), 2 * 20 * 2 * 6, s.dtype, 11);
  const std::vector<int> keep = {3};
  const std::vector<int32_t> idx = {0, 7, 19, /*h1*/ 2, 3, 18};
  std::vector<uint16_t> out = testutil::Buffer(static_cast<size_t>(2) * 3 * 2 * 6, s.dtype, 0xffff);
  ASSERT_TRUE(CompactKvCpu(s, keep.data(), idx.data(), kv.data(), out.data()).ok());
  size_t o = 0;
  for (int kvi = 0; kvi < 2; ++kvi)
    for (int j = 0; j < 3; ++j)
      for (int h = 0; h < 2; ++h)
        for (int d = 0; d < 6; ++d, ++o) {
          const size_t src = ((static_cast<size_t>(kvi) * 20 + idx[h * 3 + j]) * 2 + h) * 6 + d;
          ASSERT_EQ(LoadElement(out.data(), o, s.dtype), LoadElement(kv.data(), src, s.dtype));
        }
  AttentionShape bad = s;
  bad.dtype = static_cast<DType>(3);
  EXPECT_EQ(CompactKvCpu(bad, keep.data(), idx.data(), kv.data(), out.data()).code(),
            StatusCode::kInvalidArgument);
}

testutil::SyntheticSpec NeedleSpec(int seq, int needle) {
  testutil::SyntheticSpec spec;
  spec.shape = Shape(2, seq, 4, 2, 64);
  spec.window = 32;
  spec.needle_pos = needle;
  spec.seed = 1000 + needle;
  return spec;
}

TEST(NeedleTest, AttentionMethodsKeepThePlantedNeedleStreamingLlmDropsIt) {
  // 25%: PyramidKV's last layer still keeps (256 - 32) / 20 = 11 > kernel_size prefix tokens.
  const int seq = 1024, budget = 256;
  for (int needle : {40, 300, 512, 700}) {
    const auto a = testutil::MakeSynthetic(NeedleSpec(seq, needle));
    for (auto m : {CompressMethod::kH2O, CompressMethod::kSnapKv, CompressMethod::kPyramidKv,
                   CompressMethod::kStreamingLlm}) {
      std::vector<int> keep;
      auto idx = testutil::SelectCpu(a, Params(m, budget), &keep);
      ASSERT_TRUE(idx.ok()) << idx.status().ToString();
      const double kept = testutil::RetainedFraction(a.shape, keep, *idx, needle);
      if (m == CompressMethod::kStreamingLlm) {
        EXPECT_EQ(kept, 0.0) << "needle at " << needle;  // outside sinks [0,4) and [772, 1024)
      } else {
        EXPECT_EQ(kept, 1.0) << CompressMethodName(m) << " lost the needle at " << needle;
      }
    }
  }
  // Inside StreamingLLM's sinks or recent window the needle survives.
  for (int needle : {2, 1000}) {
    const auto a = testutil::MakeSynthetic(NeedleSpec(seq, needle));
    std::vector<int> keep;
    auto idx = testutil::SelectCpu(a, Params(CompressMethod::kStreamingLlm, budget), &keep);
    ASSERT_TRUE(idx.ok());
    EXPECT_EQ(testutil::RetainedFraction(a.shape, keep, *idx, needle), 1.0) << needle;
  }
}

TEST(OutputErrorTest, ErrorFallsWithBudgetAndAttentionMethodsBeatStreamingLlm) {
  testutil::SyntheticSpec spec;
  spec.shape = Shape(4, 1024, 4, 2, 64);
  spec.needle_pos = -1;  // a haystack with relevant tokens only
  spec.relevant_fraction = 0.06f;
  spec.topic_logit = 10;
  spec.funnel = true;
  spec.seed = 99;
  const auto a = testutil::MakeSynthetic(spec);
  const auto full = testutil::ProbeOutput(a, nullptr, nullptr);
  std::map<CompressMethod, std::vector<double>> err;
  for (auto m : {CompressMethod::kStreamingLlm, CompressMethod::kH2O, CompressMethod::kSnapKv,
                 CompressMethod::kPyramidKv}) {
    for (double frac : {0.10, 0.25, 0.50}) {
      const int budget = static_cast<int>(frac * spec.shape.seq_len);
      std::vector<int> keep;
      auto idx = testutil::SelectCpu(a, Params(m, budget), &keep);
      ASSERT_TRUE(idx.ok());
      std::vector<uint16_t> compact(static_cast<size_t>(TotalKept(keep)) * 2 *
                                    spec.shape.num_kv_heads * spec.shape.head_dim);
      ASSERT_TRUE(
          CompactKvCpu(a.shape, keep.data(), idx->data(), a.kv.data(), compact.data()).ok());
      const auto out = testutil::ProbeOutput(a, &keep, &compact);
      err[m].push_back(testutil::RelativeError(out.data(), full.data(), out.size()));
      std::printf("[output-error] %-12s budget %2.0f%%  rel_err %.4f\n", CompressMethodName(m),
                  frac * 100, err[m].back());
    }
  }
  for (auto& [m, e] : err) {
    EXPECT_GE(e[0], e[1] - 1e-3) << CompressMethodName(m);
    EXPECT_GE(e[1], e[2] - 1e-3) << CompressMethodName(m);
    EXPECT_GT(e[0], e[2]) << CompressMethodName(m);
  }
  for (int b = 0; b < 3; ++b) {
    EXPECT_LT(err[CompressMethod::kSnapKv][b], err[CompressMethod::kStreamingLlm][b]);
    EXPECT_LT(err[CompressMethod::kH2O][b], err[CompressMethod::kStreamingLlm][b]);
    EXPECT_LT(err[CompressMethod::kPyramidKv][b], err[CompressMethod::kStreamingLlm][b]);
  }
  EXPECT_LT(err[CompressMethod::kSnapKv][2], 0.2);  // half the cache is nearly lossless
}

}  // namespace
}  // namespace kernels
}  // namespace kvpool
