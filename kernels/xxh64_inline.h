#pragma once
// XXH64 (Yann Collet's xxHash, 64-bit variant, as its specification defines it), written once
// for both sides: compiled by the host compiler for the CPU twin of the device checksum and by
// nvcc (__host__ __device__) for its CUDA kernel, so both compute the same bits from the same
// code. kernels/device_checksum_test.cc checks it against libxxhash's XXH64 on every length
// class (0-3, 4-7, 8-31, 32+ bytes), unaligned starts and several seeds.
//
// Written here rather than taken from libxxhash because the device side needs it as device code;
// kept C++17 (nvcc's dialect here) and free of any library.
//
// Thread safety: pure functions.

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/host_device.h"

namespace kvpool::kernels::xxh64 {

constexpr uint64_t kPrime1 = 0x9E3779B185EBCA87ull;
constexpr uint64_t kPrime2 = 0xC2B2AE3D27D4EB4Full;
constexpr uint64_t kPrime3 = 0x165667B19E3779F9ull;
constexpr uint64_t kPrime4 = 0x85EBCA77C2B2AE63ull;
constexpr uint64_t kPrime5 = 0x27D4EB2F165667C5ull;

KVPOOL_HOST_DEVICE uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// Little-endian loads at any alignment (every target kvpool builds for is little endian).
// On the device an aligned pointer (every chunk of a slot-aligned block) is read with one load;
// memcpy there would read byte by byte, since the compiler cannot see the alignment.
KVPOOL_HOST_DEVICE uint64_t Load64(const uint8_t* p) {
#ifdef __CUDA_ARCH__
  if ((reinterpret_cast<uintptr_t>(p) & 7) == 0) return *reinterpret_cast<const uint64_t*>(p);
#endif
  uint64_t v;
  memcpy(&v, p, sizeof(v));
  return v;
}
KVPOOL_HOST_DEVICE uint32_t Load32(const uint8_t* p) {
#ifdef __CUDA_ARCH__
  if ((reinterpret_cast<uintptr_t>(p) & 3) == 0) return *reinterpret_cast<const uint32_t*>(p);
#endif
  uint32_t v;
  memcpy(&v, p, sizeof(v));
  return v;
}

KVPOOL_HOST_DEVICE uint64_t Round(uint64_t acc, uint64_t input) {
  acc += input * kPrime2;
  acc = Rotl(acc, 31);
  return acc * kPrime1;
}

KVPOOL_HOST_DEVICE uint64_t MergeRound(uint64_t acc, uint64_t val) {
  acc ^= Round(0, val);
  return acc * kPrime1 + kPrime4;
}

KVPOOL_HOST_DEVICE uint64_t Avalanche(uint64_t h) {
  h ^= h >> 33;
  h *= kPrime2;
  h ^= h >> 29;
  h *= kPrime3;
  h ^= h >> 32;
  return h;
}

// XXH64 of `len` bytes at `p` with `seed`.
KVPOOL_HOST_DEVICE uint64_t Hash(const uint8_t* p, size_t len, uint64_t seed) {
  const uint8_t* const end = p + len;
  uint64_t h;
  if (len >= 32) {
    const uint8_t* const limit = end - 32;
    uint64_t v1 = seed + kPrime1 + kPrime2;
    uint64_t v2 = seed + kPrime2;
    uint64_t v3 = seed;
    uint64_t v4 = seed - kPrime1;
    do {
      v1 = Round(v1, Load64(p));
      v2 = Round(v2, Load64(p + 8));
      v3 = Round(v3, Load64(p + 16));
      v4 = Round(v4, Load64(p + 24));
      p += 32;
    } while (p <= limit);
    h = Rotl(v1, 1) + Rotl(v2, 7) + Rotl(v3, 12) + Rotl(v4, 18);
    h = MergeRound(h, v1);
    h = MergeRound(h, v2);
    h = MergeRound(h, v3);
    h = MergeRound(h, v4);
  } else {
    h = seed + kPrime5;
  }
  h += static_cast<uint64_t>(len);
  while (end - p >= 8) {
    h ^= Round(0, Load64(p));
    h = Rotl(h, 27) * kPrime1 + kPrime4;
    p += 8;
  }
  if (end - p >= 4) {
    h ^= static_cast<uint64_t>(Load32(p)) * kPrime1;
    h = Rotl(h, 23) * kPrime2 + kPrime3;
    p += 4;
  }
  while (p < end) {
    h ^= static_cast<uint64_t>(*p) * kPrime5;
    h = Rotl(h, 11) * kPrime1;
    ++p;
  }
  return Avalanche(h);
}

}  // namespace kvpool::kernels::xxh64
