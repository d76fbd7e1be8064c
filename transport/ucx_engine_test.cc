// UcxEngine over UCX_TLS=tcp on loopback only (UcxOptions sets TLS=tcp, NET_DEVICES=lo): two
// engines in this process, and a child process (this binary re-executed with
// KVPOOL_UCX_TEST_CHILD set) for a peer that is killed.
#include "transport/ucx_engine.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace kvpool::transport {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

UcxOptions LoopbackTcp() {
  UcxOptions o;
  o.transports = "tcp";
  o.net_devices = "lo";
  return o;
}

std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    v[i] = static_cast<uint8_t>(x);
  }
  return v;
}

// ---- child process ---------------------------------------------------------------------------
// Exchanges addresses with the parent over stdin/stdout (u32 length + bytes), then:
//   "sink":    connects, never receives, idles until killed (a receiver that dies).
//   "stream":  connects, sends 64 MiB messages tagged 7 in a loop until killed (a sender that
//   dies).
bool WriteAll(int fd, const void* p, size_t n) {
  auto* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = write(fd, c, n);
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}
bool ReadAll(int fd, void* p, size_t n) {
  auto* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = read(fd, c, n);
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}
bool SendAddress(int fd, const std::string& a) {
  uint32_t n = static_cast<uint32_t>(a.size());
  return WriteAll(fd, &n, 4) && WriteAll(fd, a.data(), n);
}
bool ReceiveAddress(int fd, std::string* a) {
  uint32_t n = 0;
  if (!ReadAll(fd, &n, 4) || n > (1u << 20)) return false;
  a->resize(n);
  return ReadAll(fd, a->data(), n);
}

constexpr size_t kStreamSize = 64u << 20;
constexpr uint64_t kStreamTag = 7;

[[noreturn]] void ChildMain(const std::string& mode) {
  auto engine = UcxEngine::Create(LoopbackTcp());
  if (!engine.ok()) _exit(10);
  if (!SendAddress(1, (*engine)->WorkerAddress())) _exit(11);
  std::string parent;
  if (!ReceiveAddress(0, &parent)) _exit(12);
  auto ep = (*engine)->Connect(parent);
  if (!ep.ok()) _exit(13);
  if (mode == "stream") {
    std::vector<uint8_t> data = Pattern(kStreamSize, 99);
    while (true) {
      Status st = (*engine)->SendTaggedSync(*ep, kStreamTag, data.data(), data.size(),
                                            Clock::now() + seconds(30));
      if (!st.ok()) _exit(14);
    }
  }
  // "sink": say hello so the parent's endpoint is wired up, then idle.
  uint8_t hello = 1;
  if (!(*engine)->SendTaggedSync(*ep, 1, &hello, 1, Clock::now() + seconds(10)).ok()) _exit(15);
  while (true) pause();
}

// Runs before main(): a re-executed child never reaches GoogleTest.
const bool kChildDispatch = [] {
  const char* mode = getenv("KVPOOL_UCX_TEST_CHILD");
  if (mode != nullptr) ChildMain(mode);
  return true;
}();

struct Child {
  pid_t pid = -1;
  int to_child = -1;
  int from_child = -1;
  ~Child() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    if (to_child >= 0) close(to_child);
    if (from_child >= 0) close(from_child);
  }
  void Kill() {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    pid = -1;
  }
};

// Starts this binary as a child in `mode`, exchanges addresses with `engine`, returns the
// parent's endpoint to the child.
void SpawnChild(const std::string& mode, UcxEngine& engine, Child* child, UcxEndpointId* ep) {
  int in[2], out[2];
  ASSERT_EQ(pipe(in), 0);
  ASSERT_EQ(pipe(out), 0);
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  ASSERT_GT(n, 0);
  exe[n] = 0;
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    close(in[1]);
    close(out[0]);
    setenv("KVPOOL_UCX_TEST_CHILD", mode.c_str(), 1);
    execl(exe, exe, static_cast<char*>(nullptr));
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  child->pid = pid;
  child->to_child = in[1];
  child->from_child = out[0];
  std::string child_address;
  ASSERT_TRUE(ReceiveAddress(child->from_child, &child_address)) << "child failed to start";
  ASSERT_TRUE(SendAddress(child->to_child, engine.WorkerAddress()));
  auto r = engine.Connect(child_address);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  *ep = *r;
}

