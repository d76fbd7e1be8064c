// Client::Borrow against a real kvpoold: blocks lent in place are the daemon's own copies in
// its shared-memory arena (no copy, no bytes in frames), held by leases until released; the
// memory outlives a release, a reconnect and the client itself; Verify shows a block whose
// lease ran out and whose slot was reused; blocks that cannot be lent in place (only on disk,
// the socket path) come as owned bytes; and the C API says the same.

#include <gtest/gtest.h>

#include <kvpool/kvpool.h>

#include <thread>

#include "common/checksum.h"
#include "tests/support/daemon_process.h"
#include "tests/support/status_matchers.h"

namespace kvpool::testing {
namespace {

constexpr size_t kMiB = 1u << 20;

BlockKey KeyOf(uint64_t i) {
  BlockKey k;
  std::memcpy(k.bytes.data(), &i, sizeof(i));
  k.bytes[31] = 0xB0;
  return k;
}

std::unique_ptr<Client> Connect(const DaemonProcess& d, DataPath path) {
  ClientOptions o = d.Options("borrow-test");
  o.data_path = path;
  auto c = Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(*c) : nullptr;
}

// Puts blocks first..first+n-1 (a chain) of `size` bytes each; returns their bytes.
std::vector<std::vector<uint8_t>> PutChain(Client& c, uint64_t first, int n, size_t size,
                                           uint64_t seed = 0) {
  std::vector<std::vector<uint8_t>> ref;
  std::vector<PutBlock> blocks;
  for (int i = 0; i < n; ++i) ref.push_back(BlockBytes(seed * 1000 + first + i, size));
  for (int i = 0; i < n; ++i) {
    blocks.push_back(
        {KeyOf(first + i), ref[i].data(), size, i ? KeyOf(first + i - 1) : BlockKey{}, {}});
  }
  auto put = c.Put(blocks);
  EXPECT_TRUE(put.ok() && put->all_ok());
  return ref;
}

std::vector<BlockKey> Keys(uint64_t first, int n) {
  std::vector<BlockKey> keys;
  for (int i = 0; i < n; ++i) keys.push_back(KeyOf(first + i));
  return keys;
}

std::vector<uint8_t> Bytes(const BlockView& v) {
  const auto* p = static_cast<const uint8_t*>(v.data);
  return {p, p + v.size};
}

uint64_t LeasesActive(Client& c) {
  auto s = c.Stats();
  EXPECT_TRUE(s.ok());
  return s.ok() ? s->leases_active : ~0ull;
}

TEST(BorrowTest, LendsTheDaemonsOwnCopiesUnderLeasesUntilReleased) {
  DaemonProcess d({"--host_capacity=64MiB", "--host_segment_size=8MiB"});
  ASSERT_OK(d.Start());
  auto c = Connect(d, DataPath::kSharedMemory);
  ASSERT_NE(c, nullptr);
  EXPECT_GT(c->server().lease_timeout.count(), 0);
  const auto ref = PutChain(*c, 1, 16, 256 << 10);
  std::vector<BlockKey> keys = Keys(1, 16);
  keys.push_back(KeyOf(999));  // a miss among the hits
  const uint64_t out_before = c->Stats()->bytes_out;

  auto b = c->Borrow(keys);
  ASSERT_OK(b.status());
  ASSERT_EQ(b->size(), 17u);
  for (int i = 0; i < 16; ++i) {
    const BlockView& v = (*b)[i];
    ASSERT_OK(v.status);
    EXPECT_EQ(v.tier, Tier::kHost);
    EXPECT_EQ(v.memory, Memory::kHost);
    EXPECT_EQ(Bytes(v), ref[i]) << "block " << i;
  }
  EXPECT_TRUE((*b)[16].status.IsNotFound());
  EXPECT_EQ((*b)[16].data, nullptr);
  EXPECT_EQ(LeasesActive(*c), 16u);

  // Lent, not copied: a second borrow of the same block points at the same bytes.
  auto again = c->Borrow(std::span(&keys[3], 1));
  ASSERT_OK(again.status());
  EXPECT_EQ((*again)[0].data, (*b)[3].data);
  EXPECT_EQ(LeasesActive(*c), 17u);
  EXPECT_OK(again->Release());
  EXPECT_OK(b->Verify());
  EXPECT_OK(b->Release());
  EXPECT_OK(b->Release());  // idempotent
  const DaemonStats s = WaitForStats(*c, [](const DaemonStats& s) { return s.leases_active == 0; });
  EXPECT_EQ(s.leases_active, 0u);
  EXPECT_EQ(s.bytes_out, out_before) << "bytes travelled in frames";
}

TEST(BorrowTest, LeasedBlocksAreNotEvictedWhileBorrowed) {
  DaemonProcess d({"--host_capacity=16MiB", "--host_segment_size=4MiB"});
  ASSERT_OK(d.Start());
  auto c = Connect(d, DataPath::kSharedMemory);
  ASSERT_NE(c, nullptr);
  const auto ref = PutChain(*c, 1, 4, kMiB);
  auto b = c->Borrow(Keys(1, 4));
  ASSERT_OK(b.status());
  auto ev = c->Evict(Tier::kHost);
  ASSERT_OK(ev.status());
  EXPECT_EQ(ev->evicted, 0u);
  EXPECT_EQ(ev->skipped, 4u);
  // Fill the host tier with other blocks: the borrowed ones stay where they are, unchanged.
  PutChain(*c, 100, 24, kMiB, /*seed=*/7);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(Bytes((*b)[i]), ref[i]) << "block " << i;
  EXPECT_OK(b->Verify());
}

TEST(BorrowTest, VerifyShowsABlockWhoseLeaseRanOutAndWhoseSlotWasReused) {
  DaemonProcess d({"--host_capacity=8MiB", "--host_segment_size=8MiB", "--lease_timeout_ms=200"});
  ASSERT_OK(d.Start());
  auto c = Connect(d, DataPath::kSharedMemory);
  ASSERT_NE(c, nullptr);
  const auto ref = PutChain(*c, 1, 4, kMiB);
  PutChain(*c, 5, 2, kMiB);  // another chain, kept in host: the segment never empties
  auto b = c->Borrow(Keys(1, 4), {.verify = false});
  ASSERT_OK(b.status());
  EXPECT_LE(b->lease_deadline(), std::chrono::steady_clock::now() + std::chrono::milliseconds(200));
  WaitForStats(*c, [](const DaemonStats& s) { return s.leases_active == 0; });
  // The leases ended by themselves: the blocks may go, and new blocks take their slots (the
  // segment keeps the other chain, so it is not renewed: the holes are reused in place).
  auto ev = c->Evict(Tier::kHost, Keys(1, 4));
  ASSERT_OK(ev.status());
  EXPECT_EQ(ev->evicted, 4u);
  PutChain(*c, 50, 4, kMiB, /*seed=*/3);
  const Status st = b->Verify();
  EXPECT_TRUE((st.code() == StatusCode::kCorruption)) << st.ToString();
  int changed = 0;
  for (const BlockView& v : b->views()) changed += (v.status.code() == StatusCode::kCorruption);
  EXPECT_GT(changed, 0);
}

TEST(BorrowTest, TheMemoryOutlivesAReconnectAndTheClient) {
  DaemonProcess d;
  ASSERT_OK(d.Start());
  auto c = Connect(d, DataPath::kSharedMemory);
  ASSERT_NE(c, nullptr);
  const auto ref = PutChain(*c, 1, 3, 300000);
  auto b = c->Borrow(Keys(1, 3));
  ASSERT_OK(b.status());
  // A reconnect unmaps the client's segments and ends the connection's leases; the views stay
  // mapped.
  ASSERT_OK(c->Reconnect());
  WaitForStats(*c, [](const DaemonStats& s) { return s.leases_active == 0; });
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Bytes((*b)[i]), ref[i]) << "block " << i;
  EXPECT_OK(b->Release());  // nothing to end on the old connection; nothing sent on the new
  auto b2 = c->Borrow(Keys(1, 3));
  ASSERT_OK(b2.status());
  c.reset();  // the client goes first
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Bytes((*b2)[i]), ref[i]) << "block " << i;
  EXPECT_OK(b2->Release());
}

