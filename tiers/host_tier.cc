#include "tiers/host_tier.h"

#include <fcntl.h>
#include <glog/logging.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include "absl/time/time.h"
#include "common/units.h"
#include "kernels/pinned_memory.h"

namespace kvpool::tiers {

Result<std::unique_ptr<HostTier>> HostTier::Create(const HostTierOptions& options) {
  if (options.segment_bytes < kPageBytes || options.segment_bytes % kPageBytes != 0) {
    return Status::InvalidArgument("host segment size must be a positive multiple of 4 KiB, got " +
                                   std::to_string(options.segment_bytes));
  }
  if (options.huge_pages && options.segment_bytes % kHugePageBytes != 0) {
    return Status::InvalidArgument(
        "huge pages for the host arena need a segment size that is a "
        "multiple of 2 MiB, got " +
        FormatBytes(options.segment_bytes));
  }
  uint64_t count = options.capacity_bytes / options.segment_bytes;
  if (count == 0) {
    return Status::InvalidArgument("host capacity " + FormatBytes(options.capacity_bytes) +
                                   " is smaller than one segment (" +
                                   FormatBytes(options.segment_bytes) + ")");
  }
  if (count > UINT32_MAX) return Status::InvalidArgument("too many host segments");
  const uint64_t bytes = count * options.segment_bytes;

  // One contiguous address range; each segment's memfd is mapped over its part of it (at a huge
  // page's alignment when they are asked for: a huge page maps only an aligned 2 MiB).
  void* p = MapAligned(bytes, options.huge_pages ? kHugePageBytes : kPageBytes, PROT_NONE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE);
  if (p == MAP_FAILED) {
    return Status::FromErrno(errno, "reserving " + FormatBytes(bytes) + " for the host arena");
  }
  std::unique_ptr<HostTier> tier(
      new HostTier(static_cast<uint8_t*>(p), options, static_cast<uint32_t>(count)));
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
  if (options.spare_segments > 0 || options.standby_segments > 0) {
    tier->keeper_ = std::thread([t = tier.get()] { t->KeepAhead(); });
  }
  return tier;
}

HostTier::HostTier(uint8_t* base, const HostTierOptions& options, uint32_t segment_count)
    : SegmentedTier("host", options.segment_bytes, segment_count),
      base_(base),
      segment_bytes_(options.segment_bytes),
      segment_count_(segment_count),
      lock_(options.lock_memory),
      spare_segments_(options.spare_segments),
      spare_after_(options.spare_after),
      standby_segments_(options.standby_segments),
      huge_pages_(options.huge_pages),
      cuda_device_(options.cuda_device) {
  absl::MutexLock l(&mu_);
  segments_.resize(segment_count);
  generations_ = std::make_unique<std::atomic<uint32_t>[]>(segment_count);
  seg_registered_ = std::make_unique<std::atomic<bool>[]>(segment_count);
}

HostTier::~HostTier() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (keeper_.joinable()) keeper_.join();
  {
    absl::MutexLock lock(&mu_);
    for (int fd : std::exchange(retired_, {})) ReleaseMemfd(fd);
    for (const Standby& s : std::exchange(standby_, {})) {
      munmap(s.at, segment_bytes_);
      close(s.fd);
    }
    for (size_t i = 0; i < segment_count_; ++i) {
      if (seg_registered_[i].load(std::memory_order_relaxed)) {
        kernels::UnregisterHostMemory(base_ + i * segment_bytes_, cuda_device_);
      }
    }
  }
  munmap(base_, capacity_bytes());
  absl::MutexLock lock(&mu_);
  for (Segment& s : segments_) {
    if (s.fd >= 0) close(s.fd);
  }
}

Status HostTier::MapSegmentLocked(uint32_t index, bool* mapped_over) {
  bool touched = false;
  Standby standby = TakeStandbyLocked();
  Result<int> fd = MapFreshMemfd(index, locked_, &touched, &standby);
  if (mapped_over != nullptr) *mapped_over = touched;
  KVPOOL_RETURN_IF_ERROR(fd.status());
  ReleaseMemfd(InstallFreshLocked(index, *fd, /*from_standby=*/standby.fd >= 0));
  return Status::OK();
}

Result<int> HostTier::NewSealedMemfd(const std::string& name) const {
  int fd;
  KVPOOL_RETURN_IF_ERRNO(fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING), fd < 0,
                         "memfd_create for " + name);
  if (ftruncate(fd, static_cast<off_t>(segment_bytes_)) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    const int err = errno;
    close(fd);
    return Status::FromErrno(err, "sizing and sealing " + name);
  }
  return fd;
}