// ---- in-process pair ---------------------------------------------------------------------------

class UcxEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto a = UcxEngine::Create(LoopbackTcp());
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    auto b = UcxEngine::Create(LoopbackTcp());
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    a_ = std::move(*a);
    b_ = std::move(*b);
    auto ep = a_->Connect(b_->WorkerAddress());
    ASSERT_TRUE(ep.ok()) << ep.status().ToString();
    a_to_b_ = *ep;
  }

  void TearDown() override { StopEngines(); }
  // Joins both progress threads: after this no callback runs.
  void StopEngines() {
    a_.reset();
    b_.reset();
  }

  std::unique_ptr<UcxEngine> a_, b_;
  UcxEndpointId a_to_b_ = 0;
};

TEST_F(UcxEngineTest, ReportsLoopbackTcpOnly) {
  EXPECT_EQ(a_->transports_in_use(), "tcp/lo");
  EXPECT_EQ(a_->bulk_op(), UcxEngine::BulkOp::kTagged);
  EXPECT_FALSE(a_->WorkerAddress().empty());
  uint8_t x = 5, y = 0;
  ASSERT_TRUE(a_->SendTaggedSync(a_to_b_, 1, &x, 1, Clock::now() + seconds(10)).ok());
  ASSERT_TRUE(b_->ReceiveTaggedSync(1, &y, 1, Clock::now() + seconds(10)).ok());
  auto tls = a_->EndpointTransports(a_to_b_);
  ASSERT_TRUE(tls.ok()) << tls.status().ToString();
  EXPECT_EQ(*tls, "tcp/lo");
}

TEST_F(UcxEngineTest, TransfersAreByteIdenticalAtEverySize) {
  const size_t sizes[] = {0, 1, 4095, 4096, 4097, 1u << 20, (64u << 20) + 3};
  uint64_t tag = 100;
  for (size_t size : sizes) {
    SCOPED_TRACE(size);
    std::vector<uint8_t> src = Pattern(size, static_cast<uint32_t>(size));
    std::vector<uint8_t> dst(size + 16, 0xEE);
    // The receive is posted first (expected path).
    Result<size_t> got = Status::Internal("unset");
    std::thread rx([&] {
      got = b_->ReceiveTaggedSync(tag, dst.data(), dst.size(), Clock::now() + seconds(20));
    });
    std::this_thread::sleep_for(milliseconds(20));
    Status sent =
        a_->SendTaggedSync(a_to_b_, tag, src.data(), src.size(), Clock::now() + seconds(20));
    rx.join();
    ASSERT_TRUE(sent.ok()) << sent.ToString();
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_EQ(*got, size);
    if (size > 0)
      ASSERT_EQ(0, memcmp(src.data(), dst.data(), size));  // (0: src.data() may be null)
    ASSERT_EQ(dst[size], 0xEE) << "wrote past the message";
    ++tag;
  }
}

TEST_F(UcxEngineTest, MessageSentBeforeTheReceiveIsPostedArrives) {
  // Eager (4 KiB) and rendezvous (8 MiB) sizes, sent with no receive posted.
  for (size_t size : {size_t{4096}, size_t{8u << 20}}) {
    SCOPED_TRACE(size);
    std::vector<uint8_t> src = Pattern(size, 7);
    std::vector<uint8_t> dst(size);
    std::atomic<bool> sent{false};
    Status send_status;
    a_->SendTagged(a_to_b_, 55, src.data(), size, [&](Status st) {
      send_status = st;
      sent = true;
    });
    std::this_thread::sleep_for(milliseconds(100));  // the message reaches b_ unexpected
    auto got = b_->ReceiveTaggedSync(55, dst.data(), dst.size(), Clock::now() + seconds(20));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, size);
    EXPECT_EQ(0, memcmp(src.data(), dst.data(), size));
    auto until = Clock::now() + seconds(10);
    while (!sent && Clock::now() < until) std::this_thread::sleep_for(milliseconds(1));
    ASSERT_TRUE(sent);
    EXPECT_TRUE(send_status.ok()) << send_status.ToString();
  }
}

