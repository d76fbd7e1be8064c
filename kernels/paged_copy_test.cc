// Paged gather/scatter CPU twin against a naive per-element reference, for the three engine
// layouts, unaligned spans and payloads smaller or larger than a page.

#include "kernels/paged_copy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "kernels/test_util.h"

namespace kvpool {
namespace kernels {
namespace {

struct Engine {
  PagedKvCache cache;
  std::vector<std::vector<uint16_t>> k, v;  // per layer
  std::vector<void*> kp, vp;
};

Engine MakeEngine(PagedLayout layout, int layers, int blocks, int block_size, int heads, int dim,
                  uint64_t seed, DType dtype = DType::kBFloat16) {
  Engine e;
  const size_t per_tensor = static_cast<size_t>(blocks) * block_size * heads * dim;
  const bool combined = layout != PagedLayout::kSeparate;
  for (int l = 0; l < layers; ++l) {
    const size_t elems = per_tensor * (combined ? 2 : 1);
    e.k.push_back(testutil::Buffer(elems, dtype));
    testutil::FillNormal(e.k.back().data(), elems, dtype, seed + l);
    e.kp.push_back(e.k.back().data());
    if (!combined) {
      e.v.push_back(testutil::Buffer(per_tensor, dtype));
      testutil::FillNormal(e.v.back().data(), per_tensor, dtype, seed + 1000 + l);
      e.vp.push_back(e.v.back().data());
    }
  }
  e.cache.layout = layout;
  e.cache.dtype = dtype;
  e.cache.num_layers = layers;
  e.cache.num_blocks = blocks;
  e.cache.block_size = block_size;
  e.cache.num_kv_heads = heads;
  e.cache.head_dim = dim;
  e.cache.k_layers = e.kp.data();
  e.cache.v_layers = combined ? nullptr : e.vp.data();
  return e;
}

// The bits of element i of a buffer of dtype elements (16 or 32 of them).
uint32_t ElementBits(const std::vector<uint16_t>& buf, size_t i, DType dtype) {
  if (DTypeSize(dtype) == 2) return buf[i];
  uint32_t u;
  std::memcpy(&u, buf.data() + 2 * i, sizeof(u));
  return u;
}

// Element (layer, kv, page, slot, head, d) of the engine cache, by the tensor shapes' strides.
uint32_t EngineAt(const Engine& e, int layer, int kv, int page, int slot, int head, int d) {
  const auto& c = e.cache;
  const size_t inner = (static_cast<size_t>(slot) * c.num_kv_heads + head) * c.head_dim + d;
  const size_t page_elems = static_cast<size_t>(c.block_size) * c.num_kv_heads * c.head_dim;
  switch (c.layout) {
    case PagedLayout::kSeparate:
      return ElementBits((kv == 0 ? e.k : e.v)[layer], page * page_elems + inner, c.dtype);
    case PagedLayout::kKvFirst:
      return ElementBits(e.k[layer],
                         (static_cast<size_t>(kv) * c.num_blocks + page) * page_elems + inner,
                         c.dtype);
    case PagedLayout::kKvInterleaved:
      return ElementBits(e.k[layer], (static_cast<size_t>(page) * 2 + kv) * page_elems + inner,
                         c.dtype);
  }
  abort();
}

using Param =
    std::tuple<PagedLayout, int /*block_size*/, int /*tokens*/, int /*first_token*/, DType>;

class PagedCopyTest : public ::testing::TestWithParam<Param> {};

TEST_P(PagedCopyTest, GatherMatchesNaiveAndScatterInverts) {
  const auto [layout, block_size, tokens, first_token, dtype] = GetParam();
  const int layers = 3, heads = 2, dim = 16, blocks = 40, payloads = 3;
  Engine e = MakeEngine(layout, layers, blocks, block_size, heads, dim, 42, dtype);
  const int64_t end = first_token + static_cast<int64_t>(payloads) * tokens;
  const int table_len = static_cast<int>((end + block_size - 1) / block_size);
  std::vector<int32_t> table(table_len);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(5));  // pages out of order
  for (auto& p : table) p = (p * 7 + 3) % blocks;             // and not contiguous

