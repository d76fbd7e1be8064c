#pragma once
// Keys back to back, 32 bytes each: the packed_keys fields of the wire schema
// (transport/control.proto), as the client and the daemons' requests to one another send them.
// The daemon decodes them with DecodeKeysOf (daemon/request_codec.h).
//
// Thread safety: a free function without state.

#include <cstring>
#include <span>
#include <string>

#include <kvpool/block_key.h>

namespace kvpool {

inline void PackKeys(std::span<const BlockKey> keys, std::string* out) {
  out->resize(keys.size() * BlockKey::kSize);
  for (size_t i = 0; i < keys.size(); ++i) {
    std::memcpy(out->data() + i * BlockKey::kSize, keys[i].bytes.data(), BlockKey::kSize);
  }
}

}  // namespace kvpool
