// kvpool-kernel-bench-cpu: throughput of the CPU twins beside single-thread memcpy of the same
// bytes, measured in the same run (the twins serve CPU-only deployments and the tests).
//
// Budget (issue "The KV kernels"): gather and quantize at >= 0.5x single-thread memcpy of the same
// bytes. Bandwidths are computed on the raw payload bytes (what the memcpy moves) and the ratio
// is memcpy time / kernel time. Buffers are 128 MiB (well beyond the last-level cache).
//
// Usage: kvpool-kernel-bench-cpu [--mib N] [--reps N]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/compress.h"
#include "kernels/paged_copy.h"
#include "kernels/quantize.h"
#include "kernels/synthetic.h"
#include "kernels/test_util.h"

namespace kvpool {
namespace kernels {
namespace {

int g_reps = 7;

double MedianSeconds(const std::function<void()>& fn) {
  fn();  // warm-up (page faults, caches)
  std::vector<double> t(g_reps);
  for (int i = 0; i < g_reps; ++i) {
    const auto a = std::chrono::steady_clock::now();
    fn();
    const auto b = std::chrono::steady_clock::now();
    t[i] = std::chrono::duration<double>(b - a).count();
  }
  std::sort(t.begin(), t.end());
  return t[g_reps / 2];
}

void Check(const Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    std::exit(1);
  }
}

struct Row {
  std::string kernel;
  double bytes, sec, memcpy_sec;
};

void Print(const Row& r) {
  const double gbps = r.bytes / r.sec / 1e9, mgbps = r.bytes / r.memcpy_sec / 1e9;
  std::printf("| %s | %.0f | %.2f | %.2f | %.2f |\n", r.kernel.c_str(), r.bytes / (1 << 20), gbps,
              mgbps, r.memcpy_sec / r.sec);
}

int Main(int argc, char** argv) {
  int mib = 128;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--mib") && i + 1 < argc) {
      mib = std::max(8, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      g_reps = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--mib N] [--reps N]\n", argv[0]);
      return 2;
    }
  }
  // A Llama-3-8B shard: 32 layers, 8 KV heads, head_dim 128, bf16; kvpool blocks of 16 tokens
  // (2 MiB), engine pages of 16 tokens.
  BlockLayout pl;
  pl.num_layers = 32;
  pl.num_kv_heads = 8;
  pl.head_dim = 128;
  pl.tokens = 16;
  pl.dtype = DType::kBFloat16;
  const size_t pbytes = RawBytes(pl);
  const int payloads = std::max(1, static_cast<int>((static_cast<size_t>(mib) << 20) / pbytes));
  const size_t total = pbytes * payloads;

  std::vector<uint8_t> src(total), dst(total);
  testutil::FillNormal(reinterpret_cast<uint16_t*>(src.data()), total / 2, pl.dtype, 1);
  std::memset(dst.data(), 1, total);
  const double memcpy_sec = MedianSeconds([&] { std::memcpy(dst.data(), src.data(), total); });

  std::printf("CPU twins vs single-thread memcpy of the same %zu MiB (median of %d)\n", total >> 20,
              g_reps);
  std::printf(
      "| kernel | MiB | GB/s | memcpy GB/s | ratio |\n| --- | ---: | ---: | ---: | ---: |\n");

