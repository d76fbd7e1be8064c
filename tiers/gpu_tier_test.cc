// GpuTier over the device double of tests/support/fake_device.h: slots in namespace-owned
// segments of device memory, copies in and out byte exact, quotas, and the isolation rule: an
// emptied segment is renewed (fresh, zeroed memory, new generation) before another namespace gets
// it, and a descriptor exported before that still reaches only the old memory.

#include "tiers/gpu_tier.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "tests/support/daemon_process.h"
#include "tests/support/fake_device.h"
#include "tests/support/status_matchers.h"

namespace kvpool::tiers {
namespace {

using kernels::CopyDirection;
using testing::BlockBytes;
using testing::FakeDevice;

constexpr uint64_t kSegment = 1 << 20;

class GpuTierTest : public ::testing::Test {
 protected:
  GpuTierTest() : tier_(device_.CreateArena(kSegment, 4)) {}

  // Copies `bytes` into `slot` through the tier's copy engine.
  void Fill(const MemorySlot& slot, const std::vector<uint8_t>& bytes) {
    ASSERT_OK(tier_.copies().CopyAsync(tier_.Data(slot), bytes.data(), bytes.size(),
                                       CopyDirection::kHostToDevice, nullptr));
    ASSERT_OK(tier_.copies().Wait(nullptr));
  }
  std::vector<uint8_t> Drain(const MemorySlot& slot) {
    std::vector<uint8_t> out(slot.length);
    EXPECT_OK(tier_.copies().CopyAsync(out.data(), tier_.Data(slot), slot.length,
                                       CopyDirection::kDeviceToHost, nullptr));
    EXPECT_OK(tier_.copies().Wait(nullptr));
    return out;
  }

  FakeDevice device_{3};
  GpuTier tier_;
};

TEST_F(GpuTierTest, SlotsAreDeviceMemoryAndRoundTripExactly) {
  EXPECT_EQ(tier_.id(), Tier::kGpu);
  EXPECT_EQ(tier_.device(), 3);
  EXPECT_EQ(tier_.capacity_bytes(), 4 * kSegment);
  std::vector<MemorySlot> slots;
  std::vector<std::vector<uint8_t>> ref;
  for (uint64_t size :
       {uint64_t{1}, uint64_t{4095}, uint64_t{4096}, uint64_t{70000}, kSegment / 2}) {
    auto slot = tier_.Allocate(/*ns=*/1, size);
    ASSERT_TRUE(slot.ok()) << slot.status().ToString();
    EXPECT_EQ(slot->offset % MemoryTier::kPageBytes, 0u);
    EXPECT_EQ(device_.DeviceOf(tier_.Data(*slot)).value(), 3);
    ref.push_back(BlockBytes(size, size));
    Fill(*slot, ref.back());
    slots.push_back(*slot);
  }
  for (size_t i = 0; i < slots.size(); ++i) EXPECT_EQ(Drain(slots[i]), ref[i]) << i;
  const MemoryTierStats s = tier_.GetStats();
  EXPECT_EQ(s.blocks, slots.size());
  EXPECT_TRUE(s.locked);
  EXPECT_GT(s.allocated_bytes, s.payload_bytes);
  for (const MemorySlot& slot : slots) tier_.Free(slot);
  EXPECT_EQ(tier_.allocated_bytes(), 0u);
}

TEST_F(GpuTierTest, RefusesEmptyAndOversizeBlocksAndRunsOut) {
  auto empty = tier_.Allocate(1, 0);
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);
  auto big = tier_.Allocate(1, kSegment + 1);
  EXPECT_EQ(big.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(big.status().message().find("gpu 3"), std::string::npos) << big.status().ToString();
  for (int i = 0; i < 4; ++i) {
    auto whole = tier_.Allocate(10 + i, kSegment);
    ASSERT_OK(whole.status());
  }
  auto full = tier_.Allocate(1, 4096);
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted);
}

TEST_F(GpuTierTest, QuotaCountsSegments) {
  tier_.SetSegmentLimit(7, 1);
  auto first = tier_.Allocate(7, kSegment / 2);
  auto second = tier_.Allocate(7, kSegment / 2);
  ASSERT_OK(first.status());
  ASSERT_OK(second.status());
  EXPECT_TRUE(tier_.AtSegmentLimit(7));
  auto over = tier_.Allocate(7, 4096);
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(tier_.SegmentsOf(7), 1u);
  auto others = tier_.Allocate(8, 4096);  // others are not limited
  ASSERT_OK(others.status());
}

TEST_F(GpuTierTest, SegmentsAreExportedOnlyToTheirOwnerAndRenewedBeforeReuse) {
  const std::vector<uint8_t> secret = BlockBytes(1, 8192);
  auto a = tier_.Allocate(/*ns=*/1, secret.size());
  ASSERT_TRUE(a.ok());
  Fill(*a, secret);
  const SegmentLocation loc = tier_.Locate(a->offset);
  auto other = tier_.ExportSegment(loc.segment, loc.generation, /*ns=*/2, false);
  EXPECT_EQ(other.status().code(), StatusCode::kNotFound);  // as for a stale generation
  auto fd = tier_.ExportSegment(loc.segment, loc.generation, /*ns=*/1, false);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  // The fake's descriptor is a memfd: map what namespace 1's client would import.
  void* old_map = mmap(nullptr, kSegment, PROT_READ, MAP_SHARED, *fd, 0);
  ASSERT_NE(old_map, MAP_FAILED);
  close(*fd);
  EXPECT_EQ(std::memcmp(static_cast<uint8_t*>(old_map) + loc.offset, secret.data(), 8192), 0);

  tier_.Free(*a);  // the segment empties: vacant, still namespace 1's
  auto vacant = tier_.ExportSegment(loc.segment, loc.generation, 1, false);
  ASSERT_TRUE(vacant.ok()) << vacant.status().ToString();
  close(*vacant);
  // Four other namespaces take every segment, namespace 1's among them: each gets fresh, zeroed
  // memory, and namespace 1's descriptor of the old generation is refused.
  std::vector<MemorySlot> b;
  for (int i = 0; i < 4; ++i) {
    auto s = tier_.Allocate(/*ns=*/2 + i, kSegment);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(Drain(*s), std::vector<uint8_t>(kSegment, 0)) << "segment " << i;
    Fill(*s, std::vector<uint8_t>(kSegment, 0xEE));
    b.push_back(*s);
  }
  auto stale = tier_.ExportSegment(loc.segment, loc.generation, 1, false);
  EXPECT_EQ(stale.status().code(), StatusCode::kNotFound);
  // Namespace 1's old mapping still shows its own old bytes, none of the new owners'.
  EXPECT_EQ(std::memcmp(static_cast<uint8_t*>(old_map) + loc.offset, secret.data(), 8192), 0);
  munmap(old_map, kSegment);
}

}  // namespace
}  // namespace kvpool::tiers
