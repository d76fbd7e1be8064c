// kvpool-device-copy-check: the client's device-buffer copies (kernels/device_copy.h) on a GPU,
// checked and timed beside their peer in the same run. Run by bench/gpu/device_check.sh.
//
// The host side is what a same-node client copies from and into: a memfd-backed shared mapping
// registered with CUDA (kernels/pinned_memory.h), as the client maps the daemon's host arena.
// The peer is cudaMemcpyAsync from cudaMallocHost memory of the same size: the machine's pinned
// host<->device limit. Target (issue 9): >= 0.9x of the peer for host-to-device.
//
// Checks: bytes round-trip exactly (device -> arena -> device), DeviceOf refuses host memory,
// and knows the device of a device pointer.
//
// Usage: kvpool-device-copy-check [--block_mib N] [--blocks N] [--reps N]

#include <cuda_runtime.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/device_copy.h"
#include "kernels/pinned_memory.h"

namespace kvpool::kernels {
namespace {

int g_failed = 0;

void Check(bool ok, const std::string& what) {
  std::printf("  %-4s %s\n", ok ? "ok" : "FAIL", what.c_str());
  if (!ok) ++g_failed;
}

#define CUDA_OR_DIE(expr)                                                                         \
  do {                                                                                            \
    const cudaError_t _e = (expr);                                                                \
    if (_e != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(_e)); \
      std::exit(2);                                                                               \
    }                                                                                             \
  } while (0)

// A shared memfd mapping registered with CUDA, as the client maps a host-arena segment.
uint8_t* MapArena(size_t bytes) {
  const int fd = memfd_create("kvpool-copy-check", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    std::perror("memfd");
    std::exit(2);
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(2);
  }
  std::memset(p, 0, bytes);
  const Status reg = RegisterHostMemory(p, bytes);
  if (!reg.ok()) {
    std::fprintf(stderr, "RegisterHostMemory: %s\n", reg.ToString().c_str());
    std::exit(2);
  }
  return static_cast<uint8_t*>(p);
}

// Median seconds of `reps` runs of `blocks` copies of `block` bytes, queued by `queue` and
// waited for by `wait`.
template <typename Queue, typename WaitFn>
double MedianSeconds(int reps, int blocks, Queue queue, WaitFn wait) {
  std::vector<double> t;
  for (int r = 0; r < reps + 2; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < blocks; ++i) queue(i);
    wait();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (r >= 2) t.push_back(s);  // two warm-up runs
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int Main(int argc, char** argv) {
  size_t block = 1 << 20;
  int blocks = 16;
  int reps = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--block_mib=", 0) == 0) {
      block = static_cast<size_t>(std::atoi(a.c_str() + 12)) << 20;
    } else if (a.rfind("--blocks=", 0) == 0) {
      blocks = std::atoi(a.c_str() + 9);
    } else if (a.rfind("--reps=", 0) == 0) {
      reps = std::atoi(a.c_str() + 7);
    } else {
      std::fprintf(stderr, "usage: %s [--block_mib=N] [--blocks=N] [--reps=N]\n", argv[0]);
      return 2;
    }
  }
  Result<DeviceCopyEngine*> engine_or = CudaCopyEngine();
  if (!engine_or.ok()) {
    std::fprintf(stderr, "kvpool-device-copy-check: %s\n", engine_or.status().ToString().c_str());
    return 2;
  }
  DeviceCopyEngine& engine = **engine_or;
  const size_t total = block * static_cast<size_t>(blocks);
  uint8_t* arena = MapArena(total);
  uint8_t* pinned = nullptr;
  uint8_t* device = nullptr;
  uint8_t* device2 = nullptr;
  CUDA_OR_DIE(cudaMallocHost(&pinned, total));
  CUDA_OR_DIE(cudaMalloc(&device, total));
  CUDA_OR_DIE(cudaMalloc(&device2, total));
  cudaStream_t stream = nullptr;
  CUDA_OR_DIE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  std::printf("== checks ==\n");
  std::vector<uint8_t> ref(total);
  std::mt19937_64 rng(42);
  for (size_t i = 0; i < total; i += 8) {
    const uint64_t v = rng();
    std::memcpy(ref.data() + i, &v, std::min<size_t>(8, total - i));
  }
  CUDA_OR_DIE(cudaMemcpy(device, ref.data(), total, cudaMemcpyHostToDevice));
  bool copies_ok = true;
  for (int i = 0; i < blocks; ++i) {
    copies_ok &= engine
                     .CopyAsync(arena + i * block, device + i * block, block,
                                CopyDirection::kDeviceToHost, stream)
                     .ok();
  }
  copies_ok &= engine.Wait(stream).ok();
  Check(copies_ok && std::memcmp(arena, ref.data(), total) == 0,
        "device -> arena mapping: bytes as put");
  for (int i = 0; i < blocks; ++i) {
    copies_ok &= engine
                     .CopyAsync(device2 + i * block, arena + i * block, block,
                                CopyDirection::kHostToDevice, stream)
                     .ok();
  }
  copies_ok &= engine.Wait(stream).ok();
  std::vector<uint8_t> back(total);
  CUDA_OR_DIE(cudaMemcpy(back.data(), device2, total, cudaMemcpyDeviceToHost));
  Check(copies_ok && back == ref, "arena mapping -> device: bytes as put");
  int dev = -1;
  CUDA_OR_DIE(cudaGetDevice(&dev));
  Result<int> of_device = engine.DeviceOf(device + block);
  Check(of_device.ok() && *of_device == dev, "DeviceOf(device pointer) is its device");
  Check(!engine.DeviceOf(arena).ok(), "DeviceOf(arena mapping) refused: host memory");
  Check(!engine.DeviceOf(ref.data()).ok(), "DeviceOf(pageable memory) refused");

