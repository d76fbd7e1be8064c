#include "tests/support/fake_device.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kvpool::testing {
namespace {

[[noreturn]] void Die(const char* what) {
  std::perror(what);
  std::abort();
}

}  // namespace

FakeDevice::~FakeDevice() {
  for (auto& [addr, a] : allocations_) {
    if (!a.owned) continue;
    munmap(a.device, a.bytes);
    munmap(a.view, a.bytes);
  }
}

int FakeDevice::MapFresh(uint8_t* device, size_t bytes, int gpu) {
  const int fd = memfd_create("kvpool-fake-gpu-segment", MFD_CLOEXEC);
  if (fd < 0) Die("FakeDevice: memfd_create");
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) Die("FakeDevice: ftruncate");
  if (mmap(device, bytes, PROT_NONE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
    Die("FakeDevice: mmap segment");
  }
  void* view = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (view == MAP_FAILED) Die("FakeDevice: mmap view");
  struct stat st {};
  if (fstat(fd, &st) != 0) Die("FakeDevice: fstat");
  std::lock_guard<std::mutex> lock(mu_);
  auto it = allocations_.find(reinterpret_cast<uintptr_t>(device));
  if (it != allocations_.end()) munmap(it->second.view, it->second.bytes);
  allocations_[reinterpret_cast<uintptr_t>(device)] = {device, static_cast<uint8_t*>(view), bytes,
                                                       /*owned=*/false, gpu};
  segment_gpus_[st.st_ino] = gpu;
  return fd;
}

void FakeDevice::Unregister(uint8_t* device) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = allocations_.find(reinterpret_cast<uintptr_t>(device));
  if (it == allocations_.end()) return;
  munmap(it->second.view, it->second.bytes);
  allocations_.erase(it);
}

class FakeDevice::Arena final : public kernels::DeviceArena {
 public:
  Arena(FakeDevice& device, int gpu, uint64_t segment_bytes, uint32_t segment_count)
      : device_(device),
        gpu_(gpu),
        segment_bytes_(segment_bytes),
        segment_count_(segment_count),
        fds_(segment_count, -1) {
    void* p = mmap(nullptr, segment_bytes * segment_count, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) Die("FakeDevice: reserving an arena");
    base_ = static_cast<uint8_t*>(p);
    for (uint32_t i = 0; i < segment_count; ++i) Renew(i).IgnoreError();
  }
  ~Arena() override {
    for (uint32_t i = 0; i < segment_count_; ++i) {
      device_.Unregister(base_ + i * segment_bytes_);
      if (fds_[i] >= 0) close(fds_[i]);
    }
    munmap(base_, segment_bytes_ * segment_count_);
  }

  int device() const override { return gpu_; }
  uint8_t* base() const override { return base_; }
  uint64_t segment_bytes() const override { return segment_bytes_; }
  uint32_t segment_count() const override { return segment_count_; }
  kernels::DeviceCopyEngine& copies() override { return device_; }

  Status Renew(uint32_t index) override {
    device_.MaybeHoldRenewal();
    uint8_t* at = base_ + index * segment_bytes_;
    if (device_.TakeRenewalFailure()) {
      // As the CUDA arena: the old memory released first, and none in its place.
      device_.Unregister(at);
      if (mmap(at, segment_bytes_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) ==
          MAP_FAILED) {
        Die("FakeDevice: unmapping a segment");
      }
      if (fds_[index] >= 0) close(fds_[index]);
      fds_[index] = -1;
      return Status::ResourceExhausted("FakeDevice: no device memory for a renewal (injected)");
    }
    const int fd = device_.MapFresh(at, segment_bytes_, gpu_);
    if (fds_[index] >= 0) close(fds_[index]);
    fds_[index] = fd;
    return Status::OK();
  }

  Result<int> ExportSegment(uint32_t index) override {
    if (index >= segment_count_) return Status::InvalidArgument("no such segment");
    if (fds_[index] < 0) return Status::InvalidArgument("segment has no memory");
    const int fd = fcntl(fds_[index], F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return Status::FromErrno(errno, "dup");
    return fd;
  }

 private:
  FakeDevice& device_;
  const int gpu_;
  const uint64_t segment_bytes_;
  const uint32_t segment_count_;
  uint8_t* base_ = nullptr;
  std::vector<int> fds_;
};

class FakeDevice::Imported final : public kernels::ImportedSegment {
 public:
  Imported(FakeDevice& device, uint8_t* data, uint64_t bytes)
      : device_(device), data_(data), bytes_(bytes) {}
  ~Imported() override {
    device_.Unregister(data_);
    munmap(data_, bytes_);
  }
  uint8_t* data() const override { return data_; }
  uint64_t bytes() const override { return bytes_; }

