// The UCX data path against a real kvpoold over loopback TCP (UCX_TLS=tcp, device lo): byte-
// identical round trips from 1 byte to 64 MiB, too-small buffers, and a daemon killed mid-transfer
// gives an error within the deadline, never bytes.

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "common/checksum.h"
#include "tests/support/daemon_process.h"
#include "tests/support/status_matchers.h"

namespace kvpool::testing {
namespace {

std::unique_ptr<Client> UcxClient(const DaemonProcess& d,
                                  std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  ClientOptions o = d.Options();
  o.address = d.PrintedAddress("tcp://");
  EXPECT_FALSE(o.address.empty()) << "no tcp:// address printed\n" << d.log();
  if (o.address.empty()) return nullptr;
  o.data_path = DataPath::kUcx;
  o.ucx_transports = "tcp";
  o.ucx_net_devices = "lo";
  o.timeout = timeout;
  auto c = Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString() << "\n" << d.log();
  if (!c.ok()) return nullptr;
  EXPECT_TRUE((*c)->server().ucx);
  return std::move(*c);
}

BlockKey KeyOf(uint64_t i) {
  BlockKey k;
  std::memcpy(k.bytes.data(), &i, sizeof(i));
  k.bytes[30] = 0x7C;
  return k;
}

const std::vector<std::string> kUcxFlags = {"--listen=tcp://127.0.0.1:0", "--ucx_transports=tcp",
                                            "--ucx_net_devices=lo", "--host_capacity=320MiB",
                                            "--host_segment_size=64MiB"};

TEST(UcxTest, RoundTripsFromOneByteTo64MiB) {
  DaemonProcess d(kUcxFlags);
  ASSERT_OK(d.Start());
  auto c = UcxClient(d);
  ASSERT_NE(c, nullptr);
  const std::vector<size_t> sizes = {1, 4095, 4097, (1u << 20) + 3, 64u << 20};
  for (size_t i = 0; i < sizes.size(); ++i) {
    const std::vector<uint8_t> bytes = BlockBytes(i + 50, sizes[i]);
    PutBlock b{KeyOf(i), bytes.data(), bytes.size(), {}, {}};
    auto put = c->Put(std::span(&b, 1));
    ASSERT_TRUE(put.ok()) << put.status().ToString();
    ASSERT_TRUE(put->all_ok()) << sizes[i] << ": " << put->errors[0].ToString();
    ASSERT_EQ(put->stored, 1u);
    std::vector<uint8_t> out(sizes[i] + 8, 0xEE);
    const BlockKey key = KeyOf(i);
    MutableBuffer buf{out.data(), out.size()};
    auto got = c->Get(std::span(&key, 1), std::span(&buf, 1));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_TRUE((*got)[0].status.ok()) << sizes[i] << ": " << (*got)[0].status.ToString();
    ASSERT_EQ((*got)[0].size, sizes[i]);
    EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), out.begin())) << sizes[i];
    EXPECT_EQ(out[sizes[i]], 0xEE);
  }
  // Batches: 16 blocks of 256 KiB in one call each way.
  std::vector<std::vector<uint8_t>> blocks;
  std::vector<PutBlock> puts;
  for (uint64_t i = 0; i < 16; ++i) blocks.push_back(BlockBytes(900 + i, 256 * 1024));
  for (uint64_t i = 0; i < 16; ++i) {
    puts.push_back({KeyOf(100 + i), blocks[i].data(), blocks[i].size(), {}, {}});
  }
  auto put = c->Put(puts);
  ASSERT_TRUE(put.ok() && put->all_ok());
  std::vector<std::vector<uint8_t>> outs(16, std::vector<uint8_t>(256 * 1024));
  std::vector<MutableBuffer> bufs;
  std::vector<BlockKey> keys;
  for (uint64_t i = 0; i < 16; ++i) {
    bufs.push_back({outs[i].data(), outs[i].size()});
    keys.push_back(KeyOf(100 + i));
  }
  auto got = c->Get(keys, bufs);
  ASSERT_TRUE(got.ok());
  for (size_t i = 0; i < 16; ++i) {
    EXPECT_TRUE((*got)[i].status.ok()) << (*got)[i].status.ToString();
    EXPECT_EQ(outs[i], blocks[i]);
  }
  // A send's lease ends when the daemon's UCX progress thread sees the send complete.
  const DaemonStats s = WaitForStats(
      *c, [](const DaemonStats& s) { return s.leases_active == 0 && s.reservations_active == 0; });
  EXPECT_EQ(s.leases_active, 0u);
  EXPECT_EQ(s.reservations_active, 0u);
}

