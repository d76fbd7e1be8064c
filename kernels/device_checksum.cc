#include "kernels/device_checksum.h"

#include "kernels/xxh64_inline.h"

namespace kvpool::kernels {

uint64_t DeviceChecksumCpu(const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  const size_t chunks = (size + kDeviceChecksumChunkBytes - 1) / kDeviceChecksumChunkBytes;
  std::vector<uint64_t> c(chunks);
  for (size_t i = 0; i < chunks; ++i) {
    const size_t off = i * kDeviceChecksumChunkBytes;
    const size_t n =
        size - off < kDeviceChecksumChunkBytes ? size - off : kDeviceChecksumChunkBytes;
    c[i] = xxh64::Hash(p + off, n, 0);
  }
  return xxh64::Hash(reinterpret_cast<const uint8_t*>(c.data()), chunks * sizeof(uint64_t),
                     static_cast<uint64_t>(size));
}

}  // namespace kvpool::kernels
