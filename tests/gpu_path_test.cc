// The gpu data path end to end, in one process: a Daemon (daemon/daemon.h) whose gpu tier runs
// on the device double of tests/support/fake_device.h, and a real Client over its Unix socket
// whose device buffers use the same double. Blocks put from host memory are copied into the gpu
// tier on a prefetch hint and read from there device to device into device buffers (peer to peer
// on a real node), through a gpu segment the client imports by descriptor; host buffers and
// evicted gpu copies fall back to the host arena; the leases end. kvpoold itself never runs the
// double: without CUDA it has no gpu tier (checked at the end). In a cluster, a remote hit for a
// device reader is placed in the gpu tier behind the read, or, where the peer holds it in its
// gpu tier, comes device to device over a device link (NCCL's double: fake_device_link.h).

#include <gtest/gtest.h>

#include <kvpool/kvpool.h>

#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <thread>

#include "client/device_buffers.h"
#include "client/peer_calls.h"
#include "common/checksum.h"
#include "daemon/daemon.h"
#include "tests/support/daemon_process.h"
#include "tests/support/etcd_test_server.h"
#include "tests/support/fake_device.h"
#include "tests/support/fake_device_link.h"
#include "tests/support/status_matchers.h"
#include "tests/support/temp_dir.h"

namespace kvpool::testing {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

BlockKey KeyOf(uint64_t i) {
  BlockKey k;
  std::memcpy(k.bytes.data(), &i, sizeof(i));
  k.bytes[31] = 0x6B;
  return k;
}

// A daemon in `dir` with a gpu tier of 4 MiB on each of `devices` of `gpu` (2 MiB segments).
daemon::DaemonOptions GpuDaemonOptions(const TempDir& dir, FakeDevice& gpu,
                                       std::vector<int> devices = {0}) {
  daemon::DaemonOptions o;
  o.data_dir = dir.Join("data");
  o.socket_path = dir.Join("kvpool.sock");
  o.host_capacity_bytes = 32 * kMiB;
  o.host_segment_bytes = 2 * kMiB;
  o.disk_capacity_bytes = 256 * kMiB;
  o.lock_memory = false;
  o.ucx = false;
  o.namespaces_file = "";
  o.gpu_devices = std::move(devices);
  o.gpu_capacity_bytes = 4 * kMiB;
  o.gpu_segment_bytes = 2 * kMiB;
  o.gpu_arena = [&gpu](int device, uint64_t segment,
                       uint32_t count) -> Result<std::unique_ptr<kernels::DeviceArena>> {
    return gpu.CreateArena(segment, count, device);
  };
  return o;
}

// A shared-memory client of namespace "gpu-test" whose device buffers go through `gpu`.
std::unique_ptr<Client> GpuClient(const TempDir& dir, FakeDevice& gpu) {
  ClientOptions co;
  co.address = dir.Join("kvpool.sock");
  co.namespace_name = "gpu-test";
  co.data_path = DataPath::kSharedMemory;
  auto c = Client::Connect(co);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  if (!c.ok()) return nullptr;
  std::unique_ptr<Client> client = std::move(c).value();
  client::UseCopyEngineForTest(*client, &gpu);
  return client;
}

class GpuPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    auto d = daemon::Daemon::Start(GpuDaemonOptions(dir_, gpu_));
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    daemon_ = std::move(d).value();
    client_ = GpuClient(dir_, gpu_);
    ASSERT_NE(client_, nullptr);
  }
  void TearDown() override {
    client_.reset();
    if (daemon_) daemon_->Stop();
  }

  // Puts a chain of `n` blocks of `size` bytes from host memory; returns their bytes.
  std::vector<std::vector<uint8_t>> PutChain(uint64_t first, int n, size_t size) {
    std::vector<std::vector<uint8_t>> ref;
    std::vector<PutBlock> blocks;
    for (int i = 0; i < n; ++i) ref.push_back(BlockBytes(first + i, size));
    for (int i = 0; i < n; ++i) {
      blocks.push_back(
          {KeyOf(first + i), ref[i].data(), size, i ? KeyOf(first + i - 1) : BlockKey{}, {}});
    }
    auto put = client_->Put(blocks);
    EXPECT_TRUE(put.ok() && put->all_ok());
    return ref;
  }
  std::vector<BlockKey> Keys(uint64_t first, int n) {
    std::vector<BlockKey> keys;
    for (int i = 0; i < n; ++i) keys.push_back(KeyOf(first + i));
    return keys;
  }

  TempDir dir_{"kvpool-gpu-path"};
  FakeDevice gpu_{0};
  std::unique_ptr<daemon::Daemon> daemon_;
  std::unique_ptr<Client> client_;
};

TEST_F(GpuPathTest, BlocksPromotedToTheGpuTierAreReadDeviceToDevice) {
  ASSERT_EQ(client_->server().gpu_tiers.size(), 1u);
  EXPECT_EQ(client_->server().gpu_tiers[0].device, 0);
  EXPECT_EQ(client_->server().gpu_tiers[0].segment_bytes, 2 * kMiB);
  const size_t size = 256 << 10;
  const auto ref = PutChain(1, 4, size);
  const std::vector<BlockKey> keys = Keys(1, 4);
  auto placed = client_->Prefetch(keys, PrefetchOptions{.gpu_device = 0});
  ASSERT_TRUE(placed.ok()) << placed.status().ToString();
  EXPECT_EQ(placed->gpu_placed, 4u);
  auto where = client_->Lookup(keys, /*prefetch=*/false);
  ASSERT_TRUE(where.ok());
  EXPECT_EQ(where->tiers, std::vector<Tier>(4, Tier::kGpu));

  std::vector<MutableBuffer> bufs;
  for (int i = 0; i < 4; ++i) bufs.push_back({gpu_.Alloc(size), size, Memory::kCuda});
  const auto before = gpu_.counters();
  auto got = client_->Get(keys, bufs);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  for (int i = 0; i < 4; ++i) {
    ASSERT_OK((*got)[i].status);
    EXPECT_EQ((*got)[i].tier, Tier::kGpu);
    EXPECT_EQ((*got)[i].size, size);
    EXPECT_EQ(gpu_.Read(bufs[i].data, size), ref[i]) << "block " << i;
  }
  const auto after = gpu_.counters();
  EXPECT_EQ(after.device_copies - before.device_copies, 4u);  // device to device, nothing else
  EXPECT_EQ(after.to_device_copies - before.to_device_copies, 0u);

  // A host buffer gets the same block from the host arena, as always; the stats show the tier.
  std::vector<uint8_t> host(size);
  MutableBuffer hb{host.data(), size};
  auto h = client_->Get(std::span(&keys[2], 1), std::span(&hb, 1));
  ASSERT_TRUE(h.ok());
  ASSERT_OK((*h)[0].status);
  EXPECT_EQ(host, ref[2]);
  const DaemonStats st =
      WaitForStats(*client_, [](const DaemonStats& s) { return s.leases_active == 0; });
  EXPECT_EQ(st.leases_active, 0u);
  ASSERT_FALSE(st.tiers.empty());
  EXPECT_EQ(st.tiers[0].name, "gpu0");
  EXPECT_EQ(st.tiers[0].blocks, 4u);
  EXPECT_EQ(st.tiers[0].hits, 4u);
}

