#include "tiers/host_tier.h"

#include <fcntl.h>
#include <glog/logging.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include "common/units.h"
#include "kernels/pinned_memory.h"

namespace kvpool::tiers {
namespace {

uint32_t PagesFor(uint64_t length) {
  return static_cast<uint32_t>((length + HostTier::kPageBytes - 1) / HostTier::kPageBytes);
}

}  // namespace

Result<std::unique_ptr<HostTier>> HostTier::Create(const HostTierOptions& options) {
  if (options.segment_bytes < kPageBytes || options.segment_bytes % kPageBytes != 0) {
    return Status::InvalidArgument("host segment size must be a positive multiple of 4 KiB, got " +
                                   std::to_string(options.segment_bytes));
  }
  uint64_t count = options.capacity_bytes / options.segment_bytes;
  if (count == 0) {
    return Status::InvalidArgument("host capacity " + FormatBytes(options.capacity_bytes) +
                                   " is smaller than one segment (" +
                                   FormatBytes(options.segment_bytes) + ")");
  }
  if (count > UINT32_MAX) return Status::InvalidArgument("too many host segments");
  const uint64_t bytes = count * options.segment_bytes;

  // One contiguous address range; each segment's memfd is mapped over its part of it.
  void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return Status::FromErrno(errno, "reserving " + FormatBytes(bytes) + " for the host arena");
  }
  std::unique_ptr<HostTier> tier(new HostTier(static_cast<uint8_t*>(p), options.segment_bytes,
                                              static_cast<uint32_t>(count), options.lock_memory));
  absl::MutexLock lock(&tier->mu_);
  for (uint32_t i = 0; i < count; ++i) {
    KVPOOL_RETURN_IF_ERROR(tier->MapSegmentLocked(i));
  }
  if (options.lock_memory) {
    if (mlock(p, bytes) == 0) {
      tier->locked_ = true;
    } else {
      int err = errno;
      rlimit lim{};
      getrlimit(RLIMIT_MEMLOCK, &lim);
      LOG(WARNING) << "cannot mlock the " << FormatBytes(bytes) << " host arena ("
                   << std::strerror(err) << "; RLIMIT_MEMLOCK is "
                   << (lim.rlim_cur == RLIM_INFINITY ? std::string("unlimited")
                                                     : FormatBytes(lim.rlim_cur))
                   << "): running unlocked, the kernel may swap blocks out. "
                      "Raise LimitMEMLOCK (the systemd unit sets infinity).";
    }
  }
  return tier;
}

HostTier::HostTier(uint8_t* base, uint64_t segment_bytes, uint32_t segment_count, bool lock)
    : base_(base),
      segment_bytes_(segment_bytes),
      segment_count_(segment_count),
      pages_per_segment_(static_cast<uint32_t>(segment_bytes / kPageBytes)),
      lock_(lock) {
  absl::MutexLock l(&mu_);
  segments_.resize(segment_count);
  for (auto& s : segments_) s.bitmap.assign((pages_per_segment_ + 63) / 64, 0);
  free_segments_.reserve(segment_count);
  for (uint32_t i = segment_count; i > 0; --i) free_segments_.push_back(i - 1);
}

HostTier::~HostTier() {
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < seg_registered_.size(); ++i) {
      if (seg_registered_[i]) kernels::UnregisterHostMemory(base_ + i * segment_bytes_);
    }
  }
  munmap(base_, capacity_bytes());
  absl::MutexLock lock(&mu_);
  for (Segment& s : segments_) {
    if (s.fd >= 0) close(s.fd);
  }
}

Status HostTier::MapSegmentLocked(uint32_t index) {
  const std::string name = "kvpool-segment-" + std::to_string(index);
  int fd;
  KVPOOL_RETURN_IF_ERRNO(fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING), fd < 0,
                         "memfd_create for host segment " + std::to_string(index));
  // Sealed at its size: a client holding a descriptor (even reopened writable through
  // /proc/self/fd) cannot shrink it under the daemon's mapping, which would SIGBUS the daemon.
  if (ftruncate(fd, static_cast<off_t>(segment_bytes_)) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    const int err = errno;
    close(fd);
    return Status::FromErrno(err, "sizing and sealing host segment " + std::to_string(index));
  }
  uint8_t* at = base_ + static_cast<uint64_t>(index) * segment_bytes_;
  void* p = mmap(at, segment_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    close(fd);
    return Status::FromErrno(err, "mapping host segment " + std::to_string(index));
  }
  if (locked_) {
    mlock(at, segment_bytes_);
  } else if (!lock_) {
    madvise(at, segment_bytes_, MADV_WILLNEED);
  }
  // Pinned for CUDA where a GPU is usable, so GPU copies from blocks need no staging.
  if (seg_registered_.size() > index && seg_registered_[index]) {
    kernels::UnregisterHostMemory(at);
    seg_registered_[index] = false;
  }
  if (kernels::CudaDeviceAvailable()) {
    Status reg = kernels::RegisterHostMemory(at, segment_bytes_);
    if (reg.ok()) {
      if (seg_registered_.size() <= index) seg_registered_.resize(segment_count_, false);
      seg_registered_[index] = true;
    } else {
      LOG_FIRST_N(WARNING, 1) << "host segment not registered with CUDA: " << reg.ToString();
    }
  }
  Segment& seg = segments_[index];
  const int old = seg.fd;
  seg.fd = fd;
  ++seg.generation;
  if (old >= 0) {
    // Clients that still map the old memfd keep (their own namespace's) old bytes at worst;
    // release its pages now so that costs no memory, then drop our reference.
    fallocate(old, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
              static_cast<off_t>(segment_bytes_));
    close(old);
  }
  return Status::OK();
}

