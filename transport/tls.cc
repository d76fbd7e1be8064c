#include "transport/tls.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

namespace kvpool::transport {
namespace {

// The file exists and is a regular file; a private key must not be readable by other users.
Status CheckFile(const std::string& path, const char* what, bool secret) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return Status::InvalidArgument(std::string(what) + " " + path + ": " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    return Status::InvalidArgument(std::string(what) + " " + path + " is not a regular file");
  }
  if (secret && (st.st_mode & S_IRWXO) != 0) {
    return Status::InvalidArgument(std::string(what) + " " + path +
                                   " may be read by other users (chmod 600 or 640 " + path + ")");
  }
  return Status::OK();
}

// Loads the certificate chain and its key into `ctx` (which then presents them).
Status LoadIdentity(SSL_CTX* ctx, const TlsFiles& files) {
  KVPOOL_RETURN_IF_ERROR(CheckFile(files.cert_file, "TLS certificate", /*secret=*/false));
  KVPOOL_RETURN_IF_ERROR(CheckFile(files.key_file, "TLS key", /*secret=*/true));
  if (SSL_CTX_use_certificate_chain_file(ctx, files.cert_file.c_str()) != 1) {
    return Status::InvalidArgument("TLS certificate " + files.cert_file +
                                   " is not a PEM certificate chain: " + TakeOpenSslErrors());
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, files.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    return Status::InvalidArgument("TLS key " + files.key_file +
                                   " is not a PEM private key, or does not match certificate " +
                                   files.cert_file + ": " + TakeOpenSslErrors());
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    return Status::InvalidArgument("TLS key " + files.key_file + " does not match certificate " +
                                   files.cert_file + ": " + TakeOpenSslErrors());
  }
  return Status::OK();
}

Status LoadCa(SSL_CTX* ctx, const std::string& ca_file) {
  KVPOOL_RETURN_IF_ERROR(CheckFile(ca_file, "TLS CA file", /*secret=*/false));
  if (SSL_CTX_load_verify_locations(ctx, ca_file.c_str(), nullptr) != 1) {
    return Status::InvalidArgument("TLS CA file " + ca_file +
                                   " holds no PEM certificate: " + TakeOpenSslErrors());
  }
  return Status::OK();
}

}  // namespace

std::string TakeOpenSslErrors() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    // "error:0A000086:SSL routines::certificate verify failed": keep the reason.
    const char* reason = ERR_reason_error_string(e);
    out += reason != nullptr ? reason : buf;
  }
  return out.empty() ? "no detail from OpenSSL" : out;
}

Status ConfigureTlsServer(SSL_CTX* ctx, const TlsFiles& files) {
  if (files.cert_file.empty() || files.key_file.empty()) {
    return Status::InvalidArgument(
        "TLS needs both a certificate and its key (--tls_cert, --tls_key)");
  }
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  KVPOOL_RETURN_IF_ERROR(LoadIdentity(ctx, files));
  if (!files.ca_file.empty()) {
    KVPOOL_RETURN_IF_ERROR(LoadCa(ctx, files.ca_file));
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  return Status::OK();
}

Result<std::shared_ptr<const TlsClientContext>> TlsClientContext::Create(const TlsFiles& files) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  if (ctx == nullptr) return Status::Internal("SSL_CTX_new: " + TakeOpenSslErrors());
  std::shared_ptr<const TlsClientContext> out(new TlsClientContext(ctx));
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  if (!files.ca_file.empty()) {
    KVPOOL_RETURN_IF_ERROR(LoadCa(ctx, files.ca_file));
  } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
    return Status::Internal("cannot load the system's trust store: " + TakeOpenSslErrors());
  }
  if (!files.cert_file.empty() || !files.key_file.empty()) {
    if (files.cert_file.empty() || files.key_file.empty()) {
      return Status::InvalidArgument(
          "a TLS client certificate needs both the certificate and "
          "its key");
    }
    KVPOOL_RETURN_IF_ERROR(LoadIdentity(ctx, files));
  }
  return out;
}

TlsClientContext::~TlsClientContext() { SSL_CTX_free(ctx_); }

Result<SSL*> TlsClientContext::NewSession(int fd, std::string_view host) const {
  SSL* ssl = SSL_new(ctx_);
  if (ssl == nullptr) return Status::Internal("SSL_new: " + TakeOpenSslErrors());
  const std::string name(host);
  in6_addr probe{};
  const bool is_ip = inet_pton(AF_INET, name.c_str(), &probe) == 1 ||
                     inet_pton(AF_INET6, name.c_str(), &probe) == 1;
  // The certificate must name what was dialled: an IP address SAN for an address, else the
  // DNS name (also sent as SNI).
  const bool named = is_ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name.c_str()) == 1
                           : SSL_set1_host(ssl, name.c_str()) == 1 &&
                                 SSL_set_tlsext_host_name(ssl, name.c_str()) == 1;
  if (!named || SSL_set_fd(ssl, fd) != 1) {
    SSL_free(ssl);
    return Status::Internal("cannot set up TLS for " + name + ": " + TakeOpenSslErrors());
  }
  SSL_set_connect_state(ssl);
  return ssl;
}

}  // namespace kvpool::transport
