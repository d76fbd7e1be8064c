#pragma once
// Huge pages of shared memory: how much of a range has them, and whether the kernel gives them.
// The host arena asks for them (tiers/host_tier.h, kvpoold --host_huge_pages) and the client maps
// them as such (client/segment_mappings.cc); these say what came of it, for logs and tests.

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvpool {

inline constexpr size_t kHugePageBytes = 2u << 20;

// mmap(nullptr, bytes, prot, flags, -1, 0) with the result aligned to `align` (a power of two;
// the slack mapped for it is given back on either side). MAP_FAILED with errno on failure.
void* MapAligned(size_t bytes, size_t align, int prot, int flags);

// Bytes of the address range [begin, end) of this process that are mapped by huge pages of
// shared memory now (ShmemPmdMapped of /proc/self/smaps). Reads a file: not for hot paths.
uint64_t ShmemHugeBytesIn(const void* begin, const void* end);
// The kernel's transparent huge page mode for 2 MiB pages of shared memory ("never", "advise",
// ...): /sys/kernel/mm/transparent_hugepage/hugepages-2048kB/shmem_enabled (Linux 6.11 on) unless
// it says "inherit", else the global shmem_enabled; empty where neither can be read.
std::string ShmemHugePageMode();
// Whether that mode gives huge pages to a mapping advised MADV_HUGEPAGE.
bool ShmemHugePagesOnAdvice();

}  // namespace kvpool
