// NcclLink: ids and argument checks everywhere; without a GPU, that joining fails at once with
// a clear error; with one, a single-rank link sending to itself (bytes compared), a transfer
// nobody completes aborted by its deadline, and a new link working after it; with two or more,
// two ranks exchanging blocks (on one GPU NCCL is expected to refuse them, by their deadline).

#include "transport/nccl_link.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <thread>
#include <vector>

namespace kvpool::transport {
namespace {

using std::chrono::steady_clock;

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x = x * 1103515245u + 12345u;
    b = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

// Device memory holding `bytes` (or zeros when empty), freed with the object.
struct DeviceBuffer {
  explicit DeviceBuffer(int device, size_t n, const std::vector<uint8_t>& bytes = {}) : size(n) {
    cudaSetDevice(device);
    EXPECT_EQ(cudaMalloc(&data, n), cudaSuccess);
    if (bytes.empty()) {
      EXPECT_EQ(cudaMemset(data, 0, n), cudaSuccess);
    } else {
      EXPECT_EQ(cudaMemcpy(data, bytes.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  ~DeviceBuffer() { cudaFree(data); }
  std::vector<uint8_t> Read() const {
    std::vector<uint8_t> out(size);
    EXPECT_EQ(cudaMemcpy(out.data(), data, size, cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
  void* data = nullptr;
  size_t size;
};

// A single-rank link on device 0 (the test fails when it cannot be made).
std::unique_ptr<NcclLink> JoinAlone() {
  Result<std::string> id = NcclLink::NewId();
  EXPECT_TRUE(id.ok()) << id.status().ToString();
  if (!id.ok()) return nullptr;
  Result<std::unique_ptr<NcclLink>> link =
      NcclLink::Join(*id, 1, 0, 0, steady_clock::now() + std::chrono::seconds(30));
  EXPECT_TRUE(link.ok()) << link.status().ToString();
  if (!link.ok()) return nullptr;
  return std::move(*link);
}

TEST(NcclLinkTest, IdsAreFreshAndOfNcclSize) {
  Result<std::string> a = NcclLink::NewId();
  Result<std::string> b = NcclLink::NewId();
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(a->size(), NcclLink::kIdBytes);
  EXPECT_NE(*a, *b);
}

TEST(NcclLinkTest, AMalformedIdOrRankIsRefused) {
  const auto deadline = steady_clock::now() + std::chrono::seconds(10);
  Result<std::string> id = NcclLink::NewId();
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(NcclLink::Join("short", 1, 0, 0, deadline).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclLink::Join(*id, 2, 2, 0, deadline).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclLink::Join(*id, 0, 0, 0, deadline).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclLink::Join(*id, 1, -1, 0, deadline).status().code(), StatusCode::kInvalidArgument);
}

TEST(NcclLinkTest, WithoutAGpuJoiningFailsAtOnce) {
  if (DeviceCount() > 0) GTEST_SKIP() << "a CUDA device is present";
  Result<std::string> id = NcclLink::NewId();
  ASSERT_TRUE(id.ok());
  Result<std::unique_ptr<NcclLink>> link =
      NcclLink::Join(*id, 1, 0, 0, steady_clock::now() + std::chrono::seconds(30));
  ASSERT_FALSE(link.ok());
  EXPECT_EQ(link.status().code(), StatusCode::kUnavailable) << link.status().ToString();
  EXPECT_NE(link.status().message().find("CUDA device"), std::string::npos);
}

TEST(NcclLinkTest, ASingleRankLinkSendsToItself) {
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  std::unique_ptr<NcclLink> link = JoinAlone();
  ASSERT_NE(link, nullptr);
  const std::vector<size_t> sizes = {1, 4096 + 3, 1 << 20, 4 << 20};
  std::vector<std::vector<uint8_t>> want;
  std::vector<std::unique_ptr<DeviceBuffer>> src, dst;
  std::vector<NcclLink::Op> ops;
  for (size_t i = 0; i < sizes.size(); ++i) {
    want.push_back(Pattern(sizes[i], static_cast<uint8_t>(i + 1)));
    src.push_back(std::make_unique<DeviceBuffer>(0, sizes[i], want.back()));
    dst.push_back(std::make_unique<DeviceBuffer>(0, sizes[i]));
    ops.push_back({true, 0, src.back()->data, sizes[i]});
    ops.push_back({false, 0, dst.back()->data, sizes[i]});
  }
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  Status st = link->Transfer(ops, stream, steady_clock::now() + std::chrono::seconds(30));
  ASSERT_TRUE(st.ok()) << st.ToString();
  for (size_t i = 0; i < sizes.size(); ++i) EXPECT_EQ(dst[i]->Read(), want[i]) << "block " << i;
  cudaStreamDestroy(stream);
}

TEST(NcclLinkTest, ATransferNobodyCompletesIsAbortedAndANewLinkWorks) {
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  std::unique_ptr<NcclLink> link = JoinAlone();
  ASSERT_NE(link, nullptr);
  DeviceBuffer dst(0, 1 << 20);
  const NcclLink::Op recv{false, 0, dst.data, dst.size};  // no matching send
  Status st = link->Transfer(std::span(&recv, 1), nullptr,
                             steady_clock::now() + std::chrono::milliseconds(500));
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(link->broken()) << st.ToString();
  EXPECT_EQ(link->Transfer(std::span(&recv, 1), nullptr, steady_clock::now()).code(),
            StatusCode::kFailedPrecondition);
  link.reset();

  std::unique_ptr<NcclLink> again = JoinAlone();
  ASSERT_NE(again, nullptr);
  const std::vector<uint8_t> bytes = Pattern(65536, 9);
  DeviceBuffer src(0, bytes.size(), bytes);
  DeviceBuffer out(0, bytes.size());
  const NcclLink::Op ops[] = {{true, 0, src.data, src.size}, {false, 0, out.data, out.size}};
  st = again->Transfer(ops, nullptr, steady_clock::now() + std::chrono::seconds(30));
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(out.Read(), bytes);
}

// Two ranks, as two daemons would be, each on its own thread and GPU: each sends a block to the
// other. On one GPU NCCL is expected to refuse two ranks on the same device: then the calls must
// end by their deadline instead of hanging.
TEST(NcclLinkTest, TwoRanksExchangeBlocksOrFailByTheirDeadlineOnOneGpu) {
  const int devices = DeviceCount();
  if (devices == 0) GTEST_SKIP() << "no CUDA device";
  Result<std::string> id = NcclLink::NewId();
  ASSERT_TRUE(id.ok());
  const auto deadline = steady_clock::now() + std::chrono::seconds(20);
  std::vector<Status> joined(2);
  std::vector<std::vector<uint8_t>> got(2);
  const std::vector<uint8_t> mine[2] = {Pattern(1 << 20, 21), Pattern(1 << 20, 22)};
  auto rank_main = [&](int rank) {
    const int device = devices >= 2 ? rank : 0;
    Result<std::unique_ptr<NcclLink>> link = NcclLink::Join(*id, 2, rank, device, deadline);
    joined[rank] = link.status();
    if (!link.ok()) return;
    DeviceBuffer src(device, mine[rank].size(), mine[rank]);
    DeviceBuffer dst(device, mine[rank].size());
    const int peer = 1 - rank;
    // Both post send then receive in one group: NCCL pairs them whatever the order.
    const NcclLink::Op ops[] = {{true, peer, src.data, src.size},
                                {false, peer, dst.data, dst.size}};
    joined[rank] = (*link)->Transfer(ops, nullptr, steady_clock::now() + std::chrono::seconds(20));
    if (joined[rank].ok()) got[rank] = dst.Read();
  };
  std::thread t0(rank_main, 0);
  std::thread t1(rank_main, 1);
  t0.join();
  t1.join();
  if (joined[0].ok() && joined[1].ok()) {
    EXPECT_EQ(got[0], mine[1]);
    EXPECT_EQ(got[1], mine[0]);
  } else {
    EXPECT_EQ(devices, 1) << joined[0].ToString() << " / " << joined[1].ToString();
    std::printf("one GPU: the two ranks were refused (%s / %s); two ranks need two GPUs\n",
                joined[0].ToString().c_str(), joined[1].ToString().c_str());
  }
}

}  // namespace
}  // namespace kvpool::transport