 private:
  FakeDevice& device_;
  uint8_t* const data_;
  const uint64_t bytes_;
};

Result<std::unique_ptr<kernels::ImportedSegment>> FakeDevice::ImportSegment(int fd, uint64_t bytes,
                                                                            int device) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != bytes) {
    return Status::InvalidArgument("FakeDevice: not a segment of that size");
  }
  int gpu = device_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!KnownLocked(device)) return Status::InvalidArgument("FakeDevice: another device");
    if (fail_imports_) return *fail_imports_;
    if (auto it = segment_gpus_.find(st.st_ino); it != segment_gpus_.end()) gpu = it->second;
    if (gpu != device && !peer_access_) {
      return Status::InvalidArgument("FakeDevice: device " + std::to_string(device) +
                                     " cannot reach device " + std::to_string(gpu));
    }
  }
  void* p = mmap(nullptr, bytes, PROT_NONE, MAP_SHARED, fd, 0);
  void* view = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED || view == MAP_FAILED) return Status::FromErrno(errno, "FakeDevice: mmap");
  {
    std::lock_guard<std::mutex> lock(mu_);
    allocations_[reinterpret_cast<uintptr_t>(p)] = {static_cast<uint8_t*>(p),
                                                    static_cast<uint8_t*>(view),
                                                    bytes,
                                                    /*owned=*/false,
                                                    gpu,
                                                    device};
  }
  return std::unique_ptr<kernels::ImportedSegment>(
      std::make_unique<Imported>(*this, static_cast<uint8_t*>(p), bytes));
}

std::unique_ptr<kernels::DeviceArena> FakeDevice::CreateArena(uint64_t segment_bytes,
                                                              uint32_t segment_count, int device) {
  return std::make_unique<Arena>(*this, device < 0 ? device_ : device, segment_bytes,
                                 segment_count);
}

void FakeDevice::AddDevice(int device) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!KnownLocked(device)) devices_.push_back(device);
}

void FakeDevice::SetPeerAccess(bool can) {
  std::lock_guard<std::mutex> lock(mu_);
  peer_access_ = can;
}

namespace {
thread_local int current_device = -1;  // FakeDevice::UseDevice's; -1: none made current
}  // namespace

std::shared_ptr<void> FakeDevice::UseDevice(int device) {
  if (device < 0) return nullptr;
  const int before = current_device;
  current_device = device;
  return std::shared_ptr<void>(nullptr, [before](void*) { current_device = before; });
}

Status FakeDevice::ReachableLocked(const void* ptr, size_t bytes) const {
  const Allocation* a = FindLocked(ptr, bytes);
  if (a == nullptr) return Status::InvalidArgument("FakeDevice: outside device memory");
  const int reaching = a->mapped_for >= 0 ? a->mapped_for : a->gpu;
  if (current_device < 0 || current_device == reaching) return Status::OK();
  return Status::InvalidArgument("FakeDevice: device " + std::to_string(current_device) +
                                 " cannot reach memory of device " + std::to_string(a->gpu) +
                                 (a->mapped_for >= 0
                                      ? " imported for device " + std::to_string(a->mapped_for)
                                      : std::string()));
}

bool FakeDevice::KnownLocked(int device) const {
  return std::find(devices_.begin(), devices_.end(), device) != devices_.end();
}

int FakeDevice::DeviceCount() const {
  std::lock_guard<std::mutex> lock(mu_);
  return *std::max_element(devices_.begin(), devices_.end()) + 1;
}

bool FakeDevice::CanAccessPeer(int device, int peer) const {
  std::lock_guard<std::mutex> lock(mu_);
  return device != peer && peer_access_ && KnownLocked(device) && KnownLocked(peer);
}

void* FakeDevice::Alloc(size_t bytes, int device) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t rounded = (bytes + page - 1) / page * page;
  const int fd = memfd_create("kvpool-fake-device", MFD_CLOEXEC);
  if (fd < 0) Die("FakeDevice: memfd_create");
  if (ftruncate(fd, static_cast<off_t>(rounded)) != 0) Die("FakeDevice: ftruncate");
  void* p = mmap(nullptr, rounded, PROT_NONE, MAP_SHARED, fd, 0);
  void* view = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED || view == MAP_FAILED) Die("FakeDevice: mmap");
  std::lock_guard<std::mutex> lock(mu_);
  allocations_[reinterpret_cast<uintptr_t>(p)] = {static_cast<uint8_t*>(p),
                                                  static_cast<uint8_t*>(view), rounded,
                                                  /*owned=*/true, device < 0 ? device_ : device};
  return p;
}