TEST_F(GpuPathTest, MixedBuffersAndEvictedGpuCopiesFallBackToTheHostArena) {
  const size_t size = 100000;
  const auto ref = PutChain(10, 3, size);
  const std::vector<BlockKey> keys = Keys(10, 3);
  ASSERT_EQ(client_->Prefetch(keys, PrefetchOptions{.gpu_device = 0})->gpu_placed, 3u);
  // One host buffer among device buffers: its gpu slot is copied device to host, verified.
  std::vector<uint8_t> host(size);
  void* d0 = gpu_.Alloc(size);
  void* d2 = gpu_.Alloc(size);
  const std::vector<MutableBuffer> bufs = {
      {d0, size, Memory::kCuda}, {host.data(), size}, {d2, size, Memory::kCuda}};
  auto got = client_->Get(keys, bufs);
  ASSERT_TRUE(got.ok());
  for (const GetResult& r : *got) ASSERT_OK(r.status);
  EXPECT_EQ(gpu_.Read(d0, size), ref[0]);
  EXPECT_EQ(host, ref[1]);
  EXPECT_EQ(gpu_.Read(d2, size), ref[2]);

  // Evicted from the gpu tier: the next device read comes from host (one copy to the device).
  auto ev = client_->Evict(Tier::kGpu, keys);
  ASSERT_TRUE(ev.ok()) << ev.status().ToString();
  auto where = client_->Lookup(keys, false);
  EXPECT_EQ(where->tiers, std::vector<Tier>(3, Tier::kHost));
  void* d1 = gpu_.Alloc(size);
  MutableBuffer one{d1, size, Memory::kCuda};
  auto again = client_->Get(std::span(&keys[1], 1), std::span(&one, 1));
  ASSERT_TRUE(again.ok());
  ASSERT_OK((*again)[0].status);
  EXPECT_EQ((*again)[0].tier, Tier::kHost);
  EXPECT_EQ(gpu_.Read(d1, size), ref[1]);
}

TEST_F(GpuPathTest, BorrowLendsGpuCopiesAsDevicePointersWithoutACopy) {
  const size_t size = 128 << 10;
  const auto ref = PutChain(30, 3, size);
  const std::vector<BlockKey> keys = Keys(30, 3);
  // Two of the three in the gpu tier; the third stays in host.
  ASSERT_EQ(
      client_->Prefetch(std::span(keys).first(2), PrefetchOptions{.gpu_device = 0})->gpu_placed,
      2u);
  const auto before = gpu_.counters();
  auto b = client_->Borrow(keys, {.gpu_device = 0});
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  for (int i = 0; i < 2; ++i) {
    const BlockView& v = (*b)[i];
    ASSERT_OK(v.status);
    EXPECT_EQ(v.memory, Memory::kCuda);
    EXPECT_EQ(v.tier, Tier::kGpu);
    ASSERT_OK(gpu_.DeviceOf(v.data));  // device memory
    EXPECT_EQ(gpu_.Read(v.data, size), ref[i]) << "block " << i;
  }
  ASSERT_OK((*b)[2].status);
  EXPECT_EQ((*b)[2].memory, Memory::kHost);
  EXPECT_EQ((*b)[2].tier, Tier::kHost);
  EXPECT_EQ(std::vector<uint8_t>(static_cast<const uint8_t*>((*b)[2].data),
                                 static_cast<const uint8_t*>((*b)[2].data) + size),
            ref[2]);
  const auto after = gpu_.counters();
  EXPECT_EQ(after.device_copies - before.device_copies, 0u) << "lent, not copied";
  EXPECT_EQ(after.to_device_copies - before.to_device_copies, 0u);
  EXPECT_EQ(after.to_host_copies - before.to_host_copies, 0u);
  EXPECT_EQ(client_->Stats()->leases_active, 3u);
  // A leased gpu copy stays while borrowed.
  auto ev = client_->Evict(Tier::kGpu, keys);
  ASSERT_TRUE(ev.ok());
  EXPECT_EQ(ev->evicted, 0u);
  EXPECT_OK(b->Verify());  // the host view on the CPU, the device views on their GPU
  EXPECT_OK(b->Release());
  const DaemonStats st =
      WaitForStats(*client_, [](const DaemonStats& s) { return s.leases_active == 0; });
  EXPECT_EQ(st.leases_active, 0u);

  // A device this process does not have is refused before anything is asked.
  auto bad = client_->Borrow(keys, {.gpu_device = 5});
  ASSERT_FALSE(bad.ok());
}

// Two GPUs, a gpu tier on each. A reader whose buffers are on one GPU copies a block held in
// the other's gpu tier peer to peer (over NVLink or PCIe on a real node) where its GPU reaches
// that one, and from host where it does not.
class GpuPeersTest : public GpuPathTest {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    gpu_.AddDevice(1);
    auto d = daemon::Daemon::Start(GpuDaemonOptions(dir_, gpu_, {0, 1}));
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    daemon_ = std::move(d).value();
    client_ = GpuClient(dir_, gpu_);
    ASSERT_NE(client_, nullptr);
  }

  // Blocks `first`..`first + 3`, put from host: the first two placed in gpu 1's tier, the third
  // in gpu 0's, the fourth left in host.
  std::vector<std::vector<uint8_t>> PutAcrossTheGpus(uint64_t first, size_t size) {
    const auto ref = PutChain(first, 4, size);
    const std::vector<BlockKey> keys = Keys(first, 4);
    auto on1 = client_->Prefetch(std::span(keys).first(2), PrefetchOptions{.gpu_device = 1});
    auto on0 = client_->Prefetch(std::span(keys).subspan(2, 1), PrefetchOptions{.gpu_device = 0});
    EXPECT_TRUE(on1.ok() && on1->gpu_placed == 2u);
    EXPECT_TRUE(on0.ok() && on0->gpu_placed == 1u);
    return ref;
  }

  // Gets `keys` into fresh buffers on `device`; checks each against `ref` and returns the tiers.
  std::vector<Tier> GetOnto(int device, std::span<const BlockKey> keys,
                            std::span<const std::vector<uint8_t>> ref) {
    std::vector<MutableBuffer> bufs;
    for (const auto& r : ref)
      bufs.push_back({gpu_.Alloc(r.size(), device), r.size(), Memory::kCuda});
    auto got = client_->Get(keys, bufs);
    EXPECT_TRUE(got.ok()) << got.status().ToString();
    if (!got.ok()) return {};
    std::vector<Tier> tiers;
    for (size_t i = 0; i < keys.size(); ++i) {
      EXPECT_TRUE((*got)[i].status.ok()) << "block " << i << ": " << (*got)[i].status.ToString();
      if ((*got)[i].status.ok()) {
        EXPECT_EQ(gpu_.Read(bufs[i].data, ref[i].size()), ref[i]) << "block " << i;
      }
      tiers.push_back((*got)[i].tier);
      gpu_.Free(bufs[i].data);
    }
    return tiers;
  }
};

