// kvpool-kernel-check: every CUDA kernel against its CPU twin on fresh random inputs of several
// shapes, then each kernel timed against a device-to-device copy of the same bytes.
//
// Correctness rules (per kernel, stated in docs/KERNELS.md):
//   copies (gather, scatter, compact)       byte exact
//   quantize                                codes and scales expected bit exact; pass when the
//                                           CPU-decoded GPU block is within 1e-6 relative
//   dequantize                              expected bit exact; pass at 1e-6 relative
//   scores                                  ||gpu - cpu|| / ||cpu|| <= 1e-4 (f32 dot order, expf)
//   select                                  exactly the CPU twin's selection on the GPU's scores
// Every output is poisoned (0xA5, then 0x5A) before a run; the two runs must agree byte for byte
// so an unwritten element shows. Inputs are random, never all zero; float outputs never NaN.
// Timing: CUDA events, median of --reps runs after warm-up, bandwidth = (bytes read + bytes
// written) / time, beside cudaMemcpyAsync D2D moving the same total in the same run.
//
// Exit status: 0 all pass, 1 a check failed, 2 no CUDA device or a CUDA error.
// Usage: kvpool-kernel-check [--quick] [--reps N] [--seed S]

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/block_layout.h"
#include "kernels/compress.h"
#include "kernels/device_checksum.h"
#include "kernels/paged_copy.h"
#include "kernels/quantize.h"
#include "kernels/synthetic.h"
#include "kernels/test_util.h"

namespace kvpool {
namespace kernels {
namespace {

#define CK(expr)                                                                           \
  do {                                                                                     \
    cudaError_t _e = (expr);                                                               \
    if (_e != cudaSuccess) {                                                               \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(_e), __FILE__, \
                   __LINE__, #expr);                                                       \
      std::exit(2);                                                                        \
    }                                                                                      \
  } while (0)

#define OK_OR_DIE(expr)                                                                            \
  do {                                                                                             \
    Status _s = (expr);                                                                            \
    if (!_s.ok()) {                                                                                \
      std::fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #expr, _s.ToString().c_str()); \
      std::exit(2);                                                                                \
    }                                                                                              \
  } while (0)

struct DevBuf {
  void* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t bytes) : n(bytes) { CK(cudaMalloc(&p, std::max<size_t>(bytes, 16))); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
  void Upload(const void* src) const { CK(cudaMemcpy(p, src, n, cudaMemcpyHostToDevice)); }
  void Download(void* dst) const { CK(cudaMemcpy(dst, p, n, cudaMemcpyDeviceToHost)); }
  void Poison(int byte) const { CK(cudaMemset(p, byte, n)); }
};

std::vector<uint8_t> Bytes(const DevBuf& b) {
  std::vector<uint8_t> v(b.n);
  b.Download(v.data());
  return v;
}

struct CheckRow {
  std::string kernel, shape;
  double err = 0, tol = 0;
  bool pass = false;
  std::string note;
};
std::vector<CheckRow> g_checks;

struct TimeRow {
  std::string kernel, shape;
  double bytes = 0, ms = 0, gbps = 0, copy_gbps = 0, gflops = 0;
};
std::vector<TimeRow> g_times;

int g_reps = 50;
uint64_t g_seed = 12345;
bool g_quick = false;

void Record(CheckRow r) {
  std::printf("  %-4s %-22s %-44s err %.3g (tol %.3g) %s\n", r.pass ? "ok" : "FAIL",
              r.kernel.c_str(), r.shape.c_str(), r.err, r.tol, r.note.c_str());
  g_checks.push_back(std::move(r));
}

// Runs `launch` twice on outputs poisoned with 0xA5 then 0x5A; returns the first result and
// reports whether both runs wrote every byte identically.
std::vector<std::vector<uint8_t>> RunPoisoned(const std::vector<const DevBuf*>& outs,
                                              const std::function<void()>& launch,
                                              bool* all_written) {
  std::vector<std::vector<uint8_t>> first;
  *all_written = true;
  for (int pass = 0; pass < 2; ++pass) {
    for (auto* o : outs) o->Poison(pass == 0 ? 0xA5 : 0x5A);
    launch();
    CK(cudaDeviceSynchronize());
    for (size_t i = 0; i < outs.size(); ++i) {
      std::vector<uint8_t> b = Bytes(*outs[i]);
      if (pass == 0) {
        first.push_back(std::move(b));
      } else if (b != first[i]) {
        *all_written = false;
      }
    }
  }
  return first;
}

bool AllZero(const std::vector<uint16_t>& v) {
  return std::all_of(v.begin(), v.end(), [](uint16_t x) { return (x & 0x7fff) == 0; });
}

double MedianMs(const std::function<void()>& launch, int reps) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) launch();  // warm-up
  CK(cudaDeviceSynchronize());
  std::vector<float> ms(reps);
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(a));
    launch();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    CK(cudaEventElapsedTime(&ms[i], a, b));
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[reps / 2];
}

