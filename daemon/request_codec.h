#pragma once
// Request decoding and answer encoding shared by the request handlers (daemon/block_handlers.h,
// session_handlers.h, admin_handlers.h): parse a body, decode and bound its keys, and build a
// Response whose body is the answer with its Status. A malformed body is InvalidArgument; the
// handler answers it and the connection stays usable.
//
// Thread safety: free functions without state.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <kvpool/block_key.h>
#include <kvpool/tier.h>

#include "common/status.h"
#include "control.pb.h"
#include "transport/control_server.h"

namespace kvpool::daemon {

void SetStatus(wire::Status* out, const Status& st);

// The answer of type `type`: `msg` with `st` as its status, serialized.
template <typename Message>
transport::Response Reply(uint16_t type, Message& msg, const Status& st) {
  SetStatus(msg.mutable_status(), st);
  transport::Response r;
  r.type = type;
  msg.SerializeToString(&r.body);
  return r;
}

// InvalidArgument ("malformed WHAT request body") when `body` is not a `Message`.
template <typename Message>
Status Parse(std::string_view body, Message* msg, const char* what) {
  if (!msg->ParseFromArray(body.data(), static_cast<int>(body.size()))) {
    // Protobuf refuses a text field that is not UTF-8 the same way (a session id, say).
    return Status::InvalidArgument(std::string("malformed ") + what +
                                   " request body (or a text field in it that is not UTF-8)");
  }
  return Status::OK();
}

// Keys sent one by one. InvalidArgument for more than `max`, or for a key that is not 32 bytes.
Status DecodeKeys(const google::protobuf::RepeatedPtrField<std::string>& in, uint32_t max,
                  std::vector<BlockKey>* out);

// Keys sent as one packed string (32 bytes each) or as repeated fields, not both.
Status DecodeKeysOf(const google::protobuf::RepeatedPtrField<std::string>& keys,
                    const std::string& packed, uint32_t max, std::vector<BlockKey>* out);

wire::Tier ToWire(Tier tier);

// Sends libprotobuf's own log lines (e.g. "String field ... contains invalid UTF-8" for every
// such body a client sends) to VLOG(1) instead of stderr at ERROR: the client already gets
// InvalidArgument, and a hostile one must not be able to flood the daemon's log. Fatal ones stay
// fatal. Call once at start.
void QuietProtobufLogs();

}  // namespace kvpool::daemon