Result<int> HostTier::MapFreshMemfd(uint32_t index, bool mlock_it, bool* mapped_over,
                                    Standby* standby) const {
  *mapped_over = false;
  uint8_t* at = base_ + static_cast<uint64_t>(index) * segment_bytes_;
  if (standby->fd >= 0) {
    if (MoveStandbyOver(at, *standby, mapped_over)) {
      // Made while the limit allowed no more locked memory (the arena's own segment was locked
      // then): locked now that the old mapping is gone.
      if (mlock_it && !standby->locked) mlock(at, segment_bytes_);
      return standby->fd;
    }
    // Made on the spot instead, over whatever the failed move left.
    *standby = Standby{};
  }
  KVPOOL_ASSIGN_OR_RETURN(const int fd, NewSealedMemfd("kvpool-segment-" + std::to_string(index)));
  *mapped_over = true;
  void* p = mmap(at, segment_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    close(fd);
    return Status::FromErrno(err, "mapping host segment " + std::to_string(index));
  }
  // Before any page of it is touched: shared memory gets huge pages when it is faulted in through
  // a mapping advised so. So it is faulted in here (mlock does that): a client's mapping, which
  // is not advised, touching a page first would give it 4 KiB pages for good.
  if (huge_pages_) madvise(at, segment_bytes_, MADV_HUGEPAGE);
  if (mlock_it) {
    mlock(at, segment_bytes_);
  } else if (huge_pages_) {
    madvise(at, segment_bytes_, MADV_POPULATE_WRITE);  // Linux 5.14 on; else left to first touch
  } else if (!lock_) {
    madvise(at, segment_bytes_, MADV_WILLNEED);
  }
  return fd;
}

void HostTier::PinForCuda(uint32_t index) {
  uint8_t* at = base_ + static_cast<uint64_t>(index) * segment_bytes_;
  if (seg_registered_[index].exchange(false, std::memory_order_relaxed)) {
    kernels::UnregisterHostMemory(at, cuda_device_);
  }
  if (cuda_device_ >= 0 && kernels::CudaDeviceAvailable()) {
    Status reg = kernels::RegisterHostMemory(at, segment_bytes_, /*read_only=*/false, cuda_device_);
    if (reg.ok()) {
      seg_registered_[index].store(true, std::memory_order_relaxed);
    } else {
      LOG_FIRST_N(WARNING, 1) << "host segment not registered with CUDA: " << reg.ToString();
    }
  }
}

int HostTier::InstallMemfdLocked(uint32_t index, int fd, bool pinned) {
  if (!pinned) PinForCuda(index);
  Segment& seg = segments_[index];
  const int old = seg.fd;
  seg.fd = fd;
  generations_[index].fetch_add(1, std::memory_order_release);
  return old;
}

void HostTier::ReleaseMemfd(int fd) const {
  if (fd < 0) return;
  // Clients that still map the old memfd keep (their own namespace's) old bytes at worst;
  // release its pages now so that costs no memory, then drop our reference.
  PunchPages(fd);
  close(fd);
}