  std::printf("== timing (%d x %zu KiB per wait, median of %d) ==\n", blocks, block >> 10, reps);
  struct Row {
    const char* what;
    double gbps;
    const char* peer;
    double peer_gbps;
  };
  const auto gbps = [&](double s) { return static_cast<double>(total) / s / 1e9; };
  const auto engine_wait = [&] { engine.Wait(stream).IgnoreError(); };
  const auto cuda_wait = [&] { CUDA_OR_DIE(cudaStreamSynchronize(stream)); };
  const double h2d = MedianSeconds(
      reps, blocks,
      [&](int i) {
        engine
            .CopyAsync(device + i * block, arena + i * block, block, CopyDirection::kHostToDevice,
                       stream)
            .IgnoreError();
      },
      engine_wait);
  const double h2d_peer = MedianSeconds(
      reps, blocks,
      [&](int i) {
        CUDA_OR_DIE(cudaMemcpyAsync(device + i * block, pinned + i * block, block,
                                    cudaMemcpyHostToDevice, stream));
      },
      cuda_wait);
  const double d2h = MedianSeconds(
      reps, blocks,
      [&](int i) {
        engine
            .CopyAsync(arena + i * block, device + i * block, block, CopyDirection::kDeviceToHost,
                       stream)
            .IgnoreError();
      },
      engine_wait);
  const double d2h_peer = MedianSeconds(
      reps, blocks,
      [&](int i) {
        CUDA_OR_DIE(cudaMemcpyAsync(pinned + i * block, device + i * block, block,
                                    cudaMemcpyDeviceToHost, stream));
      },
      cuda_wait);
  const Row rows[] = {
      {"client get: arena mapping -> device (H2D)", gbps(h2d),
       "cudaMemcpyAsync from cudaMallocHost", gbps(h2d_peer)},
      {"client put: device -> arena mapping (D2H)", gbps(d2h), "cudaMemcpyAsync to cudaMallocHost",
       gbps(d2h_peer)},
  };
  std::printf("\n== summary: %d failed ==\n", g_failed);
  std::printf("| copy | block | GB/s | peer | peer GB/s | ratio |\n");
  std::printf("| --- | --- | ---: | --- | ---: | ---: |\n");
  for (const Row& r : rows) {
    std::printf("| %s | %zu KiB x %d | %.1f | %s | %.1f | %.2f |\n", r.what, block >> 10, blocks,
                r.gbps, r.peer, r.peer_gbps, r.gbps / r.peer_gbps);
  }
  std::printf("RESULT: %s\n", g_failed == 0 ? "PASS" : "FAIL");
  cudaStreamDestroy(stream);
  cudaFree(device);
  cudaFree(device2);
  cudaFreeHost(pinned);
  UnregisterHostMemory(arena);
  munmap(arena, total);
  return g_failed == 0 ? 0 : 1;
}

}  // namespace
}  // namespace kvpool::kernels

int main(int argc, char** argv) { return kvpool::kernels::Main(argc, argv); }
