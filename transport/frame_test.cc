// Frame header encoding and validation: every malformed, oversized or hostile header is
// rejected with InvalidArgument, every valid one round-trips exactly.

#include "transport/frame.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "control.pb.h"

namespace kvpool::transport {
namespace {

using Bytes = std::array<uint8_t, kFrameHeaderBytes>;

// The message types of transport/control.proto, read from the schema's descriptor (not through
// the code under test), so the test follows the protocol as types are added.
const std::set<uint16_t>& KnownTypes() {
  static const std::set<uint16_t> kTypes = [] {
    std::set<uint16_t> types;
    const auto* d = wire::MessageType_descriptor();
    for (int i = 0; i < d->value_count(); ++i) {
      if (d->value(i)->number() != 0) types.insert(static_cast<uint16_t>(d->value(i)->number()));
    }
    return types;
  }();
  return kTypes;
}

// Type numbers the schema does not define.
std::vector<uint16_t> UnknownTypes() {
  const uint16_t max = *KnownTypes().rbegin();
  std::vector<uint16_t> out = {0, static_cast<uint16_t>(max + 1), static_cast<uint16_t>(max + 2)};
  for (uint16_t t : {100, 0x100, 0x8000, 0xffff}) {
    if (!KnownTypes().count(t)) out.push_back(t);
  }
  return out;
}

Bytes Encode(const FrameHeader& h) {
  Bytes b{};
  EncodeFrameHeader(h, b.data());
  return b;
}

FrameHeader Valid(uint16_t type = wire::LOOKUP) {
  FrameHeader h;
  h.type = type;
  h.request_id = 0x0102030405060708ull;
  h.body_bytes = 1234;
  return h;
}

void ExpectRejected(const Bytes& b, const FrameLimits& limits, const std::string& what) {
  Result<FrameHeader> r = DecodeFrameHeader(b.data(), limits);
  ASSERT_FALSE(r.ok()) << what;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << what;
  EXPECT_NE(r.status().message().find(what), std::string::npos)
      << "message '" << r.status().message() << "' does not mention '" << what << "'";
}

TEST(FrameTest, EncodesTheDocumentedLittleEndianLayout) {
  FrameHeader h;
  h.version = kProtocolVersion;
  h.flags = kFlagResponse;
  h.type = 0x0203;
  h.request_id = 0x1122334455667788ull;
  h.body_bytes = 0xAABBCCDD;
  h.payload_bytes = 0x01020304;
  const Bytes b = Encode(h);
  const Bytes want = {'K',           'V',  'P',  '1',  kProtocolVersion,
                      kFlagResponse, 0x03, 0x02, 0x88, 0x77,
                      0x66,          0x55, 0x44, 0x33, 0x22,
                      0x11,          0xDD, 0xCC, 0xBB, 0xAA,
                      0x04,          0x03, 0x02, 0x01};
  EXPECT_EQ(b, want);
}

TEST(FrameTest, RoundTripsEveryKnownTypeInBothDirections) {
  std::mt19937_64 rng(1);
  for (uint16_t type : KnownTypes()) {
    for (bool response : {false, true}) {
      FrameHeader h;
      h.type = type;
      h.flags = response ? kFlagResponse : 0;
      h.request_id = rng();
      h.body_bytes = static_cast<uint32_t>(rng() % (16u << 20));
      const bool payload =
          (response && type == wire::GET) || (!response && type == wire::PUT_COMMIT);
      h.payload_bytes = payload ? static_cast<uint32_t>(rng() % (256u << 20)) + 1 : 0;
      const Bytes b = Encode(h);
      Result<FrameHeader> r = DecodeFrameHeader(b.data(), FrameLimits());
      ASSERT_TRUE(r.ok()) << type << " " << response << ": " << r.status().ToString();
      EXPECT_EQ(r->version, kProtocolVersion);
      EXPECT_EQ(r->flags, h.flags);
      EXPECT_EQ(r->is_response(), response);
      EXPECT_EQ(r->type, type);
      EXPECT_EQ(r->request_id, h.request_id);
      EXPECT_EQ(r->body_bytes, h.body_bytes);
      EXPECT_EQ(r->payload_bytes, h.payload_bytes);
    }
  }
}

TEST(FrameTest, AcceptsValuesExactlyAtTheLimits) {
  FrameLimits limits;
  limits.max_body_bytes = 1000;
  limits.max_payload_bytes = 5000;
  FrameHeader h = Valid(wire::PUT_COMMIT);
  h.body_bytes = 1000;
  h.payload_bytes = 5000;
  h.request_id = UINT64_MAX;
  Result<FrameHeader> r = DecodeFrameHeader(Encode(h).data(), limits);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->request_id, UINT64_MAX);
  h.body_bytes = 0;
  h.payload_bytes = 0;
  EXPECT_TRUE(DecodeFrameHeader(Encode(h).data(), limits).ok());
}

TEST(FrameTest, RejectsBadMagic) {
  Bytes b = Encode(Valid());
  for (int i = 0; i < 4; ++i) {
    Bytes c = b;
    c[i] ^= 0x20;
    ExpectRejected(c, FrameLimits(), "magic");
  }
  // Byte-swapped magic (a big-endian writer).
  Bytes c = b;
  std::swap(c[0], c[3]);
  std::swap(c[1], c[2]);
  ExpectRejected(c, FrameLimits(), "magic");
  // HTTP or TLS spoken to the control socket.
  Bytes http{};
  std::memcpy(http.data(), "GET / HTTP/1.1\r\nHost: x\r\n", kFrameHeaderBytes);
  ExpectRejected(http, FrameLimits(), "magic");
}

TEST(FrameTest, RejectsWrongVersion) {
  for (uint8_t v : {0, 2, 3, 0x7f, 0xff}) {
    FrameHeader h = Valid();
    h.version = v;
    ExpectRejected(Encode(h), FrameLimits(), "version");
  }
}

TEST(FrameTest, RejectsUnknownFlags) {
  for (int bit = 1; bit < 8; ++bit) {
    FrameHeader h = Valid();
    h.flags = static_cast<uint8_t>(1u << bit);
    ExpectRejected(Encode(h), FrameLimits(), "flags");
    h.flags |= kFlagResponse;
    ExpectRejected(Encode(h), FrameLimits(), "flags");
  }
}

TEST(FrameTest, RejectsUnknownTypes) {
  ASSERT_GE(KnownTypes().size(), 13u);
  for (uint16_t type : UnknownTypes()) {
    EXPECT_FALSE(IsKnownMessageType(type)) << type;
    ExpectRejected(Encode(Valid(type)), FrameLimits(), "message type");
  }
  for (uint16_t type : KnownTypes()) EXPECT_TRUE(IsKnownMessageType(type)) << type;
}

TEST(FrameTest, RejectsBodyOverTheLimit) {
  FrameLimits limits;
  limits.max_body_bytes = 1000;
  FrameHeader h = Valid();
  h.body_bytes = 1001;
  ExpectRejected(Encode(h), limits, "body");
  h.body_bytes = UINT32_MAX;
  ExpectRejected(Encode(h), FrameLimits(), "body");
  h.body_bytes = (16u << 20) + 1;  // default limit: 16 MiB
  ExpectRejected(Encode(h), FrameLimits(), "body");
}

TEST(FrameTest, RejectsPayloadOverTheLimit) {
  FrameLimits limits;
  limits.max_payload_bytes = 5000;
  FrameHeader h = Valid(wire::PUT_COMMIT);
  h.payload_bytes = 5001;
  ExpectRejected(Encode(h), limits, "payload");
  h.payload_bytes = UINT32_MAX;
  ExpectRejected(Encode(h), FrameLimits(), "payload");
  h.payload_bytes = (256u << 20) + 1;  // default limit: 256 MiB
  ExpectRejected(Encode(h), FrameLimits(), "payload");
}

TEST(FrameTest, RejectsPayloadOnTypesThatMayNotCarryOne) {
  for (uint16_t type : KnownTypes()) {
    for (bool response : {false, true}) {
      const bool allowed =
          (response && type == wire::GET) || (!response && type == wire::PUT_COMMIT);
      EXPECT_EQ(MayCarryPayload(type, response), allowed) << type << " " << response;
      FrameHeader h = Valid(type);
      h.flags = response ? kFlagResponse : 0;
      h.payload_bytes = 1;
      if (allowed) {
        EXPECT_TRUE(DecodeFrameHeader(Encode(h).data(), FrameLimits()).ok()) << type;
      } else {
        ExpectRejected(Encode(h), FrameLimits(), "may not carry a payload");
      }
    }
  }
}

TEST(FrameTest, RejectsTruncatedHeadersPaddedWithZeros) {
  // A reader that got only the first n bytes of a valid header and zero-filled the rest (or a
  // peer that sent zeros) must not see a valid frame. (From byte 7 on the zeros could be a
  // valid header: the type's high byte and the rest may legitimately be zero.)
  const Bytes full = Encode(Valid());
  for (size_t n = 0; n < 7; ++n) {
    Bytes b{};
    std::memcpy(b.data(), full.data(), n);
    EXPECT_FALSE(DecodeFrameHeader(b.data(), FrameLimits()).ok()) << n;
  }
}

// What the header should decode to, judged independently of the code under test.
bool ShouldAccept(const Bytes& b, const FrameLimits& limits) {
  const uint32_t magic = b[0] | b[1] << 8 | b[2] << 16 | static_cast<uint32_t>(b[3]) << 24;
  if (magic != kFrameMagic || b[4] != 1 || (b[5] & ~1u) != 0) return false;
  const uint16_t type = static_cast<uint16_t>(b[6] | b[7] << 8);
  if (!KnownTypes().count(type)) return false;
  const uint32_t body = b[16] | b[17] << 8 | b[18] << 16 | static_cast<uint32_t>(b[19]) << 24;
  const uint32_t payload = b[20] | b[21] << 8 | b[22] << 16 | static_cast<uint32_t>(b[23]) << 24;
  if (body > limits.max_body_bytes || payload > limits.max_payload_bytes) return false;
  const bool response = b[5] & 1;
  if (payload > 0 && !((response && type == 3) || (!response && type == 5))) return false;
  return true;
}

TEST(FrameTest, RandomGarbageNeverCrashesAndIsRejectedUnlessValid) {
  FrameLimits limits;
  limits.max_body_bytes = 1u << 20;
  limits.max_payload_bytes = 1u << 24;
  int accepted = 0;
  int rejected = 0;
  for (uint64_t seed = 0; seed < 2000; ++seed) {
    std::mt19937_64 rng(seed);
    for (int round = 0; round < 50; ++round) {
      Bytes b;
      for (auto& x : b) x = static_cast<uint8_t>(rng());
      const int mode = round % 3;
      if (mode >= 1) {
        // Keep the magic so the later checks are reached.
        const Bytes good = Encode(Valid());
        std::memcpy(b.data(), good.data(), 4);
      }
      if (mode == 2) {
        // Mostly plausible: valid version and small fields, then flip one random byte.
        b[4] = kProtocolVersion;
        b[5] &= 1;
        b[6] = static_cast<uint8_t>(rng() % (*KnownTypes().rbegin() + 2));
        b[7] = 0;
        b[18] = b[19] = 0;
        b[22] = b[23] = 0;
        if (rng() % 2) b[20] = b[21] = 0;
        if (rng() % 2) b[rng() % kFrameHeaderBytes] ^= static_cast<uint8_t>(1u << (rng() % 8));
      }
      Result<FrameHeader> r = DecodeFrameHeader(b.data(), limits);
      const bool want = ShouldAccept(b, limits);
      ASSERT_EQ(r.ok(), want) << "seed " << seed << " round " << round << ": "
                              << (r.ok() ? std::string("accepted") : r.status().ToString());
      if (r.ok()) {
        ++accepted;
        // An accepted header re-encodes to the same bytes.
        EXPECT_EQ(Encode(*r), b);
      } else {
        ++rejected;
        EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
      }
    }
  }
  // The generator reaches both outcomes, so the comparison above means something.
  EXPECT_GT(accepted, 1000);
  EXPECT_GT(rejected, 1000);
}

}  // namespace
}  // namespace kvpool::transport
