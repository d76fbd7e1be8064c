// StagingPool (client/device_buffers.h): bounce buffers of at least the size asked, in powers of
// two, reused once given back, freed beyond what the pool keeps, and alive while any handle is,
// the pool's own handle included. (No GPU here: the buffers are not pinned.)

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "client/device_buffers.h"

namespace kvpool::client {
namespace {

TEST(StagingPoolTest, BuffersAreAtLeastTheSizeAskedAndReusedWhenGivenBack) {
  auto pool = std::make_shared<StagingPool>();
  std::shared_ptr<StagingPool::Buffer> a = pool->Take(100000, -1);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->capacity, size_t{128} << 10);
  std::memset(a->data, 0x5a, a->capacity);  // all of it is ours to write
  std::shared_ptr<StagingPool::Buffer> small = pool->Take(1, -1);
  EXPECT_EQ(small->capacity, size_t{64} << 10);
  uint8_t* const first = a->data;
  a.reset();
  std::shared_ptr<StagingPool::Buffer> b = pool->Take(70000, -1);  // the same size class
  EXPECT_EQ(b->data, first) << "a buffer given back is taken again";
  std::shared_ptr<StagingPool::Buffer> c = pool->Take(70000, -1);
  EXPECT_NE(c->data, first) << "a buffer in use is not handed out twice";
}

TEST(StagingPoolTest, KeepsNoMoreThanItsLimitAndOutlivesNothingItLent) {
  auto pool = std::make_shared<StagingPool>();
  const size_t big = StagingPool::kKeepBytes / 2;
  std::vector<std::shared_ptr<StagingPool::Buffer>> held;
  for (int i = 0; i < 3; ++i) held.push_back(pool->Take(big, -1));
  EXPECT_EQ(pool->kept_bytes(), 0u);
  held.clear();  // two are kept, the third freed
  EXPECT_EQ(pool->kept_bytes(), 2 * big);
  std::vector<std::shared_ptr<StagingPool::Buffer>> again;
  for (int i = 0; i < 3; ++i) again.push_back(pool->Take(big, -1));
  EXPECT_EQ(pool->kept_bytes(), 0u);
  // A buffer handed out stays usable after the pool's last outside handle goes.
  std::shared_ptr<StagingPool::Buffer> kept = pool->Take(4096, -1);
  pool.reset();
  again.clear();
  std::memset(kept->data, 1, kept->capacity);
  kept.reset();  // returns to (and then destroys) the pool
}

TEST(StagingPoolTest, BuffersKeptUnusedForItsIdleTimeAreFreed) {
  auto pool = std::make_shared<StagingPool>(std::chrono::milliseconds(30));
  std::shared_ptr<StagingPool::Buffer> a = pool->Take(100000, -1);
  std::shared_ptr<StagingPool::Buffer> b = pool->Take(1, -1);
  a.reset();
  EXPECT_EQ(pool->kept_bytes(), size_t{128} << 10);
  std::this_thread::sleep_for(std::chrono::milliseconds(80));
  b.reset();  // giving one back frees the one kept unused since
  EXPECT_EQ(pool->kept_bytes(), size_t{64} << 10);
  std::this_thread::sleep_for(std::chrono::milliseconds(80));
  std::shared_ptr<StagingPool::Buffer> c = pool->Take(4096, -1);  // and so does a take
  EXPECT_EQ(pool->kept_bytes(), 0u);
  EXPECT_NE(c, nullptr);
}

}  // namespace
}  // namespace kvpool::client
