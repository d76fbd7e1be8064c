// The same-node shared-memory data path against a real kvpoold: byte-identical round trips from
// 1 byte to 64 MiB, namespace isolation through the mappings a client can get, leases and
// reservations reclaimed when a client dies or forgets them, and no torn reads while blocks are
// demoted and evicted under the readers.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <random>
#include <thread>

#include "common/checksum.h"
#include "control.pb.h"
#include "tests/support/daemon_process.h"
#include "tests/support/status_matchers.h"
#include "transport/control_channel.h"
#include "transport/frame.h"

namespace kvpool::testing {
namespace {

using transport::ControlChannel;
using transport::FrameHeader;

std::unique_ptr<Client> ShmClient(const DaemonProcess& d, const std::string& ns = "test") {
  ClientOptions o = d.Options(ns);
  o.data_path = DataPath::kSharedMemory;
  auto c = Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  if (!c.ok()) return nullptr;
  EXPECT_TRUE((*c)->server().shared_memory);
  return std::move(*c);
}

BlockKey KeyOf(uint64_t i) {
  BlockKey k;
  std::memcpy(k.bytes.data(), &i, sizeof(i));
  k.bytes[31] = 0xAB;
  return k;
}

TEST(ShmTest, RoundTripsFromOneByteTo64MiB) {
  DaemonProcess d({"--host_capacity=320MiB", "--host_segment_size=64MiB"});
  ASSERT_OK(d.Start());
  auto c = ShmClient(d);
  ASSERT_NE(c, nullptr);
  const std::vector<size_t> sizes = {
      1, 7, 4095, 4096, 4097, 65537, (1u << 20) + 3, (8u << 20) - 1, 64u << 20};
  for (size_t i = 0; i < sizes.size(); ++i) {
    const std::vector<uint8_t> bytes = BlockBytes(i, sizes[i]);
    PutBlock b{KeyOf(i), bytes.data(), bytes.size(), {}, {}};
    auto put = c->Put(std::span(&b, 1));
    ASSERT_TRUE(put.ok()) << put.status().ToString();
    ASSERT_TRUE(put->all_ok()) << sizes[i] << ": " << put->errors[0].ToString();
    EXPECT_EQ(put->stored, 1u);
    std::vector<uint8_t> out(sizes[i] + 16, 0xCD);
    const BlockKey key = KeyOf(i);
    MutableBuffer buf{out.data(), out.size()};
    auto got = c->Get(std::span(&key, 1), std::span(&buf, 1));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_TRUE((*got)[0].status.ok()) << sizes[i] << ": " << (*got)[0].status.ToString();
    ASSERT_EQ((*got)[0].size, sizes[i]);
    EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), out.begin())) << sizes[i];
    EXPECT_EQ(out[sizes[i]], 0xCD) << "wrote past the block";
  }
  const DaemonStats s = WaitForStats(*c, [](const DaemonStats& s) { return s.leases_active == 0; });
  EXPECT_EQ(s.leases_active, 0u);
  EXPECT_EQ(s.bytes_out, 0u) << "blocks travelled in frames, not through shared memory";
}

// A raw control connection that said hello (asking for shared memory) as namespace `ns`.
struct Raw {
  std::unique_ptr<ControlChannel> ch;
  uint64_t next_id = 1;

  Raw(const DaemonProcess& d, const std::string& ns) {
    auto c = ControlChannel::Connect(d.socket_path(), std::chrono::seconds(5));
    EXPECT_TRUE(c.ok());
    ch = std::move(*c);
    wire::HelloRequest h;
    h.set_protocol_version(transport::kProtocolVersion);
    h.set_namespace_name(ns);
    h.set_shared_memory(true);
    wire::HelloResponse r;
    EXPECT_TRUE(Call(wire::HELLO, h, &r).ok());
    EXPECT_TRUE(r.shared_memory());
  }

  template <typename Req, typename Resp>
  Status Call(uint16_t type, const Req& req, Resp* resp) {
    std::string body;
    req.SerializeToString(&body);
    FrameHeader h;
    h.type = type;
    h.request_id = next_id++;
    h.body_bytes = static_cast<uint32_t>(body.size());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    KVPOOL_RETURN_IF_ERROR(ch->Send(h, body, {}, deadline));
    transport::FrameLimits limits;
    KVPOOL_ASSIGN_OR_RETURN(FrameHeader rh, ch->ReceiveHeader(limits, deadline));
    std::string rbody(rh.body_bytes, '\0');
    KVPOOL_RETURN_IF_ERROR(ch->ReceiveInto(rbody.data(), rbody.size(), deadline));
    KVPOOL_RETURN_IF_ERROR(ch->Discard(rh.payload_bytes, deadline));
    return resp->ParseFromString(rbody) ? Status::OK() : Status::Internal("bad body");
  }
};