TEST(UcxTest, TooSmallBufferIsAnErrorAndTheConnectionStaysUsable) {
  DaemonProcess d(kUcxFlags);
  ASSERT_OK(d.Start());
  auto c = UcxClient(d);
  ASSERT_NE(c, nullptr);
  const std::vector<uint8_t> bytes = BlockBytes(3, 100000);
  PutBlock b{KeyOf(3), bytes.data(), bytes.size(), {}, {}};
  ASSERT_TRUE(c->Put(std::span(&b, 1)).ok());
  std::vector<uint8_t> small(1000);
  const BlockKey key = KeyOf(3);
  MutableBuffer buf{small.data(), small.size()};
  auto got = c->Get(std::span(&key, 1), std::span(&buf, 1));
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[0].status.code(), StatusCode::kInvalidArgument);
  std::vector<uint8_t> big(100000);
  MutableBuffer ok_buf{big.data(), big.size()};
  got = c->Get(std::span(&key, 1), std::span(&ok_buf, 1));
  ASSERT_TRUE(got.ok() && (*got)[0].status.ok());
  EXPECT_EQ(big, bytes);
}

// Client::GetWith over UCX: the blocks arrive in the buffers the callback gave once it knew
// their sizes, verified, and a block given none is skipped without harming the others.
TEST(UcxTest, GetWithReceivesIntoTheBuffersItsCallbackGives) {
  DaemonProcess d(kUcxFlags);
  ASSERT_OK(d.Start());
  auto c = UcxClient(d);
  ASSERT_NE(c, nullptr);
  std::vector<BlockKey> keys;
  std::vector<std::vector<uint8_t>> blocks;
  for (uint64_t i = 0; i < 3; ++i) {
    keys.push_back(KeyOf(40 + i));
    blocks.push_back(BlockBytes(40 + i, 200000 + 3 * i));
    PutBlock b{keys.back(), blocks.back().data(), blocks.back().size(), {}, {}};
    ASSERT_TRUE(c->Put(std::span(&b, 1)).ok());
  }
  std::vector<std::vector<uint8_t>> out(keys.size());
  auto got = c->GetWith(keys, [&](size_t i, uint64_t size) -> MutableBuffer {
    if (i == 0) return {};
    out[i].assign(size, 0);
    return {out[i].data(), out[i].size()};
  });
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ((*got)[0].status.code(), StatusCode::kInvalidArgument);
  for (size_t i = 1; i < keys.size(); ++i) {
    ASSERT_TRUE((*got)[i].status.ok()) << i << ": " << (*got)[i].status.ToString();
    EXPECT_EQ(out[i], blocks[i]) << i;
    EXPECT_EQ((*got)[i].checksum, BlockChecksum(blocks[i].data(), blocks[i].size()));
  }
}