  BlockLayout pl;
  pl.num_layers = layers;
  pl.num_kv_heads = heads;
  pl.head_dim = dim;
  pl.tokens = tokens;
  pl.dtype = dtype;
  std::vector<std::vector<uint16_t>> out(payloads,
                                         testutil::Buffer(BlockElements(pl), dtype, 0xffff));
  std::vector<void*> ptrs;
  for (auto& o : out) ptrs.push_back(o.data());
  PagedSpan span{table.data(), table_len, first_token, payloads};
  ASSERT_TRUE(GatherPagedCpu(e.cache, pl, span, ptrs.data()).ok());

  for (int i = 0; i < payloads; ++i)
    for (int l = 0; l < layers; ++l)
      for (int kv = 0; kv < 2; ++kv)
        for (int t = 0; t < tokens; ++t)
          for (int h = 0; h < heads; ++h)
            for (int d = 0; d < dim; ++d) {
              const int64_t token = first_token + static_cast<int64_t>(i) * tokens + t;
              const int page = table[token / block_size];
              const int slot = static_cast<int>(token % block_size);
              const size_t off =
                  ((((static_cast<size_t>(l) * 2 + kv) * tokens + t) * heads + h) * dim) + d;
              ASSERT_EQ(ElementBits(out[i], off, dtype), EngineAt(e, l, kv, page, slot, h, d))
                  << "payload " << i << " layer " << l << " kv " << kv << " token " << t;
            }

  // Scatter into a fresh engine: the spanned tokens equal the source, the rest stay untouched.
  Engine f = MakeEngine(layout, layers, blocks, block_size, heads, dim, 99, dtype);
  Engine f_before = MakeEngine(layout, layers, blocks, block_size, heads, dim, 99, dtype);
  std::vector<const void*> cptrs(ptrs.begin(), ptrs.end());
  ASSERT_TRUE(ScatterPagedCpu(f.cache, pl, span, cptrs.data()).ok());
  std::vector<std::vector<bool>> written(blocks, std::vector<bool>(block_size, false));
  for (int64_t token = first_token; token < end; ++token) {
    written[table[token / block_size]][token % block_size] = true;
  }
  for (int l = 0; l < layers; ++l)
    for (int kv = 0; kv < 2; ++kv)
      for (int page = 0; page < blocks; ++page)
        for (int slot = 0; slot < block_size; ++slot)
          for (int h = 0; h < heads; ++h)
            for (int d = 0; d < dim; d += 5) {
              const uint32_t want = written[page][slot]
                                        ? EngineAt(e, l, kv, page, slot, h, d)
                                        : EngineAt(f_before, l, kv, page, slot, h, d);
              ASSERT_EQ(EngineAt(f, l, kv, page, slot, h, d), want);
            }
}

INSTANTIATE_TEST_SUITE_P(Shapes, PagedCopyTest,
                         ::testing::Combine(::testing::Values(PagedLayout::kSeparate,
                                                              PagedLayout::kKvFirst,
                                                              PagedLayout::kKvInterleaved),
                                            ::testing::Values(16, 5), ::testing::Values(16, 3, 40),
                                            ::testing::Values(0, 7),
                                            ::testing::Values(DType::kBFloat16, DType::kFloat32)));

class PagedCopyValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    e_ = MakeEngine(PagedLayout::kSeparate, 2, 4, 8, 2, 8, 1);
    pl_.num_layers = 2;
    pl_.num_kv_heads = 2;
    pl_.head_dim = 8;
    pl_.tokens = 8;
    pl_.dtype = DType::kBFloat16;
    buf_.assign(BlockElements(pl_), 0);
    ptr_ = buf_.data();
  }
  Engine e_;
  BlockLayout pl_;
  std::vector<uint16_t> buf_;
  void* ptr_ = nullptr;
};