TEST(BorrowTest, BlocksThatCannotBeLentInPlaceComeAsOwnedBytes) {
  DaemonProcess d;
  ASSERT_OK(d.Start());
  // Only on disk: the daemon reads it straight into the frame.
  auto shm = Connect(d, DataPath::kSharedMemory);
  ASSERT_NE(shm, nullptr);
  const auto ref = PutChain(*shm, 1, 2, 200000);
  ASSERT_OK(shm->Evict(Tier::kHost));
  auto where = shm->Where(Keys(1, 2));
  ASSERT_OK(where.status());
  ASSERT_EQ(*where, std::vector<Tier>(2, Tier::kDisk));
  auto b = shm->Borrow(Keys(1, 2));
  ASSERT_OK(b.status());
  for (int i = 0; i < 2; ++i) {
    ASSERT_OK((*b)[i].status);
    EXPECT_EQ((*b)[i].tier, Tier::kDisk);
    EXPECT_EQ(Bytes((*b)[i]), ref[i]);
    EXPECT_EQ((*b)[i].checksum, BlockChecksum(ref[i].data(), ref[i].size()));
  }
  // The socket path: every block comes in the frame.
  auto sock = Connect(d, DataPath::kSocket);
  ASSERT_NE(sock, nullptr);
  EXPECT_EQ(sock->server().lease_timeout.count(), 0);
  const auto ref2 = PutChain(*sock, 10, 2, 70000);
  auto s = sock->Borrow(Keys(10, 2));
  ASSERT_OK(s.status());
  for (int i = 0; i < 2; ++i) {
    ASSERT_OK((*s)[i].status);
    EXPECT_EQ((*s)[i].tier, Tier::kHost);
    EXPECT_EQ(Bytes((*s)[i]), ref2[i]);
  }
  EXPECT_OK(s->Verify());
  b = BorrowedBlocks();  // released
  const DaemonStats st =
      WaitForStats(*sock, [](const DaemonStats& s) { return s.leases_active == 0; });
  EXPECT_EQ(st.leases_active, 0u);
}