TEST_F(GpuPeersTest, AReaderCopiesABlockInAnotherGpusTierPeerToPeer) {
  const size_t size = 200000;
  const auto ref = PutAcrossTheGpus(1, size);
  const std::vector<BlockKey> keys = Keys(1, 4);
  auto before = gpu_.counters();
  EXPECT_EQ(GetOnto(0, keys, ref),
            (std::vector<Tier>{Tier::kGpu, Tier::kGpu, Tier::kGpu, Tier::kHost}));
  auto after = gpu_.counters();
  EXPECT_EQ(after.device_copies - before.device_copies, 3u);
  EXPECT_EQ(after.peer_copies - before.peer_copies, 2u);            // gpu 1's two, onto gpu 0
  EXPECT_EQ(after.to_device_copies - before.to_device_copies, 1u);  // the host block

  // A reader on gpu 1 reads its own GPU's two device to device, gpu 0's one peer to peer.
  before = after;
  EXPECT_EQ(GetOnto(1, keys, ref),
            (std::vector<Tier>{Tier::kGpu, Tier::kGpu, Tier::kGpu, Tier::kHost}));
  after = gpu_.counters();
  EXPECT_EQ(after.device_copies - before.device_copies, 3u);
  EXPECT_EQ(after.peer_copies - before.peer_copies, 1u);

  // Borrowed for a kernel on gpu 0 (each view verified there first), gpu 1's copies are lent
  // where they are (its memory, imported for gpu 0), beside gpu 0's own and a host view.
  before = after;
  auto b = client_->Borrow(keys, {.gpu_device = 0});
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  for (int i = 0; i < 3; ++i) {
    const BlockView& v = (*b)[i];
    ASSERT_OK(v.status);
    EXPECT_EQ(v.memory, Memory::kCuda);
    EXPECT_EQ(v.tier, Tier::kGpu);
    Result<int> on = gpu_.DeviceOf(v.data);
    ASSERT_TRUE(on.ok());
    EXPECT_EQ(*on, i < 2 ? 1 : 0);
    EXPECT_EQ(gpu_.Read(v.data, size), ref[i]) << "block " << i;
  }
  ASSERT_OK((*b)[3].status);
  EXPECT_EQ((*b)[3].memory, Memory::kHost);
  EXPECT_EQ(std::vector<uint8_t>(static_cast<const uint8_t*>((*b)[3].data),
                                 static_cast<const uint8_t*>((*b)[3].data) + size),
            ref[3]);
  EXPECT_OK(b->Verify());
  EXPECT_OK(b->Release());
  after = gpu_.counters();
  EXPECT_EQ(after.device_copies - before.device_copies, 0u) << "lent, not copied";
  EXPECT_EQ(after.to_device_copies - before.to_device_copies, 0u);

  const DaemonStats st =
      WaitForStats(*client_, [](const DaemonStats& s) { return s.leases_active == 0; });
  EXPECT_EQ(st.leases_active, 0u);
  ASSERT_EQ(st.tiers.size(), 4u);  // gpu0, gpu1, host, disk
  EXPECT_EQ(st.tiers[0].name, "gpu0");
  EXPECT_EQ(st.tiers[1].name, "gpu1");
  EXPECT_EQ(st.tiers[0].hits, 3u);       // one read onto each GPU, one lent
  EXPECT_EQ(st.tiers[0].peer_hits, 1u);  // onto gpu 1
  EXPECT_EQ(st.tiers[1].hits, 6u);       // two onto each GPU, two lent
  EXPECT_EQ(st.tiers[1].peer_hits, 4u);  // onto gpu 0, and lent to it
}

TEST_F(GpuPeersTest, GpusThatDoNotReachEachOtherReadEachOthersBlocksFromHost) {
  gpu_.SetPeerAccess(false);
  const size_t size = 100000;
  const auto ref = PutAcrossTheGpus(10, size);
  const std::vector<BlockKey> keys = Keys(10, 4);
  const auto before = gpu_.counters();
  EXPECT_EQ(GetOnto(0, keys, ref),
            (std::vector<Tier>{Tier::kHost, Tier::kHost, Tier::kGpu, Tier::kHost}));
  const auto after = gpu_.counters();
  EXPECT_EQ(after.device_copies - before.device_copies, 1u);  // gpu 0's own
  EXPECT_EQ(after.peer_copies - before.peer_copies, 0u);
  EXPECT_EQ(after.to_device_copies - before.to_device_copies, 3u);
}

TEST_F(GpuPeersTest, APeerTierThatCannotBeMappedIsReadFromHostFromThenOn) {
  const size_t size = 100000;
  const auto ref = PutAcrossTheGpus(20, size);
  const std::vector<BlockKey> keys = Keys(20, 4);
  // The driver refuses the mappings (CUDA said peer access, the access grant failed; the own
  // GPU's too here): the read asks for those blocks again, from host, in the same call.
  gpu_.FailImports(Status::Unavailable("no peer mapping (the test's)"));
  auto before = gpu_.counters();
  EXPECT_EQ(GetOnto(0, keys, ref), std::vector<Tier>(4, Tier::kHost));
  auto after = gpu_.counters();
  EXPECT_EQ(after.device_copies - before.device_copies, 0u);
  EXPECT_EQ(after.to_device_copies - before.to_device_copies, 4u);
  // A borrow the same: views into host, the refused gpu leases ended at once.
  auto lent = client_->Borrow(keys, {.gpu_device = 1});
  ASSERT_TRUE(lent.ok()) << lent.status().ToString();
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE((*lent)[i].status.ok()) << "block " << i << ": " << (*lent)[i].status.ToString();
    EXPECT_EQ((*lent)[i].memory, Memory::kHost);
    EXPECT_EQ(std::vector<uint8_t>(static_cast<const uint8_t*>((*lent)[i].data),
                                   static_cast<const uint8_t*>((*lent)[i].data) + size),
              ref[i]);
  }
  EXPECT_EQ(client_->Stats()->leases_active, 4u);  // the host views' only
  EXPECT_OK(lent->Release());
  gpu_.FailImports(Status::OK());
  // From then on these GPUs take those tiers' blocks from host without trying.
  before = gpu_.counters();
  EXPECT_EQ(GetOnto(0, keys, ref), std::vector<Tier>(4, Tier::kHost));
  after = gpu_.counters();
  EXPECT_EQ(after.device_copies - before.device_copies, 0u);
  EXPECT_EQ(after.to_device_copies - before.to_device_copies, 4u);
  // A new connection tries again.
  ASSERT_OK(client_->Reconnect());
  before = gpu_.counters();
  EXPECT_EQ(GetOnto(0, keys, ref),
            (std::vector<Tier>{Tier::kGpu, Tier::kGpu, Tier::kGpu, Tier::kHost}));
  EXPECT_EQ(gpu_.counters().peer_copies - before.peer_copies, 2u);
  const DaemonStats st =
      WaitForStats(*client_, [](const DaemonStats& s) { return s.leases_active == 0; });
  EXPECT_EQ(st.leases_active, 0u);
}

