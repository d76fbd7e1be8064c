// kvpool-device-copy-check: the client's device-buffer copies (kernels/device_copy.h) on a GPU,
// checked and timed beside their peer in the same run. Run by bench/gpu/device_check.sh.
//
// The host side is what a same-node client copies from and into: a memfd-backed shared mapping
// registered with CUDA (kernels/pinned_memory.h), as the client maps the daemon's host arena.
// The peer is cudaMemcpyAsync from cudaMallocHost memory of the same size: the machine's pinned
// host<->device limit. Target (issue 9): >= 0.9x of the peer for host-to-device.
//
// Checks: bytes round-trip exactly (device -> arena -> device), DeviceOf refuses host memory,
// and knows the device of a device pointer. Then the gpu tier's memory (kernels/device_arena.h):
// a segment written and read back, renewed to zeros, and exported to a second process (this
// binary again, --import-child) that imports it, checks its bytes and times a device-to-device
// copy out of it beside cudaMemcpy between its own buffers (target: >= 0.8x).
//
// Usage: kvpool-device-copy-check [--block_mib=N] [--blocks=N] [--reps=N]

#include <cuda_runtime.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/wait.h>

#include "kernels/device_arena.h"
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
  // A mapping CUDA will not pin is a failed check, not the end of the run: the copies below
  // still work from it (staged by CUDA), and their bytes are still checked.
  const Status reg = RegisterHostMemory(p, bytes);
  Check(reg.ok(), "the shared mapping is pinned with CUDA (cudaHostRegister): " + reg.ToString());
  return static_cast<uint8_t*>(p);
}

std::vector<uint8_t> Pattern(uint64_t seed, size_t bytes) {
  std::vector<uint8_t> out(bytes);
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < bytes; i += 8) {
    const uint64_t v = rng();
    std::memcpy(out.data() + i, &v, std::min<size_t>(8, bytes - i));
  }
  return out;
}

constexpr uint64_t kSegmentSeed = 7;

// The second process: imports the segment behind `fd`, checks it holds Pattern(kSegmentSeed),
// and times a D2D copy out of it beside one between its own buffers. Prints one table row.
int ImportChild(int fd, uint64_t bytes, int reps) {
  int dev = 0;
  CUDA_OR_DIE(cudaGetDevice(&dev));
  Result<std::unique_ptr<ImportedSegment>> seg = ImportCudaSegment(fd, bytes, dev);
  close(fd);
  if (!seg.ok()) {
    std::printf("  FAIL second process: importing the segment: %s\n",
                seg.status().ToString().c_str());
    return 1;
  }
  std::vector<uint8_t> got(bytes);
  CUDA_OR_DIE(cudaMemcpy(got.data(), (*seg)->data(), bytes, cudaMemcpyDeviceToHost));
  const bool same = got == Pattern(kSegmentSeed, bytes);
  std::printf("  %-4s second process: imported gpu segment holds the bytes written\n",
              same ? "ok" : "FAIL");
  uint8_t* a = nullptr;
  uint8_t* b = nullptr;
  CUDA_OR_DIE(cudaMalloc(&a, bytes));
  CUDA_OR_DIE(cudaMalloc(&b, bytes));
  const auto time = [&](const void* src, void* dst) {
    cudaEvent_t e0, e1;
    CUDA_OR_DIE(cudaEventCreate(&e0));
    CUDA_OR_DIE(cudaEventCreate(&e1));
    std::vector<float> ms;
    for (int r = 0; r < reps + 2; ++r) {
      CUDA_OR_DIE(cudaEventRecord(e0));
      CUDA_OR_DIE(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice));
      CUDA_OR_DIE(cudaEventRecord(e1));
      CUDA_OR_DIE(cudaEventSynchronize(e1));
      float t = 0;
      CUDA_OR_DIE(cudaEventElapsedTime(&t, e0, e1));
      if (r >= 2) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return static_cast<double>(bytes) / (ms[ms.size() / 2] / 1e3) / 1e9;
  };
  const double imported = time((*seg)->data(), a);
  const double own = time(b, a);
  std::printf(
      "| second process: imported gpu segment -> own buffer (D2D) | %llu KiB | %.0f | "
      "cudaMemcpy D2D between own buffers | %.0f | %.2f |\n",
      static_cast<unsigned long long>(bytes >> 10), imported, own, imported / own);
  cudaFree(a);
  cudaFree(b);
  return same ? 0 : 1;
}

