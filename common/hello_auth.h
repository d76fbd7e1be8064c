#pragma once
// Proof of a shared secret at hello, both ways: a namespace's credential, the admin's, or the
// cluster secret (daemon/access_control.h says which the daemon accepts).
//
// The daemon gives the connection a random 32-byte challenge; the client answers with
// HMAC-SHA256(secret, "kvpool-hello-client" || challenge || namespace), and sends a challenge of
// its own, which the daemon answers with HMAC-SHA256(secret, "kvpool-hello-server" ||
// client challenge || namespace): a client that holds a secret also learns that the daemon (a
// peer, for another kvpoold) holds it. The two labels have one length and challenges are exactly
// 32 bytes, so no answer of one side can be made to stand for one of the other. The secret never
// travels, and an answer is good for one connection only. (Without TLS a man in the middle can
// still take over an authenticated connection: this keeps out processes that lack the secret, it
// does not encrypt.)
//
// Thread safety: pure functions.

#include <cstddef>
#include <string>
#include <string_view>

#include "common/status.h"

namespace kvpool {

inline constexpr size_t kHelloChallengeBytes = 32;

// 32 random bytes from the OS.
std::string NewHelloChallenge();
// The 32-byte proof for `challenge` and `namespace_name` under `secret`.
std::string HelloProof(std::string_view secret, std::string_view challenge,
                       std::string_view namespace_name);
// Constant-time check of `proof`; false for a challenge of any other length than 32 bytes.
bool VerifyHelloProof(std::string_view secret, std::string_view challenge,
                      std::string_view namespace_name, std::string_view proof);
// The daemon's 32-byte answer to the client's challenge, and its constant-time check.
std::string HelloServerProof(std::string_view secret, std::string_view client_challenge,
                             std::string_view namespace_name);
bool VerifyHelloServerProof(std::string_view secret, std::string_view client_challenge,
                            std::string_view namespace_name, std::string_view proof);

// A secret kept in a file (a credential, the cluster secret): the file's bytes without trailing
// white space, so an editor's final newline is not part of it. Every reader of such a file (the
// daemon, both CLIs, the Python connectors) takes it this way (Python needs it to be UTF-8).
// NotFound when it cannot be read, InvalidArgument over `max_bytes`.
Result<std::string> ReadSecretFile(const std::string& path, size_t max_bytes = 4096);

}  // namespace kvpool