TEST_F(UcxEngineTest, ManyConcurrentTransfersEachMatchTheirTag) {
  constexpr int kCount = 64;
  constexpr size_t kSize = 300 * 1024;
  std::vector<std::vector<uint8_t>> src, dst;
  for (int i = 0; i < kCount; ++i) {
    src.push_back(Pattern(kSize + i, i));
    dst.emplace_back(kSize + kCount);
  }
  absl::Mutex mu;
  int sends_ok = 0, recvs_ok = 0, done = 0;
  // Receives for even tags posted before, odd ones after, the sends.
  auto post_recv = [&](int i) {
    b_->ReceiveTagged(1000 + i, dst[i].data(), dst[i].size(), [&, i](Status st, size_t n) {
      absl::MutexLock l(&mu);
      if (st.ok() && n == kSize + i && memcmp(src[i].data(), dst[i].data(), n) == 0) ++recvs_ok;
      ++done;
    });
  };
  for (int i = 0; i < kCount; i += 2) post_recv(i);
  for (int i = kCount - 1; i >= 0; --i) {
    a_->SendTagged(a_to_b_, 1000 + i, src[i].data(), src[i].size(), [&](Status st) {
      absl::MutexLock l(&mu);
      if (st.ok()) ++sends_ok;
      ++done;
    });
  }
  for (int i = 1; i < kCount; i += 2) post_recv(i);
  absl::MutexLock l(&mu);
  auto all_done = [&] { return done == 2 * kCount; };
  ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&all_done), absl::Seconds(30)));
  EXPECT_EQ(sends_ok, kCount);
  EXPECT_EQ(recvs_ok, kCount);
  mu.Unlock();
  StopEngines();
  mu.Lock();
}

TEST_F(UcxEngineTest, MessageLongerThanTheBufferIsAnError) {
  std::vector<uint8_t> src = Pattern(100, 1), dst(50);
  ASSERT_TRUE(
      a_->SendTaggedSync(a_to_b_, 9, src.data(), src.size(), Clock::now() + seconds(10)).ok());
  auto got = b_->ReceiveTaggedSync(9, dst.data(), dst.size(), Clock::now() + seconds(10));
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kResourceExhausted) << got.status().ToString();
}

TEST_F(UcxEngineTest, ReceiveWithNothingSentMeetsItsDeadline) {
  uint8_t buf[8];
  auto start = Clock::now();
  auto got = b_->ReceiveTaggedSync(12345, buf, sizeof(buf), start + milliseconds(200));
  auto took = Clock::now() - start;
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kDeadlineExceeded) << got.status().ToString();
  EXPECT_LT(took, seconds(2));
  // The cancelled receive is gone: a later message with that tag goes to the next receive.
  uint8_t x = 42, y = 0;
  ASSERT_TRUE(a_->SendTaggedSync(a_to_b_, 12345, &x, 1, Clock::now() + seconds(10)).ok());
  auto again = b_->ReceiveTaggedSync(12345, &y, 1, Clock::now() + seconds(10));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(y, 42);
}