TEST(UcxTest, DaemonKilledMidTransferIsAnErrorWithinTheDeadline) {
  DaemonProcess d(kUcxFlags);
  ASSERT_OK(d.Start());
  auto c = UcxClient(d, std::chrono::seconds(5));
  ASSERT_NE(c, nullptr);
  std::vector<std::vector<uint8_t>> blocks;
  std::vector<PutBlock> puts;
  for (uint64_t i = 0; i < 32; ++i) blocks.push_back(BlockBytes(i, 4 << 20));
  for (uint64_t i = 0; i < 32; ++i)
    puts.push_back({KeyOf(i), blocks[i].data(), blocks[i].size(), {}, {}});
  auto put = c->Put(puts);
  ASSERT_TRUE(put.ok() && put->all_ok());
  std::vector<std::vector<uint8_t>> outs(32, std::vector<uint8_t>(4 << 20, 0));
  std::vector<MutableBuffer> bufs;
  std::vector<BlockKey> keys;
  for (uint64_t i = 0; i < 32; ++i) {
    bufs.push_back({outs[i].data(), outs[i].size()});
    keys.push_back(KeyOf(i));
  }
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    kill(d.pid(), SIGKILL);
  });
  const auto start = std::chrono::steady_clock::now();
  auto got = c->Get(keys, bufs);
  const auto took = std::chrono::steady_clock::now() - start;
  killer.join();
  d.Kill();
  EXPECT_LT(took, std::chrono::seconds(12));
  if (got.ok()) {
    // Whatever arrived complete is verified; the rest are errors, never wrong bytes.
    for (size_t i = 0; i < 32; ++i) {
      if ((*got)[i].status.ok()) {
        EXPECT_EQ(outs[i], blocks[i]) << i;
      }
    }
  }
}

// A daemon stopped (SIGSTOP) while it sends: no error reaches UCX, and a receive under way
// cannot be withdrawn; the client closes the daemon's endpoint a grace after its deadline, so the
// call returns, and the next call reconnects with a new endpoint.
TEST(UcxTest, DaemonStoppedMidTransferEndsTheCallAndTheNextCallWorksOnANewEndpoint) {
  DaemonProcess d(kUcxFlags);
  ASSERT_OK(d.Start());
  auto c = UcxClient(d, std::chrono::seconds(2));
  ASSERT_NE(c, nullptr);
  constexpr uint64_t kBlocks = 32;
  std::vector<std::vector<uint8_t>> blocks;
  std::vector<PutBlock> puts;
  for (uint64_t i = 0; i < kBlocks; ++i) blocks.push_back(BlockBytes(i, 4 << 20));
  for (uint64_t i = 0; i < kBlocks; ++i) {
    puts.push_back({KeyOf(i), blocks[i].data(), blocks[i].size(), {}, {}});
  }
  auto put = c->Put(puts);
  ASSERT_TRUE(put.ok() && put->all_ok());
  std::vector<std::vector<uint8_t>> outs(kBlocks, std::vector<uint8_t>(4 << 20, 0));
  std::vector<MutableBuffer> bufs;
  std::vector<BlockKey> keys;
  for (uint64_t i = 0; i < kBlocks; ++i) {
    bufs.push_back({outs[i].data(), outs[i].size()});
    keys.push_back(KeyOf(i));
  }
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    kill(d.pid(), SIGSTOP);
  });
  const auto start = std::chrono::steady_clock::now();
  auto got = c->Get(keys, bufs);
  const auto took = std::chrono::steady_clock::now() - start;
  stopper.join();
  size_t arrived = 0;
  if (got.ok()) {
    for (size_t i = 0; i < kBlocks; ++i) {
      if ((*got)[i].status.ok()) {
        ++arrived;
        EXPECT_EQ(outs[i], blocks[i]) << i;  // never wrong bytes
      }
    }
  }
  std::printf("stopped daemon: the call returned after %.1f s (%s), %zu of %llu blocks whole\n",
              std::chrono::duration<double>(took).count(),
              got.ok() ? "per-block results" : got.status().ToString().c_str(), arrived,
              static_cast<unsigned long long>(kBlocks));
  // A hang check, not a timing target: without the endpoint's close it waits as long as the
  // daemon stays stopped.
  EXPECT_LT(took, std::chrono::seconds(30));
  kill(d.pid(), SIGCONT);

  for (auto& o : outs) std::fill(o.begin(), o.end(), 0);
  auto again = c->Get(keys, bufs);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  for (size_t i = 0; i < kBlocks; ++i) {
    ASSERT_TRUE((*again)[i].status.ok()) << i << ": " << (*again)[i].status.ToString();
    EXPECT_EQ(outs[i], blocks[i]) << i;
  }
  EXPECT_TRUE(c->server().ucx);  // a new endpoint, bound at the reconnect
}

}  // namespace
}  // namespace kvpool::testing
