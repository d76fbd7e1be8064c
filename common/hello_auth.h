#pragma once
// Proof of the cluster secret at hello, for TCP connections to a daemon in cluster mode.
//
// The daemon gives each TCP connection a random 32-byte challenge; the client answers with
// HMAC-SHA256(secret, "kvpool-hello" || challenge || namespace). The secret never travels, and an
// answer is good for one connection only. (Without TLS a man in the middle can still take over an
// authenticated connection: this keeps out processes that lack the secret, it does not encrypt.)
//
// Thread safety: pure functions.

#include <string>
#include <string_view>

namespace kvpool {

// 32 random bytes from the OS.
std::string NewHelloChallenge();
// The 32-byte proof for `challenge` and `namespace_name` under `secret`.
std::string HelloProof(std::string_view secret, std::string_view challenge,
                       std::string_view namespace_name);
// Constant-time check of `proof`.
bool VerifyHelloProof(std::string_view secret, std::string_view challenge,
                      std::string_view namespace_name, std::string_view proof);

}  // namespace kvpool