  // Gather / scatter: engine of `payloads * 16` tokens in pages of 16 tokens, pages shuffled.
  for (PagedLayout layout : {PagedLayout::kSeparate, PagedLayout::kKvInterleaved}) {
    PagedKvCache c;
    c.layout = layout;
    c.dtype = pl.dtype;
    c.num_layers = pl.num_layers;
    c.block_size = 16;
    c.num_blocks = payloads * pl.tokens / c.block_size;
    c.num_kv_heads = pl.num_kv_heads;
    c.head_dim = pl.head_dim;
    const size_t per_layer = total / pl.num_layers;  // K and V of all pages of one layer
    std::vector<void*> k(pl.num_layers), v(pl.num_layers);
    for (int l = 0; l < pl.num_layers; ++l) {
      k[l] = src.data() + per_layer * l;
      v[l] = src.data() + per_layer * l + per_layer / 2;
    }
    c.k_layers = k.data();
    c.v_layers = v.data();
    std::vector<int32_t> table(c.num_blocks);
    for (int i = 0; i < c.num_blocks; ++i) table[i] = (i * 7919) % c.num_blocks;
    std::vector<void*> out(payloads);
    for (int i = 0; i < payloads; ++i) out[i] = dst.data() + pbytes * i;
    const PagedSpan span{table.data(), c.num_blocks, 0, payloads};
    const char* name = layout == PagedLayout::kSeparate ? "gather (separate K/V, bs 16)"
                                                        : "gather (kv interleaved, bs 16)";
    Print({name, static_cast<double>(total),
           MedianSeconds([&] { Check(GatherPagedCpu(c, pl, span, out.data())); }), memcpy_sec});
    if (layout == PagedLayout::kSeparate) {
      std::vector<const void*> in(out.begin(), out.end());
      Print({"scatter (separate K/V, bs 16)", static_cast<double>(total),
             MedianSeconds([&] { Check(ScatterPagedCpu(c, pl, span, in.data())); }), memcpy_sec});
    }
  }

  // Quantize / dequantize, bandwidth on the raw bytes.
  for (Encoding e : {Encoding::kInt8, Encoding::kFp8E4M3, Encoding::kInt4G32, Encoding::kInt4G64}) {
    BlockLayout ql = pl;
    ql.encoding = e;
    const size_t eb = EncodedBytes(ql);
    std::vector<const void*> in(payloads);
    std::vector<void*> enc(payloads), back(payloads);
    for (int i = 0; i < payloads; ++i) {
      in[i] = src.data() + pbytes * i;
      enc[i] = dst.data() + eb * i;  // encoded blocks are smaller than raw ones
    }
    Print({std::string("quantize ") + EncodingName(e), static_cast<double>(total),
           MedianSeconds([&] { Check(QuantizeBlocksCpu(ql, in.data(), enc.data(), payloads)); }),
           memcpy_sec});
    // Dequantize into src (its contents no longer matter after this point for this encoding).
    std::vector<uint8_t> raw_out(total);
    for (int i = 0; i < payloads; ++i) back[i] = raw_out.data() + pbytes * i;
    std::vector<const void*> cenc(enc.begin(), enc.end());
    Print(
        {std::string("dequantize ") + EncodingName(e), static_cast<double>(total),
         MedianSeconds([&] { Check(DequantizeBlocksCpu(ql, cenc.data(), back.data(), payloads)); }),
         memcpy_sec});
  }

  // Compaction of a 32-layer, 8k-token prompt to 25% (bytes = the kept K/V written).
  {
    AttentionShape s;
    s.num_layers = 32;
    s.seq_len = 8192;
    s.num_q_heads = 32;
    s.num_kv_heads = 8;
    s.head_dim = 128;
    s.dtype = DType::kBFloat16;
    CompressParams p;
    p.method = CompressMethod::kStreamingLlm;
    p.max_capacity_prompt = 2048;
    std::vector<int> keep(32, 2048);
    std::vector<int32_t> idx(static_cast<size_t>(32) * 8 * 2048);
    Check(SelectTokensCpu(p, s, nullptr, idx.data()));
    const size_t in_bytes = static_cast<size_t>(32) * 2 * 8192 * 8 * 128 * 2;
    std::vector<uint8_t> kv(in_bytes, 3), out(in_bytes / 4);
    const double mc = MedianSeconds([&] { std::memcpy(out.data(), kv.data(), out.size()); });
    Print({"compact 25% (32 layers, 8k tokens)", static_cast<double>(out.size()),
           MedianSeconds(
               [&] { Check(CompactKvCpu(s, keep.data(), idx.data(), kv.data(), out.data())); }),
           mc});
  }
  return 0;
}

}  // namespace
}  // namespace kernels
}  // namespace kvpool

int main(int argc, char** argv) { return kvpool::kernels::Main(argc, argv); }
