// kvpool-gpu-tier-check: the gpu data path of a real kvpoold on a real GPU, end to end, checked
// byte for byte and timed beside the CUDA copy each path stands for. Run by
// bench/gpu/device_check.sh on a machine with a GPU (it needs one; CI has none).
//
// It starts kvpoold with a gpu tier on device 0 (--gpu_devices=0) and, through one client on
// the shared-memory path:
//   1. puts blocks from device memory: one set with gpu_device (device to device into slots of
//      the gpu tier, the daemon copying them down to host behind the put), one without (D2H into
//      the reserved host slots), each timed once; then prefetches the first set toward the gpu
//      tier (nothing left to place) and checks it is all there;
//   2. gets them into device buffers: device to device out of the gpu tier, through the segment
//      the client imports by CUDA IPC; timed beside cudaMemcpy D2D of the same bytes
//      (issue 9's target: >= 0.8);
//   3. gets blocks that are only in host memory into device buffers: one H2D copy straight from
//      the shared-memory arena; timed beside cudaMemcpy H2D from cudaMallocHost memory of the
//      same bytes (target: >= 0.9);
//   4. on a machine with a second GPU that reaches device 0 peer to peer, gets the gpu-tier
//      blocks into device 1's memory: peer to peer out of device 0's gpu tier; timed beside
//      cudaMemcpy device 0 to device 1 (the same target as 2); on one GPU, says it did not run;
//   5. borrows the gpu-tier blocks as device views (verified on the GPU) and reads them;
//   6. starts a second process (this program, --child) that reads the gpu-tier blocks into its
//      own device memory by CUDA IPC and checks them.
// Every block read is copied back to the host and compared with what was put: a row fails on a
// wrong byte or a failed call. The speed ratios are reported beside their targets, not checked
// (a get also verifies each block's checksum, on the GPU for device-to-device copies, which a
// bare cudaMemcpy does not). The table it prints last goes into docs/BENCHMARKS.md with the date
// and the card.
//
// Exit: 0 every check passed; 1 a check failed; 77 no CUDA device (ctest counts it skipped);
// 2 no daemon, or another setup error.

#include <cuda_runtime.h>
#include <gflags/gflags.h>
#include <sys/wait.h>
#include <unistd.h>

#include <kvpool/kvpool.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_daemon.h"

DEFINE_string(kvpoold, "",
              "kvpoold binary (default: ../daemon/kvpoold or kvpoold beside this one)");
DEFINE_uint64(block_bytes, 4 << 20, "Bytes of every block (at most the 64 MiB segment).");
DEFINE_uint32(blocks, 64, "Blocks of each set (one in the gpu tier, one in host only).");
DEFINE_uint32(batch, 64,
              "Blocks each timed get asks for (a set's worth: the copies' bandwidth, "
              "not the round trips, is what is compared).");
DEFINE_uint32(rounds, 20, "Timed rounds of each figure (the median is reported).");
DEFINE_string(child, "", "Internal: the daemon socket a second process reads the gpu set from.");
DEFINE_uint64(nonce, 0, "Internal: the run's nonce (keys and bytes derive from it).");

namespace kvpool::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kDevice = 0;

// Key and bytes of block i of set `set` in the run `nonce`: derived, so the child process
// regenerates what it must read.
BlockKey KeyOf(uint64_t nonce, int set, uint32_t i) {
  BlockKey k;
  const uint64_t words[4] = {nonce, static_cast<uint64_t>(set), i, 0x6770752d74696572ull};
  std::memcpy(k.bytes.data(), words, sizeof(words));
  return k;
}

void FillBytes(uint64_t nonce, int set, uint32_t i, uint8_t* out, size_t n) {
  uint64_t x = nonce ^ (static_cast<uint64_t>(set) << 48) ^ (static_cast<uint64_t>(i) << 16) ^
               0x9e3779b97f4a7c15ull;
  size_t off = 0;
  while (off < n) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const size_t take = std::min<size_t>(8, n - off);
    std::memcpy(out + off, &x, take);
    off += take;
  }
}

struct Row {
  std::string check;
  bool ok = false;
  std::string detail;
};

