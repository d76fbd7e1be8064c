#include "client/control_connection.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "common/hello_auth.h"

namespace kvpool::client {
namespace {

using transport::FrameHeader;

// One reply of the fake daemon; `close` drops the connection instead of answering.
struct Reply {
  bool close = false;
  uint64_t request_id_delta = 0;  // answer another request id
  std::string body;
  std::string payload;
};

Reply Answer(std::string body, std::string payload = "") {
  Reply r;
  r.body = std::move(body);
  r.payload = std::move(payload);
  return r;
}

Reply Hangup() {
  Reply r;
  r.close = true;
  return r;
}

// A fake kvpoold on a Unix socket in a temp dir: serves one connection at a time, answering each
// request with `handler` (called on the server thread).
class FakeDaemon {
 public:
  using Handler = std::function<Reply(int connection, const FrameHeader&, const std::string& body)>;

  explicit FakeDaemon(Handler handler) : handler_(std::move(handler)) {
    char dir[] = "/tmp/kvpool-cc-test-XXXXXX";
    dir_ = mkdtemp(dir);
    path_ = dir_ + "/kvpool.sock";
    listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un un{};
    un.sun_family = AF_UNIX;
    std::strncpy(un.sun_path, path_.c_str(), sizeof(un.sun_path) - 1);
    EXPECT_EQ(bind(listen_fd_, reinterpret_cast<sockaddr*>(&un), sizeof(un)), 0);
    EXPECT_EQ(listen(listen_fd_, 8), 0);
    thread_ = std::thread([this] { Serve(); });
  }

  ~FakeDaemon() {
    stop_ = true;
    shutdown(listen_fd_, SHUT_RDWR);
    thread_.join();
    ::close(listen_fd_);
    unlink(path_.c_str());
    rmdir(dir_.c_str());
  }

  const std::string& path() const { return path_; }
  int connections() const { return connections_; }

 private:
  static bool ReadAll(int fd, void* dst, size_t n) {
    auto* p = static_cast<uint8_t*>(dst);
    while (n > 0) {
      const ssize_t r = ::read(fd, p, n);
      if (r <= 0) return false;
      p += r;
      n -= static_cast<size_t>(r);
    }
    return true;
  }
  static void WriteAll(int fd, const void* src, size_t n) {
    auto* p = static_cast<const uint8_t*>(src);
    while (n > 0) {
      const ssize_t r = ::send(fd, p, n, MSG_NOSIGNAL);
      if (r <= 0) return;
      p += r;
      n -= static_cast<size_t>(r);
    }
  }

  void Serve() {
    while (!stop_) {
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      const int connection = connections_++;
      for (;;) {
        uint8_t raw[transport::kFrameHeaderBytes];
        if (!ReadAll(fd, raw, sizeof(raw))) break;
        Result<FrameHeader> h = transport::DecodeFrameHeader(raw, {});
        if (!h.ok()) break;
        std::string body(h->body_bytes, '\0');
        std::string payload(h->payload_bytes, '\0');
        if (!ReadAll(fd, body.data(), body.size()) ||
            !ReadAll(fd, payload.data(), payload.size())) {
          break;
        }
        Reply reply = handler_(connection, *h, body);
        if (reply.close) break;
        FrameHeader rh;
        rh.flags = transport::kFlagResponse;
        rh.type = h->type;
        rh.request_id = h->request_id + reply.request_id_delta;
        rh.body_bytes = static_cast<uint32_t>(reply.body.size());
        rh.payload_bytes = static_cast<uint32_t>(reply.payload.size());
        transport::EncodeFrameHeader(rh, raw);
        WriteAll(fd, raw, sizeof(raw));
        WriteAll(fd, reply.body.data(), reply.body.size());
        WriteAll(fd, reply.payload.data(), reply.payload.size());
      }
      ::close(fd);
    }
  }

