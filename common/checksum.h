#pragma once
// Block checksums: xxh3-64 over the payload bytes. Written with every block and verified on
// every read from disk and every transfer between processes or nodes.
// Thread safety: pure function.

#include <cstddef>
#include <cstdint>

namespace kvpool {

uint64_t BlockChecksum(const void* data, size_t length);

// Copies `length` bytes from `src` to `dst` and returns BlockChecksum of them, hashing each
// chunk right after copying it, while it is still in cache: close to the cost of the copy alone.
uint64_t CopyWithChecksum(void* dst, const void* src, size_t length);

}  // namespace kvpool