// In a write-through namespace, a put whose block another writer is putting at that moment
// returns once that writer's put has landed, and then says the block is there: it is on disk,
// as every OK write-through put is. (Before, such a put returned at once, counting the block
// "in progress", with nothing on disk yet.)
TEST(ShmTest, AWriteThroughPutWaitsForTheWriterAlreadyPuttingItsBlock) {
  DaemonProcess d({"--namespace_policy=test=write-through"});
  ASSERT_OK(d.Start());
  const BlockKey key = KeyOf(77);
  const std::vector<uint8_t> bytes = BlockBytes(77, 40000);
  // The first writer reserves the block over the socket path, and commits it later.
  Raw first(d, "test");
  wire::PutReserveRequest reserve;
  wire::PutItem* item = reserve.add_items();
  item->set_key(std::string(key.AsStringView()));
  item->set_size(bytes.size());
  item->set_checksum(BlockChecksum(bytes.data(), bytes.size()));
  wire::PutReserveResponse reserved;
  ASSERT_OK(first.Call(wire::PUT_RESERVE, reserve, &reserved));
  ASSERT_EQ(reserved.reservations_size(), 1);
  ASSERT_EQ(reserved.reservations(0).state(), wire::RESERVED);

  auto second = ShmClient(d);
  ASSERT_NE(second, nullptr);
  std::atomic<bool> committed{false};
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    wire::PutCommitRequest commit;
    commit.add_reservation_ids(reserved.reservations(0).reservation_id());
    commit.add_sizes(bytes.size());
    std::string body;
    commit.SerializeToString(&body);
    FrameHeader h;
    h.type = wire::PUT_COMMIT;
    h.request_id = first.next_id++;
    h.body_bytes = static_cast<uint32_t>(body.size());
    h.payload_bytes = static_cast<uint32_t>(bytes.size());
    const iovec payload{const_cast<uint8_t*>(bytes.data()), bytes.size()};
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    committed = true;
    ASSERT_OK(first.ch->Send(h, body, {&payload, 1}, deadline));
    FrameHeader rh = *first.ch->ReceiveHeader(transport::FrameLimits{}, deadline);
    std::string rbody(rh.body_bytes, '\0');
    ASSERT_OK(first.ch->ReceiveInto(rbody.data(), rbody.size(), deadline));
    wire::PutCommitResponse resp;
    ASSERT_TRUE(resp.ParseFromString(rbody));
    ASSERT_EQ(resp.results_size(), 1);
    EXPECT_EQ(resp.results(0).code(), 0) << resp.results(0).message();
  });
  PutBlock b{key, bytes.data(), bytes.size(), {}, {}};
  Result<PutResult> put = second->Put(std::span(&b, 1));
  const bool returned_after_commit = committed.load();
  writer.join();
  ASSERT_OK(put.status());
  EXPECT_TRUE(put->all_ok());
  EXPECT_EQ(put->in_progress, 0u);
  EXPECT_EQ(put->already_present, 1u);
  EXPECT_TRUE(returned_after_commit) << "the put returned before the other writer committed";

  // On disk: a kill -9 keeps it.
  second.reset();
  d.Kill();
  ASSERT_OK(d.Start());
  auto reader = ShmClient(d);
  ASSERT_NE(reader, nullptr);
  std::vector<uint8_t> out(bytes.size());
  MutableBuffer buf{out.data(), out.size()};
  Result<std::vector<GetResult>> got = reader->Get(std::span(&key, 1), std::span(&buf, 1));
  ASSERT_OK(got.status());
  ASSERT_OK((*got)[0].status);
  EXPECT_EQ(out, bytes);
}

