#pragma once
// Helpers shared by the kernels' unit tests, the needle tool, the CPU bench and the GPU check:
// deterministic random KV data (plain Gaussian and "realistic" with outlier channels), error
// norms and 16-bit float buffers. Not part of the kernels' API.
//
// Thread safety: pure functions over caller-owned buffers.

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/dtype.h"

namespace kvpool {
namespace kernels {
namespace testutil {

// Standard normal values (times `stddev`), rounded to `dtype`. Never all zero.
void FillNormal(uint16_t* out, size_t n, DType dtype, uint64_t seed, float stddev = 1.0f);

// Values shaped like real K/V rows of `head_dim` elements: N(0, 1) with a few fixed outlier
// channels (about 3% of head_dim) scaled by 10-30x and a per-row magnitude that varies 0.5-2x
// (K caches show such channels; KIVI / KVQuant). Rounded to `dtype`.
void FillRealistic(uint16_t* out, size_t n, int head_dim, DType dtype, uint64_t seed);

// ||out - ref|| / ||ref|| over n elements of `dtype` (L2 norms, in double).
double RelativeError(const uint16_t* out, const uint16_t* ref, size_t n, DType dtype);
double RelativeError(const float* out, const float* ref, size_t n);

// Number of NaN elements.
size_t CountNaN(const uint16_t* p, size_t n, DType dtype);

std::vector<float> ToFloat(const uint16_t* p, size_t n, DType dtype);

}  // namespace testutil
}  // namespace kernels
}  // namespace kvpool
