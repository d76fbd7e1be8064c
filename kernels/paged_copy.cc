// CPU twin of the paged gather/scatter, plus validation and device dispatch.
//
// Budget: a gather moves RawBytes per payload twice (read + write); the inner loop is one memcpy
// per run of consecutive tokens inside one engine page and one (layer, kv) plane, so it runs at
// memcpy speed once runs are a few KiB (block_size * kv_heads * head_dim * 2 bytes).

#include "kernels/paged_copy.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace kvpool {
namespace kernels {
namespace {

// Bytes of one token's row in a (layer, kv) plane: kv_heads * head_dim elements.
size_t RowBytes(const PagedKvCache& c) {
  return static_cast<size_t>(c.num_kv_heads) * c.head_dim * DTypeSize(c.dtype);
}

// Address of token `slot` of page `page` in (layer, kv) of the engine cache.
inline uint8_t* PageRow(const PagedKvCache& c, int layer, int kv, int64_t page, int slot,
                        size_t row) {
  const size_t bs = static_cast<size_t>(c.block_size);
  switch (c.layout) {
    case PagedLayout::kSeparate: {
      auto* base = static_cast<uint8_t*>(kv == 0 ? c.k_layers[layer] : c.v_layers[layer]);
      return base + (page * bs + slot) * row;
    }
    case PagedLayout::kKvFirst: {
      auto* base = static_cast<uint8_t*>(c.k_layers[layer]);
      return base + ((static_cast<size_t>(kv) * c.num_blocks + page) * bs + slot) * row;
    }
    case PagedLayout::kKvInterleaved: {
      auto* base = static_cast<uint8_t*>(c.k_layers[layer]);
      return base + ((page * 2 + kv) * bs + slot) * row;
    }
  }
  return nullptr;
}

template <bool kGather>
Status CopyPagedCpu(const PagedKvCache& cache, const BlockLayout& pl, const PagedSpan& span,
                    uint8_t* const* payloads) {
  // Page ids are checked up front so a bad table writes nothing.
  const int64_t last_token = span.first_token + static_cast<int64_t>(span.num_payloads) * pl.tokens;
  for (int64_t p = span.first_token / cache.block_size; p * cache.block_size < last_token; ++p) {
    const int32_t page = span.block_table[p];
    if (page < 0 || page >= cache.num_blocks) {
      return Status::InvalidArgument("block_table[" + std::to_string(p) +
                                     "] = " + std::to_string(page) + " is outside [0, " +
                                     std::to_string(cache.num_blocks) + ")");
    }
  }
  const size_t row = RowBytes(cache);
  const size_t plane = static_cast<size_t>(pl.tokens) * row;
  for (int i = 0; i < span.num_payloads; ++i) {
    const int64_t t0 = span.first_token + static_cast<int64_t>(i) * pl.tokens;
    for (int layer = 0; layer < cache.num_layers; ++layer) {
      for (int kv = 0; kv < 2; ++kv) {
        uint8_t* dst_plane = payloads[i] + (static_cast<size_t>(layer) * 2 + kv) * plane;
        int t = 0;
        while (t < pl.tokens) {
          const int64_t token = t0 + t;
          const int64_t page = span.block_table[token / cache.block_size];
          const int slot = static_cast<int>(token % cache.block_size);
          const int run = std::min(pl.tokens - t, cache.block_size - slot);
          uint8_t* engine = PageRow(cache, layer, kv, page, slot, row);
          uint8_t* ours = dst_plane + static_cast<size_t>(t) * row;
          if (kGather) {
            std::memcpy(ours, engine, run * row);
          } else {
            std::memcpy(engine, ours, run * row);
          }
          t += run;
        }
      }
    }
  }
  return Status::OK();
}

}  // namespace

Status ValidatePagedCopy(const PagedKvCache& c, const BlockLayout& pl, const PagedSpan& span) {
  KVPOOL_RETURN_IF_ERROR(ValidateBlockLayout(pl));
  if (pl.encoding != Encoding::kRaw) {
    return Status::InvalidArgument("paged copies move raw payloads, not " +
                                   std::string(EncodingName(pl.encoding)));
  }
  if (c.num_layers != pl.num_layers || c.num_kv_heads != pl.num_kv_heads ||
      c.head_dim != pl.head_dim || c.dtype != pl.dtype) {
    return Status::InvalidArgument(
        "paged cache (layers, kv_heads, head_dim, dtype) = (" + std::to_string(c.num_layers) +
        ", " + std::to_string(c.num_kv_heads) + ", " + std::to_string(c.head_dim) + ", " +
        DTypeName(c.dtype) + ") does not match the payload layout (" +
        std::to_string(pl.num_layers) + ", " + std::to_string(pl.num_kv_heads) + ", " +
        std::to_string(pl.head_dim) + ", " + DTypeName(pl.dtype) + ")");
  }
  if (c.layout != PagedLayout::kSeparate && c.layout != PagedLayout::kKvFirst &&
      c.layout != PagedLayout::kKvInterleaved) {
    return Status::InvalidArgument("unknown paged layout");
  }
  if (c.num_blocks < 1 || c.block_size < 1 || c.block_size > kMaxTokensPerBlock) {
    return Status::InvalidArgument("paged cache needs num_blocks >= 1 and block_size in [1, 2^20]");
  }
  if (c.k_layers == nullptr || (c.layout == PagedLayout::kSeparate && c.v_layers == nullptr)) {
    return Status::InvalidArgument("paged cache layer pointer array is null");
  }
  for (int l = 0; l < c.num_layers; ++l) {
    if (c.k_layers[l] == nullptr ||
        (c.layout == PagedLayout::kSeparate && c.v_layers[l] == nullptr)) {
      return Status::InvalidArgument("paged cache layer " + std::to_string(l) + " is null");
    }
  }
  if (span.num_payloads < 0 || span.first_token < 0 || span.block_table_len < 0) {
    return Status::InvalidArgument("negative span");
  }
  if (span.num_payloads == 0) return Status::OK();
  if (span.block_table == nullptr) return Status::InvalidArgument("block_table is null");
  const int64_t end = span.first_token + static_cast<int64_t>(span.num_payloads) * pl.tokens;
  const int64_t pages_needed = (end + c.block_size - 1) / c.block_size;
  if (pages_needed > span.block_table_len) {
    return Status::InvalidArgument("span ends at token " + std::to_string(end) + ", past the " +
                                   std::to_string(span.block_table_len) + "-page block table");
  }
  return Status::OK();
}

Status GatherPagedCpu(const PagedKvCache& cache, const BlockLayout& payload_layout,
                      const PagedSpan& span, void* const* payloads) {
  KVPOOL_RETURN_IF_ERROR(ValidatePagedCopy(cache, payload_layout, span));
  if (span.num_payloads == 0) return Status::OK();
  if (payloads == nullptr) return Status::InvalidArgument("payloads is null");
  for (int i = 0; i < span.num_payloads; ++i) {
    if (payloads[i] == nullptr) return Status::InvalidArgument("payload pointer is null");
  }
  return CopyPagedCpu<true>(cache, payload_layout, span,
                            reinterpret_cast<uint8_t* const*>(payloads));
}

Status ScatterPagedCpu(const PagedKvCache& cache, const BlockLayout& payload_layout,
                       const PagedSpan& span, const void* const* payloads) {
  KVPOOL_RETURN_IF_ERROR(ValidatePagedCopy(cache, payload_layout, span));
  if (span.num_payloads == 0) return Status::OK();
  if (payloads == nullptr) return Status::InvalidArgument("payloads is null");
  for (int i = 0; i < span.num_payloads; ++i) {
    if (payloads[i] == nullptr) return Status::InvalidArgument("payload pointer is null");
  }
  // The scatter reads payloads: the const is cast away only to share the copy loop.
  return CopyPagedCpu<false>(
      cache, payload_layout, span,
      const_cast<uint8_t* const*>(reinterpret_cast<const uint8_t* const*>(payloads)));
}

Status GatherPaged(const ExecContext& ctx, const PagedKvCache& cache,
                   const BlockLayout& payload_layout, const PagedSpan& span,
                   void* const* payloads) {
  if (ctx.device == Device::kCuda) {
    return GatherPagedCuda(cache, payload_layout, span, payloads, ctx.stream);
  }
  return GatherPagedCpu(cache, payload_layout, span, payloads);
}

Status ScatterPaged(const ExecContext& ctx, const PagedKvCache& cache,
                    const BlockLayout& payload_layout, const PagedSpan& span,
                    const void* const* payloads) {
  if (ctx.device == Device::kCuda) {
    return ScatterPagedCuda(cache, payload_layout, span, payloads, ctx.stream);
  }
  return ScatterPagedCpu(cache, payload_layout, span, payloads);
}

}  // namespace kernels
}  // namespace kvpool