void FakeDevice::Free(void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = allocations_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == allocations_.end()) return;
  munmap(it->second.device, it->second.bytes);
  munmap(it->second.view, it->second.bytes);
  allocations_.erase(it);
}

const FakeDevice::Allocation* FakeDevice::FindLocked(const void* ptr, size_t bytes) const {
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  auto it = allocations_.upper_bound(p);
  if (it == allocations_.begin()) return nullptr;
  --it;
  const Allocation& a = it->second;
  if (p + bytes > it->first + a.bytes) return nullptr;
  return &a;
}

uint8_t* FakeDevice::ViewOfLocked(const void* ptr, size_t bytes) const {
  const Allocation* a = FindLocked(ptr, bytes);
  if (a == nullptr) return nullptr;
  return a->view + (static_cast<const uint8_t*>(ptr) - a->device);
}

void FakeDevice::Write(void* dst, const void* src, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  uint8_t* view = ViewOfLocked(dst, bytes);
  if (view == nullptr) Die("FakeDevice::Write outside an allocation");
  std::memcpy(view, src, bytes);
}

std::vector<uint8_t> FakeDevice::Read(const void* src, size_t bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  const uint8_t* view = ViewOfLocked(src, bytes);
  if (view == nullptr) Die("FakeDevice::Read outside an allocation");
  return std::vector<uint8_t>(view, view + bytes);
}

void FakeDevice::CorruptNextCopy() {
  std::lock_guard<std::mutex> lock(mu_);
  corrupt_next_copy_ = true;
}

void FakeDevice::Arm(Hold& hold) {
  std::lock_guard<std::mutex> lock(mu_);
  hold = Hold::kArmed;
}

void FakeDevice::AwaitHolding(const Hold& hold) {
  std::unique_lock<std::mutex> lock(mu_);
  hold_changed_.wait(lock, [&] { return hold == Hold::kHolding; });
}

void FakeDevice::Release(Hold& hold) {
  std::lock_guard<std::mutex> lock(mu_);
  hold = Hold::kReleased;
  hold_changed_.notify_all();
}

void FakeDevice::HoldHere(Hold& hold, std::unique_lock<std::mutex>& lock) {
  hold = Hold::kHolding;
  hold_changed_.notify_all();
  hold_changed_.wait(lock, [&] { return hold == Hold::kReleased; });
  hold = Hold::kNone;
}

void FakeDevice::HoldNextCopies() { Arm(hold_); }
void FakeDevice::WaitUntilHeld() { AwaitHolding(hold_); }
void FakeDevice::ReleaseHeldWait() { Release(hold_); }
void FakeDevice::HoldNextRenewal() { Arm(renewal_hold_); }
void FakeDevice::WaitUntilRenewalHeld() { AwaitHolding(renewal_hold_); }
void FakeDevice::ReleaseHeldRenewal() { Release(renewal_hold_); }

void FakeDevice::MaybeHoldRenewal() {
  std::unique_lock<std::mutex> lock(mu_);
  if (renewal_hold_ == Hold::kArmed) HoldHere(renewal_hold_, lock);
}

void FakeDevice::FailImports(Status why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (why.ok()) {
    fail_imports_.reset();
  } else {
    fail_imports_ = std::move(why);
  }
}

void FakeDevice::FailNextWait(Status why) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_next_wait_ = std::move(why);
}

FakeDevice::Counters FakeDevice::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

std::vector<const void*> FakeDevice::host_sides() const {
  std::lock_guard<std::mutex> lock(mu_);
  return host_sides_;
}

Result<std::string> FakeDevice::DeviceUuid(int device) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!KnownLocked(device)) return Status::InvalidArgument("FakeDevice: no such device");
  }
  std::string uuid = "fake-gpu-" + std::to_string(device);
  uuid.resize(16, '\0');
  return uuid;
}

void FakeDevice::SetStreamDevice(void* stream, int device) {
  std::lock_guard<std::mutex> lock(mu_);
  stream_devices_[stream] = device;
}

Result<int> FakeDevice::StreamDevice(void* stream) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = stream_devices_.find(stream);
  return it == stream_devices_.end() ? -1 : it->second;
}

