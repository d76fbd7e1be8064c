#pragma once
// Huge pages of shared memory: how much of a range has them, and whether the kernel gives them.
// The host arena asks for them (tiers/host_tier.h, kvpoold --host_huge_pages) and the client maps
// them as such (client/segment_mappings.cc); these say what came of it, for logs and tests.

#include <cstdint>
#include <string>

namespace kvpool {

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
