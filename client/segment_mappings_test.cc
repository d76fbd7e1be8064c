#include "client/segment_mappings.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/huge_pages.h"

namespace kvpool::client {
namespace {

constexpr uint64_t kSegmentBytes = 64 << 10;

bool IsOpen(int fd) { return fcntl(fd, F_GETFD) != -1; }

// A daemon's MAP_SEGMENTS over memfds: segment s of generation g is a memfd; anything else is
// refused with NotFound. Records every request and every descriptor it handed out.
class FakeSource : public SegmentDescriptorSource {
 public:
  ~FakeSource() override {
    for (auto& [seg, fd] : memfds_) ::close(fd);
  }

  // Creates segment `seg` at `generation`, filled with `fill`.
  void AddSegment(uint32_t seg, uint32_t generation, char fill) {
    if (memfds_.count({seg, generation}) == 0) {
      const int fd = memfd_create("kvpool-segment-test", MFD_CLOEXEC);
      ASSERT_GE(fd, 0);
      ASSERT_EQ(ftruncate(fd, kSegmentBytes), 0);
      memfds_[{seg, generation}] = fd;
    }
    const std::string bytes(kSegmentBytes, fill);
    ASSERT_EQ(pwrite(memfds_[{seg, generation}], bytes.data(), bytes.size(), 0),
              static_cast<ssize_t>(bytes.size()));
  }
  int memfd(uint32_t seg, uint32_t generation) { return memfds_[{seg, generation}]; }

  Status MapSegments(const wire::MapSegmentsRequest& req, wire::MapSegmentsResponse* resp,
                     std::vector<int>* fds, transport::Deadline) override {
    requests.push_back(req);
    if (!fail_round_trip.ok()) return fail_round_trip;
    resp->mutable_status()->set_code(static_cast<int>(whole_request.code()));
    resp->mutable_status()->set_message(std::string(whole_request.message()));
    if (!whole_request.ok()) return Status::OK();
    for (int i = 0; i < req.segments_size(); ++i) {
      const wire::SegmentRequest& s = req.segments(i);
      if (drop_results > 0 && i >= req.segments_size() - drop_results) break;
      wire::Status* r = resp->add_results();
      auto it = memfds_.find({s.segment(), s.generation()});
      if (it == memfds_.end()) {
        r->set_code(static_cast<int>(StatusCode::kNotFound));
        r->set_message("no such segment");
        continue;
      }
      if (withhold_fds) continue;
      fds->push_back(dup(it->second));
      handed_out.push_back(fds->back());
    }
    for (int i = 0; i < extra_fds; ++i) {
      fds->push_back(dup(memfds_.begin()->second));
      handed_out.push_back(fds->back());
    }
    return Status::OK();
  }

  std::vector<wire::MapSegmentsRequest> requests;
  std::vector<int> handed_out;
  Status fail_round_trip;
  Status whole_request;
  int drop_results = 0;  // answer this many results too few
  bool withhold_fds = false;
  int extra_fds = 0;  // descriptors beyond the results

