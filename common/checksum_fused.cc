// CopyWithChecksumFused (common/checksum_fused.h): XXH3-64's long-input loop, as libxxhash 0.8
// runs it (`XXH3_hashLong_64b_internal` with the default secret), with the copy of each stripe
// folded in. The accumulate and scramble steps, the secret and the final merge are libxxhash's
// own, taken from its header (XXH_INLINE_ALL: every xxhash function in this file is static);
// only the loop that drives them over the stripes is written here.

#include "common/checksum_fused.h"

#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#define XXH_INLINE_ALL
#define XXH_DISPATCH_AVX2 1  // its AVX2 steps, compiled for AVX2 alone (below)
#define XXH_TARGET_AVX2 __attribute__((__target__("avx2")))
#include <xxhash.h>
#endif

namespace kvpool::internal {

#if defined(__x86_64__)

namespace {

// One 64-byte stripe: copied (`kStream`: non-temporal stores to an aligned `d`), then
// accumulated from the source (in L1 now).
template <bool kStream>
__attribute__((target("avx2"), always_inline)) inline void CopyStripe(xxh_u64* acc, uint8_t* d,
                                                                      const uint8_t* s,
                                                                      const uint8_t* secret) {
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
  const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 32));
  if constexpr (kStream) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d), lo);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 32), hi);
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d), lo);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + 32), hi);
  }
  XXH3_accumulate_512_avx2(acc, s, secret);
}

template <bool kStream>
__attribute__((target("avx2"))) uint64_t CopyAndHash(uint8_t* d, const uint8_t* s, size_t length) {
  const uint8_t* const secret = XXH3_kSecret;
  constexpr size_t kSecretBytes = sizeof(XXH3_kSecret);
  constexpr size_t kStripesPerBlock = (kSecretBytes - XXH_STRIPE_LEN) / XXH_SECRET_CONSUME_RATE;
  constexpr size_t kBlockBytes = XXH_STRIPE_LEN * kStripesPerBlock;
  alignas(64) xxh_u64 acc[XXH_ACC_NB] = XXH3_INIT_ACC;  // the AVX2 steps need 32
  size_t off = 0;
  // Whole blocks of stripes, each followed by a scramble.
  const size_t blocks = (length - 1) / kBlockBytes;
  for (size_t b = 0; b < blocks; ++b) {
    for (size_t n = 0; n < kStripesPerBlock; ++n, off += XXH_STRIPE_LEN) {
      CopyStripe<kStream>(acc, d + off, s + off, secret + n * XXH_SECRET_CONSUME_RATE);
    }
    XXH3_scrambleAcc_avx2(acc, secret + kSecretBytes - XXH_STRIPE_LEN);
  }
  // The whole stripes of the last, partial block that end before its last byte; the bytes after
  // them are copied as they are, and hashed by the final stripe.
  const size_t stripes = ((length - 1) - kBlockBytes * blocks) / XXH_STRIPE_LEN;
  for (size_t n = 0; n < stripes; ++n, off += XXH_STRIPE_LEN) {
    CopyStripe<kStream>(acc, d + off, s + off, secret + n * XXH_SECRET_CONSUME_RATE);
  }
  std::memcpy(d + off, s + off, length - off);
  if constexpr (kStream) _mm_sfence();  // the stream stores are seen before what follows
  // The last 64 bytes, overlapping what came before, with their own part of the secret.
  XXH3_accumulate_512_avx2(acc, s + length - XXH_STRIPE_LEN,
                           secret + kSecretBytes - XXH_STRIPE_LEN - XXH_SECRET_LASTACC_START);
  return XXH3_mergeAccs(acc, secret + XXH_SECRET_MERGEACCS_START,
                        static_cast<xxh_u64>(length) * XXH_PRIME64_1);
}

}  // namespace

bool CanCopyWithChecksumFused() {
  static const bool avx2 = [] {
    __builtin_cpu_init();  // also where this runs before the constructors that would call it
    return __builtin_cpu_supports("avx2") != 0;  // the CPU has it and the OS saves its registers
  }();
  return avx2;
}

uint64_t CopyWithChecksumFused(void* dst, const void* src, size_t length, bool stream) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  return stream ? CopyAndHash<true>(d, s, length) : CopyAndHash<false>(d, s, length);
}

#else  // not x86-64: the chunked form only

bool CanCopyWithChecksumFused() { return false; }

uint64_t CopyWithChecksumFused(void*, const void*, size_t, bool) { return 0; }

#endif

}  // namespace kvpool::internal
