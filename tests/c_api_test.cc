// The C API against a real kvpoold: hashing matches the spec vectors' construction (via the C++
// hasher, itself checked against the vectors), and put/lookup/get/sessions work with codes and
// readable errors.

#include <gtest/gtest.h>
#include <kvpool/kvpool.h>

#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tests/support/daemon_process.h"
#include "tests/support/status_matchers.h"
#include "tests/support/test_certificates.h"

namespace kvpool::testing {
namespace {

// n blocks of distinct bytes (block i: BlockBytes(seed + i, size + step * i)) and the pointer
// and size arrays the C API takes.
struct CBlocks {
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<const void*> data;
  std::vector<size_t> sizes;
};
CBlocks MakeCBlocks(int n, int seed, size_t size, size_t step) {
  CBlocks b;
  b.bytes.reserve(n);
  for (int i = 0; i < n; ++i) {
    b.bytes.push_back(BlockBytes(seed + i, size + step * i));
    b.data.push_back(b.bytes.back().data());
    b.sizes.push_back(b.bytes.back().size());
  }
  return b;
}

TEST(CApiTest, HashChainMatchesTheCppHasher) {
  const std::vector<int32_t> tokens = Tokens(3, 16 * 5 + 7);
  std::vector<kvpool_key> keys(10);
  size_t n = 0;
  ASSERT_EQ(kvpool_hash_chain(tokens.data(), tokens.size(), 16, "tenant-a", 8, kTestLayout, nullptr,
                              keys.data(), keys.size(), &n),
            KVPOOL_OK);
  ASSERT_EQ(n, 5u);
  ChainHasher hasher("tenant-a", kTestLayout, 16);
  const std::vector<BlockKey> expect = hasher.Hash(tokens);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(std::memcmp(keys[i].bytes, expect[i].bytes.data(), 32), 0) << i;
  }
  // Too small an output buffer is an error that still reports the count.
  EXPECT_EQ(kvpool_hash_chain(tokens.data(), tokens.size(), 16, "tenant-a", 8, kTestLayout, nullptr,
                              keys.data(), 2, &n),
            KVPOOL_INVALID_ARGUMENT);
  EXPECT_EQ(n, 5u);
  EXPECT_EQ(kvpool_hash_chain(tokens.data(), tokens.size(), 0, "x", 1, kTestLayout, nullptr,
                              keys.data(), keys.size(), &n),
            KVPOOL_INVALID_ARGUMENT);
}

TEST(CApiTest, ConnectFailureHasAReadableError) {
  kvpool_client* c = nullptr;
  EXPECT_EQ(kvpool_connect("/nonexistent/kvpool.sock", "ns", 500, &c), KVPOOL_UNAVAILABLE);
  EXPECT_EQ(c, nullptr);
  EXPECT_NE(std::string(kvpool_last_error(nullptr)).find("/nonexistent/kvpool.sock"),
            std::string::npos);
  EXPECT_STREQ(kvpool_code_name(KVPOOL_NOT_FOUND), "NotFound");
}

// A namespace guarded by a credential, on a daemon behind mutual TLS: kvpool_connect_with
// carries both; without the credential, or without the client certificate, it is refused.
TEST(CApiTest, ConnectWithACredentialOverTls) {
  TempDir dir("kvpool-c-api");
  ASSERT_TRUE(dir.ok());
  Result<TestCertificates> certs = WriteTestCertificates(dir.path());
  ASSERT_OK(certs.status());
  const std::string secret = "c-api-tenant-credential-0123456789";
  const std::string cred_file = dir.Join("cred");
  const std::string ns_file = dir.Join("namespaces.yaml");
  {
    FILE* f = std::fopen(cred_file.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(secret.c_str(), f);
    std::fclose(f);
    ASSERT_EQ(::chmod(cred_file.c_str(), 0600), 0);
    f = std::fopen(ns_file.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fprintf(f, "namespaces:\n  c-api: {credential_file: %s}\n", cred_file.c_str());
    std::fclose(f);
  }
  DaemonProcessOptions po;
  po.listen_tcp_loopback = true;
  po.flags = {"--namespaces_file=" + ns_file, "--tls_cert=" + certs->server_cert,
              "--tls_key=" + certs->server_key, "--tls_ca=" + certs->ca_cert};
  DaemonProcess d(po);
  ASSERT_OK(d.Start());

  kvpool_connect_options o = {};
  o.address = d.tcp_address().c_str();
  o.namespace_name = "c-api";
  o.timeout_ms = 5000;
  o.tls_ca_file = certs->ca_cert.c_str();
  o.tls_cert_file = certs->client_cert.c_str();
  o.tls_key_file = certs->client_key.c_str();
  kvpool_client* c = nullptr;
  EXPECT_EQ(kvpool_connect_with(&o, &c), KVPOOL_PERMISSION_DENIED) << "no credential";
  o.credential = secret.data();
  o.credential_len = secret.size();
  ASSERT_EQ(kvpool_connect_with(&o, &c), KVPOOL_OK) << kvpool_last_error(nullptr);
  uint32_t hit = 7;
  kvpool_key key = {};
  EXPECT_EQ(kvpool_lookup(c, &key, 1, 0, &hit, nullptr), KVPOOL_OK) << kvpool_last_error(c);
  EXPECT_EQ(hit, 0u);
  kvpool_close(c);

  o.tls_cert_file = nullptr;
  o.tls_key_file = nullptr;
  c = nullptr;
  EXPECT_NE(kvpool_connect_with(&o, &c), KVPOOL_OK) << "the daemon requires a client certificate";
  EXPECT_EQ(c, nullptr);
  EXPECT_EQ(kvpool_connect_with(nullptr, &c), KVPOOL_INVALID_ARGUMENT);
}

// Busy polling on both ends (kvpool_connect_options.busy_poll_us, kvpoold --io_busy_poll_us):
// every answer still arrives, byte for byte, and a miss is still a miss.
TEST(CApiTest, BusyPollingClientGetsEveryAnswer) {
  DaemonProcess d({"--io_busy_poll_us=50"});
  ASSERT_OK(d.Start());
  kvpool_connect_options o{};
  o.address = d.socket_path().c_str();
  o.namespace_name = "c-api";
  o.timeout_ms = 5000;
  o.busy_poll_us = 50;
  kvpool_client* c = nullptr;
  o.busy_poll_us = -1;
  EXPECT_EQ(kvpool_connect_with(&o, &c), KVPOOL_INVALID_ARGUMENT);
  o.busy_poll_us = 50;
  ASSERT_EQ(kvpool_connect_with(&o, &c), KVPOOL_OK) << kvpool_last_error(nullptr);
  const std::vector<int32_t> tokens = Tokens(9, 16 * 3);
  kvpool_key keys[4];
  size_t n = 0;
  ASSERT_EQ(kvpool_hash_chain(tokens.data(), tokens.size(), 16, "sec", 3, kTestLayout, nullptr,
                              keys, 3, &n),
            KVPOOL_OK);
  keys[3] = keys[2];
  keys[3].bytes[0] ^= 1;  // never put
  const CBlocks put = MakeCBlocks(3, 200, 4096, 7);
  const std::vector<std::vector<uint8_t>>& blocks = put.bytes;
  uint32_t stored = 0, present = 0;
  ASSERT_EQ(
      kvpool_put_chain(c, keys, 3, put.data.data(), put.sizes.data(), nullptr, &stored, &present),
      KVPOOL_OK)
      << kvpool_last_error(c);
  ASSERT_EQ(stored, 3u);
  for (int round = 0; round < 200; ++round) {
    std::vector<std::vector<uint8_t>> out(4, std::vector<uint8_t>(8192, 0));
    void* buffers[4];
    size_t capacities[4], got[4];
    int codes[4];
    for (int i = 0; i < 4; ++i) {
      buffers[i] = out[i].data();
      capacities[i] = out[i].size();
    }
    ASSERT_EQ(kvpool_get(c, keys, 4, buffers, capacities, got, codes), KVPOOL_OK)
        << kvpool_last_error(c);
    for (int i = 0; i < 3; ++i) {
      ASSERT_EQ(codes[i], KVPOOL_OK) << round << " " << i;
      ASSERT_EQ(got[i], blocks[i].size());
      ASSERT_EQ(std::memcmp(out[i].data(), blocks[i].data(), got[i]), 0) << round << " " << i;
    }
    ASSERT_EQ(codes[3], KVPOOL_NOT_FOUND) << round;
  }
  kvpool_close(c);
}

// A buffer too small for its block: nothing written, sizes[i] 0 (bytes written), the code says
// why. (It used to report the block's size, which a C caller would read past its buffer.)
TEST(CApiTest, ABufferTooSmallReportsNothingWritten) {
  DaemonProcess d;
  ASSERT_OK(d.Start());
  kvpool_client* c = nullptr;
  ASSERT_EQ(kvpool_connect(d.socket_path().c_str(), "c-api", 5000, &c), KVPOOL_OK)
      << kvpool_last_error(nullptr);
  const std::vector<int32_t> tokens = Tokens(10, 16);
  kvpool_key key;
  size_t n = 0;
  ASSERT_EQ(kvpool_hash_chain(tokens.data(), tokens.size(), 16, "sec", 3, kTestLayout, nullptr,
                              &key, 1, &n),
            KVPOOL_OK);
  const CBlocks put = MakeCBlocks(1, 8192, 8192, 3);
  uint32_t stored = 0, present = 0;
  ASSERT_EQ(
      kvpool_put_chain(c, &key, 1, put.data.data(), put.sizes.data(), nullptr, &stored, &present),
      KVPOOL_OK)
      << kvpool_last_error(c);
  std::vector<uint8_t> small(4096, 0xEE);
  void* buffer = small.data();
  const size_t capacity = small.size();
  size_t got = 12345;
  int code = KVPOOL_OK;
  ASSERT_EQ(kvpool_get(c, &key, 1, &buffer, &capacity, &got, &code), KVPOOL_OK)
      << kvpool_last_error(c);
  EXPECT_EQ(code, KVPOOL_INVALID_ARGUMENT);
  EXPECT_EQ(got, 0u);
  EXPECT_EQ(small, std::vector<uint8_t>(4096, 0xEE));
  kvpool_close(c);
}

TEST(CApiTest, PutLookupGetSessionRoundTrip) {
  DaemonProcess d;
  ASSERT_OK(d.Start());
  kvpool_client* c = nullptr;
  ASSERT_EQ(kvpool_connect(d.socket_path().c_str(), "c-api", 5000, &c), KVPOOL_OK)
      << kvpool_last_error(nullptr);
  const std::vector<int32_t> tokens = Tokens(8, 16 * 4);
  kvpool_key keys[4];
  size_t n = 0;
  ASSERT_EQ(kvpool_hash_chain(tokens.data(), tokens.size(), 16, "sec", 3, kTestLayout, nullptr,
                              keys, 4, &n),
            KVPOOL_OK);
  const CBlocks put = MakeCBlocks(4, 100, 3000, 1);
  const std::vector<std::vector<uint8_t>>& blocks = put.bytes;
  const std::vector<const void*>& data = put.data;
  const std::vector<size_t>& sizes = put.sizes;
  uint32_t stored = 0, present = 0;
  ASSERT_EQ(kvpool_put_chain(c, keys, 4, data.data(), sizes.data(), nullptr, &stored, &present),
            KVPOOL_OK)
      << kvpool_last_error(c);
  EXPECT_EQ(stored, 4u);
  ASSERT_EQ(kvpool_put_chain(c, keys, 4, data.data(), sizes.data(), nullptr, &stored, &present),
            KVPOOL_OK);
  EXPECT_EQ(stored, 0u);
  EXPECT_EQ(present, 4u);

  uint32_t hit = 0;
  uint8_t tiers[4] = {};
  ASSERT_EQ(kvpool_lookup(c, keys, 4, 1, &hit, tiers), KVPOOL_OK);
  EXPECT_EQ(hit, 4u);
  EXPECT_EQ(tiers[0], KVPOOL_TIER_HOST);

  std::vector<std::vector<uint8_t>> out(4, std::vector<uint8_t>(4000));
  std::vector<void*> bufs;
  std::vector<size_t> caps, got(4);
  std::vector<int> codes(4);
  for (auto& o : out) {
    bufs.push_back(o.data());
    caps.push_back(o.size());
  }
  ASSERT_EQ(kvpool_get(c, keys, 4, bufs.data(), caps.data(), got.data(), codes.data()), KVPOOL_OK);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(codes[i], KVPOOL_OK);
    ASSERT_EQ(got[i], blocks[i].size());
    EXPECT_EQ(std::memcmp(out[i].data(), blocks[i].data(), got[i]), 0);
  }

  // A standalone daemon locates the chain on itself only.
  kvpool_node_location nodes[2];
  size_t n_nodes = 0;
  ASSERT_EQ(kvpool_locate(c, keys, 4, nodes, 2, &n_nodes), KVPOOL_OK) << kvpool_last_error(c);
  ASSERT_EQ(n_nodes, 1u);
  EXPECT_EQ(nodes[0].self, 1);
  EXPECT_EQ(nodes[0].code, KVPOOL_OK);
  EXPECT_EQ(nodes[0].hit_blocks, 4u);
  EXPECT_EQ(nodes[0].host_blocks, 4u);
  EXPECT_STREQ(nodes[0].control_address, "");
  EXPECT_GT(std::strlen(nodes[0].node_id), 0u);

  const char* mk[] = {"user"};
  const char* mv[] = {"bob"};
  ASSERT_EQ(kvpool_session_save(c, "s1", keys, 4, 64, mk, mv, 1), KVPOOL_OK)
      << kvpool_last_error(c);
  kvpool_key loaded[4];
  size_t n_loaded = 0;
  uint64_t token_count = 0;
  uint32_t cached = 0;
  ASSERT_EQ(kvpool_session_load(c, "s1", 1, loaded, 4, &n_loaded, &token_count, &cached),
            KVPOOL_OK);
  EXPECT_EQ(n_loaded, 4u);
  EXPECT_EQ(token_count, 64u);
  EXPECT_EQ(cached, 4u);
  EXPECT_EQ(std::memcmp(loaded, keys, sizeof(keys)), 0);
  EXPECT_EQ(kvpool_session_load(c, "nope", 0, loaded, 4, &n_loaded, nullptr, nullptr),
            KVPOOL_NOT_FOUND);
  EXPECT_NE(std::string(kvpool_last_error(c)).find("nope"), std::string::npos);
  ASSERT_EQ(kvpool_session_delete(c, "s1"), KVPOOL_OK);

  size_t needed = 0;
  EXPECT_EQ(kvpool_stats_json(c, nullptr, 0, &needed), KVPOOL_RESOURCE_EXHAUSTED);
  std::string json(needed, '\0');
  ASSERT_EQ(kvpool_stats_json(c, json.data(), json.size(), &needed), KVPOOL_OK);
  EXPECT_NE(json.find("\"puts_committed\":4"), std::string::npos) << json;
  kvpool_close(c);
}

TEST(CApiTest, DeviceCallsRefuseHostMemoryAndLeaveTheConnectionUsable) {
  DaemonProcess d;
  ASSERT_OK(d.Start());
  kvpool_client* c = nullptr;
  ASSERT_EQ(kvpool_connect(d.socket_path().c_str(), "c-api", 5000, &c), KVPOOL_OK);
  kvpool_key key{};
  key.bytes[0] = 9;
  std::vector<uint8_t> host(4096, 3);
  const void* data[1] = {host.data()};
  const size_t sizes[1] = {host.size()};
  uint32_t stored = 0, present = 0;
  // Host memory named as device memory: refused (INVALID_ARGUMENT with a GPU; without one,
  // UNAVAILABLE, or UNIMPLEMENTED in a build without CUDA), with a reason, and nothing stored.
  const int put =
      kvpool_put_chain_device(c, &key, 1, data, sizes, nullptr, nullptr, &stored, &present);
  EXPECT_TRUE(put == KVPOOL_INVALID_ARGUMENT || put == KVPOOL_UNAVAILABLE ||
              put == KVPOOL_UNIMPLEMENTED)
      << kvpool_code_name(put);
  EXPECT_STRNE(kvpool_last_error(c), "");
  void* bufs[1] = {host.data()};
  const size_t caps[1] = {host.size()};
  size_t got = 0;
  int code = 0;
  const int get = kvpool_get_device(c, &key, 1, bufs, caps, nullptr, &got, &code);
  EXPECT_EQ(get, put) << kvpool_last_error(c);
  // The connection is fine: the same block from host memory goes in and comes back.
  ASSERT_EQ(kvpool_put_chain(c, &key, 1, data, sizes, nullptr, &stored, &present), KVPOOL_OK);
  EXPECT_EQ(stored, 1u);
  std::vector<uint8_t> back(4096);
  void* back_bufs[1] = {back.data()};
  ASSERT_EQ(kvpool_get(c, &key, 1, back_bufs, caps, &got, &code), KVPOOL_OK);
  EXPECT_EQ(code, KVPOOL_OK);
  EXPECT_EQ(back, host);
  kvpool_close(c);
}

}  // namespace
}  // namespace kvpool::testing
