#include "common/checksum.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>
#if defined(__x86_64__)
// libxxhash's runtime dispatch picks the widest vector unit the CPU has (AVX2 hashes ~47 GB/s
// here, the baseline SSE2 build ~20 GB/s): the checksum stays cheaper than the copy it guards.
#include <xxh_x86dispatch.h>
#endif

#include <algorithm>
#include <cstring>

namespace kvpool {

uint64_t BlockChecksum(const void* data, size_t length) { return XXH3_64bits(data, length); }

uint64_t CopyWithChecksum(void* dst, const void* src, size_t length) {
  constexpr size_t kChunk = 64 * 1024;  // stays in L2 between the copy and the hash
  if (length <= kChunk) {
    std::memcpy(dst, src, length);
    return XXH3_64bits(dst, length);
  }
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  for (size_t done = 0; done < length; done += kChunk) {
    const size_t n = std::min(kChunk, length - done);
    std::memcpy(d + done, s + done, n);
    XXH3_64bits_update(&state, d + done, n);
  }
  return XXH3_64bits_digest(&state);
}

}  // namespace kvpool
