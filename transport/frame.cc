#include "transport/frame.h"

#include <cstring>

#include "control.pb.h"

namespace kvpool::transport {
namespace {

void Put16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
void Put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void Put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint16_t Get16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }
uint32_t Get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = v << 8 | p[i];
  return v;
}
uint64_t Get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

}  // namespace

bool IsKnownMessageType(uint16_t type) {
  return type != wire::MESSAGE_TYPE_UNSPECIFIED && wire::MessageType_IsValid(type);
}

bool MayCarryPayload(uint16_t type, bool response) {
  return response ? type == wire::GET : type == wire::PUT_COMMIT;
}

void EncodeFrameHeader(const FrameHeader& h, uint8_t out[kFrameHeaderBytes]) {
  Put32(out, kFrameMagic);
  out[4] = h.version;
  out[5] = h.flags;
  Put16(out + 6, h.type);
  Put64(out + 8, h.request_id);
  Put32(out + 16, h.body_bytes);
  Put32(out + 20, h.payload_bytes);
}

Result<FrameHeader> DecodeFrameHeader(const uint8_t in[kFrameHeaderBytes],
                                      const FrameLimits& limits) {
  if (Get32(in) != kFrameMagic) {
    return Status::InvalidArgument("bad frame magic (not a kvpool client, or stream out of sync)");
  }
  FrameHeader h;
  h.version = in[4];
  h.flags = in[5];
  h.type = Get16(in + 6);
  h.request_id = Get64(in + 8);
  h.body_bytes = Get32(in + 16);
  h.payload_bytes = Get32(in + 20);
  if (h.version != kProtocolVersion) {
    return Status::InvalidArgument("unsupported protocol version " + std::to_string(h.version) +
                                   " (this build speaks " + std::to_string(kProtocolVersion) + ")");
  }
  if (h.flags & ~kFlagResponse) {
    return Status::InvalidArgument("unknown frame flags " + std::to_string(h.flags));
  }
  if (!IsKnownMessageType(h.type)) {
    return Status::InvalidArgument("unknown message type " + std::to_string(h.type));
  }
  if (h.body_bytes > limits.max_body_bytes) {
    return Status::InvalidArgument("frame body of " + std::to_string(h.body_bytes) +
                                   " bytes exceeds the limit of " +
                                   std::to_string(limits.max_body_bytes));
  }
  if (h.payload_bytes > limits.max_payload_bytes) {
    return Status::InvalidArgument("frame payload of " + std::to_string(h.payload_bytes) +
                                   " bytes exceeds the limit of " +
                                   std::to_string(limits.max_payload_bytes));
  }
  if (h.payload_bytes > 0 && !MayCarryPayload(h.type, h.is_response())) {
    return Status::InvalidArgument("message type " + std::to_string(h.type) +
                                   " may not carry a payload");
  }
  return h;
}

}  // namespace kvpool::transport