// Polls until every key's fastest tier is `tier` (placements after a put or a session load run
// in the background on the GPU's copy worker); the tiers seen last.
std::vector<Tier> WaitForTiers(Client& c, std::span<const BlockKey> keys, Tier tier) {
  std::vector<Tier> seen;
  for (int i = 0; i < 500; ++i) {
    auto w = c.Where(keys);
    if (!w.ok()) return {};
    seen = *w;
    if (seen == std::vector<Tier>(keys.size(), tier)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return seen;
}

TEST_F(GpuPathTest, APutWithAGpuHintLandsInTheGpuTierAndIsReadDeviceToDevice) {
  const size_t size = 200000;
  std::vector<std::vector<uint8_t>> ref;
  std::vector<void*> src;
  std::vector<PutBlock> blocks;
  for (int i = 0; i < 3; ++i) {
    ref.push_back(BlockBytes(40 + i, size));
    src.push_back(gpu_.Alloc(size));
    gpu_.Write(src.back(), ref.back().data(), size);
  }
  for (int i = 0; i < 3; ++i) {
    blocks.push_back(
        {KeyOf(40 + i), src[i], size, i ? KeyOf(40 + i - 1) : BlockKey{}, {}, Memory::kCuda});
  }
  const auto before_put = gpu_.counters();
  auto put = client_->Put(blocks, PutOptions{.gpu_device = 0});
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  ASSERT_TRUE(put->all_ok());
  EXPECT_EQ(put->stored, 3u);
  const std::vector<BlockKey> keys = Keys(40, 3);
  // Straight into the gpu tier, device to device, and in gpu as soon as the put returns.
  auto at_once = client_->Lookup(keys, /*prefetch=*/false);
  ASSERT_TRUE(at_once.ok());
  EXPECT_EQ(at_once->tiers, std::vector<Tier>(3, Tier::kGpu));
  EXPECT_EQ(gpu_.counters().device_copies - before_put.device_copies, 3u);
  // A reader of host memory right away gets the host copy the daemon makes of it (it waits
  // for it if need be).
  std::vector<uint8_t> host(size);
  MutableBuffer hb{host.data(), size};
  auto h = client_->Get(std::span(&keys[1], 1), std::span(&hb, 1));
  ASSERT_TRUE(h.ok());
  ASSERT_OK((*h)[0].status);
  EXPECT_EQ(host, ref[1]);
  // The daemon's copies down, one a block, come behind the put.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (gpu_.counters().to_host_copies - before_put.to_host_copies < 3 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const auto after_put = gpu_.counters();
  EXPECT_EQ(after_put.to_host_copies - before_put.to_host_copies, 3u);
  EXPECT_EQ(after_put.to_device_copies - before_put.to_device_copies, 0u);  // nothing copied up
  std::vector<MutableBuffer> bufs;
  for (int i = 0; i < 3; ++i) bufs.push_back({gpu_.Alloc(size), size, Memory::kCuda});
  const auto before = gpu_.counters();
  auto got = client_->Get(keys, bufs);
  ASSERT_TRUE(got.ok());
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK((*got)[i].status);
    EXPECT_EQ((*got)[i].tier, Tier::kGpu);
    EXPECT_EQ(gpu_.Read(bufs[i].data, size), ref[i]);
  }
  EXPECT_EQ(gpu_.counters().device_copies - before.device_copies, 3u);
  // A device the daemon runs no gpu tier on is refused before anything is sent.
  auto bad = client_->Put(blocks, PutOptions{.gpu_device = 3});
  EXPECT_FALSE(bad.ok());
}

TEST_F(GpuPathTest, APutIntoTheGpuThatCannotMapItGoesThroughHost) {
  gpu_.FailImports(Status::Unavailable("no peer access (the test's)"));
  const size_t size = 100000;
  std::vector<std::vector<uint8_t>> ref;
  std::vector<PutBlock> blocks;
  for (int i = 0; i < 2; ++i) {
    ref.push_back(BlockBytes(60 + i, size));
    void* d = gpu_.Alloc(size);
    gpu_.Write(d, ref.back().data(), size);
    blocks.push_back({KeyOf(60 + i), d, size, i ? KeyOf(60) : BlockKey{}, {}, Memory::kCuda});
  }
  const auto before = gpu_.counters();
  auto put = client_->Put(blocks, PutOptions{.gpu_device = 0});
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  EXPECT_TRUE(put->all_ok());
  EXPECT_EQ(put->stored, 2u);
  EXPECT_EQ(gpu_.counters().device_copies - before.device_copies, 0u);
  for (int i = 0; i < 2; ++i) {
    std::vector<uint8_t> host(size);
    MutableBuffer hb{host.data(), size};
    const BlockKey key = KeyOf(60 + i);
    auto got = client_->Get(std::span(&key, 1), std::span(&hb, 1));
    ASSERT_TRUE(got.ok());
    ASSERT_OK((*got)[0].status);
    EXPECT_EQ(host, ref[i]);
  }
  const DaemonStats st =
      WaitForStats(*client_, [](const DaemonStats& s) { return s.reservations_active == 0; });
  EXPECT_EQ(st.reservations_active, 0u);  // the gpu reservations were given back
  // An engine asking whether to put into the gpu tier is told no from now on.
  auto tier = client_->GpuTierOf(0);
  ASSERT_FALSE(tier.ok());
  EXPECT_EQ(tier.status().code(), StatusCode::kInvalidArgument) << tier.status().ToString();
  // A new connection tries again.
  gpu_.FailImports(Status::OK());
  ASSERT_OK(client_->Reconnect());
  auto again = client_->GpuTierOf(0);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, 0);
}

TEST_F(GpuPathTest, ASessionLoadedForAGpuIsPlacedThereFromDisk) {
  const size_t size = 150000;
  const auto ref = PutChain(60, 3, size);
  const std::vector<BlockKey> keys = Keys(60, 3);
  ASSERT_OK(client_->SaveSession({.session_id = "s-gpu", .keys = keys, .token_count = 48}));
  ASSERT_OK(client_->Evict(Tier::kHost));
  ASSERT_EQ(*client_->Where(keys), std::vector<Tier>(3, Tier::kDisk));
  auto loaded = client_->LoadSession("s-gpu", LoadSessionOptions{.gpu_device = 0});
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->session.keys, keys);
  EXPECT_EQ(WaitForTiers(*client_, keys, Tier::kGpu), std::vector<Tier>(3, Tier::kGpu));
  std::vector<MutableBuffer> bufs;
  for (int i = 0; i < 3; ++i) bufs.push_back({gpu_.Alloc(size), size, Memory::kCuda});
  auto got = client_->Get(keys, bufs);
  ASSERT_TRUE(got.ok());
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK((*got)[i].status);
    EXPECT_EQ(gpu_.Read(bufs[i].data, size), ref[i]);
  }
  EXPECT_FALSE(client_->LoadSession("s-gpu", LoadSessionOptions{.gpu_device = 3}).ok());
}

TEST_F(GpuPathTest, AGpuCopyDamagedInDeviceMemoryIsRefusedByItsReadersAndDropped) {
  const size_t size = 64 << 10;
  const auto ref = PutChain(70, 2, size);
  const std::vector<BlockKey> keys = Keys(70, 2);
  // Flips one byte of block 0's gpu copy, through an unverified borrow of it.
  const auto damage = [&] {
    auto lent = client_->Borrow(keys, {.gpu_device = 0, .verify = false});
    ASSERT_TRUE(lent.ok());
    ASSERT_EQ((*lent)[0].memory, Memory::kCuda);
    EXPECT_NE((*lent)[0].device_checksum, 0u);
    const uint8_t bad = static_cast<uint8_t>(ref[0][100] ^ 0x40);
    gpu_.Write(const_cast<uint8_t*>(static_cast<const uint8_t*>((*lent)[0].data) + 100), &bad, 1);
    // Verify after the read shows it (and keeps the copy: a lease that ran out looks the same).
    const Status st = lent->Verify();
    EXPECT_EQ(st.code(), StatusCode::kCorruption) << st.ToString();
    EXPECT_EQ((*lent)[0].status.code(), StatusCode::kCorruption);
    EXPECT_OK((*lent)[1].status);
  };
  const auto where0 = [&] { return (*client_->Where(std::span(&keys[0], 1)))[0]; };

  // A verified borrow refuses the damaged copy (no view), and the daemon drops it.
  ASSERT_EQ(client_->Prefetch(keys, PrefetchOptions{.gpu_device = 0})->gpu_placed, 2u);
  damage();
  {
    auto lent = client_->Borrow(keys, {.gpu_device = 0});
    ASSERT_TRUE(lent.ok());
    EXPECT_EQ((*lent)[0].status.code(), StatusCode::kCorruption);
    EXPECT_EQ((*lent)[0].data, nullptr);
    EXPECT_OK((*lent)[1].status);
  }
  EXPECT_EQ(where0(), Tier::kHost);

  // A device-to-device get checks its destination on the GPU: block 0 is refused, 1 served, and
  // the bad copy is dropped, so the next get of it comes from host, byte exact.
  ASSERT_EQ(client_->Prefetch(keys, PrefetchOptions{.gpu_device = 0})->gpu_placed, 1u);
  damage();
  std::vector<MutableBuffer> bufs;
  for (int i = 0; i < 2; ++i) bufs.push_back({gpu_.Alloc(size), size, Memory::kCuda});
  const auto before = gpu_.counters();
  auto got = client_->Get(keys, bufs);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[0].status.code(), StatusCode::kCorruption) << (*got)[0].status.ToString();
  ASSERT_OK((*got)[1].status);
  EXPECT_EQ(gpu_.Read(bufs[1].data, size), ref[1]);
  // Two by the reader over its destinations, one by the daemon re-checking the reported copy.
  EXPECT_EQ(gpu_.counters().checksums - before.checksums, 3u);
  EXPECT_EQ(where0(), Tier::kHost);
  auto again = client_->Get(std::span(&keys[0], 1), std::span(&bufs[0], 1));
  ASSERT_TRUE(again.ok());
  ASSERT_OK((*again)[0].status);
  EXPECT_EQ((*again)[0].tier, Tier::kHost);
  EXPECT_EQ(gpu_.Read(bufs[0].data, size), ref[0]);
}

TEST_F(GpuPathTest, AGpuTierOnADeviceTheDaemonHasNotIsRefused) {
  auto tier = client_->GpuTierOf(0);
  ASSERT_TRUE(tier.ok()) << tier.status().ToString();
  EXPECT_EQ(*tier, 0);
  auto none = client_->GpuTierOf(3);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument) << none.status().ToString();
  PutChain(20, 1, 4096);
  auto placed = client_->Prefetch(Keys(20, 1), PrefetchOptions{.gpu_device = 3});
  ASSERT_FALSE(placed.ok());
  EXPECT_EQ(placed.status().code(), StatusCode::kInvalidArgument) << placed.status().ToString();
}

