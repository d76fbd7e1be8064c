#pragma once
// Control-plane framing.
//
// A frame is a fixed 24-byte header, a protobuf body (transport/control.proto) and an optional
// raw payload of block bytes:
//
//   offset size field
//   0      4    magic        0x3150564B ("KVP1" in memory order), rejects garbage at once
//   4      1    version      kProtocolVersion
//   5      1    flags        bit 0: response
//   6      2    type         wire::MessageType
//   8      8    request_id   echoed in the response
//   16     4    body_bytes   protobuf body length
//   20     4    payload_bytes raw block bytes after the body
//
// All integers little endian. A header that fails validation (bad magic, version, type, or a
// length beyond the configured limits) is a protocol error: the receiver closes that
// connection with a logged reason and nothing else is affected.
//
// Thread safety: pure functions and plain values.

#include <array>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace kvpool::transport {

inline constexpr uint32_t kFrameMagic = 0x3150564B;
inline constexpr uint8_t kProtocolVersion = 1;
inline constexpr size_t kFrameHeaderBytes = 24;
// No daemon stores a block larger than one host segment, and a segment is at most this: a size
// above it from a daemon (or a peer) is a lie, refused before anything is allocated for it.
inline constexpr uint64_t kLargestBlockBytes = 1ull << 30;
inline constexpr uint8_t kFlagResponse = 0x1;

struct FrameHeader {
  uint8_t version = kProtocolVersion;
  uint8_t flags = 0;
  uint16_t type = 0;
  uint64_t request_id = 0;
  uint32_t body_bytes = 0;
  uint32_t payload_bytes = 0;

  bool is_response() const { return flags & kFlagResponse; }
};

struct FrameLimits {
  // Largest protobuf body accepted. Default: 16 MiB (a 1000-key request is ~40 KiB).
  uint32_t max_body_bytes = 16u << 20;
  // Largest payload accepted in one frame. Default: 256 MiB; clients split larger batches.
  uint32_t max_payload_bytes = 256u << 20;
};

void EncodeFrameHeader(const FrameHeader& header, uint8_t out[kFrameHeaderBytes]);

// Decodes and validates a header: InvalidArgument names what is wrong (bad magic, unsupported
// version, unknown flags, unknown message type, body or payload over the limit).
Result<FrameHeader> DecodeFrameHeader(const uint8_t in[kFrameHeaderBytes],
                                      const FrameLimits& limits);

// True for message types this build knows (wire::MessageType values other than unspecified).
bool IsKnownMessageType(uint16_t type);
// True for the types whose frames may carry a payload in the given direction.
bool MayCarryPayload(uint16_t type, bool response);

}  // namespace kvpool::transport
