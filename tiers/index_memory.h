#pragma once
// Memory for the block index's large arrays (its entry chunks and its hash set's slots), backed by
// transparent huge pages where the kernel offers them (`madvise` mode, Debian's default). At 10^6
// blocks and more the index is hundreds of MB read at random; with 4 KiB pages nearly every
// lookup also misses the TLB, and under a hypervisor each such miss is a two-level page walk.
// Arrays of 2 MiB and more are mapped on their own, aligned to 2 MiB and advised MADV_HUGEPAGE;
// smaller ones are plain malloc. Where the kernel has no huge pages the advice is ignored and
// nothing changes.
//
// Thread safety: the functions are; an IndexAllocator is stateless.

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

#include "common/huge_pages.h"

namespace kvpool::tiers {

inline size_t IndexMemoryRounded(size_t bytes) {
  return (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
}

// `bytes` of memory, aligned to 2 MiB and advised to be huge pages from 2 MiB on. Large arrays
// are mapped on their own, so freeing one (the hash set's old array after it grows) returns its
// memory to the system at once.
inline void* AllocateIndexMemory(size_t bytes) {
  if (bytes < kHugePageBytes) {
    void* p = std::malloc(bytes == 0 ? 1 : bytes);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  const size_t rounded = IndexMemoryRounded(bytes);
  void* p =
      MapAligned(rounded, kHugePageBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS);
  if (p == MAP_FAILED) throw std::bad_alloc();
  (void)madvise(p, rounded, MADV_HUGEPAGE);  // advice only: without THP nothing changes
  return p;
}

// Frees what AllocateIndexMemory(bytes) returned.
inline void FreeIndexMemory(void* p, size_t bytes) {
  if (p == nullptr) return;
  if (bytes < kHugePageBytes) {
    std::free(p);
  } else {
    munmap(p, IndexMemoryRounded(bytes));
  }
}

// A std allocator over AllocateIndexMemory, for the index's hash set.
template <typename T>
struct IndexAllocator {
  using value_type = T;
  IndexAllocator() = default;
  template <typename U>
  IndexAllocator(const IndexAllocator<U>&) {}  // NOLINT: rebinding must be implicit
  T* allocate(size_t n) { return static_cast<T*>(AllocateIndexMemory(n * sizeof(T))); }
  void deallocate(T* p, size_t n) { FreeIndexMemory(p, n * sizeof(T)); }
  template <typename U>
  bool operator==(const IndexAllocator<U>&) const {
    return true;
  }
  template <typename U>
  bool operator!=(const IndexAllocator<U>&) const {
    return false;
  }
};

}  // namespace kvpool::tiers
