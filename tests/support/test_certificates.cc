#include "tests/support/test_certificates.h"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <cstdio>
#include <memory>

namespace kvpool::testing {
namespace {

struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct CertFree {
  void operator()(X509* c) const { X509_free(c); }
};
using Key = std::unique_ptr<EVP_PKEY, KeyFree>;
using Cert = std::unique_ptr<X509, CertFree>;

bool AddExtension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (ext == nullptr) return false;
  const bool ok = X509_add_ext(cert, ext, -1) == 1;
  X509_EXTENSION_free(ext);
  return ok;
}

// A certificate for `key` named `cn`, signed by `issuer_key` (issuer_cert null: self-signed).
Cert MakeCertificate(EVP_PKEY* key, const char* cn, X509* issuer_cert, EVP_PKEY* issuer_key,
                     long serial, bool ca, const char* san) {
  Cert cert(X509_new());
  if (cert == nullptr) return nullptr;
  X509* c = cert.get();
  X509_set_version(c, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(c), serial);
  X509_gmtime_adj(X509_getm_notBefore(c), -3600);
  X509_gmtime_adj(X509_getm_notAfter(c), 24 * 3600);
  X509_set_pubkey(c, key);
  X509_NAME* name = X509_get_subject_name(c);
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("kvpool tests"), -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(cn),
                             -1, -1, 0);
  X509* issuer = issuer_cert != nullptr ? issuer_cert : c;
  X509_set_issuer_name(c, X509_get_subject_name(issuer));
  bool ok = AddExtension(c, issuer, NID_basic_constraints, ca ? "critical,CA:TRUE" : "CA:FALSE");
  ok = ok && AddExtension(c, issuer, NID_subject_key_identifier, "hash");
  ok = ok && AddExtension(c, issuer, NID_authority_key_identifier, "keyid:always");
  ok = ok && AddExtension(c, issuer, NID_key_usage,
                          ca ? "critical,keyCertSign,cRLSign" : "critical,digitalSignature");
  if (!ca) ok = ok && AddExtension(c, issuer, NID_ext_key_usage, "serverAuth,clientAuth");
  if (san != nullptr) ok = ok && AddExtension(c, issuer, NID_subject_alt_name, san);
  if (!ok || X509_sign(c, issuer_key, EVP_sha256()) == 0) return nullptr;
  return cert;
}

Status WritePem(const std::string& path, X509* cert, EVP_PKEY* key) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return Status::FromErrno(errno, "open " + path);
  const bool ok = cert != nullptr
                      ? PEM_write_X509(f, cert) == 1
                      : PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr) == 1;
  std::fclose(f);
  if (!ok) return Status::Internal("cannot write " + path);
  if (key != nullptr) ::chmod(path.c_str(), 0600);
  return Status::OK();
}

}  // namespace

Result<TestCertificates> WriteTestCertificates(const std::string& dir) {
  Key ca_key(EVP_EC_gen("P-256"));
  Key other_key(EVP_EC_gen("P-256"));
  Key server_key(EVP_EC_gen("P-256"));
  Key client_key(EVP_EC_gen("P-256"));
  if (!ca_key || !other_key || !server_key || !client_key) {
    return Status::Internal("cannot generate P-256 keys");
  }
  Cert ca =
      MakeCertificate(ca_key.get(), "kvpool test CA", nullptr, ca_key.get(), 1, true, nullptr);
  Cert other = MakeCertificate(other_key.get(), "kvpool unrelated CA", nullptr, other_key.get(), 2,
                               true, nullptr);
  if (!ca || !other) return Status::Internal("cannot make the test CAs");
  Cert server = MakeCertificate(server_key.get(), "kvpoold", ca.get(), ca_key.get(), 3, false,
                                "IP:127.0.0.1,IP:::1,DNS:localhost");
  Cert client =
      MakeCertificate(client_key.get(), "kvpool client", ca.get(), ca_key.get(), 4, false, nullptr);
  if (!server || !client) return Status::Internal("cannot make the test certificates");
  TestCertificates out;
  out.ca_cert = dir + "/ca.pem";
  out.server_cert = dir + "/server.pem";
  out.server_key = dir + "/server.key";
  out.client_cert = dir + "/client.pem";
  out.client_key = dir + "/client.key";
  out.other_ca_cert = dir + "/other-ca.pem";
  KVPOOL_RETURN_IF_ERROR(WritePem(out.ca_cert, ca.get(), nullptr));
  KVPOOL_RETURN_IF_ERROR(WritePem(out.other_ca_cert, other.get(), nullptr));
  KVPOOL_RETURN_IF_ERROR(WritePem(out.server_cert, server.get(), nullptr));
  KVPOOL_RETURN_IF_ERROR(WritePem(out.server_key, nullptr, server_key.get()));
  KVPOOL_RETURN_IF_ERROR(WritePem(out.client_cert, client.get(), nullptr));
  KVPOOL_RETURN_IF_ERROR(WritePem(out.client_key, nullptr, client_key.get()));
  return out;
}

}  // namespace kvpool::testing