void HostTier::RecycleSegmentLocked(uint32_t index) {
  // Empty: it no longer counts towards its owner's quota, whatever becomes of it.
  if (auto held = segments_of_.find(segments_[index].owner); held != segments_of_.end()) {
    if (--held->second == 0) segments_of_.erase(held);
  }
  Status st = MapSegmentLocked(index);
  if (!st.ok()) {
    // The old memfd was never remapped or closed: the segment may not go to any namespace.
    segments_[index].quarantined = true;
    ++quarantined_;
    LOG(ERROR) << "host segment " << index << " could not get a fresh memfd (" << st.ToString()
               << "); it stays out of use";
    return;
  }
  segments_[index].owner = kNoNamespace;
  free_segments_.push_back(index);
}

SegmentLocation HostTier::Locate(uint64_t offset) const {
  const uint32_t index = static_cast<uint32_t>(offset / segment_bytes_);
  absl::MutexLock lock(&mu_);
  return SegmentLocation{index, segments_[index].generation, offset % segment_bytes_};
}

Result<int> HostTier::ExportSegment(uint32_t index, uint32_t generation, NamespaceId ns,
                                    bool writable) {
  absl::MutexLock lock(&mu_);
  if (index >= segment_count_)
    return Status::InvalidArgument("no host segment " + std::to_string(index));
  const Segment& seg = segments_[index];
  if (seg.generation != generation) {
    return Status::NotFound("host segment " + std::to_string(index) + " was recycled");
  }
  if (seg.owner != ns || seg.owner == kNoNamespace) {
    return Status::PermissionDenied("host segment " + std::to_string(index) +
                                    " does not belong to this namespace");
  }
  int fd;
  if (writable) {
    KVPOOL_RETURN_IF_ERRNO(fd = fcntl(seg.fd, F_DUPFD_CLOEXEC, 0), fd < 0, "dup segment fd");
  } else {
    // A read-only open file description: the client cannot map it writable.
    const std::string path = "/proc/self/fd/" + std::to_string(seg.fd);
    KVPOOL_RETURN_IF_ERRNO(fd = open(path.c_str(), O_RDONLY | O_CLOEXEC), fd < 0,
                           "reopen segment fd read-only");
  }
  return fd;
}

int64_t HostTier::FindRun(const Segment& seg, uint32_t pages) const {
  uint32_t run_start = 0;
  uint32_t run_len = 0;
  const uint32_t words = static_cast<uint32_t>(seg.bitmap.size());
  for (uint32_t w = 0; w < words; ++w) {
    const uint64_t word = seg.bitmap[w];
    const uint32_t base = w * 64;
    if (word == ~0ull) {
      run_len = 0;
      continue;
    }
    if (word == 0 && base + 64 <= pages_per_segment_) {
      if (run_len == 0) run_start = base;
      run_len += 64;
      if (run_len >= pages) return run_start;
      continue;
    }
    for (uint32_t b = 0; b < 64 && base + b < pages_per_segment_; ++b) {
      if (word >> b & 1) {
        run_len = 0;
      } else {
        if (run_len == 0) run_start = base + b;
        if (++run_len >= pages) return run_start;
      }
    }
  }
  return -1;
}

uint32_t HostTier::LargestRun(const Segment& seg) const {
  uint32_t best = 0, run = 0;
  for (uint32_t p = 0; p < pages_per_segment_; ++p) {
    if (seg.bitmap[p / 64] >> (p % 64) & 1) {
      run = 0;
    } else {
      best = std::max(best, ++run);
    }
  }
  return best;
}

void HostTier::MarkRun(Segment& seg, uint32_t first, uint32_t pages, bool used) {
  for (uint32_t p = first; p < first + pages; ++p) {
    const uint64_t bit = 1ull << (p % 64);
    if (used) {
      seg.bitmap[p / 64] |= bit;
    } else {
      seg.bitmap[p / 64] &= ~bit;
    }
  }
}

