#pragma once
// The client's side of device buffers (MutableBuffer / PutBlock with Memory::kCuda).
//
// On the same-node shared-memory path a block moves between the caller's device memory and its
// slot of the host arena by one copy on the caller's stream (client/client.cc does that). Every
// other way a block travels (socket frames, UCX, a block decoded here) lands in host memory
// first: GetStaging holds those bounce buffers and copies them to the device at the end of a
// get; StageToHost does the same for a put.
//
// Thread safety: none (one per call, like the Client).

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <kvpool/client.h>
#include <kvpool/kvpool.h>

#include "common/status.h"
#include "kernels/device_copy.h"

namespace kvpool::client {

// The device of [data, data + bytes): InvalidArgument naming `what` unless all of it is device
// memory of one device. -1 for an empty range (the empty/too-small checks say why).
Result<int> CheckDeviceRange(const kernels::DeviceCopyEngine& engine, const void* data,
                             size_t bytes, const std::string& what);

// Bounce buffers of one get, for device targets a path cannot fill directly.
class GetStaging {
 public:
  GetStaging(kernels::DeviceCopyEngine* engine, void* stream) : engine_(engine), stream_(stream) {}

  // Where block `index` lands in host memory: `caller` itself when it is host memory, else a
  // bounce buffer of its capacity (the too-small check then sees the caller's capacity).
  MutableBuffer HostTarget(size_t index, const MutableBuffer& caller);
  // The engine and stream of the call's device copies (nullptr engine: no device buffers).
  kernels::DeviceCopyEngine* engine() const { return engine_; }
  void* stream() const { return stream_; }
  // The bounce buffer of block `index`, or nullptr when it has none.
  uint8_t* Staged(size_t index);
  // Copies each staged block whose result is OK into its device buffer and waits; a failed copy
  // turns those results into errors.
  void Finish(std::span<const MutableBuffer> buffers, std::span<GetResult> results);

 private:
  kernels::DeviceCopyEngine* const engine_;
  void* const stream_;
  std::map<size_t, std::vector<uint8_t>> staged_;  // by block index
};

// Test hook (no GPU): `client`'s device buffers are copied by `engine` (e.g. the double in
// tests/support/fake_device.h) instead of the CUDA runtime's. Not owned; must outlive `client`.
void UseCopyEngineForTest(Client& client, kernels::DeviceCopyEngine* engine);
// The same for a C API client (include/kvpool/kvpool.h).
void UseCopyEngineForTest(kvpool_client* client, kernels::DeviceCopyEngine* engine);

// Host copies of the device blocks among `blocks` (copied and waited for), and `blocks` with
// those pointing at them; the copies live as long as `storage`.
Result<std::vector<PutBlock>> StageToHost(kernels::DeviceCopyEngine& engine, void* stream,
                                          std::span<const PutBlock> blocks,
                                          std::vector<std::vector<uint8_t>>& storage);

}  // namespace kvpool::client
