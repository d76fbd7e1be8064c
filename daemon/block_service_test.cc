// BlockService in-process, over a real tier manager, session store and namespace registry: the
// hello gate, routing to the block, session and admin handlers, and the socket and
// shared-memory deliveries picked at hello. (tests/daemon_test.cc covers the same through a
// real kvpoold and client; this pins the router and handlers without a process or socket.)

#include "daemon/block_service.h"

#include <gtest/gtest.h>
#include <rocksdb/db.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "control.pb.h"
#include "daemon/tier_stack_for_test.h"
#include "tiers/policy.h"

namespace kvpool::daemon {
namespace {

class BlockServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<NamespaceRegistry>> ns = NamespaceRegistry::Load(stack_.store(), 16);
    ASSERT_TRUE(ns.ok()) << ns.status().ToString();
    namespaces_ = std::move(ns).value();
    sessions_ = std::make_unique<SessionStore>(stack_.store());
    options_.node_id = "node-a";
    service_ = std::make_unique<BlockService>(options_, stack_.manager(), *namespaces_, *sessions_,
                                              metrics_);
    service_->SetConnectionGauge([] { return 3; });
  }
  void TearDown() override {
    for (auto& c : connections_) service_->OnDisconnect(*c);
  }

  transport::ConnectionState& Connect(bool local) {
    transport::ConnectionInfo info;
    info.id = connections_.size() + 1;
    info.peer = local ? "unix" : "tcp:127.0.0.1:1";
    info.local = local;
    connections_.push_back(service_->OnConnect(info));
    return *connections_.back();
  }

  template <typename Request, typename Answer>
  transport::Response Call(transport::ConnectionState& c, uint16_t type, const Request& req,
                           Answer* answer) {
    transport::FrameHeader h;
    h.type = type;
    const std::string body = req.SerializeAsString();
    transport::Response r = service_->Handle(c, h, body);
    EXPECT_EQ(r.type, type);
    EXPECT_TRUE(answer->ParseFromString(r.body));
    return r;
  }

  wire::HelloResponse Hello(transport::ConnectionState& c, bool shared_memory) {
    wire::HelloRequest req;
    req.set_protocol_version(transport::kProtocolVersion);
    req.set_namespace_name("ns1");
    req.set_shared_memory(shared_memory);
    wire::HelloResponse resp;
    Call(c, wire::HELLO, req, &resp);
    EXPECT_EQ(resp.status().code(), 0) << resp.status().message();
    return resp;
  }

  // Reserves and commits `bytes` as block `n`, its bytes in the PUT_COMMIT frame.
  void PutInFrame(transport::ConnectionState& c, uint64_t n, const std::vector<uint8_t>& bytes) {
    wire::PutReserveRequest reserve;
    wire::PutItem* item = reserve.add_items();
    item->set_key(std::string(TierStackForTest::KeyOf(n).AsStringView()));
    item->set_size(bytes.size());
    item->set_checksum(BlockChecksum(bytes.data(), bytes.size()));
    wire::PutReserveResponse reserved;
    Call(c, wire::PUT_RESERVE, reserve, &reserved);
    ASSERT_EQ(reserved.status().code(), 0) << reserved.status().message();
    ASSERT_EQ(reserved.reservations(0).state(), wire::RESERVED);
    EXPECT_FALSE(reserved.reservations(0).has_slot());

    wire::PutCommitRequest commit;
    commit.add_reservation_ids(reserved.reservations(0).reservation_id());
    commit.add_sizes(bytes.size());
    transport::FrameHeader h;
    h.type = wire::PUT_COMMIT;
    h.payload_bytes = bytes.size();
    const std::string body = commit.SerializeAsString();
    std::vector<transport::PayloadSink> sinks;
    ASSERT_TRUE(service_->PayloadSinks(c, h, body, &sinks).ok());
    ASSERT_EQ(sinks.size(), 1u);
    ASSERT_NE(sinks[0].data, nullptr);
    std::memcpy(sinks[0].data, bytes.data(), bytes.size());
    wire::PutCommitResponse committed;
    ASSERT_TRUE(committed.ParseFromString(service_->Handle(c, h, body).body));
    ASSERT_EQ(committed.results_size(), 1);
    EXPECT_EQ(committed.results(0).code(), 0) << committed.results(0).message();
  }