TEST_F(UcxEngineTest, LargeSendNobodyReceivesMeetsItsDeadlineAndBreaksTheEndpoint) {
  std::vector<uint8_t> src(16u << 20, 1);
  auto start = Clock::now();
  Status st = a_->SendTaggedSync(a_to_b_, 77, src.data(), src.size(), start + milliseconds(300));
  EXPECT_LT(Clock::now() - start, seconds(3));
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.ToString();
  uint8_t x = 1;
  Status after = a_->SendTaggedSync(a_to_b_, 78, &x, 1, Clock::now() + seconds(5));
  EXPECT_EQ(after.code(), StatusCode::kUnavailable) << after.ToString();
  // Reconnecting gives a working endpoint again.
  a_->Disconnect(a_to_b_);
  auto ep = a_->Connect(b_->WorkerAddress());
  ASSERT_TRUE(ep.ok());
  ASSERT_TRUE(a_->SendTaggedSync(*ep, 79, &x, 1, Clock::now() + seconds(10)).ok());
  uint8_t y = 0;
  ASSERT_TRUE(b_->ReceiveTaggedSync(79, &y, 1, Clock::now() + seconds(10)).ok());
}

TEST_F(UcxEngineTest, AnAsynchronousSendNobodyReceivesEndsAtItsDeadlineByItself) {
  // A daemon's UCX send of a block holds its lease until the send ends: with a deadline it ends
  // even if nobody ever cancels it (issue 12, hole 5: an idle connection's send never did).
  std::vector<uint8_t> src(16u << 20, 1);
  absl::Notification done;
  Status result;
  a_->SendTagged(
      a_to_b_, 91, src.data(), src.size(),
      [&](Status st) {
        result = st;
        done.Notify();
      },
      Clock::now() + milliseconds(300));
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)))
      << "the send outlived its deadline";
  EXPECT_EQ(result.code(), StatusCode::kAborted) << result.ToString();
}

TEST_F(UcxEngineTest, UnknownEndpointIsNotFound) {
  uint8_t x = 0;
  EXPECT_EQ(a_->SendTaggedSync(999, 1, &x, 1, Clock::now() + seconds(5)).code(),
            StatusCode::kNotFound);
  EXPECT_EQ(a_->EndpointTransports(999).status().code(), StatusCode::kNotFound);
}

TEST_F(UcxEngineTest, GarbageAddressIsAnErrorNotACrash) {
  auto ep = a_->Connect(std::string("\x01\x02garbage", 9));
  EXPECT_FALSE(ep.ok());
}