// The C API (include/kvpool/kvpool.h) carries the same: a put from device memory with a gpu
// hint, an asynchronous get into device memory, a prefetch and a session load toward the gpu
// tier, and the refusals.
TEST_F(GpuPathTest, TheCApiCarriesGpuHintsAndAsynchronousGets) {
  kvpool_client* c = nullptr;
  ASSERT_EQ(kvpool_connect(dir_.Join("kvpool.sock").c_str(), "gpu-test", 5000, &c), KVPOOL_OK);
  client::UseCopyEngineForTest(c, &gpu_);
  const size_t size = 100000;
  const int n = 3;
  std::vector<std::vector<uint8_t>> ref;
  std::vector<const void*> src;
  std::vector<size_t> sizes(n, size);
  std::vector<kvpool_key> keys(n);
  for (int i = 0; i < n; ++i) {
    ref.push_back(BlockBytes(80 + i, size));
    void* d = gpu_.Alloc(size);
    gpu_.Write(d, ref.back().data(), size);
    src.push_back(d);
    std::memcpy(keys[i].bytes, KeyOf(80 + i).bytes.data(), 32);
  }
  int daemon_device = -1;
  ASSERT_EQ(kvpool_gpu_tier_of(c, 0, &daemon_device), KVPOOL_OK);
  EXPECT_EQ(daemon_device, 0);
  EXPECT_EQ(kvpool_gpu_tier_of(c, 3, &daemon_device), KVPOOL_INVALID_ARGUMENT);
  EXPECT_STRNE(kvpool_last_error(c), "");
  uint32_t stored = 0;
  uint32_t present = 0;
  // A device the daemon runs no gpu tier on is refused, with the reason, and nothing is stored.
  EXPECT_EQ(kvpool_put_chain_to_gpu(c, keys.data(), n, src.data(), sizes.data(), nullptr, 1,
                                    nullptr, 3, &stored, &present),
            KVPOOL_INVALID_ARGUMENT);
  EXPECT_STRNE(kvpool_last_error(c), "");
  ASSERT_EQ(kvpool_put_chain_to_gpu(c, keys.data(), n, src.data(), sizes.data(), nullptr, 1,
                                    nullptr, 0, &stored, &present),
            KVPOOL_OK)
      << kvpool_last_error(c);
  EXPECT_EQ(stored, 3u);
  EXPECT_EQ(WaitForTiers(*client_, Keys(80, n), Tier::kGpu), std::vector<Tier>(n, Tier::kGpu));

  // Asynchronous get into device memory: device to device from the gpu tier, done at the wait.
  std::vector<void*> bufs;
  std::vector<size_t> caps(n, size);
  for (int i = 0; i < n; ++i) bufs.push_back(gpu_.Alloc(size));
  const auto before = gpu_.counters();
  kvpool_pending_get* pending = nullptr;
  ASSERT_EQ(kvpool_get_device_async(c, keys.data(), n, bufs.data(), caps.data(), nullptr, &pending),
            KVPOOL_OK)
      << kvpool_last_error(c);
  ASSERT_NE(pending, nullptr);
  std::vector<size_t> got(n);
  std::vector<int> codes(n, -1);
  ASSERT_EQ(kvpool_pending_get_wait(pending, got.data(), codes.data()), KVPOOL_OK)
      << kvpool_last_error(c);
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(codes[i], KVPOOL_OK) << i;
    EXPECT_EQ(got[i], size);
    EXPECT_EQ(gpu_.Read(bufs[i], size), ref[i]) << "block " << i;
  }
  EXPECT_EQ(gpu_.counters().device_copies - before.device_copies, 3u);
  // Host memory named as device memory is refused before anything is asked; no pending get.
  std::vector<uint8_t> host(size);
  void* host_buf[1] = {host.data()};
  EXPECT_EQ(kvpool_get_device_async(c, keys.data(), 1, host_buf, caps.data(), nullptr, &pending),
            KVPOOL_INVALID_ARGUMENT);
  EXPECT_EQ(pending, nullptr);
  EXPECT_EQ(kvpool_pending_get_wait(nullptr, nullptr, nullptr), KVPOOL_OK);

  // A chain put from host memory, placed in the gpu tier by a prefetch hint.
  std::vector<kvpool_key> more(2);
  std::vector<const void*> host_src;
  std::vector<std::vector<uint8_t>> host_ref;
  for (int i = 0; i < 2; ++i) {
    host_ref.push_back(BlockBytes(90 + i, size));
    host_src.push_back(host_ref.back().data());
    std::memcpy(more[i].bytes, KeyOf(90 + i).bytes.data(), 32);
  }
  ASSERT_EQ(kvpool_put_chain(c, more.data(), 2, host_src.data(), sizes.data(), nullptr, &stored,
                             &present),
            KVPOOL_OK);
  uint32_t scheduled = 0;
  uint32_t placed = 0;
  EXPECT_EQ(kvpool_prefetch_to_gpu(c, more.data(), 2, 3, &scheduled, &placed),
            KVPOOL_INVALID_ARGUMENT);
  ASSERT_EQ(kvpool_prefetch_to_gpu(c, more.data(), 2, 0, &scheduled, &placed), KVPOOL_OK)
      << kvpool_last_error(c);
  EXPECT_EQ(placed, 2u);
  EXPECT_EQ(*client_->Where(Keys(90, 2)), std::vector<Tier>(2, Tier::kGpu));

  // A session evicted to disk, loaded toward the gpu tier.
  ASSERT_OK(client_->SaveSession({.session_id = "c-gpu", .keys = Keys(90, 2), .token_count = 32}));
  ASSERT_OK(client_->Evict(Tier::kHost));
  std::vector<kvpool_key> loaded(4);
  size_t n_keys = 0;
  uint64_t tokens = 0;
  ASSERT_EQ(kvpool_session_load_to_gpu(c, "c-gpu", 0, loaded.data(), loaded.size(), &n_keys,
                                       &tokens, nullptr),
            KVPOOL_OK)
      << kvpool_last_error(c);
  EXPECT_EQ(n_keys, 2u);
  EXPECT_EQ(tokens, 32u);
  EXPECT_EQ(std::memcmp(loaded[1].bytes, more[1].bytes, 32), 0);
  EXPECT_EQ(WaitForTiers(*client_, Keys(90, 2), Tier::kGpu), std::vector<Tier>(2, Tier::kGpu));
  EXPECT_EQ(kvpool_session_load_to_gpu(c, "c-gpu", -1, loaded.data(), loaded.size(), &n_keys,
                                       &tokens, nullptr),
            KVPOOL_INVALID_ARGUMENT);
  kvpool_close(c);
}

