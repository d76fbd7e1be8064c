#pragma once
// Helpers shared by the kernels' unit tests, the needle tool, the CPU bench and the GPU check:
// deterministic random KV data (plain Gaussian and "realistic" with outlier channels), error
// norms and element buffers of any DType (16-bit words, two per fp32 element). Not part of the
// kernels' API.
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
void FillNormal(void* out, size_t n, DType dtype, uint64_t seed, float stddev = 1.0f);

// Values shaped like real K/V rows of `head_dim` elements: N(0, 1) with a few fixed outlier
// channels (about 3% of head_dim) scaled by 10-30x and a per-row magnitude that varies 0.5-2x
// (K caches show such channels; KIVI / KVQuant). Rounded to `dtype`.
void FillRealistic(void* out, size_t n, int head_dim, DType dtype, uint64_t seed);

// ||out - ref|| / ||ref|| over n elements of `dtype` (L2 norms, in double).
double RelativeError(const void* out, const void* ref, size_t n, DType dtype);
double RelativeError(const float* out, const float* ref, size_t n);

// n counts elements of dtype throughout. Number of NaN elements.
size_t CountNaN(const void* p, size_t n, DType dtype);

std::vector<float> ToFloat(const void* p, size_t n, DType dtype);

// A zeroed buffer for n elements of dtype, as 16-bit words (n * DTypeSize / 2 of them).
inline std::vector<uint16_t> Buffer(size_t n, DType dtype, uint16_t fill = 0) {
  return std::vector<uint16_t>(n * (DTypeSize(dtype) / 2), fill);
}
// n elements of `from` converted to `to` (exact when `to` is wider), as 16-bit words.
std::vector<uint16_t> Convert(const void* p, size_t n, DType from, DType to);

}  // namespace testutil
}  // namespace kernels
}  // namespace kvpool
