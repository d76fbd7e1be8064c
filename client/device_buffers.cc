#include "client/device_buffers.h"

#include <algorithm>
#include <new>

#include "kernels/pinned_memory.h"

namespace kvpool::client {

Result<int> CheckDeviceRange(const kernels::DeviceCopyEngine& engine, const void* data,
                             size_t bytes, const std::string& what) {
  if (data == nullptr || bytes == 0) return -1;  // the empty/too-small checks say why
  Result<int> first = engine.DeviceOf(data);
  if (!first.ok()) return Status::InvalidArgument(what + ": " + first.status().message());
  Result<int> last = engine.DeviceOf(static_cast<const uint8_t*>(data) + bytes - 1);
  if (!last.ok() || *last != *first) {
    return Status::InvalidArgument(what + ": its " + std::to_string(bytes) +
                                   " bytes do not lie in one device allocation");
  }
  return *first;
}

// Buffers start on 64 KiB boundaries: where the kernel's pages are 64 KiB (aarch64), two
// buffers never share a page, which CUDA could not pin twice.
constexpr std::align_val_t kStagingAlign{size_t{64} << 10};

std::shared_ptr<StagingPool::Buffer> StagingPool::Take(size_t bytes, int device) {
  size_t capacity = size_t{64} << 10;
  while (capacity < bytes) capacity <<= 1;
  Buffer* b = nullptr;
  std::vector<Buffer*> stale;
  {
    std::lock_guard<std::mutex> lock(mu_);
    TakeStaleLocked(std::chrono::steady_clock::now(), stale);
    auto it = free_.find(capacity);
    if (it != free_.end() && !it->second.empty()) {
      b = it->second.back();
      it->second.pop_back();
      kept_bytes_ -= capacity;
    }
  }
  for (Buffer* s : stale) Free(s);
  if (b == nullptr) {
    auto fresh = std::make_unique<Buffer>();
    fresh->capacity = capacity;
    fresh->data = static_cast<uint8_t*>(::operator new(capacity, kStagingAlign));
    fresh->pinned =
        kernels::CudaDeviceAvailable() &&
        kernels::RegisterHostMemory(fresh->data, capacity, /*read_only=*/false, device).ok();
    fresh->pinned_on = device;
    b = fresh.release();
  }
  std::shared_ptr<StagingPool> self = shared_from_this();
  return std::shared_ptr<Buffer>(b, [self](Buffer* given) { self->Give(given); });
}

size_t StagingPool::kept_bytes() {
  std::lock_guard<std::mutex> lock(mu_);
  return kept_bytes_;
}

void StagingPool::Give(Buffer* b) {
  std::vector<Buffer*> stale;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    TakeStaleLocked(now, stale);
    if (kept_bytes_ + b->capacity <= kKeepBytes) {
      b->given_at = now;
      free_[b->capacity].push_back(b);  // the most recent last: Take reuses it first
      kept_bytes_ += b->capacity;
      b = nullptr;
    }
  }
  for (Buffer* s : stale) Free(s);
  if (b != nullptr) Free(b);
}

void StagingPool::TakeStaleLocked(std::chrono::steady_clock::time_point now,
                                  std::vector<Buffer*>& stale) {
  for (auto& [capacity, list] : free_) {
    // Oldest first in each list.
    size_t n = 0;
    while (n < list.size() && now - list[n]->given_at > idle_) ++n;
    stale.insert(stale.end(), list.begin(), list.begin() + static_cast<ptrdiff_t>(n));
    list.erase(list.begin(), list.begin() + static_cast<ptrdiff_t>(n));
    kept_bytes_ -= n * capacity;
  }
}

void StagingPool::Free(Buffer* b) {
  if (b->pinned) kernels::UnregisterHostMemory(b->data, b->pinned_on);
  ::operator delete(b->data, kStagingAlign);
  delete b;
}

StagingPool::~StagingPool() {
  for (auto& [capacity, list] : free_) {
    for (Buffer* b : list) Free(b);
  }
}

MutableBuffer GetStaging::HostTarget(size_t index, const MutableBuffer& caller, uint64_t size) {
  if (caller.memory != Memory::kCuda) return caller;
  const size_t need = std::max<size_t>(1, std::min<uint64_t>(caller.capacity, size));
  std::shared_ptr<StagingPool::Buffer>& buf = staged_[index];
  if (buf == nullptr || buf->capacity < need) {
    if (pool_ != nullptr) {
      buf = pool_->Take(need, device_);
    } else {
      // Unpooled, unpinned: a buffer of its own, freed with the handle.
      auto* plain = new StagingPool::Buffer;
      plain->capacity = need;
      plain->data = new uint8_t[plain->capacity];
      buf = std::shared_ptr<StagingPool::Buffer>(plain, [](StagingPool::Buffer* b) {
        delete[] b->data;
        delete b;
      });
    }
  }
  return {buf->data, std::min(caller.capacity, buf->capacity)};
}

uint8_t* GetStaging::Staged(size_t index) {
  auto it = staged_.find(index);
  return it == staged_.end() ? nullptr : it->second->data;
}

GetStaging::Queued GetStaging::Finish(std::span<const MutableBuffer> buffers,
                                      std::span<GetResult> results) {
  Queued queued;
  for (auto& [index, buf] : staged_) {
    GetResult& r = results[index];
    if (!r.status.ok()) continue;
    const Status st = engine_->CopyAsync(buffers[index].data, buf->data, r.size,
                                         kernels::CopyDirection::kHostToDevice, stream_);
    if (!st.ok()) {
      r.status = st.WithContext("copying to the device");
      continue;
    }
    queued.indices.push_back(index);
    queued.buffers.push_back(buf);
  }
  return queued;
}

Result<std::vector<PutBlock>> StageToHost(kernels::DeviceCopyEngine& engine, void* stream,
                                          std::span<const PutBlock> blocks,
                                          std::vector<std::vector<uint8_t>>& storage) {
  std::vector<PutBlock> out(blocks.begin(), blocks.end());
  storage.clear();
  storage.reserve(blocks.size());
  bool any = false;
  for (PutBlock& b : out) {
    if (b.memory != Memory::kCuda || b.data == nullptr || b.size == 0) continue;
    std::vector<uint8_t>& host = storage.emplace_back(b.size);
    KVPOOL_RETURN_IF_ERROR(engine.CopyAsync(host.data(), b.data, b.size,
                                            kernels::CopyDirection::kDeviceToHost, stream));
    b.data = host.data();
    b.memory = Memory::kHost;
    any = true;
  }
  if (any) KVPOOL_RETURN_IF_ERROR(engine.Wait(stream).WithContext("copying from the device"));
  return out;
}

}  // namespace kvpool::client