// A remote hit for a reader on a GPU: the daemon fetches it from its peer into host, the read
// copies it from there, and the daemon places it in its gpu tier behind the read, so the next read
// on that GPU is device to device. A real etcd and a peer kvpoold process (skipped without etcd);
// this daemon runs in the test's process over the device double.
TEST(GpuPathInCluster, ARemoteHitForADeviceReaderIsPlacedInTheGpuTier) {
  auto etcd = EtcdTestServer::Start();
  if (!etcd.ok() && etcd.status().IsNotFound()) {
    GTEST_SKIP() << "no etcd binary: " << etcd.status().ToString();
  }
  ASSERT_TRUE(etcd.ok()) << etcd.status().ToString();
  TempDir dir{"kvpool-gpu-cluster"};
  ASSERT_TRUE(dir.ok());
  const std::string secret = "correct horse battery staple";
  const std::string secret_file = dir.Join("secret");
  std::ofstream(secret_file) << secret << "\n";
  chmod(secret_file.c_str(), 0600);
  // No replicas: a block stays on the node it was put through, so the read below is remote.
  DaemonProcess peer({"--cluster=" + (*etcd)->endpoint(), "--cluster_name=test", "--node_id=peer",
                      "--cluster_secret_file=" + secret_file, "--listen=tcp://127.0.0.1:0",
                      "--ucx_transports=tcp", "--ucx_net_devices=lo", "--replicas=0"});
  ASSERT_OK(peer.Start());

  FakeDevice gpu{0};
  daemon::DaemonOptions o = GpuDaemonOptions(dir, gpu);
  o.ucx = true;  // blocks come from the peer over UCX
  o.cluster = (*etcd)->endpoint();
  o.cluster_name = "test";
  o.cluster_secret = secret;
  o.node_id = "gpu-node";
  o.tcp_listen = "tcp://127.0.0.1:0";
  o.ucx_transports = "tcp";
  o.ucx_net_devices = "lo";
  o.replicas = 0;
  auto d = daemon::Daemon::Start(std::move(o));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  std::unique_ptr<daemon::Daemon> local = std::move(d).value();

  std::unique_ptr<Client> client = GpuClient(dir, gpu);
  ASSERT_NE(client, nullptr);
  size_t members = 0;
  for (int i = 0; i < 100 && members != 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto v = client->Cluster();
    members = v.ok() ? v->members.size() : 0;
  }
  ASSERT_EQ(members, 2u) << "the peer did not join";

  const size_t size = 100000;
  const int n = 3;
  std::vector<std::vector<uint8_t>> ref;
  std::vector<BlockKey> keys;
  std::vector<std::span<const uint8_t>> spans;
  for (int i = 0; i < n; ++i) {
    ref.push_back(BlockBytes(120 + i, size));
    keys.push_back(KeyOf(120 + i));
  }
  for (const auto& r : ref) spans.emplace_back(r);
  auto at_peer = peer.Connect("gpu-test");
  auto put = at_peer->PutChain(keys, spans);
  ASSERT_TRUE(put.ok() && put->all_ok());
  ASSERT_EQ(*client->Where(keys), std::vector<Tier>(n, Tier::kNone));

  std::vector<MutableBuffer> bufs;
  for (int i = 0; i < n; ++i) bufs.push_back({gpu.Alloc(size), size, Memory::kCuda});
  auto got = client->Get(keys, bufs);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  for (int i = 0; i < n; ++i) {
    ASSERT_OK((*got)[i].status);
    EXPECT_EQ(gpu.Read(bufs[i].data, size), ref[i]) << i;
  }
  EXPECT_EQ(WaitForTiers(*client, keys, Tier::kGpu), std::vector<Tier>(n, Tier::kGpu));

  const auto before = gpu.counters();
  std::vector<MutableBuffer> again;
  for (int i = 0; i < n; ++i) again.push_back({gpu.Alloc(size), size, Memory::kCuda});
  auto reread = client->Get(keys, again);
  ASSERT_TRUE(reread.ok()) << reread.status().ToString();
  for (int i = 0; i < n; ++i) {
    ASSERT_OK((*reread)[i].status);
    EXPECT_EQ((*reread)[i].tier, Tier::kGpu);
    EXPECT_EQ(gpu.Read(again[i].data, size), ref[i]) << i;
  }
  EXPECT_EQ(gpu.counters().device_copies - before.device_copies, uint64_t{n});
  EXPECT_EQ(gpu.counters().to_device_copies, before.to_device_copies);  // no copy up this time
  client.reset();
  local->Stop();
}

// Two daemons of one cluster in this process, each with a gpu tier on a device double of its
// own, joined by device links through one FakeLinkFabric (NCCL's double); and a client of each.
class GpuLinksInCluster : public ::testing::Test {
 protected:
  void SetUp() override {
    auto etcd = EtcdTestServer::Start();
    if (!etcd.ok() && etcd.status().IsNotFound()) {
      GTEST_SKIP() << "no etcd binary: " << etcd.status().ToString();
    }
    ASSERT_TRUE(etcd.ok()) << etcd.status().ToString();
    etcd_ = std::move(etcd).value();
    ASSERT_TRUE(holder_dir_.ok() && reader_dir_.ok());
    holder_ = StartNode(holder_dir_, holder_gpu_, "holder");
    reader_ = StartNode(reader_dir_, reader_gpu_, "reader");
    ASSERT_NE(holder_, nullptr);
    ASSERT_NE(reader_, nullptr);
    holder_client_ = GpuClient(holder_dir_, holder_gpu_);
    reader_client_ = GpuClient(reader_dir_, reader_gpu_);
    ASSERT_NE(holder_client_, nullptr);
    ASSERT_NE(reader_client_, nullptr);
    size_t members = 0;
    for (int i = 0; i < 100 && members != 2; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      auto v = reader_client_->Cluster();
      members = v.ok() ? v->members.size() : 0;
    }
    ASSERT_EQ(members, 2u) << "the daemons did not meet";
  }
  void TearDown() override {
    holder_client_.reset();
    reader_client_.reset();
    if (reader_) reader_->Stop();
    if (holder_) holder_->Stop();
  }

  std::unique_ptr<daemon::Daemon> StartNode(const TempDir& dir, FakeDevice& gpu,
                                            const std::string& id) {
    daemon::DaemonOptions o = GpuDaemonOptions(dir, gpu);
    o.ucx = true;  // what the links do not carry comes over UCX
    o.cluster = etcd_->endpoint();
    o.cluster_name = "links";
    o.cluster_secret = "correct horse battery staple";
    o.node_id = id;
    o.tcp_listen = "tcp://127.0.0.1:0";
    o.ucx_transports = "tcp";
    o.ucx_net_devices = "lo";
    o.replicas = 0;  // a block stays on the node it was put through
    o.metrics_listen = "127.0.0.1:0";
    o.device_links = [this, &gpu]() -> Result<std::unique_ptr<transport::DeviceLinks>> {
      return fabric_.LinksOf({{0, &gpu}});
    };
    auto d = daemon::Daemon::Start(std::move(o));
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    return d.ok() ? std::move(d).value() : nullptr;
  }

  // Puts blocks first..first+n-1 from the holder's device memory straight into its gpu tier.
  std::vector<std::vector<uint8_t>> PutIntoHolderGpu(uint64_t first, int n, size_t size) {
    std::vector<std::vector<uint8_t>> ref;
    std::vector<PutBlock> blocks;
    for (int i = 0; i < n; ++i) {
      ref.push_back(BlockBytes(first + i, size));
      void* src = holder_gpu_.Alloc(size);
      holder_gpu_.Write(src, ref.back().data(), size);
      blocks.push_back(
          {KeyOf(first + i), src, size, i ? KeyOf(first + i - 1) : BlockKey{}, {}, Memory::kCuda});
    }
    auto put = holder_client_->Put(blocks, PutOptions{.gpu_device = 0});
    EXPECT_TRUE(put.ok() && put->all_ok());
    auto where = holder_client_->Where(Keys(first, n));
    EXPECT_TRUE(where.ok() && *where == std::vector<Tier>(n, Tier::kGpu));
    return ref;
  }

