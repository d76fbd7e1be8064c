// Device buffers in the client (MutableBuffer / PutBlock with Memory::kCuda) against a real
// kvpoold, on each data path, with tests/support/fake_device.h standing in for the GPU: device
// memory the host cannot touch (a direct read or write of it crashes the test) and copies that run
// only when waited for. Checks that blocks come back byte for byte, that on the shared-memory
// path each block moves by one copy straight between the device and the daemon's arena mapping,
// and that bad device buffers and failed copies are errors, never wrong or half-written blocks.

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "client/device_buffers.h"
#include "common/checksum.h"
#include "tests/support/daemon_process.h"
#include "tests/support/fake_device.h"
#include "tests/support/status_matchers.h"

namespace kvpool::testing {
namespace {

BlockKey KeyOf(uint64_t i) {
  BlockKey k;
  std::memcpy(k.bytes.data(), &i, sizeof(i));
  k.bytes[31] = 0xDE;
  return k;
}

// The pathname of the mapping holding `p` in /proc/self/maps ("" when anonymous or unmapped).
std::string MappingOf(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream in(line);
    in >> std::hex >> lo >> dash >> hi;
    if (a < lo || a >= hi) continue;
    std::string perms, off, dev, inode, path;
    in >> perms >> off >> dev >> inode;
    std::getline(in >> std::ws, path);
    return path;
  }
  return "";
}

class DeviceBuffersTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    ASSERT_OK(daemon_.Start());
    ClientOptions o = daemon_.Options("dev");
    o.data_path = std::string(GetParam()) == "shm" ? DataPath::kSharedMemory : DataPath::kSocket;
    auto c = Client::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client_ = std::move(*c);
    client::UseCopyEngineForTest(*client_, &device_);
  }
  bool shm() const { return std::string(GetParam()) == "shm"; }

  // Puts `n` blocks of `size` bytes from device memory; returns their host reference bytes.
  std::vector<std::vector<uint8_t>> PutFromDevice(uint64_t first, int n, size_t size,
                                                  void* stream = nullptr) {
    std::vector<std::vector<uint8_t>> ref;
    std::vector<PutBlock> blocks;
    for (int i = 0; i < n; ++i) {
      ref.push_back(BlockBytes(first + i, size));
      void* d = device_.Alloc(size);
      device_.Write(d, ref.back().data(), size);
      PutBlock b{KeyOf(first + i), d, size, i ? KeyOf(first + i - 1) : BlockKey{}, {}};
      b.memory = Memory::kCuda;
      blocks.push_back(b);
    }
    auto put = client_->Put(blocks, {.cuda_stream = stream});
    EXPECT_TRUE(put.ok()) << put.status().ToString();
    if (put.ok()) {
      EXPECT_TRUE(put->all_ok());
      EXPECT_EQ(put->stored, static_cast<uint32_t>(n));
    }
    return ref;
  }

  DaemonProcess daemon_;
  FakeDevice device_;
  std::unique_ptr<Client> client_;
};

TEST_P(DeviceBuffersTest, DeviceRoundTripIsByteExact) {
  const size_t sizes[] = {1, 4095, 4096, 65537, (1u << 20) - 5};
  for (size_t s = 0; s < std::size(sizes); ++s) {
    const auto ref = PutFromDevice(100 * s, 3, sizes[s]);
    std::vector<MutableBuffer> bufs;
    std::vector<BlockKey> keys;
    for (int i = 0; i < 3; ++i) {
      bufs.push_back({device_.Alloc(sizes[s] + 64), sizes[s] + 64, Memory::kCuda});
      keys.push_back(KeyOf(100 * s + i));
    }
    auto got = client_->Get(keys, bufs);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    for (int i = 0; i < 3; ++i) {
      ASSERT_OK((*got)[i].status);
      EXPECT_EQ((*got)[i].size, sizes[s]);
      EXPECT_EQ(device_.Read(bufs[i].data, sizes[s]), ref[i]) << "size " << sizes[s];
    }
    // The host view agrees: what a host reader gets is what the device put.
    std::vector<uint8_t> host(sizes[s]);
    MutableBuffer hb{host.data(), host.size()};
    auto h = client_->Get(std::span(&keys[1], 1), std::span(&hb, 1));
    ASSERT_TRUE(h.ok());
    ASSERT_OK((*h)[0].status);
    EXPECT_EQ(host, ref[1]);
  }
}