TEST(BorrowTest, TheCApiLendsAndReleases) {
  DaemonProcess d;
  ASSERT_OK(d.Start());
  auto c = Connect(d, DataPath::kSharedMemory);
  ASSERT_NE(c, nullptr);
  const auto ref = PutChain(*c, 1, 2, 5000);
  kvpool_client* cc = nullptr;
  ASSERT_EQ(kvpool_connect(d.socket_path().c_str(), "borrow-test", 5000, &cc), KVPOOL_OK)
      << kvpool_last_error(nullptr);
  kvpool_key keys[3];
  for (int i = 0; i < 3; ++i)
    std::memcpy(keys[i].bytes, KeyOf(i == 2 ? 77 : i + 1).bytes.data(), 32);
  kvpool_block_view views[3];
  kvpool_borrowed* b = nullptr;
  ASSERT_EQ(kvpool_borrow(cc, keys, 3, -1, 1, views, &b), KVPOOL_OK) << kvpool_last_error(cc);
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(views[i].code, KVPOOL_OK);
    EXPECT_EQ(views[i].tier, KVPOOL_TIER_HOST);
    EXPECT_EQ(views[i].on_device, 0);
    ASSERT_EQ(views[i].size, ref[i].size());
    EXPECT_EQ(std::memcmp(views[i].data, ref[i].data(), ref[i].size()), 0);
  }
  EXPECT_EQ(views[2].code, KVPOOL_NOT_FOUND);
  EXPECT_EQ(views[2].data, nullptr);
  EXPECT_EQ(LeasesActive(*c), 2u);
  int codes[3] = {-1, -1, -1};
  EXPECT_EQ(kvpool_borrowed_verify(b, codes), KVPOOL_OK);
  EXPECT_EQ(codes[0], KVPOOL_OK);
  EXPECT_EQ(codes[2], KVPOOL_NOT_FOUND);
  kvpool_borrowed_release(b);
  WaitForStats(*c, [](const DaemonStats& s) { return s.leases_active == 0; });
  // Released after the client closed: the leases ended with its connection.
  ASSERT_EQ(kvpool_borrow(cc, keys, 2, -1, 0, views, &b), KVPOOL_OK);
  kvpool_close(cc);
  EXPECT_EQ(std::memcmp(views[1].data, ref[1].data(), ref[1].size()), 0);
  kvpool_borrowed_release(b);
  kvpool_borrowed_release(nullptr);
  EXPECT_EQ(kvpool_borrow(nullptr, keys, 1, -1, 1, views, &b), KVPOOL_INVALID_ARGUMENT);
}

}  // namespace
}  // namespace kvpool::testing