  // Namespace ns1 (the hello's), with a disk quota where `disk_quota` is not 0.
  NamespaceId Ns1(uint64_t disk_quota = 0) {
    Result<NamespaceId> ns = namespaces_->Resolve("ns1");
    EXPECT_TRUE(ns.ok());
    if (disk_quota != 0) {
      tiers::NamespacePolicy policy = tiers::DefaultNamespacePolicy();
      policy.disk_quota_bytes = disk_quota;
      EXPECT_TRUE(stack_.manager().SetNamespacePolicy(*ns, policy).ok());
    }
    return ns.ok() ? *ns : 0;
  }
  // Session calls through `c` with no chain, `metadata_bytes` of metadata: the answer's code.
  int SaveSession(transport::ConnectionState& c, const std::string& id, size_t metadata_bytes) {
    wire::SessionSaveRequest req;
    req.mutable_record()->set_session_id(id);
    (*req.mutable_record()->mutable_metadata())["tokens"] = std::string(metadata_bytes, 'x');
    wire::SessionSaveResponse resp;
    Call(c, wire::SESSION_SAVE, req, &resp);
    return resp.status().code();
  }
  int DeleteSession(transport::ConnectionState& c, const std::string& id) {
    wire::SessionDeleteRequest req;
    req.set_session_id(id);
    wire::SessionDeleteResponse resp;
    Call(c, wire::SESSION_DELETE, req, &resp);
    return resp.status().code();
  }
  uint64_t SessionCount(transport::ConnectionState& c) {
    wire::StatsResponse stats;
    Call(c, wire::STATS, wire::StatsRequest(), &stats);
    return stats.sessions();
  }

  TierStackForTest stack_;
  std::unique_ptr<NamespaceRegistry> namespaces_;
  std::unique_ptr<SessionStore> sessions_;
  Metrics metrics_;
  BlockServiceOptions options_;
  std::unique_ptr<BlockService> service_;
  std::vector<std::unique_ptr<transport::ConnectionState>> connections_;
};

TEST_F(BlockServiceTest, EverythingButHelloWaitsForHello) {
  transport::ConnectionState& c = Connect(/*local=*/true);
  wire::LookupRequest lookup;
  wire::LookupResponse resp;
  Call(c, wire::LOOKUP, lookup, &resp);
  EXPECT_EQ(resp.status().code(), static_cast<int>(StatusCode::kFailedPrecondition));
  EXPECT_EQ(resp.status().message(), "say hello first");

  // A commit frame's bytes are still read (and discarded) before the refusal.
  wire::PutCommitRequest commit;
  commit.add_reservation_ids(1);
  commit.add_sizes(100);
  transport::FrameHeader h;
  h.type = wire::PUT_COMMIT;
  std::vector<transport::PayloadSink> sinks;
  ASSERT_TRUE(service_->PayloadSinks(c, h, commit.SerializeAsString(), &sinks).ok());
  ASSERT_EQ(sinks.size(), 1u);
  EXPECT_EQ(sinks[0].data, nullptr);
  EXPECT_EQ(sinks[0].size, 100u);

  Hello(c, /*shared_memory=*/false);
  Call(c, wire::LOOKUP, lookup, &resp);
  EXPECT_EQ(resp.status().code(), 0);
}

TEST_F(BlockServiceTest, UcxBindWithoutAnOfferIsRefusedAndTheConnectionStaysUsable) {
  transport::ConnectionState& c = Connect(/*local=*/false);
  Hello(c, /*shared_memory=*/false);
  wire::UcxBindRequest bind;
  bind.set_nonce(std::string(16, 'x'));
  wire::UcxBindResponse bound;
  Call(c, wire::UCX_BIND, bind, &bound);
  EXPECT_EQ(bound.status().code(), static_cast<int>(StatusCode::kFailedPrecondition))
      << bound.status().message();
  wire::LookupRequest lookup;
  lookup.add_keys(std::string(TierStackForTest::KeyOf(1).AsStringView()));
  wire::LookupResponse resp;
  Call(c, wire::LOOKUP, lookup, &resp);
  EXPECT_EQ(resp.status().code(), 0);
}

