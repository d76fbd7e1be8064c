// GPU-vs-CPU twin tests under GoogleTest (label gpu). Each test skips when no CUDA device is
// present. The full comparison over many shapes, with timing, is kvpool-kernel-check.

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

#include "kernels/compress.h"
#include "kernels/paged_copy.h"
#include "kernels/quantize.h"
#include "kernels/synthetic.h"
#include "kernels/test_util.h"

namespace kvpool {
namespace kernels {
namespace {

bool HaveDevice() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define SKIP_WITHOUT_DEVICE() \
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device"

template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) {
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess);
  }
  ~Dev() { cudaFree(p); }
  void Up(const T* h) {
    ASSERT_EQ(cudaMemcpy(p, h, n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> Down() {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

TEST(KernelsGpuTest, GatherMatchesCpu) {
  SKIP_WITHOUT_DEVICE();
  const int layers = 2, blocks = 8, bs = 16, heads = 4, dim = 64;
  const size_t tensor = static_cast<size_t>(blocks) * bs * heads * dim;
  std::vector<uint16_t> host(tensor * 2 * layers);
  testutil::FillNormal(host.data(), host.size(), DType::kFloat16, 1);
  Dev<uint16_t> dev(host.size());
  dev.Up(host.data());
  std::vector<void*> hk, hv, dk, dv;
  for (int l = 0; l < layers; ++l) {
    hk.push_back(host.data() + tensor * 2 * l);
    hv.push_back(host.data() + tensor * (2 * l + 1));
    dk.push_back(dev.p + tensor * 2 * l);
    dv.push_back(dev.p + tensor * (2 * l + 1));
  }
  PagedKvCache c;
  c.num_layers = layers;
  c.num_blocks = blocks;
  c.block_size = bs;
  c.num_kv_heads = heads;
  c.head_dim = dim;
  BlockLayout pl;
  pl.num_layers = layers;
  pl.num_kv_heads = heads;
  pl.head_dim = dim;
  pl.tokens = 16;
  std::vector<int32_t> table = {5, 2, 7};
  Dev<int32_t> dtable(3);
  dtable.Up(table.data());
  std::vector<uint16_t> ref(BlockElements(pl) * 2);
  void* hp[2] = {ref.data(), ref.data() + BlockElements(pl)};
  c.k_layers = hk.data();
  c.v_layers = hv.data();
  ASSERT_TRUE(GatherPagedCpu(c, pl, PagedSpan{table.data(), 3, 8, 2}, hp).ok());
  Dev<uint16_t> out(ref.size());
  void* dp[2] = {out.p, out.p + BlockElements(pl)};
  c.k_layers = dk.data();
  c.v_layers = dv.data();
  ASSERT_TRUE(GatherPagedCuda(c, pl, PagedSpan{dtable.p, 3, 8, 2}, dp, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(out.Down(), ref);
}

TEST(KernelsGpuTest, QuantizeMatchesCpu) {
  SKIP_WITHOUT_DEVICE();
  for (Encoding e : {Encoding::kInt8, Encoding::kFp8E4M3, Encoding::kInt4G32, Encoding::kInt4G64}) {
    BlockLayout l;
    l.num_layers = 2;
    l.num_kv_heads = 4;
    l.head_dim = 128;
    l.tokens = 16;
    l.dtype = DType::kBFloat16;
    l.encoding = e;
    std::vector<uint16_t> raw(BlockElements(l));
    testutil::FillRealistic(raw.data(), raw.size(), l.head_dim, l.dtype, 3);
    std::vector<uint8_t> ref(EncodedBytes(l));
    const void* in = raw.data();
    void* out = ref.data();
    ASSERT_TRUE(QuantizeBlocksCpu(l, &in, &out, 1).ok());
    Dev<uint16_t> draw(raw.size());
    draw.Up(raw.data());
    Dev<uint8_t> denc(ref.size());
    ASSERT_EQ(cudaMemset(denc.p, 0xA5, ref.size()), cudaSuccess);  // poison
    const void* din = draw.p;
    void* dout = denc.p;
    ASSERT_TRUE(QuantizeBlocksCuda(l, &din, &dout, 1, nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint8_t> got = denc.Down();
    for (size_t b = EncodedDataBytes(l); b < EncodedScaleOffset(l); ++b) got[b] = ref[b];
    EXPECT_EQ(got, ref) << EncodingName(e);
  }
}

TEST(KernelsGpuTest, SnapKvSelectionMatchesCpu) {
  SKIP_WITHOUT_DEVICE();
  testutil::SyntheticSpec spec;
  spec.shape.num_layers = 2;
  spec.shape.seq_len = 700;
  spec.shape.num_q_heads = 4;
  spec.shape.num_kv_heads = 2;
  spec.shape.head_dim = 64;
  spec.needle_pos = 123;
  const auto a = testutil::MakeSynthetic(spec);
  CompressParams p;
  p.max_capacity_prompt = 128;
  const auto q = testutil::LastQueries(a, p.window_size);
  const size_t ns = static_cast<size_t>(2) * 2 * ScoredTokens(p, a.shape);
  std::vector<float> ref(ns);
  ASSERT_TRUE(ComputeScoresCpu(p, a.shape, q.data(), a.kv.data(), ref.data()).ok());
  Dev<uint16_t> dq(q.size()), dkv(a.kv.size());
  dq.Up(q.data());
  dkv.Up(a.kv.data());
  Dev<float> ds(ns);
  ASSERT_TRUE(ComputeScoresCuda(p, a.shape, dq.p, dkv.p, ds.p, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> got = ds.Down();
  EXPECT_LT(testutil::RelativeError(got.data(), ref.data(), ns), 1e-4);
  std::vector<int32_t> want(2 * 2 * 128);
  ASSERT_TRUE(SelectTokensCpu(p, a.shape, got.data(), want.data()).ok());
  Dev<int32_t> di(want.size());
  ASSERT_TRUE(SelectTokensCuda(p, a.shape, ds.p, di.p, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(di.Down(), want);
}

}  // namespace
}  // namespace kernels
}  // namespace kvpool