// The gpu tier's memory: a segment written and read back, renewed to zeros, exported to a
// second process, whose table row is returned.
std::string CheckArena(const char* self, int reps) {
  const uint64_t seg_bytes = 32ull << 20;  // a multiple of the 2 MiB granularity
  Result<std::unique_ptr<DeviceArena>> arena_or = CreateCudaDeviceArena(0, seg_bytes, 2);
  if (!arena_or.ok()) {
    Check(false, "CreateCudaDeviceArena: " + arena_or.status().ToString());
    return "";
  }
  DeviceArena& arena = **arena_or;
  uint8_t* seg1 = arena.base() + seg_bytes;
  const std::vector<uint8_t> ref = Pattern(kSegmentSeed, seg_bytes);
  std::vector<uint8_t> back(seg_bytes);
  Status st =
      arena.copies().CopyAsync(seg1, ref.data(), seg_bytes, CopyDirection::kHostToDevice, nullptr);
  if (st.ok()) st = arena.copies().Wait(nullptr);
  if (st.ok()) {
    st = arena.copies().CopyAsync(back.data(), seg1, seg_bytes, CopyDirection::kDeviceToHost,
                                  nullptr);
  }
  if (st.ok()) st = arena.copies().Wait(nullptr);
  Check(st.ok() && back == ref, "gpu arena segment: bytes as written (" + st.ToString() + ")");
  st = arena.Renew(1);
  CUDA_OR_DIE(cudaMemcpy(back.data(), seg1, seg_bytes, cudaMemcpyDeviceToHost));
  Check(st.ok() && back == std::vector<uint8_t>(seg_bytes, 0),
        "gpu arena segment renewed: zeros (" + st.ToString() + ")");
  CUDA_OR_DIE(cudaMemcpy(seg1, ref.data(), seg_bytes, cudaMemcpyHostToDevice));
  Result<int> fd = arena.ExportSegment(1);
  Check(fd.ok(), "gpu arena segment exported as a descriptor (" + fd.status().ToString() + ")");
  if (!fd.ok()) return "";
  fcntl(*fd, F_SETFD, 0);  // the child inherits it
  std::fflush(stdout);
  int out[2];
  if (pipe(out) != 0) {
    std::perror("pipe");
    std::exit(2);
  }
  // Made before fork: the child of a process with CUDA's threads only execs.
  const std::string fd_arg = "--import-child=" + std::to_string(*fd);
  const std::string bytes_arg = "--bytes=" + std::to_string(seg_bytes);
  const std::string reps_arg = "--reps=" + std::to_string(reps);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    close(out[0]);
    close(out[1]);
    execl(self, self, fd_arg.c_str(), bytes_arg.c_str(), reps_arg.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(*fd);
  close(out[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = read(out[0], buf, sizeof(buf))) > 0;) text.append(buf, n);
  close(out[0]);
  std::string row;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(at, end - at);
    if (line.rfind("|", 0) == 0) {
      row = line;
    } else {
      std::printf("%s\n", line.c_str());
    }
    at = end + 1;
  }
  int wstatus = 0;
  waitpid(pid, &wstatus, 0);
  Check(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0,
        "second process imported the segment and read it (exit " +
            std::to_string(WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1) + ")");
  return row;
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
  int import_fd = -1;
  uint64_t import_bytes = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--import-child=", 0) == 0) {
      import_fd = std::atoi(a.c_str() + 15);
    } else if (a.rfind("--bytes=", 0) == 0) {
      import_bytes = std::strtoull(a.c_str() + 8, nullptr, 10);
    } else if (a.rfind("--block_mib=", 0) == 0) {
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
  if (import_fd >= 0) return ImportChild(import_fd, import_bytes, reps);
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
  // A client maps a segment it only reads PROT_READ and pins it with cudaHostRegisterReadOnly,
  // which not every system supports (its copies from there are then staged by CUDA, slower).
  int read_only = 0;
  CUDA_OR_DIE(cudaDeviceGetAttribute(&read_only, cudaDevAttrHostRegisterReadOnlySupported, dev));
  {
    void* ro = mmap(nullptr, block, PROT_READ, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    const Status reg = ro == MAP_FAILED ? Status::FromErrno(errno, "mmap")
                                        : RegisterHostMemory(ro, block, /*read_only=*/true);
    Check(reg.ok() == (read_only != 0),
          "a read-only mapping is pinned where the GPU can (cudaDevAttrHostRegisterReadOnly"
          "Supported = " +
              std::to_string(read_only) + "): " + reg.ToString());
    if (reg.ok()) UnregisterHostMemory(ro);
    if (ro != MAP_FAILED) munmap(ro, block);
  }

  const std::string ipc_row = CheckArena(argv[0], reps);

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
  // The client's copy between the arena mapping and the device, and the same copy from or into
  // cudaMallocHost memory.
  const auto through_engine = [&](CopyDirection dir) {
    return MedianSeconds(
        reps, blocks,
        [&](int i) {
          uint8_t* host = arena + i * block;
          uint8_t* dev = device + i * block;
          const bool h2d = dir == CopyDirection::kHostToDevice;
          engine.CopyAsync(h2d ? dev : host, h2d ? host : dev, block, dir, stream).IgnoreError();
        },
        engine_wait);
  };
  const auto from_pinned = [&](cudaMemcpyKind kind) {
    return MedianSeconds(
        reps, blocks,
        [&](int i) {
          uint8_t* host = pinned + i * block;
          uint8_t* dev = device + i * block;
          const bool h2d = kind == cudaMemcpyHostToDevice;
          CUDA_OR_DIE(cudaMemcpyAsync(h2d ? dev : host, h2d ? host : dev, block, kind, stream));
        },
        cuda_wait);
  };
  const double h2d = through_engine(CopyDirection::kHostToDevice);
  const double h2d_peer = from_pinned(cudaMemcpyHostToDevice);
  const double d2h = through_engine(CopyDirection::kDeviceToHost);
  const double d2h_peer = from_pinned(cudaMemcpyDeviceToHost);
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
  if (!ipc_row.empty()) std::printf("%s\n", ipc_row.c_str());
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
