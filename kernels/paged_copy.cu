// CUDA paged gather/scatter.
//
// Budget: a pure copy; it should reach the device-to-device memcpy bandwidth of the same bytes
// (target >= 0.7x, measured by kvpool-kernel-check). One thread moves 16-byte words of a token
// row (kv_heads * head_dim elements, contiguous on both sides); a CTA covers 256 threads' worth
// of rows, and one launch covers up to 64 layers and 128 payloads (kernel parameters carry the
// pointer arrays, so no device-side pointer table and no allocation).

#include <cstdint>

#include "kernels/cuda_check.h"
#include "kernels/cuda_dtype.cuh"
#include "kernels/paged_copy.h"

namespace kvpool {
namespace kernels {
namespace {

constexpr int kLayersPerLaunch = 64;
constexpr int kPayloadsPerLaunch = 128;

struct PagedArgs {
  void* k[kLayersPerLaunch];
  void* v[kLayersPerLaunch];
  void* payload[kPayloadsPerLaunch];
  const int32_t* table;
  int64_t first_token;  // sequence token of payload 0's first token (this launch)
  int64_t total_rows;   // payloads * layers * 2 * tokens
  int layers;           // layers in this launch
  int layer_base;       // index of this launch's first layer in the payload
  int tokens;           // per payload
  int block_size;
  int num_blocks;
  int row_words;  // row bytes / sizeof(Word)
  PagedLayout layout;
};

template <typename Word, bool kGather>
__global__ void PagedCopyKernel(const PagedArgs a) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= a.total_rows) return;
  const int t = static_cast<int>(row % a.tokens);
  int64_t rest = row / a.tokens;
  const int kv = static_cast<int>(rest % 2);
  rest /= 2;
  const int l = static_cast<int>(rest % a.layers);
  const int p = static_cast<int>(rest / a.layers);
  const int64_t token = a.first_token + static_cast<int64_t>(p) * a.tokens + t;
  const int32_t page = a.table[token / a.block_size];
  if (page < 0 || page >= a.num_blocks) return;  // documented: left unwritten
  const int64_t slot = token % a.block_size;
  const int64_t rw = a.row_words;
  Word* engine;
  switch (a.layout) {
    case PagedLayout::kSeparate:
      engine = static_cast<Word*>(kv == 0 ? a.k[l] : a.v[l]) +
               (static_cast<int64_t>(page) * a.block_size + slot) * rw;
      break;
    case PagedLayout::kKvFirst:
      engine = static_cast<Word*>(a.k[l]) +
               ((static_cast<int64_t>(kv) * a.num_blocks + page) * a.block_size + slot) * rw;
      break;
    default:  // kKvInterleaved
      engine = static_cast<Word*>(a.k[l]) +
               ((static_cast<int64_t>(page) * 2 + kv) * a.block_size + slot) * rw;
      break;
  }
  Word* ours = static_cast<Word*>(a.payload[p]) +
               ((static_cast<int64_t>(a.layer_base + l) * 2 + kv) * a.tokens + t) * rw;
  Word* dst = kGather ? ours : engine;
  const Word* src = kGather ? engine : ours;
  for (int i = threadIdx.x; i < a.row_words; i += blockDim.x) dst[i] = src[i];
}

template <typename Word, bool kGather>
Status Launch(const PagedArgs& a, cudaStream_t stream) {
  int bx = 1;
  while (bx < a.row_words && bx < 256) bx <<= 1;
  const int by = 256 / bx;
  const dim3 block(bx, by);
  const int64_t grid = (a.total_rows + by - 1) / by;
  if (grid > 0x7fffffff) return Status::InvalidArgument("paged copy too large for one launch");
  KVPOOL_CUDA_CLEAR_STALE_ERROR();
  PagedCopyKernel<Word, kGather><<<static_cast<unsigned>(grid), block, 0, stream>>>(a);
  KVPOOL_CUDA_CHECK_LAUNCH();
  return Status::OK();
}

template <bool kGather>
Status PagedCopyCuda(const PagedKvCache& c, const BlockLayout& pl, const PagedSpan& span,
                     void* const* payloads, cudaStream_t stream) {
  if (span.num_payloads == 0) return Status::OK();
  if (payloads == nullptr) return Status::InvalidArgument("payloads is null");
  const size_t row_bytes = static_cast<size_t>(c.num_kv_heads) * c.head_dim * DTypeSize(c.dtype);
  // The widest word that divides the row and every base address.
  uintptr_t align = row_bytes;
  for (int l = 0; l < c.num_layers; ++l) {
    align |= reinterpret_cast<uintptr_t>(c.k_layers[l]);
    if (c.layout == PagedLayout::kSeparate) align |= reinterpret_cast<uintptr_t>(c.v_layers[l]);
  }
  for (int i = 0; i < span.num_payloads; ++i) {
    if (payloads[i] == nullptr) return Status::InvalidArgument("payload pointer is null");
    align |= reinterpret_cast<uintptr_t>(payloads[i]);
  }
  if (align % 2 != 0) {
    // A misaligned access would fault on the GPU and poison the context (the CPU twin copes).
    return Status::InvalidArgument("paged copy: KV tensors and payloads must be 2-byte aligned");
  }
  const int word = (align % 16 == 0) ? 16 : (align % 8 == 0) ? 8 : (align % 4 == 0) ? 4 : 2;

  for (int p0 = 0; p0 < span.num_payloads; p0 += kPayloadsPerLaunch) {
    const int np = std::min(kPayloadsPerLaunch, span.num_payloads - p0);
    for (int l0 = 0; l0 < c.num_layers; l0 += kLayersPerLaunch) {
      PagedArgs a{};
      a.layers = std::min(kLayersPerLaunch, c.num_layers - l0);
      for (int l = 0; l < a.layers; ++l) {
        a.k[l] = c.k_layers[l0 + l];
        a.v[l] = c.layout == PagedLayout::kSeparate ? c.v_layers[l0 + l] : nullptr;
      }
      for (int i = 0; i < np; ++i) a.payload[i] = payloads[p0 + i];
      a.table = span.block_table;
      a.first_token = span.first_token + static_cast<int64_t>(p0) * pl.tokens;
      a.total_rows = static_cast<int64_t>(np) * a.layers * 2 * pl.tokens;
      a.layer_base = l0;
      a.tokens = pl.tokens;
      a.block_size = c.block_size;
      a.num_blocks = c.num_blocks;
      a.row_words = static_cast<int>(row_bytes / word);
      a.layout = c.layout;
      Status st;
      switch (word) {
        case 16:
          st = Launch<uint4, kGather>(a, stream);
          break;
        case 8:
          st = Launch<uint2, kGather>(a, stream);
          break;
        case 4:
          st = Launch<uint32_t, kGather>(a, stream);
          break;
        default:
          st = Launch<uint16_t, kGather>(a, stream);
          break;
      }
      KVPOOL_RETURN_IF_ERROR(st);
    }
  }
  return Status::OK();
}

}  // namespace

Status GatherPagedCuda(const PagedKvCache& cache, const BlockLayout& payload_layout,
                       const PagedSpan& span, void* const* payloads, void* stream) {
  KVPOOL_RETURN_IF_ERROR(ValidatePagedCopy(cache, payload_layout, span));
  const ScopedDevice on(DeviceOfPointer(cache.num_layers > 0 ? cache.k_layers[0] : nullptr));
  return PagedCopyCuda<true>(cache, payload_layout, span, payloads,
                             static_cast<cudaStream_t>(stream));
}

Status ScatterPagedCuda(const PagedKvCache& cache, const BlockLayout& payload_layout,
                        const PagedSpan& span, const void* const* payloads, void* stream) {
  KVPOOL_RETURN_IF_ERROR(ValidatePagedCopy(cache, payload_layout, span));
  const ScopedDevice on(DeviceOfPointer(cache.num_layers > 0 ? cache.k_layers[0] : nullptr));
  // The scatter only reads payloads; the cast shares the launch code with the gather.
  return PagedCopyCuda<false>(cache, payload_layout, span, const_cast<void* const*>(payloads),
                              static_cast<cudaStream_t>(stream));
}

}  // namespace kernels
}  // namespace kvpool