TEST_P(DeviceBuffersTest, ALargeDeviceBufferGetsABounceBufferOfTheBlocksSize) {
  // An engine may hand one large device buffer per block (a whole layer's room, say). A block
  // that comes as bytes (the socket path) is bounced through host memory of its own size.
  const size_t size = 4096;
  const auto ref = PutFromDevice(900, 1, size);
  const size_t room = 32u << 20;
  std::vector<MutableBuffer> bufs = {{device_.Alloc(room), room, Memory::kCuda}};
  const BlockKey key = KeyOf(900);
  auto got = client_->Get(std::span(&key, 1), bufs);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_OK((*got)[0].status);
  EXPECT_EQ(device_.Read(bufs[0].data, size), ref[0]);
  // Kept for reuse afterwards: at most the smallest bounce buffer (64 KiB), not 32 MiB.
  EXPECT_LE(client::StagingKeptBytesForTest(*client_), size_t{64} << 10);
  // A buffer smaller than the block is still refused as too small.
  std::vector<MutableBuffer> small = {{device_.Alloc(size / 2), size / 2, Memory::kCuda}};
  auto refused = client_->Get(std::span(&key, 1), small);
  ASSERT_TRUE(refused.ok()) << refused.status().ToString();
  EXPECT_EQ((*refused)[0].status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*refused)[0].size, size);
}

TEST_P(DeviceBuffersTest, SharedMemoryPathCopiesStraightBetweenDeviceAndArena) {
  const size_t size = 256 << 10;
  const auto before = device_.counters();
  PutFromDevice(1, 4, size);
  std::vector<MutableBuffer> bufs;
  std::vector<BlockKey> keys;
  for (int i = 0; i < 4; ++i) {
    bufs.push_back({device_.Alloc(size), size, Memory::kCuda});
    keys.push_back(KeyOf(1 + i));
  }
  auto got = client_->Get(keys, bufs);
  ASSERT_TRUE(got.ok());
  for (const GetResult& r : *got) ASSERT_OK(r.status);
  const auto after = device_.counters();
  // One copy per block each way, whatever the path.
  EXPECT_EQ(after.to_host_copies - before.to_host_copies, 4u);
  EXPECT_EQ(after.to_device_copies - before.to_device_copies, 4u);
  EXPECT_EQ(after.to_host_bytes - before.to_host_bytes, 4 * size);
  EXPECT_EQ(after.to_device_bytes - before.to_device_bytes, 4 * size);
  // On shared memory the host side of every copy is the daemon's arena, mapped here (no bounce
  // buffer); elsewhere a bounce buffer of the client's own.
  for (const void* p : device_.host_sides()) {
    const std::string m = MappingOf(p);
    if (shm()) {
      EXPECT_NE(m.find("memfd:kvpool-segment-"), std::string::npos) << m;
    } else {
      EXPECT_EQ(m.find("memfd:kvpool-segment-"), std::string::npos) << m;
    }
  }
}

TEST_P(DeviceBuffersTest, MixesHostAndDeviceBuffersInOneCall) {
  const size_t size = 10000;
  const auto ref = PutFromDevice(50, 4, size);
  std::vector<std::vector<uint8_t>> host(2, std::vector<uint8_t>(size));
  void* d0 = device_.Alloc(size);
  void* d1 = device_.Alloc(size);
  const std::vector<MutableBuffer> bufs = {{d0, size, Memory::kCuda},
                                           {host[0].data(), size},
                                           {d1, size, Memory::kCuda},
                                           {host[1].data(), size}};
  const std::vector<BlockKey> keys = {KeyOf(50), KeyOf(51), KeyOf(52), KeyOf(53)};
  auto got = client_->Get(keys, bufs);
  ASSERT_TRUE(got.ok());
  for (const GetResult& r : *got) ASSERT_OK(r.status);
  EXPECT_EQ(device_.Read(d0, size), ref[0]);
  EXPECT_EQ(host[0], ref[1]);
  EXPECT_EQ(device_.Read(d1, size), ref[2]);
  EXPECT_EQ(host[1], ref[3]);
}

