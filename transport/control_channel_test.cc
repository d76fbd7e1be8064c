// ControlChannel's receive, against a Unix-socket peer the test drives by hand: with and
// without busy polling, a frame sent in pieces with pauses arrives whole, descriptors sent with
// it are taken, a peer that never answers ends in DeadlineExceeded (within the deadline, not
// the spin window) and one that hangs up in Unavailable, both leaving the channel broken.

#include "transport/control_channel.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "control.pb.h"
#include "tests/support/status_matchers.h"
#include "tests/support/temp_dir.h"

namespace kvpool::transport {
namespace {

using namespace std::chrono_literals;

// A listening Unix socket; Accept returns the peer of the channel that connected.
class Listener {
 public:
  explicit Listener(std::string path) : path_(std::move(path)) {
    fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un un{};
    un.sun_family = AF_UNIX;
    std::strncpy(un.sun_path, path_.c_str(), sizeof(un.sun_path) - 1);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&un), sizeof(un)), 0);
    EXPECT_EQ(listen(fd_, 4), 0);
  }
  ~Listener() { close(fd_); }
  int Accept() const { return accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

// A response frame of `body_bytes` bytes, header included.
std::vector<uint8_t> ResponseFrame(uint64_t request_id, size_t body_bytes) {
  FrameHeader h;
  h.type = wire::GET;
  h.flags = kFlagResponse;
  h.request_id = request_id;
  h.body_bytes = static_cast<uint32_t>(body_bytes);
  std::vector<uint8_t> frame(kFrameHeaderBytes + body_bytes);
  EncodeFrameHeader(h, frame.data());
  for (size_t i = 0; i < body_bytes; ++i) {
    frame[kFrameHeaderBytes + i] = static_cast<uint8_t>(i * 7 + request_id);
  }
  return frame;
}

class ControlChannelTest : public ::testing::TestWithParam<std::chrono::microseconds> {
 protected:
  std::unique_ptr<ControlChannel> Connect() {
    Result<std::unique_ptr<ControlChannel>> ch = ControlChannel::Connect(listener_.path(), 5s);
    EXPECT_OK(ch.status());
    if (!ch.ok()) return nullptr;
    (*ch)->set_busy_poll(GetParam());
    return std::move(*ch);
  }

  kvpool::testing::TempDir dir_{"kvpool-channel"};
  Listener listener_{dir_.Join("s.sock")};
};

TEST_P(ControlChannelTest, AFrameSentInPiecesWithPausesArrivesWhole) {
  std::unique_ptr<ControlChannel> ch = Connect();
  ASSERT_NE(ch, nullptr);
  const int peer = listener_.Accept();
  ASSERT_GE(peer, 0);
  for (uint64_t id = 1; id <= 3; ++id) {
    // The header and the body's first bytes in pieces of 5, each after a pause longer or
    // shorter than the spin window; then the rest at once.
    const std::vector<uint8_t> frame = ResponseFrame(id, 1000 * id);
    std::thread sender([&] {
      constexpr size_t kPieces = 8;
      for (size_t i = 0; i < kPieces; ++i) {
        std::this_thread::sleep_for(i % 2 == 0 ? 2ms : 10us);
        ASSERT_EQ(send(peer, frame.data() + 5 * i, 5, MSG_NOSIGNAL), 5);
      }
      const size_t rest = frame.size() - 5 * kPieces;
      ASSERT_EQ(send(peer, frame.data() + 5 * kPieces, rest, MSG_NOSIGNAL),
                static_cast<ssize_t>(rest));
    });
    const Deadline deadline = std::chrono::steady_clock::now() + 10s;
    Result<FrameHeader> h = ch->ReceiveHeader(FrameLimits{}, deadline);
    ASSERT_OK(h.status());
    EXPECT_EQ(h->request_id, id);
    std::vector<uint8_t> body(h->body_bytes);
    ASSERT_OK(ch->ReceiveInto(body.data(), body.size(), deadline));
    sender.join();
    EXPECT_EQ(body, std::vector<uint8_t>(frame.begin() + kFrameHeaderBytes, frame.end()));
  }
  close(peer);
}

TEST_P(ControlChannelTest, DescriptorsSentWithAFrameAreTaken) {
  std::unique_ptr<ControlChannel> ch = Connect();
  ASSERT_NE(ch, nullptr);
  const int peer = listener_.Accept();
  ASSERT_GE(peer, 0);
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  std::vector<uint8_t> frame = ResponseFrame(9, 64);
  std::thread sender([&] {
    std::this_thread::sleep_for(1ms);  // the channel is already spinning or waiting
    iovec iov{frame.data(), frame.size()};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &pipe_fds[1], sizeof(int));
    ASSERT_EQ(sendmsg(peer, &msg, MSG_NOSIGNAL), static_cast<ssize_t>(frame.size()));
  });
  const Deadline deadline = std::chrono::steady_clock::now() + 10s;
  Result<FrameHeader> h = ch->ReceiveHeader(FrameLimits{}, deadline);
  sender.join();
  ASSERT_OK(h.status());
  std::vector<uint8_t> body(h->body_bytes);
  ASSERT_OK(ch->ReceiveInto(body.data(), body.size(), deadline));
  std::vector<int> fds = ch->TakeReceivedFds();
  ASSERT_EQ(fds.size(), 1u);
  // The descriptor is the pipe's write end: what goes through it comes out of the read end.
  const char byte = 'k';
  ASSERT_EQ(write(fds[0], &byte, 1), 1);
  char got = 0;
  ASSERT_EQ(read(pipe_fds[0], &got, 1), 1);
  EXPECT_EQ(got, 'k');
  for (int fd : {fds[0], pipe_fds[0], pipe_fds[1], peer}) close(fd);
}