class Check {
 public:
  explicit Check(uint64_t nonce) : nonce_(nonce), bytes_(FLAGS_block_bytes), n_(FLAGS_blocks) {}
  ~Check() {
    for (void* p : device_) cudaFree(p);
    for (void* p : pinned_) cudaFreeHost(p);
  }

  std::vector<Row>& rows() { return rows_; }

  // Device memory of `bytes`, freed with the check.
  uint8_t* DeviceBuffer(size_t bytes) {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) return nullptr;
    device_.push_back(p);
    return static_cast<uint8_t*>(p);
  }
  uint8_t* PinnedBuffer(size_t bytes) {
    void* p = nullptr;
    if (cudaMallocHost(&p, bytes) != cudaSuccess) return nullptr;
    pinned_.push_back(p);
    return static_cast<uint8_t*>(p);
  }

  std::vector<BlockKey> Keys(int set) const {
    std::vector<BlockKey> keys;
    for (uint32_t i = 0; i < n_; ++i) keys.push_back(KeyOf(nonce_, set, i));
    return keys;
  }

  // Whether the n_ blocks at `device` (block i at i * bytes_) hold set `set`'s bytes.
  bool DeviceHoldsSet(const uint8_t* device, int set, std::string* why) {
    std::vector<uint8_t> got(bytes_), want(bytes_);
    for (uint32_t i = 0; i < n_; ++i) {
      if (cudaMemcpy(got.data(), device + i * bytes_, bytes_, cudaMemcpyDeviceToHost) !=
          cudaSuccess) {
        *why = "cudaMemcpy D2H of block " + std::to_string(i) + " failed";
        return false;
      }
      FillBytes(nonce_, set, i, want.data(), bytes_);
      if (got != want) {
        *why = "block " + std::to_string(i) + " differs from what was put";
        return false;
      }
    }
    return true;
  }

  void Add(std::string check, bool ok, std::string detail) {
    std::printf("%s %s: %s\n", ok ? "ok  " : "FAIL", check.c_str(), detail.c_str());
    std::fflush(stdout);
    rows_.push_back({std::move(check), ok, std::move(detail)});
  }

  uint64_t nonce() const { return nonce_; }
  size_t bytes() const { return bytes_; }
  uint32_t n() const { return n_; }

 private:
  const uint64_t nonce_;
  const size_t bytes_;
  const uint32_t n_;
  std::vector<void*> device_;
  std::vector<void*> pinned_;
  std::vector<Row> rows_;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Seconds of `fn` (synchronous), the median of FLAGS_rounds after one untimed round.
