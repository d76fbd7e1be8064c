// CUDA compression selection and compaction (the CPU twin in compress.cc is the reference).
//
//   ComputeScores  1) one CTA per (layer, q_head, query): the query's softmax max and sum over its
//                     causal keys (online softmax, warp per key);
//                  2) one CTA per (layer, kv_head, tile of 128 prefix keys + pooling halo): each
//                     key's probability summed over the group's query heads and the queries, in
//                     the twin's order (head, then query), then pooled in shared memory.
//                  Deterministic (no atomics); differs from the twin only by f32 rounding of the
//                  dot products and expf (relative error ~1e-6, checked at 1e-4).
//   SelectTokens   one CTA per (layer, kv_head): 4-pass 8-bit radix select of the k-th largest
//                  ScoreOrderKey, then one ordered pass with block scans that keeps keys above the
//                  threshold and the lowest-position ties: the exact set of the twin, ascending.
//   CompactKv      a row gather (head_dim elements per row), 16-byte words where aligned.
// Budget: CompactKv is a copy (target >= 0.7x D2D bandwidth); SelectTokens reads the scores 5
// times; ComputeScores is compute bound (2 * q_heads * queries * keys * head_dim flops per layer)
// and is reported in flop/s as well as bytes.

#include <cmath>
#include <cstdint>
#include <cub/block/block_scan.cuh>
#include <vector>

#include "kernels/compress.h"
#include "kernels/cuda_check.h"
#include "kernels/cuda_dtype.cuh"