 private:
  std::map<std::pair<uint32_t, uint32_t>, int> memfds_;
};

transport::Deadline Soon() { return std::chrono::steady_clock::now() + std::chrono::seconds(5); }

TEST(SegmentMappingsTest, MapsReadOnlyAndCachesByGeneration) {
  FakeSource source;
  source.AddSegment(3, 7, 'a');
  SegmentMappings maps;
  maps.Reset(kSegmentBytes);
  EXPECT_EQ(maps.segment_bytes(), kSegmentBytes);

  auto st = maps.EnsureMapped({{3, 7}, {3, 7}}, /*writable=*/false, source, Soon());
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ASSERT_EQ(st->size(), 2u);
  EXPECT_TRUE((*st)[0].ok());
  EXPECT_TRUE((*st)[1].ok());
  ASSERT_EQ(source.requests.size(), 1u);
  EXPECT_EQ(source.requests[0].segments_size(), 1);  // the duplicate is asked once
  EXPECT_FALSE(source.requests[0].segments(0).writable());
  ASSERT_NE(maps.ReadBase(3), nullptr);
  EXPECT_EQ(maps.ReadBase(3)[0], 'a');
  EXPECT_EQ(maps.ReadBase(3)[kSegmentBytes - 1], 'a');
  EXPECT_EQ(maps.WriteBase(3), nullptr);
  // The descriptor was closed once mapped; the mapping shares the memfd's pages.
  EXPECT_FALSE(IsOpen(source.handed_out[0]));
  source.AddSegment(3, 7, 'b');
  EXPECT_EQ(maps.ReadBase(3)[100], 'b');

  // Cached: no second round trip.
  st = maps.EnsureMapped({{3, 7}}, false, source, Soon());
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE((*st)[0].ok());
  EXPECT_EQ(source.requests.size(), 1u);

  // A newer generation replaces the mapping.
  source.AddSegment(3, 8, 'c');
  st = maps.EnsureMapped({{3, 8}}, false, source, Soon());
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE((*st)[0].ok());
  EXPECT_EQ(source.requests.size(), 2u);
  EXPECT_EQ(maps.ReadBase(3)[0], 'c');

  maps.UnmapAll();
  EXPECT_EQ(maps.ReadBase(3), nullptr);
}

// A segment the daemon keeps on huge pages (kvpoold --host_huge_pages) is mapped by huge pages
// here too, where the kernel gives them to shared memory: the kernel places a shared-memory
// mapping at a huge page's alignment and maps its huge pages whole, read-only or writable.
TEST(SegmentMappingsTest, ASegmentOnHugePagesIsMappedByHugePages) {
  if (!ShmemHugePagesOnAdvice()) {
    GTEST_SKIP() << "this kernel gives shared memory no huge pages (shmem_enabled "
                 << ShmemHugePageMode() << ")";
  }
  constexpr uint64_t kHuge = 4 << 20;
  // The daemon's side: a memfd faulted in through a mapping advised huge.
  const int fd = memfd_create("kvpool-segment-test", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, kHuge), 0);
  void* arena = mmap(nullptr, 2 * kHuge, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(arena, MAP_FAILED);
  auto* at =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(arena) + kHuge - 1) / kHuge * kHuge);
  ASSERT_NE(mmap(at, kHuge, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0), MAP_FAILED);
  madvise(at, kHuge, MADV_HUGEPAGE);
  std::memset(at, 'h', kHuge);
  if (ShmemHugeBytesIn(at, at + kHuge) == 0) {
    munmap(arena, 2 * kHuge);
    close(fd);
    GTEST_SKIP() << "the kernel found no free 2 MiB run for the daemon's side";
  }
  struct OneSegment : SegmentDescriptorSource {
    int fd;
    Status MapSegments(const wire::MapSegmentsRequest& req, wire::MapSegmentsResponse* resp,
                       std::vector<int>* fds, transport::Deadline) override {
      resp->mutable_status()->set_code(0);
      for (int i = 0; i < req.segments_size(); ++i) {
        resp->add_results()->set_code(0);
        fds->push_back(dup(fd));
      }
      return Status::OK();
    }
  } source;
  source.fd = fd;
  SegmentMappings maps;
  maps.Reset(kHuge);
  for (bool writable : {false, true}) {
    auto st = maps.EnsureMapped({{0, 1}}, writable, source, Soon());
    ASSERT_TRUE(st.ok() && (*st)[0].ok());
    const uint8_t* base = writable ? maps.WriteBase(0) : maps.ReadBase(0);
    ASSERT_NE(base, nullptr);
    EXPECT_EQ(base[kHuge - 1], 'h');
    EXPECT_GT(ShmemHugeBytesIn(base, base + kHuge), 0u) << (writable ? "writable" : "read-only");
  }
  maps.UnmapAll();
  munmap(arena, 2 * kHuge);
  close(fd);
}

