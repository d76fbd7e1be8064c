#include "tiers/segment_pages.h"

#include <glog/logging.h>

#include <algorithm>
#include <iterator>
#include <utility>

#include "common/units.h"

namespace kvpool::tiers {
namespace {

constexpr uint64_t kPage = MemoryTier::kPageBytes;

uint32_t PagesFor(uint64_t length) { return static_cast<uint32_t>((length + kPage - 1) / kPage); }

}  // namespace

SegmentPages::SegmentPages(std::string tier_name, uint64_t segment_bytes, uint32_t segment_count)
    : tier_name_(std::move(tier_name)),
      segment_bytes_(segment_bytes),
      segment_count_(segment_count),
      pages_per_segment_(static_cast<uint32_t>(segment_bytes / kPage)),
      segments_(segment_count) {
  for (Segment& s : segments_) s.bitmap.assign((pages_per_segment_ + 63) / 64, 0);
  free_segments_.reserve(segment_count);
  for (uint32_t i = segment_count; i > 0; --i) free_segments_.push_back(i - 1);
}

int64_t SegmentPages::FindRun(const Segment& seg, uint32_t pages) const {
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

uint32_t SegmentPages::LargestRun(const Segment& seg) const {
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

void SegmentPages::MarkRun(Segment& seg, uint32_t first, uint32_t pages, bool used) {
  for (uint32_t p = first; p < first + pages; ++p) {
    const uint64_t bit = 1ull << (p % 64);
    if (used) {
      seg.bitmap[p / 64] |= bit;
    } else {
      seg.bitmap[p / 64] &= ~bit;
    }
  }
}

MemorySlot SegmentPages::Take(uint32_t index, uint32_t first, uint32_t pages, uint64_t length) {
  Segment& seg = segments_[index];
  MarkRun(seg, first, pages, true);
  seg.used_pages += pages;
  allocated_bytes_ += pages * kPage;
  payload_bytes_ += length;
  ++blocks_;
  MemorySlot slot;
  slot.offset = index * segment_bytes_ + uint64_t{first} * kPage;
  slot.length = length;
  return slot;
}

std::optional<MemorySlot> SegmentPages::AllocateInOwn(NamespaceId ns, uint64_t length,
                                                      uint32_t pages, uint32_t avoid) {
  for (uint32_t i = 0; i < segment_count_; ++i) {
    Segment& seg = segments_[i];
    if (i == avoid || seg.owner != ns || seg.vacant || seg.quarantined || seg.draining ||
        pages_per_segment_ - seg.used_pages < pages) {
      continue;
    }
    const int64_t first = FindRun(seg, pages);
    if (first >= 0) return Take(i, static_cast<uint32_t>(first), pages, length);
  }
  return std::nullopt;
}

Result<MemorySlot> SegmentPages::Allocate(NamespaceId ns, uint64_t length) {
  if (length == 0) return Status::InvalidArgument("cannot allocate an empty block");
  if (length > segment_bytes_) {
    return Status::InvalidArgument("block of " + FormatBytes(length) + " exceeds the " +
                                   tier_name_ + " segment size of " + FormatBytes(segment_bytes_));
  }
  const uint32_t pages = PagesFor(length);
  if (std::optional<MemorySlot> slot = AllocateInOwn(ns, length, pages, UINT32_MAX)) return *slot;
  if (AtSegmentLimit(ns)) {
    return Status::ResourceExhausted("namespace holds its quota of " + std::to_string(LimitOf(ns)) +
                                     " " + tier_name_ + " segments");
  }
  // Its own vacant segment first (the most recently emptied): its memory and its clients'
  // mappings are still good.
  for (auto it = vacant_.rbegin(); it != vacant_.rend(); ++it) {
    if (segments_[*it].owner != ns) continue;
    const uint32_t index = *it;
    vacant_.erase(std::next(it).base());
    segments_[index].vacant = false;
    ++segments_of_[ns];
    return Take(index, 0, pages, length);
  }
  if (free_segments_.empty()) return Status::ResourceExhausted(tier_name_ + " arena full");
  const uint32_t fresh = free_segments_.back();
  free_segments_.pop_back();
  segments_[fresh].owner = ns;
  ++segments_of_[ns];
  return Take(fresh, 0, pages, length);
}

Result<MemorySlot> SegmentPages::AllocateBeside(NamespaceId ns, uint64_t length, uint32_t avoid) {
  if (length == 0 || length > segment_bytes_) {
    return Status::InvalidArgument("no block of " + FormatBytes(length) + " fits a " + tier_name_ +
                                   " segment");
  }
  const uint32_t pages = PagesFor(length);
  if (std::optional<MemorySlot> slot = AllocateInOwn(ns, length, pages, avoid)) return *slot;
  return Status::ResourceExhausted("no run of " + std::to_string(pages) + " free pages in the " +
                                   tier_name_ + " segments namespace " + std::to_string(ns) +
                                   " holds");
}

bool SegmentPages::Free(const MemorySlot& slot) {
  const uint32_t seg_index = SegmentOf(slot.offset);
  const uint32_t first = static_cast<uint32_t>(slot.offset % segment_bytes_ / kPage);
  const uint32_t pages = PagesFor(slot.length);
  CHECK_LT(seg_index, segment_count_) << tier_name_ << " slot outside the arena";
  Segment& seg = segments_[seg_index];
  CHECK_GE(seg.used_pages, pages) << tier_name_ << " slot freed twice";
  MarkRun(seg, first, pages, false);
  seg.used_pages -= pages;
  allocated_bytes_ -= pages * kPage;
  payload_bytes_ -= slot.length;
  --blocks_;
  if (seg.used_pages != 0) return false;
  // Empty: vacant, no longer counted towards its owner's quota.
  if (auto held = segments_of_.find(seg.owner); held != segments_of_.end()) {
    if (--held->second == 0) segments_of_.erase(held);
  }
  seg.vacant = true;
  seg.draining = false;  // emptied: what draining was for
  seg.vacant_since = std::chrono::steady_clock::now();
  vacant_.push_back(seg_index);
  return true;
}

std::optional<std::chrono::steady_clock::time_point> SegmentPages::LongestVacantSince() const {
  if (vacant_.empty()) return std::nullopt;
  return segments_[vacant_.front()].vacant_since;
}

std::optional<uint32_t> SegmentPages::TakeLongestVacant() {
  if (vacant_.empty()) return std::nullopt;
  const uint32_t index = vacant_.front();
  vacant_.erase(vacant_.begin());
  Segment& seg = segments_[index];
  seg.vacant = false;
  seg.taken_from = seg.owner;
  seg.owner = kNoNamespace;
  return index;
}

void SegmentPages::Recycled(uint32_t index, Renewal how) {
  Segment& seg = segments_[index];
  seg.owner = kNoNamespace;
  const NamespaceId was = std::exchange(seg.taken_from, kNoNamespace);
  switch (how) {
    case Renewal::kRenewed:
      free_segments_.push_back(index);
      ++renewals_;
      return;
    case Renewal::kUnchanged:
      // Its memory and its clients' mappings are still its owner's: vacant again, from now (the
      // spare thread tries the others first).
      seg.owner = was;
      seg.vacant = true;
      seg.vacant_since = std::chrono::steady_clock::now();
      vacant_.push_back(index);
      return;
    case Renewal::kLost:
      seg.quarantined = true;
      return;
    case Renewal::kEmpty:
      // Nobody's (no namespace allocates from it or exports it): renewed when next taken.
      seg.vacant = true;
      seg.vacant_since = std::chrono::steady_clock::now();
      vacant_.push_back(index);
      return;
  }
}

void SegmentPages::SetSegmentLimit(NamespaceId ns, uint32_t max_segments) {
  if (max_segments == 0) {
    segment_limit_.erase(ns);
  } else {
    segment_limit_[ns] = max_segments;
  }
}

uint32_t SegmentPages::SegmentsOf(NamespaceId ns) const {
  auto it = segments_of_.find(ns);
  return it == segments_of_.end() ? 0 : it->second;
}

uint32_t SegmentPages::LimitOf(NamespaceId ns) const {
  auto limit = segment_limit_.find(ns);
  return limit == segment_limit_.end() ? default_limit_ : limit->second;
}

bool SegmentPages::AtSegmentLimit(NamespaceId ns) const {
  const uint32_t limit = LimitOf(ns);
  if (limit == 0) return false;
  auto held = segments_of_.find(ns);
  return held != segments_of_.end() && held->second >= limit;
}

MemoryTierStats SegmentPages::Stats() const {
  MemoryTierStats s;
  s.capacity_bytes = segment_bytes_ * segment_count_;
  s.allocated_bytes = allocated_bytes_;
  s.payload_bytes = payload_bytes_;
  s.blocks = blocks_;
  s.segments = segment_count_;
  s.free_segments = free_segments_.size() + vacant_.size();
  s.vacant_segments = vacant_.size();
  s.renewals = renewals_;
  uint64_t largest_pages = s.free_segments == 0 ? 0 : pages_per_segment_;
  for (const Segment& seg : segments_) {
    if (seg.owner == kNoNamespace || seg.vacant || seg.used_pages == pages_per_segment_) continue;
    largest_pages = std::max<uint64_t>(largest_pages, LargestRun(seg));
  }
  s.largest_free_run = largest_pages * kPage;
  // No block is larger than a segment, so free space is unfragmented when a segment-sized run
  // (or all of it, when less is free) is one run: an empty arena reports 0, not 1 - 1/segments.
  const uint64_t free_bytes = s.capacity_bytes - s.allocated_bytes;
  const uint64_t usable_run = std::min(free_bytes, segment_bytes_);
  s.fragmentation =
      usable_run == 0 ? 0.0 : 1.0 - static_cast<double>(s.largest_free_run) / usable_run;
  return s;
}

Result<MemorySlot> SegmentedTier::Allocate(NamespaceId ns, uint64_t length) {
  absl::MutexLock lock(&mu_);
  return AllocateLocked(ns, length, /*may_wait=*/true);
}

Result<MemorySlot> SegmentedTier::TryAllocate(NamespaceId ns, uint64_t length) {
  absl::MutexLock lock(&mu_);
  return AllocateLocked(ns, length, /*may_wait=*/false);
}

Result<MemorySlot> SegmentedTier::AllocateLocked(NamespaceId ns, uint64_t length, bool may_wait) {
  bool renewed_one = false;
  for (;;) {
    Result<MemorySlot> slot = pages_.Allocate(ns, length);
    if (slot.ok() || slot.status().code() != StatusCode::kResourceExhausted) return slot;
    if (pages_.AtSegmentLimit(ns)) return slot;
    if (!may_wait && (renewing_ > 0 || pages_.vacant_segments() > 0)) {
      return Status::Unavailable("room in this tier needs a segment renewed");
    }
    if (renewing_ > 0) {
      // A segment being renewed in the background is about to be clean: wait for it rather
      // than report a full tier (the caller would evict for room that is on its way).
      AwaitRenewalsLocked();
      continue;
    }
    // At most one renewal per call: one that fails (out of descriptors or memory) must not take
    // every vacant segment out of use in one go.
    if (renewed_one) return slot;
    const std::optional<uint32_t> vacant = pages_.TakeLongestVacant();
    if (!vacant) return slot;
    renewed_one = true;
    if (!RenewTakenLocked(*vacant)) {
      return Status::ResourceExhausted(
          "no fresh memory for a " + pages_.tier_name() +
          " segment (the daemon's log says why): the room it would have given is not to be had");
    }
  }
}

Result<MemorySlot> SegmentedTier::AllocateBeside(NamespaceId ns, uint64_t length, uint32_t avoid) {
  absl::MutexLock lock(&mu_);
  return pages_.AllocateBeside(ns, length, avoid);
}

void SegmentedTier::SetDraining(uint32_t segment, bool draining) {
  absl::MutexLock lock(&mu_);
  pages_.SetDraining(segment, draining);
}

std::optional<uint32_t> SegmentedTier::TakeVacant() {
  absl::MutexLock lock(&mu_);
  std::optional<uint32_t> index = pages_.TakeLongestVacant();
  if (index) ++renewing_;
  return index;
}

void SegmentedTier::RenewedLocked(uint32_t index, SegmentPages::Renewal how) {
  --renewing_;
  RecycledLocked(index, how);
}

bool SegmentedTier::RenewTakenLocked(uint32_t index) {
  return RecycledLocked(index, RenewSegmentLocked(index));
}

bool SegmentedTier::RecycledLocked(uint32_t index, SegmentPages::Renewal how) {
  pages_.Recycled(index, how);
  if (how == SegmentPages::Renewal::kRenewed) return true;
  ++failed_renewals_;
  return false;
}

void SegmentedTier::WaitForRenewals() {
  absl::MutexLock lock(&mu_);
  AwaitRenewalsLocked();
}

void SegmentedTier::AwaitRenewalsLocked() {
  mu_.Await(absl::Condition(
      +[](uint32_t* renewing) { return *renewing == 0; }, &renewing_));
}

uint64_t SegmentedTier::failed_renewals() const {
  absl::MutexLock lock(&mu_);
  return failed_renewals_;
}

void SegmentedTier::Free(const MemorySlot& slot) {
  absl::MutexLock lock(&mu_);
  pages_.Free(slot);
}

uint32_t SegmentedTier::segment_count() const {
  absl::MutexLock lock(&mu_);
  return pages_.segment_count();
}

uint64_t SegmentedTier::SegmentUsedBytes(uint32_t segment) const {
  absl::MutexLock lock(&mu_);
  return pages_.used_bytes(segment);
}

std::vector<MemoryTier::SegmentUse> SegmentedTier::SegmentUses() const {
  absl::MutexLock lock(&mu_);
  std::vector<SegmentUse> out(pages_.segment_count());
  for (uint32_t i = 0; i < out.size(); ++i) {
    out[i] = {pages_.OwnerOf(i), pages_.used_bytes(i), pages_.draining(i)};
  }
  return out;
}

NamespaceId SegmentedTier::SegmentOwner(uint32_t segment) const {
  absl::MutexLock lock(&mu_);
  return pages_.OwnerOf(segment);
}

uint64_t SegmentedTier::allocated_bytes() const {
  absl::MutexLock lock(&mu_);
  return pages_.allocated_bytes();
}

void SegmentedTier::SetSegmentLimit(NamespaceId ns, uint32_t max_segments) {
  absl::MutexLock lock(&mu_);
  pages_.SetSegmentLimit(ns, max_segments);
}

void SegmentedTier::SetDefaultSegmentLimit(uint32_t max_segments) {
  absl::MutexLock lock(&mu_);
  pages_.SetDefaultSegmentLimit(max_segments);
}

uint32_t SegmentedTier::SegmentsOf(NamespaceId ns) const {
  absl::MutexLock lock(&mu_);
  return pages_.SegmentsOf(ns);
}

bool SegmentedTier::AtSegmentLimit(NamespaceId ns) const {
  absl::MutexLock lock(&mu_);
  return pages_.AtSegmentLimit(ns);
}

}  // namespace kvpool::tiers