Result<HostSlot> HostTier::Allocate(NamespaceId ns, uint64_t length) {
  if (length == 0) return Status::InvalidArgument("cannot allocate an empty block");
  if (length > segment_bytes_) {
    return Status::InvalidArgument("block of " + FormatBytes(length) +
                                   " exceeds the host segment size of " +
                                   FormatBytes(segment_bytes_));
  }
  const uint32_t pages = PagesFor(length);
  absl::MutexLock lock(&mu_);
  auto take = [&](uint32_t seg_index, int64_t first) {
    Segment& seg = segments_[seg_index];
    MarkRun(seg, static_cast<uint32_t>(first), pages, true);
    seg.used_pages += pages;
    allocated_bytes_ += pages * kPageBytes;
    payload_bytes_ += length;
    ++blocks_;
    HostSlot slot;
    slot.offset = seg_index * segment_bytes_ + static_cast<uint64_t>(first) * kPageBytes;
    slot.length = length;
    return slot;
  };
  for (uint32_t i = 0; i < segment_count_; ++i) {
    Segment& seg = segments_[i];
    if (seg.owner != ns || seg.quarantined || pages_per_segment_ - seg.used_pages < pages) {
      continue;
    }
    int64_t first = FindRun(seg, pages);
    if (first >= 0) return take(i, first);
  }
  if (auto limit = segment_limit_.find(ns);
      limit != segment_limit_.end() && segments_of_[ns] >= limit->second) {
    return Status::ResourceExhausted("namespace holds its quota of " +
                                     std::to_string(limit->second) + " host segments");
  }
  if (free_segments_.empty()) {
    return Status::ResourceExhausted("host arena full");
  }
  const uint32_t fresh = free_segments_.back();
  free_segments_.pop_back();
  segments_[fresh].owner = ns;
  ++segments_of_[ns];
  return take(fresh, 0);
}

void HostTier::SetSegmentLimit(NamespaceId ns, uint32_t max_segments) {
  absl::MutexLock lock(&mu_);
  if (max_segments == 0) {
    segment_limit_.erase(ns);
  } else {
    segment_limit_[ns] = max_segments;
  }
}

uint32_t HostTier::SegmentsOf(NamespaceId ns) const {
  absl::MutexLock lock(&mu_);
  auto it = segments_of_.find(ns);
  return it == segments_of_.end() ? 0 : it->second;
}

bool HostTier::AtSegmentLimit(NamespaceId ns) const {
  absl::MutexLock lock(&mu_);
  auto limit = segment_limit_.find(ns);
  if (limit == segment_limit_.end()) return false;
  auto held = segments_of_.find(ns);
  return held != segments_of_.end() && held->second >= limit->second;
}

void HostTier::Free(const HostSlot& slot) {
  const uint32_t seg_index = static_cast<uint32_t>(slot.offset / segment_bytes_);
  const uint32_t first = static_cast<uint32_t>(slot.offset % segment_bytes_ / kPageBytes);
  const uint32_t pages = PagesFor(slot.length);
  absl::MutexLock lock(&mu_);
  CHECK_LT(seg_index, segment_count_) << "host slot outside the arena";
  Segment& seg = segments_[seg_index];
  CHECK_GE(seg.used_pages, pages) << "host slot freed twice";
  MarkRun(seg, first, pages, false);
  seg.used_pages -= pages;
  allocated_bytes_ -= pages * kPageBytes;
  payload_bytes_ -= slot.length;
  --blocks_;
  if (seg.used_pages == 0) RecycleSegmentLocked(seg_index);
}

NamespaceId HostTier::OwnerOf(uint64_t offset) const {
  absl::MutexLock lock(&mu_);
  return segments_[offset / segment_bytes_].owner;
}

uint64_t HostTier::allocated_bytes() const {
  absl::MutexLock lock(&mu_);
  return allocated_bytes_;
}

HostTierStats HostTier::GetStats() const {
  absl::MutexLock lock(&mu_);
  HostTierStats s;
  s.capacity_bytes = capacity_bytes();
  s.allocated_bytes = allocated_bytes_;
  s.payload_bytes = payload_bytes_;
  s.blocks = blocks_;
  s.segments = segment_count_;
  s.free_segments = free_segments_.size();
  s.locked = locked_;
  uint64_t largest_pages = free_segments_.empty() ? 0 : pages_per_segment_;
  for (const Segment& seg : segments_) {
    if (seg.owner == kNoNamespace || seg.used_pages == pages_per_segment_) continue;
    largest_pages = std::max<uint64_t>(largest_pages, LargestRun(seg));
  }
  s.largest_free_run = largest_pages * kPageBytes;
  // No block is larger than a segment, so free space is unfragmented when a segment-sized run
  // (or all of it, when less is free) is one run: an empty arena reports 0, not 1 - 1/segments.
  const uint64_t free_bytes = s.capacity_bytes - s.allocated_bytes;
  const uint64_t usable_run = std::min(free_bytes, segment_bytes_);
  s.fragmentation =
      usable_run == 0 ? 0.0 : 1.0 - static_cast<double>(s.largest_free_run) / usable_run;
  return s;
}

}  // namespace kvpool::tiers
