// HostTier: the memfd arena, its per-namespace segments and its page allocator.

#include "tiers/host_tier.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <functional>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "tiers/without_memfds_for_test.h"

namespace kvpool::tiers {
namespace {

constexpr uint64_t kSegment = 1ull << 20;
constexpr uint64_t kCapacity = 8 * kSegment;
constexpr uint64_t kPage = HostTier::kPageBytes;

// `spares`, `after` and `standby`: HostTierOptions::spare_segments, spare_after and
// standby_segments.
std::unique_ptr<HostTier> MakeTier(uint64_t capacity = kCapacity, uint64_t segment = kSegment,
                                   uint32_t spares = 0,
                                   std::chrono::milliseconds after = std::chrono::seconds(1),
                                   uint32_t standby = 0) {
  HostTierOptions o;
  o.capacity_bytes = capacity;
  o.segment_bytes = segment;
  o.lock_memory = false;
  o.spare_segments = spares;
  o.spare_after = after;
  o.standby_segments = standby;
  Result<std::unique_ptr<HostTier>> t = HostTier::Create(o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

HostSlot MustAllocate(HostTier& tier, NamespaceId ns, uint64_t length) {
  Result<HostSlot> s = tier.Allocate(ns, length);
  EXPECT_TRUE(s.ok()) << "allocating " << length << " for ns " << ns << ": "
                      << s.status().ToString();
  return s.ok() ? *s : HostSlot{};
}

uint64_t PagesOf(uint64_t length) { return (length + kPage - 1) / kPage * kPage; }

void Fill(HostTier& tier, const HostSlot& slot, uint8_t seed) {
  uint8_t* p = tier.Data(slot);
  for (uint64_t i = 0; i < slot.length; ++i) p[i] = static_cast<uint8_t>(seed + i * 31 + (i >> 9));
}

bool Holds(HostTier& tier, const HostSlot& slot, uint8_t seed) {
  const uint8_t* p = tier.Data(slot);
  for (uint64_t i = 0; i < slot.length; ++i) {
    if (p[i] != static_cast<uint8_t>(seed + i * 31 + (i >> 9))) return false;
  }
  return true;
}

TEST(HostTierTest, CreateRoundsCapacityToWholeSegments) {
  auto tier = MakeTier(kCapacity + kSegment / 2);
  ASSERT_TRUE(tier);
  EXPECT_EQ(tier->capacity_bytes(), kCapacity);
  EXPECT_EQ(tier->segment_bytes(), kSegment);
  EXPECT_EQ(tier->max_block_bytes(), kSegment);
  const HostTierStats s = tier->GetStats();
  EXPECT_EQ(s.segments, 8u);
  EXPECT_EQ(s.free_segments, 8u);
  EXPECT_EQ(s.allocated_bytes, 0u);
  EXPECT_EQ(s.blocks, 0u);
}

TEST(HostTierTest, CreateRejectsBadOptions) {
  HostTierOptions o;
  o.lock_memory = false;
  o.capacity_bytes = kCapacity;
  for (uint64_t seg : std::vector<uint64_t>{0, 1000, kPage + 1, kSegment + 100}) {
    o.segment_bytes = seg;
    Result<std::unique_ptr<HostTier>> t = HostTier::Create(o);
    ASSERT_FALSE(t.ok()) << seg;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << seg;
  }
  o.segment_bytes = kSegment;
  o.capacity_bytes = kSegment - kPage;  // smaller than one segment
  Result<std::unique_ptr<HostTier>> t = HostTier::Create(o);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
}

TEST(HostTierTest, LockMemoryFallsBackWhenNotAllowed) {
  HostTierOptions o;
  o.capacity_bytes = 2 * kSegment;
  o.segment_bytes = kSegment;
  o.lock_memory = true;  // may fail under a small RLIMIT_MEMLOCK: must still work, unlocked
  Result<std::unique_ptr<HostTier>> t = HostTier::Create(o);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  HostSlot s = MustAllocate(**t, 1, 10000);
  Fill(**t, s, 3);
  EXPECT_TRUE(Holds(**t, s, 3));
}

TEST(HostTierTest, AllocatesPageAlignedSlotsInsideTheArena) {
  auto tier = MakeTier();
  std::vector<HostSlot> slots;
  uint64_t payload = 0;
  uint64_t allocated = 0;
  for (uint64_t len : std::vector<uint64_t>{1, 4095, 4096, 4097, 12345, 65536, 100000, kSegment, 3,
                                            kSegment - 1}) {
    HostSlot s = MustAllocate(*tier, 1, len);
    slots.push_back(s);
    payload += len;
    allocated += PagesOf(len);
  }
  for (const HostSlot& s : slots) {
    EXPECT_TRUE(s.valid());
    EXPECT_EQ(s.offset % kPage, 0u) << s.offset;
    EXPECT_LE(s.offset + s.length, tier->capacity_bytes());
    // A block lives entirely inside one segment.
    EXPECT_EQ(s.offset / kSegment, (s.offset + s.length - 1) / kSegment) << s.offset;
  }
  // No two slots' pages overlap.
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const HostSlot& s : slots) ranges.emplace_back(s.offset, s.offset + PagesOf(s.length));
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) EXPECT_LE(ranges[i - 1].second, ranges[i].first);

  EXPECT_EQ(tier->allocated_bytes(), allocated);
  const HostTierStats st = tier->GetStats();
  EXPECT_EQ(st.allocated_bytes, allocated);
  EXPECT_EQ(st.payload_bytes, payload);
  EXPECT_EQ(st.blocks, slots.size());
  for (const HostSlot& s : slots) tier->Free(s);
  EXPECT_EQ(tier->allocated_bytes(), 0u);
  EXPECT_EQ(tier->GetStats().payload_bytes, 0u);
  EXPECT_EQ(tier->GetStats().blocks, 0u);
}

TEST(HostTierTest, ASegmentLimitBoundsTheSegmentsANamespaceHolds) {
  auto tier = MakeTier();
  ASSERT_NE(tier, nullptr);
  tier->SetSegmentLimit(1, 2);
  // One small block in each segment would pin many segments: the limit stops at two.
  HostSlot a = MustAllocate(*tier, 1, kSegment);
  HostSlot b = MustAllocate(*tier, 1, kSegment);
  EXPECT_EQ(tier->SegmentsOf(1), 2u);
  EXPECT_TRUE(tier->AtSegmentLimit(1));
  Result<HostSlot> over = tier->Allocate(1, kPage);
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(over.status().message().find("quota"), std::string::npos);
  // Others are not limited by it.
  HostSlot other = MustAllocate(*tier, 2, kSegment);
  EXPECT_FALSE(tier->AtSegmentLimit(2));
  // A segment that empties no longer counts.
  tier->Free(a);
  EXPECT_EQ(tier->SegmentsOf(1), 1u);
  HostSlot c = MustAllocate(*tier, 1, kPage);
  EXPECT_EQ(tier->SegmentsOf(1), 2u);
  // No limit again.
  tier->SetSegmentLimit(1, 0);
  HostSlot d = MustAllocate(*tier, 1, kSegment);
  EXPECT_EQ(tier->SegmentsOf(1), 3u);
  for (const HostSlot& s : {b, other, c, d}) tier->Free(s);
  EXPECT_EQ(tier->SegmentsOf(1), 0u);
  EXPECT_EQ(tier->allocated_bytes(), 0u);
}

TEST(HostTierTest, RefusesZeroAndTooLargeBlocks) {
  auto tier = MakeTier();
  Result<HostSlot> zero = tier->Allocate(1, 0);
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.status().code(), StatusCode::kInvalidArgument);
  for (uint64_t len : std::vector<uint64_t>{kSegment + 1, 2 * kSegment, kCapacity, UINT64_MAX}) {
    Result<HostSlot> big = tier->Allocate(1, len);
    ASSERT_FALSE(big.ok()) << len;
    EXPECT_EQ(big.status().code(), StatusCode::kInvalidArgument) << len;
  }
  EXPECT_EQ(tier->allocated_bytes(), 0u);
  EXPECT_EQ(tier->GetStats().free_segments, 8u);
  // Exactly one segment is the largest block.
  HostSlot s = MustAllocate(*tier, 1, kSegment);
  EXPECT_EQ(s.offset % kSegment, 0u);
}

TEST(HostTierTest, NamespacesNeverShareASegment) {
  auto tier = MakeTier();
  std::mt19937_64 rng(11);
  std::map<NamespaceId, std::set<uint64_t>> segments_of;
  std::vector<std::pair<NamespaceId, HostSlot>> slots;
  // Interleave three namespaces with small blocks until the arena is full.
  for (int i = 0;; ++i) {
    const NamespaceId ns = static_cast<NamespaceId>(1 + rng() % 3);
    const uint64_t len = 1 + rng() % (64 * 1024);
    Result<HostSlot> s = tier->Allocate(ns, len);
    if (!s.ok()) {
      EXPECT_EQ(s.status().code(), StatusCode::kResourceExhausted);
      break;
    }
    ASSERT_LT(i, 100000);
    EXPECT_EQ(tier->OwnerOf(s->offset), ns);
    EXPECT_EQ(tier->OwnerOf(s->offset + s->length - 1), ns);
    segments_of[ns].insert(s->offset / kSegment);
    slots.emplace_back(ns, *s);
  }
  ASSERT_EQ(segments_of.size(), 3u);
  std::set<uint64_t> all;
  size_t total = 0;
  for (const auto& [ns, segs] : segments_of) {
    total += segs.size();
    all.insert(segs.begin(), segs.end());
  }
  EXPECT_EQ(all.size(), total) << "a segment was handed to two namespaces";
  // Owners still right after everything was handed out.
  for (const auto& [ns, slot] : slots) EXPECT_EQ(tier->OwnerOf(slot.offset), ns);
}

TEST(HostTierTest, ReturnsEmptySegmentToPool) {
  auto tier = MakeTier();
  HostSlot a = MustAllocate(*tier, 1, 5000);
  HostSlot b = MustAllocate(*tier, 1, 7000);
  ASSERT_EQ(a.offset / kSegment, b.offset / kSegment);  // same namespace packs one segment
  EXPECT_EQ(tier->GetStats().free_segments, 7u);
  const uint64_t seg_start = a.offset / kSegment * kSegment;
  EXPECT_EQ(tier->OwnerOf(seg_start), 1u);

  tier->Free(a);
  EXPECT_EQ(tier->GetStats().free_segments, 7u);  // b still lives there
  EXPECT_EQ(tier->OwnerOf(seg_start), 1u);
  tier->Free(b);
  EXPECT_EQ(tier->GetStats().free_segments, 8u);
  EXPECT_EQ(tier->GetStats().vacant_segments, 1u);
  EXPECT_EQ(tier->OwnerOf(seg_start), 1u);  // vacant: still its memory
  EXPECT_EQ(tier->SegmentsOf(1), 0u);

  // Another namespace can now take every segment, that one included.
  std::set<uint64_t> taken;
  for (int i = 0; i < 8; ++i) {
    HostSlot s = MustAllocate(*tier, 2, kSegment);
    EXPECT_EQ(tier->OwnerOf(s.offset), 2u);
    taken.insert(s.offset / kSegment);
  }
  EXPECT_EQ(taken.size(), 8u);
  EXPECT_TRUE(taken.count(seg_start / kSegment));
  EXPECT_EQ(tier->GetStats().vacant_segments, 0u);
}

TEST(HostTierTest, AnEmptiedSegmentGoesBackToItsNamespaceWithItsMemoryAndMappings) {
  auto tier = MakeTier(2 * kSegment);
  HostSlot a = MustAllocate(*tier, 1, 3 * kPage);
  const SegmentLocation loc = tier->Locate(a.offset);
  Result<int> fd = tier->ExportSegment(loc.segment, loc.generation, 1, /*writable=*/false);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  auto* view = static_cast<uint8_t*>(mmap(nullptr, kSegment, PROT_READ, MAP_SHARED, *fd, 0));
  ASSERT_NE(view, MAP_FAILED);
  close(*fd);
  tier->Free(a);
  // Namespace 1 takes the same segment back, not the clean one: same memory, same generation,
  // and the mapping its client already has shows what is written there now.
  HostSlot b = MustAllocate(*tier, 1, 5 * kPage);
  EXPECT_EQ(b.offset / kSegment, a.offset / kSegment);
  EXPECT_EQ(tier->Locate(b.offset).generation, loc.generation);
  EXPECT_EQ(tier->GetStats().vacant_segments, 0u);
  EXPECT_EQ(tier->SegmentsOf(1), 1u);
  Fill(*tier, b, 9);
  EXPECT_EQ(std::memcmp(view + tier->Locate(b.offset).offset, tier->Data(b), b.length), 0);
  munmap(view, kSegment);
}

TEST(HostTierTest, AnotherNamespaceTakesAVacantSegmentOnlyWhenNoCleanOneIsLeft) {
  auto tier = MakeTier(3 * kSegment);
  HostSlot a = MustAllocate(*tier, 1, kPage);
  HostSlot a2 = MustAllocate(*tier, 1, kSegment);  // a second segment of namespace 1
  const uint32_t first = tier->Locate(a.offset).segment;
  const uint32_t second = tier->Locate(a2.offset).segment;
  tier->Free(a);
  tier->Free(a2);
  EXPECT_EQ(tier->GetStats().vacant_segments, 2u);
  // Namespace 2 gets the clean segment first, then the longest vacant one, renewed.
  HostSlot b = MustAllocate(*tier, 2, kSegment);
  EXPECT_NE(tier->Locate(b.offset).segment, first);
  EXPECT_NE(tier->Locate(b.offset).segment, second);
  const uint32_t gen_first = tier->Locate(uint64_t{first} * kSegment).generation;
  HostSlot c = MustAllocate(*tier, 2, kPage * 2 + kSegment / 2);
  EXPECT_EQ(tier->Locate(c.offset).segment, first);
  EXPECT_NE(tier->Locate(c.offset).generation, gen_first);
  EXPECT_EQ(tier->OwnerOf(c.offset), 2u);
  // Namespace 1 still has its other vacant segment, unrenewed.
  EXPECT_EQ(tier->OwnerOf(uint64_t{second} * kSegment), 1u);
  HostSlot d = MustAllocate(*tier, 1, kPage);
  EXPECT_EQ(tier->Locate(d.offset).segment, second);
}

// TryAllocate (an I/O thread's allocation) does what Allocate does without a renewal: where
// room needs another namespace's vacant segment renewed it is Unavailable and changes nothing;
// Allocate then renews it.
TEST(HostTierTest, TryAllocateNeverRenewsASegment) {
  auto tier = MakeTier(2 * kSegment);
  HostSlot a = MustAllocate(*tier, 1, kSegment);
  HostSlot own = MustAllocate(*tier, 1, kPage);  // namespace 1's second segment
  const uint32_t vacated = tier->Locate(a.offset).segment;
  const uint32_t generation = tier->Locate(a.offset).generation;
  tier->Free(a);
  ASSERT_EQ(tier->GetStats().vacant_segments, 1u);
  // Room in a segment of its own, or its own vacant one: as Allocate.
  Result<MemorySlot> mine = tier->TryAllocate(1, kPage);
  ASSERT_TRUE(mine.ok()) << mine.status().ToString();
  tier->Free(*mine);
  // Namespace 2 needs namespace 1's vacant segment renewed: refused, the segment untouched.
  Result<MemorySlot> other = tier->TryAllocate(2, kPage);
  EXPECT_EQ(other.status().code(), StatusCode::kUnavailable) << other.status().ToString();
  EXPECT_EQ(tier->OwnerOf(uint64_t{vacated} * kSegment), 1u);
  EXPECT_EQ(tier->Locate(uint64_t{vacated} * kSegment).generation, generation);
  HostSlot renewed = MustAllocate(*tier, 2, kPage);
  EXPECT_EQ(tier->Locate(renewed.offset).segment, vacated);
  EXPECT_NE(tier->Locate(renewed.offset).generation, generation);
  tier->Free(own);
}

// A renewal that fails before it touched the segment (no descriptor for a new memfd) leaves the
// segment as it was, its namespace's, instead of out of use for good: a daemon short of
// descriptors for a while loses no host memory.
TEST(HostTierTest, ARenewalOutOfDescriptorsLeavesTheSegmentWithItsNamespace) {
  auto tier = MakeTier(kSegment);  // one segment
  ASSERT_TRUE(tier);
  const HostSlot a = MustAllocate(*tier, 1, kSegment);
  const SegmentLocation loc = tier->Locate(a.offset);
  tier->Free(a);
  Status allocated;
  if (const int refused = WithoutMemfds([&] { allocated = tier->Allocate(2, kPage).status(); })) {
    GTEST_SKIP() << "no seccomp filter allowed here: " << std::strerror(refused);
  }
  EXPECT_EQ(allocated.code(), StatusCode::kResourceExhausted) << allocated.ToString();
  EXPECT_EQ(tier->GetStats().vacant_segments, 1u);
  EXPECT_EQ(tier->OwnerOf(a.offset), 1u);
  // Its namespace takes it back as it was (same memory, same generation)...
  HostSlot back = MustAllocate(*tier, 1, kPage);
  EXPECT_EQ(tier->Locate(back.offset).segment, loc.segment);
  EXPECT_EQ(tier->Locate(back.offset).generation, loc.generation);
  tier->Free(back);
  // ... and, descriptors back, another namespace gets it renewed.
  const HostSlot c = MustAllocate(*tier, 2, kPage);
  EXPECT_EQ(tier->Locate(c.offset).segment, loc.segment);
  EXPECT_NE(tier->Locate(c.offset).generation, loc.generation);
  EXPECT_EQ(tier->OwnerOf(c.offset), 2u);
}

// TakeVacant and RenewTaken give another namespace's vacant segment fresh memory ahead of the
// allocation that needs it (the tier manager renews without its own lock): taken, the segment is
// nobody's, so its namespace cannot take it back meanwhile; renewed, it is clean, of a new
// generation, and TryAllocate, which never renews, takes it. Without a descriptor for the new
// memfd the renewal fails, counted, and the segment stays its namespace's.
TEST(HostTierTest, ATakenVacantSegmentIsRenewedAheadOfTheAllocation) {
  auto tier = MakeTier(kSegment);  // one segment
  ASSERT_TRUE(tier);
  EXPECT_FALSE(tier->TakeVacant().has_value());
  const HostSlot a = MustAllocate(*tier, 1, kSegment);
  Fill(*tier, a, 7);
  const SegmentLocation loc = tier->Locate(a.offset);
  EXPECT_FALSE(tier->TakeVacant().has_value()) << "a segment in use was taken";
  tier->Free(a);
  EXPECT_EQ(tier->TryAllocate(2, kPage).status().code(), StatusCode::kUnavailable);

  std::optional<uint32_t> taken = tier->TakeVacant();
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(*taken, loc.segment);
  // Taken: its own namespace cannot have it back, and nobody may allocate until it is renewed.
  EXPECT_EQ(tier->TryAllocate(1, kPage).status().code(), StatusCode::kUnavailable);
  Status failed;
  if (const int refused = WithoutMemfds([&] { failed = tier->RenewTaken(*taken); })) {
    GTEST_SKIP() << "no seccomp filter allowed here: " << std::strerror(refused);
  }
  EXPECT_FALSE(failed.ok());
  EXPECT_EQ(tier->failed_renewals(), 1u);
  EXPECT_EQ(tier->OwnerOf(a.offset), 1u);  // back with its namespace, vacant
  EXPECT_EQ(tier->GetStats().vacant_segments, 1u);

  taken = tier->TakeVacant();
  ASSERT_TRUE(taken.has_value());
  ASSERT_TRUE(tier->RenewTaken(*taken).ok());
  tier->WaitForRenewals();  // none under way: returns at once
  EXPECT_EQ(tier->GetStats().vacant_segments, 0u);
  EXPECT_EQ(tier->OwnerOf(a.offset), kNoNamespace);
  Result<HostSlot> b = tier->TryAllocate(2, kPage);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(tier->Locate(b->offset).segment, loc.segment);
  EXPECT_NE(tier->Locate(b->offset).generation, loc.generation);
  EXPECT_EQ(tier->OwnerOf(b->offset), 2u);
  std::vector<uint8_t> zeros(kPage, 0);
  EXPECT_EQ(std::memcmp(tier->Data(*b), zeros.data(), kPage), 0) << "fresh memory is not zero";
}

// Namespace `ns`'s own mappings of the segment that holds `loc`, read-only and writable, as a
// client keeps them: what it must see after the segment goes to another namespace.
struct KeptMappings {
  uint8_t* view = nullptr;
  uint8_t* write = nullptr;
};
KeptMappings MapAsAClient(HostTier& tier, const SegmentLocation& loc, NamespaceId ns) {
  Result<int> ro = tier.ExportSegment(loc.segment, loc.generation, ns, false);
  Result<int> rw = tier.ExportSegment(loc.segment, loc.generation, ns, true);
  EXPECT_TRUE(ro.ok() && rw.ok());
  if (!ro.ok() || !rw.ok()) return {};
  auto* view = static_cast<uint8_t*>(mmap(nullptr, kSegment, PROT_READ, MAP_SHARED, *ro, 0));
  auto* write =
      static_cast<uint8_t*>(mmap(nullptr, kSegment, PROT_READ | PROT_WRITE, MAP_SHARED, *rw, 0));
  close(*ro);
  close(*rw);
  EXPECT_NE(view, MAP_FAILED);
  EXPECT_NE(write, MAP_FAILED);
  if (view == MAP_FAILED || write == MAP_FAILED) return {};
  return {view, write};
}

// Polls `done` for up to 5 s (the spare thread works in the background).
void WaitUntil(const std::function<bool()>& done) {
  for (int i = 0; i < 500 && !done(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

TEST(HostTierTest, ASpareThreadRenewsTheLongestVacantSegmentAheadOfNeed) {
  auto made = MakeTier(3 * kSegment, kSegment, /*spares=*/1, std::chrono::milliseconds(20));
  ASSERT_TRUE(made);
  HostTier& tier = *made;
  std::vector<HostSlot> full;
  for (int i = 0; i < 3; ++i) full.push_back(MustAllocate(tier, 1, kSegment));
  Fill(tier, full[0], 5);
  const SegmentLocation loc = tier.Locate(full[0].offset);
  Result<int> fd = tier.ExportSegment(loc.segment, loc.generation, 1, /*writable=*/false);
  ASSERT_TRUE(fd.ok());
  auto* old_view = static_cast<uint8_t*>(mmap(nullptr, kSegment, PROT_READ, MAP_SHARED, *fd, 0));
  ASSERT_NE(old_view, MAP_FAILED);
  close(*fd);
  tier.Free(full[0]);
  // The thread renews it in the background: clean, owned by nobody, a new generation.
  WaitUntil([&] {
    return tier.GetStats().free_segments == 1 &&
           tier.Locate(full[0].offset).generation != loc.generation;
  });
  EXPECT_EQ(tier.GetStats().vacant_segments, 0u);
  EXPECT_EQ(tier.GetStats().free_segments, 1u);
  EXPECT_EQ(tier.OwnerOf(full[0].offset), kNoNamespace);
  const uint32_t renewed = tier.Locate(full[0].offset).generation;
  EXPECT_NE(renewed, loc.generation);
  // Namespace 2 takes it with no renewal of its own, and namespace 1's old mapping never sees
  // what namespace 2 writes.
  HostSlot b = MustAllocate(tier, 2, kSegment);
  EXPECT_EQ(b.offset, full[0].offset);
  EXPECT_EQ(tier.Locate(b.offset).generation, renewed);
  std::memset(tier.Data(b), 0x5E, b.length);
  for (uint64_t i = 0; i < b.length; i += 97) ASSERT_NE(old_view[i], 0x5E) << i;
  munmap(old_view, kSegment);
  // Emptied segments beyond the one spare stay vacant, their namespace's.
  tier.Free(full[1]);
  tier.Free(b);
  WaitUntil([&] {
    const HostTierStats st = tier.GetStats();
    return st.free_segments == 2 && st.vacant_segments == 1;
  });
  EXPECT_EQ(tier.GetStats().free_segments, 2u);
  EXPECT_EQ(tier.GetStats().vacant_segments, 1u);
}

TEST(HostTierTest, ARenewalTakesTheMemoryMadeAheadAndTheOldPagesAreReleasedLater) {
  auto made = MakeTier(kSegment, kSegment, /*spares=*/0, std::chrono::seconds(1), /*standby=*/1);
  ASSERT_TRUE(made);
  HostTier& tier = *made;  // one segment: each namespace in turn needs it renewed
  WaitUntil([&] { return tier.StandbyReady() == 1; });
  ASSERT_EQ(tier.StandbyReady(), 1u);
  EXPECT_EQ(tier.GetStats().renewals, 0u);

  HostSlot a = MustAllocate(tier, 1, 2 * kPage);
  Fill(tier, a, 7);
  const SegmentLocation loc = tier.Locate(a.offset);
  const KeptMappings kept = MapAsAClient(tier, loc, 1);
  ASSERT_NE(kept.view, nullptr);
  uint8_t* old_view = kept.view;
  uint8_t* old_write = kept.write;
  tier.Free(a);

  // Namespace 2 gets the segment renewed under the tier's lock (Allocate), from the standby.
  HostSlot b = MustAllocate(tier, 2, 2 * kPage);
  ASSERT_EQ(b.offset, a.offset);
  EXPECT_NE(tier.Locate(b.offset).generation, loc.generation);
  HostTierStats st = tier.GetStats();
  EXPECT_EQ(st.renewals, 1u);
  EXPECT_EQ(st.renewals_from_standby, 1u);
  std::vector<uint8_t> zeros(b.length, 0);
  EXPECT_EQ(std::memcmp(tier.Data(b), zeros.data(), b.length), 0) << "standby memory not fresh";
  std::memset(tier.Data(b), 0x5E, b.length);
  {  // namespace 2's clients see what the tier wrote, through the segment's new memfd
    const SegmentLocation now = tier.Locate(b.offset);
    Result<int> fd = tier.ExportSegment(now.segment, now.generation, 2, false);
    ASSERT_TRUE(fd.ok());
    auto* view = static_cast<uint8_t*>(mmap(nullptr, kSegment, PROT_READ, MAP_SHARED, *fd, 0));
    ASSERT_NE(view, MAP_FAILED);
    close(*fd);
    for (uint64_t i = 0; i < b.length; ++i) ASSERT_EQ(view[now.offset + i], 0x5E) << i;
    munmap(view, kSegment);
  }
  // The old memfd's pages are released by the thread, after the renewal (namespace 1's block
  // starts with a 7). Namespace 1's old mappings neither see namespace 2's bytes nor can they
  // change them.
  WaitUntil([&] { return old_view[loc.offset] == 0; });
  EXPECT_EQ(old_view[loc.offset], 0) << "the old memfd's pages were never released";
  for (uint64_t i = 0; i < b.length; ++i) ASSERT_NE(old_view[loc.offset + i], 0x5E) << i;
  std::memset(old_write + loc.offset, 0x11, b.length);
  for (uint64_t i = 0; i < b.length; ++i) ASSERT_EQ(tier.Data(b)[i], 0x5E) << i;
  munmap(old_view, kSegment);
  munmap(old_write, kSegment);

  // The next standby is made; a renewal without the tier's lock (TakeVacant) takes it too.
  WaitUntil([&] { return tier.StandbyReady() == 1; });
  ASSERT_EQ(tier.StandbyReady(), 1u);
  tier.Free(b);
  std::optional<uint32_t> taken = tier.TakeVacant();
  ASSERT_TRUE(taken.has_value());
  ASSERT_TRUE(tier.RenewTaken(*taken).ok());
  st = tier.GetStats();
  EXPECT_EQ(st.renewals, 2u);
  EXPECT_EQ(st.renewals_from_standby, 2u);
  Result<HostSlot> c = tier.TryAllocate(3, kSegment);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  zeros.assign(kSegment, 0);
  EXPECT_EQ(std::memcmp(tier.Data(*c), zeros.data(), kSegment), 0) << "standby memory not fresh";
  Fill(tier, *c, 9);
  EXPECT_TRUE(Holds(tier, *c, 9));
  // Without a standby ready (taken, its successor not made yet, or none asked for), a renewal
  // makes its memory on the spot, as before.
  tier.Free(*c);
  WaitUntil([&] { return tier.StandbyReady() == 1; });
  HostSlot d = MustAllocate(tier, 4, kSegment);
  tier.Free(d);
  HostSlot e = MustAllocate(tier, 5, kSegment);  // right after: its standby may not be made yet
  st = tier.GetStats();
  EXPECT_EQ(st.renewals, 4u);
  EXPECT_GE(st.renewals_from_standby, 3u);
  std::memset(tier.Data(e), 0x22, e.length);
}

TEST(HostTierTest, TheSpareThreadLeavesASegmentItsNamespaceTakesBackAtOnce) {
  // The thread renews nothing vacant less than 30 s, longer than this test.
  auto made = MakeTier(2 * kSegment, kSegment, /*spares=*/2, std::chrono::seconds(30));
  ASSERT_TRUE(made);
  HostTier& tier = *made;
  HostSlot a = MustAllocate(tier, 1, kSegment);
  HostSlot a2 = MustAllocate(tier, 1, kSegment);
  const uint32_t generation = tier.Locate(a.offset).generation;
  // As an eviction to make room does: empty a segment, and take it again.
  tier.Free(a);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  HostSlot again = MustAllocate(tier, 1, kSegment);
  EXPECT_EQ(again.offset, a.offset);
  EXPECT_EQ(tier.Locate(again.offset).generation, generation);  // its clients' mappings hold
  tier.Free(a2);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(tier.GetStats().vacant_segments, 1u);
  EXPECT_EQ(tier.OwnerOf(a2.offset), 1u);
}

TEST(HostTierTest, VacantSegmentsDoNotCountTowardsAQuota) {
  auto tier = MakeTier(2 * kSegment);
  tier->SetSegmentLimit(1, 1);
  HostSlot a = MustAllocate(*tier, 1, kPage);
  EXPECT_TRUE(tier->AtSegmentLimit(1));
  tier->Free(a);
  EXPECT_FALSE(tier->AtSegmentLimit(1));
  HostSlot b = MustAllocate(*tier, 1, kPage);
  EXPECT_EQ(b.offset / kSegment, a.offset / kSegment);
  EXPECT_TRUE(tier->AtSegmentLimit(1));
  // At its quota it renews nobody's vacant segment: the other namespace's stays.
  HostSlot c = MustAllocate(*tier, 2, kPage);
  tier->Free(c);
  Result<HostSlot> over = tier->Allocate(1, kSegment);
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(tier->OwnerOf(c.offset), 2u);
  EXPECT_EQ(tier->GetStats().vacant_segments, 1u);
}

TEST(HostTierTest, FullArenaGivesResourceExhausted) {
  auto tier = MakeTier();
  std::vector<HostSlot> slots;
  for (int i = 0; i < 8; ++i) slots.push_back(MustAllocate(*tier, 1, kSegment));
  Result<HostSlot> more = tier->Allocate(1, 1);
  ASSERT_FALSE(more.ok());
  EXPECT_EQ(more.status().code(), StatusCode::kResourceExhausted);
  Result<HostSlot> other = tier->Allocate(2, 1);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), StatusCode::kResourceExhausted);
  // Freeing one block makes room again.
  tier->Free(slots[3]);
  HostSlot again = MustAllocate(*tier, 2, 100);
  EXPECT_EQ(again.offset / kSegment, slots[3].offset / kSegment);
}

TEST(HostTierTest, FreePagesOfOtherNamespacesDoNotHelp) {
  auto tier = MakeTier();
  // Eight namespaces each take a segment with one small block: lots of free pages, but none
  // in a segment a ninth namespace may use.
  for (NamespaceId ns = 1; ns <= 8; ++ns) MustAllocate(*tier, ns, 4096);
  Result<HostSlot> s = tier->Allocate(9, 4096);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kResourceExhausted);
  // The owners still have room in their own segments.
  for (NamespaceId ns = 1; ns <= 8; ++ns) MustAllocate(*tier, ns, kSegment - 4096);
  EXPECT_EQ(tier->allocated_bytes(), kCapacity);
}

TEST(HostTierTest, FindsRunsAcrossBitmapWordsAndFillsHoles) {
  // 64 pages per bitmap word: a run spanning a word boundary must be found, and a freed hole
  // must be reused before the namespace takes another segment.
  auto tier = MakeTier(2 * kSegment);
  std::vector<HostSlot> pages;
  for (int i = 0; i < 256; ++i) pages.push_back(MustAllocate(*tier, 1, kPage));
  EXPECT_EQ(tier->GetStats().free_segments, 1u);
  // Free pages 60..67 (across the first word boundary).
  for (int i = 60; i < 68; ++i) tier->Free(pages[i]);
  HostSlot run = MustAllocate(*tier, 1, 8 * kPage);
  EXPECT_EQ(run.offset, pages[60].offset);
  EXPECT_EQ(tier->GetStats().free_segments, 1u);
  // No 2-page hole left in the first segment: a second segment is taken.
  tier->Free(pages[100]);
  HostSlot two = MustAllocate(*tier, 1, 2 * kPage);
  EXPECT_NE(two.offset / kSegment, pages[0].offset / kSegment);
  HostSlot one = MustAllocate(*tier, 1, kPage);
  EXPECT_EQ(one.offset, pages[100].offset);
}

TEST(HostTierTest, FragmentationIsSensibleAfterACheckerboardOfFrees) {
  auto tier = MakeTier();
  HostTierStats s = tier->GetStats();
  EXPECT_EQ(s.largest_free_run, kSegment);
  EXPECT_DOUBLE_EQ(s.fragmentation, 0.0) << "an empty arena is not fragmented";

  // Fill every page with 4 KiB blocks.
  std::vector<HostSlot> slots;
  for (uint64_t i = 0; i < kCapacity / kPage; ++i) slots.push_back(MustAllocate(*tier, 1, kPage));
  s = tier->GetStats();
  EXPECT_EQ(s.allocated_bytes, kCapacity);
  EXPECT_EQ(s.largest_free_run, 0u);
  EXPECT_EQ(s.free_segments, 0u);
  EXPECT_DOUBLE_EQ(s.fragmentation, 0.0);

  // Free every other page: half the arena is free, in 4 KiB holes only.
  for (size_t i = 0; i < slots.size(); i += 2) tier->Free(slots[i]);
  s = tier->GetStats();
  EXPECT_EQ(s.allocated_bytes, kCapacity / 2);
  EXPECT_EQ(s.largest_free_run, kPage);
  EXPECT_GT(s.fragmentation, 0.99);
  EXPECT_LE(s.fragmentation, 1.0);
  // Free bytes are plenty, yet a two-page block does not fit anywhere.
  Result<HostSlot> two = tier->Allocate(1, 2 * kPage);
  ASSERT_FALSE(two.ok());
  EXPECT_EQ(two.status().code(), StatusCode::kResourceExhausted);

  // Free the rest of the first segment: one whole segment is free again.
  for (size_t i = 1; i < kSegment / kPage; i += 2) tier->Free(slots[i]);
  s = tier->GetStats();
  EXPECT_EQ(s.free_segments, 1u);
  EXPECT_EQ(s.largest_free_run, kSegment);
  EXPECT_DOUBLE_EQ(s.fragmentation, 0.0);

  // And everything.
  for (size_t i = kSegment / kPage + 1; i < slots.size(); i += 2) tier->Free(slots[i]);
  s = tier->GetStats();
  EXPECT_EQ(s.allocated_bytes, 0u);
  EXPECT_EQ(s.free_segments, 8u);
  EXPECT_DOUBLE_EQ(s.fragmentation, 0.0);
}

TEST(HostTierTest, FragmentationOfAPartlyUsedSegment) {
  auto tier = MakeTier(kSegment);  // one segment
  const uint64_t pages = kSegment / kPage;
  std::vector<HostSlot> slots;
  for (uint64_t i = 0; i < pages; ++i) slots.push_back(MustAllocate(*tier, 1, kPage));
  // Free a 16-page run and 16 single pages elsewhere: 32 pages free, largest run 16.
  for (int i = 0; i < 16; ++i) tier->Free(slots[i]);
  for (int i = 0; i < 16; ++i) tier->Free(slots[100 + 2 * i]);
  const HostTierStats s = tier->GetStats();
  EXPECT_EQ(s.largest_free_run, 16 * kPage);
  EXPECT_NEAR(s.fragmentation, 0.5, 1e-9);
}

TEST(HostTierTest, BytesWrittenToOneSlotDoNotDisturbOthers) {
  auto tier = MakeTier();
  std::mt19937_64 rng(3);
  struct Live {
    HostSlot slot;
    uint8_t seed;
  };
  std::vector<Live> live;
  uint8_t next_seed = 1;
  for (int round = 0; round < 400; ++round) {
    if (!live.empty() && rng() % 3 == 0) {
      const size_t victim = rng() % live.size();
      ASSERT_TRUE(Holds(*tier, live[victim].slot, live[victim].seed));
      tier->Free(live[victim].slot);
      live.erase(live.begin() + static_cast<long>(victim));
      continue;
    }
    const NamespaceId ns = static_cast<NamespaceId>(1 + rng() % 2);
    const uint64_t len = 1 + rng() % (3 * kPage + 123);
    Result<HostSlot> s = tier->Allocate(ns, len);
    if (!s.ok()) continue;
    Fill(*tier, *s, next_seed);
    live.push_back({*s, next_seed});
    ++next_seed;
  }
  ASSERT_GT(live.size(), 50u);
  for (const Live& l : live) EXPECT_TRUE(Holds(*tier, l.slot, l.seed)) << l.slot.offset;
}

TEST(HostTierTest, ExportedSegmentIsSharedReadOnly) {
  auto tier = MakeTier(2 * kSegment);
  HostSlot s = MustAllocate(*tier, 1, 3 * kPage + 5);
  Fill(*tier, s, 42);
  const SegmentLocation loc = tier->Locate(s.offset);
  Result<int> fd = tier->ExportSegment(loc.segment, loc.generation, 1, /*writable=*/false);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  // A client's mapping of the segment sees the same bytes...
  void* view = mmap(nullptr, kSegment, PROT_READ, MAP_SHARED, *fd, 0);
  ASSERT_NE(view, MAP_FAILED);
  EXPECT_EQ(std::memcmp(static_cast<const uint8_t*>(view) + loc.offset, tier->Data(s), s.length),
            0);
  // ...and cannot be made writable through a read-only descriptor.
  EXPECT_EQ(mmap(nullptr, kSegment, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0), MAP_FAILED);
  EXPECT_EQ(errno, EACCES);
  munmap(view, kSegment);
  close(*fd);
}

TEST(HostTierTest, ExportedSegmentCannotBeShrunkUnderTheDaemon) {
  auto tier = MakeTier(2 * kSegment);
  HostSlot s = MustAllocate(*tier, 1, kPage);
  const SegmentLocation loc = tier->Locate(s.offset);
  for (bool writable : {false, true}) {
    Result<int> fd = tier->ExportSegment(loc.segment, loc.generation, 1, writable);
    ASSERT_TRUE(fd.ok());
    // Reopened writable through /proc, as a hostile client could.
    const std::string path = "/proc/self/fd/" + std::to_string(*fd);
    const int rw = open(path.c_str(), O_RDWR);
    ASSERT_GE(rw, 0);
    EXPECT_NE(ftruncate(rw, 0), 0) << "a client could shrink the segment (SIGBUS in the daemon)";
    EXPECT_NE(ftruncate(rw, 2 * kSegment), 0);
    close(rw);
    close(*fd);
  }
  Fill(*tier, s, 3);  // the daemon's mapping still works
}

TEST(HostTierTest, ExportRefusesOtherNamespacesAndStaleGenerations) {
  auto tier = MakeTier(2 * kSegment);
  HostSlot s = MustAllocate(*tier, 1, kPage);
  const SegmentLocation loc = tier->Locate(s.offset);
  // Another namespace's segment reads as a stale generation does: nothing about it is told.
  EXPECT_EQ(tier->ExportSegment(loc.segment, loc.generation, 2, false).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(tier->ExportSegment(loc.segment, loc.generation, 2, true).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(tier->ExportSegment(loc.segment, loc.generation + 1, 2, false).status().code(),
            StatusCode::kNotFound);
  // A free segment belongs to nobody.
  const uint32_t other = 1 - loc.segment;
  EXPECT_EQ(tier->ExportSegment(other, tier->Locate(other * kSegment).generation, 1, false)
                .status()
                .code(),
            StatusCode::kNotFound);
  tier->Free(s);
  // Vacant, it is still namespace 1's; once namespace 2 takes it, that generation is gone.
  Result<int> vacant = tier->ExportSegment(loc.segment, loc.generation, 1, false);
  ASSERT_TRUE(vacant.ok());
  close(*vacant);
  MustAllocate(*tier, 2, kSegment);
  MustAllocate(*tier, 2, kSegment);
  EXPECT_TRUE(tier->ExportSegment(loc.segment, loc.generation, 1, false).status().IsNotFound());
  EXPECT_NE(tier->Locate(s.offset).generation, loc.generation);
}

TEST(HostTierTest, RecycledSegmentNeverRevealsAnotherNamespace) {
  auto tier = MakeTier(kSegment);  // one segment: namespace 2 must get the one 1 used
  HostSlot a = MustAllocate(*tier, 1, 2 * kPage);
  Fill(*tier, a, 7);
  const SegmentLocation loc = tier->Locate(a.offset);
  const KeptMappings kept = MapAsAClient(*tier, loc, 1);
  ASSERT_NE(kept.view, nullptr);
  uint8_t* old_view = kept.view;
  uint8_t* old_write = kept.write;
  tier->Free(a);
  // Namespace 2 now owns the segment and writes a secret where namespace 1's block was.
  HostSlot b = MustAllocate(*tier, 2, 2 * kPage);
  ASSERT_EQ(b.offset, a.offset);
  std::memset(tier->Data(b), 0x5E, b.length);
  // Namespace 1's old mappings neither see the secret nor can they change it.
  for (uint64_t i = 0; i < b.length; ++i) ASSERT_NE(old_view[loc.offset + i], 0x5E) << i;
  std::memset(old_write + loc.offset, 0x11, b.length);
  for (uint64_t i = 0; i < b.length; ++i) ASSERT_EQ(tier->Data(b)[i], 0x5E) << i;
  munmap(old_view, kSegment);
  munmap(old_write, kSegment);
}

TEST(HostTierTest, HugePagesNeedSegmentsOfWholeHugePages) {
  HostTierOptions o;
  o.capacity_bytes = 4 * kSegment;
  o.segment_bytes = kSegment;  // 1 MiB
  o.lock_memory = false;
  o.huge_pages = true;
  Result<std::unique_ptr<HostTier>> t = HostTier::Create(o);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << t.status().ToString();
}

// Asked for, huge pages back the arena, and a client's mapping of it, where the kernel gives
// them to shared memory (shmem_enabled "advise" and up), and nothing changes where it does not;
// blocks hold, export and renew the same either way.
TEST(HostTierTest, HugePagesWhereTheKernelGivesThemToSharedMemory) {
  constexpr uint64_t kHuge = 2 * kSegment;  // 2 MiB segments
  const std::string mode = ShmemHugePageMode();
  const bool kernel_gives = ShmemHugePagesOnAdvice();
  HostTierOptions o;
  o.capacity_bytes = 3 * kHuge;
  o.segment_bytes = kHuge;
  o.lock_memory = false;
  o.huge_pages = true;
  Result<std::unique_ptr<HostTier>> made = HostTier::Create(o);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  HostTier& tier = **made;
  EXPECT_EQ(reinterpret_cast<uintptr_t>(tier.Data({0, 0})) % kHuge, 0u) << "arena not aligned";
  // Faulted in at once (not mlocked here): a client's mapping touching it first would make it
  // 4 KiB pages.
  const uint64_t at_start = tier.HugePageBytes();
  std::vector<HostSlot> slots;
  for (int i = 0; i < 3; ++i) slots.push_back(MustAllocate(tier, 1, kHuge));
  for (int i = 0; i < 3; ++i) Fill(tier, slots[i], static_cast<uint8_t>(i));
  const SegmentLocation loc = tier.Locate(slots[0].offset);
  Result<int> fd = tier.ExportSegment(loc.segment, loc.generation, 1, /*writable=*/false);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  auto* view = static_cast<uint8_t*>(mmap(nullptr, kHuge, PROT_READ, MAP_SHARED, *fd, 0));
  ASSERT_NE(view, MAP_FAILED);
  close(*fd);
  EXPECT_EQ(std::memcmp(view, tier.Data(slots[0]), kHuge), 0);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(Holds(tier, slots[i], static_cast<uint8_t>(i))) << i;
  // Another namespace takes an emptied segment: renewed (fresh memory, asked huge again).
  tier.Free(slots[0]);
  tier.Free(slots[1]);
  HostSlot b = MustAllocate(tier, 2, kHuge);
  ASSERT_TRUE(b.offset == slots[0].offset || b.offset == slots[1].offset);
  std::memset(tier.Data(b), 0x5E, b.length);
  for (uint64_t i = 0; i < kHuge; i += kPage) ASSERT_NE(view[i], 0x5E) << i;
  munmap(view, kHuge);
  EXPECT_TRUE(Holds(tier, slots[2], 2));
  if (!kernel_gives) {
    EXPECT_EQ(at_start, 0u) << "shmem_enabled " << mode;
    EXPECT_EQ(tier.HugePageBytes(), 0u) << "shmem_enabled " << mode;
    return;
  }
  // A free 2 MiB run is the kernel's to find, and a process may have THP turned off.
  if (at_start == 0) GTEST_SKIP() << "shmem_enabled " << mode << " but no huge page was given";
  EXPECT_GT(tier.HugePageBytes(), 0u);
}

}  // namespace
}  // namespace kvpool::tiers
