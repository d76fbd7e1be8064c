// The engine-facing C and C++ API (include/kvpool/kernels.h): a worker's round trip
// gather -> quantize -> dequantize -> scatter, compression through the C calls, and error codes.

#include <gtest/gtest.h>
#include <kvpool/kernels.h>

#include <cstring>
#include <vector>

#include "kernels/synthetic.h"
#include "kernels/test_util.h"

namespace {

using kvpool::kernels::DType;

TEST(KernelsApiTest, WorkerRoundTripThroughInt8) {
  const int layers = 2, blocks = 6, bs = 16, heads = 2, dim = 64;
  const size_t tensor = static_cast<size_t>(blocks) * bs * heads * dim;
  std::vector<uint16_t> k(tensor * layers), v(tensor * layers);
  kvpool::kernels::testutil::FillNormal(k.data(), k.size(), DType::kBFloat16, 1);
  kvpool::kernels::testutil::FillNormal(v.data(), v.size(), DType::kBFloat16, 2);
  std::vector<void*> kp = {k.data(), k.data() + tensor}, vp = {v.data(), v.data() + tensor};
  kvpool_paged_cache cache{KVPOOL_PAGED_SEPARATE,
                           KVPOOL_DTYPE_BFLOAT16,
                           layers,
                           blocks,
                           bs,
                           heads,
                           dim,
                           kp.data(),
                           vp.data()};
  kvpool_block_layout layout{layers, heads, dim, 32, KVPOOL_DTYPE_BFLOAT16, KVPOOL_ENCODING_INT8};
  kvpool_block_layout raw_layout = layout;
  raw_layout.encoding = KVPOOL_ENCODING_RAW;
  const size_t raw_bytes = kvpool_kernel_raw_bytes(&raw_layout);
  ASSERT_EQ(raw_bytes, 2u * layers * 32 * heads * dim * 2);
  ASSERT_EQ(kvpool_kernel_encoded_bytes(&layout), raw_bytes / 2 + 2u * layers * 32 * heads * 4);

  const int32_t table[] = {4, 1};
  const kvpool_exec cpu{KVPOOL_DEVICE_CPU, nullptr};
  std::vector<uint8_t> raw(raw_bytes), enc(kvpool_kernel_encoded_bytes(&layout));
  void* raw_p = raw.data();
  ASSERT_TRUE(kvpool::GatherPagedKv(cpu, cache, raw_layout, table, 2, 0, 1, &raw_p).ok());
  void* enc_p = enc.data();
  const void* craw = raw.data();
  ASSERT_TRUE(kvpool::QuantizeKvBlocks(cpu, layout, &craw, &enc_p, 1).ok());
  std::vector<uint8_t> back(raw_bytes);
  void* back_p = back.data();
  const void* cenc = enc.data();
  ASSERT_TRUE(kvpool::DequantizeKvBlocks(cpu, layout, &cenc, &back_p, 1).ok());
  const double err = kvpool::kernels::testutil::RelativeError(
      reinterpret_cast<uint16_t*>(back.data()), reinterpret_cast<uint16_t*>(raw.data()),
      raw_bytes / 2, DType::kBFloat16);
  EXPECT_LT(err, 0.02);
  // Scatter into other pages and gather them again.
  const int32_t table2[] = {0, 5};
  const void* cback = back.data();
  ASSERT_TRUE(kvpool::ScatterPagedKv(cpu, cache, raw_layout, table2, 2, 0, 1, &cback).ok());
  std::vector<uint8_t> again(raw_bytes);
  void* again_p = again.data();
  ASSERT_EQ(kvpool_kernel_gather_paged(&cpu, &cache, &raw_layout, table2, 2, 0, 1, &again_p), 0);
  EXPECT_EQ(again, back);
}

TEST(KernelsApiTest, CompressionThroughTheCApi) {
  // fp16, and fp32 (the dtype of small test models) through the same calls.
  for (const int dtype : {KVPOOL_DTYPE_FLOAT16, KVPOOL_DTYPE_FLOAT32}) {
    kvpool::kernels::testutil::SyntheticSpec spec;
    spec.shape.num_layers = 2;
    spec.shape.seq_len = 512;
    spec.shape.num_q_heads = 4;
    spec.shape.num_kv_heads = 2;
    spec.shape.head_dim = 32;
    spec.shape.dtype = static_cast<DType>(dtype);
    spec.needle_pos = 200;
    const auto a = kvpool::kernels::testutil::MakeSynthetic(spec);
    kvpool_compress_params p = kvpool::DefaultCompressParams();
    EXPECT_EQ(p.method, KVPOOL_COMPRESS_SNAPKV);
    EXPECT_EQ(p.window_size, 32);
    p.method = KVPOOL_COMPRESS_PYRAMIDKV;
    p.max_capacity_prompt = 256;  // the last layer keeps (256 - 32) / 20 = 11 > kernel_size
    const kvpool_attention_shape shape{2, 512, 4, 2, 32, dtype};
    std::vector<int32_t> keep(2);
    int64_t total = 0;
    int32_t nq = 0, scored = 0;
    ASSERT_EQ(kvpool_kernel_compress_sizes(&p, &shape, keep.data(), &total, &nq, &scored), 0);
    EXPECT_EQ(nq, 32);
    EXPECT_EQ(scored, 480);
    EXPECT_EQ(total, keep[0] + keep[1]);
    EXPECT_GT(keep[0], keep[1]);
    const auto q = kvpool::kernels::testutil::LastQueries(a, nq);
    std::vector<float> scores(2 * 2 * scored);
    ASSERT_EQ(
        kvpool_kernel_compute_scores(nullptr, &p, &shape, q.data(), a.kv.data(), scores.data()), 0);
    std::vector<int32_t> idx(total * 2);
    ASSERT_EQ(kvpool_kernel_select_tokens(nullptr, &p, &shape, scores.data(), idx.data()), 0);
    std::vector<uint16_t> out =
        kvpool::kernels::testutil::Buffer(total * 2 * 2 * 32, static_cast<DType>(dtype));
    ASSERT_EQ(
        kvpool_kernel_compact_kv(nullptr, &shape, keep.data(), idx.data(), a.kv.data(), out.data()),
        0);
    // The needle survives in every layer and head.
    std::vector<int> keep_int(keep.begin(), keep.end());
    EXPECT_EQ(kvpool::kernels::testutil::RetainedFraction(a.shape, keep_int, idx, 200), 1.0)
        << dtype;
  }
}

TEST(KernelsApiTest, Fp32RawPayloadsAreTwiceTheSize) {
  kvpool_block_layout f32{2, 4, 64, 16, KVPOOL_DTYPE_FLOAT32, KVPOOL_ENCODING_RAW};
  kvpool_block_layout f16 = f32;
  f16.dtype = KVPOOL_DTYPE_FLOAT16;
  EXPECT_EQ(kvpool_kernel_raw_bytes(&f32), 2u * 2 * 16 * 4 * 64 * 4);
  EXPECT_EQ(kvpool_kernel_raw_bytes(&f32), 2 * kvpool_kernel_raw_bytes(&f16));
  f32.encoding = f16.encoding = KVPOOL_ENCODING_INT4_G32;
  EXPECT_EQ(kvpool_kernel_encoded_bytes(&f32), kvpool_kernel_encoded_bytes(&f16));
  f32.dtype = 3;  // unknown
  EXPECT_EQ(kvpool_kernel_raw_bytes(&f32), 0u);
}

TEST(KernelsApiTest, ErrorsCarryCodesAndMessages) {
  kvpool_block_layout bad{0, 1, 64, 16, KVPOOL_DTYPE_FLOAT16, KVPOOL_ENCODING_INT8};
  EXPECT_EQ(kvpool_kernel_encoded_bytes(&bad), 0u);
  EXPECT_EQ(kvpool_kernel_encoded_bytes(nullptr), 0u);
  std::vector<uint8_t> buf(64);
  const void* in = buf.data();
  void* out = buf.data();
  EXPECT_EQ(kvpool_kernel_quantize(nullptr, &bad, &in, &out, 1), KVPOOL_KERNEL_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(kvpool_kernel_last_error(), "InvalidArgument"), nullptr);
  kvpool_exec weird{7, nullptr};
  bad.num_layers = 1;
  EXPECT_EQ(kvpool_kernel_quantize(&weird, &bad, &in, &out, 1), KVPOOL_KERNEL_INVALID_ARGUMENT);
  kvpool_compress_params p = kvpool::DefaultCompressParams();
  p.kernel_size = 2;
  const kvpool_attention_shape shape{1, 100, 2, 2, 8, KVPOOL_DTYPE_FLOAT16};
  auto keep = kvpool::CompressKeepCounts(p, shape);
  EXPECT_EQ(keep.status().code(), kvpool::StatusCode::kInvalidArgument);
  EXPECT_EQ(kvpool_kernel_compress_sizes(nullptr, &shape, nullptr, nullptr, nullptr, nullptr),
            KVPOOL_KERNEL_INVALID_ARGUMENT);
  // CUDA: Unimplemented without a CUDA build; with one, the layout is checked before any launch
  // (host buffers are never handed to a kernel here).
  const kvpool_exec gpu{KVPOOL_DEVICE_CUDA, nullptr};
  bad.num_layers = 0;
  const int rc = kvpool_kernel_quantize(&gpu, &bad, &in, &out, 1);
  EXPECT_TRUE(rc == KVPOOL_KERNEL_UNIMPLEMENTED || rc == KVPOOL_KERNEL_INVALID_ARGUMENT) << rc;
  kvpool_block_layout ok_layout{1, 1, 64, 1, KVPOOL_DTYPE_FLOAT16, KVPOOL_ENCODING_INT8};
  std::vector<uint8_t> big(1024);
  const void* big_in = big.data();
  void* big_out = big.data() + 256;
  EXPECT_EQ(kvpool_kernel_quantize(nullptr, &ok_layout, &big_in, &big_out, 1), 0);
  EXPECT_STREQ(kvpool_kernel_last_error(), "");
}

}  // namespace
