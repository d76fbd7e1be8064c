#pragma once
// Test certificates for TLS: a CA, a server certificate it signs for 127.0.0.1, ::1 and
// localhost, a client certificate it signs, and a second CA that signed none of them, made with
// OpenSSL (P-256 keys, SHA-256, valid from an hour ago for a day) and written as PEM files.
//
// Thread safety: none needed (writes files only).

#include <string>

#include "common/status.h"

namespace kvpool::testing {

struct TestCertificates {
  std::string ca_cert;      // the CA both certificates chain to
  std::string server_cert;  // for 127.0.0.1, ::1 and localhost
  std::string server_key;   // mode 0600
  std::string client_cert;
  std::string client_key;     // mode 0600
  std::string other_ca_cert;  // a CA that signed nothing here
};

// Writes them into `dir` (ca.pem, server.pem, server.key, client.pem, client.key, other-ca.pem).
Result<TestCertificates> WriteTestCertificates(const std::string& dir);

}  // namespace kvpool::testing