template <typename Fn>
double TimeRounds(Fn fn, bool* ok) {
  std::vector<double> s;
  for (uint32_t r = 0; r <= FLAGS_rounds; ++r) {
    const Clock::time_point t0 = Clock::now();
    if (!fn()) {
      *ok = false;
      return 0;
    }
    if (r > 0) s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return Median(s);
}

std::string Rate(double bytes, double seconds) {
  char b[64];
  std::snprintf(b, sizeof(b), "%.1f GB/s", seconds > 0 ? bytes / seconds / 1e9 : 0.0);
  return b;
}

std::string Ratio(double ours, double peer, double target) {
  char b[96];
  std::snprintf(b, sizeof(b), "%.2f of it (target >= %.1f)", peer > 0 ? ours / peer : 0.0, target);
  return b;
}

// How many of `keys` the daemon has in `tier`, polled until all are or `patience` runs out.
size_t CountIn(Client& client, const std::vector<BlockKey>& keys, Tier tier,
               std::chrono::milliseconds patience) {
  size_t n = 0;
  for (const Clock::time_point until = Clock::now() + patience;;) {
    Result<std::vector<Tier>> where = client.Where(keys);
    n = where.ok() ? static_cast<size_t>(std::count(where->begin(), where->end(), tier)) : 0;
    if (n == keys.size() || Clock::now() >= until) return n;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// One synchronous cudaMemcpy of any direction (cudaMemcpyDefault: unified addressing).
bool CudaCopy(void* dst, const void* src, size_t bytes, std::string* why) {
  if (cudaMemcpy(dst, src, bytes, cudaMemcpyDefault) != cudaSuccess ||
      cudaDeviceSynchronize() != cudaSuccess) {
    *why = std::string("cudaMemcpy: ") + cudaGetErrorString(cudaGetLastError());
    return false;
  }
  return true;
}

// Gets `keys` batch by batch into device memory at `dst` (block i at i * bytes).
bool GetInto(Client& client, const std::vector<BlockKey>& keys, uint8_t* dst, size_t bytes,
             Tier want, std::string* why) {
  for (size_t start = 0; start < keys.size(); start += FLAGS_batch) {
    const size_t end = std::min(keys.size(), start + FLAGS_batch);
    std::vector<MutableBuffer> buffers;
    for (size_t i = start; i < end; ++i) {
      buffers.push_back(MutableBuffer{dst + i * bytes, bytes, Memory::kCuda});
    }
    Result<std::vector<GetResult>> r =
        client.Get(std::span<const BlockKey>(keys).subspan(start, end - start), buffers);
    if (!r.ok()) {
      *why = "Get: " + r.status().ToString();
      return false;
    }
    for (size_t i = 0; i < r->size(); ++i) {
      const GetResult& g = (*r)[i];
      if (!g.status.ok() || g.size != bytes || (want != Tier::kNone && g.tier != want)) {
        *why = "block " + std::to_string(start + i) + ": " + g.status.ToString() + ", " +
               std::to_string(g.size) + " bytes from tier " + std::string(TierName(g.tier));
        return false;
      }
    }
  }
  return true;
}

// The second process: reads the gpu set into its own device memory by CUDA IPC and checks it.
int RunChild() {
  Check c(FLAGS_nonce);
  ClientOptions o;
  o.address = FLAGS_child;
  o.data_path = DataPath::kSharedMemory;
  Result<std::unique_ptr<Client>> client = Client::Connect(o);
  if (!client.ok()) {
    std::fprintf(stderr, "child: %s\n", client.status().ToString().c_str());
    return 1;
  }
  uint8_t* dst = c.DeviceBuffer(c.n() * c.bytes());
  std::string why;
  if (dst == nullptr || !GetInto(**client, c.Keys(0), dst, c.bytes(), Tier::kGpu, &why) ||
      !c.DeviceHoldsSet(dst, 0, &why)) {
    std::fprintf(stderr, "child: %s\n", why.empty() ? "cudaMalloc failed" : why.c_str());
    return 1;
  }
  return 0;
}

int Run(const char* argv0) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "kvpool-gpu-tier-check: no CUDA device (%s)\n",
                 cudaGetErrorString(cudaGetLastError()));
    return 77;
  }
  if (FLAGS_blocks == 0 || FLAGS_batch == 0 || FLAGS_rounds == 0 || FLAGS_block_bytes == 0 ||
      FLAGS_block_bytes > (64ull << 20)) {
    std::fprintf(stderr,
                 "kvpool-gpu-tier-check: --blocks, --batch and --rounds > 0; --block_bytes in "
                 "(0, 64 MiB]\n");
    return 2;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, kDevice) != cudaSuccess) {
    std::fprintf(stderr, "kvpool-gpu-tier-check: cudaGetDeviceProperties: %s\n",
                 cudaGetErrorString(cudaGetLastError()));
    return 2;
  }
  const uint64_t nonce = static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  Check c(nonce);
  const size_t set_bytes = static_cast<size_t>(c.n()) * c.bytes();
  // Two sets in host, one of them in the gpu tier too, with room to spare.
  const uint64_t host = std::max<uint64_t>(4 * set_bytes, 256ull << 20);
  const uint64_t gpu = std::max<uint64_t>(2 * set_bytes, 128ull << 20);
  DaemonProcessOptions d =
      BenchDaemonOptions(FindKvpoold(FLAGS_kvpoold), host,
                         {"--gpu_devices=" + std::to_string(kDevice),
                          "--gpu_capacity=" + std::to_string(gpu), "--gpu_segment_size=64MiB",
                          // What this check does not look at stays out of its way in a sandbox.
                          "--lock_memory=false", "--ucx=false"});
  d.dir_prefix = "kvpool-gpu-tier-check";
  Result<std::unique_ptr<DaemonProcess>> daemon = DaemonProcess::Launch(d);
  if (!daemon.ok()) {
    std::fprintf(stderr, "kvpool-gpu-tier-check: kvpoold (%s): %s\n", d.binary.c_str(),
                 daemon.status().ToString().c_str());
    return 2;
  }
  ClientOptions o;
  o.address = (*daemon)->socket_path();
  o.data_path = DataPath::kSharedMemory;  // the copies checked here are the same-node ones
  Result<std::unique_ptr<Client>> connected = Client::Connect(o);
  if (!connected.ok()) {
    std::fprintf(stderr, "kvpool-gpu-tier-check: connect: %s\n",
                 connected.status().ToString().c_str());
    return 2;
  }
  Client& client = **connected;
  std::printf("kvpool-gpu-tier-check: %s, %u blocks of %zu bytes a set, gets of %u\n", prop.name,
              c.n(), c.bytes(), FLAGS_batch);

  // The two sets' bytes in device memory, and set 1's in pinned host memory too.
  uint8_t* src = c.DeviceBuffer(2 * set_bytes);
  uint8_t* pinned = c.PinnedBuffer(set_bytes);
  uint8_t* dst = c.DeviceBuffer(set_bytes);
  uint8_t* peer = c.DeviceBuffer(set_bytes);
  if (src == nullptr || pinned == nullptr || dst == nullptr || peer == nullptr) {
    std::fprintf(stderr, "kvpool-gpu-tier-check: CUDA allocation of %zu bytes failed\n",
                 5 * set_bytes);
    return 2;
  }
  for (int set = 0; set < 2; ++set) {
    for (uint32_t i = 0; i < c.n(); ++i) {
      FillBytes(nonce, set, i, pinned + i * c.bytes(), c.bytes());
    }
    if (cudaMemcpy(src + set * set_bytes, pinned, set_bytes, cudaMemcpyHostToDevice) !=
        cudaSuccess) {
      std::fprintf(stderr, "kvpool-gpu-tier-check: cudaMemcpy of the sources: %s\n",
                   cudaGetErrorString(cudaGetLastError()));
      return 2;
    }
  }
  const std::vector<BlockKey> gpu_keys = c.Keys(0);
  const std::vector<BlockKey> host_keys = c.Keys(1);
  std::string why;

  // 1. Puts from device memory: set 0 with the gpu hint, set 1 without.
  for (int set = 0; set < 2; ++set) {
    std::vector<PutBlock> blocks;
    for (uint32_t i = 0; i < c.n(); ++i) {
      PutBlock b;
      b.key = set == 0 ? gpu_keys[i] : host_keys[i];
      b.data = src + set * set_bytes + i * c.bytes();
      b.size = c.bytes();
      b.memory = Memory::kCuda;
      blocks.push_back(b);
    }
    const Clock::time_point t0 = Clock::now();
    Result<PutResult> put = client.Put(blocks, {.gpu_device = set == 0 ? kDevice : -1});
    const double took = std::chrono::duration<double>(Clock::now() - t0).count();
    const bool ok = put.ok() && put->stored == c.n() && put->all_ok();
    c.Add(set == 0 ? "put from device memory into the gpu tier (D2D, one timed call)"
                   : "put from device memory into host (D2H, one timed call)",
          ok,
          put.ok() ? std::to_string(put->stored) + " of " + std::to_string(c.n()) + " stored; " +
                         Rate(set_bytes, took)
                   : put.status().ToString());
  }
  // Straight into the gpu tier: there as soon as the put returned.
  const size_t hinted = CountIn(client, gpu_keys, Tier::kGpu, std::chrono::seconds(10));
  c.Add("the put with gpu_device left the blocks in the gpu tier", hinted == c.n(),
        std::to_string(hinted) + " of " + std::to_string(c.n()) + " in gpu");
  // A prefetch toward the GPU places whatever the hint left, and waits for it.
  Result<PrefetchResult> placed = client.Prefetch(gpu_keys, {.gpu_device = kDevice});
  const size_t in_gpu =
      placed.ok() ? CountIn(client, gpu_keys, Tier::kGpu, std::chrono::seconds(10)) : 0;
  c.Add("a prefetch toward the GPU leaves every block there", placed.ok() && in_gpu == c.n(),
        placed.ok() ? std::to_string(placed->gpu_placed) + " placed by it; " +
                          std::to_string(in_gpu) + " of " + std::to_string(c.n()) + " in gpu"
                    : placed.status().ToString());

  // 2. Device to device out of the gpu tier, beside cudaMemcpy D2D.
  bool ok = true;
  why.clear();
  const double gpu_get =
      TimeRounds([&] { return GetInto(client, gpu_keys, dst, c.bytes(), Tier::kGpu, &why); }, &ok);
  ok = ok && c.DeviceHoldsSet(dst, 0, &why);
  const double d2d = TimeRounds([&] { return CudaCopy(peer, src, set_bytes, &why); }, &ok);
  c.Add("get from the gpu tier into device memory (D2D by CUDA IPC)", ok,
        ok ? Rate(set_bytes, gpu_get) + "; cudaMemcpy D2D " + Rate(set_bytes, d2d) + "; " +
                 Ratio(set_bytes / gpu_get, set_bytes / d2d, 0.8)
           : why);

  // 3. Host tier into device memory (H2D from the arena), beside cudaMemcpy from pinned memory.
  ok = true;
  why.clear();
  const double host_get = TimeRounds(
      [&] { return GetInto(client, host_keys, dst, c.bytes(), Tier::kHost, &why); }, &ok);
  ok = ok && c.DeviceHoldsSet(dst, 1, &why);
  const double h2d = TimeRounds([&] { return CudaCopy(peer, pinned, set_bytes, &why); }, &ok);
  c.Add("get from the host tier into device memory (H2D from the arena)", ok,
        ok ? Rate(set_bytes, host_get) + "; cudaMemcpy H2D from cudaMallocHost " +
                 Rate(set_bytes, h2d) + "; " + Ratio(set_bytes / host_get, set_bytes / h2d, 0.9)
           : why);

  // 4. A reader on a second GPU, peer to peer out of device 0's gpu tier, beside cudaMemcpy
  // between the two GPUs.
  std::vector<std::string> not_run;
  const std::string peer_check = "get from device 0's gpu tier onto device 1 (peer to peer)";
  int reaches = 0;
  if (devices < 2) {
    not_run.push_back(peer_check + ": this machine has one GPU");
  } else if (cudaDeviceCanAccessPeer(&reaches, 1, kDevice) != cudaSuccess || reaches == 0) {
    cudaGetLastError();
    not_run.push_back(peer_check + ": device 1 does not reach device 0 peer to peer");
  } else {
    why.clear();
    uint8_t* on1 = nullptr;
    if (cudaSetDevice(1) == cudaSuccess) on1 = c.DeviceBuffer(set_bytes);
    cudaSetDevice(kDevice);
    ok = on1 != nullptr;
    if (!ok) why = "cudaMalloc on device 1 failed";
    const double peer_get =
        ok ? TimeRounds([&] { return GetInto(client, gpu_keys, on1, c.bytes(), Tier::kGpu, &why); },
                        &ok)
           : 0;
    ok = ok && c.DeviceHoldsSet(on1, 0, &why);
    const double p2p =
        ok ? TimeRounds([&] { return CudaCopy(on1, src, set_bytes, &why); }, &ok) : 0;
    Result<DaemonStats> st = client.Stats();
    const uint64_t peer_hits = st.ok() && !st->tiers.empty() ? st->tiers[0].peer_hits : 0;
    ok = ok && peer_hits > 0;
    if (ok || why.empty()) why = std::to_string(peer_hits) + " peer hits counted";
    c.Add(peer_check, ok,
          ok ? Rate(set_bytes, peer_get) + "; cudaMemcpy device 0 to 1 " + Rate(set_bytes, p2p) +
                   "; " + Ratio(set_bytes / peer_get, set_bytes / p2p, 0.8) + "; " + why
             : why);
  }

  // 5. Device views of the gpu-tier blocks, verified on the GPU, read where they are.
  {
    why.clear();
    Result<BorrowedBlocks> lent = client.Borrow(gpu_keys, {.gpu_device = kDevice, .verify = true});
    ok = lent.ok();
    if (!ok) why = "Borrow: " + lent.status().ToString();
    for (uint32_t i = 0; ok && i < c.n(); ++i) {
      const BlockView& v = lent->views()[i];
      if (!v.status.ok() || v.memory != Memory::kCuda || v.size != c.bytes()) {
        ok = false;
        why = "view " + std::to_string(i) + ": " + v.status.ToString() +
              (v.memory == Memory::kCuda ? "" : ", not a device view") + ", " +
              std::to_string(v.size) + " bytes";
      } else {
        ok = CudaCopy(dst + i * c.bytes(), v.data, v.size, &why);
      }
    }
    if (ok) {
      const Status verified = lent->Verify();
      ok = verified.ok();
      if (!ok) why = "Verify: " + verified.ToString();
    }
    if (ok) ok = c.DeviceHoldsSet(dst, 0, &why);
    if (ok) {
      const Status released = lent->Release();
      ok = released.ok();
      if (!ok) why = "Release: " + released.ToString();
    }
    c.Add("borrow device views of the gpu tier", ok, ok ? "every view read and verified" : why);
  }

  // 6. A second process reads the gpu set by CUDA IPC. Its arguments are built before the fork.
  {
    std::error_code ec;
    std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (ec) self = argv0;
    const std::string exe = self.string();
    const std::vector<std::string> args = {exe,
                                           "--child=" + (*daemon)->socket_path(),
                                           "--nonce=" + std::to_string(nonce),
                                           "--block_bytes=" + std::to_string(c.bytes()),
                                           "--blocks=" + std::to_string(c.n()),
                                           "--batch=" + std::to_string(FLAGS_batch)};
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      execv(exe.c_str(), argv.data());
      _exit(127);
    }
    int status = 0;
    std::string outcome;
    if (pid < 0) {
      outcome = std::string("fork failed: ") + std::strerror(errno);
    } else if (waitpid(pid, &status, 0) != pid) {
      outcome = std::string("waitpid failed: ") + std::strerror(errno);
    } else if (WIFEXITED(status)) {
      outcome = "it exited with status " + std::to_string(WEXITSTATUS(status));
    } else if (WIFSIGNALED(status)) {
      outcome = "it was killed by signal " + std::to_string(WTERMSIG(status));
    }
    ok = pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    c.Add("a second process reads the gpu tier by CUDA IPC", ok,
          ok ? "its device copies match" : outcome);
  }

  // Every lease ended: the borrow's by its release, the gets' and the child's with their calls.
  Result<DaemonStats> stats = client.Stats();
  c.Add("no lease left behind", stats.ok() && stats->leases_active == 0,
        stats.ok() ? std::to_string(stats->leases_active) + " leases active"
                   : stats.status().ToString());

  connected->reset();
  const Status stopped = (*daemon)->Stop();
  c.Add("kvpoold stops cleanly", stopped.ok(), stopped.ok() ? "exit 0" : stopped.ToString());

  std::printf("\n| check | result | figures |\n| --- | --- | --- |\n");
  bool all = true;
  for (const Row& r : c.rows()) {
    std::printf("| %s | %s | %s |\n", r.check.c_str(), r.ok ? "ok" : "FAIL", r.detail.c_str());
    all = all && r.ok;
  }
  for (const std::string& n : not_run) std::printf("\nnot run: %s\n", n.c_str());
  if (!all) std::printf("\nkvpoold's log, its end:\n%s\n", (*daemon)->LogTail().c_str());
  std::printf("RESULT: %s\n", all ? "PASS" : "FAIL");
  return all ? 0 : 1;
}

}  // namespace
}  // namespace kvpool::bench

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "kvpool-gpu-tier-check: kvpoold's gpu tier on this machine's GPU, end to end. See "
      "bench/gpu/device_check.sh.");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (!FLAGS_child.empty()) return kvpool::bench::RunChild();
  return kvpool::bench::Run(argv[0]);
}
