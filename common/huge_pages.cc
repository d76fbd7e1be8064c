#include "common/huge_pages.h"

#include <sys/mman.h>

#include <fstream>
#include <sstream>

namespace kvpool {

void* MapAligned(size_t bytes, size_t align, int prot, int flags) {
  // mmap gives page-aligned ranges: only a larger alignment needs slack.
  const size_t padded = align > 4096 ? bytes + align : bytes;
  void* raw = mmap(nullptr, padded, prot, flags, -1, 0);
  if (raw == MAP_FAILED) return raw;
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + align - 1) & ~(uintptr_t{align} - 1);
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = start + padded;
  if (end > aligned + bytes)
    munmap(reinterpret_cast<void*>(aligned + bytes), end - aligned - bytes);
  return reinterpret_cast<void*>(aligned);
}

uint64_t ShmemHugeBytesIn(const void* begin, const void* end) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  uint64_t kib = 0;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0;
    uintptr_t hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') {  // a mapping's first line
      inside = lo >= reinterpret_cast<uintptr_t>(begin) && hi <= reinterpret_cast<uintptr_t>(end);
      continue;
    }
    if (inside && line.rfind("ShmemPmdMapped:", 0) == 0) kib += std::stoull(line.substr(15));
  }
  return kib * 1024;
}

namespace {

// The bracketed choice of a sysfs file like "always within_size [advise] never deny force".
std::string SelectedMode(const char* path) {
  std::ifstream in(path);
  std::string modes;
  std::getline(in, modes);
  const size_t open = modes.find('[');
  const size_t close = modes.find(']', open);
  return open == std::string::npos || close == std::string::npos
             ? std::string()
             : modes.substr(open + 1, close - open - 1);
}

}  // namespace

std::string ShmemHugePageMode() {
  // Since Linux 6.11 each page size has its own setting, which may defer to the global one.
  const std::string per_size =
      SelectedMode("/sys/kernel/mm/transparent_hugepage/hugepages-2048kB/shmem_enabled");
  if (!per_size.empty() && per_size != "inherit") return per_size;
  return SelectedMode("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
}

bool ShmemHugePagesOnAdvice() {
  const std::string mode = ShmemHugePageMode();
  return mode == "advise" || mode == "within_size" || mode == "always" || mode == "force";
}

}  // namespace kvpool