TEST_F(BlockServiceTest, PutAndGetInTheFrames) {
  transport::ConnectionState& c = Connect(/*local=*/false);
  const wire::HelloResponse hello = Hello(c, /*shared_memory=*/true);
  EXPECT_FALSE(hello.shared_memory());  // not a local connection
  EXPECT_EQ(hello.ucx_port(), 0u);      // no UCX listener
  EXPECT_EQ(hello.node_id(), "node-a");
  const std::vector<uint8_t> bytes = TierStackForTest::BytesOf(1, 10000);
  PutInFrame(c, 1, bytes);

  wire::LookupRequest lookup;
  lookup.add_keys(std::string(TierStackForTest::KeyOf(1).AsStringView()));
  lookup.add_keys(std::string(TierStackForTest::KeyOf(2).AsStringView()));
  wire::LookupResponse found;
  Call(c, wire::LOOKUP, lookup, &found);
  EXPECT_EQ(found.hit_blocks(), 1u);
  ASSERT_EQ(found.tiers_size(), 1);
  EXPECT_EQ(found.tiers(0), wire::TIER_HOST);

  wire::GetRequest get;
  get.add_keys(std::string(TierStackForTest::KeyOf(1).AsStringView()));
  get.add_keys(std::string(TierStackForTest::KeyOf(2).AsStringView()));
  wire::GetResponse got;
  transport::Response r = Call(c, wire::GET, get, &got);
  ASSERT_EQ(got.blocks_size(), 2);
  EXPECT_EQ(got.blocks(0).code(), 0);
  EXPECT_EQ(got.blocks(0).size(), bytes.size());
  EXPECT_EQ(got.blocks(1).code(), static_cast<int>(StatusCode::kNotFound));
  ASSERT_EQ(r.payload.size(), 1u);
  ASSERT_EQ(r.payload[0].second, bytes.size());
  EXPECT_EQ(std::memcmp(r.payload[0].first, bytes.data(), bytes.size()), 0);
  EXPECT_EQ(stack_.manager().GetStats().leases_active, 1u);
  r.release();  // the server, once the payload is written
  EXPECT_EQ(stack_.manager().GetStats().leases_active, 0u);

  get.set_in_place(true);
  Call(c, wire::GET, get, &got);
  EXPECT_EQ(got.status().code(), static_cast<int>(StatusCode::kFailedPrecondition));
  get.set_in_place(false);
  get.set_via_ucx(true);
  Call(c, wire::GET, get, &got);
  EXPECT_EQ(got.status().code(), static_cast<int>(StatusCode::kFailedPrecondition));
  EXPECT_EQ(got.status().message(), "the UCX data path was not granted at hello");

  wire::StatsRequest stats;
  wire::StatsResponse figures;
  Call(c, wire::STATS, stats, &figures);
  EXPECT_EQ(figures.node_id(), "node-a");
  EXPECT_EQ(figures.gets(), 1u);  // the refused ones do not count
  EXPECT_EQ(figures.get_blocks_served(), 1u);
  EXPECT_EQ(figures.puts_committed(), 1u);
  EXPECT_EQ(figures.bytes_in(), bytes.size());
  EXPECT_EQ(figures.connections(), 3u);
  EXPECT_EQ(figures.cluster_state(), "standalone");
}

