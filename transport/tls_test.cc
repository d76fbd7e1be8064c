// TLS on the control server's TCP listener and in the client's channel: frames and payloads
// cross intact; a client refuses a daemon its CA did not sign or whose certificate names
// another host; a listener that asks for client certificates refuses a client without one; a
// plain TCP client or one that never shakes hands gets nothing and harms nothing; bad files stop
// the start with a clear error.

#include "transport/tls.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <random>
#include <thread>

#include "control.pb.h"
#include "tests/support/status_matchers.h"
#include "tests/support/temp_dir.h"
#include "tests/support/test_certificates.h"
#include "transport/control_channel.h"
#include "transport/control_server.h"

namespace kvpool::transport {
namespace {

using namespace std::chrono_literals;

// Answers every request with its own body and payload (framed as a GET answer).
class EchoHandler final : public RequestHandler {
 public:
  struct State : ConnectionState {
    std::vector<uint8_t> payload;
  };
  std::unique_ptr<ConnectionState> OnConnect(const ConnectionInfo&) override {
    return std::make_unique<State>();
  }
  Status PayloadSinks(ConnectionState& state, const FrameHeader& header, std::string_view body,
                      std::vector<PayloadSink>* sinks) override {
    if (body == "refuse") return Status::InvalidArgument("refused: the connection closes");
    auto& s = static_cast<State&>(state);
    s.payload.resize(header.payload_bytes);
    sinks->push_back({s.payload.data(), s.payload.size()});
    return Status::OK();
  }
  Response Handle(ConnectionState& state, const FrameHeader& header,
                  std::string_view body) override {
    auto& s = static_cast<State&>(state);
    Response r;
    r.type = wire::GET;  // the response type that may carry a payload
    r.body = std::string(body);
    if (header.payload_bytes > 0) r.payload.emplace_back(s.payload.data(), s.payload.size());
    handled.fetch_add(1);
    return r;
  }
  void OnDisconnect(ConnectionState&) override {}

  std::atomic<int> handled{0};
};

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    Result<kvpool::testing::TestCertificates> certs =
        kvpool::testing::WriteTestCertificates(dir_.path());
    ASSERT_OK(certs.status());
    certs_ = *certs;
  }

  // A server on loopback; `files` for its TLS.
  std::unique_ptr<ControlServer> Serve(const TlsFiles& files,
                                       std::chrono::milliseconds hello_timeout = 10s,
                                       std::chrono::microseconds busy_poll = 0us) {
    ControlServerOptions o;
    o.io_busy_poll = busy_poll;
    o.unix_path = dir_.Join("s.sock");
    o.tcp_listen = "127.0.0.1:0";
    o.tls = files;
    o.io_threads = 1;
    o.worker_threads = 2;
    o.hello_timeout = hello_timeout;
    Result<std::unique_ptr<ControlServer>> s = ControlServer::Start(o, handler_);
    EXPECT_OK(s.status());
    return s.ok() ? std::move(*s) : nullptr;
  }

  TlsFiles ServerFiles() const { return {certs_.server_cert, certs_.server_key, ""}; }

  std::shared_ptr<const TlsClientContext> ClientContext(const TlsFiles& files) {
    Result<std::shared_ptr<const TlsClientContext>> c = TlsClientContext::Create(files);
    EXPECT_OK(c.status());
    return c.ok() ? *c : nullptr;
  }

  // One request with `payload` bytes; the echo must match what was sent.
  static Status Echo(ControlChannel& ch, size_t payload_bytes) {
    const Deadline deadline = std::chrono::steady_clock::now() + 10s;
    std::vector<uint8_t> payload(payload_bytes);
    std::mt19937_64 rng(payload_bytes);
    for (auto& b : payload) b = static_cast<uint8_t>(rng());
    FrameHeader h;
    h.type = wire::PUT_COMMIT;  // the request type that may carry a payload
    h.request_id = 7;
    const std::string body = "a body of some bytes";
    h.body_bytes = body.size();
    h.payload_bytes = static_cast<uint32_t>(payload.size());
    const iovec piece{payload.data(), payload.size()};
    KVPOOL_RETURN_IF_ERROR(ch.Send(h, body, {&piece, payload.empty() ? 0u : 1u}, deadline));
    KVPOOL_ASSIGN_OR_RETURN(FrameHeader r, ch.ReceiveHeader(FrameLimits{}, deadline));
    std::string got_body(r.body_bytes, '\0');
    KVPOOL_RETURN_IF_ERROR(ch.ReceiveInto(got_body.data(), got_body.size(), deadline));
    std::vector<uint8_t> got(r.payload_bytes);
    KVPOOL_RETURN_IF_ERROR(ch.ReceiveInto(got.data(), got.size(), deadline));
    if (r.request_id != 7 || got_body != body || got != payload) {
      return Status::Internal("the echo differs from what was sent");
    }
    return Status::OK();
  }