TEST_F(UcxEngineTest, AListenerAcceptsAnEndpointThatCarriesMessagesBothWays) {
  absl::Mutex mu;
  std::vector<UcxEndpointId> accepted;
  std::vector<std::string> asked_from;
  std::vector<uint64_t> client_ids;
  auto port = b_->Listen(
      "127.0.0.1", 0,
      [&](const std::string& ip, const UcxEngine::ClientIdOf& client_id) {
        absl::MutexLock lock(&mu);
        asked_from.push_back(ip);
        client_ids.push_back(client_id());
        return true;
      },
      [&](UcxEndpointId ep, const std::string&) {
        absl::MutexLock lock(&mu);
        accepted.push_back(ep);
      });
  ASSERT_TRUE(port.ok()) << port.status().ToString();
  EXPECT_NE(*port, 0);
  EXPECT_EQ(b_->Listen(
                  "127.0.0.1", 0, [](const std::string&, const auto&) { return true; },
                  [](UcxEndpointId, const std::string&) {})
                .status()
                .code(),
            StatusCode::kFailedPrecondition);

  auto to_b = a_->ConnectTo("127.0.0.1", *port);
  ASSERT_TRUE(to_b.ok()) << to_b.status().ToString();
  const std::vector<uint8_t> there = Pattern(100000, 1), back = Pattern(5000, 2);
  std::vector<uint8_t> got_there(there.size()), got_back(back.size());
  // The receive is posted first: a large send may wait for its receiver (rendezvous).
  absl::Notification received;
  Status receive_status;
  size_t receive_length = 0;
  b_->ReceiveTagged(41, got_there.data(), got_there.size(), [&](Status st, size_t n) {
    receive_status = st;
    receive_length = n;
    received.Notify();
  });
  ASSERT_TRUE(
      a_->SendTaggedSync(*to_b, 41, there.data(), there.size(), Clock::now() + seconds(10)).ok());
  ASSERT_TRUE(received.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(receive_status.ok()) << receive_status.ToString();
  EXPECT_EQ(receive_length, there.size());
  EXPECT_EQ(got_there, there);

  UcxEndpointId to_a = 0;
  {
    absl::MutexLock lock(&mu);
    ASSERT_EQ(accepted.size(), 1u);
    to_a = accepted[0];
    EXPECT_EQ(asked_from, std::vector<std::string>{"127.0.0.1"});
    // The request carries the connecting engine's client id: random, its own.
    EXPECT_NE(a_->client_id(), 0u);
    EXPECT_NE(a_->client_id(), b_->client_id());
    EXPECT_EQ(client_ids, std::vector<uint64_t>{a_->client_id()});
  }
  absl::Notification received_back;
  Status back_status;
  a_->ReceiveTagged(42, got_back.data(), got_back.size(), [&](Status st, size_t) {
    back_status = st;
    received_back.Notify();
  });
  ASSERT_TRUE(
      b_->SendTaggedSync(to_a, 42, back.data(), back.size(), Clock::now() + seconds(10)).ok());
  ASSERT_TRUE(received_back.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(back_status.ok()) << back_status.ToString();
  EXPECT_EQ(got_back, back);
  a_->Disconnect(*to_b);
  b_->Disconnect(to_a);
}

TEST(UcxEngineCreateTest, TheTcpPortRangeIsUcxsAndABadOneIsRefused) {
  if (std::getenv("UCX_TCP_PORT_RANGE") != nullptr) GTEST_SKIP() << "$UCX_TCP_PORT_RANGE decides";
  UcxOptions o = LoopbackTcp();
  for (const char* bad : {"not-a-range", "9-8", "1-70000", "10-20x"}) {
    o.tcp_port_range = bad;
    EXPECT_EQ(UcxEngine::Create(o).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  o.tcp_port_range = "20000-60000";
  auto a = UcxEngine::Create(o);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = UcxEngine::Create(o);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  auto ep = (*a)->Connect((*b)->WorkerAddress());
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  uint8_t x = 9, y = 0;
  absl::Notification got;
  (*b)->ReceiveTagged(3, &y, 1, [&](Status, size_t) { got.Notify(); });
  ASSERT_TRUE((*a)->SendTaggedSync(*ep, 3, &x, 1, Clock::now() + seconds(10)).ok());
  ASSERT_TRUE(got.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(y, 9);
}

TEST_F(UcxEngineTest, ConnectingToAHostThatDoesNotResolveIsAnError) {
  EXPECT_EQ(a_->ConnectTo("no-such-host.invalid", 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a_->Listen(
                  "not-an-address.invalid", 0, [](const std::string&, const auto&) { return true; },
                  [](UcxEndpointId, const std::string&) {})
                .status()
                .code(),
            StatusCode::kInvalidArgument);
}

TEST_F(UcxEngineTest, StreamBytesArriveOnlyAtTheirOwnEndpoint) {
  absl::Mutex mu;
  std::vector<UcxEndpointId> accepted;
  auto port = b_->Listen(
      "127.0.0.1", 0, [](const std::string&, const auto&) { return true; },
      [&](UcxEndpointId ep, const std::string&) {
        absl::MutexLock lock(&mu);
        accepted.push_back(ep);
      });
  ASSERT_TRUE(port.ok()) << port.status().ToString();
  // Two endpoints from a_ to b_, one at a time so that b_'s ends are known.
  std::vector<UcxEndpointId> from_a, from_b;
  for (int i = 0; i < 2; ++i) {
    auto ep = a_->ConnectTo("127.0.0.1", *port);
    ASSERT_TRUE(ep.ok()) << ep.status().ToString();
    from_a.push_back(*ep);
    // Accepted once a_'s wire-up reaches b_: a first message makes it happen.
    ASSERT_TRUE(a_->SendStream(*ep, "x", 1, [](Status) {}) != 0);
    absl::MutexLock lock(&mu);
    auto two = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return accepted.size() == from_a.size(); };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&two), absl::Seconds(10)));
    from_b.push_back(accepted.back());
  }
  char x = 0;
  for (UcxEndpointId ep : from_b) {
    auto got = b_->ReceiveStreamSync(ep, &x, 1, Clock::now() + seconds(10));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, 1u);
    EXPECT_EQ(x, 'x');
  }
  b_->SendStream(from_b[1], "second", 6, [](Status) {});
  b_->SendStream(from_b[0], "first!", 6, [](Status) {});
  // Received after the bytes are there: UCX completes such a receive at once, and its length
  // must still be the bytes' (it was taken as 0 once, and the bind nonce refused).
  std::this_thread::sleep_for(milliseconds(200));
  std::string got0(6, '\0'), got1(6, '\0');
  auto n = a_->ReceiveStreamSync(from_a[1], got1.data(), got1.size(), Clock::now() + seconds(10));
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, 6u);
  n = a_->ReceiveStreamSync(from_a[0], got0.data(), got0.size(), Clock::now() + seconds(10));
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, 6u);
  EXPECT_EQ(got0, "first!");
  EXPECT_EQ(got1, "second");
  // Nothing comes on an endpoint nobody writes to: the deadline ends the wait.
  n = a_->ReceiveStreamSync(from_a[0], got0.data(), 1, Clock::now() + milliseconds(200));
  EXPECT_EQ(n.status().code(), StatusCode::kDeadlineExceeded) << n.status().ToString();
}

