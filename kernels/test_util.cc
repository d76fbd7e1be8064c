#include "kernels/test_util.h"

#include <cmath>

namespace kvpool {
namespace kernels {
namespace testutil {

void FillNormal(void* out, size_t n, DType dtype, uint64_t seed, float stddev) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  for (size_t i = 0; i < n; ++i) StoreElement(out, i, normal(rng), dtype);
  if (n > 0) StoreElement(out, 0, stddev, dtype);  // never an all-zero buffer
}

void FillRealistic(void* out, size_t n, int head_dim, DType dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  // Outlier channels are fixed per seed (they belong to the model, not the token).
  std::vector<float> channel_gain(head_dim, 1.0f);
  const int outliers = std::max(1, head_dim / 32);
  for (int i = 0; i < outliers; ++i) {
    channel_gain[rng() % head_dim] = 10.0f + 20.0f * uni(rng);
  }
  float row_gain = 1.0f;
  for (size_t i = 0; i < n; ++i) {
    const int d = static_cast<int>(i % head_dim);
    if (d == 0) row_gain = 0.5f + 1.5f * uni(rng);
    StoreElement(out, i, normal(rng) * row_gain * channel_gain[d], dtype);
  }
  if (n > 0) StoreElement(out, 0, 1.0f, dtype);
}

double RelativeError(const void* out, const void* ref, size_t n, DType dtype) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double r = LoadElement(ref, i, dtype);
    const double o = LoadElement(out, i, dtype);
    num += (o - r) * (o - r);
    den += r * r;
  }
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}

double RelativeError(const float* out, const float* ref, size_t n) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(out[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}

size_t CountNaN(const void* p, size_t n, DType dtype) {
  size_t c = 0;
  for (size_t i = 0; i < n; ++i) c += std::isnan(LoadElement(p, i, dtype)) ? 1 : 0;
  return c;
}

std::vector<float> ToFloat(const void* p, size_t n, DType dtype) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = LoadElement(p, i, dtype);
  return v;
}

std::vector<uint16_t> Convert(const void* p, size_t n, DType from, DType to) {
  std::vector<uint16_t> out = Buffer(n, to);
  for (size_t i = 0; i < n; ++i) StoreElement(out.data(), i, LoadElement(p, i, from), to);
  return out;
}

}  // namespace testutil
}  // namespace kernels
}  // namespace kvpool
