#include "common/hello_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cctype>
#include <fstream>

#include "common/status.h"

namespace kvpool {

std::string NewHelloChallenge() {
  std::string c(kHelloChallengeBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(c.data()), static_cast<int>(c.size())) != 1) {
    AbortWithStatus(Status::Internal("RAND_bytes failed"), __FILE__, __LINE__);
  }
  return c;
}

namespace {

// HMAC-SHA256(secret, label || challenge || namespace_name).
std::string Proof(std::string_view label, std::string_view secret, std::string_view challenge,
                  std::string_view namespace_name) {
  std::string msg(label);
  msg += challenge;
  msg += namespace_name;
  std::string out(32, '\0');
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(msg.data()), msg.size(),
           reinterpret_cast<unsigned char*>(out.data()), &len) == nullptr ||
      len != out.size()) {
    AbortWithStatus(Status::Internal("HMAC-SHA256 failed"), __FILE__, __LINE__);
  }
  return out;
}

bool SameProof(std::string_view proof, const std::string& expected) {
  return proof.size() == expected.size() &&
         CRYPTO_memcmp(proof.data(), expected.data(), expected.size()) == 0;
}

}  // namespace

std::string HelloProof(std::string_view secret, std::string_view challenge,
                       std::string_view namespace_name) {
  return Proof("kvpool-hello-client", secret, challenge, namespace_name);
}

bool VerifyHelloProof(std::string_view secret, std::string_view challenge,
                      std::string_view namespace_name, std::string_view proof) {
  return challenge.size() == kHelloChallengeBytes &&
         SameProof(proof, HelloProof(secret, challenge, namespace_name));
}

std::string HelloServerProof(std::string_view secret, std::string_view client_challenge,
                             std::string_view namespace_name) {
  return Proof("kvpool-hello-server", secret, client_challenge, namespace_name);
}

bool VerifyHelloServerProof(std::string_view secret, std::string_view client_challenge,
                            std::string_view namespace_name, std::string_view proof) {
  return client_challenge.size() == kHelloChallengeBytes &&
         SameProof(proof, HelloServerProof(secret, client_challenge, namespace_name));
}

Result<std::string> ReadSecretFile(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("cannot read " + path);
  std::string secret(max_bytes + 1, '\0');
  in.read(secret.data(), static_cast<std::streamsize>(secret.size()));
  if (in.bad()) return Status::IoError("cannot read " + path);
  secret.resize(static_cast<size_t>(in.gcount()));
  if (secret.size() > max_bytes) {
    return Status::InvalidArgument(path + " is larger than " + std::to_string(max_bytes) +
                                   " bytes: not a secret");
  }
  while (!secret.empty() && std::isspace(static_cast<unsigned char>(secret.back()))) {
    secret.pop_back();
  }
  return secret;
}

}  // namespace kvpool