  Handler handler_;
  std::string dir_;
  std::string path_;
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::thread thread_;
};

template <typename Msg>
std::string Serialize(const Msg& m) {
  std::string s;
  m.SerializeToString(&s);
  return s;
}

std::string HelloOk() {
  wire::HelloResponse resp;
  resp.set_node_id("fake");
  return Serialize(resp);
}

ClientOptions OptionsFor(const FakeDaemon& daemon) {
  ClientOptions o;
  o.address = daemon.path();
  o.namespace_name = "tenant";
  o.timeout = std::chrono::milliseconds(2000);
  return o;
}

wire::HelloRequest Hello() {
  wire::HelloRequest req;
  req.set_protocol_version(transport::kProtocolVersion);
  req.set_namespace_name("tenant");
  return req;
}

TEST(ControlConnectionTest, DialFailsWithoutADaemon) {
  ClientOptions o;
  o.address = "/tmp/kvpool-cc-test-no-such-dir/kvpool.sock";
  o.timeout = std::chrono::milliseconds(500);
  ControlConnection c(o);
  EXPECT_TRUE(c.broken());
  EXPECT_EQ(c.Dial().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(c.broken());
}

TEST(ControlConnectionTest, HelloAndRoundTrip) {
  FakeDaemon daemon([](int, const FrameHeader& h, const std::string& body) {
    if (h.type == wire::HELLO) return Answer(HelloOk());
    wire::GetRequest req;
    EXPECT_TRUE(req.ParseFromString(body));
    wire::GetResponse resp;
    resp.add_blocks()->set_size(req.packed_keys().size());
    // A payload the caller did not ask for is discarded.
    return Answer(Serialize(resp), "xyz");
  });
  const ClientOptions o = OptionsFor(daemon);
  ControlConnection c(o);
  ASSERT_TRUE(c.Dial().ok());
  wire::HelloResponse hello;
  ASSERT_TRUE(c.Hello(Hello(), &hello).ok());
  EXPECT_EQ(hello.node_id(), "fake");
  EXPECT_FALSE(c.broken());
  wire::GetRequest req;
  req.set_packed_keys(std::string(32, 'k'));
  for (int i = 0; i < 2; ++i) {
    wire::GetResponse resp;
    Status st = c.Simple(wire::GET, req, &resp);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_EQ(resp.blocks_size(), 1);
    EXPECT_EQ(resp.blocks(0).size(), 32u);
  }
  // With out_header the payload is the caller's to read.
  wire::GetResponse resp;
  FrameHeader rh;
  const Deadline deadline = c.NewDeadline();
  ASSERT_TRUE(c.ExchangeOnce(wire::GET, req, {}, &resp, deadline, &rh).ok());
  ASSERT_EQ(rh.payload_bytes, 3u);
  char got[3];
  ASSERT_TRUE(c.ReceivePayload(got, 3, deadline).ok());
  EXPECT_EQ(std::string(got, 3), "xyz");
}

TEST(ControlConnectionTest, ChallengeNeedsTheClusterSecret) {
  const std::string challenge(32, 'c');
  std::string proof_seen;
  FakeDaemon daemon([&](int, const FrameHeader&, const std::string& body) {
    wire::HelloRequest req;
    EXPECT_TRUE(req.ParseFromString(body));
    wire::HelloResponse resp;
    if (req.auth().empty()) {
      resp.mutable_status()->set_code(static_cast<int>(StatusCode::kPermissionDenied));
      resp.set_challenge(challenge);
    } else {
      proof_seen = req.auth();
      resp.set_node_id("authenticated");
      resp.set_server_proof(HelloServerProof("s3cret", req.client_challenge(), "tenant"));
    }
    return Answer(Serialize(resp));
  });
  ClientOptions o = OptionsFor(daemon);
  {
    ControlConnection c(o);
    ASSERT_TRUE(c.Dial().ok());
    wire::HelloResponse resp;
    Status st = c.Hello(Hello(), &resp);
    EXPECT_EQ(st.code(), StatusCode::kPermissionDenied);
    EXPECT_NE(st.message().find("cluster secret"), std::string::npos) << st.ToString();
    EXPECT_TRUE(c.broken());
  }
  o.cluster_secret = "s3cret";
  ControlConnection c(o);
  ASSERT_TRUE(c.Dial().ok());
  wire::HelloResponse resp;
  ASSERT_TRUE(c.Hello(Hello(), &resp).ok());
  EXPECT_EQ(resp.node_id(), "authenticated");
  EXPECT_EQ(proof_seen, HelloProof("s3cret", challenge, "tenant"));
}

TEST(ControlConnectionTest, ADaemonThatCannotProveTheSecretItselfIsRefused) {
  // It takes any proof, but does not know the secret: its answer to the client's challenge is
  // missing, then wrong.
  std::string answer;
  std::string client_challenge;
  FakeDaemon daemon([&](int, const FrameHeader&, const std::string& body) {
    wire::HelloRequest req;
    EXPECT_TRUE(req.ParseFromString(body));
    wire::HelloResponse resp;
    if (req.auth().empty()) {
      resp.mutable_status()->set_code(static_cast<int>(StatusCode::kPermissionDenied));
      resp.set_challenge(std::string(32, 'c'));
    } else {
      client_challenge = req.client_challenge();
      resp.set_server_proof(answer);
    }
    return Answer(Serialize(resp));
  });
  ClientOptions o = OptionsFor(daemon);
  o.credential = "the-tenants-credential-0123";
  for (const std::string& wrong : {std::string(), std::string(32, 'x')}) {
    answer = wrong;
    ControlConnection c(o);
    ASSERT_TRUE(c.Dial().ok());
    wire::HelloResponse resp;
    Status st = c.Hello(Hello(), &resp);
    EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << st.ToString();
    EXPECT_NE(st.message().find("did not prove that it holds the secret this client holds"),
              std::string::npos)
        << st.ToString();
    EXPECT_TRUE(c.broken());
  }
  EXPECT_EQ(client_challenge.size(), 32u);
  // A daemon that admits a client holding a secret at once, without asking for a proof (and so
  // without proving anything itself), is refused too.
  FakeDaemon lax([](int, const FrameHeader&, const std::string&) { return Answer(HelloOk()); });
  ClientOptions lo = OptionsFor(lax);
  lo.cluster_secret = "the-cluster-secret-0123456";
  {
    ControlConnection c(lo);
    ASSERT_TRUE(c.Dial().ok());
    wire::HelloResponse resp;
    Status st = c.Hello(Hello(), &resp);
    EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << st.ToString();
    EXPECT_NE(st.message().find("ClientOptions::cluster_secret"), std::string::npos)
        << st.ToString();
  }
  // A daemon that answers the client's challenge under the secret is accepted; the credential
  // is the secret proven, not the cluster secret.
  FakeDaemon honest([&](int, const FrameHeader&, const std::string& body) {
    wire::HelloRequest req;
    EXPECT_TRUE(req.ParseFromString(body));
    wire::HelloResponse resp;
    if (req.auth().empty()) {
      resp.mutable_status()->set_code(static_cast<int>(StatusCode::kPermissionDenied));
      resp.set_challenge(std::string(32, 'c'));
    } else {
      EXPECT_EQ(req.auth(), HelloProof(o.credential, std::string(32, 'c'), "tenant"));
      resp.set_server_proof(HelloServerProof(o.credential, req.client_challenge(), "tenant"));
    }
    return Answer(Serialize(resp));
  });
  ClientOptions ho = OptionsFor(honest);
  ho.credential = o.credential;
  ho.cluster_secret = "the-cluster-secret-0123456";
  ControlConnection hc(ho);
  ASSERT_TRUE(hc.Dial().ok());
  wire::HelloResponse resp;
  EXPECT_TRUE(hc.Hello(Hello(), &resp).ok());
}

TEST(ControlConnectionTest, ABlockLargerThanADaemonMaySendIsRefusedBeforeAnyAllocation) {
  // A lying daemon (or peer): a block of 2^63 bytes in a GET answer.
  FakeDaemon daemon([](int, const FrameHeader& h, const std::string& body) {
    if (h.type == wire::HELLO) {
      wire::HelloResponse resp;
      resp.set_node_id("liar");
      resp.set_max_block_bytes(UINT64_MAX);  // a lie too: the client caps it
      resp.set_max_batch_keys(16);
      return Answer(Serialize(resp));
    }
    wire::GetResponse resp;
    resp.add_blocks()->set_size(1ull << 63);
    return Answer(Serialize(resp));
  });
  ClientOptions o = OptionsFor(daemon);
  o.data_path = DataPath::kSocket;
  auto client = Client::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  const BlockKey key{};
  auto got = (*client)->GetBlocks({&key, 1});
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kInternal);
  EXPECT_NE(got.status().message().find("announced a block of 9223372036854775808 bytes"),
            std::string::npos)
      << got.status().ToString();
}

TEST(ControlConnectionTest, RefusedHelloKeepsTheDaemonsCode) {
  FakeDaemon daemon([](int, const FrameHeader&, const std::string&) {
    wire::HelloResponse resp;
    resp.mutable_status()->set_code(static_cast<int>(StatusCode::kInvalidArgument));
    resp.mutable_status()->set_message("bad namespace");
    return Answer(Serialize(resp));
  });
  const ClientOptions o = OptionsFor(daemon);
  ControlConnection c(o);
  ASSERT_TRUE(c.Dial().ok());
  wire::HelloResponse resp;
  Status st = c.Hello(Hello(), &resp);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.ToString().find("kvpoold refused the connection"), std::string::npos)
      << st.ToString();
  EXPECT_TRUE(c.broken());
}

TEST(ControlConnectionTest, AnswerToAnotherRequestClosesTheConnection) {
  FakeDaemon daemon([](int, const FrameHeader& h, const std::string&) {
    if (h.type == wire::HELLO) return Answer(HelloOk());
    Reply r = Answer(Serialize(wire::StatsResponse()));
    r.request_id_delta = 5;
    return r;
  });
  const ClientOptions o = OptionsFor(daemon);
  ControlConnection c(o);
  ASSERT_TRUE(c.Dial().ok());
  wire::HelloResponse hello;
  ASSERT_TRUE(c.Hello(Hello(), &hello).ok());
  wire::StatsResponse resp;
  Status st = c.Simple(wire::STATS, wire::StatsRequest(), &resp);
  EXPECT_EQ(st.code(), StatusCode::kInternal);
  EXPECT_TRUE(c.broken());
}

TEST(ControlConnectionTest, RunRetriesOnceOnAReusedConnectionThatDied) {
  // The first connection dies at its first request (a daemon restart); later ones answer.
  FakeDaemon daemon([](int connection, const FrameHeader& h, const std::string&) {
    if (h.type == wire::HELLO) return Answer(HelloOk());
    if (connection == 0) return Hangup();
    return Answer(Serialize(wire::StatsResponse()));
  });
  const ClientOptions o = OptionsFor(daemon);
  ControlConnection c(o);
  int connects = 0;
  auto connect = [&] {
    ++connects;
    KVPOOL_RETURN_IF_ERROR(c.Dial());
    wire::HelloResponse resp;
    return c.Hello(Hello(), &resp);
  };
  auto stats = [&]() -> Result<bool> {
    wire::StatsResponse resp;
    KVPOOL_RETURN_IF_ERROR(c.Simple(wire::STATS, wire::StatsRequest(), &resp));
    return true;
  };
  ASSERT_TRUE(connect().ok());
  // Fresh from connect: a failure is not retried.
  Result<bool> r = c.Run(stats, connect);
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().ToString();
  EXPECT_EQ(connects, 1);
  // Broken: the next call reconnects first.
  r = c.Run(stats, connect);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(connects, 2);
  // Reused and fine: no reconnect.
  r = c.Run(stats, connect);
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(connects, 2);
}

TEST(ControlConnectionTest, RunReconnectsAReusedConnectionOnUnavailable) {
  // Connection 1 dies at its second request: the call on the reused connection is retried.
  std::atomic<int> requests_on_1{0};
  FakeDaemon daemon([&](int connection, const FrameHeader& h, const std::string&) {
    if (h.type == wire::HELLO) return Answer(HelloOk());
    if (connection == 0 && requests_on_1++ == 1) return Hangup();
    return Answer(Serialize(wire::StatsResponse()));
  });
  ClientOptions o = OptionsFor(daemon);
  ControlConnection c(o);
  int connects = 0;
  auto connect = [&] {
    ++connects;
    KVPOOL_RETURN_IF_ERROR(c.Dial());
    wire::HelloResponse resp;
    return c.Hello(Hello(), &resp);
  };
  auto stats = [&]() -> Result<bool> {
    wire::StatsResponse resp;
    KVPOOL_RETURN_IF_ERROR(c.Simple(wire::STATS, wire::StatsRequest(), &resp));
    return true;
  };
  EXPECT_TRUE(c.Run(stats, connect).ok());  // connects (fresh), first request answered
  EXPECT_EQ(connects, 1);
  Result<bool> r = c.Run(stats, connect);  // reused; dies; reconnected and retried
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(connects, 2);
  EXPECT_EQ(daemon.connections(), 2);
}

TEST(ControlConnectionTest, WithoutAutoReconnectABrokenConnectionStaysClosed) {
  FakeDaemon daemon([](int, const FrameHeader& h, const std::string&) {
    if (h.type == wire::HELLO) return Answer(HelloOk());
    return Hangup();
  });
  ClientOptions o = OptionsFor(daemon);
  o.auto_reconnect = false;
  ControlConnection c(o);
  int connects = 0;
  auto connect = [&] {
    ++connects;
    KVPOOL_RETURN_IF_ERROR(c.Dial());
    wire::HelloResponse resp;
    return c.Hello(Hello(), &resp);
  };
  auto stats = [&]() -> Result<bool> {
    wire::StatsResponse resp;
    KVPOOL_RETURN_IF_ERROR(c.Simple(wire::STATS, wire::StatsRequest(), &resp));
    return true;
  };
  EXPECT_EQ(c.Run(stats, connect).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(connects, 1);
  Result<bool> r = c.Run(stats, connect);
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("call Reconnect()"), std::string::npos);
  EXPECT_EQ(connects, 1);
}

}  // namespace
}  // namespace kvpool::client