TEST(ShmTest, ANamespaceCannotMapAnotherNamespacesSegments) {
  DaemonProcess d;
  ASSERT_OK(d.Start());
  auto a = ShmClient(d, "tenant-a");
  const std::vector<uint8_t> secret(5000, 0x5E);
  PutBlock b{KeyOf(1), secret.data(), secret.size(), {}, {}};
  ASSERT_TRUE(a->Put(std::span(&b, 1)).ok());
  // Find where tenant-a's block sits (tenant-a may learn that; tenant-b must not use it).
  Raw ra(d, "tenant-a");
  wire::GetRequest get;
  get.add_keys(std::string(KeyOf(1).AsStringView()));
  get.set_in_place(true);
  wire::GetResponse gr;
  ASSERT_TRUE(ra.Call(wire::GET, get, &gr).ok());
  ASSERT_EQ(gr.blocks(0).code(), 0);
  const wire::SegmentSlot slot = gr.blocks(0).slot();

  Raw rb(d, "tenant-b");
  for (bool writable : {false, true}) {
    wire::MapSegmentsRequest m;
    wire::SegmentRequest* sr = m.add_segments();
    sr->set_segment(slot.segment());
    sr->set_generation(slot.generation());
    sr->set_writable(writable);
    wire::MapSegmentsResponse mr;
    ASSERT_TRUE(rb.Call(wire::MAP_SEGMENTS, m, &mr).ok());
    ASSERT_EQ(mr.results_size(), 1);
    // Writable: no reservation of tenant-b's there. Read-only: not tenant-b's segment, answered
    // as a stale generation is (nothing about another tenant's segment is told).
    EXPECT_EQ(mr.results(0).code(),
              static_cast<int>(writable ? StatusCode::kPermissionDenied : StatusCode::kNotFound));
    EXPECT_TRUE(rb.ch->TakeReceivedFds().empty()) << "a descriptor went to the wrong tenant";
  }
  // tenant-b cannot get tenant-a's lease either: the key is not in its namespace.
  wire::GetResponse gb;
  ASSERT_TRUE(rb.Call(wire::GET, get, &gb).ok());
  EXPECT_EQ(gb.blocks(0).code(), static_cast<int>(StatusCode::kNotFound));
  // Even tenant-a gets a writable descriptor only for a segment holding its own open reservation.
  wire::MapSegmentsRequest m;
  wire::SegmentRequest* sr = m.add_segments();
  sr->set_segment(slot.segment());
  sr->set_generation(slot.generation());
  sr->set_writable(true);
  wire::MapSegmentsResponse mr;
  ASSERT_TRUE(ra.Call(wire::MAP_SEGMENTS, m, &mr).ok());
  EXPECT_EQ(mr.results(0).code(), static_cast<int>(StatusCode::kPermissionDenied));
  // A read-only descriptor it gets cannot be mapped writable.
  sr->set_writable(false);
  ASSERT_TRUE(ra.Call(wire::MAP_SEGMENTS, m, &mr).ok());
  ASSERT_EQ(mr.results(0).code(), 0);
  std::vector<int> fds = ra.ch->TakeReceivedFds();
  ASSERT_EQ(fds.size(), 1u);
  EXPECT_EQ(mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0), MAP_FAILED);
  void* ro = mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fds[0], 0);
  EXPECT_NE(ro, MAP_FAILED);
  if (ro != MAP_FAILED) munmap(ro, 4096);
  close(fds[0]);
}

// One 1 MiB segment: once tenant-a's blocks are gone, tenant-b gets the same segment, renewed
// with fresh memory made on the spot or, with a standby segment, made ahead and moved over it.
class ShmReuseTest : public ::testing::TestWithParam<const char*> {};

