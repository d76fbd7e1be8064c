#pragma once
// Test-only KV blocks for the tiers' encoding tests: a small model's block layout and fp16 bytes
// shaped like a KV cache's, from a seed. Stateless; any thread.

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/block_layout.h"
#include "kernels/dtype.h"

namespace kvpool::tiers {

// A small model's block: 2 layers, 2 KV heads of 64, 16 tokens, fp16 (16 KiB raw).
inline kernels::BlockLayout SmallLayout() {
  kernels::BlockLayout l;
  l.num_layers = 2;
  l.num_kv_heads = 2;
  l.head_dim = 64;
  l.tokens = 16;
  l.dtype = kernels::DType::kFloat16;
  return l;
}

// fp16 values like a KV cache's (roughly normal), one block of `l`, from a seed.
inline std::vector<uint8_t> KvBytes(const kernels::BlockLayout& l, uint64_t seed) {
  std::vector<uint8_t> out(kernels::RawBytes(l));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  for (size_t i = 0; i + 1 < out.size(); i += 2) {
    const uint16_t h = kernels::FloatToHalf(normal(rng));
    std::memcpy(out.data() + i, &h, 2);
  }
  return out;
}

}  // namespace kvpool::tiers