namespace kvpool {
namespace kernels {
namespace {

using cuda::CeilDiv;

constexpr int kLayersPerLaunch = 64;
constexpr int kScoreTile = 128;

// q and kv are typed per dtype at their use (Elem<D>).
struct ScoreArgs {
  const void* q;
  const void* kv;
  float* scores;
  float2* stats;  // [layer][q_head][query] {max, sum}
  int n, nq, scored, hq, hk, dim, group, kernel_size;
  bool pool;
  bool avg;
  float inv_sqrt_d;
};

template <DType D>
__device__ __forceinline__ float Logit(const ScoreArgs& a, const float* qs, const Elem<D>* k,
                                       int lane) {
  float part = 0.0f;
  for (int d = lane; d < a.dim; d += 32)
    part = __fadd_rn(part, __fmul_rn(qs[d], cuda::LoadF<D>(k, d)));
  return __fmul_rn(cuda::WarpSum(part), a.inv_sqrt_d);
}

template <DType D>
__device__ __forceinline__ const Elem<D>* KeyRow(const ScoreArgs& a, int l, int j, int kvh) {
  return static_cast<const Elem<D>*>(a.kv) +
         ((static_cast<int64_t>(l) * 2 * a.n + j) * a.hk + kvh) * a.dim;
}
template <DType D>
__device__ __forceinline__ const Elem<D>* QueryRow(const ScoreArgs& a, int l, int i, int h) {
  return static_cast<const Elem<D>*>(a.q) +
         ((static_cast<int64_t>(l) * a.nq + i) * a.hq + h) * a.dim;
}

// grid (nq, hq, layers), 128 threads, dynamic shared: dim floats.
template <DType D>
__global__ void SoftmaxStatsKernel(const ScoreArgs a) {
  extern __shared__ float qs[];
  __shared__ float wm[4], wl[4];
  const int i = blockIdx.x, h = blockIdx.y, l = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t = a.n - a.nq + i;
  const int kvh = h / a.group;
  const Elem<D>* q = QueryRow<D>(a, l, i, h);
  for (int d = threadIdx.x; d < a.dim; d += blockDim.x) qs[d] = cuda::LoadF<D>(q, d);
  __syncthreads();
  float m = -INFINITY, s = 0.0f;
  for (int j = warp; j <= t; j += 4) {
    const float x = Logit<D>(a, qs, KeyRow<D>(a, l, j, kvh), lane);
    if (x > m) {
      s = __fadd_rn(__fmul_rn(s, expf(m - x)), 1.0f);
      m = x;
    } else {
      s = __fadd_rn(s, expf(x - m));
    }
  }
  if (lane == 0) {
    wm[warp] = m;
    wl[warp] = s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float mm = -INFINITY;
    for (int w = 0; w < 4; ++w) mm = fmaxf(mm, wm[w]);
    float ss = 0.0f;
    for (int w = 0; w < 4; ++w) {
      if (wm[w] > -INFINITY) ss = __fadd_rn(ss, __fmul_rn(wl[w], expf(wm[w] - mm)));
    }
    a.stats[(static_cast<int64_t>(l) * a.hq + h) * a.nq + i] = make_float2(mm, ss);
  }
}

// grid (tiles, hk, layers), 256 threads, dynamic shared: dim floats + tile + 2 * halo floats.
template <DType D>
__global__ void ScoreKernel(const ScoreArgs a) {
  extern __shared__ float smem[];
  const int tile = blockIdx.x, kvh = blockIdx.y, l = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int halo = a.pool ? a.kernel_size / 2 : 0;
  const int j0 = tile * kScoreTile;
  const int lo = max(0, j0 - halo);
  const int hi = min(a.scored, j0 + kScoreTile + halo);       // exclusive
  float* raw = smem;                                          // hi - lo entries
  float* qs = smem + (kScoreTile + 2 * halo) + warp * a.dim;  // per-warp query vector
  for (int j = lo + warp; j < hi; j += warps) {
    const Elem<D>* k = KeyRow<D>(a, l, j, kvh);
    float acc = 0.0f;
    for (int g = 0; g < a.group; ++g) {
      const int h = kvh * a.group + g;
      for (int i = 0; i < a.nq; ++i) {
        const int t = a.n - a.nq + i;
        if (j > t) continue;  // causal (H2O's early queries)
        const Elem<D>* q = QueryRow<D>(a, l, i, h);
        for (int d = lane; d < a.dim; d += 32) qs[d] = cuda::LoadF<D>(q, d);
        __syncwarp();
        const float x = Logit<D>(a, qs, k, lane);
        const float2 st = a.stats[(static_cast<int64_t>(l) * a.hq + h) * a.nq + i];
        acc = __fadd_rn(acc, __fmul_rn(expf(x - st.x), 1.0f / st.y));
        __syncwarp();
      }
    }
    if (lane == 0) raw[j - lo] = acc;
  }
  __syncthreads();
  const float inv_group = 1.0f / static_cast<float>(a.group);
  for (int j = j0 + threadIdx.x; j < min(a.scored, j0 + kScoreTile); j += blockDim.x) {
    float v;
    if (!a.pool || a.kernel_size == 1) {
      v = __fmul_rn(raw[j - lo], inv_group);
    } else {
      const int x0 = max(0, j - halo), x1 = min(a.scored - 1, j + halo);
      if (a.avg) {
        float sum = 0.0f;
        for (int x = x0; x <= x1; ++x) sum = __fadd_rn(sum, raw[x - lo]);
        v = __fdiv_rn(__fmul_rn(sum, inv_group), static_cast<float>(a.kernel_size));
      } else {
        float mx = -INFINITY;
        for (int x = x0; x <= x1; ++x) mx = fmaxf(mx, raw[x - lo]);
        v = __fmul_rn(mx, inv_group);
      }
    }
    a.scores[(static_cast<int64_t>(l) * a.hk + kvh) * a.scored + j] = v;
  }
}

__device__ __forceinline__ uint32_t OrderKey(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

struct SelectArgs {
  const float* scores;
  int32_t* indices;
  int keep[kLayersPerLaunch];
  int64_t offset[kLayersPerLaunch];  // index offset of each layer
  int layer_base, n, scored, hk, window, sink;
  bool streaming;
};

constexpr int kSelectThreads = 512;

// grid (hk, layers in launch), kSelectThreads threads.
__global__ void SelectKernel(const SelectArgs a) {
  using Scan = cub::BlockScan<int, kSelectThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ unsigned int hist[256];
  __shared__ uint32_t s_prefix;
  __shared__ int s_rem;
  const int h = blockIdx.x, lc = blockIdx.y, l = a.layer_base + lc;
  const int k = a.keep[lc];
  const int tid = threadIdx.x;
  int32_t* out = a.indices + a.offset[lc] + static_cast<int64_t>(h) * k;
  if (k >= a.n) {
    for (int j = tid; j < a.n; j += kSelectThreads) out[j] = j;
    return;
  }
  if (a.streaming) {
    for (int j = tid; j < k; j += kSelectThreads) {
      out[j] = j < a.sink ? j : a.n - (k - a.sink) + (j - a.sink);
    }
    return;
  }
  const float* sc = a.scores + (static_cast<int64_t>(l) * a.hk + h) * a.scored;
  const int budget = k - a.window;
  for (int j = tid; j < a.window; j += kSelectThreads) out[budget + j] = a.scored + j;
  if (budget <= 0) return;
  uint32_t prefix = 0, mask = 0;
  int rem = budget;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = tid; b < 256; b += kSelectThreads) hist[b] = 0;
    __syncthreads();
    for (int j = tid; j < a.scored; j += kSelectThreads) {
      const uint32_t key = OrderKey(sc[j]);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xffu], 1u);
    }
    __syncthreads();
    if (tid == 0) {
      int cum = 0;
      for (int b = 255; b >= 0; --b) {
        if (cum + static_cast<int>(hist[b]) >= rem) {
          s_prefix = prefix | (static_cast<uint32_t>(b) << shift);
          s_rem = rem - cum;
          break;
        }
        cum += hist[b];
      }
    }
    __syncthreads();
    prefix = s_prefix;
    rem = s_rem;
    mask |= 0xffu << shift;
  }
  const uint32_t threshold = prefix;  // the budget-th largest key; take `rem` of its ties
  int taken = 0, eq_seen = 0;
  for (int base = 0; base < a.scored; base += kSelectThreads) {
    const int j = base + tid;
    const uint32_t key = j < a.scored ? OrderKey(sc[j]) : 0u;
    const int is_eq = (j < a.scored && key == threshold) ? 1 : 0;
    int eq_before, eq_total;
    Scan(scan_tmp).ExclusiveSum(is_eq, eq_before, eq_total);
    __syncthreads();
    const int sel =
        (j < a.scored && (key > threshold || (is_eq && eq_seen + eq_before < rem))) ? 1 : 0;
    int pos, sel_total;
    Scan(scan_tmp).ExclusiveSum(sel, pos, sel_total);
    __syncthreads();
    if (sel) out[taken + pos] = j;
    taken += sel_total;
    eq_seen += eq_total;
  }
}

