// libFuzzer target: request frames straight into BlockService's handlers, as the control server
// hands them over, on one connection per input, with the checks the server makes at the header
// (transport/control_server.cc) done here the same way.
//
// Input: one byte of flags, then frames.
//   flags: bit 0 the connection is local (Unix socket), bit 1 the harness says hello first (for
//          namespace "fuzz"; so mutations of the rest reach every handler behind a hello),
//          bit 2 that hello asks for shared memory, bit 3 for admin rights, bit 4 it is a peer
//          daemon's (client name "kvpool-peer"). A TCP connection's harness hello answers the
//          daemon's challenge with a proof of the cluster secret, as a remote worker or peer does.
//   frame: u8 type, u16 body bytes, u32 payload bytes (little endian), the body, the payload.
// A frame the server would refuse at its header (a payload on a type that carries none, sizes
// over the limits, anything but a small hello before admission) ends the connection, as there.
// A payload cut short by the end of the input is a client dying mid-transfer.
//
// Checks beyond the sanitizers': every response names the request's type and its body parses as
// a protobuf with a Status (field 1); response payloads are readable (every byte is read).

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "common/hello_auth.h"
#include "control.pb.h"
#include "fuzz/fuzz_world.h"
#include "transport/control_server.h"
#include "transport/frame.h"

namespace kvpool::fuzz {
namespace {

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  size_t left() const { return end_ - p_; }
  bool Take(size_t n, std::string_view* out) {
    if (left() < n) return false;
    *out = std::string_view(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return true;
  }
  bool Int(size_t n, uint64_t* v) {
    std::string_view b;
    if (!Take(n, &b)) return false;
    *v = 0;
    for (size_t i = 0; i < n; ++i) *v |= uint64_t(uint8_t(b[i])) << (8 * i);
    return true;
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

// Reads what a response hands back, so the sanitizers see every byte it points at.
void Consume(transport::Response& r, uint16_t type) {
  if (r.type != type) __builtin_trap();  // a response must answer the request's type
  // Every response's field 1 is its Status (control.proto): a message with only that field
  // parses any of them, and fails on a body that is not a protobuf.
  wire::SessionSaveResponse status_only;
  if (!r.no_reply && !status_only.ParseFromString(r.body)) __builtin_trap();
  uint8_t sum = 0;
  for (const auto& [data, n] : r.payload) {
    for (size_t i = 0; i < n; ++i) sum ^= data[i];
  }
  asm volatile("" : : "r"(sum));
  if (r.release) r.release();
  for (int fd : r.fds) ::close(fd);
}

// The header the server would have decoded for this frame (request ids count up).
transport::FrameHeader HeaderOf(uint16_t type, size_t body_bytes, uint32_t payload_bytes) {
  static uint64_t request_id = 0;
  transport::FrameHeader h;
  h.type = type;
  h.request_id = ++request_id;
  h.body_bytes = static_cast<uint32_t>(body_bytes);
  h.payload_bytes = payload_bytes;
  return h;
}

}  // namespace
}  // namespace kvpool::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvpool;
  using namespace kvpool::fuzz;
  FuzzWorld& world = FuzzWorld::Get();
  daemon::BlockService& service = world.service();
  const transport::FrameLimits& limits = world.options().limits;
  Reader in(data, size);
  uint64_t flags = 0;
  if (!in.Int(1, &flags)) return 0;

  static uint64_t connection_id = 0;
  transport::ConnectionInfo info;
  info.id = ++connection_id;
  info.local = flags & 1;
  info.peer = info.local ? "unix" : "tcp:127.0.0.1:1";
  std::unique_ptr<transport::ConnectionState> state = service.OnConnect(info);

  if (flags & 2) {
    wire::HelloRequest hello;
    hello.set_protocol_version(transport::kProtocolVersion);
    hello.set_namespace_name("fuzz");
    hello.set_client_name(flags & 16 ? "kvpool-peer" : "fuzz_handlers");
    hello.set_shared_memory(flags & 4);
    hello.set_admin(flags & 8);
    std::string body = hello.SerializeAsString();
    transport::Response r = service.Handle(*state, HeaderOf(wire::HELLO, body.size(), 0), body);
    wire::HelloResponse answer;
    const bool challenged = answer.ParseFromString(r.body) && !answer.challenge().empty();
    Consume(r, wire::HELLO);
    if (challenged) {
      hello.set_auth(HelloProof(kFuzzClusterSecret, answer.challenge(), hello.namespace_name()));
      body = hello.SerializeAsString();
      r = service.Handle(*state, HeaderOf(wire::HELLO, body.size(), 0), body);
      Consume(r, wire::HELLO);
    }
  }

  for (;;) {
    uint64_t type = 0, body_bytes = 0, payload_bytes = 0;
    std::string_view body;
    if (!in.Int(1, &type) || !in.Int(2, &body_bytes) || !in.Int(4, &payload_bytes) ||
        !in.Take(body_bytes, &body)) {
      break;
    }
    // The server's header checks (frame.cc, control_server.cc): refused frames close.
    if (!transport::IsKnownMessageType(type) || payload_bytes > limits.max_payload_bytes ||
        (payload_bytes > 0 && !transport::MayCarryPayload(type, /*response=*/false))) {
      break;
    }
    if (!service.Admitted(*state) &&
        (body_bytes > transport::ControlServerOptions().max_hello_body_bytes ||
         payload_bytes > 0)) {
      break;
    }

    const transport::FrameHeader h = HeaderOf(type, body_bytes, payload_bytes);
    if (payload_bytes > 0) {
      std::vector<transport::PayloadSink> sinks;
      Status st = service.PayloadSinks(*state, h, body, &sinks);
      uint64_t total = 0;
      for (const auto& s : sinks) total += s.size;
      if (!st.ok() || total != payload_bytes) break;
      bool cut = false;
      for (const auto& s : sinks) {
        std::string_view bytes;
        if (!in.Take(s.size, &bytes)) {
          cut = true;  // the client died mid-payload
          break;
        }
        if (s.data != nullptr) std::memcpy(s.data, bytes.data(), bytes.size());
      }
      if (cut) break;
    }
    transport::Response r = service.Handle(*state, h, body);
    const bool close = r.close_after;
    Consume(r, type);
    if (close) break;
  }
  service.OnDisconnect(*state);
  return 0;
}
