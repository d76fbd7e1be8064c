#pragma once
// CopyWithChecksum's one-pass form (common/checksum.cc): each 64-byte stripe is loaded once,
// stored to the destination and fed to XXH3's accumulator while still in registers or L1, where
// the chunked form copies 64 KiB and then reads it back to hash it. Byte-identical to
// XXH3_64bits (common_test checks every length and alignment against libxxhash).
// Thread safety: pure functions.

#include <cstddef>
#include <cstdint>

namespace kvpool::internal {

// Whether CopyWithChecksumFused may run on this CPU (x86-64 with AVX2).
bool CanCopyWithChecksumFused();

// Lengths above XXH3's 240-byte mid-size limit only (shorter inputs hash another way).
inline constexpr size_t kFusedMinBytes = 241;

// Copies `length` (>= kFusedMinBytes) bytes from `src` to `dst` and returns their XXH3-64.
// Only where CanCopyWithChecksumFused(). With `stream` (`dst` must be 32-byte aligned) the
// stores are non-temporal, and fenced before it returns.
uint64_t CopyWithChecksumFused(void* dst, const void* src, size_t length, bool stream);

}  // namespace kvpool::internal