struct CompactArgs {
  const void* kv;
  void* out;
  const int32_t* indices;
  int keep[kLayersPerLaunch];
  int64_t cum[kLayersPerLaunch + 1];  // kept tokens before each layer of the launch (absolute)
  int layers, layer_base, n, hk, row_words;
};

template <typename Word>
__global__ void CompactKernel(const CompactArgs a) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  const int64_t base_rows = 2 * a.hk * a.cum[0];
  const int64_t r_abs = base_rows + row;
  // Find the layer: rows of layer lc are [2 hk cum[lc], 2 hk cum[lc + 1]).
  int lc = 0;
  while (lc < a.layers && r_abs >= 2 * a.hk * a.cum[lc + 1]) ++lc;
  if (lc >= a.layers) return;
  const int k = a.keep[lc];
  const int64_t local = r_abs - 2 * a.hk * a.cum[lc];
  const int kv = static_cast<int>(local / (static_cast<int64_t>(k) * a.hk));
  const int64_t rest = local % (static_cast<int64_t>(k) * a.hk);
  const int j = static_cast<int>(rest / a.hk), h = static_cast<int>(rest % a.hk);
  const int32_t t = a.indices[a.hk * a.cum[lc] + static_cast<int64_t>(h) * k + j];
  if (t < 0 || t >= a.n) return;  // documented: left unwritten
  const int l = a.layer_base + lc;
  const int64_t rw = a.row_words;
  const Word* src = static_cast<const Word*>(a.kv) +
                    (((static_cast<int64_t>(l) * 2 + kv) * a.n + t) * a.hk + h) * rw;
  Word* dst = static_cast<Word*>(a.out) + r_abs * rw;
  for (int i = threadIdx.x; i < a.row_words; i += blockDim.x) dst[i] = src[i];
}