  kvpool::testing::TempDir dir_{"kvpool-tls"};
  kvpool::testing::TestCertificates certs_;
  EchoHandler handler_;
};

TEST_F(TlsTest, FramesAndPayloadsCrossATlsConnectionIntact) {
  auto server = Serve(ServerFiles());
  ASSERT_NE(server, nullptr);
  auto ctx = ClientContext({"", "", certs_.ca_cert});
  Result<std::unique_ptr<ControlChannel>> ch =
      ControlChannel::Connect("tls://" + server->tcp_address(), 5s, ctx);
  ASSERT_OK(ch.status());
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{16 << 10}, size_t{5 << 20} + 3}) {
    const Status st = Echo(**ch, bytes);
    EXPECT_TRUE(st.ok()) << bytes << " payload bytes: " << st.ToString();
  }
  // By name as well as by address.
  const std::string port = server->tcp_address().substr(server->tcp_address().rfind(':'));
  Result<std::unique_ptr<ControlChannel>> by_name =
      ControlChannel::Connect("tls://localhost" + port, 5s, ctx);
  ASSERT_OK(by_name.status());
  EXPECT_OK(Echo(**by_name, 1000));
}

TEST_F(TlsTest, BusyPollingServerAndClientsAnswerEveryFrameAndStop) {
  auto server = Serve(ServerFiles(), 10s, /*busy_poll=*/500us);
  ASSERT_NE(server, nullptr);
  Result<std::unique_ptr<ControlChannel>> plain = ControlChannel::Connect(server->unix_path(), 5s);
  ASSERT_OK(plain.status());
  Result<std::unique_ptr<ControlChannel>> tls = ControlChannel::Connect(
      "tls://" + server->tcp_address(), 5s, ClientContext({"", "", certs_.ca_cert}));
  ASSERT_OK(tls.status());
  (*plain)->set_busy_poll(300us);
  (*tls)->set_busy_poll(300us);
  for (int round = 0; round < 20; ++round) {
    for (size_t bytes : {size_t{0}, size_t{100}, size_t{1} << 20}) {
      ASSERT_OK(Echo(**plain, bytes));
      ASSERT_OK(Echo(**tls, bytes));
    }
    // Pauses longer than both windows: each side sleeps, and the next frame wakes it.
    if (round % 5 == 0) std::this_thread::sleep_for(2ms);
  }
  server->Stop();  // the spinning I/O thread ends
}

