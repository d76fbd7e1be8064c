#include "common/checksum.h"

#include "common/checksum_fused.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>
#if defined(__x86_64__)
// libxxhash's runtime dispatch picks the widest vector unit the CPU has (AVX2 hashes ~47 GB/s
// here, the baseline SSE2 build ~20 GB/s): the checksum stays cheaper than the copy it guards.
#include <xxh_x86dispatch.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace kvpool {

uint64_t BlockChecksum(const void* data, size_t length) { return XXH3_64bits(data, length); }

namespace {

// glibc copies a few KiB and more with `rep movsb`, which on this AMD EPYC runs at a sixth of its
// speed (2.9 GB/s instead of 17) when the destination is 1 to 31 bytes past the source modulo
// 4 KiB, as it is for a buffer from malloc (16 bytes into its page) filled from a page-aligned
// arena slot. Copied in pieces below glibc's `rep movsb` threshold instead, such a copy takes
// glibc's vector loop: 13.5 GB/s there. Any other distance keeps the plain memcpy.
void Copy(uint8_t* d, const uint8_t* s, size_t n) {
  constexpr size_t kPiece = 2048;
  const uintptr_t distance =
      (reinterpret_cast<uintptr_t>(d) - reinterpret_cast<uintptr_t>(s)) & 4095;
  if (distance == 0 || distance >= 64 || n <= kPiece) {
    std::memcpy(d, s, n);
    return;
  }
  for (size_t done = 0; done < n; done += kPiece) {
    std::memcpy(d + done, s + done, std::min(kPiece, n - done));
  }
}

}  // namespace

uint64_t CopyWithChecksum(void* dst, const void* src, size_t length, CopyCache cache) {
  if (length >= internal::kFusedMinBytes && internal::CanCopyWithChecksumFused()) {
    // One pass: 1.03-1.14x a memcpy here, against 1.08-1.29x for the chunks below; with
    // kBypass 0.84-0.89x (docs/BENCHMARKS.md).
    const bool stream = cache == CopyCache::kBypass && reinterpret_cast<uintptr_t>(dst) % 32 == 0;
    return internal::CopyWithChecksumFused(dst, src, length, stream);
  }
  constexpr size_t kChunk = 64 * 1024;  // stays in L2 between the copy and the hash
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  if (length <= kChunk) {
    Copy(d, s, length);
    return XXH3_64bits(dst, length);
  }
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  for (size_t done = 0; done < length; done += kChunk) {
    const size_t n = std::min(kChunk, length - done);
    Copy(d + done, s + done, n);
    XXH3_64bits_update(&state, d + done, n);
  }
  return XXH3_64bits_digest(&state);
}

}  // namespace kvpool