TEST_P(ControlChannelTest, APeerThatNeverAnswersEndsAtTheDeadline) {
  std::unique_ptr<ControlChannel> ch = Connect();
  ASSERT_NE(ch, nullptr);
  const int peer = listener_.Accept();
  ASSERT_GE(peer, 0);
  // Half a header, then nothing: the deadline ends the wait, spinning or not.
  const std::vector<uint8_t> frame = ResponseFrame(1, 0);
  ASSERT_EQ(send(peer, frame.data(), 10, MSG_NOSIGNAL), 10);
  const auto start = std::chrono::steady_clock::now();
  Result<FrameHeader> h = ch->ReceiveHeader(FrameLimits{}, start + 100ms);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(h.status().code(), StatusCode::kDeadlineExceeded) << h.status().ToString();
  EXPECT_GE(took, 100ms);
  EXPECT_LT(took, 5s);  // bounded by the deadline, not by anything else
  EXPECT_TRUE(ch->broken());
  close(peer);
}

TEST_P(ControlChannelTest, APeerThatHangsUpMidFrameIsUnavailable) {
  std::unique_ptr<ControlChannel> ch = Connect();
  ASSERT_NE(ch, nullptr);
  const int peer = listener_.Accept();
  ASSERT_GE(peer, 0);
  const std::vector<uint8_t> frame = ResponseFrame(1, 100);
  ASSERT_EQ(send(peer, frame.data(), kFrameHeaderBytes + 10, MSG_NOSIGNAL),
            static_cast<ssize_t>(kFrameHeaderBytes + 10));
  std::thread closer([peer] {
    std::this_thread::sleep_for(5ms);
    close(peer);
  });
  const Deadline deadline = std::chrono::steady_clock::now() + 10s;
  Result<FrameHeader> h = ch->ReceiveHeader(FrameLimits{}, deadline);
  ASSERT_OK(h.status());
  std::vector<uint8_t> body(h->body_bytes);
  const Status st = ch->ReceiveInto(body.data(), body.size(), deadline);
  closer.join();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_TRUE(ch->broken());
}

// A tcp:// channel knows the numeric address it reached (a client's UCX endpoint dials that, not
// the name again); a Unix-socket channel has none.
TEST(ControlChannelAddressTest, ATcpChannelKnowsTheAddressItReached) {
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&in), sizeof(in)), 0);
  ASSERT_EQ(listen(listener, 4), 0);
  socklen_t len = sizeof(in);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&in), &len), 0);
  const std::string port = std::to_string(ntohs(in.sin_port));
  // "localhost" is a name: the channel reports the address it resolved to and reached.
  Result<std::unique_ptr<ControlChannel>> by_name =
      ControlChannel::Connect("tcp://localhost:" + port, 5s);
  if (by_name.ok()) {
    EXPECT_EQ((*by_name)->peer_ip(), "127.0.0.1");
  } else {
    // (Where "localhost" resolves to ::1 first, nothing listens there.)
    EXPECT_EQ(by_name.status().code(), StatusCode::kUnavailable) << by_name.status().ToString();
  }
  Result<std::unique_ptr<ControlChannel>> by_ip =
      ControlChannel::Connect("tcp://127.0.0.1:" + port, 5s);
  ASSERT_OK(by_ip.status());
  EXPECT_EQ((*by_ip)->peer_ip(), "127.0.0.1");
  close(listener);

  kvpool::testing::TempDir dir("kvpool-channel");
  Listener unix_listener(dir.Join("s.sock"));
  Result<std::unique_ptr<ControlChannel>> local = ControlChannel::Connect(unix_listener.path(), 5s);
  ASSERT_OK(local.status());
  EXPECT_EQ((*local)->peer_ip(), "");
}

INSTANTIATE_TEST_SUITE_P(BlockingAndBusyPolling, ControlChannelTest,
                         ::testing::Values(0us, 50us, 20ms),
                         [](const ::testing::TestParamInfo<std::chrono::microseconds>& p) {
                           return "busy_poll_" + std::to_string(p.param.count()) + "us";
                         });

}  // namespace
}  // namespace kvpool::transport