TEST_F(UcxEngineTest, ARefusedRequestFailsTheReceivesThatWaitForItsEndpoint) {
  std::atomic<int> accepted{0};
  auto port = b_->Listen(
      "127.0.0.1", 0, [](const std::string&, const auto&) { return false; },
      [&](UcxEndpointId, const std::string&) { ++accepted; });
  ASSERT_TRUE(port.ok()) << port.status().ToString();
  auto to_b = a_->ConnectTo("127.0.0.1", *port);
  ASSERT_TRUE(to_b.ok()) << to_b.status().ToString();
  // A receive that names the endpoint ends when the endpoint fails, long before its deadline.
  uint8_t x = 0;
  auto got = a_->ReceiveTaggedSync(7, &x, 1, Clock::now() + seconds(60), *to_b);
  EXPECT_EQ(got.status().code(), StatusCode::kUnavailable) << got.status().ToString();
  EXPECT_EQ(accepted.load(), 0);
  // And so does one posted after it failed.
  got = a_->ReceiveTaggedSync(8, &x, 1, Clock::now() + seconds(60), *to_b);
  EXPECT_FALSE(got.ok());
  EXPECT_NE(got.status().code(), StatusCode::kDeadlineExceeded) << got.status().ToString();
  // A listener stopped refuses too; one can listen again.
  b_->StopListening();
  auto again = b_->Listen(
      "127.0.0.1", 0, [](const std::string&, const auto&) { return true; },
      [&](UcxEndpointId, const std::string&) { ++accepted; });
  EXPECT_TRUE(again.ok()) << again.status().ToString();
}

TEST_F(UcxEngineTest, DestroyingTheEngineAbortsOutstandingOperations) {
  std::vector<uint8_t> big(8u << 20, 3), buf(4096);
  absl::Mutex mu;
  std::vector<Status> results;
  auto record = [&](Status st) {
    absl::MutexLock l(&mu);
    results.push_back(std::move(st));
  };
  for (int i = 0; i < 8; ++i) {
    a_->ReceiveTagged(5000 + i, buf.data(), buf.size(), [&](Status st, size_t) { record(st); });
  }
  a_->SendTagged(a_to_b_, 6000, big.data(), big.size(), record);  // b_ never receives it
  a_->SendTagged(a_to_b_, 6001, big.data(), big.size(), record);
  std::this_thread::sleep_for(milliseconds(50));
  auto start = Clock::now();
  a_.reset();
  EXPECT_LT(Clock::now() - start, seconds(5));
  absl::MutexLock l(&mu);
  ASSERT_EQ(results.size(), 10u);
  for (const Status& st : results) EXPECT_EQ(st.code(), StatusCode::kAborted) << st.ToString();
}