TEST_P(DeviceBuffersTest, HostMemoryPassedAsDeviceIsRefusedBeforeAnythingMoves) {
  std::vector<uint8_t> host(4096, 7);
  PutBlock b{KeyOf(900), host.data(), host.size(), {}, {}};
  b.memory = Memory::kCuda;
  auto put = client_->Put(std::span(&b, 1));
  ASSERT_FALSE(put.ok());
  EXPECT_EQ(put.status().code(), StatusCode::kInvalidArgument) << put.status().ToString();
  EXPECT_NE(put.status().message().find("block 0"), std::string::npos);
  // A range that runs past its allocation is refused too.
  void* d = device_.Alloc(4096);
  MutableBuffer too_long{d, 3 * 4096, Memory::kCuda};
  const BlockKey k = KeyOf(900);
  auto get = client_->Get(std::span(&k, 1), std::span(&too_long, 1));
  ASSERT_FALSE(get.ok());
  EXPECT_EQ(get.status().code(), StatusCode::kInvalidArgument);
  const DaemonStats st = client_->Stats().value();
  EXPECT_EQ(st.puts_offered, 0u);
  EXPECT_EQ(st.gets, 0u);
  EXPECT_EQ(device_.counters().to_host_copies + device_.counters().to_device_copies, 0u);
}

TEST_P(DeviceBuffersTest, FailedDeviceCopyStoresNothingAndReturnsNothing) {
  const size_t size = 8192;
  const std::vector<uint8_t> ref = BlockBytes(7, size);
  void* d = device_.Alloc(size);
  device_.Write(d, ref.data(), size);
  PutBlock b{KeyOf(700), d, size, {}, {}};
  b.memory = Memory::kCuda;
  device_.FailNextWait(Status::Internal("injected: copy failed"));
  auto put = client_->Put(std::span(&b, 1));
  if (put.ok()) {  // shared memory: that block's error; other paths: the call's
    EXPECT_EQ(put->stored, 0u);
    EXPECT_FALSE(put->errors[0].ok());
  }
  std::vector<uint8_t> host(size);
  MutableBuffer hb{host.data(), size};
  const BlockKey k = KeyOf(700);
  auto miss = client_->Get(std::span(&k, 1), std::span(&hb, 1));
  ASSERT_TRUE(miss.ok());
  EXPECT_TRUE((*miss)[0].status.IsNotFound()) << (*miss)[0].status.ToString();

  // A stored block whose copy to the device fails is an error for that block, not a hit.
  PutFromDevice(701, 1, size);
  void* out = device_.Alloc(size);
  MutableBuffer db{out, size, Memory::kCuda};
  const BlockKey k2 = KeyOf(701);
  device_.FailNextWait(Status::Internal("injected: copy failed"));
  auto got = client_->Get(std::span(&k2, 1), std::span(&db, 1));
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE((*got)[0].status.ok());
  EXPECT_NE((*got)[0].status.message().find("injected"), std::string::npos);
  // Nothing is held: the lease went with the call, the next get succeeds.
  auto again = client_->Get(std::span(&k2, 1), std::span(&db, 1));
  ASSERT_TRUE(again.ok());
  ASSERT_OK((*again)[0].status);
  EXPECT_EQ(device_.Read(out, size), BlockBytes(701, size));
  const DaemonStats st =
      WaitForStats(*client_, [](const DaemonStats& s) { return s.leases_active == 0; });
  EXPECT_EQ(st.leases_active, 0u);
}

TEST_P(DeviceBuffersTest, CallerChecksumIsCheckedForDeviceBlocks) {
  const size_t size = 5000;
  const std::vector<uint8_t> ref = BlockBytes(8, size);
  void* d = device_.Alloc(size);
  device_.Write(d, ref.data(), size);
  PutBlock b{KeyOf(800), d, size, {}, BlockChecksum(ref.data(), size) ^ 1};
  b.memory = Memory::kCuda;
  auto put = client_->Put(std::span(&b, 1));
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  EXPECT_EQ(put->stored, 0u);
  EXPECT_EQ(put->errors[0].code(), StatusCode::kCorruption) << put->errors[0].ToString();
  b.checksum = BlockChecksum(ref.data(), size);
  put = client_->Put(std::span(&b, 1));
  ASSERT_TRUE(put.ok());
  EXPECT_EQ(put->stored, 1u);
}