// Bandwidth of a D2D copy moving `moved` bytes (read + write) in total.
double CopyGbps(double moved) {
  const size_t n = static_cast<size_t>(moved / 2);
  DevBuf src(n), dst(n);
  src.Poison(1);
  const double ms =
      MedianMs([&] { CK(cudaMemcpyAsync(dst.p, src.p, n, cudaMemcpyDeviceToDevice)); }, g_reps);
  return moved / (ms * 1e-3) / 1e9;
}

void Time(const std::string& kernel, const std::string& shape, double moved,
          const std::function<void()>& launch, double flops = 0) {
  const double ms = MedianMs(launch, g_reps);
  TimeRow r;
  r.kernel = kernel;
  r.shape = shape;
  r.bytes = moved;
  r.ms = ms;
  r.gbps = moved / (ms * 1e-3) / 1e9;
  r.copy_gbps = CopyGbps(moved);
  r.gflops = flops > 0 ? flops / (ms * 1e-3) / 1e9 : 0;
  std::printf(
      "  time %-22s %-40s %9.3f ms %8.1f GB/s (copy %8.1f GB/s, %.2fx)%s\n", kernel.c_str(),
      shape.c_str(), ms, r.gbps, r.copy_gbps, r.gbps / r.copy_gbps,
      flops > 0 ? (" " + std::to_string(static_cast<int>(r.gflops)) + " GFLOP/s").c_str() : "");
  g_times.push_back(r);
}

// Fills a large device buffer quickly: random host chunk, replicated.
void FillDeviceRandom(const DevBuf& b, DType dtype, uint64_t seed) {
  const size_t chunk = std::min<size_t>(b.n, 32u << 20);
  std::vector<uint16_t> h(chunk / 2 + 1);
  testutil::FillNormal(h.data(), h.size() * 2 / DTypeSize(dtype), dtype, seed);
  for (size_t off = 0; off < b.n; off += chunk) {
    CK(cudaMemcpy(static_cast<uint8_t*>(b.p) + off, h.data(), std::min(chunk, b.n - off),
                  cudaMemcpyHostToDevice));
  }
}

