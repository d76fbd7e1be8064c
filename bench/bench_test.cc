// Unit tests of kvpool-bench's own machinery: a benchmark that cannot tell wrong bytes from
// right ones, or miscounts its calls, reports nonsense; these pin that down without a daemon.

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "bench/block_data.h"
#include "bench/pinning.h"
#include "bench/runner.h"

namespace kvpool::bench {
namespace {

struct Stored {
  explicit Stored(size_t size) : pattern(size, 2, 42), block(size) {
    key = MakeKeys("secret", "test", 1)[0];
    std::memcpy(block.data(), pattern.slot(1), size);
    StampBlock(key, block.data(), size);
  }
  PatternSet pattern;
  AlignedBuffer block;
  BlockKey key;
};

TEST(BlockDataTest, VerifyAcceptsTheStoredBytes) {
  for (size_t size : {size_t{4096}, size_t{65536}, size_t{4096 * 3 + 10}, size_t{4096 + 16}}) {
    Stored s(size);
    EXPECT_TRUE(VerifyBlock(s.key, s.block.data(), size, s.pattern.slot(1), size).ok()) << size;
  }
}

TEST(BlockDataTest, VerifyRejectsAFlippedBitAnywhere) {
  Stored s(65536);
  for (size_t off : {size_t{0}, size_t{9}, size_t{100}, size_t{4096}, size_t{65535}}) {
    s.block.data()[off] ^= 0x10;
    const Status st = VerifyBlock(s.key, s.block.data(), 65536, s.pattern.slot(1), 65536);
    EXPECT_EQ(st.code(), StatusCode::kCorruption) << off;
    s.block.data()[off] ^= 0x10;
  }
}

TEST(BlockDataTest, VerifyRejectsAnotherKeysBlockAndAnotherSlot) {
  Stored s(16384);
  const BlockKey other = MakeKeys("secret", "other", 1)[0];
  EXPECT_FALSE(VerifyBlock(other, s.block.data(), 16384, s.pattern.slot(1), 16384).ok());
  EXPECT_FALSE(VerifyBlock(s.key, s.block.data(), 16384, s.pattern.slot(0), 16384).ok());
}

TEST(BlockDataTest, VerifyRejectsSwappedPagesAndShortReads) {
  Stored s(16384);
  std::vector<uint8_t> swapped(s.block.data(), s.block.data() + 16384);
  std::swap_ranges(swapped.begin(), swapped.begin() + 4096, swapped.begin() + 4096);
  EXPECT_FALSE(VerifyBlock(s.key, swapped.data(), 16384, s.pattern.slot(1), 16384).ok());
  EXPECT_FALSE(VerifyBlock(s.key, s.block.data(), 16383, s.pattern.slot(1), 16384).ok());
}

TEST(BlockDataTest, KeysAreFreshPerStreamAndPerRun) {
  const std::vector<BlockKey> a = MakeKeys("run-1", "s", 100);
  const std::vector<BlockKey> b = MakeKeys("run-1", "t", 100);
  const std::vector<BlockKey> c = MakeKeys("run-2", "s", 100);
  ASSERT_EQ(a.size(), 100u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NE(a[i], b[i]);
    EXPECT_NE(a[i], c[i]);
    if (i > 0) {
      EXPECT_NE(a[i], a[i - 1]);
    }
  }
  EXPECT_EQ(MakeKeys("run-1", "s", 100), a) << "a stream's keys are a pure function";
  EXPECT_NE(RandomSecret(), RandomSecret());
}

TEST(PinningTest, ParsesAndFormatsCpuLists) {
  auto r = ParseCpuList("3,0-1,1");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(FormatCpuList(*r), "0-1,3");
  for (const char* bad : {"", "a", "1-", "-1", "2-1", "1,,2", "99999"}) {
    EXPECT_FALSE(ParseCpuList(bad).ok()) << bad;
  }
}

TEST(PinningTest, DefaultPlanSplitsTheAllowedCpus) {
  auto off = MakePinPlan(false, "", "", true);
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->description, "none");
  auto on = MakePinPlan(true, "", "", true);
  ASSERT_TRUE(on.ok());
  EXPECT_FALSE(on->daemon_cpus.empty());
  EXPECT_FALSE(on->bench_cpus.empty());
  if (AllowedCpus().size() > 1) {
    for (int c : on->daemon_cpus) {
      EXPECT_EQ(std::count(on->bench_cpus.begin(), on->bench_cpus.end(), c), 0);
    }
  }
  EXPECT_FALSE(MakePinPlan(true, "100000", "", true).ok());
}

TEST(RunnerTest, PercentileIsNearestRank) {
  std::vector<double> v;
  for (int i = 1; i <= 100; ++i) v.push_back(i);
  EXPECT_EQ(Percentile(v, 0.50), 50);
  EXPECT_EQ(Percentile(v, 0.99), 99);
  EXPECT_EQ(Percentile({7}, 0.99), 7);
  EXPECT_EQ(Percentile({}, 0.5), 0);
}

class CountingWorker : public PhaseWorker {
 public:
  explicit CountingWorker(uint64_t data_calls) : data_calls_(data_calls) {}
  Status Run(PhaseClock& clock) override {
    while (calls_ < data_calls_ && clock.Continue()) {
      clock.Record(std::chrono::microseconds(calls_ + 1), 10);
      ++calls_;
    }
    if (calls_ == data_calls_) clock.OutOfData();
    return Status::OK();
  }
  uint64_t calls_ = 0;