bool HostTier::MoveStandbyOver(uint8_t* at, const Standby& standby, bool* touched) const {
  // Its pages and page tables move (a huge page's alignment on both sides moves huge pages whole).
  // First the old mapping is replaced through mmap, which UCX's memory hooks see (its registration
  // cache forgets the range, as with a fresh memfd mapped over it). Then the move, by the system
  // call itself: with those hooks installed (libucm, loaded with UCX), libc's mremap drops
  // MREMAP_FIXED's new address and maps the memory at address 0.
  void* moved = mmap(at, segment_bytes_, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  if (moved != MAP_FAILED) {
    *touched = true;
    moved = reinterpret_cast<void*>(syscall(SYS_mremap, standby.at, segment_bytes_, segment_bytes_,
                                            MREMAP_MAYMOVE | MREMAP_FIXED, at));
  }
  if (moved == at) return true;
  // (With MREMAP_FIXED the kernel answers `at` or an error.)
  LOG_EVERY_N(WARNING, 60) << "could not move standby memory over a host segment ("
                           << std::strerror(errno) << "); fresh memory made on the spot instead";
  munmap(standby.at, segment_bytes_);
  close(standby.fd);
  return false;
}

Result<HostTier::Standby> HostTier::MakeStandby(bool mlock_it) const {
  KVPOOL_ASSIGN_OR_RETURN(const int fd, NewSealedMemfd("kvpool-segment-standby"));
  // At a huge page's alignment where they are asked for, as the arena: mremap moves them whole.
  void* at = MapAligned(segment_bytes_, huge_pages_ ? kHugePageBytes : kPageBytes, PROT_NONE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE);
  if (at == MAP_FAILED || mmap(at, segment_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                               fd, 0) == MAP_FAILED) {
    const int err = errno;
    if (at != MAP_FAILED) munmap(at, segment_bytes_);
    close(fd);
    return Status::FromErrno(err, "mapping standby memory for a host segment");
  }
  // Faulted in now, which is the point: the renewal that takes it faults nothing.
  if (huge_pages_) madvise(at, segment_bytes_, MADV_HUGEPAGE);
  const bool locked = mlock_it && mlock(at, segment_bytes_) == 0;
  if (!locked) {
    madvise(at, segment_bytes_, MADV_POPULATE_WRITE);  // Linux 5.14 on; else left to first touch
  }
  return Standby{fd, static_cast<uint8_t*>(at), locked};
}

HostTier::Standby HostTier::TakeStandbyLocked() {
  if (standby_.empty()) return {};
  const Standby s = standby_.back();
  standby_.pop_back();
  standby_due_ = absl::Now() + kStandbyAfterTaken;
  return s;
}

int HostTier::InstallFreshLocked(uint32_t index, int fd, bool from_standby, bool pinned) {
  if (from_standby) ++renewals_from_standby_;
  return RetireMemfdLocked(InstallMemfdLocked(index, fd, pinned));
}

int HostTier::RetireMemfdLocked(int fd) {
  if (fd < 0 || stopping_ || !keeper_.joinable()) return fd;
  retired_.push_back(fd);
  return -1;
}

uint32_t HostTier::StandbyReady() const {
  absl::MutexLock lock(&mu_);
  return static_cast<uint32_t>(standby_.size());
}

bool HostTier::SpareWantedOrStopping() const {
  return stopping_ || (pages_.clean_segments() < spare_segments_ && pages_.vacant_segments() > 0);
}

bool HostTier::StandbyWanted() const {
  return standby_.size() < standby_segments_ && absl::Now() >= standby_due_;
}

bool HostTier::StandbyOrReleaseWantedOrStopping() const {
  return stopping_ || !retired_.empty() || StandbyWanted();
}

void HostTier::KeepAhead() {
  mu_.Lock();
  for (;;) {
    // With a timeout: a standby due later is wanted only as time passes, and one taken while
    // this waits is due kStandbyAfterTaken later (nothing wakes the thread then).
    absl::Duration wait = absl::Seconds(1);
    if (standby_.size() < standby_segments_) {
      wait = std::clamp(standby_due_ - absl::Now(), absl::Milliseconds(1), wait);
    } else if (standby_segments_ > 0) {
      wait = kStandbyAfterTaken;
    }
    mu_.AwaitWithTimeout(absl::Condition(this, &HostTier::WorkOrStopping), wait);
    if (stopping_) break;
    if (!retired_.empty()) {
      std::vector<int> fds = std::exchange(retired_, {});
      mu_.Unlock();
      for (int fd : fds) ReleaseMemfd(fd);
      mu_.Lock();
      continue;
    }
    if (StandbyWanted()) {
      const bool mlock_it = locked_;
      mu_.Unlock();
      Result<Standby> made = MakeStandby(mlock_it);
      mu_.Lock();
      if (made.ok()) {
        standby_.push_back(*made);
      } else {
        // Out of descriptors or memory lasts a while: a line a minute or so, and a second's
        // pause (renewals meanwhile make their memory on the spot).
        LOG_EVERY_N(WARNING, 60) << "no standby memory for a host segment ("
                                 << made.status().ToString() << "); retried in a second";
        standby_due_ = absl::Now() + absl::Seconds(1);
      }
      continue;
    }
    if (!SpareWantedOrStopping()) continue;
    // A spare: not a segment its namespace may take back at once. Wait until it has been vacant
    // a while (or is taken, or another empties, or other work comes).
    const auto since = pages_.LongestVacantSince();
    const auto waited = std::chrono::steady_clock::now() - *since;
    if (waited < spare_after_) {
      mu_.AwaitWithTimeout(absl::Condition(this, &HostTier::StandbyOrReleaseWantedOrStopping),
                           std::min(absl::FromChrono(spare_after_ - waited), kStandbyAfterTaken));
      continue;
    }
    const std::optional<uint32_t> index = pages_.TakeLongestVacant();
    if (!index) continue;
    ++renewing_;  // as TakeVacant
    mu_.Unlock();
    // Its own memory, made here: the standby is kept for renewals someone waits for.
    const Status renewed = Renew(*index, /*from_standby=*/false);
    mu_.Lock();
    // Whatever failed (descriptors, memory) may fail for the next one too: pause.
    if (!renewed.ok()) mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Seconds(1));
  }
  mu_.Unlock();
}