std::string Shape(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string Shape(const char* fmt, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  return buf;
}

// ------------------------------------------------------------------------------------------
// Paged gather / scatter

struct PagedCase {
  PagedLayout layout;
  DType dtype;
  int layers, heads, dim, block_size, tokens, payloads;
  int64_t first_token;
};

const char* LayoutName(PagedLayout l) {
  return l == PagedLayout::kSeparate  ? "separate"
         : l == PagedLayout::kKvFirst ? "kv_first"
                                      : "kv_interleaved";
}

void CheckPaged(const PagedCase& c, bool time_it) {
  const int64_t end = c.first_token + static_cast<int64_t>(c.payloads) * c.tokens;
  const int pages = static_cast<int>((end + c.block_size - 1) / c.block_size);
  // The table below must name each page once: a scatter to a page named twice has no defined
  // result on a GPU (two CTAs race; the CPU twin lets the later payload win).
  int num_blocks = pages + 7;
  while (std::gcd(num_blocks, 5) != 1) ++num_blocks;
  const size_t tensor_elems = static_cast<size_t>(num_blocks) * c.block_size * c.heads * c.dim;
  const bool combined = c.layout != PagedLayout::kSeparate;
  // Buffers are 16-bit words: `w` per element (two for fp32).
  const size_t w = DTypeSize(c.dtype) / 2;
  const size_t tensor_words = tensor_elems * w;
  const size_t per_layer = tensor_words * 2;  // K and V (one or two tensors)
  // Host engine, random.
  std::vector<uint16_t> host_engine(per_layer * c.layers);
  if (time_it) {
    host_engine.clear();
  } else {
    testutil::FillNormal(host_engine.data(), host_engine.size() / w, c.dtype, g_seed++);
  }
  DevBuf engine(per_layer * c.layers * 2);
  if (time_it) {
    FillDeviceRandom(engine, c.dtype, g_seed++);
  } else {
    engine.Upload(host_engine.data());
  }
  std::vector<void*> hk(c.layers), hv(c.layers), dk(c.layers), dv(c.layers);
  for (int l = 0; l < c.layers; ++l) {
    uint16_t* hbase = time_it ? nullptr : host_engine.data() + per_layer * l;
    uint16_t* dbase = engine.as<uint16_t>() + per_layer * l;
    hk[l] = hbase;
    dk[l] = dbase;
    hv[l] = combined || !hbase ? nullptr : hbase + tensor_words;
    dv[l] = combined ? nullptr : dbase + tensor_words;
  }
  std::vector<int32_t> table(pages);
  for (int i = 0; i < pages; ++i) table[i] = (i * 5 + 3) % num_blocks;  // scattered pages
  DevBuf dtable(table.size() * 4);
  dtable.Upload(table.data());

  PagedKvCache cache;
  cache.layout = c.layout;
  cache.dtype = c.dtype;
  cache.num_layers = c.layers;
  cache.num_blocks = num_blocks;
  cache.block_size = c.block_size;
  cache.num_kv_heads = c.heads;
  cache.head_dim = c.dim;
  BlockLayout pl;
  pl.num_layers = c.layers;
  pl.num_kv_heads = c.heads;
  pl.head_dim = c.dim;
  pl.tokens = c.tokens;
  pl.dtype = c.dtype;
  const size_t pbytes = RawBytes(pl);
  DevBuf dpay(pbytes * c.payloads);
  std::vector<void*> dptrs(c.payloads);
  for (int i = 0; i < c.payloads; ++i) dptrs[i] = dpay.as<uint8_t>() + pbytes * i;
  PagedSpan dspan{dtable.as<int32_t>(), pages, c.first_token, c.payloads};
  PagedKvCache dcache = cache;
  dcache.k_layers = dk.data();
  dcache.v_layers = dv.data();
  const std::string shape =
      Shape("%s %s L%d H%d D%d bs%d T%d x%d", LayoutName(c.layout), DTypeName(c.dtype), c.layers,
            c.heads, c.dim, c.block_size, c.tokens, c.payloads);
  const double moved = 2.0 * pbytes * c.payloads;
  if (time_it) {
    Time("gather", shape, moved,
         [&] { OK_OR_DIE(GatherPagedCuda(dcache, pl, dspan, dptrs.data(), nullptr)); });
    Time("scatter", shape, moved, [&] {
      OK_OR_DIE(ScatterPagedCuda(dcache, pl, dspan,
                                 reinterpret_cast<const void* const*>(dptrs.data()), nullptr));
    });
    return;
  }
  // CPU twin.
  PagedKvCache hcache = cache;
  hcache.k_layers = hk.data();
  hcache.v_layers = hv.data();
  std::vector<uint8_t> ref(pbytes * c.payloads);
  std::vector<void*> hptrs(c.payloads);
  for (int i = 0; i < c.payloads; ++i) hptrs[i] = ref.data() + pbytes * i;
  PagedSpan hspan{table.data(), pages, c.first_token, c.payloads};
  OK_OR_DIE(GatherPagedCpu(hcache, pl, hspan, hptrs.data()));
  bool written;
  auto got = RunPoisoned(
      {&dpay}, [&] { OK_OR_DIE(GatherPagedCuda(dcache, pl, dspan, dptrs.data(), nullptr)); },
      &written);
  const bool same = got[0] == ref;
  Record(
      {"gather", shape, same ? 0.0 : 1.0, 0.0, same && written, written ? "" : "unwritten bytes"});

  // Scatter: write fresh random payloads into the device engine; compare with the CPU twin.
  std::vector<uint16_t> fresh(pbytes * c.payloads / 2);
  testutil::FillNormal(fresh.data(), fresh.size() / w, c.dtype, g_seed++);
  dpay.Upload(fresh.data());
  std::vector<const void*> hsrc(c.payloads);
  for (int i = 0; i < c.payloads; ++i)
    hsrc[i] = reinterpret_cast<uint8_t*>(fresh.data()) + pbytes * i;
  OK_OR_DIE(ScatterPagedCpu(hcache, pl, hspan, hsrc.data()));
  // The engine is the output here: poison would clobber untouched pages, so restore between
  // runs and compare the whole engine instead (both runs must equal the CPU engine).
  bool ok = true;
  for (int pass = 0; pass < 2; ++pass) {
    engine.Poison(pass == 0 ? 0xA5 : 0x5A);
    // Pages outside the span must keep the poison; the CPU reference is rebuilt accordingly.
    std::vector<uint16_t> want(engine.n / 2);
    std::memset(want.data(), pass == 0 ? 0xA5 : 0x5A, engine.n);
    std::vector<void*> wk(c.layers), wv(c.layers);
    for (int l = 0; l < c.layers; ++l) {
      wk[l] = want.data() + per_layer * l;
      wv[l] = combined ? nullptr : want.data() + per_layer * l + tensor_words;
    }
    PagedKvCache wcache = cache;
    wcache.k_layers = wk.data();
    wcache.v_layers = wv.data();
    OK_OR_DIE(ScatterPagedCpu(wcache, pl, hspan, hsrc.data()));
    OK_OR_DIE(ScatterPagedCuda(dcache, pl, dspan,
                               reinterpret_cast<const void* const*>(dptrs.data()), nullptr));
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> got_engine(engine.n / 2);
    engine.Download(got_engine.data());
    ok = ok && got_engine == want;
  }
  Record({"scatter", shape, ok ? 0.0 : 1.0, 0.0, ok, ""});
}

// ------------------------------------------------------------------------------------------
// Quantize / dequantize

void CheckQuant(Encoding enc, DType dtype, int layers, int heads, int dim, int tokens, int blocks,
                bool realistic, bool time_it) {
  BlockLayout l;
  l.num_layers = layers;
  l.num_kv_heads = heads;
  l.head_dim = dim;
  l.tokens = tokens;
  l.dtype = dtype;
  l.encoding = enc;
  const size_t rb = RawBytes(l), eb = EncodedBytes(l);
  DevBuf draw(rb * blocks), denc(eb * blocks), dback(rb * blocks);
  std::vector<void*> pr(blocks), pe(blocks), pb(blocks);
  for (int i = 0; i < blocks; ++i) {
    pr[i] = draw.as<uint8_t>() + rb * i;
    pe[i] = denc.as<uint8_t>() + eb * i;
    pb[i] = dback.as<uint8_t>() + rb * i;
  }
  const std::string shape =
      Shape("%s %s L%d H%d D%d T%d x%d%s", EncodingName(enc), DTypeName(dtype), layers, heads, dim,
            tokens, blocks, realistic ? " outliers" : "");
  auto quant = [&] {
    OK_OR_DIE(QuantizeBlocksCuda(l, reinterpret_cast<const void* const*>(pr.data()), pe.data(),
                                 blocks, nullptr));
  };
  auto dequant = [&] {
    OK_OR_DIE(DequantizeBlocksCuda(l, reinterpret_cast<const void* const*>(pe.data()), pb.data(),
                                   blocks, nullptr));
  };
  if (time_it) {
    FillDeviceRandom(draw, dtype, g_seed++);
    quant();
    Time("quantize", shape, static_cast<double>(rb + eb) * blocks, quant);
    Time("dequantize", shape, static_cast<double>(rb + eb) * blocks, dequant);
    return;
  }
  // 16-bit words (two per fp32 element); `elems` elements in all.
  const size_t elems = rb / DTypeSize(dtype) * blocks;
  std::vector<uint16_t> raw(rb / 2 * blocks);
  for (int i = 0; i < blocks; ++i) {
    uint16_t* p = raw.data() + rb / 2 * i;
    if (realistic) {
      testutil::FillRealistic(p, rb / DTypeSize(dtype), dim, dtype, g_seed++);
    } else {
      testutil::FillNormal(p, rb / DTypeSize(dtype), dtype, g_seed++);
    }
  }
  if (AllZero(raw)) std::abort();
  draw.Upload(raw.data());
  // CPU twin.
  std::vector<uint8_t> ref_enc(eb * blocks);
  std::vector<const void*> hr(blocks);
  std::vector<void*> he(blocks);
  for (int i = 0; i < blocks; ++i) {
    hr[i] = raw.data() + rb / 2 * i;
    he[i] = ref_enc.data() + eb * i;
  }
  OK_OR_DIE(QuantizeBlocksCpu(l, hr.data(), he.data(), blocks));
  bool written;
  auto got = RunPoisoned({&denc}, quant, &written);
  // Bit for bit, the padding before the scale section (zero on both sides) included.
  size_t mismatched = 0;
  for (size_t b = 0; b < got[0].size(); ++b) mismatched += got[0][b] != ref_enc[b];
  // Decode both on the CPU and compare.
  std::vector<uint16_t> dec_gpu(rb / 2 * blocks), dec_cpu(rb / 2 * blocks);
  std::vector<const void*> ge(blocks), ce(blocks);
  std::vector<void*> gd(blocks), cd(blocks);
  for (int i = 0; i < blocks; ++i) {
    ge[i] = got[0].data() + eb * i;
    ce[i] = ref_enc.data() + eb * i;
    gd[i] = dec_gpu.data() + rb / 2 * i;
    cd[i] = dec_cpu.data() + rb / 2 * i;
  }
  OK_OR_DIE(DequantizeBlocksCpu(l, ge.data(), gd.data(), blocks));
  OK_OR_DIE(DequantizeBlocksCpu(l, ce.data(), cd.data(), blocks));
  const double qerr = testutil::RelativeError(dec_gpu.data(), dec_cpu.data(), elems, dtype);
  const bool qnan = testutil::CountNaN(dec_gpu.data(), elems, dtype) > 0;
  const double recon = testutil::RelativeError(dec_cpu.data(), raw.data(), elems, dtype);
  Record({"quantize", shape, qerr, 1e-6, qerr <= 1e-6 && mismatched == 0 && written && !qnan,
          Shape("%zu/%zu bytes differ; reconstruction %.4f%s%s", mismatched, got[0].size(), recon,
                written ? "" : " UNWRITTEN", qnan ? " NaN" : "")});
  // Dequantize the CPU's encoding on the GPU.
  denc.Upload(ref_enc.data());
  auto back = RunPoisoned({&dback}, dequant, &written);
  std::vector<uint16_t> back16(back[0].size() / 2);
  std::memcpy(back16.data(), back[0].data(), back[0].size());
  const double derr = testutil::RelativeError(back16.data(), dec_cpu.data(), elems, dtype);
  const bool dnan = testutil::CountNaN(back16.data(), elems, dtype) > 0;
  Record({"dequantize", shape, derr, 1e-6, derr <= 1e-6 && written && !dnan,
          std::string(back16 == dec_cpu ? "bit exact" : "not bit exact") +
              (written ? "" : " UNWRITTEN") + (dnan ? " NaN" : "")});
}

// ------------------------------------------------------------------------------------------
// Compression

void CheckCompress(CompressMethod m, Pooling pooling, int kernel, DType dtype, int layers, int seq,
                   int hq, int hk, int dim, int capacity, int window, bool time_it) {
  AttentionShape s;
  s.num_layers = layers;
  s.seq_len = seq;
  s.num_q_heads = hq;
  s.num_kv_heads = hk;
  s.head_dim = dim;
  s.dtype = dtype;
  CompressParams p;
  p.method = m;
  p.pooling = pooling;
  p.kernel_size = kernel;
  p.max_capacity_prompt = capacity;
  p.window_size = window;
  auto keep_r = KeepCounts(p, s);
  OK_OR_DIE(keep_r.status());
  const std::vector<int> keep = *keep_r;
  const int nq = QueryTokens(p, s), scored = ScoredTokens(p, s);
  const int64_t kept = TotalKept(keep);
  const size_t q_elems = static_cast<size_t>(layers) * nq * hq * dim;
  const size_t kv_elems = static_cast<size_t>(layers) * 2 * seq * hk * dim;
  const size_t score_elems = static_cast<size_t>(layers) * hk * scored;
  const size_t idx_elems = static_cast<size_t>(kept) * hk;
  const size_t out_elems = static_cast<size_t>(kept) * 2 * hk * dim;
  const size_t esize = DTypeSize(dtype);  // bytes of one element of q, kv and the output
  DevBuf dq(std::max<size_t>(q_elems, 1) * esize), dkv(kv_elems * esize),
      dscores(std::max<size_t>(score_elems, 1) * 4), didx(idx_elems * 4), dout(out_elems * esize);
  const std::string shape = Shape("%s%s %s L%d n%d Hq%d Hk%d D%d C%d W%d", CompressMethodName(m),
                                  m == CompressMethod::kSnapKv || m == CompressMethod::kPyramidKv
                                      ? (pooling == Pooling::kAvgPool ? "/avg" : "/max")
                                      : "",
                                  DTypeName(dtype), layers, seq, hq, hk, dim, capacity, window);
  auto scores_fn = [&] {
    OK_OR_DIE(ComputeScoresCuda(p, s, dq.p, dkv.p, dscores.as<float>(), nullptr));
  };
  auto select_fn = [&] {
    OK_OR_DIE(SelectTokensCuda(p, s, dscores.as<float>(), didx.as<int32_t>(), nullptr));
  };
  auto compact_fn = [&] {
    OK_OR_DIE(CompactKvCuda(s, keep.data(), didx.as<int32_t>(), dkv.p, dout.p, nullptr));
  };
  if (time_it) {
    FillDeviceRandom(dkv, dtype, g_seed++);
    if (q_elems) FillDeviceRandom(dq, dtype, g_seed++);
    if (NeedsScores(p, s)) {
      scores_fn();
      const double flops = 2.0 * 2 * layers * hq * static_cast<double>(nq) *
                           (m == CompressMethod::kH2O ? seq / 2.0 : seq) * dim;
      Time("scores", shape,
           (q_elems + kv_elems / 2) * static_cast<double>(esize) + score_elems * 4.0, scores_fn,
           flops);
    }
    select_fn();
    Time("select", shape, score_elems * 4.0 * 5 + idx_elems * 4.0, select_fn);
    Time("compact", shape, out_elems * static_cast<double>(esize) * 2 + idx_elems * 4.0,
         compact_fn);
    return;
  }
  testutil::SyntheticSpec spec;
  spec.shape = s;
  spec.window = window;
  spec.needle_pos = seq / 3;
  spec.seed = g_seed++;
  const testutil::SyntheticAttention a = testutil::MakeSynthetic(spec);
  const std::vector<uint16_t> q = testutil::LastQueries(a, nq);
  if (AllZero(a.kv)) std::abort();
  if (q_elems) dq.Upload(q.data());
  dkv.Upload(a.kv.data());
  std::vector<float> ref_scores(score_elems);
  bool written;
  std::vector<float> gpu_scores(score_elems);
  if (NeedsScores(p, s)) {
    OK_OR_DIE(ComputeScoresCpu(p, s, q.data(), a.kv.data(), ref_scores.data()));
    auto got = RunPoisoned({&dscores}, scores_fn, &written);
    std::memcpy(gpu_scores.data(), got[0].data(), score_elems * 4);
    const double err = testutil::RelativeError(gpu_scores.data(), ref_scores.data(), score_elems);
    const bool nan =
        std::any_of(gpu_scores.begin(), gpu_scores.end(), [](float x) { return std::isnan(x); });
    Record({"scores", shape, err, 1e-4, err <= 1e-4 && written && !nan,
            std::string(written ? "" : "UNWRITTEN") + (nan ? " NaN" : "")});
  }
  // Select: on the GPU's scores, both sides; the GPU scores are uploaded back unchanged.
  std::vector<int32_t> ref_idx(idx_elems), cpu_idx(idx_elems);
  OK_OR_DIE(SelectTokensCpu(p, s, gpu_scores.data(), ref_idx.data()));
  OK_OR_DIE(SelectTokensCpu(p, s, ref_scores.data(), cpu_idx.data()));
  if (NeedsScores(p, s)) dscores.Upload(gpu_scores.data());
  auto got_idx = RunPoisoned({&didx}, select_fn, &written);
  std::vector<int32_t> gpu_idx(idx_elems);
  std::memcpy(gpu_idx.data(), got_idx[0].data(), idx_elems * 4);
  size_t same_as_cpu_scores = 0;
  for (size_t i = 0; i < idx_elems; ++i) same_as_cpu_scores += gpu_idx[i] == cpu_idx[i];
  Record({"select", shape, gpu_idx == ref_idx ? 0.0 : 1.0, 0.0, gpu_idx == ref_idx && written,
          Shape("%.4f of positions equal to the all-CPU selection%s",
                idx_elems ? static_cast<double>(same_as_cpu_scores) / idx_elems : 1.0,
                written ? "" : " UNWRITTEN")});
  // Compact with the reference indices.
  didx.Upload(ref_idx.data());
  std::vector<uint16_t> ref_out = testutil::Buffer(out_elems, dtype);
  OK_OR_DIE(CompactKvCpu(s, keep.data(), ref_idx.data(), a.kv.data(), ref_out.data()));
  auto got_out = RunPoisoned({&dout}, compact_fn, &written);
  const bool same = std::memcmp(got_out[0].data(), ref_out.data(), out_elems * esize) == 0;
  Record({"compact", shape, same ? 0.0 : 1.0, 0.0, same && written, written ? "" : "UNWRITTEN"});
}

// ------------------------------------------------------------------------------------------
// Device checksum

// `count` blocks of the given sizes at odd offsets inside one buffer: each block's device
// checksum on the GPU against the CPU twin over the same bytes; with `time_it`, timed beside a
// D2D copy reading as many bytes (the checksum writes none: its copy figure counts read + write
// of the same bytes, so 0.5x of it is reading at copy speed).
void CheckDeviceChecksum(const std::vector<size_t>& sizes, bool time_it) {
  size_t total = 0;
  for (size_t s : sizes) total += s + 13;
  DevBuf buf(total);
  std::vector<uint8_t> host(total);
  std::mt19937_64 rng(g_seed ^ total);
  for (auto& b : host) b = static_cast<uint8_t>(rng());
  buf.Upload(host.data());
  std::vector<ByteRange> ranges;
  size_t off = 0;
  for (size_t s : sizes) {
    off += ranges.size() % 2 ? 5 : 13;  // unaligned starts
    ranges.push_back({buf.as<uint8_t>() + off, s});
    off += s;
  }
  Result<std::vector<uint64_t>> got = DeviceChecksumsCuda(ranges.data(), ranges.size(), nullptr);
  OK_OR_DIE(got.status());
  size_t wrong = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const size_t at = static_cast<const uint8_t*>(ranges[i].data) - buf.as<uint8_t>();
    wrong += (*got)[i] != DeviceChecksumCpu(host.data() + at, ranges[i].size) ? 1 : 0;
  }
  CheckRow r;
  r.kernel = "device_checksum";
  r.shape =
      Shape("%zu blocks, %zu..%zu B", sizes.size(), *std::min_element(sizes.begin(), sizes.end()),
            *std::max_element(sizes.begin(), sizes.end()));
  r.err = static_cast<double>(wrong);
  r.pass = wrong == 0;
  r.note = "exact (CPU twin)";
  Record(r);
  if (time_it) {
    Time("device_checksum", r.shape, static_cast<double>(total) * 2,
         [&] { OK_OR_DIE(DeviceChecksumsCuda(ranges.data(), ranges.size(), nullptr).status()); });
  }
}