TEST_P(DeviceBuffersTest, SmallDeviceBufferIsThatBlocksError) {
  PutFromDevice(600, 1, 9000);
  void* d = device_.Alloc(4096);
  MutableBuffer small{d, 4096, Memory::kCuda};
  const BlockKey k = KeyOf(600);
  auto got = client_->Get(std::span(&k, 1), std::span(&small, 1));
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)[0].status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*got)[0].size, 9000u);
  EXPECT_EQ(device_.counters().to_device_copies, 0u);
}

TEST_P(DeviceBuffersTest, CopiesRunOnTheCallersStream) {
  // The fake runs a stream's copies only when that stream is waited for: a get that waited on
  // another stream would leave the buffer unwritten.
  int stream_tag = 0;
  void* stream = &stream_tag;
  const auto ref = PutFromDevice(400, 2, 3000, stream);
  std::vector<MutableBuffer> bufs = {{device_.Alloc(3000), 3000, Memory::kCuda},
                                     {device_.Alloc(3000), 3000, Memory::kCuda}};
  const std::vector<BlockKey> keys = {KeyOf(400), KeyOf(401)};
  auto got = client_->Get(keys, bufs, {.cuda_stream = stream});
  ASSERT_TRUE(got.ok());
  for (int i = 0; i < 2; ++i) {
    ASSERT_OK((*got)[i].status);
    EXPECT_EQ(device_.Read(bufs[i].data, 3000), ref[i]);
  }
}

// A stream of another device than the buffers' would order nothing the caller's work on them
// needs: refused before anything moves, for a put, a get and an asynchronous get.
TEST_P(DeviceBuffersTest, AStreamOfAnotherDeviceIsRefused) {
  int stream_tag = 0;
  void* stream = &stream_tag;
  device_.SetStreamDevice(stream, 1);  // the buffers are on device 0
  void* d = device_.Alloc(4096);
  PutBlock b{KeyOf(950), d, 4096, {}, {}};
  b.memory = Memory::kCuda;
  auto put = client_->Put(std::span(&b, 1), {.cuda_stream = stream});
  ASSERT_FALSE(put.ok());
  EXPECT_EQ(put.status().code(), StatusCode::kInvalidArgument) << put.status().ToString();
  EXPECT_NE(put.status().message().find("CUDA device 1"), std::string::npos);
  const auto ref = PutFromDevice(951, 1, 4096);
  MutableBuffer buf{device_.Alloc(4096), 4096, Memory::kCuda};
  const BlockKey k = KeyOf(951);
  auto get = client_->Get(std::span(&k, 1), std::span(&buf, 1), {.cuda_stream = stream});
  ASSERT_FALSE(get.ok());
  EXPECT_EQ(get.status().code(), StatusCode::kInvalidArgument);
  auto pending = client_->GetAsync(std::span(&k, 1), std::span(&buf, 1), {.cuda_stream = stream});
  EXPECT_FALSE(pending.ok());
  // A borrow toward device 0 on it: refused before anything is leased.
  const uint64_t leases_before = client_->Stats()->leases_active;
  auto lent = client_->Borrow(std::span(&k, 1), {.gpu_device = 0, .cuda_stream = stream});
  ASSERT_FALSE(lent.ok());
  EXPECT_EQ(lent.status().code(), StatusCode::kInvalidArgument) << lent.status().ToString();
  EXPECT_NE(lent.status().message().find("CUDA device 1"), std::string::npos);
  EXPECT_EQ(client_->Stats()->leases_active, leases_before);
  // The same stream, said to be device 0's, serves.
  device_.SetStreamDevice(stream, 0);
  auto again = client_->Get(std::span(&k, 1), std::span(&buf, 1), {.cuda_stream = stream});
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_OK((*again)[0].status);
  EXPECT_EQ(device_.Read(buf.data, 4096), ref[0]);
}