TEST_F(TlsTest, AClientRefusesADaemonItsCaDidNotSign) {
  auto server = Serve(ServerFiles());
  ASSERT_NE(server, nullptr);
  Result<std::unique_ptr<ControlChannel>> ch = ControlChannel::Connect(
      "tls://" + server->tcp_address(), 5s, ClientContext({"", "", certs_.other_ca_cert}));
  ASSERT_FALSE(ch.ok());
  EXPECT_EQ(ch.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(ch.status().message().find("does not verify"), std::string::npos)
      << ch.status().ToString();
  EXPECT_EQ(handler_.handled.load(), 0);
}

TEST_F(TlsTest, AClientRefusesACertificateThatNamesAnotherHost) {
  // The client certificate is signed by the same CA but names no host at all.
  auto server = Serve({certs_.client_cert, certs_.client_key, ""});
  ASSERT_NE(server, nullptr);
  Result<std::unique_ptr<ControlChannel>> ch = ControlChannel::Connect(
      "tls://" + server->tcp_address(), 5s, ClientContext({"", "", certs_.ca_cert}));
  ASSERT_FALSE(ch.ok());
  EXPECT_EQ(ch.status().code(), StatusCode::kPermissionDenied) << ch.status().ToString();
}

TEST_F(TlsTest, AListenerWithACaRequiresAClientCertificateSignedByIt) {
  auto server = Serve({certs_.server_cert, certs_.server_key, certs_.ca_cert});
  ASSERT_NE(server, nullptr);
  const std::string address = "tls://" + server->tcp_address();
  {
    // Without a certificate: under TLS 1.3 the client's handshake ends before the server has
    // checked it, so the refusal arrives at the first exchange.
    Result<std::unique_ptr<ControlChannel>> ch =
        ControlChannel::Connect(address, 5s, ClientContext({"", "", certs_.ca_cert}));
    Status st = ch.ok() ? Echo(**ch, 10) : ch.status();
    EXPECT_FALSE(st.ok());
  }
  EXPECT_EQ(handler_.handled.load(), 0);
  Result<std::unique_ptr<ControlChannel>> ch = ControlChannel::Connect(
      address, 5s, ClientContext({certs_.client_cert, certs_.client_key, certs_.ca_cert}));
  ASSERT_OK(ch.status());
  EXPECT_OK(Echo(**ch, 4096));
}

TEST_F(TlsTest, PlainTcpAndSilentClientsGetNothingAndTheListenerKeepsServing) {
  auto server = Serve(ServerFiles(), /*hello_timeout=*/300ms);
  ASSERT_NE(server, nullptr);
  {
    Result<std::unique_ptr<ControlChannel>> plain =
        ControlChannel::Connect("tcp://" + server->tcp_address(), 5s);
    ASSERT_OK(plain.status());
    EXPECT_FALSE(Echo(**plain, 100).ok());
  }
  // The refused connection is gone (the server may see its end a moment later) before the next.
  for (int i = 0; i < 100 && server->connections() > 0; ++i) std::this_thread::sleep_for(20ms);
  ASSERT_EQ(server->connections(), 0u);
  // A connection that never shakes hands is closed at the hello timeout.
  Result<std::unique_ptr<ControlChannel>> silent =
      ControlChannel::Connect("tcp://" + server->tcp_address(), 5s);
  ASSERT_OK(silent.status());
  for (int i = 0; i < 100 && server->connections() == 0; ++i) std::this_thread::sleep_for(20ms);
  ASSERT_EQ(server->connections(), 1u);
  for (int i = 0; i < 100 && server->connections() > 0; ++i) std::this_thread::sleep_for(50ms);
  EXPECT_EQ(server->connections(), 0u);
  EXPECT_EQ(handler_.handled.load(), 0);

  Result<std::unique_ptr<ControlChannel>> ch = ControlChannel::Connect(
      "tls://" + server->tcp_address(), 5s, ClientContext({"", "", certs_.ca_cert}));
  ASSERT_OK(ch.status());
  EXPECT_OK(Echo(**ch, 100));
}

TEST_F(TlsTest, ADaemonThatHangsUpMidWriteIsAnErrorNotASigpipe) {
  auto server = Serve(ServerFiles());
  ASSERT_NE(server, nullptr);
  Result<std::unique_ptr<ControlChannel>> ch = ControlChannel::Connect(
      "tls://" + server->tcp_address(), 5s, ClientContext({"", "", certs_.ca_cert}));
  ASSERT_OK(ch.status());
  // The server closes the connection at the header of a frame whose 200 MiB payload the client
  // is still writing: the write fails with EPIPE or ECONNRESET, which must not end this process.
  std::vector<uint8_t> payload(200u << 20, 0x5a);
  FrameHeader h;
  h.type = wire::PUT_COMMIT;
  h.request_id = 1;
  const std::string body = "refuse";
  h.body_bytes = body.size();
  h.payload_bytes = static_cast<uint32_t>(payload.size());
  const iovec piece{payload.data(), payload.size()};
  Status st = (*ch)->Send(h, body, {&piece, 1}, std::chrono::steady_clock::now() + 10s);
  if (st.ok())
    st = (*ch)->ReceiveHeader(FrameLimits{}, std::chrono::steady_clock::now() + 10s).status();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_TRUE((*ch)->broken());
}

TEST_F(TlsTest, BadFilesStopTheStartWithTheirNameAndTheProblem) {
  auto start = [&](TlsFiles files, std::string listen = "127.0.0.1:0") {
    ControlServerOptions o;
    o.unix_path = dir_.Join("bad.sock");
    o.tcp_listen = std::move(listen);
    o.tls = std::move(files);
    return ControlServer::Start(o, handler_).status();
  };
  Status st = start({certs_.server_cert, certs_.client_key, ""});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("does not match"), std::string::npos) << st.ToString();

  st = start({certs_.server_cert, dir_.Join("missing.key"), ""});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("missing.key"), std::string::npos) << st.ToString();

  ASSERT_EQ(::chmod(certs_.server_key.c_str(), 0644), 0);
  st = start(ServerFiles());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("other users"), std::string::npos) << st.ToString();
  ASSERT_EQ(::chmod(certs_.server_key.c_str(), 0600), 0);

  st = start({certs_.server_key, certs_.server_key, ""});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("not a PEM certificate"), std::string::npos) << st.ToString();

  st = start(ServerFiles(), /*listen=*/"");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("--listen"), std::string::npos) << st.ToString();

  EXPECT_OK(start(ServerFiles()));
}

TEST(TlsClientContextTest, ACertificateWithoutItsKeyIsRefused) {
  Result<std::shared_ptr<const TlsClientContext>> c =
      TlsClientContext::Create({"/nonexistent/cert.pem", "", ""});
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvpool::transport
