#include "client/device_buffers.h"

#include <algorithm>

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

MutableBuffer GetStaging::HostTarget(size_t index, const MutableBuffer& caller) {
  if (caller.memory != Memory::kCuda) return caller;
  std::vector<uint8_t>& buf = staged_[index];
  buf.resize(caller.capacity);
  return {buf.data(), buf.size()};
}

uint8_t* GetStaging::Staged(size_t index) {
  auto it = staged_.find(index);
  return it == staged_.end() ? nullptr : it->second.data();
}

void GetStaging::Finish(std::span<const MutableBuffer> buffers, std::span<GetResult> results) {
  std::vector<size_t> copied;
  for (auto& [index, bytes] : staged_) {
    GetResult& r = results[index];
    if (!r.status.ok()) continue;
    const Status st = engine_->CopyAsync(buffers[index].data, bytes.data(), r.size,
                                         kernels::CopyDirection::kHostToDevice, stream_);
    if (!st.ok()) {
      r.status = st;
      continue;
    }
    copied.push_back(index);
  }
  if (copied.empty()) return;
  const Status done = engine_->Wait(stream_);
  if (done.ok()) return;
  for (size_t index : copied) results[index].status = done.WithContext("copying to the device");
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