TEST_F(BlockServiceTest, LocalConnectionGetsInPlace) {
  transport::ConnectionState& writer = Connect(/*local=*/false);
  Hello(writer, false);
  const std::vector<uint8_t> bytes = TierStackForTest::BytesOf(5, 7000);
  PutInFrame(writer, 5, bytes);

  transport::ConnectionState& c = Connect(/*local=*/true);
  const wire::HelloResponse hello = Hello(c, /*shared_memory=*/true);
  EXPECT_TRUE(hello.shared_memory());
  EXPECT_EQ(hello.lease_timeout_ms(), options_.lease_timeout.count());
  wire::GetRequest get;
  get.add_keys(std::string(TierStackForTest::KeyOf(5).AsStringView()));
  get.set_in_place(true);
  wire::GetResponse got;
  transport::Response r = Call(c, wire::GET, get, &got);
  ASSERT_EQ(got.blocks_size(), 1);
  EXPECT_EQ(got.blocks(0).code(), 0);
  EXPECT_NE(got.blocks(0).lease_id(), 0u);
  EXPECT_TRUE(got.blocks(0).has_slot());
  EXPECT_TRUE(r.payload.empty());
  r.release();
  EXPECT_EQ(stack_.manager().GetStats().leases_active, 1u);  // the client's until RELEASE

  wire::ReleaseRequest release;
  release.add_lease_ids(got.blocks(0).lease_id());
  transport::FrameHeader h;
  h.type = wire::RELEASE;
  EXPECT_TRUE(service_->Handle(c, h, release.SerializeAsString()).no_reply);
  EXPECT_EQ(stack_.manager().GetStats().leases_active, 0u);
}

TEST_F(BlockServiceTest, SessionsSaveLoadListDelete) {
  transport::ConnectionState& c = Connect(/*local=*/false);
  Hello(c, false);
  const std::vector<uint8_t> bytes = TierStackForTest::BytesOf(9, 4096);
  PutInFrame(c, 9, bytes);

  wire::SessionSaveRequest save;
  save.mutable_record()->set_session_id("chat-1");
  save.mutable_record()->add_keys(std::string(TierStackForTest::KeyOf(9).AsStringView()));
  wire::SessionSaveResponse saved;
  Call(c, wire::SESSION_SAVE, save, &saved);
  EXPECT_EQ(saved.status().code(), 0) << saved.status().message();

  wire::SessionLoadRequest load;
  load.set_session_id("chat-1");
  wire::SessionLoadResponse loaded;
  Call(c, wire::SESSION_LOAD, load, &loaded);
  EXPECT_EQ(loaded.status().code(), 0);
  EXPECT_EQ(loaded.cached_blocks(), 1u);
  EXPECT_EQ(loaded.record().total_bytes(), bytes.size());

  wire::SessionListRequest list;
  wire::SessionListResponse listed;
  Call(c, wire::SESSION_LIST, list, &listed);
  ASSERT_EQ(listed.sessions_size(), 1);
  EXPECT_EQ(listed.sessions(0).session_id(), "chat-1");

  wire::SessionDeleteRequest del;
  del.set_session_id("chat-1");
  wire::SessionDeleteResponse deleted;
  Call(c, wire::SESSION_DELETE, del, &deleted);
  EXPECT_EQ(deleted.status().code(), 0);
  Call(c, wire::SESSION_LOAD, load, &loaded);
  EXPECT_EQ(loaded.status().code(), static_cast<int>(StatusCode::kNotFound));
}

// A session's record counts against its namespace's disk use and disk quota as blocks do (so
// records cannot fill the device past them), and the session count is exact: re-saves do not
// add to it, deletes take from it.
TEST_F(BlockServiceTest, SessionRecordsCountAgainstTheDiskQuotaAndTheirCountIsExact) {
  transport::ConnectionState& c = Connect(/*local=*/false);
  Hello(c, false);
  const NamespaceId ns = Ns1(/*disk_quota=*/1 << 20);
  auto disk_bytes = [&] { return stack_.manager().UsageOf(ns).disk_bytes; };
  constexpr int kExhausted = static_cast<int>(StatusCode::kResourceExhausted);

  ASSERT_EQ(SaveSession(c, "a", 400 << 10), 0);
  ASSERT_EQ(SaveSession(c, "b", 400 << 10), 0);
  const uint64_t two = disk_bytes();
  EXPECT_GE(two, 800u << 10);
  EXPECT_EQ(stack_.manager().GetStats().disk_used_bytes, two);
  EXPECT_EQ(SaveSession(c, "c", 400 << 10), kExhausted) << "past the namespace's 1 MiB quota";
  for (int i = 0; i < 5; ++i) EXPECT_EQ(SaveSession(c, "a", 400 << 10), 0) << "no more room";
  EXPECT_EQ(disk_bytes(), two);
  EXPECT_EQ(SessionCount(c), 2u);
  ASSERT_EQ(SaveSession(c, "a", 100 << 10), 0);  // smaller: the difference is given back
  EXPECT_EQ(disk_bytes(), two - (300u << 10));
  EXPECT_EQ(SaveSession(c, "c", 400 << 10), 0);
  EXPECT_EQ(SessionCount(c), 3u);

  EXPECT_EQ(DeleteSession(c, "b"), 0);
  EXPECT_EQ(DeleteSession(c, "b"), static_cast<int>(StatusCode::kNotFound));
  EXPECT_EQ(SessionCount(c), 2u);
  EXPECT_EQ(DeleteSession(c, "a"), 0);
  EXPECT_EQ(DeleteSession(c, "c"), 0);
  EXPECT_EQ(SessionCount(c), 0u);
  EXPECT_EQ(disk_bytes(), 0u);
  EXPECT_EQ(stack_.manager().GetStats().disk_used_bytes, 0u);
}