  // Reads the blocks on the reader's node into its device memory; checks them against `ref`.
  void ReadOnReaderGpu(uint64_t first, const std::vector<std::vector<uint8_t>>& ref, size_t size) {
    const std::vector<BlockKey> keys = Keys(first, static_cast<int>(ref.size()));
    std::vector<MutableBuffer> bufs;
    for (size_t i = 0; i < ref.size(); ++i) {
      bufs.push_back({reader_gpu_.Alloc(size), size, Memory::kCuda});
    }
    auto got = reader_client_->Get(keys, bufs);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_OK((*got)[i].status);
      EXPECT_EQ(reader_gpu_.Read(bufs[i].data, size), ref[i]) << "block " << i;
    }
  }

  // The value of Prometheus sample `name` on `d`'s /metrics (-1 when absent), waiting up to a
  // second for it to reach `want` (a daemon's counters may trail the reply a little); with `want`
  // negative, as it is now.
  static double Metric(daemon::Daemon& d, const std::string& name, double want) {
    double v = -1;
    for (int i = 0; i < 20; ++i) {
      const std::string cmd =
          "python3 -c \"import urllib.request,sys; sys.stdout.write(urllib.request.urlopen("
          "'http://" +
          d.metrics_address() + "/metrics', timeout=5).read().decode())\"";
      FILE* p = popen(cmd.c_str(), "r");
      if (p == nullptr) return -1;
      std::string body;
      char buf[4096];
      for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) body.append(buf, n);
      pclose(p);
      const size_t at = body.find("\n" + name + " ");
      v = at == std::string::npos ? -1 : std::stod(body.substr(at + name.size() + 2));
      if (v == want || want < 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return v;
  }

  // Puts a block at a time from `first` on into the holder's gpu tier and reads it on the
  // reader's GPU until one comes over the device link (a link joins in the background after the
  // first miss). False when none did within a few seconds.
  bool WaitForLink(uint64_t first) {
    const uint64_t bytes = fabric_.counters().bytes;
    for (uint64_t i = 0; i < 100; ++i) {
      const auto ref = PutIntoHolderGpu(first + i, 1, 4096);
      ReadOnReaderGpu(first + i, ref, 4096);
      if (fabric_.counters().bytes > bytes) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  static std::vector<BlockKey> Keys(uint64_t first, int n) {
    std::vector<BlockKey> keys;
    for (int i = 0; i < n; ++i) keys.push_back(KeyOf(first + i));
    return keys;
  }

  std::unique_ptr<EtcdTestServer> etcd_;
  TempDir holder_dir_{"kvpool-link-holder"};
  TempDir reader_dir_{"kvpool-link-reader"};
  FakeDevice holder_gpu_{0};
  FakeDevice reader_gpu_{0};
  FakeLinkFabric fabric_;
  std::unique_ptr<daemon::Daemon> holder_, reader_;
  std::unique_ptr<Client> holder_client_, reader_client_;
};

// The first miss toward a peer starts joining a link in the background and takes its blocks over
// UCX; once joined, a block the peer holds in its gpu tier comes device to device over the link
// into the reader's gpu tier, and the read copies it from there: nothing is copied up from host.
TEST_F(GpuLinksInCluster, ARemoteGpuHitComesDeviceToDeviceIntoTheGpuTier) {
  const size_t size = 150000;
  const int n = 3;
  const auto first = PutIntoHolderGpu(300, n, size);
  ASSERT_EQ(*reader_client_->Where(Keys(300, n)), std::vector<Tier>(n, Tier::kNone));
  ReadOnReaderGpu(300, first, size);
  ASSERT_TRUE(WaitForLink(320));
  const double in_before = Metric(*reader_, "kvpool_gpu_link_blocks_total{direction=\"in\"}", -1);
  const double out_before =
      Metric(*holder_, "kvpool_gpu_link_blocks_total{direction=\"out\"}", in_before);
  const uint64_t bytes_before = fabric_.counters().bytes;
  const auto ref = PutIntoHolderGpu(310, n, size);
  const auto before = reader_gpu_.counters();
  ReadOnReaderGpu(310, ref, size);
  EXPECT_EQ(fabric_.counters().joins, 2u);  // one link, both sides; reused
  EXPECT_EQ(fabric_.counters().bytes - bytes_before, uint64_t{n} * size);
  EXPECT_EQ(fabric_.counters().failures, 0u);
  // In the reader's gpu tier at once; its host copies are the daemon's, made behind.
  EXPECT_EQ(*reader_client_->Where(Keys(310, n)), std::vector<Tier>(n, Tier::kGpu));
  EXPECT_EQ(reader_gpu_.counters().to_device_copies, before.to_device_copies);
  EXPECT_EQ(Metric(*reader_, "kvpool_gpu_link_blocks_total{direction=\"in\"}", in_before + n),
            in_before + n);
  EXPECT_EQ(Metric(*holder_, "kvpool_gpu_link_blocks_total{direction=\"out\"}", out_before + n),
            out_before + n);
  // A host reader on the reader's node gets the same bytes (the host copy made from gpu).
  std::vector<uint8_t> host(size);
  MutableBuffer hb{host.data(), size};
  const BlockKey k = KeyOf(311);
  auto h = reader_client_->Get(std::span(&k, 1), std::span(&hb, 1));
  ASSERT_TRUE(h.ok());
  ASSERT_OK((*h)[0].status);
  EXPECT_EQ(host, ref[1]);
}

// A chain read in reverse comes over the link as one batch, its children committed before their
// parents: each is linked under its parent once the fetch is done, so evictions stay tail first.
TEST_F(GpuLinksInCluster, AChainReadInReverseOverTheLinkKeepsItsParentLinks) {
  const size_t size = 4096;
  ASSERT_TRUE(WaitForLink(340));
  const auto ref = PutIntoHolderGpu(330, 3, size);
  const std::vector<BlockKey> reversed{KeyOf(332), KeyOf(331), KeyOf(330)};
  std::vector<MutableBuffer> bufs;
  for (int i = 0; i < 3; ++i) bufs.push_back({reader_gpu_.Alloc(size), size, Memory::kCuda});
  const uint64_t bytes_before = fabric_.counters().bytes;
  auto got = reader_client_->Get(reversed, bufs);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK((*got)[i].status);
    EXPECT_EQ(reader_gpu_.Read(bufs[i].data, size), ref[2 - i]) << "block " << 332 - i;
  }
  EXPECT_EQ(fabric_.counters().bytes - bytes_before, 3 * size);  // over the link
  for (uint64_t k : {330, 331}) {
    const BlockKey key = KeyOf(k);
    auto evicted = reader_client_->Evict(Tier::kDisk, std::span(&key, 1));
    ASSERT_TRUE(evicted.ok()) << evicted.status().ToString();
    EXPECT_EQ(evicted->skipped, 1u) << "block " << k << " went before its child";
  }
  auto all = reader_client_->Evict(Tier::kDisk, Keys(330, 3));
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(all->evicted, 3u);
}

// Forming a link (an NCCL communicator) can take seconds: no read waits for it. While the joins
// are held, misses are answered over UCX; once they complete, the link carries the next ones.
TEST_F(GpuLinksInCluster, AReadNeverWaitsForALinkToForm) {
  const size_t size = 100000;
  fabric_.HoldJoins();
  const auto ref = PutIntoHolderGpu(350, 2, size);
  ReadOnReaderGpu(350, ref, size);
  const auto more = PutIntoHolderGpu(352, 2, size);
  ReadOnReaderGpu(352, more, size);
  EXPECT_EQ(fabric_.counters().joins, 0u);
  EXPECT_EQ(fabric_.counters().bytes, 0u);
  fabric_.ReleaseJoins();
  EXPECT_TRUE(WaitForLink(360));
  EXPECT_EQ(fabric_.counters().joins, 2u);
}

// A link whose transfer never completes (a peer that died mid-transfer) fails by its deadline:
// the blocks come over UCX instead, right, and a new link is joined for later misses.
TEST_F(GpuLinksInCluster, AStalledLinkCostsItsDeadlineAndTheBlocksComeOverUcx) {
  const size_t size = 100000;
  ASSERT_TRUE(WaitForLink(390));
  const uint64_t bytes_before = fabric_.counters().bytes;
  const auto ref = PutIntoHolderGpu(400, 2, size);
  fabric_.StallNextTransfer();
  ReadOnReaderGpu(400, ref, size);
  EXPECT_GE(fabric_.counters().failures, 1u);
  EXPECT_EQ(fabric_.counters().bytes, bytes_before);
  EXPECT_EQ(Metric(*reader_, "kvpool_gpu_link_failures_total", 1), 1);
  EXPECT_EQ(Metric(*holder_, "kvpool_gpu_link_failures_total", 1), 1);
  ASSERT_TRUE(WaitForLink(420));
  EXPECT_EQ(fabric_.counters().joins, 4u);  // a new link, both sides
}

// A block damaged on the link fails its device checksum on the reader's GPU: it is not stored
// from the link, and the read gets the right bytes over UCX.
TEST_F(GpuLinksInCluster, ABlockDamagedOnTheLinkIsRefusedAndFetchedOverUcx) {
  const size_t size = 100000;
  ASSERT_TRUE(WaitForLink(490));
  const double in_before = Metric(*reader_, "kvpool_gpu_link_blocks_total{direction=\"in\"}", -1);
  const uint64_t bytes_before = fabric_.counters().bytes;
  const auto ref = PutIntoHolderGpu(500, 3, size);
  fabric_.CorruptNextTransfer();
  ReadOnReaderGpu(500, ref, size);
  // All three came, one of them damaged.
  EXPECT_EQ(fabric_.counters().bytes - bytes_before, 3u * size);
  EXPECT_EQ(Metric(*reader_, "kvpool_gpu_link_checksum_failures_total", 1), 1);
  EXPECT_EQ(Metric(*reader_, "kvpool_gpu_link_blocks_total{direction=\"in\"}", in_before + 2),
            in_before + 2);
  // The two good ones came device to device, the damaged one over UCX; all are read right
  // again from the reader's node.
  ReadOnReaderGpu(500, ref, size);
}

// Reads on two connections at once share one link (one fetch at a time uses it; the other waits
// a little or takes UCX): every block is read right either way.
TEST_F(GpuLinksInCluster, ReadsAtOnceShareTheLink) {
  const size_t size = 64 * 1024;
  ASSERT_TRUE(WaitForLink(590));
  std::vector<std::vector<uint8_t>> ref[2];
  for (int t = 0; t < 2; ++t) ref[t] = PutIntoHolderGpu(600 + 10 * t, 4, size);
  std::unique_ptr<Client> other = GpuClient(reader_dir_, reader_gpu_);
  ASSERT_NE(other, nullptr);
  Client* clients[2] = {reader_client_.get(), other.get()};
  std::vector<std::vector<uint8_t>> got[2];
  Status st[2];
  auto read = [&](int t) {
    const std::vector<BlockKey> keys = Keys(600 + 10 * t, 4);
    std::vector<MutableBuffer> bufs;
    for (int i = 0; i < 4; ++i) bufs.push_back({reader_gpu_.Alloc(size), size, Memory::kCuda});
    auto r = clients[t]->Get(keys, bufs);
    st[t] = r.status();
    for (int i = 0; r.ok() && i < 4; ++i) {
      if (!(*r)[i].status.ok()) st[t] = (*r)[i].status;
      got[t].push_back(reader_gpu_.Read(bufs[i].data, size));
    }
  };
  std::thread a(read, 0), b(read, 1);
  a.join();
  b.join();
  for (int t = 0; t < 2; ++t) {
    ASSERT_OK(st[t]);
    EXPECT_EQ(got[t], ref[t]) << "reader " << t;
  }
  EXPECT_EQ(fabric_.counters().failures, 0u);
}

// The peer's side of the protocol, asked as a peer daemon would: a GPU_SEND out of order (a
// request repeated or lost on the way) is refused and ends the link, so one group's receives are
// never paired with another's sends; the next send on that link finds it gone.
TEST_F(GpuLinksInCluster, AGpuSendOutOfOrderEndsTheLink) {
  const size_t size = 100000;
  PutIntoHolderGpu(700, 2, size);
  ClientOptions o;
  o.address = "tcp://" + holder_->tcp_address();
  o.namespace_name = "gpu-test";
  o.client_name = "kvpool-peer";
  o.cluster_secret = "correct horse battery staple";
  o.data_path = DataPath::kSocket;
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Client& peer = **c;
  FakeDevice mine{0};
  auto links = fabric_.LinksOf({{0, &mine}});
  wire::GpuLinkJoinRequest join;
  join.set_token(std::string(16, 't'));
  join.set_link_id(*links->NewId());
  join.set_device(0);
  wire::GpuLinkJoinResponse joined;
  ASSERT_OK(client::PeerCall(peer, join, &joined));
  auto link = links->Join(join.link_id(), 2, 0, 0,
                          std::chrono::steady_clock::now() + std::chrono::seconds(5));
  ASSERT_TRUE(link.ok()) << link.status().ToString();
  wire::GpuOfferRequest offer;
  const std::vector<BlockKey> keys = Keys(700, 2);
  std::string packed;
  for (const BlockKey& k : keys) packed += std::string(k.AsStringView());
  offer.set_packed_keys(packed);
  wire::GpuOfferResponse offered;
  ASSERT_OK(client::PeerCall(peer, offer, &offered));
  ASSERT_EQ(offered.offers_size(), 2);
  EXPECT_EQ(offered.offers(0).device(), 0);
  EXPECT_EQ(offered.offers(0).size(), size);
  wire::GpuSendRequest send;
  send.set_token(join.token());
  send.set_packed_keys(packed);
  for (const wire::GpuOffer& g : offered.offers()) {
    send.add_sizes(g.size());
    send.add_device_checksums(g.device_checksum());
  }
  send.set_seq(1);  // the link's first must be 0
  wire::GpuSendResponse sent;
  EXPECT_EQ(client::PeerCall(peer, send, &sent).code(), StatusCode::kAborted);
  send.set_seq(0);
  EXPECT_EQ(client::PeerCall(peer, send, &sent).code(), StatusCode::kNotFound);
  // A wrong device checksum is not sent: the offer no longer matches what the peer holds.
  join.set_token(std::string(16, 'u'));
  join.set_link_id(*links->NewId());
  ASSERT_OK(client::PeerCall(peer, join, &joined));
  link = links->Join(join.link_id(), 2, 0, 0,
                     std::chrono::steady_clock::now() + std::chrono::seconds(5));
  ASSERT_TRUE(link.ok()) << link.status().ToString();
  send.set_token(join.token());
  send.set_device_checksums(1, send.device_checksums(1) ^ 1);
  ASSERT_OK(client::PeerCall(peer, send, &sent));
  ASSERT_EQ(sent.sending_size(), 2);
  EXPECT_TRUE(sent.sending(0));
  EXPECT_FALSE(sent.sending(1));
  void* dst = mine.Alloc(size);
  const transport::DeviceLink::Op recv{false, 1, dst, size};
  ASSERT_OK((*link)->Transfer({&recv, 1}, nullptr,
                              std::chrono::steady_clock::now() + std::chrono::seconds(5)));
  EXPECT_EQ(mine.Read(dst, size), BlockBytes(700, size));
}

// GPU_* requests are a peer daemon's only, and a daemon without a gpu tier has no links.
TEST_F(GpuLinksInCluster, OnlyAPeerMayAskForDeviceLinks) {
  wire::GpuOfferRequest req;
  const BlockKey k = KeyOf(600);
  req.set_packed_keys(std::string(k.AsStringView()));
  wire::GpuOfferResponse resp;
  EXPECT_EQ(client::PeerCall(*reader_client_, req, &resp).code(), StatusCode::kPermissionDenied);
  wire::GpuLinkJoinRequest join;
  join.set_token(std::string(16, 'x'));
  join.set_link_id(std::string(128, 'y'));
  wire::GpuLinkJoinResponse joined;
  EXPECT_EQ(client::PeerCall(*reader_client_, join, &joined).code(), StatusCode::kPermissionDenied);
}

TEST(GpuPathWithoutCuda, KvpooldRefusesAGpuTierItCannotRun) {
  DaemonProcess d({"--gpu_devices=0", "--gpu_capacity=64MiB"});
  Status st = d.Start();
  if (st.ok()) GTEST_SKIP() << "this machine has a GPU: kvpoold started a gpu tier";
  EXPECT_NE(d.log().find("gpu tier on CUDA device 0"), std::string::npos) << d.LogTail();
}

}  // namespace
}  // namespace kvpool::testing