TEST(UcxEngineCreateTest, TransportNotPresentIsUnavailable) {
  UcxOptions o = LoopbackTcp();
  o.transports = "rc_mlx5";  // no InfiniBand device in a test environment
  auto engine = UcxEngine::Create(o);
  if (engine.ok()) GTEST_SKIP() << "this machine has rc_mlx5";
  EXPECT_EQ(engine.status().code(), StatusCode::kUnavailable) << engine.status().ToString();
}

// ---- a peer in another process that is killed ---------------------------------------------------

TEST(UcxEngineChildTest, SendToAKilledReceiverFailsWithoutHanging) {
  auto engine = UcxEngine::Create(LoopbackTcp());
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  Child child;
  UcxEndpointId ep = 0;
  ASSERT_NO_FATAL_FAILURE(SpawnChild("sink", **engine, &child, &ep));
  uint8_t hello = 0;
  ASSERT_TRUE((*engine)->ReceiveTaggedSync(1, &hello, 1, Clock::now() + seconds(10)).ok());

  std::vector<uint8_t> big(32u << 20, 9);
  absl::Mutex mu;
  bool done = false;
  Status result;
  (*engine)->SendTagged(ep, 2, big.data(), big.size(), [&](Status st) {
    absl::MutexLock l(&mu);
    result = std::move(st);
    done = true;
  });
  std::this_thread::sleep_for(milliseconds(100));  // rendezvous: waits for a receive never posted
  auto killed_at = Clock::now();
  child.Kill();
  {
    absl::MutexLock l(&mu);
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(10)))
        << "send to a dead peer hung";
    EXPECT_EQ(result.code(), StatusCode::kUnavailable) << result.ToString();
    printf("send failed %.0f ms after the peer was killed: %s\n",
           std::chrono::duration<double, std::milli>(Clock::now() - killed_at).count(),
           result.ToString().c_str());
  }
  // Later sends on the dead endpoint fail at once.
  Status after = (*engine)->SendTaggedSync(ep, 3, &hello, 1, Clock::now() + seconds(5));
  EXPECT_FALSE(after.ok());
}

TEST(UcxEngineChildTest, ReceiveFromASenderKilledMidStreamIsNeverPartialSuccess) {
  auto engine = UcxEngine::Create(LoopbackTcp());
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  Child child;
  UcxEndpointId ep = 0;
  ASSERT_NO_FATAL_FAILURE(SpawnChild("stream", **engine, &child, &ep));
  const std::vector<uint8_t> expect = Pattern(kStreamSize, 99);
  std::vector<uint8_t> buf(kStreamSize);
  // One whole message first: the stream works.
  auto first =
      (*engine)->ReceiveTaggedSync(kStreamTag, buf.data(), buf.size(), Clock::now() + seconds(20));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_EQ(*first, kStreamSize);
  ASSERT_EQ(0, memcmp(buf.data(), expect.data(), kStreamSize));
  // Then kill the sender while the next message is (most likely) in flight.
  memset(buf.data(), 0, buf.size());
  absl::Mutex mu;
  bool done = false;
  Status st;
  size_t received = 0;
  (*engine)->ReceiveTagged(kStreamTag, buf.data(), buf.size(), [&](Status s, size_t n) {
    absl::MutexLock l(&mu);
    st = std::move(s);
    received = n;
    done = true;
  });
  std::this_thread::sleep_for(milliseconds(5));
  child.Kill();
  absl::MutexLock l(&mu);
  ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(15)))
      << "receive from a killed sender hung";  // keepalive 2 s bounds an unmatched-by-death case
  if (st.ok()) {  // it finished before the kill: then it must be whole and exact
    EXPECT_EQ(received, kStreamSize);
    EXPECT_EQ(0, memcmp(buf.data(), expect.data(), kStreamSize));
    printf("message completed before the kill (whole and exact)\n");
  } else {
    EXPECT_EQ(received, 0u);
    printf("receive failed after the sender was killed: %s\n", st.ToString().c_str());
  }
}