// A record RocksDB hands back but protobuf cannot read: a save replaces it and a delete removes
// it (before, both answered Corruption, and the id could never be used again), giving back what
// it was charged and counted.
TEST_F(BlockServiceTest, ADamagedSessionRecordIsReplacedBySaveAndRemovedByDelete) {
  transport::ConnectionState& c = Connect(/*local=*/false);
  Hello(c, false);
  const NamespaceId ns = Ns1();
  auto damage = [&](const std::string& id) {
    std::string key(4, '\0');
    for (int i = 0; i < 4; ++i) key[i] = static_cast<char>(ns >> (24 - 8 * i));
    ASSERT_TRUE(stack_.store()
                    .db()
                    ->Put(rocksdb::WriteOptions(), stack_.store().sessions(), key + id,
                          std::string("\xff\xff\xff", 3))
                    .ok());
  };
  auto load = [&] {
    wire::SessionLoadRequest req;
    req.set_session_id("chat-1");
    wire::SessionLoadResponse resp;
    Call(c, wire::SESSION_LOAD, req, &resp);
    return resp.status().code();
  };
  auto disk_bytes = [&] { return stack_.manager().UsageOf(ns).disk_bytes; };
  damage("chat-1");
  EXPECT_EQ(load(), static_cast<int>(StatusCode::kCorruption));
  EXPECT_EQ(SaveSession(c, "chat-1", 4096), 0);
  EXPECT_EQ(load(), 0);
  EXPECT_EQ(SessionCount(c), 1u);
  const uint64_t one = disk_bytes();
  EXPECT_GT(one, 4096u);

  // Damaged after it was counted: replaced, and what it was charged is given back.
  damage("chat-1");
  EXPECT_EQ(SaveSession(c, "chat-1", 4096), 0);
  EXPECT_EQ(SessionCount(c), 1u);
  EXPECT_EQ(disk_bytes(), one);

  damage("chat-1");
  EXPECT_EQ(DeleteSession(c, "chat-1"), 0);
  EXPECT_EQ(load(), static_cast<int>(StatusCode::kNotFound));
  EXPECT_EQ(SessionCount(c), 0u);
  EXPECT_EQ(disk_bytes(), 0u);
}

// In cluster mode a delete leaves a deletion record, also of a session this node does not hold
// (a home may). A namespace at its disk quota must still be able to delete: deletion records are
// charged without making room.
TEST_F(BlockServiceTest, ADeleteAtAFullDiskQuotaLeavesItsDeletionRecord) {
  options_.cluster_mode = true;
  service_ = std::make_unique<BlockService>(options_, stack_.manager(), *namespaces_, *sessions_,
                                            metrics_);
  transport::ConnectionState& c = Connect(/*local=*/false);
  Hello(c, false);
  const NamespaceId ns = Ns1(/*disk_quota=*/1 << 20);
  ASSERT_EQ(SaveSession(c, "big", (1 << 20) - 64), 0);
  EXPECT_EQ(DeleteSession(c, "held-elsewhere"), 0);
  EXPECT_EQ(DeleteSession(c, "big"), 0);
  EXPECT_LT(stack_.manager().UsageOf(ns).disk_bytes, 1024u) << "two deletion records";
}

}  // namespace
}  // namespace kvpool::daemon