TEST_P(DeviceBuffersTest, GetAsyncLeavesTheCopiesOnTheStreamUntilWait) {
  int stream_tag = 0;
  void* stream = &stream_tag;
  const size_t size = 50000;
  const auto ref = PutFromDevice(500, 3, size);
  std::vector<MutableBuffer> bufs;
  for (int i = 0; i < 3; ++i) bufs.push_back({device_.Alloc(size), size, Memory::kCuda});
  const std::vector<BlockKey> keys = {KeyOf(500), KeyOf(501), KeyOf(502), KeyOf(999)};
  bufs.push_back({device_.Alloc(size), size, Memory::kCuda});  // for the miss
  const uint64_t waits_before = device_.counters().waits;
  auto pending = client_->GetAsync(keys, bufs, {.cuda_stream = stream});
  ASSERT_TRUE(pending.ok()) << pending.status().ToString();
  // Queued on the stream, not run: nothing waited, the buffers untouched. Over shared memory
  // the copies read the arena, whose leases are held until Wait; over the socket the blocks came
  // as bytes, and the copies read the client's bounce buffers, held until Wait.
  EXPECT_TRUE(pending->pending());
  EXPECT_EQ(device_.counters().waits, waits_before);
  EXPECT_EQ(device_.Read(bufs[0].data, size), std::vector<uint8_t>(size, 0));
  if (shm()) EXPECT_EQ(client_->Stats()->leases_active, 3u);
  auto got = pending->Wait();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK((*got)[i].status);
    EXPECT_EQ((*got)[i].size, size);
    EXPECT_EQ(device_.Read(bufs[i].data, size), ref[i]);
  }
  EXPECT_TRUE((*got)[3].status.IsNotFound());
  const DaemonStats st =
      WaitForStats(*client_, [](const DaemonStats& s) { return s.leases_active == 0; });
  EXPECT_EQ(st.leases_active, 0u);
  EXPECT_EQ(pending->Wait().status().code(), StatusCode::kFailedPrecondition);

  // Dropped without Wait: the copies still finish before the leases end.
  std::vector<MutableBuffer> again = {{device_.Alloc(size), size, Memory::kCuda}};
  {
    auto dropped = client_->GetAsync(std::span(&keys[1], 1), again, {.cuda_stream = stream});
    ASSERT_TRUE(dropped.ok());
  }
  EXPECT_EQ(device_.Read(again[0].data, size), ref[1]);
  // Waited after the client is gone: the leases ended with its connection.
  std::vector<MutableBuffer> late = {{device_.Alloc(size), size, Memory::kCuda}};
  auto orphan = client_->GetAsync(std::span(&keys[2], 1), late, {.cuda_stream = stream});
  ASSERT_TRUE(orphan.ok());
  client_.reset();
  auto late_got = orphan->Wait();
  ASSERT_TRUE(late_got.ok());
  ASSERT_OK((*late_got)[0].status);
  EXPECT_EQ(device_.Read(late[0].data, size), ref[2]);
}

// A PendingGet may be waited for on another thread than the one that queued its copies: the
// copies are marked on the caller's stream when queued (a stream handle such as CUDA's per-thread
// default stream names another stream on another thread; a mark does not), and Wait waits for
// that mark.
TEST_P(DeviceBuffersTest, GetAsyncCanBeWaitedForOnAnotherThread) {
  int stream_tag = 0;
  void* stream = &stream_tag;
  const size_t size = 40000;
  const auto ref = PutFromDevice(600, 2, size);
  std::vector<MutableBuffer> bufs;
  for (int i = 0; i < 2; ++i) bufs.push_back({device_.Alloc(size), size, Memory::kCuda});
  const std::vector<BlockKey> keys = {KeyOf(600), KeyOf(601)};
  const uint64_t marks_before = device_.counters().marks;
  auto pending = client_->GetAsync(keys, bufs, {.cuda_stream = stream});
  ASSERT_TRUE(pending.ok()) << pending.status().ToString();
  EXPECT_EQ(device_.counters().marks, marks_before + 1);  // both paths queue their copies
  Result<std::vector<GetResult>> got = Status::Internal("not waited");
  std::thread waiter([&] { got = pending->Wait(); });
  waiter.join();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  for (int i = 0; i < 2; ++i) {
    ASSERT_OK((*got)[i].status);
    EXPECT_EQ(device_.Read(bufs[i].data, size), ref[i]);
  }
  EXPECT_EQ(WaitForStats(*client_, [](const DaemonStats& s) { return s.leases_active == 0; })
                .leases_active,
            0u);
}

INSTANTIATE_TEST_SUITE_P(Paths, DeviceBuffersTest, ::testing::Values("shm", "socket"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace kvpool::testing
