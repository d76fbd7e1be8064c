// kvpool-fuzz-seeds OUT_DIR: writes the seed corpora of fuzz_handlers and fuzz_frame (real
// requests of every type, as the client library sends them) under OUT_DIR/<target>/. The etcd
// and namespaces-file seeds are plain text files committed beside them.
//
// Each scenario is written twice: as fuzz_handlers input (flags byte, then u8 type, u16 body
// bytes, u32 payload bytes, body, payload) and as the byte stream fuzz_frame sends (a HELLO
// frame first, then 24-byte frame headers, bodies and payloads).

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <kvpool/block_key.h>

#include "common/checksum.h"
#include "control.pb.h"
#include "transport/frame.h"

namespace kvpool {
namespace {

struct Frame {
  uint16_t type;
  std::string body;
  std::string payload;
};

struct Scenario {
  std::string name;
  uint8_t flags;  // fuzz_handlers: bit 0 local, bit 1 hello by the harness, 2 shm, 3 admin,
                  // 4 a peer daemon's (fuzz/fuzz_handlers.cc)
  std::vector<Frame> frames;
};

std::string KeyBytes(uint64_t n) {
  BlockKey k;
  for (size_t i = 0; i < k.bytes.size(); ++i) k.bytes[i] = static_cast<uint8_t>(n * 31 + i);
  return std::string(k.AsStringView());
}

std::string BlockBytes(uint64_t n, size_t size) {
  std::string out(size, '\0');
  for (size_t i = 0; i < size; ++i) out[i] = static_cast<char>((n * 131 + i * 7) & 0xff);
  return out;
}

template <typename Message>
Frame F(wire::MessageType type, const Message& m, std::string payload = "") {
  return Frame{static_cast<uint16_t>(type), m.SerializeAsString(), std::move(payload)};
}

wire::HelloRequest Hello(bool shm, bool admin) {
  wire::HelloRequest h;
  h.set_protocol_version(transport::kProtocolVersion);
  h.set_namespace_name("fuzz");
  h.set_client_name("seed");
  h.set_shared_memory(shm);
  h.set_admin(admin);
  return h;
}

std::vector<Scenario> Scenarios() {
  constexpr size_t kBlock = 4096;
  std::vector<Scenario> out;

  // Put two blocks (in the frame), look them up, get them, release, prefetch, evict, stats.
  {
    Scenario s{"put_get", 0x2 | 0x8, {}};
    wire::PutReserveRequest reserve;
    std::string payload;
    for (uint64_t n = 1; n <= 2; ++n) {
      wire::PutItem* item = reserve.add_items();
      item->set_key(KeyBytes(n));
      item->set_size(kBlock);
      const std::string bytes = BlockBytes(n, kBlock);
      item->set_checksum(BlockChecksum(bytes.data(), bytes.size()));
      if (n > 1) item->set_parent(KeyBytes(n - 1));
      payload += bytes;
    }
    s.frames.push_back(F(wire::PUT_RESERVE, reserve));
    wire::PutCommitRequest commit;
    for (uint64_t id = 1; id <= 2; ++id) {
      commit.add_reservation_ids(id);
      commit.add_sizes(kBlock);
    }
    s.frames.push_back(F(wire::PUT_COMMIT, commit, payload));
    wire::LookupRequest lookup;
    lookup.add_keys(KeyBytes(1));
    lookup.add_keys(KeyBytes(2));
    s.frames.push_back(F(wire::LOOKUP, lookup));
    lookup.set_packed_keys(KeyBytes(1) + KeyBytes(2));
    lookup.clear_keys();
    lookup.set_each_key(true);
    s.frames.push_back(F(wire::LOOKUP, lookup));
    wire::GetRequest get;
    get.add_keys(KeyBytes(1));
    get.add_keys(KeyBytes(2));
    s.frames.push_back(F(wire::GET, get));
    wire::ReleaseRequest release;
    release.add_lease_ids(1);
    s.frames.push_back(F(wire::RELEASE, release));
    wire::PrefetchRequest prefetch;
    prefetch.add_keys(KeyBytes(2));
    s.frames.push_back(F(wire::PREFETCH, prefetch));
    wire::EvictRequest evict;
    evict.set_tier(wire::TIER_HOST);
    evict.add_keys(KeyBytes(1));
    s.frames.push_back(F(wire::EVICT, evict));
    s.frames.push_back(F(wire::STATS, wire::StatsRequest()));
    out.push_back(std::move(s));
  }

  // A session over a chain: save, load, list, delete, load again.
  {
    Scenario s{"sessions", 0x2, {}};
    wire::SessionSaveRequest save;
    wire::SessionRecord* r = save.mutable_record();
    r->set_session_id("conversation-1");
    r->add_keys(KeyBytes(1));
    r->add_keys(KeyBytes(2));
    r->set_token_count(32);
    (*r->mutable_metadata())["model"] = "seed";
    s.frames.push_back(F(wire::SESSION_SAVE, save));
    wire::SessionLoadRequest load;
    load.set_session_id("conversation-1");
    s.frames.push_back(F(wire::SESSION_LOAD, load));
    wire::SessionListRequest list;
    list.set_prefix("conv");
    list.set_limit(10);
    s.frames.push_back(F(wire::SESSION_LIST, list));
    wire::SessionDeleteRequest del;
    del.set_session_id("conversation-1");
    s.frames.push_back(F(wire::SESSION_DELETE, del));
    load.set_include_deleted(true);
    s.frames.push_back(F(wire::SESSION_LOAD, load));
    out.push_back(std::move(s));
  }

  // Same-node shared memory: map segments, put in place, get in place, release.
  {
    Scenario s{"shared_memory", 0x1 | 0x2 | 0x4, {}};
    wire::MapSegmentsRequest map;
    wire::SegmentRequest* seg = map.add_segments();
    seg->set_segment(0);
    seg->set_generation(1);
    s.frames.push_back(F(wire::MAP_SEGMENTS, map));
    wire::PutReserveRequest reserve;
    reserve.set_in_place(true);
    wire::PutItem* item = reserve.add_items();
    item->set_key(KeyBytes(3));
    item->set_size(kBlock);
    const std::string bytes = BlockBytes(3, kBlock);
    item->set_checksum(BlockChecksum(bytes.data(), bytes.size()));
    s.frames.push_back(F(wire::PUT_RESERVE, reserve));
    wire::PutCommitRequest commit;
    commit.set_in_place(true);
    commit.add_reservation_ids(3);
    commit.add_sizes(kBlock);
    s.frames.push_back(F(wire::PUT_COMMIT, commit));
    wire::GetRequest get;
    get.set_in_place(true);
    get.set_packed_keys(KeyBytes(3));
    s.frames.push_back(F(wire::GET, get));
    wire::ReleaseRequest release;
    release.add_lease_ids(2);
    s.frames.push_back(F(wire::RELEASE, release));
    out.push_back(std::move(s));
  }

  // The rest: locate, policies, cluster members, damage reports, aborts.
  {
    Scenario s{"admin_and_rest", 0x2 | 0x8, {}};
    wire::LocateRequest locate;
    locate.set_packed_keys(KeyBytes(1) + KeyBytes(2));
    s.frames.push_back(F(wire::LOCATE, locate));
    s.frames.push_back(F(wire::POLICIES, wire::PoliciesRequest()));
    s.frames.push_back(F(wire::CLUSTER_MEMBERS, wire::ClusterMembersRequest()));
    wire::ReportDamagedRequest damaged;
    damaged.add_keys(KeyBytes(1));
    damaged.set_tier(wire::TIER_GPU);
    s.frames.push_back(F(wire::REPORT_DAMAGED, damaged));
    wire::PutReserveRequest reserve;
    wire::PutItem* item = reserve.add_items();
    item->set_key(KeyBytes(9));
    item->set_size(kBlock);
    item->set_checksum(1);
    s.frames.push_back(F(wire::PUT_RESERVE, reserve));
    wire::PutAbortRequest abort;
    abort.add_reservation_ids(4);
    s.frames.push_back(F(wire::PUT_ABORT, abort));
    out.push_back(std::move(s));
  }

  // A peer daemon (over TCP, having proved the cluster secret): a session's copy stored as given,
  // which of its records this daemon would keep, a put (not replicated back), and the GPU
  // requests, which find no gpu tier here.
  {
    Scenario s{"peer", 0x2 | 0x10, {}};
    wire::SessionSaveRequest save;
    save.set_replica(true);
    wire::SessionRecord* r = save.mutable_record();
    r->set_session_id("conversation-2");
    r->add_keys(KeyBytes(4));
    r->set_token_count(16);
    r->set_version(3);
    r->set_origin("node-b");
    s.frames.push_back(F(wire::SESSION_SAVE, save));
    wire::SessionVersionsRequest versions;
    for (const auto& [id, version] : {std::pair<const char*, uint64_t>{"conversation-2", 2},
                                      {"conversation-2", 4},
                                      {"conversation-9", 1}}) {
      wire::SessionVersion* v = versions.add_sessions();
      v->set_session_id(id);
      v->set_version(version);
      v->set_origin("node-b");
    }
    s.frames.push_back(F(wire::SESSION_VERSIONS, versions));
    wire::UcxBindRequest bind;  // refused: the fuzzed daemon has no UCX listener
    bind.set_nonce(std::string(16, 'n'));
    s.frames.push_back(F(wire::UCX_BIND, bind));
    wire::PutReserveRequest reserve;
    wire::PutItem* item = reserve.add_items();
    item->set_key(KeyBytes(4));
    item->set_size(kBlock);
    const std::string bytes = BlockBytes(4, kBlock);
    item->set_checksum(BlockChecksum(bytes.data(), bytes.size()));
    s.frames.push_back(F(wire::PUT_RESERVE, reserve));
    wire::GpuOfferRequest offer;
    offer.set_packed_keys(KeyBytes(4));
    s.frames.push_back(F(wire::GPU_OFFER, offer));
    wire::GpuLinkJoinRequest join;
    join.set_token(std::string(16, '\x01'));
    join.set_link_id(std::string(128, '\x02'));
    s.frames.push_back(F(wire::GPU_LINK_JOIN, join));
    wire::GpuSendRequest send;
    send.set_token(std::string(16, '\x01'));
    send.set_packed_keys(KeyBytes(4));
    send.add_sizes(kBlock);
    send.add_device_checksums(1);
    s.frames.push_back(F(wire::GPU_SEND, send));
    out.push_back(std::move(s));
  }

  // The hello itself, sent by the input (no harness hello), then a lookup.
  {
    Scenario s{"hello", 0x1, {}};
    s.frames.push_back(F(wire::HELLO, Hello(/*shm=*/true, /*admin=*/false)));
    wire::LookupRequest lookup;
    lookup.add_keys(KeyBytes(1));
    s.frames.push_back(F(wire::LOOKUP, lookup));
    out.push_back(std::move(s));
  }
  return out;
}

void AppendLe(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

std::string HandlersInput(const Scenario& s) {
  std::string out(1, static_cast<char>(s.flags));
  for (const Frame& f : s.frames) {
    AppendLe(&out, f.type, 1);
    AppendLe(&out, f.body.size(), 2);
    AppendLe(&out, f.payload.size(), 4);
    out += f.body;
    out += f.payload;
  }
  return out;
}

std::string FrameStream(const Scenario& s) {
  std::vector<Frame> frames;
  if (s.flags & 0x2) {
    frames.push_back(F(wire::HELLO, Hello((s.flags & 0x4) != 0, (s.flags & 0x8) != 0)));
  }
  frames.insert(frames.end(), s.frames.begin(), s.frames.end());
  std::string out;
  uint64_t id = 0;
  for (const Frame& f : frames) {
    transport::FrameHeader h;
    h.type = f.type;
    h.request_id = ++id;
    h.body_bytes = f.body.size();
    h.payload_bytes = f.payload.size();
    uint8_t header[transport::kFrameHeaderBytes];
    transport::EncodeFrameHeader(h, header);
    out.append(reinterpret_cast<const char*>(header), sizeof(header));
    out += f.body;
    out += f.payload;
  }
  return out;
}

void Write(const std::filesystem::path& path, const std::string& bytes) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

}  // namespace
}  // namespace kvpool

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR (e.g. fuzz/corpus)\n", argv[0]);
    return 2;
  }
  const std::filesystem::path out = argv[1];
  for (const auto& s : kvpool::Scenarios()) {
    kvpool::Write(out / "fuzz_handlers" / s.name, kvpool::HandlersInput(s));
    kvpool::Write(out / "fuzz_frame" / s.name, kvpool::FrameStream(s));
  }
  return 0;
}
