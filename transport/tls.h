#pragma once
// TLS for the control plane's TCP connections (OpenSSL, TLS 1.2 and later).
//
// A daemon started with a certificate speaks TLS on its TCP listener (clients dial
// "tls://HOST:PORT"); with a CA file it also asks every client for a certificate that chains
// to it (mutual TLS). Clients verify the daemon's certificate against their CA file (or the
// system's trust store) and its name against the address they dialled. TLS protects the
// control connection and the blocks that travel on it (the socket data path); the UCX data
// path is not encrypted and is for trusted networks (README "TLS").
//
// The server's context is Asio's (transport/control_server.cc) and is configured here; the
// client's is TlsClientContext, shared by a client's connections.
//
// Thread safety: a TlsClientContext is immutable after Create and may be shared.

#include <openssl/ssl.h>

#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace kvpool::transport {

// PEM files. A server needs cert_file and key_file; ca_file makes it require client
// certificates. A client needs none of them: ca_file replaces the system's trust store, and
// cert_file with key_file is presented to a daemon that asks.
struct TlsFiles {
  std::string cert_file;
  std::string key_file;
  std::string ca_file;
};

// What the OpenSSL error queue holds (and clears it), e.g. "certificate verify failed".
std::string TakeOpenSslErrors();

// Sets up `ctx` to serve with `files`: TLS >= 1.2, the certificate chain and its key (which
// must match), and with a CA file, client certificates required and verified. InvalidArgument
// naming the file and what is wrong with it.
Status ConfigureTlsServer(SSL_CTX* ctx, const TlsFiles& files);

class TlsClientContext {
 public:
  static Result<std::shared_ptr<const TlsClientContext>> Create(const TlsFiles& files);
  ~TlsClientContext();
  TlsClientContext(const TlsClientContext&) = delete;
  TlsClientContext& operator=(const TlsClientContext&) = delete;

  // A new TLS session on connected socket `fd` for `host` (a name or an address: the
  // certificate must carry it). The caller owns it (SSL_free).
  Result<SSL*> NewSession(int fd, std::string_view host) const;

 private:
  explicit TlsClientContext(SSL_CTX* ctx) : ctx_(ctx) {}
  SSL_CTX* ctx_;
};

}  // namespace kvpool::transport