template <typename Word>
Status LaunchCompact(const CompactArgs& a, int64_t rows, cudaStream_t stream) {
  int bx = 1;
  while (bx < a.row_words && bx < 256) bx <<= 1;
  const int by = 256 / bx;
  const int64_t grid = (rows + by - 1) / by;
  if (grid == 0) return Status::OK();
  if (grid > 0x7fffffff) return Status::InvalidArgument("compaction too large for one launch");
  KVPOOL_CUDA_CLEAR_STALE_ERROR();
  CompactKernel<Word><<<static_cast<unsigned>(grid), dim3(bx, by), 0, stream>>>(a);
  KVPOOL_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

template <DType D>
Status LaunchScores(const ScoreArgs& a, int layers, cudaStream_t stream) {
  const size_t stats_smem = static_cast<size_t>(a.dim) * sizeof(float);
  KVPOOL_CUDA_CLEAR_STALE_ERROR();
  SoftmaxStatsKernel<D><<<dim3(a.nq, a.hq, layers), 128, stats_smem, stream>>>(a);
  KVPOOL_CUDA_CHECK_LAUNCH();
  const int halo = a.pool ? a.kernel_size / 2 : 0;
  const size_t score_smem =
      (kScoreTile + 2 * halo + 8 * static_cast<size_t>(a.dim)) * sizeof(float);
  if (score_smem > 48 * 1024) {
    KVPOOL_CUDA_CHECK(cudaFuncSetAttribute(
        ScoreKernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(score_smem)));
  }
  ScoreKernel<D><<<dim3(CeilDiv(a.scored, kScoreTile), a.hk, layers), 256, score_smem, stream>>>(a);
  KVPOOL_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

}  // namespace

Status ComputeScoresCuda(const CompressParams& params, const AttentionShape& s, const void* q,
                         const void* kv, float* scores, void* stream_ptr) {
  KVPOOL_RETURN_IF_ERROR(ValidateCompress(params, s));
  if (!NeedsScores(params, s)) return Status::OK();
  if (q == nullptr || kv == nullptr || scores == nullptr) {
    return Status::InvalidArgument("ComputeScores: null buffer");
  }
  if (s.num_layers > 65535 || s.num_q_heads > 65535) {
    return Status::InvalidArgument("ComputeScoresCuda: too many layers or heads for one grid");
  }
  const ScopedDevice on(DeviceOfPointer(kv));
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  ScoreArgs a{};
  a.q = q;
  a.kv = kv;
  a.scores = scores;
  a.n = s.seq_len;
  a.nq = QueryTokens(params, s);
  a.scored = ScoredTokens(params, s);
  a.hq = s.num_q_heads;
  a.hk = s.num_kv_heads;
  a.dim = s.head_dim;
  a.group = s.num_q_heads / s.num_kv_heads;
  a.kernel_size = params.kernel_size;
  a.pool = params.method == CompressMethod::kSnapKv || params.method == CompressMethod::kPyramidKv;
  a.avg = params.pooling == Pooling::kAvgPool;
  a.inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  const size_t stats_bytes = static_cast<size_t>(s.num_layers) * a.hq * a.nq * sizeof(float2);
  void* stats = nullptr;
  // Stream-ordered where the device has memory pools; a plain allocation where it has not (as
  // device_checksum.cu).
  const bool pooled = cudaMallocAsync(&stats, stats_bytes, stream) == cudaSuccess;
  if (!pooled) {
    cudaGetLastError();
    KVPOOL_CUDA_CHECK(cudaMalloc(&stats, stats_bytes));
  }
  a.stats = static_cast<float2*>(stats);
  Status st;
  switch (s.dtype) {
    case DType::kFloat16:
      st = LaunchScores<DType::kFloat16>(a, s.num_layers, stream);
      break;
    case DType::kBFloat16:
      st = LaunchScores<DType::kBFloat16>(a, s.num_layers, stream);
      break;
    case DType::kFloat32:
      st = LaunchScores<DType::kFloat32>(a, s.num_layers, stream);
      break;
  }
  if (pooled) {
    KVPOOL_CUDA_CHECK(cudaFreeAsync(stats, stream));
  } else {
    const cudaError_t synced = cudaStreamSynchronize(stream);  // the kernels that use it first
    cudaFree(stats);
    KVPOOL_CUDA_CHECK(synced);
  }
  return st;
}

Status SelectTokensCuda(const CompressParams& params, const AttentionShape& s, const float* scores,
                        int32_t* indices, void* stream_ptr) {
  KVPOOL_ASSIGN_OR_RETURN(std::vector<int> keep, KeepCounts(params, s));
  if (indices == nullptr) return Status::InvalidArgument("SelectTokens: null indices");
  if (NeedsScores(params, s) && scores == nullptr) {
    return Status::InvalidArgument("SelectTokens: null scores");
  }
  if (s.num_kv_heads > 65535) return Status::InvalidArgument("too many kv heads for one grid");
  const ScopedDevice on(DeviceOfPointer(indices));
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  int64_t offset = 0;
  for (int l0 = 0; l0 < s.num_layers; l0 += kLayersPerLaunch) {
    SelectArgs a{};
    const int layers = std::min(kLayersPerLaunch, s.num_layers - l0);
    for (int i = 0; i < layers; ++i) {
      a.keep[i] = keep[l0 + i];
      a.offset[i] = offset;
      offset += static_cast<int64_t>(keep[l0 + i]) * s.num_kv_heads;
    }
    a.scores = scores;
    a.indices = indices;
    a.layer_base = l0;
    a.n = s.seq_len;
    a.scored = ScoredTokens(params, s);
    a.hk = s.num_kv_heads;
    a.window = params.window_size;
    a.sink = params.sink_size;
    a.streaming = params.method == CompressMethod::kStreamingLlm;
    KVPOOL_CUDA_CLEAR_STALE_ERROR();
    SelectKernel<<<dim3(s.num_kv_heads, layers), kSelectThreads, 0, stream>>>(a);
    KVPOOL_CUDA_CHECK_LAUNCH();
  }
  return Status::OK();
}

Status CompactKvCuda(const AttentionShape& s, const int* keep_counts, const int32_t* indices,
                     const void* kv, void* kv_out, void* stream_ptr) {
  if (s.num_layers < 1 || s.num_layers > kMaxLayers || s.seq_len < 1 || s.num_kv_heads < 1 ||
      s.num_kv_heads > kMaxKvHeads || s.head_dim < 1 || s.head_dim > kMaxHeadDim) {
    return Status::InvalidArgument("CompactKv: shape out of range");
  }
  if (!IsKnownDType(s.dtype)) return Status::InvalidArgument("CompactKv: unknown dtype");
  if (keep_counts == nullptr || indices == nullptr || kv == nullptr || kv_out == nullptr) {
    return Status::InvalidArgument("CompactKv: null buffer");
  }
  for (int l = 0; l < s.num_layers; ++l) {
    if (keep_counts[l] < 0 || keep_counts[l] > s.seq_len) {
      return Status::InvalidArgument("CompactKv: keep count out of range");
    }
  }
  const ScopedDevice on(DeviceOfPointer(kv));
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const size_t row_bytes = static_cast<size_t>(s.head_dim) * DTypeSize(s.dtype);
  const uintptr_t align =
      row_bytes | reinterpret_cast<uintptr_t>(kv) | reinterpret_cast<uintptr_t>(kv_out);
  if (align % 2 != 0) {
    // A misaligned access would fault on the GPU and poison the context (the CPU twin copes).
    return Status::InvalidArgument("CompactKvCuda: kv and kv_out must be 2-byte aligned");
  }
  const int word = (align % 16 == 0) ? 16 : (align % 8 == 0) ? 8 : (align % 4 == 0) ? 4 : 2;
  int64_t cum = 0;
  for (int l0 = 0; l0 < s.num_layers; l0 += kLayersPerLaunch) {
    CompactArgs a{};
    a.layers = std::min(kLayersPerLaunch, s.num_layers - l0);
    a.cum[0] = cum;
    for (int i = 0; i < a.layers; ++i) {
      a.keep[i] = keep_counts[l0 + i];
      cum += keep_counts[l0 + i];
      a.cum[i + 1] = cum;
    }
    a.kv = kv;
    a.out = kv_out;
    a.indices = indices;
    a.layer_base = l0;
    a.n = s.seq_len;
    a.hk = s.num_kv_heads;
    a.row_words = static_cast<int>(row_bytes / word);
    const int64_t rows = 2 * static_cast<int64_t>(s.num_kv_heads) * (a.cum[a.layers] - a.cum[0]);
    Status st;
    switch (word) {
      case 16:
        st = LaunchCompact<uint4>(a, rows, stream);
        break;
      case 8:
        st = LaunchCompact<uint2>(a, rows, stream);
        break;
      case 4:
        st = LaunchCompact<uint32_t>(a, rows, stream);
        break;
      default:
        st = LaunchCompact<uint16_t>(a, rows, stream);
        break;
    }
    KVPOOL_RETURN_IF_ERROR(st);
  }
  return Status::OK();
}

}  // namespace kernels
}  // namespace kvpool