 private:
  const uint64_t data_calls_;
};

TEST(RunnerTest, AnOpsLimitIsExactOverAllThreads) {
  std::vector<std::unique_ptr<PhaseWorker>> w;
  for (int i = 0; i < 3; ++i) w.push_back(std::make_unique<CountingWorker>(1000000));
  auto s = RunPhase(w, {}, PhaseLimits{0, 1000});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->ops, 1000u);
  EXPECT_EQ(s->bytes, 10000u);
  EXPECT_EQ(s->stop, StopReason::kOps);
  EXPECT_TRUE(std::is_sorted(s->latencies_us.begin(), s->latencies_us.end()));
}

TEST(RunnerTest, RunningOutOfDataEndsThePhaseAndSaysSo) {
  std::vector<std::unique_ptr<PhaseWorker>> w;
  w.push_back(std::make_unique<CountingWorker>(5));
  auto s = RunPhase(w, {}, PhaseLimits{10, 0});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->ops, 5u);
  EXPECT_EQ(s->stop, StopReason::kData);
  Figure f;
  f.SetFrom(*s);
  EXPECT_EQ(f.p50_us, 3);
  EXPECT_EQ(f.p99_us, 5);
  EXPECT_GT(f.gbps, 0);
}

class FailingWorker : public PhaseWorker {
 public:
  Status Run(PhaseClock&) override { return Status::Corruption("wrong bytes"); }
};

TEST(RunnerTest, AWorkerErrorFailsThePhase) {
  std::vector<std::unique_ptr<PhaseWorker>> w;
  w.push_back(std::make_unique<CountingWorker>(5));
  w.push_back(std::make_unique<FailingWorker>());
  auto s = RunPhase(w, {}, PhaseLimits{10, 0});
  EXPECT_EQ(s.status().code(), StatusCode::kCorruption);
}

TEST(RunnerTest, JsonLinesCarryTheDocumentedKeys) {
  Figure f;
  f.system = "kvpool";
  f.path = "socket";
  f.op = "get";
  f.block_bytes = 65536;
  f.concurrency = 4;
  f.extra["pin"] = "none";
  const nlohmann::json j = f.ToJson();
  for (const char* k : {"system", "path", "op", "block_bytes", "concurrency", "gbps", "ops_per_s",
                        "p50_us", "p99_us", "pin"}) {
    EXPECT_TRUE(j.contains(k)) << k;
  }
}

}  // namespace
}  // namespace kvpool::bench