int Main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) {
      g_quick = true;
    } else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      g_reps = std::max(3, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--seed") && i + 1 < argc) {
      g_seed = std::strtoull(argv[++i], nullptr, 10);
    } else {
      std::fprintf(stderr, "usage: %s [--quick] [--reps N] [--seed S]\n", argv[0]);
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "kvpool-kernel-check: no CUDA device\n");
    return 2;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, %.1f GiB, cc %d.%d\n", prop.name, prop.multiProcessorCount,
              prop.totalGlobalMem / 1073741824.0, prop.major, prop.minor);

  std::printf("== correctness (GPU vs CPU twin, fresh random inputs) ==\n");
  for (DType dt : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    CheckPaged({PagedLayout::kSeparate, dt, 4, 8, 128, 16, 16, 5, 0}, false);
    CheckPaged({PagedLayout::kKvFirst, dt, 3, 2, 64, 16, 32, 3, 5}, false);
    CheckPaged({PagedLayout::kKvInterleaved, dt, 2, 4, 96, 32, 16, 4, 16}, false);
    CheckPaged({PagedLayout::kSeparate, dt, 70, 1, 8, 5, 7, 130, 3}, false);  // 2 layer chunks,
                                                                              // 2 payload chunks
    // Rows of 8, 12 and 6 bytes (16-bit types; twice that in fp32): the 8-, 4- and 2-byte word
    // copies (16-, 8- and 4-byte in fp32).
    CheckPaged({PagedLayout::kSeparate, dt, 2, 1, 4, 16, 16, 3, 0}, false);
    CheckPaged({PagedLayout::kKvFirst, dt, 2, 1, 6, 16, 16, 3, 5}, false);
    CheckPaged({PagedLayout::kKvInterleaved, dt, 2, 1, 3, 16, 16, 3, 0}, false);
    for (Encoding e :
         {Encoding::kInt8, Encoding::kFp8E4M3, Encoding::kInt4G32, Encoding::kInt4G64}) {
      CheckQuant(e, dt, 4, 8, 128, 16, 3, false, false);
      CheckQuant(e, dt, 2, 2, 64, 5, 2, true, false);
      CheckQuant(e, dt, 3, 3, 192, 7, 130, true, false);  // 2 launches
    }
    CheckQuant(Encoding::kInt8, dt, 2, 3, 40, 3, 2, false, false);  // head_dim not 32-aligned
    CheckQuant(Encoding::kFp8E4M3, dt, 2, 3, 6, 3, 2, false, false);
  }
  for (DType dt : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    CheckCompress(CompressMethod::kSnapKv, Pooling::kAvgPool, 5, dt, 2, 1024, 8, 2, 128, 256, 32,
                  false);
    CheckCompress(CompressMethod::kSnapKv, Pooling::kMaxPool, 7, dt, 2, 777, 4, 4, 64, 100, 16,
                  false);
    CheckCompress(CompressMethod::kPyramidKv, Pooling::kAvgPool, 5, dt, 4, 1500, 8, 2, 128, 300, 32,
                  false);
    CheckCompress(CompressMethod::kH2O, Pooling::kAvgPool, 5, dt, 2, 600, 4, 2, 64, 128, 16, false);
    CheckCompress(CompressMethod::kStreamingLlm, Pooling::kAvgPool, 5, dt, 2, 900, 4, 2, 64, 128,
                  16, false);
    CheckCompress(CompressMethod::kSnapKv, Pooling::kAvgPool, 5, dt, 2, 200, 4, 2, 64, 256, 32,
                  false);  // short: keep all
  }
  CheckCompress(CompressMethod::kSnapKv, Pooling::kAvgPool, 1, DType::kBFloat16, 70, 300, 2, 1, 32,
                64, 8, false);  // 2 chunks
  CheckDeviceChecksum({0, 1, 31, 4095, 4096, 4097, 100000, 1u << 20}, false);
  CheckDeviceChecksum(std::vector<size_t>(70, 65536 + 7), false);  // 2 launches

  std::printf("== timing (median of %d after warm-up; bandwidth = bytes read + written) ==\n",
              g_reps);
  const int big = g_quick ? 32 : 256;
  CheckPaged({PagedLayout::kSeparate, DType::kBFloat16, 32, 8, 128, 16, 16, big, 0}, true);
  CheckPaged({PagedLayout::kKvFirst, DType::kBFloat16, 32, 8, 128, 16, 16, big, 0}, true);
  CheckPaged({PagedLayout::kKvInterleaved, DType::kBFloat16, 32, 8, 128, 16, 16, big, 0}, true);
  CheckPaged({PagedLayout::kSeparate, DType::kFloat16, 32, 8, 128, 16, 64, big / 4, 0}, true);
  for (Encoding e : {Encoding::kInt8, Encoding::kFp8E4M3, Encoding::kInt4G32, Encoding::kInt4G64}) {
    CheckQuant(e, DType::kBFloat16, 32, 8, 128, 16, big, false, true);
  }
  CheckCompress(CompressMethod::kSnapKv, Pooling::kAvgPool, 5, DType::kBFloat16, 32,
                g_quick ? 4096 : 16384, 32, 8, 128, 2048, 32, true);
  CheckCompress(CompressMethod::kPyramidKv, Pooling::kMaxPool, 7, DType::kBFloat16, 32,
                g_quick ? 4096 : 16384, 32, 8, 128, 2048, 32, true);
  CheckCompress(CompressMethod::kH2O, Pooling::kAvgPool, 5, DType::kBFloat16, 4,
                g_quick ? 1024 : 4096, 32, 8, 128, 1024, 32, true);
  CheckDeviceChecksum(std::vector<size_t>(16, size_t{1} << 20), true);  // a get of 16 x 1 MiB
  CheckDeviceChecksum(std::vector<size_t>(64, size_t{4} << 20), true);

  int failed = 0;
  for (const auto& r : g_checks) failed += r.pass ? 0 : 1;
  std::printf("\n== summary: %zu checks, %d failed ==\n", g_checks.size(), failed);
  std::printf("| kernel | shape | time (ms) | GB/s | D2D copy GB/s | ratio |\n");
  std::printf("| --- | --- | ---: | ---: | ---: | ---: |\n");
  for (const auto& t : g_times) {
    std::printf("| %s | %s | %.3f | %.0f | %.0f | %.2f%s |\n", t.kernel.c_str(), t.shape.c_str(),
                t.ms, t.gbps, t.copy_gbps, t.gbps / t.copy_gbps,
                t.gflops > 0
                    ? (" (" + std::to_string(static_cast<int>(t.gflops)) + " GFLOP/s)").c_str()
                    : "");
  }
  std::printf("RESULT: %s\n", failed == 0 ? "PASS" : "FAIL");
  return failed == 0 ? 0 : 1;
}

}  // namespace
}  // namespace kernels
}  // namespace kvpool

int main(int argc, char** argv) { return kvpool::kernels::Main(argc, argv); }