TEST(SegmentMappingsTest, WritableMappingWritesThroughToTheSegment) {
  FakeSource source;
  source.AddSegment(1, 1, 'x');
  SegmentMappings maps;
  maps.Reset(kSegmentBytes);
  auto st = maps.EnsureMapped({{1, 1}}, /*writable=*/true, source, Soon());
  ASSERT_TRUE(st.ok());
  ASSERT_TRUE((*st)[0].ok());
  EXPECT_TRUE(source.requests[0].segments(0).writable());
  ASSERT_NE(maps.WriteBase(1), nullptr);
  EXPECT_EQ(maps.ReadBase(1), nullptr);  // read and write mappings are kept apart
  std::memcpy(maps.WriteBase(1) + 10, "kvpool", 6);
  char back[6];
  ASSERT_EQ(pread(source.memfd(1, 1), back, 6, 10), 6);
  EXPECT_EQ(std::string(back, 6), "kvpool");
}

TEST(SegmentMappingsTest, ReportsEachSegmentsOwnOutcome) {
  FakeSource source;
  source.AddSegment(1, 1, 'x');
  SegmentMappings maps;
  maps.Reset(kSegmentBytes);
  auto st = maps.EnsureMapped({{1, 1}, {2, 1}, {1, 1}}, false, source, Soon());
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE((*st)[0].ok());
  EXPECT_EQ((*st)[1].code(), StatusCode::kNotFound);  // the daemon's refusal of that one
  EXPECT_TRUE((*st)[2].ok());
  EXPECT_EQ(maps.ReadBase(2), nullptr);
}

TEST(SegmentMappingsTest, ShortAnswersAreInternalAndExtraDescriptorsClosed) {
  FakeSource source;
  source.AddSegment(1, 1, 'x');
  source.AddSegment(2, 1, 'y');
  SegmentMappings maps;
  maps.Reset(kSegmentBytes);
  source.drop_results = 1;
  source.extra_fds = 2;
  auto st = maps.EnsureMapped({{1, 1}, {2, 1}}, false, source, Soon());
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE((*st)[0].ok());
  EXPECT_EQ((*st)[1].code(), StatusCode::kInternal);
  for (int fd : source.handed_out) EXPECT_FALSE(IsOpen(fd)) << fd;

  SegmentMappings other;
  other.Reset(kSegmentBytes);
  FakeSource no_fds;
  no_fds.AddSegment(1, 1, 'x');
  no_fds.withhold_fds = true;
  st = other.EnsureMapped({{1, 1}}, false, no_fds, Soon());
  ASSERT_TRUE(st.ok());
  EXPECT_EQ((*st)[0].code(), StatusCode::kInternal);
  EXPECT_EQ(other.ReadBase(1), nullptr);
}

TEST(SegmentMappingsTest, FailedRoundTripOrRefusalFailsTheCall) {
  FakeSource source;
  source.AddSegment(1, 1, 'x');
  SegmentMappings maps;
  maps.Reset(kSegmentBytes);
  source.fail_round_trip = Status::Unavailable("connection lost");
  EXPECT_EQ(maps.EnsureMapped({{1, 1}}, false, source, Soon()).status().code(),
            StatusCode::kUnavailable);
  source.fail_round_trip = Status::OK();
  source.whole_request = Status::FailedPrecondition("not granted");
  EXPECT_EQ(maps.EnsureMapped({{1, 1}}, false, source, Soon()).status().code(),
            StatusCode::kFailedPrecondition);
}

TEST(SegmentMappingsTest, AsksAtMost64SegmentsARoundTrip) {
  FakeSource source;
  std::vector<SegmentMappings::SegmentId> segs;
  for (uint32_t s = 0; s < 70; ++s) {
    source.AddSegment(s, 1, static_cast<char>('a' + s % 26));
    segs.emplace_back(s, 1);
  }
  SegmentMappings maps;
  maps.Reset(kSegmentBytes);
  auto st = maps.EnsureMapped(segs, false, source, Soon());
  ASSERT_TRUE(st.ok());
  for (const Status& s : *st) EXPECT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(source.requests.size(), 2u);
  EXPECT_EQ(source.requests[0].segments_size(), 64);
  EXPECT_EQ(source.requests[1].segments_size(), 6);
  EXPECT_EQ(maps.ReadBase(69)[0], 'a' + 69 % 26);
  // Reset unmaps everything (segment sizes belong to one daemon instance).
  maps.Reset(kSegmentBytes * 2);
  EXPECT_EQ(maps.ReadBase(0), nullptr);
}

}  // namespace
}  // namespace kvpool::client
