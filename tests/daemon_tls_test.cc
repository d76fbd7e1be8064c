// kvpoold with --tls_cert, --tls_key and --tls_ca: a client that trusts the CA and presents a
// certificate it signed puts and gets blocks byte for byte over tls:// (in the TLS connection,
// not over UCX); a client without a certificate, one that trusts another CA, and a plain TCP
// client get nothing; the Unix socket is unchanged; the CLI speaks TLS too; and bad TLS flags
// stop the start with a clear error.

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "tests/support/daemon_process.h"
#include "tests/support/status_matchers.h"
#include "tests/support/test_certificates.h"

namespace kvpool::testing {
namespace {

class DaemonTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    Result<TestCertificates> certs = WriteTestCertificates(dir_.path());
    ASSERT_OK(certs.status());
    certs_ = *certs;
  }

  // A daemon whose loopback TCP listener speaks mutual TLS; null (with a failure) when it does not
  // start.
  std::unique_ptr<DaemonProcess> StartTlsDaemon() const {
    DaemonProcessOptions po;
    po.listen_tcp_loopback = true;
    po.flags = {"--tls_cert=" + certs_.server_cert, "--tls_key=" + certs_.server_key,
                "--tls_ca=" + certs_.ca_cert};
    auto d = std::make_unique<DaemonProcess>(po);
    const Status st = d->Start();
    EXPECT_TRUE(st.ok()) << st.ToString();
    return st.ok() ? std::move(d) : nullptr;
  }

  ClientOptions TlsClient(const DaemonProcess& d) const {
    ClientOptions o = d.Options("tenant");
    o.address = d.tcp_address();
    o.data_path = DataPath::kAuto;
    o.tls_ca_file = certs_.ca_cert;
    o.tls_cert_file = certs_.client_cert;
    o.tls_key_file = certs_.client_key;
    o.timeout = std::chrono::milliseconds(5000);
    return o;
  }

  TempDir dir_{"kvpool-tls"};
  TestCertificates certs_;
};

TEST_F(DaemonTlsTest, BlocksCrossTheTlsConnectionByteForByte) {
  std::unique_ptr<DaemonProcess> daemon = StartTlsDaemon();
  ASSERT_NE(daemon, nullptr);
  DaemonProcess& d = *daemon;
  ASSERT_EQ(d.tcp_address().rfind("tls://127.0.0.1:", 0), 0u) << d.Banner();

  Result<std::unique_ptr<Client>> c = Client::Connect(TlsClient(d));
  ASSERT_OK(c.status());
  EXPECT_FALSE((*c)->server().ucx) << "auto over tls:// keeps blocks inside TLS";
  EXPECT_FALSE((*c)->server().shared_memory);
  ChainHasher hasher("tenant-secret", kTestLayout, 16);
  const std::vector<BlockKey> keys = hasher.Hash(Tokens(7, 12 * 16));
  std::vector<std::vector<uint8_t>> blocks;
  for (size_t i = 0; i < keys.size(); ++i) blocks.push_back(BlockBytes(300 + i, 200000 + i));
  std::vector<std::span<const uint8_t>> spans(blocks.begin(), blocks.end());
  Result<PutResult> put = (*c)->PutChain(keys, spans);
  ASSERT_OK(put.status());
  ASSERT_TRUE(put->all_ok());

  // Read back over TLS, and through the Unix socket (the same blocks; the socket needs no TLS).
  for (Client* reader : {c->get(), d.Connect("tenant").release()}) {
    std::unique_ptr<Client> owned(reader == c->get() ? nullptr : reader);
    Result<std::vector<FetchedBlock>> got = reader->GetBlocks(keys);
    ASSERT_OK(got.status());
    for (size_t i = 0; i < keys.size(); ++i) {
      ASSERT_OK((*got)[i].status);
      EXPECT_EQ((*got)[i].bytes, blocks[i]) << i;
    }
  }
}

TEST_F(DaemonTlsTest, ClientsWithoutTheRightCertificatesGetNothing) {
  std::unique_ptr<DaemonProcess> daemon = StartTlsDaemon();
  ASSERT_NE(daemon, nullptr);
  DaemonProcess& d = *daemon;

  ClientOptions no_cert = TlsClient(d);
  no_cert.tls_cert_file.clear();
  no_cert.tls_key_file.clear();
  EXPECT_FALSE(Client::Connect(no_cert).ok()) << "the daemon asks for a client certificate";

  ClientOptions other_ca = TlsClient(d);
  other_ca.tls_ca_file = certs_.other_ca_cert;
  Result<std::unique_ptr<Client>> c = Client::Connect(other_ca);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kPermissionDenied) << c.status().ToString();

  ClientOptions plain = TlsClient(d);
  plain.address = "tcp://" + d.tcp_address().substr(6);
  plain.data_path = DataPath::kSocket;
  EXPECT_FALSE(Client::Connect(plain).ok());

  // The listener still serves a client with the right certificates.
  EXPECT_OK(Client::Connect(TlsClient(d)));
}

TEST_F(DaemonTlsTest, TheCliSpeaksTls) {
  std::unique_ptr<DaemonProcess> daemon = StartTlsDaemon();
  ASSERT_NE(daemon, nullptr);
  DaemonProcess& d = *daemon;
  const std::string cmd = std::string(KVPOOL_CLI_PATH) + " stats --json --namespace=tenant" +
                          " --socket=" + d.tcp_address() + " --tls_ca=" + certs_.ca_cert +
                          " --tls_cert=" + certs_.client_cert + " --tls_key=" + certs_.client_key +
                          " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  EXPECT_EQ(::pclose(p), 0) << out;
  EXPECT_NE(out.find("\"bytes_in\""), std::string::npos) << out;
}

TEST_F(DaemonTlsTest, BadTlsFlagsStopTheStart) {
  for (const std::vector<std::string>& flags : std::vector<std::vector<std::string>>{
           {"--tls_cert=" + certs_.server_cert, "--tls_key=" + certs_.client_key},
           {"--listen=tls://127.0.0.1:0"},
           {"--tls_cert=" + certs_.server_cert, "--tls_key=" + certs_.server_key}}) {
    DaemonProcess d(flags);  // the last one has no --listen
    Status st = d.Start();
    EXPECT_FALSE(st.ok()) << flags[0];
    EXPECT_NE(d.log().find("tls"), std::string::npos) << d.LogTail();
  }
}

}  // namespace
}  // namespace kvpool::testing