TEST_F(PagedCopyValidationTest, RejectsBadInput) {
  int32_t table[2] = {0, 1};
  PagedSpan span{table, 2, 0, 1};
  EXPECT_TRUE(GatherPagedCpu(e_.cache, pl_, span, &ptr_).ok());

  int32_t bad_table[2] = {0, 4};  // page 4 of 4
  PagedSpan bad{bad_table, 2, 4, 1};
  Status st = GatherPagedCpu(e_.cache, pl_, bad, &ptr_);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  bad_table[1] = -1;
  EXPECT_EQ(GatherPagedCpu(e_.cache, pl_, bad, &ptr_).code(), StatusCode::kInvalidArgument);

  PagedSpan past{table, 2, 9, 1};  // tokens 9..16 need 3 pages
  EXPECT_EQ(GatherPagedCpu(e_.cache, pl_, past, &ptr_).code(), StatusCode::kInvalidArgument);

  BlockLayout wrong = pl_;
  wrong.num_kv_heads = 3;
  EXPECT_EQ(GatherPagedCpu(e_.cache, wrong, span, &ptr_).code(), StatusCode::kInvalidArgument);
  wrong = pl_;
  wrong.dtype = DType::kFloat16;
  EXPECT_EQ(GatherPagedCpu(e_.cache, wrong, span, &ptr_).code(), StatusCode::kInvalidArgument);
  wrong.dtype = DType::kFloat32;  // fp32 payloads from a bf16 cache: a mismatch too
  EXPECT_EQ(GatherPagedCpu(e_.cache, wrong, span, &ptr_).code(), StatusCode::kInvalidArgument);
  wrong.dtype = static_cast<DType>(3);
  PagedKvCache unknown = e_.cache;
  unknown.dtype = wrong.dtype;
  EXPECT_EQ(GatherPagedCpu(unknown, wrong, span, &ptr_).code(), StatusCode::kInvalidArgument);
  wrong = pl_;
  wrong.encoding = Encoding::kInt8;
  EXPECT_EQ(GatherPagedCpu(e_.cache, wrong, span, &ptr_).code(), StatusCode::kInvalidArgument);
  wrong = pl_;
  wrong.tokens = 0;
  EXPECT_EQ(GatherPagedCpu(e_.cache, wrong, span, &ptr_).code(), StatusCode::kInvalidArgument);

  void* null_ptr = nullptr;
  EXPECT_EQ(GatherPagedCpu(e_.cache, pl_, span, &null_ptr).code(), StatusCode::kInvalidArgument);
  PagedSpan no_table{nullptr, 2, 0, 1};
  EXPECT_EQ(GatherPagedCpu(e_.cache, pl_, no_table, &ptr_).code(), StatusCode::kInvalidArgument);
  PagedKvCache no_v = e_.cache;
  no_v.v_layers = nullptr;
  EXPECT_EQ(GatherPagedCpu(no_v, pl_, span, &ptr_).code(), StatusCode::kInvalidArgument);
  PagedSpan negative{table, 2, -1, 1};
  EXPECT_EQ(GatherPagedCpu(e_.cache, pl_, negative, &ptr_).code(), StatusCode::kInvalidArgument);
  PagedSpan empty{nullptr, 0, 0, 0};
  EXPECT_TRUE(GatherPagedCpu(e_.cache, pl_, empty, nullptr).ok());
}

TEST_F(PagedCopyValidationTest, FailedGatherWritesNothing) {
  int32_t table[2] = {1, 7};  // the second page is bad
  PagedSpan span{table, 2, 0, 2};
  std::vector<uint16_t> b0(BlockElements(pl_), 0x1234), b1(BlockElements(pl_), 0x1234);
  void* ptrs[2] = {b0.data(), b1.data()};
  EXPECT_FALSE(GatherPagedCpu(e_.cache, pl_, span, ptrs).ok());
  for (uint16_t x : b0) ASSERT_EQ(x, 0x1234);
}

TEST(PagedCopyCudaTest, CudaWithoutDeviceOrBuildFailsCleanly) {
  // Either CUDA is not built (Unimplemented) or there is no device / bad args: never a crash.
  PagedKvCache cache;
  BlockLayout pl;
  PagedSpan span;
  EXPECT_FALSE(GatherPagedCuda(cache, pl, span, nullptr, nullptr).ok());
}

}  // namespace
}  // namespace kernels
}  // namespace kvpool
