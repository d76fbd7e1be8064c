// TierStack: the order and kinds of tiers the tier manager accepts.

#include "tiers/tier.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "tiers/disk_tier.h"
#include "tiers/host_tier.h"

namespace kvpool::tiers {
namespace {

// A tier that only says where it sits: for checking the stack's rules, never run.
class PlacedOnly final : public StorageTier {
 public:
  explicit PlacedOnly(Tier t) : t_(t) {}
  Tier id() const override { return t_; }

 private:
  Tier t_;
};

class TierStackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvpool_tier_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    RocksStoreOptions ro;
    ro.path = dir_ + "/rocksdb";
    store_ = std::move(RocksStore::Open(ro)).value();
    disk_ = std::make_unique<DiskTier>(*store_);
    HostTierOptions ho;
    ho.capacity_bytes = 2 << 20;
    ho.segment_bytes = 1 << 20;
    ho.lock_memory = false;
    host_ = std::move(HostTier::Create(ho)).value();
  }
  void TearDown() override {
    disk_.reset();
    store_.reset();
    std::filesystem::remove_all(dir_);
  }
  std::string dir_;
  std::unique_ptr<RocksStore> store_;
  std::unique_ptr<DiskTier> disk_;
  std::unique_ptr<HostTier> host_;
};

TEST_F(TierStackTest, HostThenDiskIsTheStack) {
  Result<TierStack> s = TierStack::Create({host_.get(), disk_.get()});
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(&s->host(), host_.get());
  EXPECT_EQ(&s->disk(), disk_.get());
  ASSERT_EQ(s->tiers().size(), 2u);
  EXPECT_EQ(s->tiers()[0]->id(), Tier::kHost);
  EXPECT_EQ(s->tiers()[1]->id(), Tier::kDisk);
}

TEST_F(TierStackTest, RefusesWrongOrdersKindsAndTheRemoteTierItDoesNotRunYet) {
  EXPECT_EQ(TierStack::Create({disk_.get(), host_.get()}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(TierStack::Create({host_.get()}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(TierStack::Create({host_.get(), host_.get(), disk_.get()}).status().code(),
            StatusCode::kInvalidArgument);
  PlacedOnly not_memory(Tier::kHost);
  EXPECT_EQ(TierStack::Create({&not_memory, disk_.get()}).status().code(),
            StatusCode::kInvalidArgument);
  PlacedOnly not_a_gpu_tier(Tier::kGpu);
  Result<TierStack> with_gpu = TierStack::Create({&not_a_gpu_tier, host_.get(), disk_.get()});
  EXPECT_EQ(with_gpu.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(with_gpu.status().message().find("GpuTier"), std::string::npos);
  PlacedOnly remote(Tier::kRemote);
  Result<TierStack> with_remote = TierStack::Create({host_.get(), disk_.get(), &remote});
  EXPECT_EQ(with_remote.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(with_remote.status().message().find("remote"), std::string::npos);
}

TEST_F(TierStackTest, TheDiskTiersReadHandleIsDoneWhenHandedBack) {
  const BlockKey key{};
  uint8_t byte = 7;
  DiskWrite w;
  w.key = key;
  w.meta.size = 1;
  w.meta.checksum = 0;
  w.data = &byte;
  uint8_t dst = 0;
  std::unique_ptr<PendingRead> r = disk_->StartRead(1, key, w.meta, &dst);
  EXPECT_TRUE(r->IsReady());
  EXPECT_EQ(r->Wait().code(), StatusCode::kNotFound);  // nothing was written
}

}  // namespace
}  // namespace kvpool::tiers
