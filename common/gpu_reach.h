#pragma once
// GpuReach: the gpu tiers a reader copies from device to device, in the daemon's numbering of
// GPUs: the one on the reader's own GPU (`device`; -1: none there) and those on GPUs the reader
// reaches peer to peer (`peers`: bit d for device d, 0-63). The client builds one for a get
// (GetRequest.gpu_device and .peer_gpu_devices) and checks the slots it is given against it; the
// daemon's tier manager leases the gpu copies it reaches (TierManager::Acquire).
//
// Thread safety: a plain value.

#include <cstdint>

namespace kvpool {

struct GpuReach {
  int device = -1;
  uint64_t peers = 0;

  static constexpr int kMaxPeerDevice = 63;
  bool Reaches(int d) const {
    return d >= 0 && (d == device || (d <= kMaxPeerDevice && ((peers >> d) & 1) != 0));
  }
  // Whether any gpu tier is reached at all.
  bool Any() const { return device >= 0 || peers != 0; }
};

}  // namespace kvpool