TEST_P(ShmReuseTest, MappingKeptAfterSegmentReuseRevealsNothing) {
  DaemonProcess d({"--host_capacity=1MiB", "--disk_capacity=64MiB",
                   std::string("--host_standby_segments=") + GetParam()});
  ASSERT_OK(d.Start());
  auto a = ShmClient(d, "tenant-a");
  const std::vector<uint8_t> mine = BlockBytes(1, 100000);
  PutBlock b{KeyOf(1), mine.data(), mine.size(), {}, {}};
  ASSERT_TRUE(a->Put(std::span(&b, 1)).ok());
  Raw ra(d, "tenant-a");
  wire::GetRequest get;
  get.add_keys(std::string(KeyOf(1).AsStringView()));
  get.set_in_place(true);
  wire::GetResponse gr;
  ASSERT_TRUE(ra.Call(wire::GET, get, &gr).ok());
  const wire::SegmentSlot slot = gr.blocks(0).slot();
  wire::ReleaseRequest rel;
  rel.add_lease_ids(gr.blocks(0).lease_id());
  wire::MapSegmentsRequest m;
  wire::SegmentRequest* sr = m.add_segments();
  sr->set_segment(slot.segment());
  sr->set_generation(slot.generation());
  wire::MapSegmentsResponse mr;
  ASSERT_TRUE(ra.Call(wire::MAP_SEGMENTS, m, &mr).ok());
  std::vector<int> fds = ra.ch->TakeReceivedFds();
  ASSERT_EQ(fds.size(), 1u);
  const size_t seg = 1u << 20;
  auto* kept = static_cast<uint8_t*>(mmap(nullptr, seg, PROT_READ, MAP_SHARED, fds[0], 0));
  ASSERT_NE(kept, MAP_FAILED);
  close(fds[0]);
  EXPECT_EQ(std::memcmp(kept + slot.offset(), mine.data(), mine.size()), 0);
  // Release the lease, then drop tenant-a's block from host (it goes to disk).
  {
    std::string body;
    rel.SerializeToString(&body);
    FrameHeader h;
    h.type = wire::RELEASE;
    h.body_bytes = static_cast<uint32_t>(body.size());
    ASSERT_TRUE(
        ra.ch->Send(h, body, {}, std::chrono::steady_clock::now() + std::chrono::seconds(5)).ok());
  }
  // RELEASE has no answer and travels on another connection than the evict: wait for it.
  for (int i = 0; i < 200; ++i) {
    auto st = a->Stats();
    ASSERT_TRUE(st.ok());
    if (st->leases_active == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  auto ev = a->Evict(Tier::kHost);
  ASSERT_TRUE(ev.ok());
  ASSERT_EQ(ev->evicted, 1u);
  // tenant-b fills the (only) segment with its secret.
  auto bcl = ShmClient(d, "tenant-b");
  const std::vector<uint8_t> secret(200000, 0x5E);
  PutBlock sb{KeyOf(2), secret.data(), secret.size(), {}, {}};
  auto p = bcl->Put(std::span(&sb, 1));
  ASSERT_TRUE(p.ok() && p->all_ok());
  // The old mapping shows tenant-a's own bytes, or zeros once the daemon released the old
  // memory's pages (a background thread does that, after the renewal): never tenant-b's.
  std::vector<uint8_t> own(seg, 0);
  std::memcpy(own.data() + slot.offset(), mine.data(), mine.size());
  for (size_t i = 0; i < seg; ++i) {
    ASSERT_TRUE(kept[i] == 0 || kept[i] == own[i]) << "a byte tenant-a never had seen at " << i;
  }
  munmap(kept, seg);
  // And tenant-a's block still reads back identical (from disk).
  std::vector<uint8_t> out(mine.size());
  MutableBuffer buf{out.data(), out.size()};
  const BlockKey k1 = KeyOf(1);
  auto got = a->Get(std::span(&k1, 1), std::span(&buf, 1));
  ASSERT_TRUE(got.ok() && (*got)[0].status.ok());
  EXPECT_EQ(out, mine);
  // Renewed twice (for tenant-b, then for tenant-a's get), the first from memory made ahead where
  // there is some (the daemon makes its one standby segment, 1 MiB here, as it starts; the next
  // only 250 ms after it was taken).
  auto stats = a->Stats();
  ASSERT_TRUE(stats.ok());
  for (const TierStats& t : stats->tiers) {
    if (t.name != "host") continue;
    EXPECT_EQ(t.renewals, 2u);
    if (std::string(GetParam()) == "0") {
      EXPECT_EQ(t.renewals_from_standby, 0u);
    } else {
      EXPECT_GE(t.renewals_from_standby, 1u);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(MadeOnTheSpotOrAhead, ShmReuseTest, ::testing::Values("0", "1"),
                         [](const ::testing::TestParamInfo<const char*>& p) {
                           return std::string("Standby") + p.param;
                         });

DaemonStats StatsOf(const DaemonProcess& d) {
  auto c = d.Connect();
  auto s = c->Stats();
  EXPECT_TRUE(s.ok());
  return s.ok() ? *s : DaemonStats{};
}

template <typename Pred>
DaemonStats WaitFor(const DaemonProcess& d, Pred pred) {
  DaemonStats s;
  for (int i = 0; i < 200; ++i) {
    s = StatsOf(d);
    if (pred(s)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return s;
}

// Descriptors in answers a client has not read are in flight, counted against kvpoold's own
// open-file limit: a client that keeps asking for mappings and never reads the answers is
// closed (1,024 unread), while one that reads its answers may ask for any number.
TEST(ShmTest, AClientThatAsksForMappingsAndNeverReadsTheAnswersIsClosed) {
  DaemonProcess d;
  ASSERT_OK(d.Start());
  auto c = ShmClient(d);
  const std::vector<uint8_t> bytes(5000, 0x42);
  PutBlock b{KeyOf(1), bytes.data(), bytes.size(), {}, {}};
  ASSERT_TRUE(c->Put(std::span(&b, 1)).ok());
  Raw reader(d, "test");
  wire::GetRequest get;
  get.add_keys(std::string(KeyOf(1).AsStringView()));
  get.set_in_place(true);
  wire::GetResponse gr;
  ASSERT_TRUE(reader.Call(wire::GET, get, &gr).ok());
  ASSERT_EQ(gr.blocks(0).code(), 0);
  wire::MapSegmentsRequest m;  // 64 descriptors an answer
  for (int i = 0; i < 64; ++i) {
    wire::SegmentRequest* sr = m.add_segments();
    sr->set_segment(gr.blocks(0).slot().segment());
    sr->set_generation(gr.blocks(0).slot().generation());
  }
  auto ask_and_read = [&m](Raw& r) {
    wire::MapSegmentsResponse mr;
    const Status st = r.Call(wire::MAP_SEGMENTS, m, &mr);
    std::vector<int> fds = r.ch->TakeReceivedFds();
    for (int fd : fds) close(fd);
    return st.ok() && fds.size() == 64;
  };
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(ask_and_read(reader)) << "call " << i;

  Raw hog(d, "test");
  std::string body;
  m.SerializeToString(&body);
  for (int i = 0; i < 40; ++i) {
    FrameHeader h;
    h.type = wire::MAP_SEGMENTS;
    h.request_id = hog.next_id++;
    h.body_bytes = static_cast<uint32_t>(body.size());
    if (!hog.ch->Send(h, body, {}, std::chrono::steady_clock::now() + std::chrono::seconds(5))
             .ok()) {
      break;  // closed already
    }
  }
  bool closed = false;
  for (int i = 0; i < 500 && !closed; ++i) {
    closed = d.log().find("the client does not read its answers") != std::string::npos;
    if (!closed) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(closed) << d.LogTail();
  // The reader goes on being served.
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(ask_and_read(reader)) << "call " << i;
  // The closed connection's socket stays open while the hog holds the descriptors unread (they
  // are in flight until then, counted against its user), and goes once the hog closes its end.
  auto connections = [&] {
    auto s = c->Stats();
    return s.ok() ? s->connections : 0;
  };
  const uint64_t with_hog = connections();
  hog.ch.reset();
  uint64_t now = with_hog;
  for (int i = 0; i < 500 && now >= with_hog; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    now = connections();
  }
  EXPECT_EQ(now, with_hog - 1) << "the closed hog's connection was not let go";
}

TEST(ShmTest, LeasesAndReservationsOfAStuckOrDeadClientAreReclaimed) {
  DaemonProcess d({"--lease_timeout_ms=300", "--reservation_timeout_ms=300"});
  ASSERT_OK(d.Start());
  auto c = ShmClient(d);
  std::vector<std::vector<uint8_t>> blocks;
  for (uint64_t i = 0; i < 8; ++i) {
    blocks.push_back(BlockBytes(i, 50000));
    PutBlock b{KeyOf(i), blocks.back().data(), blocks.back().size(), {}, {}};
    ASSERT_TRUE(c->Put(std::span(&b, 1)).ok());
  }
  const DaemonStats before = StatsOf(d);
  // A child takes leases on every block and reserves 4 more slots in place, then stops (alive,
  // connection open, never releasing) — SIGSTOP — and a second child does the same and dies.
  std::vector<pid_t> kids;
  for (int k = 0; k < 2; ++k) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      Raw r(d, "test");
      wire::GetRequest get;
      for (uint64_t i = 0; i < 8; ++i) get.add_keys(std::string(KeyOf(i).AsStringView()));
      get.set_in_place(true);
      wire::GetResponse gr;
      if (!r.Call(wire::GET, get, &gr).ok()) _exit(1);
      wire::PutReserveRequest res;
      res.set_in_place(true);
      for (uint64_t i = 0; i < 4; ++i) {
        wire::PutItem* it = res.add_items();
        it->set_key(std::string(KeyOf(100 + 10 * k + i).AsStringView()));
        it->set_size(30000);
        it->set_checksum(1);
      }
      wire::PutReserveResponse rr;
      if (!r.Call(wire::PUT_RESERVE, res, &rr).ok()) _exit(1);
      if (k == 0) raise(SIGSTOP);
      _exit(0);
    }
    kids.push_back(pid);
  }
  int status = 0;
  waitpid(kids[1], &status, 0);
  waitpid(kids[0], &status, WUNTRACED);  // stopped, still holding its connection
  const DaemonStats after = WaitFor(
      d, [&](const DaemonStats& s) { return s.leases_active == 0 && s.reservations_active == 0; });
  EXPECT_EQ(after.leases_active, 0u);
  EXPECT_EQ(after.reservations_active, 0u);
  EXPECT_EQ(after.tiers[0].allocated_bytes, before.tiers[0].allocated_bytes)
      << "host memory not back where it was";
  kill(kids[0], SIGKILL);
  waitpid(kids[0], &status, 0);
  // The blocks are still served, identical.
  for (uint64_t i = 0; i < 8; ++i) {
    std::vector<uint8_t> out(50000);
    MutableBuffer buf{out.data(), out.size()};
    const BlockKey k = KeyOf(i);
    auto got = c->Get(std::span(&k, 1), std::span(&buf, 1));
    ASSERT_TRUE(got.ok() && (*got)[0].status.ok());
    EXPECT_EQ(out, blocks[i]);
  }
}

TEST(ShmTest, ReadersNeverSeeATornBlockWhileBlocksAreDemotedAndEvicted) {
  DaemonProcess d({"--host_capacity=4MiB", "--disk_capacity=64MiB"});
  ASSERT_OK(d.Start());
  constexpr int kBlocks = 48;  // 48 x 96 KiB = 4.5 MiB: more than host holds
  std::vector<std::vector<uint8_t>> blocks;
  {
    auto c = ShmClient(d);
    for (int i = 0; i < kBlocks; ++i) {
      blocks.push_back(BlockBytes(1000 + i, 96 * 1024));
      PutBlock b{KeyOf(i), blocks.back().data(), blocks.back().size(), {}, {}};
      auto p = c->Put(std::span(&b, 1));
      ASSERT_TRUE(p.ok() && p->all_ok());
    }
  }
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> ok{0}, missing{0}, wrong{0}, failed{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 3; ++t) {
    readers.emplace_back([&, t] {
      auto c = ShmClient(d);
      std::mt19937 rng(t);
      std::vector<uint8_t> out(96 * 1024);
      while (!stop) {
        const int i = static_cast<int>(rng() % kBlocks);
        const BlockKey k = KeyOf(i);
        MutableBuffer buf{out.data(), out.size()};
        auto got = c->Get(std::span(&k, 1), std::span(&buf, 1));
        if (!got.ok()) {
          failed++;
        } else if ((*got)[0].status.ok()) {
          (out == blocks[i] ? ok : wrong)++;
          if (out != blocks[i]) ADD_FAILURE() << "block " << i << " served with wrong bytes";
        } else if ((*got)[0].status.IsNotFound()) {
          missing++;
        } else {
          wrong++;  // Corruption would mean a torn or changed block reached the reader
          ADD_FAILURE() << "block " << i << ": " << (*got)[0].status.ToString();
        }
      }
    });
  }
  // Meanwhile, demote everything repeatedly; the readers' gets promote blocks back.
  auto admin = d.Connect();
  const auto start = std::chrono::steady_clock::now();
  int evictions = 0;
  // At least 2 s and 200 verified reads, at most 20 s (a loaded CI machine is slow).
  while (std::chrono::steady_clock::now() < start + std::chrono::seconds(20) &&
         (std::chrono::steady_clock::now() < start + std::chrono::seconds(2) || ok < 200)) {
    ASSERT_TRUE(admin->Evict(Tier::kHost).ok());
    ++evictions;
  }
  stop = true;
  for (auto& r : readers) r.join();
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_EQ(failed.load(), 0u);
  EXPECT_GE(ok.load(), 200u);
  EXPECT_GT(evictions, 10);
  EXPECT_EQ(missing.load(), 0u) << "blocks on disk must be served, not missed";
}

}  // namespace
}  // namespace kvpool::testing
