#pragma once
// Block checksums: xxh3-64 over the payload bytes. Written with every block and verified on
// every read from disk and every transfer between processes or nodes.
// Thread safety: pure function.

#include <cstddef>
#include <cstdint>

namespace kvpool {

uint64_t BlockChecksum(const void* data, size_t length);

// Where a copy's bytes go: into the CPU's caches on their way to memory, for a reader that
// comes next (a get into the caller's buffer), or around them (non-temporal stores) for bytes
// nobody reads soon, such as a put into the daemon's arena: no line of the destination is read
// first only to be overwritten, and the copy takes less than a plain memcpy.
enum class CopyCache { kKeep, kBypass };

// Copies `length` bytes from `src` to `dst` and returns BlockChecksum of them, hashing each
// piece right after copying it, while it is still in cache: close to the cost of the copy alone.
// kBypass takes effect where the CPU has AVX2 and `dst` is 32-byte aligned.
uint64_t CopyWithChecksum(void* dst, const void* src, size_t length,
                          CopyCache cache = CopyCache::kKeep);

}  // namespace kvpool