Status HostTier::RenewTaken(uint32_t segment) { return Renew(segment, /*from_standby=*/true); }

Status HostTier::Renew(uint32_t segment, bool from_standby) {
  // Out of every pool and owned by nobody (TakeVacant): no slot, no allocation and no export
  // reaches the segment while its memory is replaced without the lock.
  mu_.Lock();
  const bool mlock_it = locked_;
  Standby standby = from_standby ? TakeStandbyLocked() : Standby{};
  mu_.Unlock();
  bool mapped_over = false;
  Result<int> fd = MapFreshMemfd(segment, mlock_it, &mapped_over, &standby);
  if (fd.ok()) PinForCuda(segment);  // without the lock, as the mapping
  mu_.Lock();
  if (!fd.ok()) {
    RenewedLocked(segment, FailedRenewalLocked(segment, fd.status(), mapped_over));
    mu_.Unlock();
    return fd.status();
  }
  const int release =
      InstallFreshLocked(segment, *fd, /*from_standby=*/standby.fd >= 0, /*pinned=*/true);
  RenewedLocked(segment, SegmentPages::Renewal::kRenewed);
  mu_.Unlock();
  ReleaseMemfd(release);
  return Status::OK();
}

SegmentPages::Renewal HostTier::RenewSegmentLocked(uint32_t index) {
  bool mapped_over = false;
  const Status st = MapSegmentLocked(index, &mapped_over);
  if (st.ok()) return SegmentPages::Renewal::kRenewed;
  return FailedRenewalLocked(index, st, mapped_over);
}

SegmentPages::Renewal HostTier::FailedRenewalLocked(uint32_t index, const Status& why,
                                                    bool mapped_over) {
  if (!mapped_over) {
    // Nothing of the segment changed (its old memfd still maps it): it stays its owner's.
    // Out of descriptors lasts: a line a minute or so, not one per try.
    LOG_EVERY_N(WARNING, 60) << "host segment " << index << " could not get a fresh memfd ("
                             << why.ToString() << "); it stays with its namespace for now";
    return SegmentPages::Renewal::kUnchanged;
  }
  // The old memfd was never closed, and the range may be unmapped: the segment may not go to
  // any namespace.
  LOG(ERROR) << "host segment " << index << " could not get a fresh memfd (" << why.ToString()
             << "); it stays out of use";
  // Its old bytes go (a client still mapping them sees zeros).
  PunchPages(segments_[index].fd);
  return SegmentPages::Renewal::kLost;
}

void HostTier::PunchPages(int fd) const {
  fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(segment_bytes_));
}

SegmentLocation HostTier::Locate(uint64_t offset) const {
  const uint32_t index = static_cast<uint32_t>(offset / segment_bytes_);
  return SegmentLocation{index, generations_[index].load(std::memory_order_acquire),
                         offset % segment_bytes_};
}

Result<int> HostTier::ExportSegment(uint32_t index, uint32_t generation, NamespaceId ns,
                                    bool writable) {
  absl::MutexLock lock(&mu_);
  if (index >= segment_count_)
    return Status::InvalidArgument("no host segment " + std::to_string(index));
  const Segment& seg = segments_[index];
  // Another namespace's segment and a stale generation get one answer: a tenant learns nothing
  // of other tenants' segments (whose they are, whether and how often they were renewed).
  if (pages_.OwnerOf(index) != ns || ns == kNoNamespace ||
      generations_[index].load(std::memory_order_relaxed) != generation) {
    return Status::NotFound("host segment " + std::to_string(index) + " generation " +
                            std::to_string(generation) +
                            " is not this namespace's (recycled, or never its own)");
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

NamespaceId HostTier::OwnerOf(uint64_t offset) const {
  absl::MutexLock lock(&mu_);
  return pages_.OwnerOf(pages_.SegmentOf(offset));
}

HostTierStats HostTier::GetStats() const {
  absl::MutexLock lock(&mu_);
  HostTierStats s = pages_.Stats();
  s.locked = locked_;
  s.renewals_from_standby = renewals_from_standby_;
  s.standby_ready = standby_.size();
  return s;
}

}  // namespace kvpool::tiers