// A sender stopped (SIGSTOP) mid-message: no error reaches UCX, and UCX 1.13 cannot withdraw a
// receive under way. A receive that names its sender has that endpoint closed a grace after its
// cancel, which ends it; the buffer is the caller's again.
TEST(UcxEngineChildTest, ACancelledReceiveFromAStoppedSenderEndsAfterTheGrace) {
  UcxOptions o = LoopbackTcp();
  o.cancel_grace = milliseconds(200);
  auto engine = UcxEngine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  Child child;
  UcxEndpointId ep = 0;
  ASSERT_NO_FATAL_FAILURE(SpawnChild("stream", **engine, &child, &ep));
  std::vector<uint8_t> buf(kStreamSize);
  auto first = (*engine)->ReceiveTaggedSync(kStreamTag, buf.data(), buf.size(),
                                            Clock::now() + seconds(20), ep);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  absl::Mutex mu;
  bool done = false;
  Status st;
  const UcxOpId op = (*engine)->ReceiveTagged(
      kStreamTag, buf.data(), buf.size(),
      [&](Status s, size_t) {
        absl::MutexLock l(&mu);
        st = std::move(s);
        done = true;
      },
      ep);
  std::this_thread::sleep_for(milliseconds(20));  // the next message is (most likely) under way
  kill(child.pid, SIGSTOP);
  (*engine)->Cancel(op);
  {
    absl::MutexLock l(&mu);
    // A hang check: before the close it waited for as long as the sender stayed stopped.
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(15)))
        << "a cancelled receive from a stopped sender did not end";
    printf("cancelled receive from a stopped sender: %s\n", st.ToString().c_str());
    EXPECT_TRUE(st.ok() || st.code() == StatusCode::kAborted) << st.ToString();
  }
  kill(child.pid, SIGCONT);
}

// ---- throughput (printed, not asserted) ---------------------------------------------------------

TEST_F(UcxEngineTest, ThroughputOneMiBMessages) {
  constexpr size_t kSize = 1u << 20;
  constexpr int kMessages = 400;
  constexpr int kWindow = 8;
  std::vector<std::vector<uint8_t>> src(kWindow, Pattern(kSize, 3)),
      dst(kWindow, std::vector<uint8_t>(kSize));
  absl::Mutex mu;
  int recvd = 0, sent = 0, failures = 0;
  auto start = Clock::now();
  std::function<void(int)> post;
  // Each slot: post a receive and a send; on receive completion, repost until done.
  int next = 0;
  post = [&](int slot) {
    int seq;
    {
      absl::MutexLock l(&mu);
      if (next >= kMessages) return;
      seq = next++;
    }
    uint64_t tag = 1u << 20 | static_cast<uint64_t>(seq);
    b_->ReceiveTagged(tag, dst[slot].data(), kSize, [&, slot](Status st, size_t) {
      post(slot);  // before counting: once the count is full the test may leave
      absl::MutexLock l(&mu);
      ++recvd;
      if (!st.ok()) ++failures;
    });
    a_->SendTagged(a_to_b_, tag, src[slot].data(), kSize, [&](Status st) {
      absl::MutexLock l(&mu);
      ++sent;
      if (!st.ok()) ++failures;
    });
  };
  for (int s = 0; s < kWindow; ++s) post(s);
  absl::MutexLock l(&mu);
  auto all = [&] { return recvd == kMessages && sent == kMessages; };
  ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&all), absl::Seconds(60)));
  double secs = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_EQ(failures, 0);
  printf(
      "UcxEngine tagged, 1 MiB messages, window %d, UCX_TLS=tcp lo, two engines in one "
      "process: %.2f GB/s (%d messages in %.3f s)\n",
      kWindow, kMessages * double(kSize) / secs / 1e9, kMessages, secs);
  mu.Unlock();
  StopEngines();  // no callback may run once this frame's state is gone
  mu.Lock();
}

}  // namespace
}  // namespace kvpool::transport