Result<int> FakeDevice::DeviceOf(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Allocation* a = FindLocked(ptr, 1);
  if (a == nullptr) return Status::InvalidArgument("host memory passed as a device buffer");
  return a->gpu;
}

Status FakeDevice::CopyAsync(void* dst, const void* src, size_t bytes,
                             kernels::CopyDirection direction, void* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (direction == kernels::CopyDirection::kDeviceToDevice) {
    const Allocation* to = FindLocked(dst, bytes);
    const Allocation* from = FindLocked(src, bytes);
    if (to == nullptr || from == nullptr) {
      return Status::InvalidArgument("FakeDevice: a device side outside device memory");
    }
    KVPOOL_RETURN_IF_ERROR(ReachableLocked(dst, bytes));
    KVPOOL_RETURN_IF_ERROR(ReachableLocked(src, bytes));
    queued_[stream].push_back({ViewOfLocked(dst, bytes), ViewOfLocked(src, bytes), bytes});
    ++counters_.device_copies;
    counters_.device_bytes += bytes;
    if (to->gpu != from->gpu) ++counters_.peer_copies;
    return Status::OK();
  }
  const bool to_device = direction == kernels::CopyDirection::kHostToDevice;
  const void* device_side = to_device ? dst : src;
  const void* host_side = to_device ? src : dst;
  uint8_t* view = ViewOfLocked(device_side, bytes);
  if (view == nullptr) return Status::InvalidArgument("FakeDevice: device side outside memory");
  KVPOOL_RETURN_IF_ERROR(ReachableLocked(device_side, bytes));
  if (ViewOfLocked(host_side, 1) != nullptr) {
    return Status::InvalidArgument("FakeDevice: host side is device memory");
  }
  host_sides_.push_back(host_side);
  if (to_device) {
    queued_[stream].push_back({view, static_cast<const uint8_t*>(src), bytes});
    ++counters_.to_device_copies;
    counters_.to_device_bytes += bytes;
  } else {
    queued_[stream].push_back({static_cast<uint8_t*>(dst), view, bytes});
    ++counters_.to_host_copies;
    counters_.to_host_bytes += bytes;
  }
  return Status::OK();
}

Status FakeDevice::Wait(void* stream) {
  std::unique_lock<std::mutex> lock(mu_);
  ++counters_.waits;
  std::vector<Copy> copies = std::move(queued_[stream]);
  queued_.erase(stream);
  if (hold_ == Hold::kArmed && !copies.empty()) HoldHere(hold_, lock);
  if (fail_next_wait_) {
    Status why = std::move(*fail_next_wait_);
    fail_next_wait_.reset();
    return why;
  }
  for (const Copy& c : copies) {
    std::memcpy(c.dst, c.src, c.bytes);
    if (corrupt_next_copy_ && c.bytes > 0) {
      c.dst[0] ^= 0xFF;
      corrupt_next_copy_ = false;
    }
  }
  return Status::OK();
}

void FakeDevice::FailNextRenewals(int n) {
  std::lock_guard<std::mutex> lock(mu_);
  failing_renewals_ = n;
}

bool FakeDevice::TakeRenewalFailure() {
  std::lock_guard<std::mutex> lock(mu_);
  if (failing_renewals_ == 0) return false;
  --failing_renewals_;
  return true;
}

// A mark names its stream; waiting for it runs what that stream has queued (all of it: copies
// queued after the mark run too, which a real device may also have done by then).
Result<void*> FakeDevice::Mark(void* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.marks;
  return static_cast<void*>(new void*(stream));
}

Status FakeDevice::WaitMarked(void* mark) {
  void** stream = static_cast<void**>(mark);
  const Status st = Wait(*stream);
  delete stream;
  return st;
}

Result<std::vector<uint64_t>> FakeDevice::DeviceChecksums(const kernels::ByteRange* ranges,
                                                          size_t n, void* stream) {
  KVPOOL_RETURN_IF_ERROR(Wait(stream));
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<uint64_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* view = ViewOfLocked(ranges[i].data, ranges[i].size);
    if (view == nullptr) {
      return Status::InvalidArgument("FakeDevice: device checksum outside an allocation");
    }
    KVPOOL_RETURN_IF_ERROR(ReachableLocked(ranges[i].data, ranges[i].size));
    out[i] = kernels::DeviceChecksumCpu(view, ranges[i].size);
    ++counters_.checksums;
  }
  return out;
}

}  // namespace kvpool::testing
